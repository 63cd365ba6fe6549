#include "dlplan/collective_costs.hpp"

#include "dlplan/error.hpp"
#include "dlplan/json_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace dlplan {
namespace {

[[noreturn]] void bad(const std::string& src, const std::string& field, const std::string& what, const nlohmann::json& got) {
  bad_json_field(src, "collective_costs." + field, what, got);
}

constexpr Collective kLadderOps[] = {Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather,
                                     Collective::Broadcast};

}  // namespace

std::optional<double> CollectiveCostTable::seconds(Collective op, double bytes) const {
  for (const CollectiveLadder& l : ladders) {
    if (l.op != op || l.rungs.empty()) continue;
    const auto& r = l.rungs;
    if (bytes <= r.front().bytes) return r.front().seconds;
    if (bytes >= r.back().bytes) return r.back().seconds * bytes / r.back().bytes;
    size_t i = 1;
    while (r[i].bytes < bytes) ++i;
    if (r[i].bytes == bytes) return r[i].seconds;
    // Log-log interpolation between rungs i-1 and i: t = t0 (S / S0)^p with
    // p the segment's slope, exact at both rungs.
    const CollectiveRung& a = r[i - 1];
    const CollectiveRung& b = r[i];
    const double p = std::log(b.seconds / a.seconds) / std::log(b.bytes / a.bytes);
    return a.seconds * std::pow(bytes / a.bytes, p);
  }
  return std::nullopt;
}

nlohmann::ordered_json collective_costs_to_json(const CollectiveCostTable& t) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["source"] = t.source;
  j["ranks"] = t.ranks;
  for (const CollectiveLadder& l : t.ladders) {
    nlohmann::ordered_json rungs = nlohmann::ordered_json::array();
    for (const CollectiveRung& r : l.rungs) rungs.push_back({r.bytes, r.seconds});
    j[to_string(l.op)] = std::move(rungs);
  }
  return j;
}

CollectiveCostTable collective_costs_from_json(const nlohmann::json& j, const std::string& src) {
  if (!j.is_object()) bad(src, "", "an object", j);
  CollectiveCostTable t;
  for (const auto& [key, value] : j.items()) {
    if (key == "source") {
      if (!value.is_string()) bad(src, key, "a string", value);
      t.source = value.get<std::string>();
      continue;
    }
    if (key == "ranks") {
      if (!value.is_number_integer() || value.get<int64_t>() < 2 || value.get<int64_t>() > 1024)
        bad(src, key, "an integer in [2, 1024]", value);
      t.ranks = value.get<int>();
      continue;
    }
    const Collective* op = nullptr;
    for (const Collective& c : kLadderOps)
      if (key == to_string(c)) op = &c;
    if (!op)
      throw Error(fmt::format("{}: unknown field 'collective_costs.{}'; known: source, ranks, all-reduce, reduce-scatter, "
                              "all-gather, broadcast",
                              src, key));
    if (!value.is_array() || value.empty()) bad(src, key, "a non-empty array of [bytes, seconds]", value);
    CollectiveLadder l;
    l.op = *op;
    for (size_t k = 0; k < value.size(); ++k) {
      const auto& r = value[k];
      const std::string at = fmt::format("{}[{}]", key, k);
      auto finite_positive = [](const nlohmann::json& v) {
        return v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0;
      };
      if (!r.is_array() || r.size() != 2 || !finite_positive(r[0]) || !finite_positive(r[1]))
        bad(src, at, "[bytes, seconds], both > 0", r);
      const CollectiveRung rung{r[0].get<double>(), r[1].get<double>()};
      if (!l.rungs.empty() && rung.bytes <= l.rungs.back().bytes)
        bad(src, at, fmt::format("larger than the rung before it ({} bytes): rungs in increasing size", l.rungs.back().bytes), r);
      l.rungs.push_back(rung);
    }
    t.ladders.push_back(std::move(l));
  }
  // In the enum's order, whatever the file's (a JSON object's keys have none).
  std::sort(t.ladders.begin(), t.ladders.end(),
            [](const CollectiveLadder& a, const CollectiveLadder& b) { return a.op < b.op; });
  if (t.ranks == 0) throw Error(fmt::format("{}: missing field 'collective_costs.ranks'", src));
  return t;
}

}  // namespace dlplan
