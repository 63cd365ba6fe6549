#include "dlplan/checkpoint_cost.hpp"

#include "dlplan/step_program.hpp"

#include <algorithm>

namespace dlplan {

CheckpointCost checkpoint_cost(const Model& m, const Cluster& c, const TrainingConfig& t) {
  // fp32 values per parameter: the parameter (the master copy under
  // bf16-mixed) and the optimizer's moments.
  const int64_t states = 1 + (t.optimizer.kind == OptimizerKind::adamw ? 2 : t.optimizer.kind == OptimizerKind::sgd ? 0 : 1);
  // Every parameter is saved once, split over the shard world; hsdp's
  // replicas in the other groups write no parameters (only their buffers).
  // Fine-tuning saves what trains (LoRA's adapters, as peft saves them) and
  // its optimizer state; the frozen base stays the file it came from.
  const int64_t N = std::max<int64_t>(1, shard_world(t, c.world()));
  int64_t buffers = 0;
  for (const ParamInfo& b : m.buffers) buffers += b.numel;
  CheckpointCost k;
  for (int64_t P : unit_trainable_counts(m)) {
    const int64_t share = (P + N - 1) / N;  // rank 0's range is the largest
    k.bytes_per_rank += std::min(P, share) * states * 4;
    k.bytes_total += P * states * 4;
  }
  k.bytes_per_rank += buffers * 4;
  k.bytes_total += c.world() * buffers * 4;
  k.storage_bytes_per_s = c.storage_bytes_per_s > 0 ? c.storage_bytes_per_s : kDefaultStorageBytesPerS;
  k.seconds = static_cast<double>(k.bytes_per_rank) * std::min<int64_t>(c.gpus_per_node, N) / k.storage_bytes_per_s;
  return k;
}

}  // namespace dlplan
