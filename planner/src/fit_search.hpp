// Planner internals shared by planner.cpp, fit_search.cpp and suggest.cpp:
// evaluating several strategies, picking among them, and searching for the
// largest micro-batch that fits.
#pragma once

#include "dlplan/planner.hpp"

#include <optional>
#include <vector>

namespace dlplan::detail {

// One row per strategy in `which` (in the order given), all else as `base`.
std::vector<StrategyResult> evaluate_all(const Model& m, const Cluster& c, const TrainingConfig& base, bool explain,
                                         const std::vector<Strategy>& which);

// Among the rows that fit (in order of simplicity), the fastest; within 5% of
// it, the simplest. With per_sample, time per sample decides (rows whose
// batches differ); otherwise the step time.
// The simplest strategy that fits whose time is within `band` of the
// fastest's (t <= (1 + band) t_fastest); rows are in order of simplicity.
std::optional<Strategy> pick(const std::vector<StrategyResult>& rows, double band, bool per_sample = false);

// The largest micro-batch b < below (0: no bound) with which strategy t fits.
// per_rank > 0 keeps b x accumulation = per_rank (a fixed global batch): b
// runs over its divisors. Returns 0 when not even the smallest fits.
int64_t largest_fitting_micro_batch(const Model& m, const Cluster& c, const TrainingConfig& t, int64_t per_rank,
                                    int64_t below = 0);

// --micro-batch max: every strategy at its own largest micro-batch (at 1
// when none fits), with the SyncBN advice of that micro-batch.
std::vector<StrategyResult> evaluate_max_micro_batch(const PlanRequest& req);

// The changes that make one of `allowed` fit, cheapest first (suggest.cpp).
std::vector<SuggestedChange> suggest_changes(const PlanRequest& req, const TrainingConfig& base,
                                             const std::vector<StrategyResult>& rows, const std::vector<Strategy>& allowed);

}  // namespace dlplan::detail
