// Shape subgraphs evaluated at import. torch.onnx.export writes the shapes
// of views as computations: Shape(x) -> Gather -> Unsqueeze -> Concat ->
// Reshape, Range for positions, ConstantOfShape / Where / Expand / Trilu for masks.
// ONNX's shape inference cannot see through them, so a Reshape's output
// shape stays unknown. Once the importer has bound the inputs' dimensions
// (the micro-batch, the sequence length) every such value is a constant:
// this file computes it, turns the node into a Constant holding it, and runs
// shape inference again, until nothing more folds.
//
// Only values that do not depend on a graph input are folded: integer and
// boolean arithmetic, float tensors built from attributes (masks), and float
// constants torch named "onnx::..." (Gemma's inv_freq, from which RoPE's cos
// and sin are computed: MatMul, Transpose, Cos, Sin). A node reading a float
// initializer named after a module (a parameter or buffer: an embedding
// table, a class token) is left for the importer to plan. A Gather or Slice
// of a stored table too large to read whole (XGLM's positions at 2,048, a
// causal-mask buffer) reads only the elements it takes.
#include "dlplan/error.hpp"
#include "dlplan/ir.hpp"
#include "dlplan/ops.hpp"
#include "import_onnx_graph.hpp"

#include <fmt/format.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <tuple>

