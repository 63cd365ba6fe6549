// Planning: evaluate every strategy for a model on a cluster (memory walk,
// compute and communication time), advise on SyncBatchNorm, recommend.
#pragma once

#include "dlplan/error.hpp"
#include "dlplan/hardware.hpp"
#include "dlplan/ir.hpp"
#include "dlplan/step_walk.hpp"
#include "dlplan/training.hpp"

#include <optional>
#include <array>
#include <string>
#include <vector>

namespace dlplan {

// A value or combination of values that cannot be used: a usage error (the
// CLI exits with 2). The message names the flag, as `dlplan plan` spells it.
class UsageError : public Error {
 public:
  using Error::Error;
};

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
// The band a predicted step time is good to where the device states none
// (DeviceSpec::time_uncertainty): GPUs without published runs to validate on.
// 0.25 is the worst held-out error of the GPUs that have them (24.5 %, MPT-30B
// on H100; docs/gpu-time-model.md Validation), rounded up.
inline constexpr double kDefaultTimeUncertainty = 0.25;

// How far a predicted step may be off, and why that much.
struct TimeBand {
  double relative = kDefaultTimeUncertainty;  // 0.1: the measured step is within +-10 %
  std::string source;
};
TimeBand time_band(const Cluster& c);

// Built from flags by build_request (dlplan/request.hpp), or by hand.
struct PlanRequest {
  Model model;
  Cluster cluster;
  TrainingConfig training;                // strategy ignored unless forced
  std::optional<Strategy> forced;         // --strategy
  SyncBnMode syncbn = SyncBnMode::automatic;
  int syncbn_threshold = kSyncBnThreshold;
  bool explain = false;
  // --micro-batch max: each strategy gets the largest micro-batch that fits;
  // with global_batch > 0, micro-batch x accumulation x GPUs stays equal to it.
  bool max_micro_batch = false;
  int64_t global_batch = 0;
  // What the plan was built from, for the header: the --cluster file ("" for
  // a catalog GPU) and the model's own sequence length (0: no token inputs).
  std::string cluster_source;
  int64_t model_context = 0;
};

// The strategies a planning compares, in DESIGN.md's order of simplicity:
// ddp, zero1, zero2, zero3, then hsdp2 and hsdp3 where hybrid sharding
// differs from ZeRO (a shard group of 2 or more ranks, fewer than all), and
// `forced` whatever it is. Under --offload only the strategies it goes with
// (offload_conflict).
std::vector<Strategy> strategies_to_compare(const Cluster& c, const TrainingConfig& t,
                                            std::optional<Strategy> forced = std::nullopt);

struct CommSummary {
  double bytes = 0;            // sent per GPU per step
  double seconds = 0;          // communication busy time
  double exposed_seconds = 0;  // the part compute waits for
};

// CPU offload: what one node keeps in host memory (host_states of each of
// its ranks) against what it has (the cluster's host_memory_bytes; on the
// cpu device, what the ranks' device pools leave of the same memory).
struct HostMemory {
  CategoryBytes per_rank{};  // params, grads, optimizer (step_program.hpp)
  int ranks = 0;             // ranks per node
  int64_t per_node = 0;
  int64_t capacity = 0;      // 0: the cluster does not say (then not checked)
  bool fits = true;
};

struct StrategyResult {
  Strategy strategy = Strategy::ddp;
  TrainingConfig training;     // as evaluated (strategy, syncbn filled in)
  StepWalk walk;
  int64_t runtime_bytes = 0;
  int64_t margin_bytes = 0;
  int64_t capacity_bytes = 0;
  bool fits = false;            // device and, under offload, host memory
  HostMemory host;              // all 0 without offload
  double compute_seconds = 0;
  CommSummary comm;
  double syncbn_seconds = 0;
  double step_seconds = 0;
  double model_flops = 0;      // forward + backward per device per step, recomputation excluded
  double mfu = 0;
  // Where the ops' times came from (Simulation::cost_sources), and why a
  // cluster's measured op costs were not used.
  std::array<int, 4> cost_sources{};  // kCostSources (op_costs.hpp)
  std::string cost_table_unused;
  int comm_measured = 0, comm_modeled = 0;  // Simulation's
};

struct SyncBnAdvice {
  bool applicable = false;
  bool recommended = false;
  bool enabled = false;        // what the plans use (auto follows the advice)
  int group_size = 1;          // ranks per group when enabled (1: no group)
  bool crosses_nodes = false;  // the group spans nodes (said why in `reason`)
  int bn_layers = 0;
  double seconds = 0;          // per step when enabled, at group_size (blocking); 0 when off
  double share = 0;            // of the recommended plan's step
  // When it is off but applicable on several GPUs: what turning it on would
  // cost (--syncbn on syncs all GPUs unless --syncbn-group says otherwise).
  int if_enabled_group = 0;
  double if_enabled_seconds = 0;
  std::string reason;
};

// A change to the request that makes a strategy fit, and what it costs.
struct SuggestedChange {
  std::string what;            // "flash attention (--attention flash)"
  Strategy strategy = Strategy::ddp;  // the strategy recommended after the change
  int64_t peak_bytes = 0;      // its peak (plus runtime and margin it fits)
  int gpus = 0;                // GPUs in all after the change
  int64_t global_batch = 0;    // samples per step after the change
  // Relative GPU time per sample against the request as asked (which does
  // not fit): 0.1 = 10% more. Negative when the change is also faster.
  double cost = 0;
};

struct Recommendation {
  std::optional<Strategy> strategy;  // none when nothing fits
  bool syncbn = false;
  std::vector<std::string> reasons;
  // When nothing fits (or the forced strategy does not): the changes that
  // would fit, cheapest first; changes on the same GPUs before more GPUs.
  std::vector<SuggestedChange> changes;
  // The predicted steps' band. The simpler strategy wins unless a more
  // complex one is faster by more than it.
  TimeBand time_band;
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
// micro-batch, accumulation, SyncBN group); throws UsageError.
void validate(const PlanRequest& r);

StrategyResult evaluate(const Model& m, const Cluster& c, const TrainingConfig& t, bool explain = false);
SyncBnAdvice advise_syncbn(const Model& m, const Cluster& c, const TrainingConfig& t, SyncBnMode mode, int threshold);
double syncbn_seconds(const Model& m, const Cluster& c, int group, int64_t grad_accum);
Planning plan(const PlanRequest& r);

// The recommendation as the CLI and the GUI print it: "Recommendation: ...",
// its reasons ("  - ..."), then the SyncBatchNorm advice and its cost.
std::vector<std::string> recommendation_lines(const Planning& p);

}  // namespace dlplan
