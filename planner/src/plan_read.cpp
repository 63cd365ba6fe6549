// Reading a plan (plan_io.hpp): every field checked, then the IR against
// model.params, the knobs against the limits, and the content hash.
#include "dlplan/plan_io.hpp"

#include "document_fields.hpp"
#include "dlplan/error.hpp"
#include "dlplan/fine_tuning.hpp"
#include "dlplan/json_file.hpp"
#include "dlplan/limits.hpp"
#include "dlplan/loader.hpp"

#include <fmt/format.h>

#include <limits>

namespace dlplan {
namespace doc {

MemoryNumbers read_memory(const Object& m) {
  MemoryNumbers out;
  constexpr int64_t kBig = kMaxBytes;
  for (Category c : kAllCategories) out.at_peak[static_cast<size_t>(c)] = m.integer(to_string(c), 0, kBig);
  out.runtime = m.integer("runtime", 0, kBig);
  out.peak = m.integer("peak", 0, kBig);
  return out;
}

CommNumbers read_comm(const Object& c) {
  return {c.number("bytes"), c.number("seconds"), c.number("exposed_seconds")};
}

Predicted read_predicted(const Object& p) {
  Predicted out;
  out.memory = read_memory(p.object("memory"));
  out.step_seconds = p.number("step_seconds");
  out.compute_seconds = p.number("compute_seconds");
  out.comm = read_comm(p.object("comm"));
  out.mfu = p.number("mfu");
  out.fits = p.flag("fits");
  if (p.has("host")) {  // CPU offload
    const Object host = p.object("host");
    for (Category c : kAllCategories)
      out.host[static_cast<size_t>(c)] = host.integer(to_string(c), 0, kMaxBytes);
  }
  return out;
}

}  // namespace doc

namespace {

using doc::Object;

OptimizerConfig read_optimizer(const Object& o) {
  OptimizerConfig c;
  c.kind = o.choice("name", parse_optimizer);
  c.lr = o.number("lr");
  const auto betas = o.numbers("betas", 2, doc::kUnitOpen);
  c.beta1 = betas[0];
  c.beta2 = betas[1];
  c.eps = o.number("eps", doc::kPositive);
  c.weight_decay = o.number("weight_decay");
  c.momentum = o.number("momentum", doc::kUnitOpen);
  c.clip_norm = o.number("clip_norm");
  c.warmup_steps = static_cast<int>(o.integer("warmup_steps", 0, std::numeric_limits<int>::max()));
  c.min_lr = o.number("min_lr");
  return c;
}

TrainingConfig read_training(const Object& d, int world) {
  TrainingConfig t;
  t.strategy = d.choice("strategy", parse_strategy);
  if (hybrid(t.strategy)) {
    t.shard_group = static_cast<int>(d.integer("shard_group", 1, world));
    if (world % t.shard_group != 0)
      d.fail(fmt::format("shard_group = {} does not divide the world of {} ranks", t.shard_group, world));
  }
  if (d.has("offload")) {
    t.offload = d.choice("offload", parse_offload);
    if (const std::string why = offload_conflict(t); !why.empty()) d.fail(why);
  }
  t.precision = d.choice("precision", parse_precision);
  if (loss_scaled(t.precision)) {  // GradScaler's settings (training.hpp, LossScaling)
    const Object ls = d.object("loss_scale");
    LossScaling& c = t.loss_scaling;
    c.init_scale = ls.number("init_scale", doc::Range{1, 1e38});
    c.growth = ls.number("growth", doc::Range{1, 1e3});
    c.backoff = ls.number("backoff", doc::Range{0, 1, true, true});
    c.growth_interval = static_cast<int>(ls.integer("growth_interval", 1, std::numeric_limits<int>::max()));
  }
  t.checkpointing = d.choice("checkpointing", parse_checkpointing);
  t.attention = d.choice("attention", parse_attention);
  t.micro_batch = d.integer("micro_batch", 1, kMaxMicroBatch);
  t.grad_accum = d.integer("grad_accum", 1, kMaxGradAccum);
  t.bucket_mb = d.number("bucket_mb", doc::Range{0, kMaxBucketMb, true});
  t.prefetch = static_cast<int>(d.integer("prefetch", 0, kMaxPrefetch));
  const Object sb = d.object("syncbn");
  t.syncbn = sb.flag("enabled");
  const int group = static_cast<int>(sb.integer("group_size", 1, world));
  if (t.syncbn && world % group != 0)
    sb.fail(fmt::format("syncbn.group_size = {} does not divide the world of {} ranks", group, world));
  t.syncbn_group = t.syncbn ? group : 0;
  t.optimizer = read_optimizer(d.object("optimizer"));
  return t;
}

// fine_tuning {freeze, lora {rank, targets, alpha}, trainable_params}:
// applied to the plan's model as the planner applied it, and checked
// against the count it wrote.
void read_fine_tuning(const Object& o, Model& m, FineTuning& f) {
  auto strings = [&](const Object& from, const char* key) {
    const doc::Json& a = from.raw(key);
    std::vector<std::string> out;
    if (!a.is_array()) from.fail(from.field(key) + " must be an array of strings");
    for (const doc::Json& e : a) {
      if (!e.is_string()) from.fail(from.field(key) + " must be an array of strings");
      out.push_back(e.get<std::string>());
    }
    return out;
  };
  f.freeze = strings(o, "freeze");
  if (o.has("lora")) {
    const Object l = o.object("lora");
    f.lora_rank = l.integer("rank", 1, int64_t{1} << 20);
    f.lora_targets = strings(l, "targets");
    f.lora_alpha = l.number("alpha", doc::kPositive);
  }
  if (!f.active()) o.fail(o.path() + " freezes nothing and has no lora");
  try {
    apply_fine_tuning(m, f);
  } catch (const Error& e) {
    o.fail(fmt::format("{}: {}", o.path(), e.what()));
  }
  const int64_t trainable = o.integer("trainable_params", 0, kMaxParameters);
  if (trainable != m.trainable_parameter_count())
    o.fail(fmt::format("{} = {} but the adapted model has {} trainable parameters", o.field("trainable_params"),
                       trainable, m.trainable_parameter_count()));
}

}  // namespace

PlanDocument plan_from_json(const nlohmann::json& j, const std::string& src, const PlanReadOptions& opt) {
  return plan_from_json(OrderedJson(j), src, opt);
}

PlanDocument plan_from_json(const OrderedJson& ordered, const std::string& src, const PlanReadOptions& opt) {
  const nlohmann::json j(ordered);
  doc::check_kind(j, src, "plan", "write one with dlplan plan --out");
  const Object d(j, src);
  PlanDocument p;
  p.path = src;
  p.document = ordered;
  // First the hash: an edited plan is named as such before its fields are read.
  const std::string want = plan_content_hash(j);
  const std::string have = d.has("content_hash") && j["content_hash"].is_string() ? j["content_hash"].get<std::string>() : "";
  if (have != want) {
    if (!opt.allow_edited)
      d.fail(have.empty() ? "the plan has no content_hash (written by an older dlplan, or edited); plan it again with "
                            "dlplan plan --out, or pass --allow-edited-plan to run it as it is"
                          : "the plan was edited after dlplan planned it (its content_hash does not match): its "
                            "prediction may not hold for what it now says; plan it again with dlplan plan --out, or "
                            "pass --allow-edited-plan to run it as it is");
    p.edited = true;
  }

  const Object model = d.object("model");
  const int64_t params = model.integer("params", 0, kMaxParameters);
  model.object("ir");  // an object, or a message naming model.ir
  p.model = parse_model(model.raw("ir"), src + " (model.ir)");
  if (p.model.parameter_count() != params)
    d.fail(fmt::format("model.params = {} but model.ir has {} parameters", params, p.model.parameter_count()));
  d.object("cluster");
  p.cluster = cluster_from_json(d.raw("cluster"), src);
  p.training = read_training(d, p.cluster.world());
  if (d.has("fine_tuning")) read_fine_tuning(d.object("fine_tuning"), p.model, p.training.fine_tuning);
  check_training_limits(p.model, p.cluster, p.training, src);
  p.predicted = doc::read_predicted(d.object("predicted"));

  return p;
}

PlanDocument read_plan_file(const std::string& path, const PlanReadOptions& opt) {
  return plan_from_json(read_ordered_json_file(path, "plan file"), path, opt);
}

}  // namespace dlplan