namespace dlplan::onnx_import {
namespace {

using TP = onnx::TensorProto;

constexpr int64_t kMaxFoldedElements = int64_t{1} << 20;
// The most elements a stored table may have (a protobuf holds at most 2 GiB).
constexpr int64_t kMaxTableElements = int64_t{1} << 31;

struct Const {
  Dims shape;
  std::vector<double> v;
  int32_t type = TP::INT64;
};

// Elements of a shape; -1 for a negative dimension, and cap + 1 for any
// count beyond cap (a file's dimensions may be anything).
int64_t count(const Dims& d, int64_t cap = kMaxFoldedElements) {
  int64_t n = 1;
  for (auto x : d) {
    if (x < 0) return -1;
    if (x > 0 && n > cap / x) return cap + 1;
    n *= x;
  }
  return n;
}

int64_t normalize_axis(int64_t a, size_t rank) { return a < 0 ? a + static_cast<int64_t>(rank) : a; }

// A stored integer as int64, clamped to +-2^62: torch writes "to the end" as
// INT64_MAX, which a double rounds past the int64 range.
int64_t to_i64(double x) {
  constexpr double kLimit = 4611686018427387904.0;  // 2^62
  if (std::isnan(x)) return 0;
  return static_cast<int64_t>(std::clamp(x, -kLimit, kLimit));
}

std::vector<int64_t> ints_of(const Const* c) {
  std::vector<int64_t> out;
  for (double x : c->v) out.push_back(to_i64(x));
  return out;
}

bool is_integral(int32_t t) {
  return t == TP::INT64 || t == TP::INT32 || t == TP::INT16 || t == TP::INT8 || t == TP::UINT8 || t == TP::BOOL;
}

bool storable(int32_t t) { return is_integral(t) || t == TP::FLOAT || t == TP::DOUBLE; }

// Rounds what an op computed to its element type, as the runtime would store it.
double to_type(double x, int32_t t) {
  if (t == TP::BOOL) return x != 0.0 ? 1.0 : 0.0;
  if (is_integral(t)) return std::trunc(x);
  if (t == TP::FLOAT) return static_cast<double>(static_cast<float>(x));
  return x;
}

std::optional<Dims> broadcast(const std::vector<const Const*>& in) {
  Shape s = in[0]->shape;
  for (size_t k = 1; k < in.size(); ++k) {
    auto b = broadcast_shape(s, in[k]->shape);
    if (!b) return std::nullopt;
    s = *b;
  }
  return Dims(s.begin(), s.end());
}

std::optional<Const> elementwise(const std::vector<const Const*>& in, int32_t type,
                                 const std::function<double(const std::vector<double>&)>& f) {
  const auto shape = broadcast(in);
  if (!shape || count(*shape) > kMaxFoldedElements) return std::nullopt;
  std::vector<std::vector<int64_t>> at;
  for (const Const* c : in) at.push_back(broadcast_offsets(*shape, c->shape));
  Const out{*shape, {}, type};
  std::vector<double> args(in.size());
  for (size_t i = 0; i < static_cast<size_t>(count(*shape)); ++i) {
    for (size_t k = 0; k < in.size(); ++k) args[k] = in[k]->v[static_cast<size_t>(at[k][i])];
    out.v.push_back(to_type(f(args), type));
  }
  return out;
}

// Axes from the attribute (older opsets) or the input `input` (newer ones).
std::optional<std::vector<int64_t>> axes_of(const onnx::NodeProto& n, const std::vector<const Const*>& in, size_t input) {
  if (in.size() > input && in[input]) return ints_of(in[input]);
  if (attr(n, "axes")) return attr_ints(n, "axes");
  return std::nullopt;
}


// Where the elements of a Slice or Gather come from: the output's shape and,
// for each output element in order, its flat position in the input. The
// positions are computed from the input's shape alone, so that a table too
// large to read whole gives only the elements taken (Folder::read_part).
struct Picks {
  Dims shape;
  std::vector<int64_t> at;
};

// The values `p` picks from x.
Const picked(const Const& x, const Picks& p) {
  Const out{p.shape, {}, x.type};
  out.v.reserve(p.at.size());
  for (int64_t at : p.at) out.v.push_back(x.v[static_cast<size_t>(at)]);
  return out;
}

// ONNX Slice of an input of shape x: starts, ends, axes and steps from the
// inputs in[1..4] (opset 10 on) or the attributes (before).
std::optional<Picks> slice_picks(const onnx::NodeProto& n, const Dims& x, const std::vector<const Const*>& in) {
  const size_t rank = x.size();
  std::vector<int64_t> starts, ends, axes, steps;
  if (in.size() >= 3) {
    if (!in[1] || !in[2]) return std::nullopt;
    starts = ints_of(in[1]);
    ends = ints_of(in[2]);
    if (in.size() > 3 && in[3]) axes = ints_of(in[3]);
    if (in.size() > 4 && in[4]) steps = ints_of(in[4]);
  } else {
    starts = attr_ints(n, "starts");
    ends = attr_ints(n, "ends");
    axes = attr_ints(n, "axes");
  }
  if (axes.empty())
    for (size_t k = 0; k < starts.size(); ++k) axes.push_back(static_cast<int64_t>(k));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size()) return std::nullopt;
  std::vector<int64_t> begin(rank, 0), step(rank, 1);
  Dims shape = x;
  for (size_t k = 0; k < starts.size(); ++k) {  // ONNX Slice's clamping rules
    const int64_t a = normalize_axis(axes[k], rank);
    if (a < 0 || a >= static_cast<int64_t>(rank) || steps[k] == 0) return std::nullopt;
    const int64_t dim = x[static_cast<size_t>(a)], st = steps[k];
    if (dim == 0) continue;  // an empty axis stays empty
    int64_t s = starts[k] < 0 ? starts[k] + dim : starts[k];
    int64_t e = ends[k] < 0 ? ends[k] + dim : ends[k];
    if (st > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
    } else {
      s = std::clamp<int64_t>(s, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
    }
    const int64_t len = st > 0 ? (e - s + st - 1) / st : (s - e + (-st) - 1) / (-st);
    shape[static_cast<size_t>(a)] = std::max<int64_t>(len, 0);
    begin[static_cast<size_t>(a)] = s;
    step[static_cast<size_t>(a)] = st;
  }
  if (count(shape) < 0 || count(shape) > kMaxFoldedElements) return std::nullopt;
  Picks out{shape, {}};
  if (count(shape) == 0) return out;
  std::vector<int64_t> in_stride(rank, 1);
  for (size_t k = rank; k-- > 1;) in_stride[k - 1] = in_stride[k] * x[k];
  std::vector<int64_t> index(rank, 0);
  for (int64_t i = 0; i < count(shape); ++i) {
    int64_t at = 0;
    for (size_t k = 0; k < rank; ++k) at += (begin[k] + index[k] * step[k]) * in_stride[k];
    out.at.push_back(at);
    for (size_t k = rank; k-- > 0;) {
      if (++index[k] < shape[k]) break;
      index[k] = 0;
    }
  }
  return out;
}

// ONNX Gather along its axis of an input of shape x, at the indices idx.
std::optional<Picks> gather_picks(const onnx::NodeProto& n, const Dims& x, const Const& idx) {
  const size_t rank = x.size();
  if (rank == 0) return std::nullopt;
  const int64_t axis = normalize_axis(attr_int(n, "axis", 0), rank);
  if (axis < 0 || axis >= static_cast<int64_t>(rank)) return std::nullopt;
  const int64_t dim = x[static_cast<size_t>(axis)];
  Dims shape(x.begin(), x.begin() + axis);
  shape.insert(shape.end(), idx.shape.begin(), idx.shape.end());
  shape.insert(shape.end(), x.begin() + axis + 1, x.end());
  if (count(shape) < 0 || count(shape) > kMaxFoldedElements) return std::nullopt;
  const int64_t outer = count(Dims(x.begin(), x.begin() + axis));
  const int64_t inner = count(Dims(x.begin() + axis + 1, x.end()));
  Picks out{shape, {}};
  for (int64_t o = 0; o < outer; ++o)
    for (double iv : idx.v) {
      int64_t i = to_i64(iv);
      if (i < 0) i += dim;
      if (i < 0 || i >= dim) return std::nullopt;
      for (int64_t r = 0; r < inner; ++r) out.at.push_back((o * dim + i) * inner + r);
    }
  return out;
}

// out[i] = x[i with its axis coordinate replaced by idx[i]]; out has idx's
// shape, which is no larger than x's on any other axis (ONNX GatherElements:
// torch.gather, GPT-J's sin/cos rows picked by position).
std::optional<Const> gather_elements(const onnx::NodeProto& n, const Const& x, const Const& idx) {
  const size_t rank = x.shape.size();
  if (rank == 0 || idx.shape.size() != rank || static_cast<int64_t>(idx.v.size()) != count(idx.shape)) return std::nullopt;
  const int64_t axis = normalize_axis(attr_int(n, "axis", 0), rank);
  if (axis < 0 || axis >= static_cast<int64_t>(rank)) return std::nullopt;
  for (size_t d = 0; d < rank; ++d)
    if (idx.shape[d] < 0 || (static_cast<int64_t>(d) != axis && idx.shape[d] > x.shape[d])) return std::nullopt;
  Const out{idx.shape, std::vector<double>(idx.v.size()), x.type};
  for (int64_t e = 0, total = count(idx.shape); e < total; ++e) {
    int64_t rest = e, at = 0, stride = 1;
    for (size_t d = rank; d-- > 0;) {
      int64_t c = rest % idx.shape[d];
      rest /= idx.shape[d];
      if (static_cast<int64_t>(d) == axis) {
        c = to_i64(idx.v[static_cast<size_t>(e)]);
        if (c < 0) c += x.shape[d];
        if (c < 0 || c >= x.shape[d]) return std::nullopt;
      }
      at += c * stride;
      stride *= x.shape[d];
    }
    out.v[static_cast<size_t>(e)] = x.v[static_cast<size_t>(at)];
  }
  return out;
}

// Split's parts along its axis, as `sizes` says (the input "split", opset
// 13+; the attribute before), else equal parts, one per output.
std::optional<std::vector<Const>> split(const onnx::NodeProto& n, const Const& x, const Const* sizes) {
  const size_t rank = x.shape.size();
  if (rank == 0 || n.output_size() < 1) return std::nullopt;
  const int64_t axis = normalize_axis(attr_int(n, "axis", 0), rank);
  if (axis < 0 || axis >= static_cast<int64_t>(rank)) return std::nullopt;
  const int64_t dim = x.shape[static_cast<size_t>(axis)];
  std::vector<int64_t> parts;
  if (sizes) parts = ints_of(sizes);
  else
    for (const auto& a : n.attribute())
      if (a.name() == "split") parts.assign(a.ints().begin(), a.ints().end());
  if (parts.empty()) {
    if (dim % n.output_size() != 0) return std::nullopt;
    parts.assign(static_cast<size_t>(n.output_size()), dim / n.output_size());
  }
  if (static_cast<int>(parts.size()) != n.output_size() ||
      std::accumulate(parts.begin(), parts.end(), int64_t{0}) != dim ||
      std::any_of(parts.begin(), parts.end(), [](int64_t p) { return p < 0; }))
    return std::nullopt;
  const int64_t outer = count(Dims(x.shape.begin(), x.shape.begin() + axis));
  const int64_t inner = count(Dims(x.shape.begin() + axis + 1, x.shape.end()));
  std::vector<Const> out;
  int64_t first = 0;
  for (int64_t part : parts) {
    Const c{x.shape, {}, x.type};
    c.shape[static_cast<size_t>(axis)] = part;
    for (int64_t o = 0; o < outer; ++o) {
      const auto from = x.v.begin() + (o * dim + first) * inner;
      c.v.insert(c.v.end(), from, from + part * inner);
    }
    out.push_back(std::move(c));
    first += part;
  }
  return out;
}

std::optional<Const> concat(const onnx::NodeProto& n, const std::vector<const Const*>& in) {
  const size_t rank = in[0]->shape.size();
  const int64_t axis = normalize_axis(attr_int(n, "axis", 0), rank);
  if (axis < 0 || axis >= static_cast<int64_t>(rank)) return std::nullopt;
  Dims shape = in[0]->shape;
  shape[static_cast<size_t>(axis)] = 0;
  for (const Const* c : in) {
    if (c->shape.size() != rank) return std::nullopt;
    for (size_t d = 0; d < rank; ++d)
      if (static_cast<int64_t>(d) != axis && c->shape[d] != in[0]->shape[d]) return std::nullopt;
    shape[static_cast<size_t>(axis)] += c->shape[static_cast<size_t>(axis)];
  }
  if (count(shape) > kMaxFoldedElements) return std::nullopt;
  const int64_t outer = count(Dims(shape.begin(), shape.begin() + axis));
  Const out{shape, {}, in[0]->type};
  for (int64_t o = 0; o < outer; ++o)
    for (const Const* c : in) {
      const int64_t run = count(Dims(c->shape.begin() + axis, c->shape.end()));
      out.v.insert(out.v.end(), c->v.begin() + o * run, c->v.begin() + (o + 1) * run);
    }
  return out;
}

// ReduceSum over the axes of the input `axes` (opset 13 on) or the
// attribute (before): XLM's lengths, the count of the tokens that are not
// padding. No axes sums every axis, unless noop_with_empty_axes says to
// pass the input through.
std::optional<Const> reduce_sum(const onnx::NodeProto& n, const std::vector<const Const*>& in) {
  const Const& x = *in[0];
  const size_t rank = x.shape.size();
  if (static_cast<int64_t>(x.v.size()) != count(x.shape)) return std::nullopt;
  std::vector<int64_t> axes;
  if (in.size() > 1 && in[1]) axes = ints_of(in[1]);  // (Folder::pass evaluates only known inputs)
  else axes = attr_ints(n, "axes");
  if (axes.empty() && attr_int(n, "noop_with_empty_axes", 0) != 0) return x;
  std::vector<bool> reduced(rank, axes.empty());
  for (int64_t a : axes) {
    const int64_t k = normalize_axis(a, rank);
    if (k < 0 || k >= static_cast<int64_t>(rank)) return std::nullopt;
    reduced[static_cast<size_t>(k)] = true;
  }
  const bool keep = attr_int(n, "keepdims", 1) != 0;
  Dims kept_shape, out_shape;  // the output with reduced axes as 1, and as written
  for (size_t d = 0; d < rank; ++d) {
    kept_shape.push_back(reduced[d] ? 1 : x.shape[d]);
    if (!reduced[d] || keep) out_shape.push_back(kept_shape.back());
  }
  Const out{out_shape, std::vector<double>(static_cast<size_t>(count(kept_shape)), 0.0), x.type};
  std::vector<int64_t> index(rank, 0);
  for (double v : x.v) {
    int64_t at = 0;
    for (size_t d = 0; d < rank; ++d) at = at * kept_shape[d] + (reduced[d] ? 0 : index[d]);
    out.v[static_cast<size_t>(at)] += v;
    for (size_t d = rank; d-- > 0;) {
      if (++index[d] < x.shape[d]) break;
      index[d] = 0;
    }
  }
  for (double& v : out.v) v = to_type(v, x.type);
  return out;
}

// The value of one node whose inputs are all known; nothing when the op is
// not one folded here or its inputs do not fit it.
std::optional<Const> evaluate(const onnx::NodeProto& n, const std::vector<const Const*>& in) {
  const auto& op = n.op_type();
  auto binary = [&](std::function<double(double, double)> f, int32_t type) {
    return elementwise(in, type, [&](const std::vector<double>& a) { return f(a[0], a[1]); });
  };
  auto unary = [&](std::function<double(double)> f) {
    return elementwise(in, in[0]->type, [&](const std::vector<double>& a) { return f(a[0]); });
  };
  // The inputs each op reads (the rest optional); a fuzzed file may hold fewer.
  static const std::map<std::string, size_t> kArity = {
      {"Identity", 1}, {"Cast", 1}, {"Unsqueeze", 1}, {"Squeeze", 1}, {"Concat", 1}, {"Gather", 2}, {"Slice", 1},
      {"Reshape", 2}, {"Range", 3}, {"ConstantOfShape", 1}, {"Expand", 2}, {"Where", 3}, {"Not", 1}, {"Neg", 1},
      {"Abs", 1}, {"Floor", 1}, {"Ceil", 1}, {"Sqrt", 1}, {"Trilu", 1}, {"Tile", 2}, {"Cos", 1}, {"Sin", 1}, {"Log", 1},
      {"Transpose", 1}, {"MatMul", 2}, {"CumSum", 2}, {"ScatterND", 3}, {"GatherElements", 2}, {"ReduceSum", 1},
      {"Clip", 1}};
  const auto arity = kArity.find(op);
  const size_t needed = arity != kArity.end() ? arity->second : 2;  // the binary ops
  if (in.size() < needed || (arity == kArity.end() && in.size() != 2)) return std::nullopt;
  const size_t present = op == "Concat" ? in.size() : needed;
  for (size_t k = 0; k < present; ++k)
    if (!in[k]) return std::nullopt;
  if (op == "Range" && (in[0]->v.size() != 1 || in[1]->v.size() != 1 || in[2]->v.size() != 1)) return std::nullopt;
  const int32_t t0 = in[0]->type;
  const bool integral = is_integral(t0);
  if (op == "Identity") return *in[0];
  if (op == "Cast") {
    const auto to = static_cast<int32_t>(attr_int(n, "to", TP::FLOAT));
    if (!storable(to)) return std::nullopt;
    Const c = *in[0];
    c.type = to;
    for (auto& x : c.v) x = to_type(x, to);
    return c;
  }
  if (op == "Unsqueeze" || op == "Squeeze") {
    Const c = *in[0];
    auto axes = axes_of(n, in, 1);
    if (op == "Unsqueeze") {
      if (!axes) return std::nullopt;
      const size_t rank = c.shape.size() + axes->size();
      for (auto& a : *axes) a = normalize_axis(a, rank);
      std::sort(axes->begin(), axes->end());
      for (auto a : *axes) {
        if (a < 0 || a > static_cast<int64_t>(c.shape.size())) return std::nullopt;
        c.shape.insert(c.shape.begin() + a, 1);
      }
      return c;
    }
    Dims kept;
    for (size_t k = 0; k < c.shape.size(); ++k) {
      const bool named = axes ? std::count_if(axes->begin(), axes->end(), [&](int64_t a) {
                                  return normalize_axis(a, c.shape.size()) == static_cast<int64_t>(k);
                                }) > 0
                              : c.shape[k] == 1;
      if (!named) kept.push_back(c.shape[k]);
    }
    c.shape = kept;
    return c;
  }
  if (op == "Concat") return concat(n, in);
  if (op == "Gather") {
    const auto p = gather_picks(n, in[0]->shape, *in[1]);
    if (!p) return std::nullopt;
    return picked(*in[0], *p);
  }
  if (op == "GatherElements") return gather_elements(n, *in[0], *in[1]);
  if (op == "Slice") {
    const auto p = slice_picks(n, in[0]->shape, in);
    if (!p) return std::nullopt;
    return picked(*in[0], *p);
  }
  if (op == "Reshape") {
    Const c = *in[0];
    Dims shape = ints_of(in[1]);
    int64_t known = 1, infer = -1;
    for (size_t k = 0; k < shape.size(); ++k) {
      if (shape[k] == 0 && attr_int(n, "allowzero", 0) == 0) shape[k] = k < c.shape.size() ? c.shape[k] : 0;
      if (shape[k] == -1) {
        if (infer >= 0) return std::nullopt;
        infer = static_cast<int64_t>(k);
      } else if (shape[k] < 0 || (shape[k] > 0 && known > kMaxFoldedElements / shape[k])) {
        return std::nullopt;  // not a shape, or more elements than the data has
      } else {
        known *= shape[k];
      }
    }
    if (infer >= 0 && known > 0) shape[static_cast<size_t>(infer)] = count(c.shape) / known;
    if (count(shape) != count(c.shape)) return std::nullopt;
    c.shape = shape;
    return c;
  }
  if (op == "Range") {
    const double start = in[0]->v.at(0), limit = in[1]->v.at(0), delta = in[2]->v.at(0);
    const double steps = std::ceil((limit - start) / delta);
    if (delta == 0 || !std::isfinite(steps) || steps > static_cast<double>(kMaxFoldedElements)) return std::nullopt;
    const auto len = static_cast<int64_t>(std::max(steps, 0.0));
    Const c{{len}, {}, t0};
    for (int64_t i = 0; i < len; ++i) c.v.push_back(to_type(start + static_cast<double>(i) * delta, t0));
    return c;
  }
  if (op == "ConstantOfShape") {
    const Dims shape = ints_of(in[0]);
    if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0 || d > kMaxFoldedElements; }) ||
        count(shape) > kMaxFoldedElements)
      return std::nullopt;
    Const c{shape, {}, TP::FLOAT};
    double fill = 0;
    if (const auto* a = attr(n, "value")) {
      c.type = a->t().data_type();
      const auto v = tensor_values(a->t());
      if (!v || v->size() != 1 || !storable(c.type)) return std::nullopt;
      fill = (*v)[0];
    }
    c.v.assign(static_cast<size_t>(count(shape)), fill);
    return c;
  }
  if (op == "Trilu") {  // torch.triu / tril of a mask: keep j - i >= k (upper) or j - i <= k (lower)
    const Const& x = *in[0];
    if (x.shape.size() < 2) return std::nullopt;
    double k = 0;
    if (in.size() > 1 && in[1]) {
      if (in[1]->v.size() != 1 || !std::isfinite(in[1]->v[0])) return std::nullopt;
      k = in[1]->v[0];
    }
    const bool upper = attr_int(n, "upper", 1) != 0;
    const int64_t rows = x.shape[x.shape.size() - 2], cols = x.shape.back();
    if (rows <= 0 || cols <= 0) return x;
    Const c = x;
    for (size_t e = 0; e < c.v.size(); ++e) {
      const auto i = static_cast<double>(static_cast<int64_t>(e) / cols % rows);
      const auto j = static_cast<double>(static_cast<int64_t>(e) % cols);
      const bool keep = upper ? j - i >= k : j - i <= k;
      if (!keep) c.v[e] = 0;
    }
    return c;
  }
  if (op == "Expand") {
    Const target{ints_of(in[1]), {}, TP::INT64};
    for (auto d : target.shape)
      if (d < 0 || d > kMaxFoldedElements) return std::nullopt;
    const std::vector<const Const*> both{in[0], &target};
    const auto shape = broadcast(both);
    if (!shape || count(*shape) > kMaxFoldedElements) return std::nullopt;
    Const c{*shape, {}, in[0]->type};
    for (auto at : broadcast_offsets(*shape, in[0]->shape)) c.v.push_back(in[0]->v[static_cast<size_t>(at)]);
    return c;
  }
  if (op == "Transpose") {  // RoPE's freqs.transpose(1, 2)
    const Dims& from = in[0]->shape;
    const auto rank = static_cast<int64_t>(from.size());
    std::vector<int64_t> perm;
    for (const auto& a : n.attribute())
      if (a.name() == "perm") perm.assign(a.ints().begin(), a.ints().end());
    if (perm.empty())
      for (int64_t k = rank; k-- > 0;) perm.push_back(k);
    if (static_cast<int64_t>(perm.size()) != rank) return std::nullopt;
    std::vector<bool> seen(perm.size(), false);  // a permutation: each axis once (a file may say anything)
    for (int64_t a : perm) {
      if (a < 0 || a >= rank || seen[static_cast<size_t>(a)]) return std::nullopt;
      seen[static_cast<size_t>(a)] = true;
    }
    Dims shape(from.size());
    std::vector<int64_t> stride(from.size(), 1);  // the input's row-major strides
    for (int64_t d = rank - 1; d > 0; --d) stride[static_cast<size_t>(d - 1)] = stride[static_cast<size_t>(d)] * from[static_cast<size_t>(d)];
    for (int64_t d = 0; d < rank; ++d) shape[static_cast<size_t>(d)] = from[static_cast<size_t>(perm[static_cast<size_t>(d)])];
    Const c{shape, std::vector<double>(static_cast<size_t>(count(shape))), in[0]->type};
    for (int64_t i = 0, n_out = count(shape); i < n_out; ++i) {
      int64_t rest = i, at = 0;
      for (int64_t d = rank; d-- > 0;) {
        const int64_t idx = rest % shape[static_cast<size_t>(d)];
        rest /= shape[static_cast<size_t>(d)];
        at += idx * stride[static_cast<size_t>(perm[static_cast<size_t>(d)])];
      }
      c.v[static_cast<size_t>(i)] = in[0]->v[static_cast<size_t>(at)];
    }
    return c;
  }
  if (op == "MatMul") {  // [.., M, K] x [.., K, N], equal leading dims (RoPE's inv_freq x positions)
    const Dims &a = in[0]->shape, &b = in[1]->shape;
    if (a.size() < 2 || a.size() != b.size() || a[a.size() - 1] != b[b.size() - 2]) return std::nullopt;
    if (!std::equal(a.begin(), a.end() - 2, b.begin())) return std::nullopt;
    const int64_t M = a[a.size() - 2], K = a.back(), N = b.back();
    Dims shape(a.begin(), a.end() - 1);
    shape.push_back(N);
    if (count(shape) > kMaxFoldedElements || count(a) > kMaxFoldedElements || count(b) > kMaxFoldedElements)
      return std::nullopt;
    const int64_t batches = count(shape) / std::max<int64_t>(M * N, 1);
    Const c{shape, std::vector<double>(static_cast<size_t>(count(shape)), 0.0), in[0]->type};
    for (int64_t r = 0; r < batches; ++r)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double sum = 0;
          for (int64_t k = 0; k < K; ++k)
            sum += in[0]->v[static_cast<size_t>((r * M + i) * K + k)] * in[1]->v[static_cast<size_t>((r * K + k) * N + j)];
          c.v[static_cast<size_t>((r * M + i) * N + j)] = to_type(sum, in[0]->type);
        }
    return c;
  }
  if (op == "Tile") {  // tensor.repeat: axis d repeated repeats[d] times (Gemma's causal mask, per batch)
    const auto reps = ints_of(in[1]);
    const Dims& from = in[0]->shape;
    if (reps.size() != from.size()) return std::nullopt;
    Dims shape = from;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (reps[d] < 0 || (reps[d] > 0 && shape[d] > kMaxFoldedElements / reps[d])) return std::nullopt;
      shape[d] *= reps[d];
    }
    if (count(shape) > kMaxFoldedElements) return std::nullopt;
    Const c{shape, {}, in[0]->type};
    c.v.resize(static_cast<size_t>(count(shape)));
    for (int64_t i = 0, n_out = count(shape); i < n_out; ++i) {
      int64_t rest = i, at = 0, stride = 1;  // the source element: each index modulo the input's extent
      for (size_t d = shape.size(); d-- > 0;) {
        const int64_t idx = rest % shape[d];
        rest /= shape[d];
        at += (idx % from[d]) * stride;
        stride *= from[d];
      }
      c.v[static_cast<size_t>(i)] = in[0]->v[static_cast<size_t>(at)];
    }
    return c;
  }
  if (op == "ScatterND") {  // x[a:b, c:d] = v (Swin's shifted-window mask, region by region)
    // indices [..., k]: each row names a slice data[i_0, ..., i_k-1] of the
    // data's trailing shape, which the matching block of updates replaces.
    const Dims& ds = in[0]->shape;
    const Dims& is = in[1]->shape;
    if (attr_text(n, "reduction", "none") != "none" || is.empty() || is.back() < 1 ||
        is.back() > static_cast<int64_t>(ds.size()) || static_cast<int64_t>(in[0]->v.size()) != count(ds) ||
        static_cast<int64_t>(in[1]->v.size()) != count(is))
      return std::nullopt;
    const auto k = static_cast<size_t>(is.back());
    int64_t block = 1;
    for (size_t d = k; d < ds.size(); ++d) block *= ds[d];
    const int64_t rows = count(is) / static_cast<int64_t>(k);
    if (static_cast<int64_t>(in[2]->v.size()) != rows * block) return std::nullopt;
    Const c = *in[0];
    for (int64_t r = 0; r < rows; ++r) {
      int64_t at = 0;
      for (size_t d = 0; d < k; ++d) {
        auto i = static_cast<int64_t>(in[1]->v[static_cast<size_t>(r) * k + d]);
        if (i < 0) i += ds[d];
        if (i < 0 || i >= ds[d]) return std::nullopt;
        at = at * ds[d] + i;
      }
      for (int64_t e = 0; e < block; ++e)
        c.v[static_cast<size_t>(at * block + e)] = to_type(in[2]->v[static_cast<size_t>(r * block + e)], t0);
    }
    return c;
  }
  if (op == "ReduceSum") return reduce_sum(n, in);
  if (op == "CumSum") {  // torch.cumsum along one axis (OPT's positions from its attention mask)
    const auto ax = ints_of(in[1]);
    const Dims& s = in[0]->shape;
    const auto rank = static_cast<int64_t>(s.size());
    if (ax.size() != 1 || rank == 0 || static_cast<int64_t>(in[0]->v.size()) != count(s)) return std::nullopt;
    const int64_t axis = ax[0] < 0 ? ax[0] + rank : ax[0];
    if (axis < 0 || axis >= rank) return std::nullopt;
    const bool exclusive = attr_int(n, "exclusive", 0) != 0, reverse = attr_int(n, "reverse", 0) != 0;
    int64_t inner = 1;
    for (auto d = static_cast<size_t>(axis) + 1; d < s.size(); ++d) inner *= s[d];
    const int64_t len = s[static_cast<size_t>(axis)];
    if (len <= 0 || inner <= 0) return std::nullopt;
    const int64_t outer = count(s) / (len * inner);
    Const c = *in[0];
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        double sum = 0;
        for (int64_t k = 0; k < len; ++k) {
          const auto at = static_cast<size_t>((o * len + (reverse ? len - 1 - k : k)) * inner + i);
          const double x = in[0]->v[at];
          if (!exclusive) sum += x;
          c.v[at] = to_type(sum, t0);
          if (exclusive) sum += x;
        }
      }
    return c;
  }
  if (op == "Add") return binary([](double a, double b) { return a + b; }, t0);
  if (op == "Sub") return binary([](double a, double b) { return a - b; }, t0);
  if (op == "Mul") return binary([](double a, double b) { return a * b; }, t0);
  if (op == "Div") {
    for (double b : in[1]->v)
      if (integral && b == 0) return std::nullopt;
    return binary([](double a, double b) { return a / b; }, t0);  // integers truncate (to_type)
  }
  if (op == "Mod") {
    const bool fmod = attr_int(n, "fmod", 0) != 0;
    for (double b : in[1]->v)
      if (b == 0) return std::nullopt;
    return binary([fmod](double a, double b) { return fmod ? std::fmod(a, b) : a - std::floor(a / b) * b; }, t0);
  }
  if (op == "Pow") return binary([](double a, double b) { return std::pow(a, b); }, t0);
  if (op == "Clip") {  // min and max optional, scalars (ProphetNet's positions clamped to its table)
    double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
    for (size_t k = 1; k < 3 && k < in.size(); ++k) {
      if (!in[k]) continue;
      if (in[k]->v.size() != 1) return std::nullopt;
      (k == 1 ? lo : hi) = in[k]->v[0];
    }
    return elementwise({in[0]}, in[0]->type, [lo, hi](const std::vector<double>& a) {
      return std::min(std::max(a[0], lo), hi);
    });
  }
  if (op == "Max") return binary([](double a, double b) { return std::max(a, b); }, t0);
  if (op == "Min") return binary([](double a, double b) { return std::min(a, b); }, t0);
  if (op == "Equal") return binary([](double a, double b) { return a == b ? 1.0 : 0.0; }, TP::BOOL);
  if (op == "Less") return binary([](double a, double b) { return a < b ? 1.0 : 0.0; }, TP::BOOL);
  if (op == "Greater") return binary([](double a, double b) { return a > b ? 1.0 : 0.0; }, TP::BOOL);
  if (op == "LessOrEqual") return binary([](double a, double b) { return a <= b ? 1.0 : 0.0; }, TP::BOOL);
  if (op == "GreaterOrEqual") return binary([](double a, double b) { return a >= b ? 1.0 : 0.0; }, TP::BOOL);
  if (op == "And") return binary([](double a, double b) { return a != 0 && b != 0 ? 1.0 : 0.0; }, TP::BOOL);
  if (op == "Or") return binary([](double a, double b) { return a != 0 || b != 0 ? 1.0 : 0.0; }, TP::BOOL);
  if (op == "Where")
    return elementwise(in, in[1]->type, [](const std::vector<double>& a) { return a[0] != 0 ? a[1] : a[2]; });
  if (op == "Not") return unary([](double a) { return a != 0 ? 0.0 : 1.0; });
  if (op == "Neg") return unary([](double a) { return -a; });
  if (op == "Abs") return unary([](double a) { return std::fabs(a); });
  if (op == "Floor") return unary([](double a) { return std::floor(a); });
  if (op == "Ceil") return unary([](double a) { return std::ceil(a); });
  if (op == "Sqrt") return unary([](double a) { return std::sqrt(a); });
  if (op == "Cos") return unary([](double a) { return std::cos(a); });
  if (op == "Sin") return unary([](double a) { return std::sin(a); });
  // In float32 for a float tensor, as torch computes it (MPNet's and T5's
  // relative-position buckets truncate a log whose last bit can matter).
  if (op == "Log")
    return unary([float32 = t0 == TP::FLOAT](double a) {
      return float32 ? static_cast<double>(std::log(static_cast<float>(a))) : std::log(a);
    });
  return std::nullopt;
}

