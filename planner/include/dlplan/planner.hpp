// Planning: evaluate every strategy for a model on a cluster (memory walk,
// compute and communication time), advise on SyncBatchNorm, recommend.
#pragma once

#include "dlplan/hardware.hpp"
#include "dlplan/ir.hpp"
#include "dlplan/step_walk.hpp"
#include "dlplan/training.hpp"

#include <optional>
#include <string>
#include <vector>

namespace dlplan {

enum class SyncBnMode { automatic, on, off };
SyncBnMode parse_syncbn_mode(std::string_view s);

// "Fits" compares peak + runtime + this share of the peak (allocator
// fragmentation; PyTorch's caching allocator rounds and splits blocks) with the
// device memory.
inline constexpr double kFragmentationMargin = 0.05;
// SyncBN is advised when a GPU normalizes over fewer samples than this (Wu &
// He, Group Normalization, ECCV'18: ResNet-50 BN error 23.6% at 32 images per
// GPU, 34.7% at 2).
inline constexpr int kSyncBnThreshold = 16;

struct PlanRequest {
  Model model;
  Cluster cluster;
  TrainingConfig training;                // strategy ignored unless forced
  std::optional<Strategy> forced;         // --strategy
  SyncBnMode syncbn = SyncBnMode::automatic;
  int syncbn_threshold = kSyncBnThreshold;
  bool explain = false;
};

struct CommSummary {
  double bytes = 0;            // sent per GPU per step
  double seconds = 0;          // communication busy time
  double exposed_seconds = 0;  // the part compute waits for
};

struct StrategyResult {
  Strategy strategy = Strategy::ddp;
  TrainingConfig training;     // as evaluated (strategy, syncbn filled in)
  StepWalk walk;
  int64_t runtime_bytes = 0;
  int64_t margin_bytes = 0;
  int64_t capacity_bytes = 0;
  bool fits = false;
  double compute_seconds = 0;
  CommSummary comm;
  double syncbn_seconds = 0;
  double step_seconds = 0;
  double model_flops = 0;      // forward + backward per device per step, recomputation excluded
  double mfu = 0;
};

struct SyncBnAdvice {
  bool applicable = false;
  bool recommended = false;
  bool enabled = false;        // what the plans use (auto follows the advice)
  int group_size = 1;
  int bn_layers = 0;
  double seconds = 0;          // per step, at group_size (blocking)
  double share = 0;            // of the recommended plan's step
  std::string reason;
};

struct Recommendation {
  std::optional<Strategy> strategy;  // none when nothing fits
  bool syncbn = false;
  std::vector<std::string> reasons;
};

struct Planning {
  PlanRequest request;
  std::vector<StrategyResult> results;   // one per strategy, ddp..zero3
  SyncBnAdvice syncbn;
  Recommendation recommendation;
  const StrategyResult* chosen() const;  // the recommended (or forced) row, or null
};

// Memory the device offers one rank: the catalog figure, or for `cpu` the
// host's memory divided among the ranks of a node.
int64_t device_capacity(const Cluster& c);

// Checks a request a user could have got wrong (precision on the device,
// micro-batch, accumulation, SyncBN group); throws dlplan::Error.
void validate(const PlanRequest& r);

StrategyResult evaluate(const Model& m, const Cluster& c, const TrainingConfig& t, bool explain = false);
SyncBnAdvice advise_syncbn(const Model& m, const Cluster& c, const TrainingConfig& t, SyncBnMode mode, int threshold);
double syncbn_seconds(const Model& m, const Cluster& c, int group, int64_t grad_accum);
Planning plan(const PlanRequest& r);

}  // namespace dlplan
