#include "dlplan/op_costs.hpp"

#include "dlplan/error.hpp"
#include "dlplan/json_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <sstream>
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
    case CostSource::curve: return "curve";
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

std::string curve_kind(const std::string& signature) {
  // step_program.cpp's signature: "kind [shapes] {attrs} dx=.. dw=N how",
  // how = precision, then the attention mode, "onednn", "lora" as they apply.
  std::string kind = signature.substr(0, signature.find(' '));
  // A grouped convolution (depthwise, most often) runs its own loops: its
  // own curve. The attributes are JSON without spaces: "groups":N. (Group
  // norm's "groups" is its width, not another kernel.)
  const bool conv = kind == "conv2d" || kind == "conv_transpose2d";
  if (const size_t g = signature.find("\"groups\":");
      conv && g != std::string::npos && std::atol(signature.c_str() + g + 9) > 1)
    kind += "/grouped";
  const size_t dw = signature.rfind(" dw=");
  if (dw == std::string::npos) return kind;
  std::istringstream how(signature.substr(signature.find(' ', dw + 1) + 1));
  std::string word;
  how >> word;  // the precision: curves are fp32's
  while (how >> word)
    if (word != "lora") kind += "/" + word;
  return kind;
}

std::optional<OpCostLookup> OpCostTable::from_curve(const std::string& kind, bool gemm, Phase phase, double flops,
                                                    double bytes) const {
  const Phase ph = phase == Phase::recompute ? Phase::forward : phase;  // the same kernels run again
  const std::string cls = gemm ? "*gemm" : "*memory";
  const OpCostCurve* fallback = nullptr;
  for (const OpCostCurve& c : curves) {
    if (c.phase != ph) continue;
    if (c.kind == kind) return OpCostLookup{c.seconds(flops, bytes), CostSource::curve};
    if (c.kind == cls) fallback = &c;
  }
  if (fallback) return OpCostLookup{fallback->seconds(flops, bytes), CostSource::curve};
  return std::nullopt;
}