onnx::TensorProto to_tensor(const Const& c) {
  onnx::TensorProto t;
  t.set_data_type(c.type);
  for (auto d : c.shape) t.add_dims(d);
  for (double x : c.v) {
    if (c.type == TP::INT64) t.add_int64_data(to_i64(x));
    else if (c.type == TP::FLOAT) t.add_float_data(static_cast<float>(x));
    else if (c.type == TP::DOUBLE) t.add_double_data(x);
    else t.add_int32_data(static_cast<int32_t>(std::clamp<int64_t>(to_i64(x), INT32_MIN, INT32_MAX)));  // int32 .. bool
  }
  return t;
}

class Folder {
 public:
  explicit Folder(onnx::ModelProto& model, const std::string& src) : model_(model), src_(src) {}

  // One pass in topological order: returns how many nodes became Constants.
  int pass() {
    Graph g(model_, src_);
    g.index();
    known_.clear();
    int folded = 0;
    auto* nodes = model_.mutable_graph()->mutable_node();
    std::vector<std::pair<int, std::vector<onnx::NodeProto>>> inserts;
    for (int i = 0; i < nodes->size(); ++i) {
      auto& n = *nodes->Mutable(i);
      if (n.op_type() == "Split" && (n.domain().empty() || n.domain() == "ai.onnx")) {
        if (auto more = fold_split(g, n)) {
          inserts.emplace_back(i, std::move(*more));
          ++folded;
        }
        continue;
      }
      if (n.op_type() == "Constant" || n.output_size() != 1 || !(n.domain().empty() || n.domain() == "ai.onnx"))
        continue;
      if (n.op_type() == "Gather" || n.op_type() == "GatherElements") check_indices(g, n);
      if (n.op_type() == "Expand") check_expand(g, n);
      std::optional<Const> value;
      if (n.op_type() == "Shape" || n.op_type() == "Size") {
        value = shape_of(g, n);
      } else if (auto none = no_padding(g, n)) {
        value = std::move(none);
      } else {
        std::vector<const Const*> in;
        bool all = n.input_size() > 0;
        for (const auto& t : n.input()) {
          if (t.empty()) {
            in.push_back(nullptr);
            continue;
          }
          const Const* c = lookup(g, t);
          if (!c) all = false;
          in.push_back(c);
        }
        // Optional inputs may be absent, the data ones may not.
        if (all && in[0] && std::none_of(in.begin(), in.end(), [](const Const* c) {
              return c && c->type == -1;  // a parameter: left to the importer
            }))
          value = evaluate(n, in);
        else if (!in.empty() && !in[0])
          value = read_part(g, n, in);
      }
      if (!value || count(value->shape) > kMaxFoldedElements || !storable(value->type)) continue;
      if (static_cast<int64_t>(value->v.size()) != count(value->shape)) continue;
      make_constant(n, std::move(*value));
      ++folded;
    }
    // The further parts of folded Splits, each right after its node (from
    // the last, so that the earlier positions hold), after the walk: the
    // Graph indexed above names nodes by position.
    for (auto it = inserts.rbegin(); it != inserts.rend(); ++it)
      for (size_t k = 0; k < it->second.size(); ++k) {
        *nodes->Add() = std::move(it->second[k]);
        for (int at = nodes->size() - 1; at > it->first + 1 + static_cast<int>(k); --at) nodes->SwapElements(at, at - 1);
      }
    return folded;
  }

