// Planning across strategies and the recommendation.
// Rule: among strategies that fit, the simplest (ddp, zero1, zero2, zero3,
// then hybrid, in that order) unless a more complex one is faster by more
// than the predicted steps' band (time_band: the device's validated error) —
// if the model fits each GPU, plain DDP is the simplest thing that works, and
// a faster plan has to be faster by more than the prediction can tell. If nothing fits, the changes that
// would, cheapest first (suggest.cpp). With --micro-batch max each strategy
// gets the largest micro-batch that fits (fit_search.cpp).
#include "dlplan/planner.hpp"

#include "dlplan/checkpoint_cost.hpp"

#include "dlplan/error.hpp"
#include "dlplan/format.hpp"
#include "fit_search.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace dlplan {

SyncBnMode parse_syncbn_mode(std::string_view s) {
  if (s == "auto") return SyncBnMode::automatic;
  if (s == "on") return SyncBnMode::on;
  if (s == "off") return SyncBnMode::off;
  throw UsageError(fmt::format("unknown --syncbn '{}' (choose one of: auto, on, off)", s));
}

TimeBand time_band(const Cluster& c) {
  const DeviceSpec& d = c.device;
  TimeBand b;
  if (d.time_uncertainty > 0) {
    b.relative = d.time_uncertainty;
    const auto s = d.sources.find("time_uncertainty");
    b.source = s != d.sources.end() ? s->second : "the cluster file's device.time_uncertainty";
  } else {
    b.source = fmt::format("dlplan's default for a device without validation runs: the worst held-out error of the "
                           "validated GPUs (24.5 %), rounded up (docs/time.md)");
  }
  return b;
}

const StrategyResult* Planning::chosen() const {
  if (!recommendation.strategy) return nullptr;
  for (const auto& r : results)
    if (r.strategy == *recommendation.strategy) return &r;
  return nullptr;
}

std::vector<Strategy> strategies_to_compare(const Cluster& c, const TrainingConfig& t, std::optional<Strategy> forced) {
  std::vector<Strategy> out;
  TrainingConfig h = t;
  h.strategy = Strategy::hsdp2;
  const int64_t G = shard_world(h, c.world());
  const bool hybrid_differs = G > 1 && G < c.world();
  for (Strategy s : kAllStrategies) {
    h.strategy = s;
    if (forced == s || ((!hybrid(s) || hybrid_differs) && offload_conflict(h).empty())) out.push_back(s);
  }
  return out;
}

void validate(const PlanRequest& r) {
  const auto& d = r.cluster.device;
  const auto& t = r.training;
  const std::string device = d.description.empty() ? d.kind : d.description;
  if (t.precision == Precision::bf16_mixed && !d.has_bf16())
    throw UsageError(fmt::format("{} has no bf16 support; use --precision {}", device,
                                 d.has_fp16() ? "fp16-mixed (fp16 with loss scaling) or fp32" : "fp32"));
  if (t.precision == Precision::fp16_mixed && !d.has_fp16())
    throw UsageError(fmt::format("{} gives no fp16 rate (device.fp16_flops); use --precision {}", device,
                                 d.has_bf16() ? "bf16-mixed or fp32" : "fp32"));
  if (r.cluster.nodes <= 0 || r.cluster.gpus_per_node <= 0) throw UsageError("--gpus and --nodes must be positive");
  if (t.micro_batch <= 0) throw UsageError(fmt::format("--micro-batch must be positive, got {}", t.micro_batch));
  if (t.grad_accum <= 0) throw UsageError(fmt::format("--grad-accum must be positive, got {}", t.grad_accum));
  if (!(t.bucket_mb > 0)) throw UsageError(fmt::format("--bucket-mb must be positive, got {}", t.bucket_mb));
  if (t.prefetch < 0) throw UsageError(fmt::format("--prefetch must be 0 or more, got {}", t.prefetch));
  if (r.max_micro_batch && r.global_batch > 0 && r.global_batch % r.cluster.world() != 0)
    throw UsageError(fmt::format("--global-batch {} is not a multiple of the {} GPUs", r.global_batch, r.cluster.world()));
}

