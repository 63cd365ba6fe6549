// When nothing fits: the changes that would, ranked by what they cost.
//
// Each candidate change is planned like the request itself (every allowed
// strategy, the same pick), and its cost is the GPU time per sample of the
// plan it leads to against the request as asked (which does not fit, but
// whose step the simulator still times):
//
//   cost = (step' x N' / samples') / (step x N / samples) - 1
//        = (step' / (b' x A')) / (step / (b x A)) - 1     (per GPU: samples = b x A x N)
//
// so flash attention (no recomputation) costs about nothing, checkpointing
// costs the recomputed forward, a smaller micro-batch with more accumulation
// costs the GEMM efficiency and per-op overheads it loses, CPU offload the
// host's optimizer step and the copies. Changes on the same
// GPUs come first, cheapest first; more GPUs come after them (they cost GPUs,
// not time), fewest first. Only if no single change fits are changes combined.
#include "fit_search.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace dlplan::detail {
namespace {

struct Candidate {
  std::string what;
  Cluster cluster;
  TrainingConfig training;
  std::vector<Strategy> strategies;
};

bool has_op(const Model& m, OpKind k) {
  return std::any_of(m.nodes.begin(), m.nodes.end(), [k](const Node& n) { return n.op == k; });
}

// The cluster with `factor` times the GPUs: a single node grows up to 8 GPUs,
// beyond that nodes are added.
Cluster more_gpus(Cluster c, int factor) {
  if (c.nodes == 1 && c.gpus_per_node * factor <= 8) c.gpus_per_node *= factor;
  else c.nodes *= factor;
  return c;
}

std::string gpus_text(const Cluster& c) {
  return fmt::format("{} GPUs ({} node{} x {})", c.world(), c.nodes, c.nodes == 1 ? "" : "s", c.gpus_per_node);
}

}  // namespace