 private:
  // A Gather of known indices reading past its table's axis: PyTorch would
  // raise an index error on this input, so the import stops here with the
  // node named (a position table read past its end: a --seq-len longer than
  // the positions the model was made with), before it would stop later at a
  // node with no shape.
  void check_indices(const Graph& g, const onnx::NodeProto& n) {
    if (n.input_size() != 2) return;
    const Const* idx = lookup(g, n.input(1));
    if (!idx || idx->type == -1 || !is_integral(idx->type)) return;
    auto shape = g.shape(n.input(0));
    if (const auto k = known_.find(n.input(0)); k != known_.end()) shape = k->second.shape;
    if (!shape || shape->empty()) return;
    const int64_t axis = normalize_axis(attr_int(n, "axis", 0), shape->size());
    if (axis < 0 || axis >= static_cast<int64_t>(shape->size())) return;
    const int64_t dim = (*shape)[static_cast<size_t>(axis)];
    if (dim <= 0) return;
    for (double v : idx->v)
      if (to_i64(v) < -dim || to_i64(v) >= dim)
        throw Error(fmt::format("{}: node '{}' ({}): index {} is outside axis {} of '{}', which has {}; a --seq-len "
                                "longer than the positions the model was made with?",
                                src_, n.name(), n.op_type(), to_i64(v), axis, n.input(0), dim));
  }

