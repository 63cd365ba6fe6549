// Pattern matching for the ONNX importer: subgraphs that are one IR op.
//   attention: x -> q, k, v projections (MatMul W [+ Add b] or Gemm; separate
//     or one fused QKV projection split three ways) -> Reshape / Transpose /
//     Split / Squeeze / Slice plumbing -> MatMul(q, k^T) -> scale (Div or Mul
//     by a constant, on the scores or on q) -> optional mask (Add or Where) ->
//     Softmax -> optional Dropout -> MatMul(p, v) -> Transpose / Reshape ->
//     output projection [+ bias]; nn.MultiheadAttention's sequence-first
//     transposes around it are taken inside. A mask built from constants or
//     shapes is evaluated: all zeros (BERT) hides nothing, anything else is
//     planned as causal; a mask read from a graph input is padding (ignored
//     for cost). Heads come from the inferred shape of the scores ([B, heads,
//     T, T]), or from q's width when the scores are [B heads, T, T].
//     The fused op's parameters must equal the projections' initializers.
//   gelu: x / sqrt(2) -> Erf -> +1 -> * x -> * 0.5 (any order of the last
//     two), and the tanh form x + 0.044715 x^3 -> * sqrt(2/pi) -> Tanh -> ...
//   silu: x * Sigmoid(x).
//   hardswish: x * HardSigmoid(x) (alpha 1/6, beta 1/2; opset 13 and below).
//   layernorm: x - mean, over the root of the mean square plus eps, times w
//     (+ b): LayerNorm over the last axis below opset 17.
//   rmsnorm: x * 1 / sqrt(mean(x^2) + eps) [-> Cast] * w, w an initializer
//     over the last axis (Hugging Face's LlamaRMSNorm, Mistral's, Qwen2's).
//   groupnorm: Reshape(x, [b, G, -1]) -> InstanceNormalization (scale 1,
//     bias 0) -> Reshape back to x's shape [-> * w -> + b]: nn.GroupNorm,
//     which torch exports this way at every opset.
#include "import_onnx_graph.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <set>
#include <tuple>

