// What a training checkpoint (`dlplan train --checkpoint-dir`) costs: the
// bytes each rank writes and the time to write them at the cluster's storage
// bandwidth. The layout is the executor's (executor checkpoint.hpp): per unit
// of P parameters, rank r writes the fp32 parameters and every optimizer
// moment of its range [r S, (r + 1) S), S = ceil(P / N), plus its copy of the
// BatchNorm running statistics; the manifest is not counted.
#pragma once

#include "dlplan/hardware.hpp"
#include "dlplan/ir.hpp"
#include "dlplan/training.hpp"

#include <cstdint>

namespace dlplan {

struct CheckpointCost {
  int64_t bytes_per_rank = 0;  // the largest shard (rank 0's)
  int64_t bytes_total = 0;     // every shard
  double storage_bytes_per_s = 0;  // per node, as used (the cluster's, or the default)
  double seconds = 0;          // the busiest node's shards at that rate
};

CheckpointCost checkpoint_cost(const Model& m, const Cluster& c, const TrainingConfig& t);

}  // namespace dlplan