  // An Expand of a known tensor to a known shape it cannot broadcast to
  // (ONNX's rule: each axis equal, or 1 in one of them): PyTorch's expand
  // would raise here. BERT's token_type_ids are a buffer of the positions the
  // model was made with, sliced to the sequence and expanded to [b, T]; a
  // longer --seq-len leaves the slice short (Slice clamps), and the import
  // stopped later, at the Gather that read it, with "indices ... could not
  // evaluate". Now it stops here, naming the node and both shapes.
  void check_expand(const Graph& g, const onnx::NodeProto& n) {
    if (n.input_size() != 2) return;
    const Const* x = lookup(g, n.input(0));
    const Const* target = lookup(g, n.input(1));
    if (!x || !target || x->type == -1 || target->type == -1 || !is_integral(target->type)) return;
    const Const shape{ints_of(target), {}, TP::INT64};
    if (std::any_of(shape.shape.begin(), shape.shape.end(), [](int64_t d) { return d < 0; })) return;
    if (broadcast({x, &shape})) return;
    throw Error(fmt::format("{}: node '{}' (Expand): cannot expand '{}' of shape [{}] to [{}]; a --seq-len longer "
                            "than the positions the model was made with?",
                            src_, n.name(), n.input(0), fmt::join(x->shape, ", "), fmt::join(shape.shape, ", ")));
  }