namespace dlplan::onnx_import {
namespace {

using OJson = nlohmann::ordered_json;

int64_t numel(const Dims& d) {
  int64_t n = 1;
  for (auto v : d) n *= v;
  return n;
}

std::string normalize_name(const std::string& name) {
  std::string s;
  for (char c : name) {
    char d = c == '/' || c == ':' ? '.' : c;
    if (d == '.' && (s.empty() || s.back() == '.')) continue;
    s.push_back(d);
  }
  while (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

std::string common_prefix(const std::vector<std::string>& names) {
  if (names.empty()) return "";
  std::vector<std::string> parts;
  auto split = [](const std::string& s) {
    std::vector<std::string> out;
    size_t b = 0;
    for (size_t e; (e = s.find('.', b)) != std::string::npos; b = e + 1) out.push_back(s.substr(b, e - b));
    out.push_back(s.substr(b));
    return out;
  };
  parts = split(normalize_name(names[0]));
  parts.pop_back();  // the op part ("MatMul")
  for (size_t k = 1; k < names.size(); ++k) {
    auto p = split(normalize_name(names[k]));
    size_t i = 0;
    while (i < parts.size() && i < p.size() && parts[i] == p[i]) ++i;
    parts.resize(i);
  }
  std::string s;
  for (const auto& p : parts) s += (s.empty() ? "" : ".") + p;
  return s;
}

// The other operand of a binary node, when one operand is `t`.
std::string other_operand(const onnx::NodeProto& n, const std::string& t) {
  if (n.input_size() != 2) return "";
  return n.input(0) == t ? n.input(1) : n.input(0);
}

// The non-constant operand of a binary node whose other operand is constant.
std::optional<std::string> data_operand(const Graph& g, const onnx::NodeProto& n) {
  if (n.input_size() != 2) return std::nullopt;
  const bool c0 = g.is_const(n.input(0)), c1 = g.is_const(n.input(1));
  if (c0 == c1) return std::nullopt;
  return c0 ? n.input(1) : n.input(0);
}

struct Proj {
  std::string out;   // after the bias
  std::string x;     // input
  int matmul = -1;
  int bias_node = -1;
  bool bias = false;
  int64_t in_f = 0, out_f = 0, params = 0;
  WeightRef weight, bias_ref;  // where the values are (bias_ref: when bias)
  int part = -1;               // which part of a fused projection's output this path takes (Split / Gather)
};

std::optional<Proj> projection_at(const Graph& g, const std::string& t) {
  int p = g.producer_of(t);
  if (p < 0) return std::nullopt;
  const auto& n = g.node(p);
  Proj pr;
  pr.out = t;
  int mm = p;
  if (n.op_type() == "Add" && n.input_size() == 2) {
    const std::string& b = g.is_init(n.input(0)) ? n.input(0) : n.input(1);
    const std::string& a = b == n.input(0) ? n.input(1) : n.input(0);
    if (!g.is_init(b)) return std::nullopt;
    mm = g.producer_of(a);
    if (mm < 0) return std::nullopt;
    pr.bias = true;
    pr.bias_node = p;
    pr.bias_ref = WeightRef{b};
    pr.params += numel(*g.shape(b));
  }
  const auto& m = g.node(mm);
  if (m.op_type() == "MatMul" && m.input_size() == 2 && g.matmul_weight(m.input(1)) && !g.is_const(m.input(0))) {
    std::tie(pr.in_f, pr.out_f) = *g.matmul_weight(m.input(1));
    pr.weight = g.matmul_weight_ref(m.input(1));
  } else if (m.op_type() == "Gemm" && !pr.bias && m.input_size() >= 2 && g.is_init(m.input(1)) &&
             attr_int(m, "transA", 0) == 0) {
    auto w = *g.shape(m.input(1));
    if (w.size() != 2) return std::nullopt;
    const bool tb = attr_int(m, "transB", 0) != 0;
    pr.in_f = tb ? w[1] : w[0];
    pr.out_f = tb ? w[0] : w[1];
    pr.weight = WeightRef{m.input(1), !tb};
    if (m.input_size() > 2 && !m.input(2).empty()) {
      pr.bias = true;
      pr.bias_ref = WeightRef{m.input(2)};
      pr.params += numel(*g.shape(m.input(2)));
    }
  } else {
    return std::nullopt;
  }
  pr.matmul = mm;
  pr.x = m.input(0);
  pr.params += pr.in_f * pr.out_f;
  return pr;
}

bool is_plumbing(const std::string& op) {
  return op == "Reshape" || op == "Transpose" || op == "Split" || op == "Squeeze" || op == "Unsqueeze" ||
         op == "Slice" || op == "Identity" || op == "Cast" || op == "Gather";
}

// Rotary position embedding as Hugging Face writes it:
//   x * cos + cat(-x[..., d/2:], x[..., :d/2]) * sin
// (rotate_half), cos and sin constants. The rotated tensor x, and the angle
// of position 1 in the second frequency (for rope_theta), when it matches.
struct Rotary {
  std::string x;
  std::optional<double> theta;
  std::optional<int64_t> dim;  // partial rotary (Phi): the leading dims of each head that rotate
  std::string cos, sin;        // the two tables
  std::vector<int> nodes;      // the two Muls, the Concat, the Neg and the two Slices
  int hi = -1, lo = -1;        // the Slices x[..., d/2:] and x[..., :d/2] (interleaved: x[..., 1::2], x[..., ::2])
  bool interleaved = false;
};

std::optional<Rotary> rotary_at(const Graph& g, const onnx::NodeProto& add) {
  if (add.op_type() != "Add" || add.input_size() != 2) return std::nullopt;
  for (int k = 0; k < 2; ++k) {
    const int a = g.producer_of(add.input(k)), b = g.producer_of(add.input(1 - k));
    if (a < 0 || b < 0 || g.node(a).op_type() != "Mul" || g.node(b).op_type() != "Mul") continue;
    const auto x = data_operand(g, g.node(a));
    const auto rot = data_operand(g, g.node(b));
    if (!x || !rot) continue;
    const int cat = g.producer_of(*rot);
    if (cat < 0 || g.node(cat).op_type() != "Concat" || g.node(cat).input_size() != 2) continue;
    const int neg = g.producer_of(g.node(cat).input(0));
    if (neg < 0 || g.node(neg).op_type() != "Neg") continue;
    const int hi = g.producer_of(g.node(neg).input(0)), lo = g.producer_of(g.node(cat).input(1));
    if (hi < 0 || lo < 0 || g.node(hi).op_type() != "Slice" || g.node(lo).op_type() != "Slice" ||
        g.node(hi).input(0) != *x || g.node(lo).input(0) != *x)
      continue;
    Rotary r{*x, std::nullopt, std::nullopt, other_operand(g.node(a), *x), other_operand(g.node(b), *rot),
             {a, b, cat, neg, hi, lo}, hi, lo};
    // cos [.., T, d]: cos(t / theta^(2i/d)) for i < d/2, repeated; position 1, i = 1
    // gives theta = (1 / acos(cos[1][1]))^(d/2).
    const std::string& cos = r.cos;
    const auto v = g.values(cos);
    const auto s = g.shape(cos);
    if (v && s && !s->empty() && s->back() >= 4 && static_cast<int64_t>(v->size()) >= 2 * s->back()) {
      const int64_t d = s->back();
      const double angle = std::acos(std::clamp((*v)[static_cast<size_t>(d + 1)], -1.0, 1.0));
      if (angle > 0) r.theta = std::pow(1.0 / angle, static_cast<double>(d) / 2.0);
    }
    return r;
  }
  return std::nullopt;
}

// start, end and step of a one-axis Slice of its input's last axis with
// constant bounds (end clamped to the axis), or nothing.
struct LastAxisSlice {
  int64_t start, end, step;
};
std::optional<LastAxisSlice> last_axis_slice(const Graph& g, const onnx::NodeProto& n) {
  const auto s = g.shape(n.input(0));
  if (n.input_size() < 4 || !s || s->empty()) return std::nullopt;
  const auto st = g.values(n.input(1)), en = g.values(n.input(2)), ax = g.values(n.input(3));
  if (!st || !en || !ax || st->size() != 1 || en->size() != 1 || ax->size() != 1) return std::nullopt;
  double step = 1;
  if (n.input_size() > 4 && !n.input(4).empty()) {
    const auto v = g.values(n.input(4));
    if (!v || v->size() != 1 || !((*v)[0] >= 1)) return std::nullopt;
    step = (*v)[0];
  }
  const auto rank = static_cast<double>(s->size());
  if ((*ax)[0] != -1.0 && (*ax)[0] != rank - 1) return std::nullopt;
  const int64_t len = s->back();
  auto clamp = [&](double v) { return static_cast<int64_t>(std::clamp(v < 0 ? v + len : v, 0.0, double(len))); };
  return LastAxisSlice{clamp((*st)[0]), clamp((*en)[0]), static_cast<int64_t>(step)};
}

// GPT-J's and CodeGen's rotary embedding, rotate_every_two:
//   x * cos + flatten(stack((-x[..., 1::2], x[..., ::2]), -1), -2) * sin
// (ONNX: Reshape(Concat(Unsqueeze(Neg(Slice)), Unsqueeze(Slice)))), cos and
// sin constants repeat_interleave'd. Not an attention pattern's rotary (that
// is rotate-half): matched for the standalone `rope` only.
std::optional<Rotary> interleaved_rotary_at(const Graph& g, const onnx::NodeProto& add) {
  if (add.op_type() != "Add" || add.input_size() != 2) return std::nullopt;
  auto made = [&](const std::string& t, const char* op) {
    const int p = g.producer_of(t);
    return p >= 0 && g.node(p).op_type() == op ? p : -1;
  };
  for (int k = 0; k < 2; ++k) {
    const int a = made(add.input(k), "Mul"), b = made(add.input(1 - k), "Mul");
    if (a < 0 || b < 0) continue;
    const auto x = data_operand(g, g.node(a));
    const auto rot = data_operand(g, g.node(b));
    if (!x || !rot) continue;
    const int flat = made(*rot, "Reshape");
    const int cat = flat >= 0 ? made(g.node(flat).input(0), "Concat") : -1;
    if (cat < 0 || g.node(cat).input_size() != 2) continue;
    const int u0 = made(g.node(cat).input(0), "Unsqueeze"), u1 = made(g.node(cat).input(1), "Unsqueeze");
    const int neg = u0 >= 0 ? made(g.node(u0).input(0), "Neg") : -1;
    const int hi = neg >= 0 ? made(g.node(neg).input(0), "Slice") : -1;
    const int lo = u1 >= 0 ? made(g.node(u1).input(0), "Slice") : -1;
    if (hi < 0 || lo < 0 || g.node(hi).input(0) != *x || g.node(lo).input(0) != *x) continue;
    // The pairs stacked on a new last axis, then flattened back to x's shape.
    const auto xs = g.shape(*x), cs = g.shape(g.node(cat).output(0)), fs = g.shape(*rot);
    if (!xs || !cs || !fs || *fs != *xs || cs->size() != xs->size() + 1 || cs->back() != 2) continue;
    Rotary r{*x, std::nullopt, std::nullopt, other_operand(g.node(a), *x), other_operand(g.node(b), *rot),
             {a, b, flat, cat, u0, u1, neg, hi, lo}, hi, lo, true};
    return r;
  }
  return std::nullopt;
}

// Rotary position embedding outside a recognised attention (GPT-NeoX's and
// Falcon's, whose attention is not the pattern; GPT-J's and CodeGen's
// interleaved form): the IR's `rope` on x [..., T, (heads,) d], where every
// value of both tables is cos and sin of t theta^(-2i/d) (to 1e-5, fp32
// tables) for pair i, and the halves are x[..., d/2:] and x[..., :d/2]
// (interleaved: x[..., 1::2] and x[..., ::2]). The tables' one axis longer
// than 1 besides d is the positions' (GPT-J's [1, T, 1, d] on x [b, T, H, d]:
// position_axis -3). PyTorch's two products keep only the tables (their
// other operand needs no gradient), constants shared by the batch: per
// sample, nothing, under both fusions.
std::optional<Fusion> match_rope(const Graph& g, int add) {
  auto r = rotary_at(g, g.node(add));
  if (!r) r = interleaved_rotary_at(g, g.node(add));
  const auto xs = r ? g.shape(r->x) : std::nullopt;
  const auto ts = r ? g.shape(r->cos) : std::nullopt;
  if (!r || !xs || xs->size() < 2 || !ts || ts->size() < 2 || ts->size() > xs->size() || g.shape(r->sin) != ts)
    return std::nullopt;
  // The positions' axis, from the end: the table's one axis longer than 1
  // before d (aligned with x's from the right, as broadcasting does).
  int64_t from_end = 0;
  for (size_t k = 2; k <= ts->size(); ++k)
    if ((*ts)[ts->size() - k] != 1) {
      if (from_end != 0) return std::nullopt;
      from_end = static_cast<int64_t>(k);
    }
  if (from_end == 0) return std::nullopt;
  const int64_t d = xs->back(), T = (*xs)[xs->size() - static_cast<size_t>(from_end)], half = d / 2;
  const auto cv = g.values(r->cos), sv = g.values(r->sin);
  if (d < 4 || d % 2 != 0 || T < 2 || ts->back() != d || (*ts)[ts->size() - static_cast<size_t>(from_end)] != T || !cv ||
      !sv || static_cast<int64_t>(cv->size()) != T * d || static_cast<int64_t>(sv->size()) != T * d)
    return std::nullopt;
  // Feature i's pair (its frequency index).
  auto pair_of = [&](int64_t i) { return r->interleaved ? i / 2 : i % half; };
  // theta from position 1's angle in the second frequency, theta^(-2/d): from
  // atan2(sin, cos), which keeps the fp32 tables' precision where acos of a
  // cosine near 1 does not; to 4 significant digits, then every value checked
  const auto second = static_cast<size_t>(d + (r->interleaved ? 2 : 1));
  const double angle = std::atan2((*sv)[second], (*cv)[second]);
  if (!(angle > 0)) return std::nullopt;
  const double estimate = std::pow(1.0 / angle, static_cast<double>(d) / 2.0);
  if (!std::isfinite(estimate) || estimate <= 1) return std::nullopt;
  const double mag = std::pow(10.0, std::floor(std::log10(estimate)) - 3);
  const double theta = std::round(estimate / mag) * mag;
  const auto hi = last_axis_slice(g, g.node(r->hi)), lo = last_axis_slice(g, g.node(r->lo));
  if (!hi || !lo) return std::nullopt;
  const bool halves = !r->interleaved && hi->step == 1 && lo->step == 1 && hi->start == half && hi->end == d &&
                      lo->start == 0 && lo->end == half;
  const bool pairs = r->interleaved && hi->step == 2 && lo->step == 2 && hi->start == 1 && hi->end == d &&
                     lo->start == 0 && lo->end >= d - 1;
  if (!halves && !pairs) return std::nullopt;
  for (const bool is_sin : {false, true}) {
    const auto& v = is_sin ? *sv : *cv;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < d; ++i) {
        const double inv_freq = std::pow(theta, -static_cast<double>(2 * pair_of(i)) / static_cast<double>(d));
        const double a = static_cast<double>(t) * inv_freq;
        if (std::fabs(v[static_cast<size_t>(t * d + i)] - (is_sin ? std::sin(a) : std::cos(a))) > 1e-5) return std::nullopt;
      }
  }
  Fusion f;
  f.kind = "rope";
  f.x = r->x;
  f.out = g.node(add).output(0);
  f.nodes = r->nodes;
  f.nodes.push_back(add);
  f.unit_source = g.node(add).name();
  f.name = g.node(add).name().empty() ? "rope" : normalize_name(g.node(add).name()) + ".rope";
  f.attrs["theta"] = theta;
  if (r->interleaved) f.attrs["interleaved"] = true;
  if (from_end != 2) f.attrs["position_axis"] = -from_end;
  return f;
}

// Which equal part of its input's sliced axis a one-axis Slice with
// constant bounds takes (nn.MultiheadAttention's q, k, v of the packed
// projection, torch 1.13): start / length, or -1.
int slice_part(const Graph& g, const onnx::NodeProto& n) {
  if (n.input_size() < 3) return -1;
  const auto s = g.shape(n.input(0));
  const auto st = g.values(n.input(1)), en = g.values(n.input(2));
  std::optional<std::vector<double>> ax;
  if (n.input_size() > 3 && !n.input(3).empty()) ax = g.values(n.input(3));
  if (!s || !st || !en || st->size() != 1 || en->size() != 1 || (ax && ax->size() != 1)) return -1;
  const auto rank = static_cast<int64_t>(s->size());
  int64_t axis = ax ? static_cast<int64_t>((*ax)[0]) : 0;
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank || (*s)[static_cast<size_t>(axis)] <= 0) return -1;
  const double dim = static_cast<double>((*s)[static_cast<size_t>(axis)]);
  double b = (*st)[0], e = std::min((*en)[0], dim);
  if (b < 0) b += dim;
  const double len = e - b;
  if (!(len > 0) || std::fmod(b, len) != 0 || std::fmod(dim, len) != 0) return -1;
  return static_cast<int>(b / len);
}

std::optional<Proj> trace_to_projection(const Graph& g, const std::string& t, int depth = 0,
                                        std::optional<Rotary>* rotary = nullptr) {
  if (depth > 12) return std::nullopt;
  if (auto pr = projection_at(g, t)) return pr;
  int p = g.producer_of(t);
  if (p < 0) return std::nullopt;
  const auto& n = g.node(p);
  if (auto r = rotary_at(g, n)) {
    if (rotary) *rotary = r;
    return trace_to_projection(g, r->x, depth + 1, rotary);
  }
  // Partial rotary (Phi): cat(rotate(x[..., :r]), x[..., r:]) along the last
  // axis, both parts sliced from the same x; the path goes on from x.
  if (n.op_type() == "Concat" && n.input_size() == 2) {
    const int a = g.producer_of(n.input(0)), b = g.producer_of(n.input(1));
    if (a >= 0 && b >= 0 && g.node(b).op_type() == "Slice") {
      if (auto r = rotary_at(g, g.node(a))) {
        const int s = g.producer_of(r->x);
        const std::string& x = g.node(b).input(0);
        const auto xs = g.shape(x), rs = g.shape(r->x), ps = g.shape(n.input(1));
        const int64_t axis = attr_int(n, "axis", 0);
        if (s >= 0 && g.node(s).op_type() == "Slice" && g.node(s).input(0) == x && xs && rs && ps && !xs->empty() &&
            rs->size() == xs->size() && ps->size() == xs->size() &&
            (axis == -1 || axis == static_cast<int64_t>(xs->size()) - 1) && rs->back() > 0 &&
            rs->back() + ps->back() == xs->back()) {
          r->dim = rs->back();
          if (rotary) *rotary = r;
          return trace_to_projection(g, x, depth + 1, rotary);
        }
      }
    }
  }
  // repeat_kv: grouped KV heads broadcast to the query heads
  if (n.op_type() == "Expand" && n.input_size() == 2 && g.is_const(n.input(1)))
    return trace_to_projection(g, n.input(0), depth + 1, rotary);
  if (is_plumbing(n.op_type())) {
    if (n.op_type() == "Gather" && (g.is_const(n.input(0)) || !g.is_const(n.input(1)))) return std::nullopt;
    auto pr = trace_to_projection(g, n.input(0), depth + 1, rotary);
    // The part of a fused QKV output this path takes, nearest the projection:
    // a Split's output index (GPT-2), or a Gather's constant index (nn.MultiheadAttention).
    if (pr && pr->part < 0 && n.op_type() == "Split")
      for (int k = 0; k < n.output_size(); ++k)
        if (n.output(k) == t) pr->part = k;
    if (pr && pr->part < 0 && n.op_type() == "Gather")
      if (const auto v = g.values(n.input(1)); v && v->size() == 1) pr->part = static_cast<int>((*v)[0]);
    if (pr && pr->part < 0 && n.op_type() == "Slice") pr->part = slice_part(g, n);
    return pr;
  }
  if (n.op_type() == "Div" || n.op_type() == "Mul")
    if (auto d = data_operand(g, n)) return trace_to_projection(g, *d, depth + 1, rotary);
  return std::nullopt;
}

// Whether a value `t` is computed from reaches a source for which
// `is_source(name)` holds: a graph input or an initializer, walking back
// through producers. Shape and Size read only their input's size and are not
// followed. (A search with its own stack: a graph may be a chain of many
// thousand nodes.)
template <typename Source>
bool computed_from(const Graph& g, const std::string& t, std::set<std::string>& seen, Source is_source) {
  std::vector<std::string> work{t};
  while (!work.empty()) {
    const std::string cur = work.back();
    work.pop_back();
    if (!seen.insert(cur).second) continue;
    const int p = g.producer_of(cur);
    if (p < 0) {
      if (is_source(cur)) return true;
      continue;
    }
    const auto& n = g.node(p);
    if (n.op_type() == "Shape" || n.op_type() == "Size") continue;
    for (const auto& in : n.input())
      if (!in.empty()) work.push_back(in);
  }
  return false;
}

// Whether `t` reads a graph input by value.
bool reads_graph_input(const Graph& g, const std::string& t, std::set<std::string>& seen) {
  return computed_from(g, t, seen, [&](const std::string& s) {
    return !g.is_init(s) && std::find(g.inputs.begin(), g.inputs.end(), s) != g.inputs.end();
  });
}

// Whether `t` is computed from a learned tensor (Graph::is_learned), as Swin's
// relative position bias table, gathered and added to the scores.
bool reads_parameter(const Graph& g, const std::string& t) {
  std::set<std::string> seen;
  return computed_from(g, t, seen, [&](const std::string& s) { return g.is_learned(s); });
}

// How a mask meets the scores: added to them, or a Where that keeps the
// scores where its condition is true (or where it is false).
enum class MaskUse { add, keep_if_true, keep_if_false };

struct Scores {
  int qk = -1;
  std::vector<std::pair<std::string, MaskUse>> masks;
  std::vector<int> nodes;
};

// A mask evaluated at import, over its last two axes [Tq, Tk]: whether it
// hides nothing (BERT's extended mask of an all-ones attention_mask is all
// zeros), hides exactly the future (j > i: causal), or something else
// (a sliding window, or values not known at import).
enum class MaskKind { none, causal, other };

MaskKind classify_mask(const Graph& g, const std::string& m, MaskUse use) {
  const auto v = g.values(m);
  const auto s = g.shape(m);
  if (!v || !s || s->size() < 2 || v->empty()) return MaskKind::other;
  const int64_t tq = (*s)[s->size() - 2], tk = s->back();
  const auto n = static_cast<int64_t>(v->size());
  if (tq <= 0 || tk <= 0 || tq > n || tk > n || n % (tq * tk) != 0) return MaskKind::other;  // (no overflow)
  auto hidden = [&](double x) -> std::optional<bool> {  // whether this entry hides its score
    switch (use) {
      case MaskUse::add:
        if (x == 0.0) return false;
        if (x <= -1e4) return true;  // -inf, or finfo.min as transformers writes it
        return std::nullopt;
      case MaskUse::keep_if_true: return x == 0.0;
      case MaskUse::keep_if_false: return x != 0.0;
    }
    return std::nullopt;
  };
  bool none = true, causal = true;
  for (size_t k = 0; k < v->size(); ++k) {
    const auto h = hidden((*v)[k]);
    if (!h) return MaskKind::other;
    const int64_t i = static_cast<int64_t>(k) / tk % tq, j = static_cast<int64_t>(k) % tk;
    none = none && !*h;
    causal = causal && *h == (j > i + (tk - tq));  // (a query attends to keys up to its own position)
  }
  return none ? MaskKind::none : causal ? MaskKind::causal : MaskKind::other;
}

bool find_qk(const Graph& g, const std::string& t, Scores& s, int depth = 0) {
  if (depth > 6) return false;
  int p = g.producer_of(t);
  if (p < 0) return false;
  const auto& n = g.node(p);
  const auto& op = n.op_type();
  if (op == "MatMul" && !g.is_const(n.input(0)) && !g.is_const(n.input(1))) {
    s.qk = p;
    return true;
  }
  if (op == "Div" || op == "Mul" || op == "Cast" || op == "Identity") {
    std::optional<std::string> d = op == "Cast" || op == "Identity" ? std::optional<std::string>(n.input(0)) : data_operand(g, n);
    if (!d) return false;
    s.nodes.push_back(p);
    return find_qk(g, *d, s, depth + 1);
  }
  if (op == "Add" && n.input_size() == 2) {
    for (int k = 0; k < 2; ++k) {
      Scores sub = s;
      sub.nodes.push_back(p);
      sub.masks.emplace_back(n.input(1 - k), MaskUse::add);
      if (find_qk(g, n.input(k), sub, depth + 1)) {
        s = sub;
        return true;
      }
    }
    return false;
  }
  if (op == "Where" && n.input_size() == 3) {
    for (int k = 1; k < 3; ++k) {
      if (g.is_const(n.input(k))) continue;
      Scores sub = s;
      sub.nodes.push_back(p);
      sub.masks.emplace_back(n.input(0), k == 1 ? MaskUse::keep_if_true : MaskUse::keep_if_false);
      if (find_qk(g, n.input(k), sub, depth + 1)) {
        s = sub;
        return true;
      }
    }
  }
  return false;
}

// Nodes on paths from `x` to `out` (both ends' producers included, x's not).
std::vector<int> region(const Graph& g, const std::string& x, const std::string& out) {
  std::set<int> fwd;
  std::deque<std::string> q{x};
  std::set<std::string> seen{x};
  while (!q.empty()) {
    auto t = q.front();
    q.pop_front();
    for (int c : g.consumers_of(t)) {
      const auto& op = g.node(c).op_type();
      if (op == "Shape" || op == "Size") continue;  // shape plumbing is shared between layers
      if (!fwd.insert(c).second) continue;
      for (const auto& o : g.node(c).output())
        if (!o.empty() && seen.insert(o).second && o != out) q.push_back(o);
    }
  }
  std::set<int> in;
  std::vector<std::string> work{out};
  std::set<std::string> seen2;
  while (!work.empty()) {
    auto t = work.back();
    work.pop_back();
    if (t == x || !seen2.insert(t).second) continue;
    int p = g.producer_of(t);
    if (p < 0 || !fwd.count(p)) continue;
    if (!in.insert(p).second) continue;
    for (const auto& i : g.node(p).input())
      if (!i.empty()) work.push_back(i);
  }
  return {in.begin(), in.end()};
}

bool swaps_first_two(const Graph& g, int node) {
  if (node < 0 || g.node(node).op_type() != "Transpose") return false;
  const auto perm = attr_ints(g.node(node), "perm");
  return perm.size() == 3 && perm[0] == 1 && perm[1] == 0 && perm[2] == 2;
}

// When `x` is Transpose(perm [1, 0, 2]) of a tensor and `out` leads through a
// Reshape to the inverse transpose, the batch-first tensors outside them.
std::optional<std::pair<std::string, std::string>> batch_second_around(const Graph& g, const std::string& x,
                                                                       const std::string& out) {
  const int in = g.producer_of(x);
  if (!swaps_first_two(g, in)) return std::nullopt;
  std::string t = out;
  for (int depth = 0; depth < 3; ++depth) {
    const auto& c = g.consumers_of(t);
    if (c.size() != 1) return std::nullopt;
    const auto& n = g.node(c[0]);
    if (swaps_first_two(g, c[0])) return std::make_pair(g.node(in).input(0), n.output(0));
    if (n.op_type() != "Reshape" && n.op_type() != "Identity") return std::nullopt;
    t = n.output(0);
  }
  return std::nullopt;
}

// The batch: the first axis of the graph's first data input (bound to
// --micro-batch, or fixed in the file); 0 when unknown.
int64_t graph_batch(const Graph& g) {
  for (const auto& in : g.g.input()) {
    if (g.is_init(in.name())) continue;
    const auto s = g.shape(in.name());
    return s && !s->empty() ? (*s)[0] : 0;
  }
  return 0;
}

std::optional<Fusion> match_attention(const Graph& g, int softmax, std::string& why) {
  const auto& sm = g.node(softmax);
  Scores s;
  if (!find_qk(g, sm.input(0), s)) {
    why = "no MatMul(q, k) before it";
    return std::nullopt;
  }
  // Forward: [Dropout] -> MatMul(p, v).
  std::string probs = sm.output(0);
  double dropout = 0.0;
  auto single = [&](const std::string& t) -> int {
    const auto& c = g.consumers_of(t);
    return c.size() == 1 ? c[0] : -1;
  };
  int nx = single(probs);
  // (GPT-2 casts the probabilities to v's type: a Cast or Identity is skipped.)
  auto skip_casts = [&] {
    while (nx >= 0 && (g.node(nx).op_type() == "Cast" || g.node(nx).op_type() == "Identity")) {
      probs = g.node(nx).output(0);
      nx = single(probs);
    }
  };
  skip_casts();
  if (nx >= 0 && g.node(nx).op_type() == "Dropout") {
    const auto& d = g.node(nx);
    dropout = attr_float(d, "ratio", 0.5);
    if (d.input_size() > 1 && !d.input(1).empty())
      if (auto v = g.scalar(d.input(1))) dropout = *v;
    if (d.input_size() > 2 && !d.input(2).empty())
      if (auto v = g.scalar(d.input(2)); v && *v == 0.0) dropout = 0.0;
    probs = d.output(0);
    nx = single(probs);
    skip_casts();
  }
  if (nx < 0 || g.node(nx).op_type() != "MatMul" || g.node(nx).input(0) != probs) {
    why = "its output does not feed MatMul(probabilities, v)";
    return std::nullopt;
  }
  const auto& pv = g.node(nx);
  const auto& qk = g.node(s.qk);
  std::optional<Rotary> rq, rk;
  auto pq = trace_to_projection(g, qk.input(0), 0, &rq);
  auto pk = trace_to_projection(g, qk.input(1), 0, &rk);
  auto pvp = trace_to_projection(g, pv.input(1));
  if (!pq || !pk || !pvp) {
    why = "q, k or v does not trace back to a linear projection through Reshape / Transpose / Split";
    return std::nullopt;
  }
  if (pq->x != pk->x || pq->x != pvp->x) {
    why = "q, k and v are projections of different tensors (cross-attention is not supported)";
    return std::nullopt;
  }
  // Forward from MatMul(p, v) through plumbing to the output projection.
  std::string t = pv.output(0);
  std::optional<Proj> po;
  for (int depth = 0; depth < 8 && !po; ++depth) {
    int c = single(t);
    if (c < 0) break;
    const auto& n = g.node(c);
    if ((n.op_type() == "MatMul" && n.input(0) == t && g.matmul_weight(n.input(1))) || n.op_type() == "Gemm") {
      std::string cand = n.output(0);
      int b = single(cand);
      if (b >= 0 && g.node(b).op_type() == "Add") {
        if (auto withb = projection_at(g, g.node(b).output(0))) po = withb;
      }
      if (!po) po = projection_at(g, cand);
      break;
    }
    if (n.op_type() != "Transpose" && n.op_type() != "Reshape" && n.op_type() != "Identity" && n.op_type() != "Flatten")
      break;
    t = n.output(0);
  }
  if (!po) {
    why = "MatMul(probabilities, v) does not lead to an output projection";
    return std::nullopt;
  }
  // Heads from the scores' inferred shape [B, heads, Tq, Tk], else q's [B, heads, T, d];
  // nn.MultiheadAttention's scores are [B heads, Tq, Tk], and q's last axis
  // is then the head width: heads = the output projection's input / d.
  int64_t heads = 0;
  if (auto sh = g.shape(qk.output(0)); sh && sh->size() == 4 && (*sh)[1] > 0) heads = (*sh)[1];
  else if (auto qs = g.shape(qk.input(0)); qs && qs->size() == 4 && (*qs)[1] > 0) heads = (*qs)[1];
  else if (auto q3 = g.shape(qk.input(0)); q3 && q3->size() == 3 && q3->back() > 0 && po->in_f % q3->back() == 0)
    heads = po->in_f / q3->back();
  if (heads <= 0) {
    why = "the number of heads is not known (no 4-D shape on the scores after shape inference)";
    return std::nullopt;
  }
  const bool fused_qkv = pq->matmul == pk->matmul;
  const int64_t D = pq->in_f;
  int64_t q_out = pq->out_f, k_out = pk->out_f, v_out = pvp->out_f;
  int64_t params = pq->params + (fused_qkv ? 0 : pk->params + pvp->params) + po->params;
  if (fused_qkv) {
    if (pvp->matmul != pq->matmul || pq->out_f % 3 != 0) {
      why = "a fused QKV projection that is not split in three equal parts";
      return std::nullopt;
    }
    q_out = k_out = v_out = pq->out_f / 3;
  }
  if (q_out % heads != 0) {
    why = fmt::format("q width {} does not divide by {} heads", q_out, heads);
    return std::nullopt;
  }
  const int64_t hd = q_out / heads;
  if (k_out != v_out || k_out % hd != 0) {
    why = "k and v widths differ";
    return std::nullopt;
  }
  const int64_t kv = k_out / hd;
  // Biases on q, k and v together, and on the output projection apart from
  // them (Qwen2: q, k and v only).
  const bool qkv_bias = pq->bias && pk->bias && pvp->bias, out_bias = po->bias;
  if (!qkv_bias && (pq->bias || pk->bias || pvp->bias)) {
    why = "some of the q, k and v projections have a bias and some do not";
    return std::nullopt;
  }
  const int64_t expect = D * (heads + 2 * kv) * hd + heads * hd * D + (qkv_bias ? (heads + 2 * kv) * hd : 0) +
                         (out_bias ? D : 0);
  if (po->in_f != heads * hd || po->out_f != D || expect != params) {
    why = fmt::format("projection sizes do not form attention over width {} ({} heads of {})", D, heads, hd);
    return std::nullopt;
  }
  Fusion f;
  f.kind = "attention";
  f.x = pq->x;
  f.out = po->out;
  // nn.MultiheadAttention runs sequence-first: torch writes x.transpose(0, 1)
  // before the projections and the inverse after the output projection's
  // view back to [T, b, D]. Both are inside the block, which reads and
  // writes [b, T, D].
  if (auto seq_first = batch_second_around(g, f.x, f.out)) std::tie(f.x, f.out) = *seq_first;
  // The IR's attention reads one sequence a sample, x [b, T, D] (or [b T, D]
  // after GPT-2's Conv1D reshape). MobileViT folds its patches into the
  // batch ([b P, N, C]): P attentions a sample, planned through the generic ops.
  const int64_t batch = graph_batch(g);  // (unknown: 0, and no rank-3 input is judged by it)
  if (auto xs = g.shape(f.x); xs && (xs->size() > 3 || (xs->size() == 3 && batch > 0 && (*xs)[0] != batch))) {
    why = fmt::format("its input [{}] is not one sequence a sample, [batch, T, D]", fmt::join(*xs, ", "));
    return std::nullopt;
  }
  f.nodes = region(g, f.x, f.out);
  f.unit_source = sm.name();
  std::vector<std::string> names{g.node(pq->matmul).name(), g.node(po->matmul).name(), sm.name()};
  std::string base = common_prefix(names);
  f.name = base.empty() ? "attention" : base;
  bool causal = false;
  std::vector<std::string> input_masks;
  for (const auto& [m, use] : s.masks) {
    if (reads_parameter(g, m)) {  // its parameters would vanish into the fused op
      why = "a learned tensor is added to the scores (a relative position bias table)";
      return std::nullopt;
    }
    std::set<std::string> seen;
    if (reads_graph_input(g, m, seen)) input_masks.push_back(m);
    else if (classify_mask(g, m, use) != MaskKind::none) causal = true;  // a window is planned as causal
  }
  f.attrs["heads"] = heads;
  if (kv != heads) f.attrs["kv_heads"] = kv;
  if (hd * heads != D) f.attrs["head_dim"] = hd;
  f.attrs["causal"] = causal;
  if (rq.has_value() != rk.has_value()) {
    why = "only one of q and k is rotated";
    return std::nullopt;
  }
  if (rq && rq->dim != rk->dim) {
    why = "q and k rotate different parts of their heads";
    return std::nullopt;
  }
  if (rq) {
    f.attrs["rope"] = true;
    if (rq->dim && *rq->dim != hd) f.attrs["rotary_dim"] = *rq->dim;
    // Rounded to 4 significant digits: the table is float32, and the angle's
    // error grows by the power d/2 (10000 comes back as 10000.1 at d = 32).
    if (rq->theta && std::isfinite(*rq->theta) && *rq->theta > 1) {
      const double mag = std::pow(10.0, std::floor(std::log10(*rq->theta)) - 3);
      f.attrs["rope_theta"] = std::round(*rq->theta / mag) * mag;
    }
  }
  f.attrs["bias"] = qkv_bias && out_bias;
  if (qkv_bias != out_bias) {
    f.attrs["qkv_bias"] = qkv_bias;
    f.attrs["out_bias"] = out_bias;
  }
  // Where each projection's values are; a fused QKV weight [q | k | v] gives
  // each its rows, in that order (GPT-2's c_attn, split three ways).
  auto weights_of = [&](const char* name, const Proj& p, int64_t begin, int64_t end) {
    WeightRef w = p.weight, b = p.bias_ref;
    w.begin = b.begin = begin;
    w.end = b.end = end;
    f.weights.emplace_back(std::string(name) + ".weight", w);
    if (std::string(name) == "o" ? out_bias : qkv_bias) f.weights.emplace_back(std::string(name) + ".bias", b);
  };
  std::string parts_note;
  if (fused_qkv) {
    // Each of q, k, v takes the third its path's Split or Gather picks; where
    // that was not traced, the order q, k, v (GPT-2's, PyTorch's in_proj).
    std::array<int, 3> part{pq->part, pk->part, pvp->part};
    if (std::set<int>(part.begin(), part.end()) != std::set<int>{0, 1, 2}) {
      part = {0, 1, 2};
      parts_note = fmt::format("attention '{}': the fused projection's parts were not traced; --init reads its rows "
                               "as q, k, v in that order", f.name);
    }
    weights_of("q", *pq, part[0] * q_out, (part[0] + 1) * q_out);
    weights_of("k", *pq, part[1] * q_out, (part[1] + 1) * q_out);
    weights_of("v", *pq, part[2] * q_out, (part[2] + 1) * q_out);
  } else {
    weights_of("q", *pq, 0, -1);
    weights_of("k", *pk, 0, -1);
    weights_of("v", *pvp, 0, -1);
  }
  weights_of("o", *po, 0, -1);
  if (dropout > 0.0) f.attrs["dropout"] = std::round(dropout * 1e6) / 1e6;  // float32 in the file
  if (!input_masks.empty())
    f.note = fmt::format("attention '{}': padding mask from a model input ignored (no effect on memory)", f.name);
  if (rq && !f.attrs.contains("rope_theta"))
    f.note += std::string(f.note.empty() ? "" : "; ") +
              fmt::format("attention '{}': rope_theta could not be read from the cos table; 10000 assumed", f.name);
  if (!parts_note.empty()) f.note += std::string(f.note.empty() ? "" : "; ") + parts_note;
  return f;
}

// The tail of a GELU: from `cur` through +1, * x (or * (0.5 x)) and * 0.5.
// half_apart: set when 0.5 x is its own node (x * 0.5 * (1 + ...), as Python
// writes it; torch's export of F.gelu multiplies by 0.5 last).
std::optional<std::string> gelu_tail(const Graph& g, const std::string& x, std::string cur, std::vector<int>& nodes,
                                     bool* half_apart = nullptr) {
  bool seen_x = false, seen_half = false, seen_one = false;
  for (int step = 0; step < 4 && !(seen_x && seen_half && seen_one); ++step) {
    const auto& cons = g.consumers_of(cur);
    if (cons.size() != 1) return std::nullopt;
    const auto& n = g.node(cons[0]);
    if ((n.op_type() != "Add" && n.op_type() != "Mul") || n.input_size() != 2) return std::nullopt;
    const auto other = other_operand(n, cur);
    if (g.is_const(other)) {
      (n.op_type() == "Add" ? seen_one : seen_half) = true;
    } else if (other == x) {
      if (n.op_type() != "Mul") return std::nullopt;
      seen_x = true;
    } else {
      int q = g.producer_of(other);
      if (q < 0) return std::nullopt;
      const auto& side = g.node(q);
      auto d = data_operand(g, side);
      if (side.op_type() != "Mul" || !d || *d != x) return std::nullopt;
      nodes.push_back(q);
      seen_x = seen_half = true;
      if (half_apart) *half_apart = true;
    }
    nodes.push_back(cons[0]);
    cur = n.output(0);
  }
  if (!(seen_x && seen_half && seen_one)) return std::nullopt;
  return cur;
}

// x / sqrt(2) -> Erf -> +1, * x, * 0.5. Under --fusion eager, the form
// Python writes (ESM's gelu: x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))),
// 0.5 x its own node) is left op by op, as PyTorch's eager autograd runs it
// (erf keeps x / sqrt(2), the product both factors); torch's own export of
// F.gelu, one op in PyTorch, is fused either way.
std::optional<Fusion> match_gelu_erf(const Graph& g, int erf, bool eager) {
  const auto& e = g.node(erf);
  int p = g.producer_of(e.input(0));
  if (p < 0) return std::nullopt;
  const auto& pre = g.node(p);
  if (pre.op_type() != "Div" && pre.op_type() != "Mul") return std::nullopt;
  auto x = data_operand(g, pre);
  if (!x) return std::nullopt;
  std::vector<int> nodes{p, erf};
  bool half_apart = false;
  auto out = gelu_tail(g, *x, e.output(0), nodes, &half_apart);
  if (!out || (eager && half_apart)) return std::nullopt;
  Fusion f;
  f.kind = "gelu";
  f.x = *x;
  f.out = *out;
  f.nodes = nodes;
  f.unit_source = e.name();
  f.name = e.name().empty() ? "gelu" : normalize_name(e.name()) + ".gelu";
  f.attrs["approximate"] = "none";
  return f;
}

// x^3 as the GELU's tanh form writes it: Pow(x, 3) (Python: Hugging Face's
// gelu_new) or x * (x * x) (torch's own export of F.gelu(approximate="tanh")).
// The nodes, and whether it is the Python form; nothing for another tensor.
std::optional<std::pair<std::vector<int>, bool>> cube_of(const Graph& g, const std::string& cube, const std::string& x) {
  const int p = g.producer_of(cube);
  if (p < 0) return std::nullopt;
  const auto& n = g.node(p);
  if (n.op_type() == "Pow" && n.input(0) == x) return std::make_pair(std::vector<int>{p}, true);
  if (n.op_type() != "Mul" || n.input_size() != 2) return std::nullopt;
  for (int k = 0; k < 2; ++k) {
    const int sq = g.producer_of(n.input(1 - k));
    if (n.input(k) == x && sq >= 0 && g.node(sq).op_type() == "Mul" && g.node(sq).input_size() == 2 &&
        g.node(sq).input(0) == x && g.node(sq).input(1) == x)
      return std::make_pair(std::vector<int>{sq, p}, false);
  }
  return std::nullopt;
}

// The tanh GELU of x whose nodes up to the Tanh are `nodes`: with its tail
// (+1, * x, * 0.5) when the graph has it.
std::optional<Fusion> tanh_gelu(const Graph& g, const std::string& x, int tanh, std::vector<int> nodes) {
  const auto& t = g.node(tanh);
  auto out = gelu_tail(g, x, t.output(0), nodes);
  if (!out) return std::nullopt;
  Fusion f;
  f.kind = "gelu";
  f.x = x;
  f.out = *out;
  f.nodes = std::move(nodes);
  f.unit_source = t.name();
  f.name = t.name().empty() ? "gelu" : normalize_name(t.name()) + ".gelu";
  f.attrs["approximate"] = "tanh";
  return f;
}

std::optional<Fusion> match_gelu_tanh(const Graph& g, int tanh, bool eager) {
  const auto& t = g.node(tanh);
  int p1 = g.producer_of(t.input(0));  // * sqrt(2/pi)
  if (p1 < 0 || g.node(p1).op_type() != "Mul") return std::nullopt;
  auto a = data_operand(g, g.node(p1));
  if (!a) return std::nullopt;
  int p2 = g.producer_of(*a);  // x + 0.044715 x^3
  if (p2 < 0 || g.node(p2).op_type() != "Add" || g.node(p2).input_size() != 2) return std::nullopt;
  for (int k = 0; k < 2; ++k) {
    const std::string x = g.node(p2).input(k);
    int p3 = g.producer_of(g.node(p2).input(1 - k));  // 0.044715 * x^3
    if (p3 < 0 || g.node(p3).op_type() != "Mul") continue;
    auto cube = data_operand(g, g.node(p3));
    if (!cube) continue;
    const auto c = cube_of(g, *cube, x);
    if (!c) continue;
    if (c->second && eager) return std::nullopt;  // written in Python: op by op under --fusion eager
    std::vector<int> nodes = c->first;
    nodes.insert(nodes.end(), {p3, p2, p1, tanh});
    return tanh_gelu(g, x, tanh, std::move(nodes));
  }
  return std::nullopt;
}

// BLOOM's GELU (transformers' bloom_gelu_forward): x * 0.5 * (1 + tanh(
// 0.79788456 x (1 + 0.044715 x x))), the tanh form written another way. In
// training BLOOM runs it as a custom autograd Function that keeps only its
// input (BloomGelu -> GeLUFunction); the export writes the forward out. So it
// is one tanh gelu under both fusions: PyTorch never keeps its intermediates.
std::optional<Fusion> match_gelu_tanh_bloom(const Graph& g, int tanh) {
  const auto& t = g.node(tanh);
  const int p1 = g.producer_of(t.input(0));  // (0.79788456 x) * (1 + 0.044715 x x)
  if (p1 < 0 || g.node(p1).op_type() != "Mul" || g.node(p1).input_size() != 2) return std::nullopt;
  // A Mul of `of` by a constant near `c`: the data operand.
  auto scaled = [&](const std::string& t_out, double c) -> std::optional<std::pair<int, std::string>> {
    const int p = g.producer_of(t_out);
    if (p < 0 || g.node(p).op_type() != "Mul") return std::nullopt;
    const auto d = data_operand(g, g.node(p));
    const auto k = d ? g.scalar(other_operand(g.node(p), *d)) : std::nullopt;
    if (!k || std::fabs(*k - c) > 1e-6 * c) return std::nullopt;
    return std::make_pair(p, *d);
  };
  for (int k = 0; k < 2; ++k) {
    const auto lin = scaled(g.node(p1).input(k), 0.79788456);  // sqrt(2 / pi), as BLOOM rounds it
    const int add = g.producer_of(g.node(p1).input(1 - k));
    if (!lin || add < 0 || g.node(add).op_type() != "Add") continue;
    const std::string& x = lin->second;
    const auto sq = data_operand(g, g.node(add));  // 1 + (0.044715 x) x
    const auto one = sq ? g.scalar(other_operand(g.node(add), *sq)) : std::nullopt;
    const int p3 = sq ? g.producer_of(*sq) : -1;
    if (!one || *one != 1.0 || p3 < 0 || g.node(p3).op_type() != "Mul" || g.node(p3).input_size() != 2) continue;
    const std::string& cubic = g.node(p3).input(0) == x ? g.node(p3).input(1) : g.node(p3).input(0);
    const auto c2 = scaled(cubic, 0.044715);
    if (other_operand(g.node(p3), cubic) != x || !c2 || c2->second != x) continue;
    auto f = tanh_gelu(g, x, tanh, {lin->first, c2->first, p3, add, p1, tanh});
    if (f)
      f->note = "BLOOM's form of the tanh GELU planned as one gelu under both fusions (in training PyTorch runs it as "
                "a custom autograd Function that keeps only its input)";
    return f;
  }
  return std::nullopt;
}

// x * gate(x), the gate's output multiplied by the gate's own input: SiLU
// (Sigmoid) and Hardswish (HardSigmoid).
std::optional<Fusion> match_self_gated(const Graph& g, int gate, const char* kind) {
  const auto& s = g.node(gate);
  const auto& cons = g.consumers_of(s.output(0));
  if (cons.size() != 1) return std::nullopt;
  const auto& m = g.node(cons[0]);
  if (m.op_type() != "Mul" || other_operand(m, s.output(0)) != s.input(0)) return std::nullopt;
  Fusion f;
  f.kind = kind;
  f.x = s.input(0);
  f.out = m.output(0);
  f.nodes = {gate, cons[0]};
  f.unit_source = s.name();
  f.name = s.name().empty() ? kind : normalize_name(s.name()) + "." + kind;
  return f;
}

std::optional<Fusion> match_silu(const Graph& g, int sig) { return match_self_gated(g, sig, "silu"); }

// x * HardSigmoid(x) with PyTorch's alpha 1/6 and beta 1/2: Hardswish as
// torch exports it below opset 14, which has no HardSwish op.
std::optional<Fusion> match_hardswish(const Graph& g, int hs) {
  if (!is_torch_hardsigmoid(g.node(hs))) return std::nullopt;
  return match_self_gated(g, hs, "hardswish");
}

// The axes a ReduceMean reduces: its attribute (up to opset 17) or its
// second input (opset 18), negative axes counted from the end of `rank`.
std::vector<int64_t> reduce_axes(const Graph& g, const onnx::NodeProto& n, size_t rank) {
  auto axes = attr_ints(n, "axes");
  if (n.input_size() > 1 && !n.input(1).empty())
    if (auto v = g.values(n.input(1))) axes.assign(v->begin(), v->end());
  for (auto& a : axes)
    if (a < 0) a += static_cast<int64_t>(rank);
  return axes;
}

// The one node reading `t`, if exactly one does and it is `op`.
std::optional<int> sole_consumer(const Graph& g, const std::string& t, const char* op) {
  const auto& cons = g.consumers_of(t);
  if (cons.size() != 1 || g.node(cons[0]).op_type() != op || g.node(cons[0]).output_size() < 1) return std::nullopt;
  return cons[0];
}

// x * Tanh(Softplus(x)): nn.Mish, which torch exports below opset 18 (no
// Mish op) as these three nodes, and PyTorch runs as one op keeping only x,
// so it is one mish under both fusions.
std::optional<Fusion> match_mish(const Graph& g, int softplus) {
  const auto& sp = g.node(softplus);
  const auto tanh = sole_consumer(g, sp.output(0), "Tanh");
  if (!tanh) return std::nullopt;
  const auto& t = g.node(*tanh);
  const auto mul = sole_consumer(g, t.output(0), "Mul");
  if (!mul || other_operand(g.node(*mul), t.output(0)) != sp.input(0)) return std::nullopt;
  Fusion f;
  f.kind = "mish";
  f.x = sp.input(0);
  f.out = g.node(*mul).output(0);
  f.nodes = {softplus, *tanh, *mul};
  f.unit_source = sp.name();
  f.name = sp.name().empty() ? "mish" : normalize_name(sp.name()) + ".mish";
  return f;
}

// Stochastic depth as Hugging Face writes it (drop_path: random_tensor =
// floor(keep + torch.rand([b, 1, ...])), x.div(keep) * random_tensor),
// anchored at the RandomUniformLike: Div(x, keep) * Floor(Add(u, keep)),
// the random tensor one value a sample. The IR's drop_path with p = 1 - keep
// under both fusions: PyTorch's div keeps nothing, and its mul keeps only
// the random tensor (x does not need the other's gradient), one float a
// sample, which drop_path keeps too.
std::optional<Fusion> match_drop_path(const Graph& g, int rand) {
  const auto& r = g.node(rand);
  const auto rs = g.shape(r.output(0));
  if (!rs || rs->empty() || std::any_of(rs->begin() + 1, rs->end(), [](int64_t d) { return d != 1; }))
    return std::nullopt;
  const auto add = sole_consumer(g, r.output(0), "Add");
  if (!add) return std::nullopt;
  const auto keep = g.scalar(other_operand(g.node(*add), r.output(0)));
  if (!keep || !(*keep > 0.0 && *keep <= 1.0)) return std::nullopt;
  const auto floor = sole_consumer(g, g.node(*add).output(0), "Floor");
  if (!floor) return std::nullopt;
  const auto mul = sole_consumer(g, g.node(*floor).output(0), "Mul");
  if (!mul) return std::nullopt;
  const std::string scaled = other_operand(g.node(*mul), g.node(*floor).output(0));
  const int div = g.producer_of(scaled);
  if (div < 0 || g.node(div).op_type() != "Div" || g.node(div).input_size() != 2 ||
      g.node(div).input(0) == scaled || g.consumers_of(scaled).size() != 1)
    return std::nullopt;
  const auto by = g.scalar(g.node(div).input(1));
  if (!by || std::fabs(*by - *keep) > 1e-6 * *keep) return std::nullopt;
  Fusion f;
  f.kind = "drop_path";
  f.x = g.node(div).input(0);
  f.out = g.node(*mul).output(0);
  f.nodes = {rand, *add, *floor, div, *mul};
  f.unit_source = g.node(*mul).name();
  const std::string& n = g.node(*mul).name();
  f.name = n.empty() ? "drop_path" : normalize_name(n);
  f.attrs["p"] = std::round((1.0 - *keep) * 1e6) / 1e6;  // a float32 in the file: 0.9f -> p 0.1
  return f;
}

// LayerNorm over the last axis as torch exports it below opset 17, which has
// no LayerNormalization op (anchored at the Sqrt):
//   d = x - ReduceMean(x); Div(d, Sqrt(ReduceMean(Pow(d, 2)) + eps)) * w [+ b]
// with w and b initializers of the last axis's size (the affine form; without
// w it is not nn.LayerNorm's parameters, and is left to the generic ops).
// What LayerNorm and RMSNorm written out share: Sqrt(ReduceMean(Pow(d, 2)) + eps).
struct MeanSquare {
  int add_eps = -1, mean = -1, pow = -1;
  double eps = 0;
  std::string d;  // what is squared
};

std::optional<MeanSquare> mean_square_under(const Graph& g, int sqrt) {
  const auto& sq = g.node(sqrt);
  if (sq.input_size() != 1 || sq.output_size() != 1) return std::nullopt;
  MeanSquare m;
  m.add_eps = g.producer_of(sq.input(0));
  if (m.add_eps < 0 || g.node(m.add_eps).op_type() != "Add") return std::nullopt;
  const auto ms_t = data_operand(g, g.node(m.add_eps));
  const auto eps = ms_t ? g.scalar(other_operand(g.node(m.add_eps), *ms_t)) : std::nullopt;
  if (!eps || !(*eps > 0)) return std::nullopt;
  m.eps = *eps;
  m.mean = g.producer_of(*ms_t);
  if (m.mean < 0 || g.node(m.mean).op_type() != "ReduceMean" || g.node(m.mean).input_size() < 1) return std::nullopt;
  m.pow = g.producer_of(g.node(m.mean).input(0));
  if (m.pow < 0 || g.node(m.pow).op_type() != "Pow" || g.node(m.pow).input_size() != 2) return std::nullopt;
  if (g.scalar(g.node(m.pow).input(1)) != std::optional<double>(2.0)) return std::nullopt;
  m.d = g.node(m.pow).input(0);
  return m;
}

std::optional<Fusion> match_layernorm(const Graph& g, int sqrt) {
  const auto& sq = g.node(sqrt);
  const auto msq = mean_square_under(g, sqrt);
  if (!msq) return std::nullopt;
  const int add_eps = msq->add_eps, var = msq->mean, pow = msq->pow;
  const std::string d = msq->d;
  const int sub = g.producer_of(d);
  if (sub < 0 || g.node(sub).op_type() != "Sub" || g.node(sub).input_size() != 2) return std::nullopt;
  const std::string x = g.node(sub).input(0);
  const int mean = g.producer_of(g.node(sub).input(1));
  if (mean < 0 || g.node(mean).op_type() != "ReduceMean" || g.node(mean).input_size() < 1 ||
      g.node(mean).input(0) != x)
    return std::nullopt;
  const auto xs = g.shape(x);
  if (!xs || xs->size() < 2 || xs->back() <= 0) return std::nullopt;
  const std::vector<int64_t> last{static_cast<int64_t>(xs->size()) - 1};
  for (int r : {mean, var})
    if (reduce_axes(g, g.node(r), xs->size()) != last || attr_int(g.node(r), "keepdims", 1) != 1) return std::nullopt;
  const auto div = sole_consumer(g, sq.output(0), "Div");
  if (!div || g.node(*div).input_size() != 2 || g.node(*div).input(0) != d || g.node(*div).input(1) != sq.output(0))
    return std::nullopt;
  // The affine part: * w, then + b, each an initializer [C].
  auto affine = [&](const std::string& t, const char* op) -> std::optional<int> {
    const auto n = sole_consumer(g, t, op);
    if (!n) return std::nullopt;
    const std::string p = other_operand(g.node(*n), t);  // "" unless the node is binary
    const auto ps = !p.empty() && g.is_init(p) ? g.shape(p) : std::nullopt;
    if (!ps || *ps != Dims{xs->back()}) return std::nullopt;
    return n;
  };
  const auto mul = affine(g.node(*div).output(0), "Mul");
  if (!mul) return std::nullopt;
  const auto bias = affine(g.node(*mul).output(0), "Add");
  Fusion f;
  f.kind = "layernorm";
  f.x = x;
  f.nodes = {mean, sub, pow, var, add_eps, sqrt, *div, *mul};
  if (bias) f.nodes.push_back(*bias);
  f.out = g.node(f.nodes.back()).output(0);
  f.unit_source = sq.name();
  f.name = sq.name().empty() ? "layernorm" : common_prefix({sq.name()}) + ".layernorm";
  f.attrs["eps"] = msq->eps;  // as LayerNormalization's epsilon attribute reads: the float32's value
  f.attrs["bias"] = bias.has_value();
  f.weights.emplace_back("weight", WeightRef{other_operand(g.node(*mul), g.node(*div).output(0))});
  if (bias) f.weights.emplace_back("bias", WeightRef{other_operand(g.node(*bias), g.node(*mul).output(0))});
  return f;
}

// RMSNorm as Hugging Face writes it (LlamaRMSNorm; anchored at the Sqrt):
//   x * (1 / Sqrt(ReduceMean(Pow(x, 2)) + eps)) [-> Cast] * w
// or x / Sqrt(...), or Reciprocal; w an initializer of the last axis's size.
std::optional<Fusion> match_rmsnorm(const Graph& g, int sqrt) {
  const auto& sq = g.node(sqrt);
  const auto msq = mean_square_under(g, sqrt);
  if (!msq) return std::nullopt;
  const int add_eps = msq->add_eps, ms = msq->mean, pow = msq->pow;
  const std::string x = msq->d;
  if (int p = g.producer_of(x); p >= 0 && g.node(p).op_type() == "Sub") return std::nullopt;  // a LayerNorm
  const auto xs = g.shape(x);
  if (!xs || xs->size() < 2 || xs->back() <= 0) return std::nullopt;
  const std::vector<int64_t> last{static_cast<int64_t>(xs->size()) - 1};
  if (reduce_axes(g, g.node(ms), xs->size()) != last || attr_int(g.node(ms), "keepdims", 1) != 1) return std::nullopt;
  std::vector<int> nodes{pow, ms, add_eps, sqrt};
  // x / sqrt(...), or x * (1 / sqrt(...)) (torch.rsqrt exports as Div(1, Sqrt)).
  std::string normed;
  if (const auto div = sole_consumer(g, sq.output(0), "Div"); div && g.node(*div).input_size() == 2) {
    const auto& d = g.node(*div);
    nodes.push_back(*div);
    if (d.input(0) == x && d.input(1) == sq.output(0)) {
      normed = d.output(0);
    } else if (d.input(1) == sq.output(0) && g.scalar(d.input(0)) == std::optional<double>(1.0)) {
      const auto mul = sole_consumer(g, d.output(0), "Mul");
      if (!mul || other_operand(g.node(*mul), d.output(0)) != x) return std::nullopt;
      nodes.push_back(*mul);
      normed = g.node(*mul).output(0);
    } else {
      return std::nullopt;
    }
  } else if (const auto rec = sole_consumer(g, sq.output(0), "Reciprocal")) {
    const auto mul = sole_consumer(g, g.node(*rec).output(0), "Mul");
    if (!mul || other_operand(g.node(*mul), g.node(*rec).output(0)) != x) return std::nullopt;
    nodes.insert(nodes.end(), {*rec, *mul});
    normed = g.node(*mul).output(0);
  } else {
    return std::nullopt;
  }
  if (const auto cast = sole_consumer(g, normed, "Cast")) {  // .to(input_dtype)
    nodes.push_back(*cast);
    normed = g.node(*cast).output(0);
  }
  const auto w = sole_consumer(g, normed, "Mul");
  if (!w) return std::nullopt;
  std::string p = other_operand(g.node(*w), normed);
  double offset = 0;
  if (const auto ow = p.empty() || g.is_init(p) ? std::nullopt : g.offset_weight(p)) {  // Gemma: x (1 + w)
    nodes.push_back(g.producer_of(p));
    std::tie(p, offset) = *ow;
  }
  const auto ps = !p.empty() && g.is_init(p) ? g.shape(p) : std::nullopt;
  if (!ps || *ps != Dims{xs->back()}) return std::nullopt;
  nodes.push_back(*w);
  Fusion f;
  f.kind = "rmsnorm";
  f.x = x;
  f.nodes = nodes;
  f.out = g.node(*w).output(0);
  f.unit_source = sq.name();
  f.name = sq.name().empty() ? "rmsnorm" : common_prefix({sq.name()}) + ".rmsnorm";
  f.attrs["eps"] = msq->eps;
  if (offset != 0) f.attrs["offset"] = offset;
  f.weights.emplace_back("weight", WeightRef{p});
  return f;
}

// nn.GroupNorm(G, C) on x [b, C, ...], as torch exports it (anchored at the
// InstanceNormalization):
//   Reshape(x, [b, G, -1]) -> InstanceNormalization(scale ones [G], bias
//   zeros [G], epsilon) -> Reshape(x's shape) [-> Mul(w) -> Add(b)]
// with w and b the module's [C] parameters, each an initializer [C, 1, ...]
// or an Unsqueeze of one [C]. PyTorch runs it as one op (native_group_norm),
// so it is one groupnorm under both fusions. An InstanceNormalization of
// another form is left to the importer, which plans it as opaque.
std::optional<Fusion> match_groupnorm(const Graph& g, int instance_norm) {
  const auto& in = g.node(instance_norm);
  if (in.input_size() != 3) return std::nullopt;
  const auto ones = g.values(in.input(1)), zeros = g.values(in.input(2));
  if (!ones || !zeros || ones->empty() || ones->size() != zeros->size()) return std::nullopt;
  if (std::any_of(ones->begin(), ones->end(), [](double v) { return v != 1.0; }) ||
      std::any_of(zeros->begin(), zeros->end(), [](double v) { return v != 0.0; }))
    return std::nullopt;
  const auto groups = static_cast<int64_t>(ones->size());
  const int split = g.producer_of(in.input(0));
  if (split < 0 || g.node(split).op_type() != "Reshape" || g.consumers_of(in.input(0)).size() != 1)
    return std::nullopt;
  const std::string x = g.node(split).input(0);
  const auto xs = g.shape(x), grouped = g.shape(in.input(0));
  if (!xs || xs->size() < 2 || !grouped || grouped->size() != 3 || (*grouped)[1] != groups) return std::nullopt;
  for (auto d : *xs)
    if (d <= 0) return std::nullopt;
  const int64_t channels = (*xs)[1];
  if (channels % groups != 0) return std::nullopt;
  const auto merge = sole_consumer(g, in.output(0), "Reshape");
  if (!merge || g.shape(g.node(*merge).output(0)) != xs) return std::nullopt;
  Fusion f;
  f.kind = "groupnorm";
  f.x = x;
  f.nodes = {split, instance_norm, *merge};
  f.attrs["groups"] = groups;
  f.attrs["eps"] = attr_float(in, "epsilon", 1e-5);
  // The affine part: * w, then + b, each [C] broadcast over the positions.
  const auto channel_param = [&](const std::string& t) -> std::optional<std::string> {
    std::string p = t;
    if (const int u = g.producer_of(t); u >= 0 && g.node(u).op_type() == "Unsqueeze") p = g.node(u).input(0);
    const auto ps = g.is_learned(p) ? g.shape(p) : std::nullopt;
    const auto ts = g.shape(t);
    if (!ps || !ts || ps->empty() || (*ps)[0] != channels || numel(*ps) != channels) return std::nullopt;
    if (ts->size() != xs->size() - 1 || (*ts)[0] != channels) return std::nullopt;  // [C, 1, ...]: per channel
    return p;
  };
  const auto affine = [&](const std::string& t, const char* op) -> std::optional<std::pair<int, std::string>> {
    const auto n = sole_consumer(g, t, op);
    if (!n) return std::nullopt;
    const auto p = channel_param(other_operand(g.node(*n), t));
    if (!p) return std::nullopt;
    return std::make_pair(*n, *p);
  };
  // affine=False exports * 1 and + 0 (constants [1, 1, 1]): taken in, as
  // nothing PyTorch runs.
  const auto identity = [&](const std::string& t, const char* op, double v) -> std::optional<int> {
    const auto n = sole_consumer(g, t, op);
    const auto c = n ? g.values(other_operand(g.node(*n), t)) : std::nullopt;
    const auto cs = n ? g.shape(other_operand(g.node(*n), t)) : std::nullopt;
    if (!c || !cs || cs->size() > xs->size() - 1 ||
        std::any_of(c->begin(), c->end(), [v](double e) { return e != v; }))
      return std::nullopt;
    return n;
  };
  const auto mul = affine(g.node(*merge).output(0), "Mul");
  const auto add = mul ? affine(g.node(mul->first).output(0), "Add") : std::nullopt;
  f.attrs["affine"] = add.has_value();
  if (add) {
    f.nodes.push_back(mul->first);
    f.nodes.push_back(add->first);
    f.weights.emplace_back("weight", WeightRef{mul->second});
    f.weights.emplace_back("bias", WeightRef{add->second});
  } else if (const auto one = identity(g.node(*merge).output(0), "Mul", 1.0)) {
    f.nodes.push_back(*one);
    if (const auto zero = identity(g.node(*one).output(0), "Add", 0.0)) f.nodes.push_back(*zero);
  }
  f.out = g.node(f.nodes.back()).output(0);
  f.unit_source = in.name();
  f.name = in.name().empty() ? "groupnorm" : common_prefix({in.name()}) + ".groupnorm";
  return f;
}

}  // namespace

std::vector<Fusion> find_fusions(const Graph& g, dlplan::FusionMode mode, std::map<int, std::string>* unfused) {
  const bool eager = mode == dlplan::FusionMode::eager;
  // From opset 17 torch exports nn.LayerNorm as LayerNormalization, so a
  // LayerNorm written out in such a file is math written in Python (I-BERT's
  // IntLayerNorm in float mode): under eager it is planned op by op, as
  // PyTorch's autograd keeps it, as RMSNorm is. Below 17 it is nn.LayerNorm.
  const bool written_out_layernorm = eager && default_opset(g.m) >= 17;
  std::vector<Fusion> out;
  std::set<int> taken;
  auto take = [&](std::optional<Fusion> f) {
    if (!f) return;
    for (int n : f->nodes)
      if (taken.count(n)) return;
    for (int n : f->nodes) taken.insert(n);
    out.push_back(std::move(*f));
  };
  for (int i = 0; i < g.g.node_size(); ++i) {
    const auto& op = g.node(i).op_type();
    if (op == "Softmax") {
      std::string why;
      auto f = match_attention(g, i, why);
      if (!f) {
        // Left unfused: the MatMuls around it then fail naming this reason.
        if (unfused) (*unfused)[i] = why;
        continue;
      }
      take(std::move(f));
    }
  }
  for (int i = 0; i < g.g.node_size(); ++i) {
    if (taken.count(i)) continue;
    const auto& op = g.node(i).op_type();
    if (op == "Erf") take(match_gelu_erf(g, i, eager));
    else if (op == "Add") take(match_rope(g, i));
    else if (op == "Tanh") {
      auto f = match_gelu_tanh(g, i, eager);
      take(f ? std::move(f) : match_gelu_tanh_bloom(g, i));
    }
    else if (op == "Sigmoid") take(match_silu(g, i));
    else if (op == "HardSigmoid") take(match_hardswish(g, i));
    else if (op == "Softplus") take(match_mish(g, i));
    else if (op == "RandomUniformLike") take(match_drop_path(g, i));
    else if (op == "InstanceNormalization") take(match_groupnorm(g, i));
    else if (op == "LSTM" || op == "GRU" || op == "RNN") {
      std::string why;  // the importer asks again for it when the node is on the data path
      take(match_recurrent(g, i, why));
    }
    else if (op == "Sqrt") {
      auto f = written_out_layernorm ? std::nullopt : match_layernorm(g, i);
      take(f ? std::move(f) : eager ? std::nullopt : match_rmsnorm(g, i));
    }
  }
  return out;
}

}  // namespace dlplan::onnx_import
