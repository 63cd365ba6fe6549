// --explain: what makes up the peak of the explained strategy (the
// recommended one, else the last), and how its model states compare with the
// published formulas users know: the ZeRO paper's and DeepSpeed's estimators
// (docs/deepspeed.md says why they differ). Text for the table, JSON for
// --format json.
#pragma once

#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"

#include <string>
#include <vector>

namespace dlplan {

// The row --explain describes: the chosen one, or the last (zero3).
const StrategyResult& explained_row(const Planning& p);

// A published estimate of one strategy's model states per GPU.
struct StateEstimate {
  std::string source;     // "ZeRO paper", "DeepSpeed estimate_zero2_model_states_mem_needs"
  std::string formula;    // "4Ψ + 16Ψ/N"
  double bytes = 0;
  std::vector<std::string> differences;  // why dlplan's number differs, one line each
};

struct ModelStates {
  int64_t bytes = 0;               // params + grads + optimizer (+ gathered for zero3) at the peak
  std::vector<StateEstimate> estimates;
  // CPU offload: the host memory of one node, and the published estimates of it.
  int64_t host_bytes = 0;
  std::vector<StateEstimate> host_estimates;
};

ModelStates compare_model_states(const Planning& p, const StrategyResult& r);

std::vector<std::string> explain_lines(const Planning& p);
OrderedJson explain_json(const Planning& p);

// The `planning` document of --format json: planning_json (plan_io.hpp) with
// every default that shaped the answer (sequence length, optimizer settings,
// bucket, prefetch), each strategy's batch, the ranked changes, and with
// `explain` the "explain" block.
OrderedJson planning_document(const Planning& p, bool explain);

}  // namespace dlplan
