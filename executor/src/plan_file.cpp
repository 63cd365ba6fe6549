#include "dlplan/exec/plan_file.hpp"

#include "dlplan/error.hpp"
#include "dlplan/loader.hpp"

#include <fmt/format.h>

#include <fstream>

namespace dlplan::exec {
namespace {

using Json = nlohmann::json;

const Json& field(const Json& j, const char* key, const std::string& src, const char* where = "") {
  if (!j.is_object() || !j.contains(key)) throw Error(fmt::format("{}: missing field '{}{}'", src, where, key));
  return j.at(key);
}

template <typename T>
T get(const Json& j, const char* key, const std::string& src, const char* where = "") {
  const Json& v = field(j, key, src, where);
  try {
    return v.get<T>();
  } catch (const Json::exception&) {
    throw Error(fmt::format("{}: field '{}{}' has the wrong type ({})", src, where, key, v.dump()));
  }
}

}  // namespace

LoadedPlan plan_from_json(const Json& doc, const std::string& src) {
  if (!doc.is_object() || doc.value("kind", "") != "plan")
    throw Error(fmt::format("{}: not a plan (\"kind\": \"plan\"); write one with dlplan plan --out", src));
  if (doc.value("schema_version", 0) != 1)
    throw Error(fmt::format("{}: schema_version {} is not supported (expected 1)", src, doc.value("schema_version", 0)));
  LoadedPlan p;
  p.path = src;
  p.document = doc;
  p.model = parse_model(field(field(doc, "model", src), "ir", src, "model."), src + " (model.ir)");
  p.cluster = cluster_from_json(field(doc, "cluster", src), src);
  auto& t = p.training;
  t.strategy = parse_strategy(get<std::string>(doc, "strategy", src));
  t.precision = parse_precision(get<std::string>(doc, "precision", src));
  t.micro_batch = get<int64_t>(doc, "micro_batch", src);
  t.grad_accum = get<int64_t>(doc, "grad_accum", src);
  if (t.micro_batch <= 0 || t.grad_accum <= 0) throw Error(fmt::format("{}: micro_batch and grad_accum must be positive", src));
  t.checkpointing = parse_checkpointing(get<std::string>(doc, "checkpointing", src));
  t.attention = parse_attention(get<std::string>(doc, "attention", src));
  t.bucket_mb = get<double>(doc, "bucket_mb", src);
  t.prefetch = get<int>(doc, "prefetch", src);
  const Json& sb = field(doc, "syncbn", src);
  t.syncbn = get<bool>(sb, "enabled", src, "syncbn.");
  t.syncbn_group = t.syncbn ? get<int>(sb, "group_size", src, "syncbn.") : 0;
  const Json& o = field(doc, "optimizer", src);
  auto& oc = t.optimizer;
  oc.kind = parse_optimizer(get<std::string>(o, "name", src, "optimizer."));
  oc.lr = get<double>(o, "lr", src, "optimizer.");
  auto betas = get<std::vector<double>>(o, "betas", src, "optimizer.");
  if (betas.size() != 2) throw Error(fmt::format("{}: optimizer.betas must hold two numbers", src));
  oc.beta1 = betas[0];
  oc.beta2 = betas[1];
  oc.eps = get<double>(o, "eps", src, "optimizer.");
  oc.weight_decay = get<double>(o, "weight_decay", src, "optimizer.");
  oc.momentum = get<double>(o, "momentum", src, "optimizer.");
  oc.clip_norm = get<double>(o, "clip_norm", src, "optimizer.");
  oc.warmup_steps = get<int>(o, "warmup_steps", src, "optimizer.");
  oc.min_lr = get<double>(o, "min_lr", src, "optimizer.");
  return p;
}

LoadedPlan load_plan_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(fmt::format("{}: cannot open plan file", path));
  Json doc;
  try {
    doc = Json::parse(f);
  } catch (const Json::parse_error& e) {
    throw Error(fmt::format("{}: malformed JSON at byte {}: {}", path, e.byte, e.what()));
  }
  return plan_from_json(doc, path);
}

}  // namespace dlplan::exec
