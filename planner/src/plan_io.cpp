// Writing the documents (plan_io.hpp): planning, plan, report, progress lines.
#include "dlplan/plan_io.hpp"

#include "dlplan/checkpoint_cost.hpp"

#include "document_json.hpp"

#include <fmt/format.h>

namespace dlplan {

Predicted predicted_of(const StrategyResult& r) {
  Predicted p;
  p.memory.at_peak = r.walk.at_peak;
  p.memory.runtime = r.runtime_bytes;
  p.memory.peak = r.walk.peak;
  p.step_seconds = r.step_seconds;
  p.compute_seconds = r.compute_seconds;
  p.comm = {r.comm.bytes, r.comm.seconds, r.comm.exposed_seconds};
  p.mfu = r.mfu;
  p.fits = r.fits;
  p.host = r.host.per_rank;
  return p;
}

namespace doc {

OrderedJson categories_json(const CategoryBytes& c) {
  OrderedJson j = OrderedJson::object();
  for (Category k : kAllCategories) j[to_string(k)] = c[static_cast<size_t>(k)];
  return j;
}

OrderedJson memory_json(const MemoryNumbers& m) {
  OrderedJson j = categories_json(m.at_peak);
  j["runtime"] = m.runtime;
  j["peak"] = m.peak;
  return j;
}

OrderedJson comm_json(const CommNumbers& c) {
  return {{"bytes", c.bytes}, {"seconds", c.seconds}, {"exposed_seconds", c.exposed_seconds}};
}

OrderedJson predicted_json(const Predicted& p) {
  OrderedJson j = {{"memory", memory_json(p.memory)}, {"step_seconds", p.step_seconds}, {"compute_seconds", p.compute_seconds},
                   {"comm", comm_json(p.comm)},       {"mfu", p.mfu},                   {"fits", p.fits}};
  if (total(p.host) > 0) j["host"] = categories_json(p.host);  // CPU offload, per rank
  return j;
}

// CPU offload: host memory per node, by category, against what it has.
OrderedJson host_json(const HostMemory& h) {
  return {{"params", h.per_rank[static_cast<size_t>(Category::params)] * h.ranks},
          {"grads", h.per_rank[static_cast<size_t>(Category::grads)] * h.ranks},
          {"optimizer", h.per_rank[static_cast<size_t>(Category::optimizer)] * h.ranks},
          {"per_node", h.per_node},
          {"ranks_per_node", h.ranks},
          {"capacity", h.capacity},
          {"fits", h.fits}};
}

// What `train --checkpoint-dir` writes per save (checkpoint_cost.hpp).
OrderedJson checkpoint_json(const CheckpointCost& k) {
  return {{"bytes_per_rank", k.bytes_per_rank},
          {"bytes_total", k.bytes_total},
          {"storage_bytes_per_s", k.storage_bytes_per_s},
          {"seconds", k.seconds}};
}

}  // namespace doc

std::string plan_content_hash(const nlohmann::json& plan) {
  nlohmann::json content = plan;
  content.erase("content_hash");
  const std::string text = content.dump();  // nlohmann::json sorts keys: the order in the file does not matter
  uint64_t h = 0xcbf29ce484222325ull;       // FNV-1a, 64 bits
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return fmt::format("fnv1a64:{:016x}", h);
}

namespace {

// What a fine-tuning plan adapts (fine_tuning.hpp), and how much then trains.
OrderedJson fine_tuning_json(const FineTuning& f, const Model& m) {
  OrderedJson j = {{"freeze", f.freeze}};
  if (f.lora_rank > 0)
    j["lora"] = {{"rank", f.lora_rank},
                 {"targets", f.lora_targets.empty() ? kDefaultLoraTargets : f.lora_targets},
                 {"alpha", f.lora_scale() * static_cast<double>(f.lora_rank)}};
  j["trainable_params"] = m.trainable_parameter_count();
  return j;
}

}  // namespace

OrderedJson planning_json(const Planning& p) {
  const auto& req = p.request;
  const auto& t = req.training;
  OrderedJson j;
  j["schema_version"] = 1;
  j["kind"] = "planning";
  j["model"] = {{"name", req.model.name}, {"params", req.model.base_parameter_count()}};
  if (t.fine_tuning.active()) {
    j["model"]["adapter_params"] = req.model.parameter_count() - req.model.base_parameter_count();
    j["model"]["trainable_params"] = req.model.trainable_parameter_count();
  }
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
                   {"attention", to_string(t.attention)},
                   {"offload", to_string(t.offload)}};
  if (t.fine_tuning.active()) j["training"]["fine_tuning"] = fine_tuning_json(t.fine_tuning, req.model);
  j["strategies"] = OrderedJson::array();
  for (const auto& r : p.results) {
    const Predicted pr = predicted_of(r);
    OrderedJson row = {{"strategy", to_string(r.strategy)},
                               {"memory", doc::memory_json(pr.memory)},
                               {"fits", r.fits},
                               {"compute_seconds", r.compute_seconds},
                               {"comm", doc::comm_json(pr.comm)},
                               {"step_seconds", r.step_seconds},
                               {"mfu", r.mfu},
                               {"checkpoint", doc::checkpoint_json(checkpoint_cost(req.model, req.cluster, r.training))}};
    // The most each category holds at any moment of the step: apart from
    // `memory` (the categories at the peak). For a small model the peak can
    // fall in the optimizer step, when no activations are alive.
    row["memory_max"] = doc::categories_json(r.walk.max_each);
    if (t.offload != Offload::none) row["host"] = doc::host_json(r.host);  // per node
    j["strategies"].push_back(std::move(row));
  }
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
  // The IR is the user's model; fine_tuning says how the plan adapts it
  // (fine_tuning.hpp), and every reader applies it the same way.
  j["model"] = {{"name", req.model.name}, {"params", req.model.base_parameter_count()}, {"ir", req.model.ir}};
  if (t.fine_tuning.active()) j["fine_tuning"] = fine_tuning_json(t.fine_tuning, req.model);
  j["cluster"] = cluster_to_json(req.cluster);
  j["strategy"] = to_string(t.strategy);
  if (hybrid(t.strategy)) j["shard_group"] = shard_world(t, req.cluster.world());
  if (t.offload != Offload::none) {
    j["offload"] = to_string(t.offload);
    j["host"] = doc::host_json(r.host);
  }
  j["syncbn"] = {{"enabled", t.syncbn}, {"group_size", t.syncbn ? t.syncbn_group : 1}};
  j["micro_batch"] = t.micro_batch;
  j["grad_accum"] = t.grad_accum;
  j["precision"] = to_string(t.precision);
  if (loss_scaled(t.precision)) {
    const LossScaling& ls = t.loss_scaling;
    j["loss_scale"] = {{"init_scale", ls.init_scale},
                       {"growth", ls.growth},
                       {"backoff", ls.backoff},
                       {"growth_interval", ls.growth_interval}};
  }
  const auto& o = t.optimizer;
  j["optimizer"] = {{"name", to_string(o.kind)}, {"lr", o.lr},           {"betas", {o.beta1, o.beta2}},
                    {"eps", o.eps},              {"weight_decay", o.weight_decay}, {"momentum", o.momentum},
                    {"clip_norm", o.clip_norm},  {"warmup_steps", o.warmup_steps}, {"min_lr", o.min_lr}};
  j["checkpointing"] = to_string(t.checkpointing);
  j["attention"] = to_string(t.attention);
  j["bucket_mb"] = t.bucket_mb;
  j["prefetch"] = t.prefetch;
  j["predicted"] = doc::predicted_json(predicted_of(r));
  j["checkpoint"] = doc::checkpoint_json(checkpoint_cost(req.model, req.cluster, t));
  j["content_hash"] = plan_content_hash(nlohmann::json(j));
  return j;
}

}  // namespace dlplan
