// Collective cost model against hand formulas (Thakur et al. 2005; nccl-tests
// doc/PERFORMANCE.md) and measured busbw (REFERENCES.md "Collectives").
#include "dlplan/comm_model.hpp"
#include "dlplan/error.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace dlplan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

Cluster cluster(const char* kind, int nodes, int gpus_per_node) {
  return Cluster{find_device(kind), nodes, gpus_per_node};
}

// nccl-tests PERFORMANCE.md: busbw = S/t × 2(n-1)/n for all-reduce.
double allreduce_busbw(double S, int n, double t) { return S / t * 2.0 * (n - 1) / n; }

TEST(CommModel, GroupOfOneIsFree) {
  const Cluster c = cluster("h100-80g", 1, 8);
  for (Collective op : {Collective::AllReduce, Collective::ReduceScatter,
                        Collective::AllGather, Collective::Broadcast}) {
    const CollectiveCost cost = collective_cost(c, op, kGiB, 1);
    EXPECT_EQ(cost.seconds, 0) << to_string(op);
    EXPECT_EQ(cost.bytes_sent, 0) << to_string(op);
  }
  EXPECT_GT(collective_cost(c, Collective::AllReduce, kGiB, 2).seconds, 0);  // control
}

TEST(CommModel, BytesSentIsRingAccounting) {
  const Cluster c = cluster("h100-80g", 4, 8);
  const double S = 100e6;
  for (int n : {2, 3, 8, 16, 32}) {
    SCOPED_TRACE(n);
    EXPECT_DOUBLE_EQ(collective_cost(c, Collective::AllReduce, S, n).bytes_sent,
                     2.0 * (n - 1) / n * S);
    EXPECT_DOUBLE_EQ(collective_cost(c, Collective::ReduceScatter, S, n).bytes_sent,
                     1.0 * (n - 1) / n * S);
    EXPECT_DOUBLE_EQ(collective_cost(c, Collective::AllGather, S, n).bytes_sent,
                     1.0 * (n - 1) / n * S);
    EXPECT_DOUBLE_EQ(collective_cost(c, Collective::Broadcast, S, n).bytes_sent,
                     1.0 * (n - 1) / n * S);
    // Control: all-reduce sends twice what reduce-scatter does.
    EXPECT_NE(collective_cost(c, Collective::AllReduce, S, n).bytes_sent,
              collective_cost(c, Collective::ReduceScatter, S, n).bytes_sent);
  }
}

TEST(CommModel, EightH100BusbwMatchesMeasured) {
  // nccl #1455: 8xH100 ring all-reduce busbw ~365-370 GB/s at large sizes.
  const Cluster c = cluster("h100-80g", 1, 8);
  const double S = kGiB;
  const CollectiveCost cost = collective_cost(c, Collective::AllReduce, S, 8);
  EXPECT_EQ(cost.algorithm, "ring");
  const double busbw = allreduce_busbw(S, 8, cost.seconds);
  EXPECT_NEAR(busbw, 365e9, 0.03 * 365e9) << busbw / 1e9 << " GB/s";
  // ...and within 1 % of link × efficiency (latency is negligible at 1 GiB).
  EXPECT_NEAR(busbw, c.device.link_bytes_per_s * c.device.link_efficiency, 0.01 * busbw);
  // Control: 8xA100 comes out at its own measured ~230 GB/s (nccl-tests #149).
  const Cluster a = cluster("a100-80g", 1, 8);
  const double a_busbw =
      allreduce_busbw(S, 8, collective_cost(a, Collective::AllReduce, S, 8).seconds);
  EXPECT_NEAR(a_busbw, 230e9, 0.03 * 230e9);
  EXPECT_GT(std::fabs(busbw - a_busbw), 100e9);
}

TEST(CommModel, IntraNodeRingIsThakurFormula) {
  const Cluster c = cluster("h100-80g", 1, 8);
  const DeviceSpec& d = c.device;
  const double B = d.link_bytes_per_s * d.link_efficiency;
  const double S = 512e6;
  const int n = 8;
  // reduce-scatter / all-gather: base + (n-1)·hop + (n-1)/n·S/B
  const double rs = d.base_latency_s + (n - 1) * d.link_hop_latency_s + 7.0 / 8 * S / B;
  EXPECT_NEAR(collective_cost(c, Collective::ReduceScatter, S, n).seconds, rs, 1e-12);
  EXPECT_NEAR(collective_cost(c, Collective::AllGather, S, n).seconds, rs, 1e-12);
  // all-reduce (ring at this size): base + 2(n-1)·hop + 2(n-1)/n·S/B
  const double ar = d.base_latency_s + 14 * d.link_hop_latency_s + 14.0 / 8 * S / B;
  EXPECT_NEAR(collective_cost(c, Collective::AllReduce, S, n).seconds, ar, 1e-12);
  EXPECT_GT(std::fabs(ar - rs), 1e-4);  // control
  // broadcast: busbw factor 1 (nccl-tests): base + (n-1)·hop + S/B
  EXPECT_NEAR(collective_cost(c, Collective::Broadcast, S, n).seconds,
              d.base_latency_s + 7 * d.link_hop_latency_s + S / B, 1e-12);
}

