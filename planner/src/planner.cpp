// Planning across strategies and the recommendation.
// Rule: among strategies that fit, the fastest; within 5% of it, the simplest
// (ddp, zero1, zero2, zero3 in that order) — if the model fits each GPU, plain
// DDP is the simplest thing that works. If nothing fits, name the smallest
// change that would: checkpointing, a smaller micro-batch, more GPUs.
#include "dlplan/planner.hpp"

#include "dlplan/error.hpp"
#include "dlplan/format.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace dlplan {

SyncBnMode parse_syncbn_mode(std::string_view s) {
  if (s == "auto") return SyncBnMode::automatic;
  if (s == "on") return SyncBnMode::on;
  if (s == "off") return SyncBnMode::off;
  throw Error(fmt::format("unknown --syncbn '{}' (choose one of: auto, on, off)", s));
}

const StrategyResult* Planning::chosen() const {
  if (!recommendation.strategy) return nullptr;
  for (const auto& r : results)
    if (r.strategy == *recommendation.strategy) return &r;
  return nullptr;
}

void validate(const PlanRequest& r) {
  const auto& d = r.cluster.device;
  const auto& t = r.training;
  if (d.kind == "cpu" && t.precision != Precision::fp32)
    throw Error(fmt::format("the cpu device runs fp32 only; --precision {} is not available there", to_string(t.precision)));
  if (t.precision == Precision::bf16_mixed && !d.has_bf16())
    throw Error(fmt::format("{} has no bf16 support; use --precision fp32", d.description.empty() ? d.kind : d.description));
  if (r.cluster.nodes <= 0 || r.cluster.gpus_per_node <= 0) throw Error("--gpus and --nodes must be positive");
  if (t.micro_batch <= 0) throw Error(fmt::format("--micro-batch must be positive, got {}", t.micro_batch));
  if (t.grad_accum <= 0) throw Error(fmt::format("--grad-accum must be positive, got {}", t.grad_accum));
  if (t.bucket_mb <= 0) throw Error(fmt::format("--bucket-mb must be positive, got {}", t.bucket_mb));
  if (t.prefetch < 0) throw Error(fmt::format("--prefetch must be 0 or more, got {}", t.prefetch));
}

