// Measured op costs (op_costs.hpp) in the simulator, against hand arithmetic:
// a table with a known time for every op gives their sum; another micro-batch
// scales it; recomputation reads the forward's row; a table measured with
// other ranks per node or older kernels is set aside and said so; the profile's JSON
// round-trips and its errors name the field; signatures survive a plan file.
#include "dlplan/op_costs.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"
#include "dlplan/simulator.hpp"
#include "dlplan/loader.hpp"

#include "cpu_host.hpp"
#include "error_of.hpp"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>

using namespace dlplan;
using dlplan::testing::error_of;

namespace {

Cluster host(int ranks) { return dlplan::testing::cpu_host(ranks); }

TrainingConfig fp32(int64_t micro_batch, Checkpointing ck = Checkpointing::none) {
  TrainingConfig t;
  t.precision = Precision::fp32;
  t.micro_batch = micro_batch;
  t.checkpointing = ck;
  return t;
}

// Every op of the program at `seconds_of(phase)`, measured at `micro_batch`.
template <class F>
std::shared_ptr<const OpCostTable> table_for(const StepProgram& prog, int ranks, int64_t micro_batch, F seconds_of,
                                             double optimizer_bytes_per_s = 0, double gap = 0) {
  auto t = std::make_shared<OpCostTable>();
  t->ranks_per_node = ranks;
  t->kernel_revision = kCpuKernelRevision;
  t->optimizer_bytes_per_s = optimizer_bytes_per_s;
  t->gap_per_op_s = gap;
  std::set<std::pair<std::string, Phase>> seen;
  for (const ComputeEvent& e : prog.compute)
    if (e.node >= 0 && e.phase != Phase::recompute && seen.insert({e.signature, e.phase}).second)
      t->ops.push_back({e.signature, e.phase, micro_batch, seconds_of(e.phase), 1});
  return t;
}

double optimizer_bytes(const StepProgram& prog) {
  for (const ComputeEvent& e : prog.compute)
    if (e.node < 0) return e.bytes;
  return 0;
}

TEST(OpCosts, ATableWithKnownTimesGivesTheirSum) {
  const Model m = load_model("tiny-gpt");
  Cluster c = host(1);
  const TrainingConfig t = fp32(4);
  const StepProgram prog = build_step_program(m, c, t);
  int forwards = 0, backwards = 0;
  for (const ComputeEvent& e : prog.compute) {
    if (e.node < 0) continue;
    EXPECT_FALSE(e.signature.empty()) << e.name;
    (e.phase == Phase::forward ? forwards : backwards)++;
  }
  // 1 ms per forward, 3 ms per backward, the optimizer at 1 GB/s, 10 us between ops.
  const double opt_bytes = optimizer_bytes(prog);
  ASSERT_GT(opt_bytes, 0);
  c.op_costs = table_for(prog, 1, 4, [](Phase p) { return p == Phase::forward ? 1e-3 : 3e-3; }, 1e9, 10e-6);
  const Simulation s = simulate_program(prog, c, t);
  const double events = forwards + backwards + 1;
  EXPECT_NEAR(s.compute_seconds, forwards * 1e-3 + backwards * 3e-3 + opt_bytes / 1e9 + events * 10e-6, 1e-12);
  EXPECT_EQ(s.cost_sources[static_cast<size_t>(CostSource::measured)], static_cast<int>(events));
  EXPECT_EQ(s.cost_sources[static_cast<size_t>(CostSource::roofline)], 0);
  // Doubling every row doubles the ops' share of the step.
  c.op_costs = table_for(prog, 1, 4, [](Phase p) { return p == Phase::forward ? 2e-3 : 6e-3; }, 1e9, 10e-6);
  EXPECT_NEAR(simulate_program(prog, c, t).compute_seconds - s.compute_seconds, forwards * 1e-3 + backwards * 3e-3, 1e-12);
}

TEST(OpCosts, AnotherMicroBatchScalesTheNearestRow) {
  const Model m = load_model("tiny-mlp");
  Cluster c = host(1);
  const StepProgram at2 = build_step_program(m, c, fp32(2));
  auto t = std::make_shared<OpCostTable>(*table_for(at2, 1, 2, [](Phase) { return 1e-3; }));
  // A second, farther row at micro-batch 32 that must not be chosen for 6.
  for (OpCost row : std::vector<OpCost>(t->ops)) {
    row.micro_batch = 32;
    row.seconds = 1.0;
    t->ops.push_back(row);
  }
  c.op_costs = t;
  const TrainingConfig t6 = fp32(6);
  const StepProgram at6 = build_step_program(m, c, t6);
  const Simulation s = simulate_program(at6, c, t6);
  int ops = 0;
  for (const ComputeEvent& e : at6.compute) ops += e.node >= 0;
  const double roofline_optimizer = compute_event_seconds(at6.compute.back(), c.device, t6.precision);
  ASSERT_LT(at6.compute.back().node, 0);
  EXPECT_NEAR(s.compute_seconds, ops * 3e-3 + roofline_optimizer, 1e-12);  // 1 ms x 6 / 2
  EXPECT_EQ(s.cost_sources[static_cast<size_t>(CostSource::scaled)], ops);
  EXPECT_EQ(s.cost_sources[static_cast<size_t>(CostSource::roofline)], 1);  // the optimizer: no rate measured
}

TEST(OpCosts, RecomputationReadsTheForwardRow) {
  const Model m = load_model("tiny-gpt");
  Cluster c = host(1);
  const TrainingConfig t = fp32(4, Checkpointing::units);
  const StepProgram prog = build_step_program(m, c, t);
  int recomputes = 0, others = 0;
  for (const ComputeEvent& e : prog.compute)
    if (e.node >= 0) (e.phase == Phase::recompute ? recomputes : others)++;
  ASSERT_GT(recomputes, 0);
  c.op_costs = table_for(prog, 1, 4, [](Phase p) { return p == Phase::forward ? 1e-3 : 2e-3; }, 1e9);
  const Simulation s = simulate_program(prog, c, t);
  int forwards = 0;
  for (const ComputeEvent& e : prog.compute) forwards += e.node >= 0 && e.phase == Phase::forward;
  EXPECT_NEAR(s.compute_seconds, (forwards + recomputes) * 1e-3 + (others - forwards) * 2e-3 + optimizer_bytes(prog) / 1e9,
              1e-12);
}

TEST(OpCosts, ATableFromOtherRanksPerNodeIsSetAsideAndSaid) {
  const Model m = load_model("tiny-mlp");
  Cluster c = host(1);
  const TrainingConfig t = fp32(4);
  const StepProgram prog = build_step_program(m, c, t);
  const double plain = simulate_program(prog, c, t).compute_seconds;
  c.op_costs = table_for(prog, 2, 4, [](Phase) { return 1.0; });  // measured with 2 ranks sharing the cores
  const Simulation s = simulate_program(prog, c, t);
  EXPECT_DOUBLE_EQ(s.compute_seconds, plain);
  EXPECT_NE(s.cost_table_unused.find("2 rank(s) per node"), std::string::npos) << s.cost_table_unused;
  // The planner carries the reason to --explain.
  PlanRequest req;
  req.model = m;
  req.cluster = c;
  req.training = t;
  req.forced = Strategy::ddp;
  const Planning p = plan(req);
  ASSERT_TRUE(p.chosen());
  EXPECT_EQ(p.chosen()->cost_table_unused, s.cost_table_unused);
}

TEST(OpCosts, ATableOfOlderKernelsIsSetAsideAndSaid) {
  const Model m = load_model("tiny-mlp");
  Cluster c = host(1);
  const TrainingConfig t = fp32(4);
  const StepProgram prog = build_step_program(m, c, t);
  const double plain = simulate_program(prog, c, t).compute_seconds;
  auto old = std::make_shared<OpCostTable>(*table_for(prog, 1, 4, [](Phase) { return 1.0; }));
  old->kernel_revision = kCpuKernelRevision - 1;
  c.op_costs = old;
  const Simulation s = simulate_program(prog, c, t);
  EXPECT_DOUBLE_EQ(s.compute_seconds, plain);
  EXPECT_NE(s.cost_table_unused.find("calibrate --model"), std::string::npos) << s.cost_table_unused;
}

TEST(OpCosts, SignaturesSurviveAPlanFile) {
  // A plan file's model lists attributes in another order; the calibration
  // that reads it must key its ops as the planner does.
  PlanRequest req;
  req.model = load_model("tiny-gpt");
  req.cluster = host(1);
  req.training = fp32(4);
  req.forced = Strategy::ddp;
  const Planning p = plan(req);
  const PlanDocument doc = plan_from_json(nlohmann::json(plan_json(p, *p.chosen())), "tiny-gpt.plan");
  const StepProgram a = build_step_program(req.model, req.cluster, req.training);
  const StepProgram b = build_step_program(doc.model, doc.cluster, doc.training);
  ASSERT_EQ(a.compute.size(), b.compute.size());
  for (size_t e = 0; e < a.compute.size(); ++e) EXPECT_EQ(a.compute[e].signature, b.compute[e].signature) << a.compute[e].name;
}

TEST(OpCosts, TheProfileRoundTripsAndItsErrorsNameTheField) {
  Cluster c = host(2);
  auto t = std::make_shared<OpCostTable>();
  t->source = "hand-made";
  t->ranks_per_node = 2;
  t->kernel_revision = kCpuKernelRevision;
  t->optimizer_bytes_per_s = 3e9;
  t->gap_per_op_s = 4e-6;
  t->ops.push_back({"relu [8] {} dx=1 dw=0 fp32", Phase::backward, 16, 2.5e-5, 10});
  c.op_costs = t;
  const nlohmann::json j = cluster_to_json(c);
  const Cluster back = cluster_from_json(j, "host.json");
  ASSERT_TRUE(back.op_costs);
  EXPECT_EQ(back.op_costs->source, "hand-made");
  EXPECT_EQ(back.op_costs->ranks_per_node, 2);
  EXPECT_DOUBLE_EQ(back.op_costs->optimizer_bytes_per_s, 3e9);
  EXPECT_DOUBLE_EQ(back.op_costs->gap_per_op_s, 4e-6);
  ASSERT_EQ(back.op_costs->ops.size(), 1u);
  EXPECT_EQ(back.op_costs->ops[0].signature, t->ops[0].signature);
  EXPECT_EQ(back.op_costs->ops[0].phase, Phase::backward);
  EXPECT_EQ(back.op_costs->ops[0].micro_batch, 16);
  EXPECT_DOUBLE_EQ(back.op_costs->ops[0].seconds, 2.5e-5);

  auto broken = [&](auto edit) {
    nlohmann::json k = j;
    edit(k["op_costs"]);
    return error_of([&] { cluster_from_json(k, "host.json"); });
  };
  EXPECT_NE(broken([](auto& o) { o["ops"][0]["seconds"] = -1; }).find("host.json: op_costs.ops[0].seconds"), std::string::npos);
  EXPECT_NE(broken([](auto& o) { o["ops"][0]["phase"] = "sideways"; }).find("op_costs.ops[0].phase"), std::string::npos);
  EXPECT_NE(broken([](auto& o) { o["ops"][0].erase("signature"); }).find("op_costs.ops[0].signature"), std::string::npos);
  EXPECT_NE(broken([](auto& o) { o.erase("kernel_revision"); }).find("op_costs.kernel_revision"), std::string::npos);
  EXPECT_NE(broken([](auto& o) { o["ranks_per_node"] = 0; }).find("op_costs.ranks_per_node"), std::string::npos);
  EXPECT_NE(broken([](auto& o) { o["speed"] = 1; }).find("unknown field 'op_costs.speed'"), std::string::npos);
}

}  // namespace