TEST(CommModel, TinyMessagesAreLatencyBound) {
  const Cluster c = cluster("h100-80g", 1, 8);
  const DeviceSpec& d = c.device;
  const CollectiveCost cost = collective_cost(c, Collective::AllReduce, 8, 8);
  // Tree wins: base + 2·ceil(log2 8)·hop, the bandwidth term is ~0.
  EXPECT_EQ(cost.algorithm, "tree");
  const double latency = d.base_latency_s + 2 * 3 * d.link_hop_latency_s;
  EXPECT_NEAR(cost.seconds, latency, 0.1 * latency);
  // Ring latency would be base + 14 hops: larger.
  EXPECT_LT(cost.seconds, d.base_latency_s + 14 * d.link_hop_latency_s);
  // Control: 1 GiB is nothing like latency-bound.
  EXPECT_GT(collective_cost(c, Collective::AllReduce, kGiB, 8).seconds, 100 * latency);
  // Same for reduce-scatter: base + 7 hops.
  const double rs_lat = d.base_latency_s + 7 * d.link_hop_latency_s;
  EXPECT_NEAR(collective_cost(c, Collective::ReduceScatter, 8, 8).seconds, rs_lat,
              0.1 * rs_lat);
  // Across nodes too: 8 bytes over 4x8 is within 10 % of its latency terms
  // (base + intra RS/AG hops + inter tree hops).
  const Cluster m = cluster("h100-80g", 4, 8);
  const CollectiveCost x = collective_cost(m, Collective::AllReduce, 8, 32);
  EXPECT_EQ(x.algorithm, "hierarchical-tree");
  const double x_lat =
      d.base_latency_s + 2 * 7 * d.link_hop_latency_s + 2 * 2 * d.net_hop_latency_s;
  EXPECT_NEAR(x.seconds, x_lat, 0.1 * x_lat);
}

TEST(CommModel, TreeForSmallRingForLarge) {
  const Cluster c = cluster("h100-80g", 1, 8);
  EXPECT_EQ(collective_cost(c, Collective::AllReduce, 64e3, 8).algorithm, "tree");
  EXPECT_EQ(collective_cost(c, Collective::AllReduce, 256e6, 8).algorithm, "ring");
  // Two ranks: tree depth equals ring steps, ring moves less: always ring.
  EXPECT_EQ(collective_cost(c, Collective::AllReduce, 64, 2).algorithm, "ring");
  // The choice is the faster: never slower than the ring formula.
  const DeviceSpec& d = c.device;
  const double B = d.link_bytes_per_s * d.link_efficiency;
  for (double S : {1e3, 1e5, 1e6, 1e7, 1e9}) {
    const double ring = d.base_latency_s + 14 * d.link_hop_latency_s + 14.0 / 8 * S / B;
    EXPECT_LE(collective_cost(c, Collective::AllReduce, S, 8).seconds, ring + 1e-15);
  }
}

TEST(CommModel, AcrossNodesTheFasterOfHierarchicalAndFlatRing) {
  // 2 nodes x 8 H100. Hierarchical: intra RS + inter AR on S/8 over 2 nodes
  // at NIC rate + intra AG. Flat ring: 2(n-1) network-latency steps at the
  // slower of the NVLink ring and the node's 8 NICs together.
  const Cluster c = cluster("h100-80g", 2, 8);
  const DeviceSpec& d = c.device;
  const double Bl = d.link_bytes_per_s * d.link_efficiency;
  const double Bn = d.net_bytes_per_s * d.net_efficiency;
  auto hierarchical_ar = [&](double S) {
    const double intra = 7 * d.link_hop_latency_s + 7.0 / 8 * S / Bl;
    const double inter_ring = 2 * 1 * d.net_hop_latency_s + 2.0 * 1 / 2 * (S / 8) / Bn;
    return d.base_latency_s + 2 * intra + inter_ring;
  };
  auto hierarchical_rs = [&](double S) {
    return d.base_latency_s + 7 * d.link_hop_latency_s + 7.0 / 8 * S / Bl + 1 * d.net_hop_latency_s +
           1.0 / 2 * (S / 8) / Bn;
  };
  auto flat_ar = [&](double S) {
    return d.base_latency_s + 30 * d.net_hop_latency_s + 30.0 / 16 * S / std::min(Bl, 8 * Bn);
  };
  auto flat_rs = [&](double S) {
    return d.base_latency_s + 15 * d.net_hop_latency_s + 15.0 / 16 * S / std::min(Bl, 8 * Bn);
  };
  // Large: the flat ring streams better (one fewer NVLink pass).
  const double S = kGiB;
  const CollectiveCost big = collective_cost(c, Collective::AllReduce, S, 16);
  EXPECT_EQ(big.algorithm, "ring");
  EXPECT_NEAR(big.seconds, flat_ar(S), 1e-12);
  EXPECT_LT(flat_ar(S), hierarchical_ar(S));
  EXPECT_NEAR(collective_cost(c, Collective::ReduceScatter, S, 16).seconds, std::min(flat_rs(S), hierarchical_rs(S)), 1e-12);
  EXPECT_NEAR(collective_cost(c, Collective::AllGather, S, 16).seconds, std::min(flat_rs(S), hierarchical_rs(S)), 1e-12);
  // Small: 30 network hops cost more than the hierarchy's 2.
  const double small = 64e3;
  const CollectiveCost tiny = collective_cost(c, Collective::AllReduce, small, 16);
  EXPECT_EQ(tiny.algorithm.rfind("hierarchical", 0), 0u);
  EXPECT_LE(tiny.seconds, hierarchical_ar(small) + 1e-15);
  EXPECT_LT(tiny.seconds, flat_ar(small));
  EXPECT_GT(big.seconds - collective_cost(c, Collective::ReduceScatter, S, 16).seconds, 1e-3);  // control
}