namespace {

// Solves the n x n system a x = b (n <= 3) by Gaussian elimination with
// partial pivoting; false when it is singular.
bool solve(std::array<std::array<double, 3>, 3> a, std::array<double, 3> b, size_t n, std::array<double, 3>& x) {
  for (size_t c = 0; c < n; ++c) {
    size_t p = c;
    for (size_t r = c + 1; r < n; ++r)
      if (std::fabs(a[r][c]) > std::fabs(a[p][c])) p = r;
    if (std::fabs(a[p][c]) < 1e-12) return false;
    std::swap(a[p], a[c]);
    std::swap(b[p], b[c]);
    for (size_t r = c + 1; r < n; ++r) {
      const double f = a[r][c] / a[c][c];
      for (size_t k = c; k < n; ++k) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  for (size_t r = n; r-- > 0;) {
    double v = b[r];
    for (size_t k = r + 1; k < n; ++k) v -= a[r][k] * x[k];
    x[r] = v / a[r][r];
  }
  return true;
}

}  // namespace

OpCostCurve fit_op_curve(const std::string& kind, Phase phase, const std::vector<CurveSample>& samples) {
  OpCostCurve best;
  best.kind = kind;
  best.phase = phase;
  best.samples = static_cast<int>(samples.size());
  if (samples.empty()) return best;
  // The features, scaled to at most 1 so that the normal equations stay
  // well conditioned: 1, flops / max flops, bytes / max bytes.
  double fmax = 0, bmax = 0;
  for (const CurveSample& s : samples) fmax = std::max(fmax, s.flops), bmax = std::max(bmax, s.bytes);
  const std::array<double, 3> scale{1.0, fmax > 0 ? fmax : 1.0, bmax > 0 ? bmax : 1.0};
  auto feature = [&](const CurveSample& s, size_t f) { return f == 0 ? 1.0 : (f == 1 ? s.flops : s.bytes) / scale[f]; };
  // Non-negative least squares by its active sets: with three coefficients,
  // every non-empty subset is solved and the best one without a negative
  // coefficient kept (Lawson & Hanson, "Solving Least Squares Problems",
  // 1974, ch. 23: the NNLS optimum is the unconstrained optimum on its
  // support). Weights 1 / t^2 make the residual the relative error.
  double best_residual = std::numeric_limits<double>::infinity();
  for (unsigned mask = 1; mask < 8; ++mask) {
    std::array<size_t, 3> cols{};
    size_t n = 0;
    for (size_t f = 0; f < 3; ++f)
      if (mask & (1u << f)) cols[n++] = f;
    std::array<std::array<double, 3>, 3> a{};
    std::array<double, 3> b{}, x{};
    for (const CurveSample& s : samples) {
      if (s.seconds <= 0) continue;
      const double w = 1.0 / (s.seconds * s.seconds);
      for (size_t i = 0; i < n; ++i) {
        b[i] += w * feature(s, cols[i]) * s.seconds;
        for (size_t j = 0; j < n; ++j) a[i][j] += w * feature(s, cols[i]) * feature(s, cols[j]);
      }
    }
    if (!solve(a, b, n, x)) continue;
    std::array<double, 3> coef{};
    bool negative = false;
    for (size_t i = 0; i < n; ++i) {
      coef[cols[i]] = x[i] / scale[cols[i]];
      negative = negative || x[i] < 0;
    }
    if (negative) continue;
    OpCostCurve c = best;
    c.overhead_s = coef[0];
    c.seconds_per_flop = coef[1];
    c.seconds_per_byte = coef[2];
    double residual = 0, worst = 0;
    for (const CurveSample& s : samples) {
      if (s.seconds <= 0) continue;
      const double e = c.seconds(s.flops, s.bytes) / s.seconds - 1;
      residual += e * e;
      worst = std::max(worst, std::fabs(e));
    }
    c.worst_error = worst;
    if (residual < best_residual) best_residual = residual, best = c;
  }
  return best;
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
  if (t.gap_per_byte_s > 0) j["gap_per_byte_s"] = t.gap_per_byte_s;
  j["ops"] = std::move(ops);
  if (!t.curves.empty()) {
    nlohmann::ordered_json curves = nlohmann::ordered_json::array();
    for (const OpCostCurve& c : t.curves)
      curves.push_back({{"kind", c.kind},
                        {"phase", to_string(c.phase)},
                        {"overhead_s", c.overhead_s},
                        {"seconds_per_flop", c.seconds_per_flop},
                        {"seconds_per_byte", c.seconds_per_byte},
                        {"samples", c.samples},
                        {"worst_error", c.worst_error}});
    j["curves"] = std::move(curves);
  }
  return j;
}

OpCostTable op_costs_from_json(const nlohmann::json& j, const std::string& src) {
  if (!j.is_object()) bad(src, "", "an object", j);
  for (const auto& [key, value] : j.items()) {
    (void)value;
    if (key != "source" && key != "ranks_per_node" && key != "kernel_revision" && key != "optimizer_bytes_per_s" &&
        key != "gap_per_op_s" && key != "gap_per_byte_s" && key != "ops" && key != "curves")
      throw Error(fmt::format("{}: unknown field 'op_costs.{}'; known: source, ranks_per_node, kernel_revision, "
                              "optimizer_bytes_per_s, gap_per_op_s, gap_per_byte_s, ops, curves", src, key));
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
  t.gap_per_byte_s = positive(j, "gap_per_byte_s", src, "", true);
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
  if (j.contains("curves")) {
    if (!j.at("curves").is_array()) bad(src, "curves", "an array", j.at("curves"));
    for (size_t k = 0; k < j.at("curves").size(); ++k) {
      const auto& o = j.at("curves")[k];
      const std::string at = fmt::format("curves[{}].", k);
      if (!o.is_object()) bad(src, at.substr(0, at.size() - 1), "an object", o);
      OpCostCurve c;
      if (!o.contains("kind") || !o.at("kind").is_string() || o.at("kind").get<std::string>().empty())
        bad(src, at + "kind", "an op kind, \"*gemm\" or \"*memory\"", o.contains("kind") ? o.at("kind") : nlohmann::json());
      c.kind = o.at("kind").get<std::string>();
      if (!o.contains("phase")) bad(src, at + "phase", "forward, backward, recompute or optimizer", nlohmann::json());
      c.phase = phase_named(o.at("phase"), src, at + "phase");
      c.overhead_s = positive(o, "overhead_s", src, at, true);
      c.seconds_per_flop = positive(o, "seconds_per_flop", src, at, true);
      c.seconds_per_byte = positive(o, "seconds_per_byte", src, at, true);
      c.samples = static_cast<int>(positive(o, "samples", src, at, true));
      c.worst_error = positive(o, "worst_error", src, at, true);
      if (c.overhead_s == 0 && c.seconds_per_flop == 0 && c.seconds_per_byte == 0)
        bad(src, at + "overhead_s", "a curve with a coefficient > 0", o);
      t.curves.push_back(std::move(c));
    }
  }
  return t;
}

}  // namespace dlplan