  void make_constant(onnx::NodeProto& n, Const value) {
    n.clear_input();
    n.clear_attribute();
    n.set_op_type("Constant");
    auto* a = n.add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    *a->mutable_t() = to_tensor(value);
    known_[n.output(0)] = std::move(value);
  }

  // A Split of a known value (GPT-J's sin and cos, from one table): `n`
  // becomes the first part's Constant; the Constants of the further parts
  // are returned, to go right after it (the order stays topological).
  std::optional<std::vector<onnx::NodeProto>> fold_split(const Graph& g, onnx::NodeProto& n) {
    if (n.input_size() < 1 || n.output_size() < 1) return std::nullopt;
    const Const* x = lookup(g, n.input(0));
    const bool sized = n.input_size() > 1 && !n.input(1).empty();
    const Const* sizes = sized ? lookup(g, n.input(1)) : nullptr;
    if (!x || x->type == -1 || (sized && !sizes) || !storable(x->type)) return std::nullopt;
    auto parts = split(n, *x, sizes);
    if (!parts) return std::nullopt;
    for (const Const& p : *parts)
      if (count(p.shape) > kMaxFoldedElements) return std::nullopt;
    std::vector<onnx::NodeProto> more;
    for (int k = 1; k < n.output_size(); ++k) {
      onnx::NodeProto c;
      c.set_name(fmt::format("{}/part{}", n.name(), k));
      c.add_output(n.output(k));
      make_constant(c, std::move((*parts)[static_cast<size_t>(k)]));
      more.push_back(std::move(c));
    }
    const std::string first = n.output(0);
    n.clear_output();
    n.add_output(first);
    make_constant(n, std::move((*parts)[0]));
    return more;
  }

  std::optional<Const> shape_of(const Graph& g, const onnx::NodeProto& n) const {
    if (n.input_size() < 1) return std::nullopt;
    auto s = g.shape(n.input(0));
    // A constant folded this pass has its exact shape, an empty axis
    // included (Swin's mask regions for a shift of 0); shape inference's 0
    // may mean unknown.
    if (const auto k = known_.find(n.input(0)); k != known_.end()) s = k->second.shape;
    if (s && std::any_of(s->begin(), s->end(), [](int64_t d) { return d == 0; }) && !known_.count(n.input(0)))
      return std::nullopt;
    if (!s || std::any_of(s->begin(), s->end(), [](int64_t d) { return d < 0; })) return std::nullopt;
    if (n.op_type() == "Size") return Const{{}, {static_cast<double>(count(*s))}, TP::INT64};
    const auto rank = static_cast<int64_t>(s->size());
    auto clampdim = [&](int64_t a) { return std::clamp<int64_t>(a < 0 ? a + rank : a, 0, rank); };
    const int64_t start = clampdim(attr_int(n, "start", 0)), end = clampdim(attr_int(n, "end", rank));
    Const c{{std::max<int64_t>(end - start, 0)}, {}, TP::INT64};
    for (int64_t k = start; k < end; ++k) c.v.push_back(static_cast<double>((*s)[static_cast<size_t>(k)]));
    return c;
  }

