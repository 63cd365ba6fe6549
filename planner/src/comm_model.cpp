// Collective cost model (see comm_model.hpp and REFERENCES.md "Collectives").
//
// Every time is  latency + bytes / bandwidth  in the NCCL manner:
//   * alpha-beta ring costs from Thakur, Rabenseifner & Gropp, "Optimization of
//     Collective Communication Operations in MPICH" (IJHPCA 2005):
//       reduce-scatter, all-gather: (p-1)·alpha + (p-1)/p · S · beta
//       all-reduce (RS + AG):       2(p-1)·alpha + 2(p-1)/p · S · beta
//   * alpha split as in NCCL src/graph/tuning.cc: one base latency per
//     collective plus a per-hop latency per ring step (NVLink/PCIe within a
//     node, network across nodes); ring steps 2(n-1) for all-reduce, n-1 for
//     reduce-scatter / all-gather (/ broadcast).
//   * beta = 1 / (link rate × efficiency): nccl-tests doc/PERFORMANCE.md's busbw
//     is comparable to one link's rate, so "busbw = rate × efficiency" is what
//     the catalog's efficiencies are fitted to (e.g. 8xH100 ~365 GB/s of 450).
#include "dlplan/comm_model.hpp"

#include "dlplan/collective_costs.hpp"
#include "dlplan/error.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace dlplan {

std::string to_string(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "all-reduce";
    case Collective::ReduceScatter: return "reduce-scatter";
    case Collective::AllGather: return "all-gather";
    case Collective::Broadcast: return "broadcast";
  }
  return "unknown";
}

namespace {

// ceil(log2 n) for n >= 1: depth of a (double) binary tree over n ranks.
int ceil_log2(int n) {
  int d = 0;
  while ((1 << d) < n) ++d;
  return d;
}

// One level of the topology: p ranks joined by links of effective bandwidth
// `bw` (bytes/s, already × efficiency) and per-step latency `hop` (s).
// Each returns the time without the collective's base latency.
struct Level {
  int p;
  double bw;
  double hop;

  // Ring reduce-scatter / all-gather of a buffer of S bytes (Thakur et al.
  // 2005 §4: p-1 steps, each moving S/p): (p-1)·hop + (p-1)/p·S/bw.
  double ring_rs_ag(double S) const {
    if (p <= 1) return 0;
    return (p - 1) * hop + (p - 1) / static_cast<double>(p) * S / bw;
  }
  // Ring all-reduce = reduce-scatter + all-gather (Thakur et al. 2005, the
  // Patarasuk-Yuan bandwidth-optimal ring; NCCL ring): 2(p-1) steps,
  // 2(p-1)/p·S per rank: 2(p-1)·hop + 2(p-1)/p·S/bw.
  double ring_ar(double S) const {
    if (p <= 1) return 0;
    return 2 * (p - 1) * hop + 2 * (p - 1) / static_cast<double>(p) * S / bw;
  }
  // Double binary tree all-reduce (NCCL >= 2.4; Sanders, Speck & Träff 2009):
  // a pipelined reduce up and broadcast down each of two trees, each tree
  // carrying S/2. Latency: depth ceil(log2 p) up and down, 2·ceil(log2 p)
  // hops (NCCL tuning.cc counts tree latency per tree level, not per rank).
  // Bandwidth: a rank is interior in one tree (receives 2·S/2, sends S/2 up,
  // then 2·S/2 down) and a leaf in the other (sends S/2 up), so it sends 2S
  // in all: 2·S/bw — busbw (p-1)/p × the link, below the ring's, as
  // NCCL's intra-node tree is (its tuning scales tree bandwidth down).
  double tree_ar(double S) const {
    if (p <= 1) return 0;
    return 2 * ceil_log2(p) * hop + 2 * S / bw;
  }
  // Pipelined ring (chain) broadcast: p-1 hops for the first chunk to reach
  // the last rank, then the whole buffer streams through each link once:
  // (p-1)·hop + S/bw. nccl-tests PERFORMANCE.md: broadcast busbw = algbw
  // (factor 1), i.e. t = S / busbw.
  double ring_bcast(double S) const {
    if (p <= 1) return 0;
    return (p - 1) * hop + S / bw;
  }
};

// Ring accounting of what one rank sends (DESIGN.md "Strategies": comm.bytes):
// all-reduce 2(n-1)/n·S; reduce-scatter, all-gather (n-1)/n·S; broadcast
// (n-1)/n·S — a pipelined ring broadcast sends S from each of n-1 ranks
// (all but the last), (n-1)/n·S per rank on average. The hierarchical
// algorithm sends the same total: e.g. all-reduce
// 2(g-1)/g·S + 2(k-1)/k·S/g = 2(n-1)/n·S.
double ring_bytes_sent(Collective op, double S, int n) {
  const double f = (n - 1) / static_cast<double>(n);
  return op == Collective::AllReduce ? 2 * f * S : f * S;
}

}  // namespace

