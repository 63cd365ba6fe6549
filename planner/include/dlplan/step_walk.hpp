// The dry run of a step program (step_program.hpp): every allocation counted
// in its category as the executor will make it. Yields the memory peak (with
// its breakdown and, on request, the tensors that make it), the timeline, and
// the program's compute and communication events.
#pragma once

#include "dlplan/step_program.hpp"

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace dlplan {

// A tensor alive at the peak, for --explain.
struct LiveTensor {
  std::string what;     // "h.3.attn.probs", "grad of h.3.mlp.fc", "bucket 4", ...
  std::string holder;   // the op (or mechanism) that keeps it alive
  Category category = Category::workspace;
  int64_t bytes = 0;
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
// The same over a program already built (with names when opt.explain).
StepWalk walk_program(const StepProgram& prog, const WalkOptions& opt, int64_t grad_accum);

}  // namespace dlplan