std::vector<SuggestedChange> suggest_changes(const PlanRequest& req, const TrainingConfig& base,
                                             const std::vector<StrategyResult>& rows, const std::vector<Strategy>& allowed) {
  const Model& m = req.model;
  const int64_t per_rank = base.micro_batch * base.grad_accum;
  auto allowed_has = [&](Strategy s) { return std::find(allowed.begin(), allowed.end(), s) != allowed.end(); };

  // GPU time per sample of the request as asked: its fastest allowed strategy.
  double reference = std::numeric_limits<double>::infinity();
  for (const auto& r : rows)
    if (allowed_has(r.strategy)) reference = std::min(reference, r.step_seconds / static_cast<double>(per_rank));

  auto plan_of = [&](const Candidate& c) -> std::optional<SuggestedChange> {
    const auto got = evaluate_all(m, c.cluster, c.training, false, c.strategies);
    const auto s = pick(got, time_band(c.cluster).relative);
    if (!s) return std::nullopt;
    const auto& r = *std::find_if(got.begin(), got.end(), [&](const StrategyResult& x) { return x.strategy == *s; });
    SuggestedChange out;
    out.what = c.what;
    out.strategy = *s;
    out.peak_bytes = r.walk.peak;
    out.gpus = c.cluster.world();
    out.global_batch = c.training.micro_batch * c.training.grad_accum * c.cluster.world();
    const double per_sample = r.step_seconds / static_cast<double>(c.training.micro_batch * c.training.grad_accum);
    out.cost = reference > 0 ? per_sample / reference - 1 : 0;
    return out;
  };

  const bool can_checkpoint = base.checkpointing == Checkpointing::none && m.units.size() > 1;
  const bool can_flash = base.attention == AttentionImpl::math && has_op(m, OpKind::attention);
  auto with = [&](std::string what, auto change) {
    Candidate c{std::move(what), req.cluster, base, allowed};
    change(c);
    return c;
  };
  auto flash = [](Candidate& c) { c.training.attention = AttentionImpl::flash; };
  auto checkpoint = [](Candidate& c) { c.training.checkpointing = Checkpointing::units; };

  std::vector<SuggestedChange> same, more;
  auto add = [](std::vector<SuggestedChange>& to, const std::optional<SuggestedChange>& c) {
    if (c) to.push_back(*c);
  };

  // ---- one change on these GPUs ----
  if (can_flash) add(same, plan_of(with("flash attention (--attention flash)", flash)));
  if (allowed.size() == 1)  // --strategy: a higher ZeRO stage (hsdp2: hsdp3)
    for (Strategy s : kAllStrategies)
      if (s > allowed.front() && hybrid(s) == hybrid(allowed.front()))
        add(same, plan_of(with(fmt::format("{} instead (--strategy {})", to_string(s), to_string(s)),
                               [s](Candidate& c) { c.strategies = {s}; })));
  if (can_checkpoint) add(same, plan_of(with("activation checkpointing (--checkpointing units)", checkpoint)));
  // CPU offload (ZeRO-Offload; with the parameters, ZeRO-3 only), on the
  // allowed strategies it goes with. Its cost is the host's optimizer step
  // and the copies, as the simulator times them.
  if (base.offload == Offload::none)
    for (Offload o : {Offload::optimizer, Offload::params}) {
      if (o == Offload::params && req.cluster.world() < 2) continue;  // one rank shards no parameters
      Candidate c = with(fmt::format("CPU offload (--offload {})", to_string(o)), [o](Candidate& x) { x.training.offload = o; });
      std::erase_if(c.strategies, [&](Strategy s) {
        TrainingConfig t = c.training;
        t.strategy = s;
        return !offload_conflict(t).empty();
      });
      if (!c.strategies.empty()) add(same, plan_of(c));
    }
  // A smaller micro-batch: the largest that keeps the global batch (more
  // accumulation), and the largest at all when that is larger still.
  auto smaller_micro_batch = [&](const TrainingConfig& t, const std::string& prefix) {
    std::vector<SuggestedChange> found;
    int64_t keep = 0, any = 0;
    for (Strategy s : allowed) {
      TrainingConfig u = t;
      u.strategy = s;
      keep = std::max(keep, largest_fitting_micro_batch(m, req.cluster, u, per_rank, t.micro_batch));
      any = std::max(any, largest_fitting_micro_batch(m, req.cluster, u, 0, t.micro_batch));
    }
    if (keep > 0) {
      Candidate c{fmt::format("{}micro-batch {} with --grad-accum {} (same global batch)", prefix, keep, per_rank / keep),
                  req.cluster, t, allowed};
      c.training.micro_batch = keep;
      c.training.grad_accum = per_rank / keep;
      add(found, plan_of(c));
    }
    if (any > keep) {
      Candidate c{fmt::format("{}micro-batch {} (--micro-batch {})", prefix, any, any), req.cluster, t, allowed};
      c.training.micro_batch = any;
      add(found, plan_of(c));
    }
    return found;
  };
  if (base.micro_batch > 1)
    for (auto& c : smaller_micro_batch(base, "")) same.push_back(c);

  // ---- more GPUs, as asked otherwise: the fewest that fit ----
  for (int f = 2; f <= 64 && more.empty(); f *= 2) {
    Candidate c{gpus_text(more_gpus(req.cluster, f)), more_gpus(req.cluster, f), base, allowed};
    add(more, plan_of(c));
  }

  // ---- nothing single fits: combine ----
  if (same.empty() && more.empty()) {
    TrainingConfig both = base;
    if (can_checkpoint) both.checkpointing = Checkpointing::units;
    if (can_flash) both.attention = AttentionImpl::flash;
    std::string prefix = can_checkpoint && can_flash ? "activation checkpointing + flash attention"
                         : can_checkpoint            ? "activation checkpointing"
                         : can_flash                 ? "flash attention"
                                                     : "";
    if (can_checkpoint && can_flash)
      add(same, plan_of(Candidate{prefix + " (--checkpointing units --attention flash)", req.cluster, both, allowed}));
    if (same.empty() && base.micro_batch > 1)
      for (auto& c : smaller_micro_batch(both, prefix.empty() ? "" : prefix + " + ")) same.push_back(c);
    for (int f = 2; f <= 64 && more.empty() && same.empty(); f *= 2) {
      Candidate c{(prefix.empty() ? "" : prefix + " + ") + "micro-batch 1 + " + gpus_text(more_gpus(req.cluster, f)),
                  more_gpus(req.cluster, f), both, allowed};
      c.training.micro_batch = 1;
      c.training.grad_accum = base.grad_accum;
      add(more, plan_of(c));
    }
  }

  std::stable_sort(same.begin(), same.end(), [](const auto& a, const auto& b) { return a.cost < b.cost; });
  same.insert(same.end(), more.begin(), more.end());
  return same;
}

}  // namespace dlplan::detail
