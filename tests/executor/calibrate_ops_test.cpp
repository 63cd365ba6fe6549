// measure_op_costs on one rank: the table it writes covers every op of the
// plan the planner makes for the same model and micro-batch (none falls back
// to the roofline), and at another micro-batch every op is scaled from it.
#include "dlplan/exec/backend.hpp"
#include "dlplan/exec/calibrate.hpp"
#include "dlplan/exec/communicator.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/op_costs.hpp"
#include "dlplan/simulator.hpp"

#include <gtest/gtest.h>

#include <memory>

using namespace dlplan;
using namespace dlplan::exec;

namespace {

class MeasuredOpCosts : public ::testing::TestWithParam<const char*> {};

TEST_P(MeasuredOpCosts, CoverEveryOpOfThePlan) {
  const Model m = load_model(GetParam());
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  const OpCostTable table = measure_op_costs(*comm, *backend, m, 2, 2);
  EXPECT_EQ(table.ranks_per_node, 1);
  EXPECT_GT(table.optimizer_bytes_per_s, 0);
  for (const OpCost& c : table.ops) {
    EXPECT_GT(c.seconds, 0) << c.signature;
    EXPECT_EQ(c.micro_batch, 2);
  }
  Cluster c;
  c.device = find_device("cpu");
  c.op_costs = std::make_shared<const OpCostTable>(table);
  TrainingConfig t;
  t.precision = Precision::fp32;
  t.micro_batch = 2;
  const StepProgram prog = build_step_program(m, c, t);
  const Simulation s = simulate_program(prog, c, t);
  EXPECT_TRUE(s.cost_table_unused.empty()) << s.cost_table_unused;
  EXPECT_EQ(s.cost_sources[static_cast<size_t>(CostSource::roofline)], 0);
  EXPECT_EQ(s.cost_sources[static_cast<size_t>(CostSource::measured)], static_cast<int>(prog.compute.size()));

  t.micro_batch = 3;
  const Simulation scaled = simulate_program(build_step_program(m, c, t), c, t);
  EXPECT_EQ(scaled.cost_sources[static_cast<size_t>(CostSource::roofline)], 0);
  EXPECT_EQ(scaled.cost_sources[static_cast<size_t>(CostSource::scaled)], static_cast<int>(prog.compute.size()) - 1);
}

// tiny-cnn's convolutions run through oneDNN where it is built (their
// signatures say so), tiny-gpt's attention in the plan's mode.
INSTANTIATE_TEST_SUITE_P(Zoo, MeasuredOpCosts, ::testing::Values("tiny-mlp", "tiny-cnn", "tiny-gpt"));

}  // namespace
