// Collective cost model: latency + bytes / bandwidth in the NCCL manner.
//   ring (Thakur, Rabenseifner & Gropp 2005): all-gather / reduce-scatter take
//   (p-1) steps moving (p-1)/p of the data; all-reduce 2(p-1) steps and 2(p-1)/p.
//   busbw factors as nccl-tests doc/PERFORMANCE.md.
//   Across nodes: hierarchical (intra-node reduce-scatter, inter-node collective
//   on 1/g of the data over all g NICs in parallel, intra-node all-gather).
#pragma once

#include "dlplan/hardware.hpp"

#include <cstdint>
#include <string>

namespace dlplan {

enum class Collective { AllReduce, ReduceScatter, AllGather, Broadcast };
std::string to_string(Collective c);

// A group of `size` ranks. Contiguous ranks: `size` <= gpus_per_node stays in
// one node; otherwise it spans size / gpus_per_node nodes (size must then be a
// multiple of gpus_per_node).
struct CollectiveCost {
  double seconds = 0;       // time of the collective on the slowest link
  double bytes_sent = 0;    // what one rank sends (ring accounting, DESIGN.md)
  std::string algorithm;    // "ring", "tree", "hierarchical-ring", ... (the chosen one)
};

// `bytes` is the collective's full buffer size S (all-reduce: the buffer;
// reduce-scatter: the input, N shards; all-gather: the output, N shards).
// Returns zero cost for group size 1.
// `stride` > 1: the group is the ranks equal modulo `stride` (hybrid
// sharding's replicas of one shard: ranks r, r+G, r+2G, ...); every rank of a
// node is then in such a collective at once, each over its own NIC (rail).
// It holds gpus_per_node / stride ranks of a node when stride divides
// gpus_per_node, else one.
CollectiveCost collective_cost(const Cluster& cluster, Collective op,
                               double bytes, int group_size, int stride = 1);

}  // namespace dlplan
