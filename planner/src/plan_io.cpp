#include "dlplan/plan_io.hpp"

namespace dlplan {

OrderedJson memory_json(const StrategyResult& r) {
  OrderedJson j = OrderedJson::object();
  for (Category c : kAllCategories) j[to_string(c)] = r.walk.at_peak[static_cast<size_t>(c)];
  j["runtime"] = r.runtime_bytes;
  j["peak"] = r.walk.peak;
  return j;
}

static OrderedJson comm_json(const StrategyResult& r) {
  return {{"bytes", r.comm.bytes}, {"seconds", r.comm.seconds}, {"exposed_seconds", r.comm.exposed_seconds}};
}

OrderedJson planning_json(const Planning& p) {
  const auto& req = p.request;
  const auto& t = req.training;
  OrderedJson j;
  j["schema_version"] = 1;
  j["kind"] = "planning";
  j["model"] = {{"name", req.model.name}, {"params", req.model.parameter_count()}};
  if (!req.model.notes.empty()) j["model"]["notes"] = req.model.notes;
  if (req.model.unaccounted_bytes > 0) j["model"]["unaccounted_bytes_per_sample"] = req.model.unaccounted_bytes;
  j["cluster"] = {{"gpu", req.cluster.device.kind},
                  {"nodes", req.cluster.nodes},
                  {"gpus_per_node", req.cluster.gpus_per_node},
                  {"gpu_memory_bytes", device_capacity(req.cluster)},
                  {"fragmentation_margin", kFragmentationMargin}};
  j["training"] = {{"micro_batch", t.micro_batch},
                   {"grad_accum", t.grad_accum},
                   {"global_batch", t.micro_batch * t.grad_accum * req.cluster.world()},
                   {"precision", to_string(t.precision)},
                   {"optimizer", to_string(t.optimizer.kind)},
                   {"checkpointing", to_string(t.checkpointing)},
                   {"attention", to_string(t.attention)}};
  j["strategies"] = OrderedJson::array();
  for (const auto& r : p.results)
    j["strategies"].push_back({{"strategy", to_string(r.strategy)},
                               {"memory", memory_json(r)},
                               {"fits", r.fits},
                               {"compute_seconds", r.compute_seconds},
                               {"comm", comm_json(r)},
                               {"step_seconds", r.step_seconds},
                               {"mfu", r.mfu}});
  j["recommendation"] = {{"strategy", p.recommendation.strategy ? OrderedJson(to_string(*p.recommendation.strategy)) : OrderedJson()},
                         {"syncbn", p.recommendation.syncbn},
                         {"reasons", p.recommendation.reasons}};
  j["syncbn"] = {{"applicable", p.syncbn.applicable},
                 {"recommended", p.syncbn.recommended},
                 {"group_size", p.syncbn.group_size},
                 {"reason", p.syncbn.reason},
                 {"seconds", p.syncbn.seconds}};
  return j;
}

OrderedJson plan_json(const Planning& p, const StrategyResult& r) {
  const auto& req = p.request;
  const auto& t = r.training;
  OrderedJson j;
  j["schema_version"] = 1;
  j["kind"] = "plan";
  j["model"] = {{"name", req.model.name}, {"params", req.model.parameter_count()}, {"ir", req.model.ir}};
  j["cluster"] = cluster_to_json(req.cluster);
  j["strategy"] = to_string(t.strategy);
  j["syncbn"] = {{"enabled", t.syncbn}, {"group_size", t.syncbn ? t.syncbn_group : 1}};
  j["micro_batch"] = t.micro_batch;
  j["grad_accum"] = t.grad_accum;
  j["precision"] = to_string(t.precision);
  const auto& o = t.optimizer;
  j["optimizer"] = {{"name", to_string(o.kind)}, {"lr", o.lr},           {"betas", {o.beta1, o.beta2}},
                    {"eps", o.eps},              {"weight_decay", o.weight_decay}, {"momentum", o.momentum},
                    {"clip_norm", o.clip_norm},  {"warmup_steps", o.warmup_steps}, {"min_lr", o.min_lr}};
  j["checkpointing"] = to_string(t.checkpointing);
  j["attention"] = to_string(t.attention);
  j["bucket_mb"] = t.bucket_mb;
  j["prefetch"] = t.prefetch;
  OrderedJson mem = memory_json(r);
  j["predicted"] = {{"memory", mem},
                    {"step_seconds", r.step_seconds},
                    {"compute_seconds", r.compute_seconds},
                    {"comm", comm_json(r)},
                    {"mfu", r.mfu},
                    {"fits", r.fits}};
  return j;
}

}  // namespace dlplan
