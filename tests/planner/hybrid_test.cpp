// Hybrid sharding (hsdp2, hsdp3) against hand-derived formulas:
//  - model states: ZeRO-2 / ZeRO-3 with N replaced by the shard group G
//    (the ZeRO paper's per-device formulas, Rajbhandari et al. 2020, Fig. 1);
//  - traffic per GPU: the in-group ring collectives over G plus one ring
//    all-reduce of each gradient shard over the N/G groups;
//  - the cross-group all-reduce is costed on the network (alpha-beta ring
//    over the nodes, one NIC per GPU);
//  - which strategies a planning compares, the flags' checks, and the plan
//    file's shard_group.
#include "dlplan/comm_model.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"
#include "dlplan/request.hpp"
#include "dlplan/step_program.hpp"
#include "dlplan/zoo.hpp"

#include "sharding_fixtures.hpp"

#include <gtest/gtest.h>

#include <algorithm>

using namespace dlplan;
using sharding_fixtures::nodes_of;
using sharding_fixtures::small_gpt;

namespace {

TrainingConfig mixed(Strategy s, int G) {
  TrainingConfig t;
  t.strategy = s;
  t.precision = Precision::bf16_mixed;
  t.shard_group = G;
  return t;
}

std::vector<Strategy> compared(const Cluster& c, int G, std::optional<Strategy> forced = std::nullopt) {
  TrainingConfig t;
  t.shard_group = G;
  return strategies_to_compare(c, t, forced);
}

}  // namespace

TEST(Hybrid, ModelStatesAreZeroOverTheShardGroup) {
  const Model m = small_gpt();
  const int N = 16, G = 4;
  double padded = 0, full = 0;  // per unit, padded to a multiple of G
  for (int64_t p : unit_parameter_counts(m)) {
    padded += static_cast<double>(pad_to(p, G));
    full += static_cast<double>(p);
  }
  const double K = 12;  // bf16-mixed Adam: fp32 master, m, v
  // hsdp2 = ZeRO-2 over G: full (padded) bf16 params, 1/G of grads and state.
  const CategoryBytes h2 = model_states(m, N, mixed(Strategy::hsdp2, G));
  EXPECT_EQ(h2[0], static_cast<int64_t>(2 * padded));
  EXPECT_EQ(h2[1], static_cast<int64_t>(2 * padded / G));
  EXPECT_EQ(h2[2], static_cast<int64_t>(K * padded / G));
  // hsdp3 = ZeRO-3 over G: everything 1/G.
  const CategoryBytes h3 = model_states(m, N, mixed(Strategy::hsdp3, G));
  EXPECT_EQ(h3[0], static_cast<int64_t>(2 * padded / G));
  EXPECT_EQ(h3[1], static_cast<int64_t>(2 * padded / G));
  EXPECT_EQ(h3[2], static_cast<int64_t>(K * padded / G));
  // Control: ZeRO-3 over all 16 ranks keeps less than hybrid over 4.
  EXPECT_LT(total(model_states(m, N, mixed(Strategy::zero3, 0))), total(h3));
  // And the tensors the executor allocates add up to the same.
  CategoryBytes sum{};
  for (const StateTensor& t : model_state_tensors(m, N, mixed(Strategy::hsdp3, G)))
    sum[static_cast<size_t>(t.category)] += t.bytes;
  EXPECT_EQ(sum, h3);
  EXPECT_GT(full, 0);
}

TEST(Hybrid, TrafficIsTheGroupsCollectivesPlusTheShardAllReduce) {
  const Model m = small_gpt();  // unit sizes divisible by 8: no padding
  double P = 0, root = 0;
  for (const auto& p : m.params) {
    P += static_cast<double>(p.numel);
    if (p.unit == 0) root += static_cast<double>(p.numel);
  }
  for (auto [nodes, per_node] : {std::pair{2, 4}, std::pair{4, 2}}) {
    const Cluster c = nodes_of(nodes, per_node);
    const int N = c.world(), G = per_node, R = N / G;
    const double fg = (G - 1.0) / G, fr = (R - 1.0) / R;
    for (int A : {1, 3}) {
      auto bytes = [&](Strategy s) {
        TrainingConfig t = mixed(s, G);
        t.grad_accum = A;
        return evaluate(m, c, t).comm.bytes;
      };
      // The shards' all-reduce across the R groups: 2(R-1)/R x (2P/G) bytes, once a step.
      const double across = 2 * fr * 2 * P / G;
      // hsdp2: reduce-scatter in the group every micro-batch, all-gather of the updated parameters once.
      EXPECT_DOUBLE_EQ(bytes(Strategy::hsdp2), A * fg * 2 * P + fg * 2 * P + across);
      // hsdp3: units gathered twice and reduce-scattered once per micro-batch, the root gathered once a step.
      EXPECT_DOUBLE_EQ(bytes(Strategy::hsdp3),
                       A * fg * 2 * (3 * (P - root)) + fg * 2 * root + A * fg * 2 * root + across);
    }
  }
}