TEST(CommModel, CrossingNodesIsSlowerThanOneNode) {
  const Cluster c = cluster("h100-80g", 2, 8);
  const double one = collective_cost(c, Collective::AllReduce, kGiB, 8).seconds;
  const double two = collective_cost(c, Collective::AllReduce, kGiB, 16).seconds;
  EXPECT_GT(two, one);
  EXPECT_EQ(collective_cost(c, Collective::AllReduce, kGiB, 8).algorithm, "ring");
  // Slower NICs (HDR, 24 GB/s per GPU) make the node boundary dominate.
  Cluster hdr = c;
  hdr.device.net_bytes_per_s = 25e9;
  EXPECT_GT(collective_cost(hdr, Collective::AllReduce, kGiB, 16).seconds, 1.5 * one);
  // Control: the same 16 GPUs in one (hypothetical) 16-GPU node are not slower
  // than 8 by more than the 2(n-1)/n factor.
  const Cluster big = cluster("h100-80g", 1, 16);
  const double flat16 = collective_cost(big, Collective::AllReduce, kGiB, 16).seconds;
  EXPECT_LT(flat16, one * (30.0 / 16) / (14.0 / 8) * 1.01);
}

TEST(CommModel, TimeGrowsWithNodes) {
  const Cluster c = cluster("h100-80g", 64, 8);
  for (Collective op : {Collective::AllReduce, Collective::ReduceScatter,
                        Collective::AllGather, Collective::Broadcast}) {
    for (double S : {1e4, 1e8, 4e9}) {
      double prev = 0;
      for (int nodes : {1, 2, 4, 8, 16, 32, 64}) {
        const double t = collective_cost(c, op, S, nodes * 8).seconds;
        EXPECT_GT(t, prev) << to_string(op) << " S=" << S << " nodes=" << nodes;
        prev = t;
      }
    }
  }
}

TEST(CommModel, FasterLinksAreFaster) {
  const double a = collective_cost(cluster("a100-80g", 1, 8), Collective::AllReduce, kGiB, 8).seconds;
  const double h = collective_cost(cluster("h100-80g", 1, 8), Collective::AllReduce, kGiB, 8).seconds;
  const double b = collective_cost(cluster("b200", 1, 8), Collective::AllReduce, kGiB, 8).seconds;
  const double l = collective_cost(cluster("l40s", 1, 8), Collective::AllReduce, kGiB, 8).seconds;
  EXPECT_LT(b, h);
  EXPECT_LT(h, a);
  EXPECT_LT(a, l);
}

TEST(CommModel, BadGroupsAreErrors) {
  const Cluster c = cluster("h100-80g", 2, 8);
  EXPECT_THROW(collective_cost(c, Collective::AllReduce, 1e6, 12), Error);  // 12 % 8 != 0
  EXPECT_THROW(collective_cost(c, Collective::AllReduce, 1e6, 32), Error);  // > world
  EXPECT_THROW(collective_cost(c, Collective::AllReduce, 1e6, 0), Error);
  EXPECT_THROW(collective_cost(c, Collective::AllReduce, -1, 8), Error);
  EXPECT_NO_THROW(collective_cost(c, Collective::AllReduce, 1e6, 16));  // control
  EXPECT_NO_THROW(collective_cost(c, Collective::AllReduce, 1e6, 4));   // within a node
}

TEST(CommModel, Names) {
  EXPECT_EQ(to_string(Collective::AllReduce), "all-reduce");
  EXPECT_EQ(to_string(Collective::ReduceScatter), "reduce-scatter");
  EXPECT_EQ(to_string(Collective::AllGather), "all-gather");
  EXPECT_EQ(to_string(Collective::Broadcast), "broadcast");
}

}  // namespace
}  // namespace dlplan