namespace {

int simplicity(Strategy s) { return static_cast<int>(s); }

std::optional<Strategy> pick(const std::vector<StrategyResult>& rows) {
  const StrategyResult* fastest = nullptr;
  for (const auto& r : rows)
    if (r.fits && (!fastest || r.step_seconds < fastest->step_seconds)) fastest = &r;
  if (!fastest) return std::nullopt;
  for (const auto& r : rows)  // rows are in order of simplicity
    if (r.fits && r.step_seconds <= 1.05 * fastest->step_seconds) return r.strategy;
  return fastest->strategy;
}

std::vector<StrategyResult> evaluate_all(const Model& m, const Cluster& c, const TrainingConfig& base, bool explain) {
  std::vector<StrategyResult> rows;
  for (Strategy s : kAllStrategies) {
    TrainingConfig t = base;
    t.strategy = s;
    rows.push_back(evaluate(m, c, t, explain));
  }
  return rows;
}

std::string need_sentence(const StrategyResult& r) {
  return fmt::format("{} needs {} (peak {} + runtime {} + {:.0f}% margin) of {}", to_string(r.strategy),
                     format_bytes(r.walk.peak + r.runtime_bytes + r.margin_bytes), format_bytes(r.walk.peak),
                     format_bytes(r.runtime_bytes), kFragmentationMargin * 100, format_bytes(r.capacity_bytes));
}

// The smallest change that makes some strategy fit. Changes are tried from
// the cheapest (a flag that costs some recomputation) to the dearest (more
// GPUs, then several changes together); the first that fits is named.
std::vector<std::string> suggest_changes(const PlanRequest& req, const TrainingConfig& base) {
  struct Candidate {
    std::string what;
    Cluster cluster;
    TrainingConfig training;
  };
  std::vector<Candidate> candidates;
  const bool ckpt_off = base.checkpointing == Checkpointing::none, math = base.attention == AttentionImpl::math;
  auto with = [&](bool ckpt, bool flash, int64_t micro_batch, int gpu_factor) {
    Candidate c{{}, req.cluster, base};
    std::vector<std::string> parts;
    if (ckpt && ckpt_off) {
      c.training.checkpointing = Checkpointing::units;
      parts.push_back("activation checkpointing (--checkpointing units)");
    }
    if (flash && math) {
      c.training.attention = AttentionImpl::flash;
      parts.push_back("flash attention (--attention flash)");
    }
    if (micro_batch < base.micro_batch) {
      c.training.micro_batch = micro_batch;
      c.training.grad_accum = base.grad_accum * (base.micro_batch / micro_batch);
      parts.push_back(fmt::format("micro-batch {} with --grad-accum {} (same global batch)", micro_batch, c.training.grad_accum));
    }
    if (gpu_factor > 1) {
      auto& cl = c.cluster;
      if (cl.nodes == 1 && cl.gpus_per_node * gpu_factor <= 8) cl.gpus_per_node *= gpu_factor;
      else cl.nodes *= gpu_factor;
      parts.push_back(fmt::format("{} GPUs ({} node{} x {})", cl.world(), cl.nodes, cl.nodes == 1 ? "" : "s", cl.gpus_per_node));
    }
    if (parts.empty()) return;
    c.what = fmt::format("{}", fmt::join(parts, " + "));
    candidates.push_back(std::move(c));
  };
  with(true, false, base.micro_batch, 1);
  with(false, true, base.micro_batch, 1);
  with(true, true, base.micro_batch, 1);
  for (int64_t b = base.micro_batch / 2; b >= 1; b /= 2) with(true, true, b, 1);
  for (int f = 2; f <= 64; f *= 2) with(false, false, base.micro_batch, f);
  for (int f = 2; f <= 64; f *= 2) with(true, true, 1, f);

  for (const auto& c : candidates) {
    auto rows = evaluate_all(req.model, c.cluster, c.training, false);
    if (auto s = pick(rows)) {
      const auto& r = rows[static_cast<size_t>(simplicity(*s))];
      return {fmt::format("Smallest change that fits: {}; {} then peaks at {} per GPU.", c.what, to_string(r.strategy),
                          format_bytes(static_cast<double>(r.walk.peak)))};
    }
  }
  return {"Even 64x the GPUs with checkpointing, flash attention and micro-batch 1 would not fit: "
          "the model is too large for this device."};
}

Recommendation recommend(const PlanRequest& req, const std::vector<StrategyResult>& rows, const TrainingConfig& base) {
  Recommendation rec;
  if (req.forced) {
    const auto& r = rows[static_cast<size_t>(simplicity(*req.forced))];
    rec.strategy = r.strategy;
    rec.reasons.push_back(fmt::format("{} was chosen with --strategy.", to_string(r.strategy)));
    if (!r.fits) rec.reasons.push_back(fmt::format("It does not fit: {}.", need_sentence(r)));
    return rec;
  }
  rec.strategy = pick(rows);
  if (!rec.strategy) {
    const StrategyResult* least = &rows[0];
    for (const auto& r : rows)
      if (r.walk.peak < least->walk.peak) least = &r;
    rec.reasons.push_back(fmt::format("No strategy fits: even {}.", need_sentence(*least)));
    for (auto& s : suggest_changes(req, base)) rec.reasons.push_back(std::move(s));
    return rec;
  }
  const auto& best = rows[static_cast<size_t>(simplicity(*rec.strategy))];
  const StrategyResult* fastest = &best;
  int fitting = 0;
  for (const auto& r : rows) {
    fitting += r.fits;
    if (r.fits && r.step_seconds < fastest->step_seconds) fastest = &r;
  }
  rec.reasons.push_back(fmt::format("{} fits: peak {} + runtime {} + {:.0f}% margin of {}.", to_string(best.strategy),
                                    format_bytes(best.walk.peak), format_bytes(best.runtime_bytes),
                                    kFragmentationMargin * 100, format_bytes(best.capacity_bytes)));
  if (fastest == &best)
    rec.reasons.push_back(fmt::format("It has the fastest step of the {} strateg{} that fit ({}).", fitting,
                                      fitting == 1 ? "y" : "ies", format_seconds(best.step_seconds)));
  else
    rec.reasons.push_back(fmt::format(
        "Its step ({}) is within 5% of the fastest ({}, {}), and it is simpler: DDP, then ZeRO-1, 2, 3.",
        format_seconds(best.step_seconds), to_string(fastest->strategy), format_seconds(fastest->step_seconds)));
  for (const auto& r : rows)
    if (!r.fits && simplicity(r.strategy) < simplicity(best.strategy))
      rec.reasons.push_back(fmt::format("{} does not fit: {}.", to_string(r.strategy), need_sentence(r)));
  return rec;
}

}  // namespace

Planning plan(const PlanRequest& req) {
  validate(req);
  Planning p;
  p.request = req;
  TrainingConfig base = req.training;
  p.syncbn = advise_syncbn(req.model, req.cluster, base, req.syncbn, req.syncbn_threshold);
  base.syncbn = p.syncbn.enabled;
  base.syncbn_group = p.syncbn.enabled ? p.syncbn.group_size : 0;
  p.results = evaluate_all(req.model, req.cluster, base, req.explain);
  p.recommendation = recommend(req, p.results, base);
  p.recommendation.syncbn = p.syncbn.enabled;
  if (const auto* c = p.chosen(); c && c->step_seconds > 0) p.syncbn.share = p.syncbn.seconds / c->step_seconds;
  return p;
}

}  // namespace dlplan