CollectiveCost collective_cost(const Cluster& cluster, Collective op, double bytes,
                               int group_size, int stride) {
  const int n = group_size;
  const int g = cluster.gpus_per_node;
  const DeviceSpec& d = cluster.device;
  if (n < 1)
    throw Error("collective " + to_string(op) + ": group size must be positive (got " +
                std::to_string(n) + ")");
  if (!(bytes >= 0) || !std::isfinite(bytes))
    throw Error("collective " + to_string(op) + ": buffer size must be a non-negative "
                "number of bytes (got " + std::to_string(bytes) + ")");
  if (g < 1 || cluster.nodes < 1)
    throw Error("cluster: nodes and gpus_per_node must be positive (got " +
                std::to_string(cluster.nodes) + " x " + std::to_string(g) + ")");
  if (stride < 1 || (stride > 1 && static_cast<int64_t>(n) * stride > cluster.world()))
    throw Error("collective " + to_string(op) + " over " + std::to_string(n) + " ranks " + std::to_string(stride) +
                " apart: the cluster has only " + std::to_string(cluster.world()));
  if (n > cluster.world())
    throw Error("collective " + to_string(op) + " over " + std::to_string(n) +
                " ranks: the cluster has only " + std::to_string(cluster.world()) + " (" +
                std::to_string(cluster.nodes) + " nodes x " + std::to_string(g) + ")");

  CollectiveCost out;
  if (n == 1) return out;  // nothing to communicate
  if (bytes == 0) {        // NCCL returns at once for count 0
    out.algorithm = "none";
    return out;
  }
  const double S = bytes;
  out.bytes_sent = ring_bytes_sent(op, S, n);

  // The group's ranks per node: contiguous groups fill a node; a strided
  // group has g / stride of each node (one when stride >= g).
  const int local = stride == 1 ? std::min(n, g) : (g % stride == 0 ? std::min(n, g / stride) : 1);
  const Level intra{local, d.link_bytes_per_s * d.link_efficiency,
                    d.link_hop_latency_s};

  if (n <= local) {
    // ---- One node, the group calibrate measured: its ladder
    // (collective_costs.hpp), what this machine really took at these sizes.
    if (const auto& table = cluster.collective_costs; table && stride == 1 && n == table->ranks)
      if (std::optional<double> t = table->seconds(op, S)) {
        out.seconds = *t;
        out.algorithm = "measured";
        return out;
      }
    // ---- One node: flat ring (or tree for all-reduce) over the local links.
    double t = 0;
    std::string algo = "ring";
    switch (op) {
      case Collective::AllReduce: {
        const double ring = intra.ring_ar(S);
        const double tree = intra.tree_ar(S);
        // NCCL picks the faster by the same kind of model (tuning.cc):
        // tree for small messages at larger n, ring for large messages.
        if (tree < ring) {
          t = tree;
          algo = "tree";
        } else {
          t = ring;
        }
        break;
      }
      case Collective::ReduceScatter:
      case Collective::AllGather: t = intra.ring_rs_ag(S); break;
      case Collective::Broadcast: t = intra.ring_bcast(S); break;
    }
    out.seconds = d.base_latency_s + t;
    out.algorithm = algo;
    return out;
  }

  // ---- Across nodes: k nodes of g GPUs, hierarchical (REFERENCES.md
  // "Collectives", last bullet): intra-node reduce-scatter of S over g,
  // inter-node collective on S/g over k nodes with all g NICs in parallel
  // (GPU i of every node talks to GPU i of the others: rail-aligned), then
  // intra-node all-gather. Phases are summed (not overlapped), and one base
  // latency is charged for the whole collective (NCCL launches one kernel).
  if (n % local != 0)
    throw Error("collective " + to_string(op) + " over " + std::to_string(n) +
                " ranks spans nodes of " + std::to_string(g) +
                " GPUs: the group size must then be a multiple of gpus_per_node");
  const int k = n / local;
  const Level inter{k, d.net_bytes_per_s * d.net_efficiency, d.net_hop_latency_s};
  const double shard = S / local;  // what each GPU (and its NIC) carries across nodes

  double t = 0;
  std::string algo = "hierarchical-ring";
  switch (op) {
    case Collective::AllReduce: {
      // intra RS + inter AR (ring or double binary tree) + intra AG.
      const double ring = inter.ring_ar(shard);
      const double tree = inter.tree_ar(shard);
      double mid = ring;
      if (tree < ring) {
        mid = tree;
        algo = "hierarchical-tree";
      }
      t = intra.ring_rs_ag(S) + mid + intra.ring_rs_ag(S);
      break;
    }
    case Collective::ReduceScatter:
      // intra RS of S (each GPU then holds S/g reduced over its node), then
      // inter RS of that S/g over k nodes (each ends with S/n).
      t = intra.ring_rs_ag(S) + inter.ring_rs_ag(shard);
      break;
    case Collective::AllGather:
      // inter AG of the S/g slices (GPU i of every node gathers slice i),
      // then intra AG of S over g.
      t = inter.ring_rs_ag(shard) + intra.ring_rs_ag(S);
      break;
    case Collective::Broadcast:
      // Scatter-then-all-gather broadcast (van de Geijn): the root node
      // scatters S over its g GPUs ((g-1)/g·S on the links), each GPU
      // broadcasts its S/g slice along its rail to the other k-1 nodes
      // (pipelined), then every node all-gathers S.
      t = intra.ring_rs_ag(S) + inter.ring_bcast(shard) + intra.ring_rs_ag(S);
      break;
  }
  // Flat ring across all n ranks, as NCCL builds it by default: one ring per
  // channel, each leaving a node through a different NIC (rail-aligned), so
  // the ring's bandwidth is the slower of the NVLink ring and the g NICs of a
  // node together; every step waits for a network hop. NCCL's tuner picks the
  // faster algorithm for the size (tuning.cc), and so do we.
  const Level flat{n, std::min(intra.bw, local * inter.bw), d.net_hop_latency_s};
  double flat_t = -1;
  switch (op) {
    case Collective::AllReduce: flat_t = flat.ring_ar(S); break;
    case Collective::ReduceScatter:
    case Collective::AllGather: flat_t = flat.ring_rs_ag(S); break;
    case Collective::Broadcast: break;  // scatter + all-gather above is the better one
  }
  if (flat_t >= 0 && flat_t < t) {
    t = flat_t;
    algo = "ring";
  }
  out.seconds = d.base_latency_s + t;
  out.algorithm = algo;
  return out;
}

}  // namespace dlplan