namespace {

const StrategyResult& row_of(const std::vector<StrategyResult>& rows, Strategy s) {
  for (const auto& r : rows)
    if (r.strategy == s) return r;
  throw Error(fmt::format("internal: no row for strategy {}", to_string(s)));
}

std::string need_sentence(const StrategyResult& r) {
  std::string s = fmt::format("{} needs {} (peak {} + runtime {} + {:.0f}% margin) of {}", to_string(r.strategy),
                              format_bytes(r.walk.peak + r.runtime_bytes + r.margin_bytes), format_bytes(r.walk.peak),
                              format_bytes(r.runtime_bytes), kFragmentationMargin * 100, format_bytes(r.capacity_bytes));
  if (!r.host.fits)
    s += fmt::format(", and {} of host memory per node ({} ranks' offloaded states) of {}", format_bytes(r.host.per_node),
                     r.host.ranks, format_bytes(r.host.capacity));
  return s;
}

std::string cost_phrase(const SuggestedChange& c, int gpus_now) {
  std::string time;
  if (c.cost > 0.005) time = fmt::format("+{:.0f}% GPU time per sample", c.cost * 100);
  else if (c.cost < -0.005) time = fmt::format("{:.0f}% less GPU time per sample", -c.cost * 100);
  else time = "no extra GPU time per sample";
  if (c.gpus > gpus_now) return fmt::format("{} more GPUs, {}", c.gpus - gpus_now, time);
  return time;
}

// The changes, cheapest first, as sentences.
void say_changes(const PlanRequest& req, Recommendation& rec) {
  if (rec.changes.empty()) {
    rec.reasons.push_back("Even 64x the GPUs with checkpointing, flash attention and micro-batch 1 would not fit: "
                          "the model is too large for this device.");
    return;
  }
  const int64_t global_now = req.training.micro_batch * req.training.grad_accum * req.cluster.world();
  for (size_t i = 0; i < rec.changes.size(); ++i) {
    const auto& c = rec.changes[i];
    std::string batch = c.global_batch != global_now ? fmt::format(", global batch {} instead of {}", c.global_batch, global_now) : "";
    rec.reasons.push_back(fmt::format("{}: {}: {} then peaks at {} per GPU ({}{}).",
                                      i == 0 ? "Cheapest change that fits" : "Also fits", c.what, to_string(c.strategy),
                                      format_bytes(static_cast<double>(c.peak_bytes)), cost_phrase(c, req.cluster.world()),
                                      batch));
  }
  rec.reasons.push_back("Cost: GPU time per sample against the step as asked (which does not fit), from the same "
                        "simulator; changes on these GPUs are listed before more GPUs.");
}

Recommendation recommend(const PlanRequest& req, const std::vector<StrategyResult>& rows, const TrainingConfig& base) {
  Recommendation rec;
  rec.time_band = time_band(req.cluster);
  if (req.forced) {
    const auto& r = row_of(rows, *req.forced);
    rec.strategy = r.strategy;
    rec.reasons.push_back(fmt::format("{} was chosen with --strategy.", to_string(r.strategy)));
    if (!r.fits) {
      rec.reasons.push_back(fmt::format("It does not fit: {}.", need_sentence(r)));
      rec.changes = detail::suggest_changes(req, base, rows, {r.strategy});
      say_changes(req, rec);
    }
    return rec;
  }
  const double band = rec.time_band.relative;
  rec.strategy = detail::pick(rows, band, req.max_micro_batch && req.global_batch == 0);
  if (!rec.strategy) {
    const StrategyResult* least = &rows[0];
    for (const auto& r : rows)
      if (r.walk.peak < least->walk.peak) least = &r;
    rec.reasons.push_back(fmt::format("No strategy fits: even {}.", need_sentence(*least)));
    if (!req.max_micro_batch) {
      rec.changes = detail::suggest_changes(req, base, rows, strategies_to_compare(req.cluster, base));
      say_changes(req, rec);
    }
    return rec;
  }
  const auto& best = row_of(rows, *rec.strategy);
  const StrategyResult* fastest = &best;
  int fitting = 0;
  for (const auto& r : rows) {
    fitting += r.fits;
    if (r.fits && r.step_seconds < fastest->step_seconds) fastest = &r;
  }
  rec.reasons.push_back(fmt::format("{} fits: peak {} + runtime {} + {:.0f}% margin of {}.", to_string(best.strategy),
                                    format_bytes(best.walk.peak), format_bytes(best.runtime_bytes),
                                    kFragmentationMargin * 100, format_bytes(best.capacity_bytes)));
  if (req.max_micro_batch)
    rec.reasons.push_back(fmt::format("--micro-batch max: {} takes micro-batch {} x grad-accum {} = {} samples per GPU.",
                                      to_string(best.strategy), best.training.micro_batch, best.training.grad_accum,
                                      best.training.micro_batch * best.training.grad_accum));
  // Per sample when the strategies' batches differ (--micro-batch max).
  const char* unit = req.max_micro_batch && !req.global_batch ? "time per sample" : "step";
  auto per = [&](const StrategyResult& r) {
    return req.max_micro_batch && !req.global_batch
               ? r.step_seconds / static_cast<double>(r.training.micro_batch * r.training.grad_accum)
               : r.step_seconds;
  };
  if (fastest == &best) {
    rec.reasons.push_back(fmt::format("It has the fastest {} of the {} strateg{} that fit ({}).", unit, fitting,
                                      fitting == 1 ? "y" : "ies", format_seconds(per(best))));
  } else {
    rec.reasons.push_back(fmt::format(
        "Its {} ({}) is {:.1f}% slower than the fastest ({}, {}), within the {:.0f}% the predicted times are good "
        "to, and it is simpler: DDP, then ZeRO-1, 2, 3, then hybrid sharding (hsdp2, hsdp3).",
        unit, format_seconds(per(best)), (per(best) / per(*fastest) - 1) * 100, to_string(fastest->strategy),
        format_seconds(per(*fastest)), band * 100));
  }
  // The simplest strategy that fits, passed over: it lost by more than the band.
  for (const auto& r : rows)
    if (r.fits && r.strategy < best.strategy) {
      rec.reasons.push_back(fmt::format("{} is simpler and fits, but its {} ({}) is {:.0f}% longer, more than the {:.0f}% "
                                        "the predicted times are good to: the more complex strategy is worth it.",
                                        to_string(r.strategy), unit, format_seconds(per(r)), (per(r) / per(best) - 1) * 100,
                                        band * 100));
      break;
    }
  rec.reasons.push_back(fmt::format("Predicted times are good to +-{:.0f}%: {}.", band * 100, rec.time_band.source));
  for (const auto& r : rows)
    if (!r.fits && r.strategy < best.strategy)
      rec.reasons.push_back(fmt::format("{} does not fit: {}.", to_string(r.strategy), need_sentence(r)));
  return rec;
}

}  // namespace