TEST(Hybrid, ShardAllReduceIsCostedOnTheNetwork) {
  const Cluster c = nodes_of(2, 8);
  const DeviceSpec& d = c.device;
  const double S = 64e6;
  // Ranks 8 apart on 2 nodes of 8: one per node, each over its own NIC; a
  // ring of 2 moves S once each way: 2 hops + S / (NIC rate x efficiency).
  const CollectiveCost across = collective_cost(c, Collective::AllReduce, S, 2, 8);
  const double want = d.base_latency_s + 2 * d.net_hop_latency_s + S / (d.net_bytes_per_s * d.net_efficiency);
  EXPECT_NEAR(across.seconds, want, 1e-12 * want);
  EXPECT_DOUBLE_EQ(across.bytes_sent, S);  // 2(n-1)/n S at n = 2
  // Control: two contiguous ranks share a node's NVLink, much faster.
  EXPECT_LT(collective_cost(c, Collective::AllReduce, S, 2).seconds, 0.5 * across.seconds);
  // Ranks 2 apart on one node of 8: the 4 of a replica group are all local.
  const Cluster one = nodes_of(1, 8);
  EXPECT_DOUBLE_EQ(collective_cost(one, Collective::AllReduce, S, 4, 2).seconds,
                   collective_cost(one, Collective::AllReduce, S, 4).seconds);
  EXPECT_THROW(collective_cost(c, Collective::AllReduce, S, 4, 8), Error);  // 4 x 8 ranks > 16
}

TEST(Hybrid, OnASlowNetworkShardingInsideTheNodeBeatsZero3) {
  // "On 2 nodes with a slow network, should I shard only inside each node?"
  PlanRequest r;
  r.model = load_model("gpt2");
  r.cluster = nodes_of(2, 8);
  r.cluster.device.net_bytes_per_s = 1.25e9;  // 10 Gb/s Ethernet per GPU
  r.training = mixed(Strategy::ddp, 8);
  r.training.micro_batch = 4;
  const Planning p = plan(r);
  ASSERT_EQ(p.results.size(), 6u);
  const auto row = [&](Strategy s) {
    return *std::find_if(p.results.begin(), p.results.end(), [s](const StrategyResult& x) { return x.strategy == s; });
  };
  // ZeRO-3 moves 3 x 2P per step across the nodes; hsdp3 only the shards' all-reduce, 2 x 2P/G.
  EXPECT_LT(row(Strategy::hsdp3).step_seconds, row(Strategy::zero3).step_seconds);
  EXPECT_LT(row(Strategy::hsdp2).step_seconds, row(Strategy::zero2).step_seconds);
  // And the reasons name the hybrid order when it is not the pick.
  ASSERT_TRUE(p.recommendation.strategy.has_value());
}

TEST(Hybrid, ComparedOnlyWhereTheGroupIsNeitherOneRankNorAll) {
  const std::vector<Strategy> zero{Strategy::ddp, Strategy::zero1, Strategy::zero2, Strategy::zero3};
  EXPECT_EQ(compared(nodes_of(1, 8), 8), zero);   // one node: hsdp is ZeRO
  EXPECT_EQ(compared(nodes_of(4, 1), 1), zero);   // groups of one rank shard nothing
  EXPECT_EQ(compared(nodes_of(2, 8), 8).size(), 6u);
  EXPECT_EQ(compared(nodes_of(1, 8), 4).size(), 6u);  // groups of 4 inside one node
  const auto forced = compared(nodes_of(1, 8), 8, Strategy::hsdp3);
  EXPECT_EQ(forced.back(), Strategy::hsdp3);
}

TEST(Hybrid, FlagsAreChecked) {
  RequestFlags f;
  f.model = "tiny-gpt";
  f.gpus = 16;
  f.nodes = 2;
  f.strategy = "hsdp3";
  EXPECT_EQ(build_request(f).training.shard_group, 8);  // default: one node
  f.shard_group = 4;
  EXPECT_EQ(build_request(f).training.shard_group, 4);
  f.shard_group = 3;
  EXPECT_THROW(build_request(f), UsageError);  // does not divide 16
  f.shard_group = 4;
  f.strategy = "zero2";
  EXPECT_THROW(build_request(f), UsageError);  // --shard-group is hybrid's
  RequestFlags one;
  one.model = "tiny-gpt";
  one.gpus = 4;
  one.nodes = 4;
  one.strategy = "hsdp2";
  EXPECT_THROW(build_request(one), UsageError);  // a node of one GPU: a group of 1
}

TEST(Hybrid, PlanFileCarriesTheShardGroup) {
  RequestFlags f;
  f.model = "tiny-gpt";
  f.gpus = 8;
  f.nodes = 2;
  f.strategy = "hsdp3";
  const Planning p = plan(build_request(f));
  const auto j = plan_json(p, *p.chosen());
  EXPECT_EQ(j.at("strategy"), "hsdp3");
  EXPECT_EQ(j.at("shard_group"), 4);
  const PlanDocument back = plan_from_json(j, "hsdp3 plan");
  EXPECT_EQ(back.training.strategy, Strategy::hsdp3);
  EXPECT_EQ(back.training.shard_group, 4);
  // A ZeRO plan carries none (files written before hybrid sharding read alike).
  f.strategy = "zero3";
  const Planning z = plan(build_request(f));
  EXPECT_FALSE(plan_json(z, *z.chosen()).contains("shard_group"));
}
