// The run report and the progress lines (plan_io.hpp), written and read.
#include "dlplan/plan_io.hpp"

#include "document_fields.hpp"
#include "document_json.hpp"
#include "dlplan/error.hpp"
#include "dlplan/json_file.hpp"
#include "dlplan/limits.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace dlplan {
namespace doc {
// plan_read.cpp
MemoryNumbers read_memory(const Object& m);
CommNumbers read_comm(const Object& c);
Predicted read_predicted(const Object& p);
}  // namespace doc

namespace {

using doc::Object;
constexpr int64_t kBig = kMaxBytes;

const char* rate_key(bool tokens) { return tokens ? "tokens_per_second" : "samples_per_second"; }

// tokens_per_second or samples_per_second, exactly one of them.
bool read_rate(const Object& o, double& rate) {
  const bool tokens = o.has("tokens_per_second"), samples = o.has("samples_per_second");
  if (tokens == samples)
    o.fail(fmt::format("{} must hold exactly one of tokens_per_second and samples_per_second",
                       o.path().empty() ? "the line" : o.path()));
  rate = o.number(rate_key(tokens));
  return tokens;
}

Measured read_measured(const Object& m, int world) {
  Measured out;
  out.memory = doc::read_memory(m.object("memory"));
  const Object each = m.object("memory_max_per_category");
  for (Category c : kAllCategories) out.max_each[static_cast<size_t>(c)] = each.integer(to_string(c), 0, kBig);
  out.reserved_bytes = m.integer("reserved_bytes", 0, kBig);
  out.rank = static_cast<int>(m.integer("rank", 0, world - 1));
  out.step_seconds = m.number("step_seconds");
  out.compute_seconds = m.number("compute_seconds");
  out.comm = doc::read_comm(m.object("comm"));
  out.mfu = m.number("mfu");
  out.tokens = read_rate(m, out.rate);
  out.rss_bytes = m.integer("rss_bytes", 0, kBig);
  if (m.has("host")) {  // CPU offload
    const Object host = m.object("host");
    for (Category c : kAllCategories) out.host[static_cast<size_t>(c)] = host.integer(to_string(c), 0, kBig);
  }
  return out;
}

}  // namespace

OrderedJson report_json(const RunReport& r) {
  const Measured& m = r.measured;
  OrderedJson measured;
  measured["memory"] = doc::memory_json(m.memory);
  measured["reserved_bytes"] = m.reserved_bytes;
  measured["memory_max_per_category"] = doc::categories_json(m.max_each);
  measured["rank"] = m.rank;
  measured["step_seconds"] = m.step_seconds;
  measured["compute_seconds"] = m.compute_seconds;
  measured["comm"] = doc::comm_json(m.comm);
  measured["mfu"] = m.mfu;
  measured[rate_key(m.tokens)] = m.rate;
  measured["rss_bytes"] = m.rss_bytes;
  if (total(m.host) > 0) measured["host"] = doc::categories_json(m.host);  // CPU offload, per rank

  OrderedJson j;
  j["schema_version"] = 1;
  j["kind"] = "report";
  j["plan"] = r.plan.document;
  if (r.plan.edited) j["plan_edited"] = true;
  j["world_size"] = r.world_size;
  j["seed"] = r.seed;
  if (r.partial) j["partial"] = true;
  if (r.first_step > 0) j["first_step"] = r.first_step;
  j["steps"] = r.loss.size();
  j["loss"] = OrderedJson::array();
  for (double l : r.loss) j["loss"].push_back(std::isfinite(l) ? OrderedJson(l) : OrderedJson());  // NaN: null
  if (!r.loss_scale.empty()) {
    j["loss_scale"] = r.loss_scale;
    j["skipped_steps"] = r.skipped_steps;
  }
  j["measured"] = measured;
  j["predicted"] = doc::predicted_json(r.predicted);
  return j;
}

RunReport report_from_json(const OrderedJson& ordered, const std::string& src) {
  const nlohmann::json j(ordered);
  doc::check_kind(j, src, "report", "dlplan train --report writes one");
  const Object d(j, src);
  RunReport r;
  d.object("plan");
  r.plan = plan_from_json(ordered.at("plan"), src + " (plan)", PlanReadOptions{.allow_edited = true});
  if (r.plan.edited && !(d.has("plan_edited") && d.flag("plan_edited")))
    d.fail("the report's plan was edited after the run (its content_hash does not match, and plan_edited is not set)");
  r.world_size = static_cast<int>(d.integer("world_size", 1, std::numeric_limits<int>::max()));
  if (r.world_size != r.plan.cluster.world())
    d.fail(fmt::format("world_size = {} but the plan is for {} ranks", r.world_size, r.plan.cluster.world()));
  r.seed = d.unsigned_integer("seed");
  if (d.has("partial")) r.partial = d.flag("partial");
  if (d.has("first_step")) r.first_step = static_cast<int>(d.integer("first_step", 0, std::numeric_limits<int>::max()));
  const int64_t steps = d.integer("steps", 0, std::numeric_limits<int>::max());
  const auto& loss = d.raw("loss");
  if (!loss.is_array() || static_cast<int64_t>(loss.size()) != steps)
    d.fail(fmt::format("loss must be an array of {} numbers (one per step)", steps));
  for (size_t i = 0; i < loss.size(); ++i)
    r.loss.push_back(loss[i].is_null() ? std::nan("")
                                       : doc::number_value(loss[i], src, fmt::format("loss[{}]", i),
                                                           doc::Range{-doc::kInf, doc::kInf}));
  if (d.has("loss_scale")) {  // fp16-mixed
    r.loss_scale = d.numbers("loss_scale", static_cast<size_t>(steps), doc::kPositive);
    for (double s : d.numbers("skipped_steps", d.raw("skipped_steps").is_array() ? d.raw("skipped_steps").size() : 0,
                              doc::Range{1, static_cast<double>(r.first_step + steps)}))
      r.skipped_steps.push_back(static_cast<int64_t>(s));
  }
  r.measured = read_measured(d.object("measured"), r.world_size);
  r.predicted = doc::read_predicted(d.object("predicted"));
  return r;
}

RunReport read_report_file(const std::string& path) {
  return report_from_json(read_ordered_json_file(path, "report file"), path);
}

std::string progress_line_json(const ProgressLine& l) {
  OrderedJson j;
  j["step"] = l.step;
  j["steps"] = l.steps;
  j["loss"] = std::isfinite(l.loss) ? OrderedJson(l.loss) : OrderedJson();
  j["step_seconds"] = l.step_seconds;
  j[rate_key(l.tokens)] = l.rate;
  j["peak_bytes"] = l.peak_bytes;
  return j.dump();
}

std::optional<ProgressLine> progress_line_from_json(std::string_view line) {
  if (line.empty() || line.front() != '{') return std::nullopt;
  try {
    const nlohmann::json j = parse_json_text(line, "progress line");
    const Object o(j, "progress line");
    ProgressLine l;
    l.steps = o.integer("steps", 1, std::numeric_limits<int>::max());
    l.step = o.integer("step", 1, l.steps);
    l.loss = o.raw("loss").is_null() ? std::nan("") : doc::number_value(o.raw("loss"), "progress line", "loss",
                                                                          doc::Range{-doc::kInf, doc::kInf});
    l.step_seconds = o.number("step_seconds");
    l.tokens = read_rate(o, l.rate);
    l.peak_bytes = o.integer("peak_bytes", 0, kBig);
    return l;
  } catch (const Error&) {
    return std::nullopt;  // not a progress line: the caller shows it as output
  }
}

}  // namespace dlplan
