// SyncBatchNorm advice and cost.
// Cost, as PyTorch's SyncBatchNorm (torch/nn/modules/_functions.py): per BN
// layer, forward all-gathers (mean, invstd, count), 2C+1 fp32 values per rank,
// and backward all-reduces (sum dy, sum dy*xhat), 2C values. Both block the
// layer, and are small, so latency-bound: a group that spans nodes pays the
// network's latency on every one of them (docs/cluster.md).
#include "dlplan/comm_model.hpp"
#include "dlplan/error.hpp"
#include "dlplan/format.hpp"
#include "dlplan/planner.hpp"

#include <fmt/format.h>

namespace dlplan {

double syncbn_seconds(const Model& m, const Cluster& c, int group, int64_t grad_accum) {
  if (group <= 1) return 0;
  double s = 0;  // collective_cost puts a group of contiguous ranks inside a node when it fits in one
  for (const auto& n : m.nodes) {
    if (n.op != OpKind::batchnorm) continue;
    double ch = static_cast<double>(m.tensor(n.inputs[0]).shape[0]);
    s += collective_cost(c, Collective::AllGather, group * (2 * ch + 1) * 4, group).seconds;
    s += collective_cost(c, Collective::AllReduce, 2 * ch * 4, group).seconds;
  }
  return s * static_cast<double>(grad_accum);
}

namespace {

// Groups are contiguous ranks: inside a node a group size must divide the
// GPUs per node, across nodes it must be whole nodes; and it divides N.
bool valid_group(const Cluster& c, int g) {
  const int N = c.world();
  if (g < 1 || N % g != 0) return false;
  return g <= c.gpus_per_node ? c.gpus_per_node % g == 0 : g % c.gpus_per_node == 0;
}

// The smallest valid group inside a node whose samples reach the threshold;
// 0 when none does.
int smallest_in_node_group(const Cluster& c, int64_t micro_batch, int threshold) {
  for (int g = 1; g <= c.gpus_per_node; ++g)
    if (valid_group(c, g) && g * micro_batch >= threshold) return g;
  return 0;
}

int largest_in_node_group(const Cluster& c) {
  for (int g = c.gpus_per_node; g > 1; --g)
    if (valid_group(c, g)) return g;
  return 1;
}

// The smallest valid group across nodes that reaches the threshold, or all N.
int smallest_cross_node_group(const Cluster& c, int64_t micro_batch, int threshold) {
  for (int g = c.gpus_per_node + 1; g <= c.world(); ++g)
    if (valid_group(c, g) && g * micro_batch >= threshold) return g;
  return c.world();
}

}  // namespace

SyncBnAdvice advise_syncbn(const Model& m, const Cluster& c, const TrainingConfig& t, SyncBnMode mode, int threshold) {
  SyncBnAdvice a;
  for (const auto& n : m.nodes) a.bn_layers += n.op == OpKind::batchnorm;
  a.applicable = a.bn_layers > 0;
  const int N = c.world();
  if (!a.applicable) {
    a.reason = "Not applicable: the model has no batchnorm layers.";
    if (mode == SyncBnMode::on) throw UsageError(fmt::format("{}: --syncbn on, but the model has no batchnorm layers", m.source));
    return a;
  }
  const int64_t b = t.micro_batch;
  int advised = 1;  // the group the advice names
  if (b >= threshold) {
    a.reason = fmt::format(
        "Not needed: each GPU normalizes over {} samples (>= {}), where plain BatchNorm is as accurate "
        "(Wu & He 2018: ResNet-50 BN error 23.6% at 32 images per GPU, 34.7% at 2).",
        b, threshold);
  } else if (N == 1) {
    a.reason = fmt::format(
        "Only {} samples per BatchNorm, but with one GPU there is nothing to synchronize: raise the micro-batch "
        "or consider GroupNorm (Wu & He 2018).",
        b);
  } else {
    a.recommended = true;
    if (int g = smallest_in_node_group(c, b, threshold); g > 0) {
      advised = g;
      a.reason = fmt::format(
          "Recommended: {} samples per GPU is below {}; syncing BatchNorm over groups of {} GPUs inside a node gives {} "
          "samples per statistic (Wu & He 2018: error 34.7% at 2 images per GPU vs 23.6% at 32).",
          b, threshold, g, g * b);
    } else if (c.nodes > 1) {
      // No group inside a node reaches the threshold: cross nodes, and say why.
      advised = smallest_cross_node_group(c, b, threshold);
      const int in_node = largest_in_node_group(c);
      a.reason = fmt::format(
          "Recommended: {} samples per GPU is below {}, and no group inside a node reaches it (a node's {} GPUs give "
          "{}); groups of {} GPUs across {} nodes give {} samples per statistic{}, at the network's latency per BN "
          "layer: {} per step, against {} for groups of {} inside a node (--syncbn-group {}).",
          b, threshold, in_node, in_node * b, advised, advised / c.gpus_per_node, advised * b,
          advised * b >= threshold ? "" : " (all of them, still below)", format_seconds(syncbn_seconds(m, c, advised, t.grad_accum)),
          format_seconds(syncbn_seconds(m, c, in_node, t.grad_accum)), in_node, in_node);
    } else {
      advised = N;
      a.reason = fmt::format(
          "Recommended: {} samples per GPU is below {}; even all {} GPUs together give only {} samples per "
          "statistic, so sync across all of them (Wu & He 2018).",
          b, threshold, N, N * b);
    }
  }
  switch (mode) {
    case SyncBnMode::automatic: a.enabled = a.recommended; break;
    case SyncBnMode::on: a.enabled = N > 1; break;
    case SyncBnMode::off: a.enabled = false; break;
  }
  int group = a.recommended ? advised : N;  // --syncbn on without advice: all GPUs
  if (t.syncbn_group > 0) {
    if (!valid_group(c, t.syncbn_group))
      throw UsageError(fmt::format(
          "--syncbn-group {} must divide the {} GPUs and either divide a node's {} GPUs or be whole nodes "
          "(groups are contiguous ranks)",
          t.syncbn_group, N, c.gpus_per_node));
    group = t.syncbn_group;
  }
  a.group_size = a.recommended ? advised : 1;  // the advice's group, whether or not the plans use it
  if (a.enabled) {
    a.group_size = group;
    a.crosses_nodes = group > c.gpus_per_node;
    a.seconds = syncbn_seconds(m, c, group, t.grad_accum);
  } else if (N > 1) {
    a.if_enabled_group = group;
    a.if_enabled_seconds = syncbn_seconds(m, c, group, t.grad_accum);
  }
  return a;
}

}  // namespace dlplan