  // input_ids == pad, where it only feeds the positions RoBERTa computes
  // from the ids (transformers' create_position_ids_from_input_ids:
  // mask = ids.ne(pad); positions = cumsum(mask, 1) * mask + pad): every
  // element false, i.e. the input holds no padding token, so the positions
  // are pad + 1 ... pad + T. A padded batch shifts them, not what the step
  // keeps or computes; the assumption goes to the notes. Any other Equal of
  // the ids (a mask attention reads) is left alone.
  std::optional<Const> no_padding(const Graph& g, const onnx::NodeProto& n) {
    if (n.op_type() != "Equal" || n.input_size() != 2) return std::nullopt;
    for (int side = 0; side < 2; ++side) {
      const std::string& operand = n.input(side);
      const std::string ids = graph_input_through_views(g, operand);
      if (ids.empty() || !is_integral(g.dtype(operand))) continue;
      const auto shape = g.shape(operand);
      const Const* pad = lookup(g, n.input(1 - side));
      if (!shape || count(*shape) <= 0 || !pad || pad->v.size() != 1 || !is_integral(pad->type)) continue;
      const auto& readers = g.consumers_of(n.output(0));
      const bool negated = readers.size() == 1 && g.node(readers[0]).op_type() == "Not";  // ids != pad
      if (!negated) continue;
      if (feeds_cumsum_only_through_not(g, n.output(0)))
        assumptions_.push_back(fmt::format(
            "node '{}': positions computed from '{}' (RoBERTa's, from the tokens that are not padding) assume no "
            "token equals the padding id {}, so they are {} ... {}; a padded batch shifts positions, not memory",
            n.name(), ids, to_i64(pad->v[0]), to_i64(pad->v[0]) + 1, to_i64(pad->v[0]) + shape->back()));
      else
        assumptions_.push_back(fmt::format(
            "node '{}': the mask of the tokens of '{}' that are not {} (a padding mask, as XLM's) assumes no token "
            "equals the padding id {}, so every token is attended to and kept; a padded batch masks some, which "
            "changes their values, not what the step keeps or computes",
            n.name(), ids, to_i64(pad->v[0]), to_i64(pad->v[0])));
      return Const{*shape, std::vector<double>(static_cast<size_t>(count(*shape)), 0.0), TP::BOOL};
    }
    return std::nullopt;
  }

  // The graph input t is, or that t reshapes (Speech2Text2's ids.view(-1, T)
  // before its positions): the same elements. "" for anything else.
  static std::string graph_input_through_views(const Graph& g, std::string t) {
    for (int depth = 0; depth < 4; ++depth) {
      if (std::find(g.inputs.begin(), g.inputs.end(), t) != g.inputs.end()) return t;
      const int p = g.producer_of(t);
      if (p < 0) return "";
      const auto& op = g.node(p).op_type();
      if (op != "Reshape" && op != "Flatten" && op != "Identity" && op != "Unsqueeze" && op != "Squeeze") return "";
      t = g.node(p).input(0);
    }
    return "";
  }

  // t's only reader is a Not, whose readers (through Casts) are a CumSum and
  // the product of that sum with the mask itself.
  static bool feeds_cumsum_only_through_not(const Graph& g, const std::string& t) {
    const auto& c = g.consumers_of(t);
    if (c.size() != 1 || g.node(c[0]).op_type() != "Not") return false;
    std::vector<std::string> frontier = {g.node(c[0]).output(0)};
    bool cumsum = false;
    for (int depth = 0; depth < 3 && !frontier.empty(); ++depth) {
      std::vector<std::string> next;
      for (const auto& f : frontier)
        for (int k : g.consumers_of(f)) {
          const auto& op = g.node(k).op_type();
          if (op == "CumSum") cumsum = true;
          else if (op == "Cast") next.push_back(g.node(k).output(0));
          else if (op != "Mul") return false;
        }
      frontier = std::move(next);
    }
    return cumsum;
  }

  // A known value: folded in this pass, a Constant, or an integer
  // initializer. A float initializer is marked (type -1): a parameter, or a
  // buffer, that the importer plans.
  const Const* lookup(const Graph& g, const std::string& t) {
    if (auto it = known_.find(t); it != known_.end()) return &it->second;
    if (auto it = g.inits.find(t); it != g.inits.end() && is_parameter(g, t)) return &param_;
    if (int p = g.producer_of(t); p >= 0 && g.node(p).op_type() == "Constant")
      for (const auto& a : g.node(p).attribute())
        if (a.name() == "value_int" || a.name() == "value_ints" || a.name() == "value_float" ||
            a.name() == "value_floats") {
          const auto v = g.values(t);
          if (!v) return nullptr;
          const bool list = a.name() == "value_ints" || a.name() == "value_floats";
          const int32_t type = a.name().rfind("value_int", 0) == 0 ? TP::INT64 : TP::FLOAT;
          return &(known_[t] = Const{list ? Dims{static_cast<int64_t>(v->size())} : Dims{}, *v, type});
        }
    const TP* tp = stored(g, t);
    if (!tp || count(Dims(tp->dims().begin(), tp->dims().end())) > kMaxFoldedElements) return nullptr;
    const auto v = tensor_values(*tp);
    const Dims shape(tp->dims().begin(), tp->dims().end());
    if (!v || static_cast<int64_t>(v->size()) != count(shape)) return nullptr;
    return &(known_[t] = Const{shape, *v, tp->data_type()});
  }

  // A float initializer the importer plans as a parameter (or a buffer it
  // keeps): not torch's "onnx::" constant (Gemma's inv_freq, from which
  // RoPE's cos and sin are computed), nor a fixed sinusoidal table
  // (fixed_positions).
  bool is_parameter(const Graph& g, const std::string& t) {
    return !is_integral(g.dtype(t)) && g.is_learned(t) && !fixed_positions(g, t);
  }

  // The tensor stored for t, a Constant's value or an initializer that is not
  // a parameter, whatever its size; nothing for anything else.
  const TP* stored(const Graph& g, const std::string& t) {
    const TP* tp = nullptr;
    if (auto it = g.inits.find(t); it != g.inits.end()) {
      if (!is_parameter(g, t)) tp = it->second;
    } else if (int p = g.producer_of(t); p >= 0 && g.node(p).op_type() == "Constant") {
      for (const auto& a : g.node(p).attribute())
        if (a.name() == "value") tp = &a.t();
    }
    return tp && storable(tp->data_type()) ? tp : nullptr;
  }

