// Evaluating strategies side by side, picking one, and the search for the
// largest micro-batch that fits. Peak memory grows with the micro-batch, so
// "fits" is monotonic in it and a bisection finds the boundary.
#include "fit_search.hpp"

#include "dlplan/error.hpp"
#include "dlplan/limits.hpp"

#include <algorithm>

namespace dlplan::detail {
namespace {

// Beyond the limits (limits.hpp) a micro-batch does not fit either.
bool fits_at(const Model& m, const Cluster& c, TrainingConfig t, int64_t b, int64_t per_rank) {
  t.micro_batch = b;
  if (per_rank > 0) t.grad_accum = per_rank / b;
  try {
    return evaluate(m, c, t).fits;
  } catch (const Error&) {
    return false;
  }
}

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      d.push_back(i);
      if (i != n / i) d.push_back(n / i);
    }
  std::sort(d.begin(), d.end());
  return d;
}

}  // namespace

std::vector<StrategyResult> evaluate_all(const Model& m, const Cluster& c, const TrainingConfig& base, bool explain,
                                         const std::vector<Strategy>& which) {
  std::vector<StrategyResult> rows;
  for (Strategy s : which) {
    TrainingConfig t = base;
    t.strategy = s;
    rows.push_back(evaluate(m, c, t, explain));
  }
  return rows;
}

std::optional<Strategy> pick(const std::vector<StrategyResult>& rows, double band, bool per_sample) {
  auto time = [per_sample](const StrategyResult& r) {
    return per_sample ? r.step_seconds / static_cast<double>(r.training.micro_batch * r.training.grad_accum) : r.step_seconds;
  };
  const StrategyResult* fastest = nullptr;
  for (const auto& r : rows)
    if (r.fits && (!fastest || time(r) < time(*fastest))) fastest = &r;
  if (!fastest) return std::nullopt;
  for (const auto& r : rows)  // rows are in order of simplicity
    if (r.fits && time(r) <= (1 + band) * time(*fastest)) return r.strategy;
  return fastest->strategy;
}

int64_t largest_fitting_micro_batch(const Model& m, const Cluster& c, const TrainingConfig& t, int64_t per_rank,
                                    int64_t below) {
  const int64_t cap = below > 0 ? below - 1 : (per_rank > 0 ? per_rank : kMaxMicroBatch);
  if (per_rank > 0) {  // bisection over the divisors <= cap
    std::vector<int64_t> d = divisors(per_rank);
    d.erase(std::upper_bound(d.begin(), d.end(), cap), d.end());
    if (d.empty() || !fits_at(m, c, t, d.front(), per_rank)) return 0;
    size_t lo = 0, hi = d.size();  // d[lo] fits; d[hi..] not known to
    while (hi - lo > 1) {
      const size_t mid = (lo + hi) / 2;
      if (fits_at(m, c, t, d[mid], per_rank)) lo = mid;
      else hi = mid;
    }
    return d[lo];
  }
  if (cap < 1 || !fits_at(m, c, t, 1, 0)) return 0;
  int64_t lo = 1, hi = 2;  // lo fits; find an hi that does not (or the cap)
  while (hi <= cap && fits_at(m, c, t, hi, 0)) {
    lo = hi;
    hi *= 2;
  }
  hi = std::min(hi, cap + 1);
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits_at(m, c, t, mid, 0)) lo = mid;
    else hi = mid;
  }
  return lo;
}

std::vector<StrategyResult> evaluate_max_micro_batch(const PlanRequest& req) {
  const int64_t N = req.cluster.world();
  const int64_t per_rank = req.global_batch > 0 ? req.global_batch / N : 0;
  std::vector<StrategyResult> rows;
  for (Strategy s : strategies_to_compare(req.cluster, req.training, req.forced)) {
    TrainingConfig t = req.training;
    t.strategy = s;
    t.micro_batch = std::max<int64_t>(1, largest_fitting_micro_batch(req.model, req.cluster, t, per_rank));
    if (per_rank > 0) t.grad_accum = per_rank / t.micro_batch;
    const SyncBnAdvice a = advise_syncbn(req.model, req.cluster, t, req.syncbn, req.syncbn_threshold);
    t.syncbn = a.enabled;
    t.syncbn_group = a.enabled ? a.group_size : 0;
    rows.push_back(evaluate(req.model, req.cluster, t, req.explain));
  }
  return rows;
}

}  // namespace dlplan::detail
