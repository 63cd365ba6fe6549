// The `planning` document as --format json prints it: plan_io's fields, and
// (added under the same schema_version, DESIGN.md "Conventions") every
// default that shaped the answer, each strategy's batch, the ranked changes,
// the SyncBN group's reach and, with --explain, the explanation.
#include "dlplan/explain.hpp"
#include "dlplan/loader.hpp"

namespace dlplan {

OrderedJson planning_document(const Planning& p, bool explain) {
  OrderedJson j = planning_json(p);
  const auto& req = p.request;
  const auto& t = req.training;
  const auto& o = t.optimizer;
  j["model"]["context"] = req.model_context;
  if (!req.cluster_source.empty()) j["cluster"]["source"] = req.cluster_source;
  auto& tr = j["training"];
  tr["seq_len"] = tokens_per_sample(req.model);
  tr["micro_batch_max"] = req.max_micro_batch;
  tr["lr"] = o.lr;
  tr["min_lr"] = o.min_lr;
  tr["warmup_steps"] = o.warmup_steps;
  tr["betas"] = {o.beta1, o.beta2};
  tr["eps"] = o.eps;
  tr["weight_decay"] = o.weight_decay;
  tr["momentum"] = o.momentum;
  tr["clip_norm"] = o.clip_norm;
  tr["bucket_mb"] = t.bucket_mb;
  tr["prefetch"] = t.prefetch;
  tr["fragmentation_margin"] = kFragmentationMargin;
  for (size_t i = 0; i < p.results.size() && i < j["strategies"].size(); ++i) {
    j["strategies"][i]["micro_batch"] = p.results[i].training.micro_batch;
    j["strategies"][i]["grad_accum"] = p.results[i].training.grad_accum;
  }
  auto& changes = j["recommendation"]["changes"] = OrderedJson::array();
  for (const auto& c : p.recommendation.changes)
    changes.push_back({{"change", c.what},
                       {"strategy", to_string(c.strategy)},
                       {"peak_bytes", c.peak_bytes},
                       {"gpus", c.gpus},
                       {"global_batch", c.global_batch},
                       {"cost", c.cost}});
  j["recommendation"]["time_uncertainty"] = {{"relative", p.recommendation.time_band.relative},
                                              {"source", p.recommendation.time_band.source}};
  j["syncbn"]["enabled"] = p.syncbn.enabled;
  j["syncbn"]["crosses_nodes"] = p.syncbn.crosses_nodes;
  if (p.syncbn.if_enabled_group > 1)
    j["syncbn"]["if_enabled"] = {{"group_size", p.syncbn.if_enabled_group}, {"seconds", p.syncbn.if_enabled_seconds}};
  if (explain) j["explain"] = explain_json(p);
  return j;
}

}  // namespace dlplan