  // A Gather or Slice of a stored tensor too large for lookup (over
  // kMaxFoldedElements values) with its other inputs known: only the
  // elements it takes are read. XGLM's sinusoidal table (2050 x 1024, a
  // Constant) gathered at the sequence's positions, the tutorial's pe
  // (5000 x 512) sliced to the sequence, GPT-Neo's causal-mask buffer
  // (2048 x 2048 per layer) cut to T x T: each a constant as small as the
  // step's sequence.
  std::optional<Const> read_part(const Graph& g, const onnx::NodeProto& n, const std::vector<const Const*>& in) {
    const bool gather = n.op_type() == "Gather";
    if (!gather && n.op_type() != "Slice") return std::nullopt;
    for (size_t k = 1; k < in.size(); ++k)
      if (!n.input(static_cast<int>(k)).empty() && (!in[k] || in[k]->type == -1)) return std::nullopt;
    if (gather && (in.size() != 2 || !is_integral(in[1]->type))) return std::nullopt;
    if (!gather && in.size() == 2) return std::nullopt;  // Slice reads starts and ends together
    const TP* tp = stored(g, n.input(0));
    if (!tp) return std::nullopt;
    const Dims shape(tp->dims().begin(), tp->dims().end());
    if (count(shape) <= kMaxFoldedElements) return std::nullopt;  // lookup would have read it: it holds no values
    const auto picks = gather ? gather_picks(n, shape, *in[1]) : slice_picks(n, shape, in);
    if (!picks) return std::nullopt;
    auto v = tensor_elements(*tp, picks->at);
    if (!v) return std::nullopt;
    return Const{picks->shape, std::move(*v), tp->data_type()};
  }

  onnx::ModelProto& model_;
  // A float initializer [P, D] (leading 1s allowed) whose every value is a
  // fixed sinusoidal position from position 0 (match_sinusoidal_positions,
  // ops.hpp): a table no step trains, folded as a constant. RoFormer keeps
  // its rotary sin and cos this way, in an nn.Parameter with requires_grad
  // False that ONNX cannot tell from a trained one, and PyTorch's tutorial
  // PositionalEncoding its pe (5000 x 512 by default) in a buffer, so only
  // the values decide; the note names it. A stripped file holds no values:
  // its table stays a parameter. Row 0 is read first (sin 0 = 0 and cos 0 =
  // 1 at columns 0 and 1 or D/2), so that a trained weight is turned away
  // without reading it; then the first rows, which give the layout and the
  // step, and the rest a block of rows at a time, whatever the table's size.
  bool fixed_positions(const Graph& g, const std::string& t) {
    if (auto it = fixed_.find(t); it != fixed_.end()) return it->second;
    bool fixed = false;
    const auto s = g.shape(t);
    const auto init = g.inits.find(t);
    if (s && init != g.inits.end() && s->size() >= 2 &&
        std::all_of(s->begin(), s->end() - 2, [](int64_t d) { return d == 1; }) && count(*s, kMaxTableElements) > 0 &&
        count(*s, kMaxTableElements) <= kMaxTableElements) {
      const TP& tp = *init->second;
      const int64_t P = (*s)[s->size() - 2], D = s->back();
      auto rows = [&](int64_t first, int64_t n) {  // rows first .. first + n - 1
        std::vector<int64_t> at(static_cast<size_t>(n * D));
        std::iota(at.begin(), at.end(), first * D);
        return tensor_elements(tp, at);
      };
      const auto row0 = D >= 4 && P >= 2 ? tensor_elements(tp, {0, 1, D / 2}) : std::nullopt;
      std::optional<SinusoidalPositions> sp;
      std::optional<int64_t> padding_row;
      if (row0 && (*row0)[0] == 0.0 && ((*row0)[1] == 1.0 || (*row0)[2] == 1.0)) {
        const int64_t head = std::min<int64_t>(P, 64);
        if (const auto v = rows(0, head)) {
          sp = match_sinusoidal_positions(*v, head, D);
          if (!sp) std::tie(sp, padding_row) = sinusoids_around_a_zero_row(*v, head, D);
        }
      }
      fixed = sp && sp->offset == 0;
      const int64_t block = std::max<int64_t>(1, kMaxFoldedElements / D);
      for (int64_t r = std::min<int64_t>(P, 64); fixed && r < P; r += block) {
        const auto v = rows(r, std::min(block, P - r));
        fixed = v && holds_sinusoidal_positions(*v, r, D, *sp);
      }
      if (fixed)
        assumptions_.push_back(fmt::format(
            "'{}' holds fixed sinusoidal positions ({} x {}, {}{}; every value checked): read as constants, not a "
            "parameter (PyTorch counts it, {} values, where it is an nn.Parameter, as RoFormer's frozen table)",
            t, P, D, sp->interleaved ? "interleaved" : "sines then cosines",
            padding_row ? fmt::format(", row {} zero: the padding position's", *padding_row) : "", P * D));
    }
    return fixed_[t] = fixed;
  }

  // fairseq's sinusoidal table (Speech2Text2's) zeroes the row of its
  // padding index: the first `head` rows [head, D] in `v` are sinusoids of
  // positions 0, 1, ... but for one row of zeros, row z >= 1. The layout and
  // z, or nothing. The rows before z fix the layout where there are two of
  // them (the step is read at position 1), else the rows after it (their
  // first position is z + 1 = 2); the other side must follow it.
  static std::pair<std::optional<SinusoidalPositions>, std::optional<int64_t>> sinusoids_around_a_zero_row(
      const std::vector<double>& v, int64_t head, int64_t D) {
    auto zero = [&](int64_t r) {
      return std::all_of(v.begin() + r * D, v.begin() + (r + 1) * D, [](double e) { return e == 0.0; });
    };
    int64_t z = 1;
    while (z < head && !zero(z)) ++z;
    if (z >= head) return {std::nullopt, std::nullopt};
    const std::vector<double> before(v.begin(), v.begin() + z * D), after(v.begin() + (z + 1) * D, v.begin() + head * D);
    std::optional<SinusoidalPositions> sp;
    if (z >= 2) {
      sp = match_sinusoidal_positions(before, z, D);
      if (!sp || sp->offset != 0 || !holds_sinusoidal_positions(after, z + 1, D, *sp)) return {std::nullopt, std::nullopt};
    } else {
      const auto later = head > z + 1 ? match_sinusoidal_positions(after, head - z - 1, D) : std::nullopt;
      if (!later || later->offset != z + 1) return {std::nullopt, std::nullopt};
      sp = SinusoidalPositions{later->interleaved, 0, later->step};
      if (!holds_sinusoidal_positions(before, 0, D, *sp)) return {std::nullopt, std::nullopt};
    }
    return {sp, z};
  }

  const std::string& src_;
  std::map<std::string, Const> known_;
  std::map<std::string, bool> fixed_;  // fixed_positions, once per initializer
  const Const param_{{}, {}, -1};

 public:
  std::vector<std::string> assumptions_;  // what a fold assumed of the inputs, for the notes
};

}  // namespace

int fold_shape_subgraphs(onnx::ModelProto& model, const std::string& src, std::vector<std::string>* assumptions) {
  Folder f(model, src);
  int total = 0;
  for (int round = 0; round < 32; ++round) {  // each round after shape inference revealed more dimensions
    const int folded = f.pass();
    if (folded == 0) break;
    total += folded;
    model.mutable_graph()->clear_value_info();
    onnx::ShapeInferenceOptions so(false, 0, true);
    onnx::shape_inference::InferShapes(model, onnx::OpSchemaRegistry::Instance(), so);
  }
  if (assumptions) *assumptions = f.assumptions_;
  return total;
}

}  // namespace dlplan::onnx_import
