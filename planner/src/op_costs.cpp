#include "dlplan/op_costs.hpp"

#include "dlplan/error.hpp"
#include "dlplan/json_file.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>

namespace dlplan {
namespace {

[[noreturn]] void bad(const std::string& src, const std::string& field, const std::string& what, const nlohmann::json& got) {
  bad_json_field(src, "op_costs." + field, what, got);
}

double positive(const nlohmann::json& j, const char* key, const std::string& src, const std::string& at, bool zero_ok) {
  if (!j.contains(key)) {
    if (zero_ok) return 0;
    throw Error(fmt::format("{}: missing field 'op_costs.{}{}'", src, at, key));
  }
  const auto& v = j.at(key);
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0 || (!zero_ok && v.get<double>() == 0))
    bad(src, at + key, zero_ok ? "a number >= 0" : "a number > 0", v);
  return v.get<double>();
}

Phase phase_named(const nlohmann::json& v, const std::string& src, const std::string& field) {
  for (Phase p : {Phase::forward, Phase::backward, Phase::recompute, Phase::optimizer})
    if (v.is_string() && v.get<std::string>() == to_string(p)) return p;
  bad(src, field, "forward, backward, recompute or optimizer", v);
}

}  // namespace

const char* to_string(CostSource s) {
  switch (s) {
    case CostSource::measured: return "measured";
    case CostSource::scaled: return "scaled";
    case CostSource::roofline: return "roofline";
  }
  return "roofline";
}

std::optional<OpCostLookup> OpCostTable::find(const std::string& signature, Phase phase, int64_t micro_batch) const {
  auto search = [&](Phase ph) -> std::optional<OpCostLookup> {
    const OpCost* best = nullptr;
    for (const OpCost& c : ops) {
      if (c.phase != ph || c.signature != signature) continue;
      if (c.micro_batch == micro_batch) return OpCostLookup{c.seconds, CostSource::measured};
      if (!best || std::llabs(c.micro_batch - micro_batch) < std::llabs(best->micro_batch - micro_batch)) best = &c;
    }
    if (!best || best->micro_batch <= 0) return std::nullopt;
    return OpCostLookup{best->seconds * static_cast<double>(micro_batch) / static_cast<double>(best->micro_batch),
                        CostSource::scaled};
  };
  if (auto hit = search(phase)) return hit;
  if (phase == Phase::recompute) return search(Phase::forward);  // the same kernel run again
  return std::nullopt;
}

nlohmann::ordered_json op_costs_to_json(const OpCostTable& t) {
  nlohmann::ordered_json ops = nlohmann::ordered_json::array();
  for (const OpCost& c : t.ops)
    ops.push_back({{"phase", to_string(c.phase)},
                   {"micro_batch", c.micro_batch},
                   {"seconds", c.seconds},
                   {"samples", c.samples},
                   {"signature", c.signature}});
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["source"] = t.source;
  j["ranks_per_node"] = t.ranks_per_node;
  j["kernel_revision"] = t.kernel_revision;
  j["optimizer_bytes_per_s"] = t.optimizer_bytes_per_s;
  j["gap_per_op_s"] = t.gap_per_op_s;
  j["ops"] = std::move(ops);
  return j;
}

OpCostTable op_costs_from_json(const nlohmann::json& j, const std::string& src) {
  if (!j.is_object()) bad(src, "", "an object", j);
  for (const auto& [key, value] : j.items()) {
    (void)value;
    if (key != "source" && key != "ranks_per_node" && key != "kernel_revision" && key != "optimizer_bytes_per_s" &&
        key != "gap_per_op_s" && key != "ops")
      throw Error(fmt::format("{}: unknown field 'op_costs.{}'; known: source, ranks_per_node, kernel_revision, "
                              "optimizer_bytes_per_s, gap_per_op_s, ops", src, key));
  }
  OpCostTable t;
  if (j.contains("source")) {
    if (!j.at("source").is_string()) bad(src, "source", "a string", j.at("source"));
    t.source = j.at("source").get<std::string>();
  }
  const double ranks = positive(j, "ranks_per_node", src, "", false);
  if (ranks != std::floor(ranks) || ranks > 1024) bad(src, "ranks_per_node", "an integer in [1, 1024]", j.at("ranks_per_node"));
  t.ranks_per_node = static_cast<int>(ranks);
  const double revision = positive(j, "kernel_revision", src, "", false);
  if (revision != std::floor(revision) || revision > 1e6) bad(src, "kernel_revision", "an integer >= 1", j.at("kernel_revision"));
  t.kernel_revision = static_cast<int>(revision);
  t.optimizer_bytes_per_s = positive(j, "optimizer_bytes_per_s", src, "", true);
  t.gap_per_op_s = positive(j, "gap_per_op_s", src, "", true);
  if (!j.contains("ops") || !j.at("ops").is_array()) bad(src, "ops", "an array", j.contains("ops") ? j.at("ops") : nlohmann::json());
  for (size_t k = 0; k < j.at("ops").size(); ++k) {
    const auto& o = j.at("ops")[k];
    const std::string at = fmt::format("ops[{}].", k);
    if (!o.is_object()) bad(src, at.substr(0, at.size() - 1), "an object", o);
    OpCost c;
    if (!o.contains("signature") || !o.at("signature").is_string() || o.at("signature").get<std::string>().empty())
      bad(src, at + "signature", "a non-empty string", o.contains("signature") ? o.at("signature") : nlohmann::json());
    c.signature = o.at("signature").get<std::string>();
    if (!o.contains("phase")) bad(src, at + "phase", "forward, backward, recompute or optimizer", nlohmann::json());
    c.phase = phase_named(o.at("phase"), src, at + "phase");
    const double b = positive(o, "micro_batch", src, at, false);
    if (b != std::floor(b) || b > 1e9) bad(src, at + "micro_batch", "an integer >= 1", o.at("micro_batch"));
    c.micro_batch = static_cast<int64_t>(b);
    c.seconds = positive(o, "seconds", src, at, false);
    c.samples = static_cast<int>(positive(o, "samples", src, at, true));
    t.ops.push_back(std::move(c));
  }
  return t;
}

}  // namespace dlplan
