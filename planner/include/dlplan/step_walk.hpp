// One walk of a training step, in the order the executor runs it: forward in
// topological order, backward in reverse (recomputing checkpointed units), the
// optimizer. Every tensor is allocated and freed where the executor does so,
// each in one of DESIGN.md's memory categories, and every collective is
// recorded where it is issued and where compute waits for it. The walk yields
// the memory peak (with its breakdown and, on request, the tensors that make
// it), the compute events and the communication events of the step.
#pragma once

#include "dlplan/comm_model.hpp"
#include "dlplan/hardware.hpp"
#include "dlplan/ir.hpp"
#include "dlplan/training.hpp"

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace dlplan {

enum class Category { params, grads, optimizer, activations, gathered, comm, workspace };
inline constexpr int kCategories = 7;
inline constexpr std::array<Category, kCategories> kAllCategories = {
    Category::params,   Category::grads, Category::optimizer, Category::activations,
    Category::gathered, Category::comm,  Category::workspace};
const char* to_string(Category c);

using CategoryBytes = std::array<int64_t, kCategories>;
int64_t total(const CategoryBytes& b);

// A tensor alive at the peak, for --explain.
struct LiveTensor {
  std::string what;     // "h.3.attn.probs", "grad of h.3.mlp.fc", "bucket 4", ...
  std::string holder;   // the op (or mechanism) that keeps it alive
  Category category = Category::workspace;
  int64_t bytes = 0;
};

enum class Phase { forward, backward, recompute, optimizer };
const char* to_string(Phase p);

struct ComputeEvent {
  std::string name;     // node name, or "optimizer"
  Phase phase = Phase::forward;
  int node = -1;
  double flops = 0;     // for the whole micro-batch
  double bytes = 0;     // memory traffic estimate
};

struct CommEvent {
  std::string name;       // "bucket 3", "h.2 all-gather", "bn1 syncbn stats"
  Collective op = Collective::AllReduce;
  double bytes = 0;       // the collective's buffer size S (padding included)
  int group = 1;          // ranks taking part
  int issue_after = -1;   // compute event index after which it is issued (-1: step start)
  int wait_before = -1;   // compute event index that waits for it (-1: end of step)
  bool blocking = false;  // compute waits at once (SyncBN)
  int per_step = 1;       // how often it happens per step (grad accumulation)
};

struct MemoryPoint {
  int event = -1;         // compute event index this point follows
  CategoryBytes bytes{};
};

struct WalkOptions {
  bool explain = false;   // keep the tensors alive at the peak
  bool timeline = false;  // keep bytes per category after every compute event
};

struct StepWalk {
  CategoryBytes at_peak{};     // the categories when their sum peaks
  CategoryBytes max_each{};    // per-category maxima (labelled as such when shown)
  int64_t peak = 0;            // total(at_peak)
  int peak_event = -1;         // compute event at or after which the peak happens
  std::vector<LiveTensor> peak_tensors;  // with WalkOptions::explain, largest first
  std::vector<MemoryPoint> timeline;     // with WalkOptions::timeline
  std::vector<ComputeEvent> compute;     // one micro-batch; optimizer last
  std::vector<CommEvent> comm;
  int backward_start = -1;     // index of the first backward compute event
  int64_t grad_accum = 1;
};

StepWalk walk_step(const Model& m, const Cluster& cluster, const TrainingConfig& cfg, const WalkOptions& opt = {});

// Persistent model states per device (params incl. buffers, grads, optimizer)
// as the strategy keeps them: the ZeRO paper's accounting plus padding.
CategoryBytes model_states(const Model& m, int world, const TrainingConfig& cfg);

}  // namespace dlplan
