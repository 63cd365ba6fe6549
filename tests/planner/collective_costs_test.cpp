// Measured collective ladders (collective_costs.hpp) against hand arithmetic:
// a rung's time is returned exactly; between rungs the time follows the
// segment's power law (at the geometric middle of two rungs, the geometric
// mean of their times); below the ladder the smallest rung's, above it in
// proportion to the bytes; a group the ladder was not measured over, a
// strided group and a collective without a ladder keep the alpha-beta model;
// a DDP step's exposed all-reduce moves by what the ladder adds; the profile
// round-trips and its errors name the field; --explain says which collectives
// came from the ladders.
#include "dlplan/collective_costs.hpp"
#include "dlplan/comm_model.hpp"
#include "dlplan/explain.hpp"
#include "dlplan/planner.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/simulator.hpp"

#include "cpu_host.hpp"
#include "error_of.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

using namespace dlplan;
using dlplan::testing::error_of;

namespace {

Cluster host(int ranks) { return dlplan::testing::cpu_host(ranks); }

// All-reduce: 1 KiB 10 us, 4 KiB 40 us, 16 KiB 50 us (bent, as a host's is);
// all-gather: 1 KiB 5 us, 4 KiB 20 us.
std::shared_ptr<const CollectiveCostTable> ladder(int ranks) {
  auto t = std::make_shared<CollectiveCostTable>();
  t->source = "hand-made";
  t->ranks = ranks;
  t->ladders.push_back({Collective::AllReduce, {{1024, 10e-6}, {4096, 40e-6}, {16384, 50e-6}}});
  t->ladders.push_back({Collective::AllGather, {{1024, 5e-6}, {4096, 20e-6}}});
  return t;
}

TEST(CollectiveCosts, ARungIsItsOwnTime) {
  Cluster c = host(2);
  c.collective_costs = ladder(2);
  const CollectiveCost at = collective_cost(c, Collective::AllReduce, 4096, 2);
  EXPECT_DOUBLE_EQ(at.seconds, 40e-6);
  EXPECT_EQ(at.algorithm, "measured");
  EXPECT_DOUBLE_EQ(at.bytes_sent, 4096);  // ring accounting as ever: 2(n-1)/n S
  EXPECT_DOUBLE_EQ(collective_cost(c, Collective::AllGather, 1024, 2).seconds, 5e-6);
}

TEST(CollectiveCosts, BetweenRungsThePowerLawOfTheSegment) {
  Cluster c = host(2);
  c.collective_costs = ladder(2);
  // 2 KiB is the geometric middle of 1 and 4 KiB: sqrt(10 x 40) = 20 us.
  EXPECT_NEAR(collective_cost(c, Collective::AllReduce, 2048, 2).seconds, 20e-6, 1e-12);
  // 8 KiB between 40 and 50 us: sqrt(40 x 50).
  EXPECT_NEAR(collective_cost(c, Collective::AllReduce, 8192, 2).seconds, std::sqrt(40e-6 * 50e-6), 1e-12);
  // Monotone in between.
  double last = 0;
  for (double S = 1024; S <= 16384; S *= 1.1) {
    const double t = collective_cost(c, Collective::AllReduce, S, 2).seconds;
    EXPECT_GE(t, last) << S;
    last = t;
  }
}

TEST(CollectiveCosts, OutsideTheLadderLatencyBelowBandwidthAbove) {
  Cluster c = host(2);
  c.collective_costs = ladder(2);
  EXPECT_DOUBLE_EQ(collective_cost(c, Collective::AllReduce, 4, 2).seconds, 10e-6);
  EXPECT_DOUBLE_EQ(collective_cost(c, Collective::AllReduce, 65536, 2).seconds, 200e-6);  // 4 x 16 KiB: 4 x 50 us
}

TEST(CollectiveCosts, OtherGroupsAndCollectivesKeepTheModel) {
  Cluster plain = host(4);
  Cluster measured = host(4);
  measured.collective_costs = ladder(2);
  // A group of 4 was not measured; nor a reduce-scatter.
  EXPECT_DOUBLE_EQ(collective_cost(measured, Collective::AllReduce, 4096, 4).seconds,
                   collective_cost(plain, Collective::AllReduce, 4096, 4).seconds);
  EXPECT_DOUBLE_EQ(collective_cost(measured, Collective::ReduceScatter, 4096, 2).seconds,
                   collective_cost(plain, Collective::ReduceScatter, 4096, 2).seconds);
  // Two ranks 2 apart (hybrid sharding's replicas) are another group.
  EXPECT_DOUBLE_EQ(collective_cost(measured, Collective::AllReduce, 4096, 2, 2).seconds,
                   collective_cost(plain, Collective::AllReduce, 4096, 2, 2).seconds);
  EXPECT_DOUBLE_EQ(collective_cost(measured, Collective::AllReduce, 4096, 2).seconds, 40e-6);  // control
}

TEST(CollectiveCosts, ADdpStepPaysTheLaddersAllReduce) {
  // tiny-mlp under DDP on two ranks: one bucket, all-reduced after backward
  // and waited for by the optimizer, so the step moves by exactly what the
  // ladder's time for it adds to the model's.
  const Model m = load_model("tiny-mlp");
  TrainingConfig t;
  t.precision = Precision::fp32;
  t.micro_batch = 8;
  Cluster plain = host(2);
  const StepProgram prog = build_step_program(m, plain, t);
  ASSERT_EQ(prog.comm.size(), 1u);
  const double bytes = prog.comm[0].bytes;
  auto table = std::make_shared<CollectiveCostTable>();
  table->ranks = 2;
  table->ladders.push_back({Collective::AllReduce, {{bytes / 2, 0.5e-3}, {bytes * 2, 2e-3}}});
  Cluster measured = plain;
  measured.collective_costs = table;
  const Simulation a = simulate_step(m, plain, t);
  const Simulation b = simulate_step(m, measured, t);
  const double model = collective_cost(plain, Collective::AllReduce, bytes, 2).seconds;
  // Half-way (geometrically) from bytes / 2 to 2 bytes: sqrt(0.5 x 2) ms = 1 ms.
  EXPECT_NEAR(b.step_seconds - a.step_seconds, 1e-3 - model, 1e-9);
  EXPECT_NEAR(b.comm_seconds, 1e-3, 1e-9);
}

TEST(CollectiveCosts, ExplainSaysWhereTheCollectivesTimesCameFrom) {
  PlanRequest req;
  req.model = load_model("tiny-mlp");
  req.cluster = host(2);
  req.training.precision = Precision::fp32;
  req.training.micro_batch = 8;
  req.forced = Strategy::zero3;
  auto said = [&] {
    for (const std::string& line : explain_lines(plan(req)))
      if (line.rfind("Op times of", 0) == 0) return line;
    return std::string();
  };
  EXPECT_NE(said().find("collectives: 0 from calibrate's measured ladders"), std::string::npos) << said();
  // A ladder of all-gathers only: ZeRO-3's gathers are measured, its
  // reduce-scatters modeled.
  auto t = std::make_shared<CollectiveCostTable>();
  t->source = "hand-made";
  t->ranks = 2;
  t->ladders.push_back({Collective::AllGather, {{1024, 5e-6}, {4096, 20e-6}}});
  req.cluster.collective_costs = t;
  const Planning p = plan(req);
  const StrategyResult& r = *p.chosen();
  EXPECT_GT(r.comm_measured, 0);
  EXPECT_GT(r.comm_modeled, 0);
  EXPECT_NE(said().find(fmt::format("collectives: {} from calibrate's measured ladders, {} from the alpha-beta model "
                                    "(ladders: hand-made)",
                                    r.comm_measured, r.comm_modeled)),
            std::string::npos)
      << said();
}

TEST(CollectiveCosts, TheProfileRoundTripsAndItsErrorsNameTheField) {
  Cluster c = host(2);
  c.collective_costs = ladder(2);
  const nlohmann::json j = cluster_to_json(c);
  const Cluster back = cluster_from_json(j, "host.json");
  ASSERT_TRUE(back.collective_costs);
  EXPECT_EQ(back.collective_costs->source, "hand-made");
  EXPECT_EQ(back.collective_costs->ranks, 2);
  ASSERT_EQ(back.collective_costs->ladders.size(), 2u);
  EXPECT_DOUBLE_EQ(*back.collective_costs->seconds(Collective::AllReduce, 2048), 20e-6);
  EXPECT_FALSE(back.collective_costs->seconds(Collective::Broadcast, 2048));

  auto broken = [&](auto edit) {
    nlohmann::json k = j;
    edit(k["collective_costs"]);
    return error_of([&] { cluster_from_json(k, "host.json"); });
  };
  EXPECT_NE(broken([](auto& o) { o["all-reduce"][1] = {512, 1e-5}; })
                .find("host.json: collective_costs.all-reduce[1] must be larger than the rung before it"),
            std::string::npos);
  EXPECT_NE(broken([](auto& o) { o["all-gather"][0] = {1024, -1}; }).find("collective_costs.all-gather[0]"),
            std::string::npos);
  EXPECT_NE(broken([](auto& o) { o["all-gather"] = nlohmann::json::array(); }).find("collective_costs.all-gather"),
            std::string::npos);
  EXPECT_NE(broken([](auto& o) { o.erase("ranks"); }).find("missing field 'collective_costs.ranks'"), std::string::npos);
  EXPECT_NE(broken([](auto& o) { o["ranks"] = 1; }).find("collective_costs.ranks"), std::string::npos);
  EXPECT_NE(broken([](auto& o) { o["all-to-all"] = 1; }).find("unknown field 'collective_costs.all-to-all'"),
            std::string::npos);
}

}  // namespace