Planning plan(const PlanRequest& req) {
  validate(req);
  Planning p;
  p.request = req;
  TrainingConfig base = req.training;
  if (req.max_micro_batch) {
    p.results = detail::evaluate_max_micro_batch(req);
  } else {
    p.syncbn = advise_syncbn(req.model, req.cluster, base, req.syncbn, req.syncbn_threshold);
    base.syncbn = p.syncbn.enabled;
    base.syncbn_group = p.syncbn.enabled ? p.syncbn.group_size : 0;
    p.results = detail::evaluate_all(req.model, req.cluster, base, req.explain,
                                     strategies_to_compare(req.cluster, base, req.forced));
  }
  p.recommendation = recommend(req, p.results, base);
  if (req.max_micro_batch) {  // the SyncBN advice of the chosen row's micro-batch
    const StrategyResult* c = p.chosen();
    TrainingConfig t = c ? c->training : p.results.front().training;
    p.syncbn = advise_syncbn(req.model, req.cluster, t, req.syncbn, req.syncbn_threshold);
  }
  p.recommendation.syncbn = p.syncbn.enabled;
  if (const auto* c = p.chosen(); c && c->step_seconds > 0) p.syncbn.share = p.syncbn.seconds / c->step_seconds;
  return p;
}

std::vector<std::string> recommendation_lines(const Planning& p) {
  std::vector<std::string> out;
  const auto& rec = p.recommendation;
  out.push_back(rec.strategy ? fmt::format("Recommendation: {}{}", to_string(*rec.strategy), rec.syncbn ? " with SyncBN" : "")
                             : "Recommendation: none fits");
  for (const auto& reason : rec.reasons) out.push_back("  - " + reason);
  out.emplace_back();
  if (const StrategyResult* c = p.chosen(); c && c->training.offload != Offload::none) {
    out.push_back("Checkpoint (train --checkpoint-dir): not with --offload in this version (the offloaded state is not saved)");
    out.emplace_back();
  } else if (c) {
    const CheckpointCost k = checkpoint_cost(p.request.model, p.request.cluster, c->training);
    out.push_back(fmt::format("Checkpoint (train --checkpoint-dir): {} per rank, {} in all; {} to save at {:g} GB/s per node{}",
                              format_bytes(static_cast<double>(k.bytes_per_rank)), format_bytes(static_cast<double>(k.bytes_total)),
                              format_seconds(k.seconds), k.storage_bytes_per_s / 1e9,
                              p.request.cluster.storage_bytes_per_s > 0 ? "" : " (default; storage_bytes_per_s in a --cluster file)"));
    out.emplace_back();
  }
  const auto& s = p.syncbn;
  out.push_back("SyncBatchNorm: " + s.reason);
  if (s.enabled && s.group_size > 1)
    out.push_back(fmt::format("  Cost: {} BN layers x (all-gather of 2C+1 + all-reduce of 2C floats) over groups of {} GPUs{}: "
                              "{} per step{}",
                              s.bn_layers, s.group_size, s.crosses_nodes ? " (across nodes)" : "",
                              format_seconds(s.seconds),
                              s.share > 0 ? fmt::format(" ({:.1f}% of the step)", s.share * 100) : ""));
  else if (s.if_enabled_group > 1)
    out.push_back(fmt::format("  Off. Turning it on (--syncbn on) would sync {} BN layers over {} GPUs: {} per step.",
                              s.bn_layers, s.if_enabled_group, format_seconds(s.if_enabled_seconds)));
  return out;
}

}  // namespace dlplan
