// nn.LSTM, nn.GRU and nn.RNN as torch.onnx.export writes them, recognised as
// the IR's lstm, gru and rnn.
//
// torch 1.13 exports each layer of an nn.LSTM as one ONNX LSTM node, which
// runs sequence-first ([T, b, in] -> Y [T, directions, b, H]):
//   batch_first input -> Transpose(perm 1, 0, 2) -> LSTM -> Squeeze(axis 1)
//     -> Transpose(perm 1, 0, 2) -> the batch_first output,
// where a bidirectional layer's Squeeze is Transpose(perm 0, 2, 1, 3) ->
// Reshape to [T, b, 2H] (the directions side by side), and a further layer
// reads that directly. The weights reach the node reordered from PyTorch's
// gate order (i, f, g, o) to ONNX's (i, o, f, c): W = Unsqueeze(Concat(
// Slice(weight_ih, rows i), Slice(rows o), Slice(rows f and g))), and for
// two directions a Concat of that and the same of weight_ih_reverse; R
// likewise from weight_hh, and B the same of bias_ih then bias_hh. With
// constant folding on, these are initializers already in ONNX's order. The
// states start at zero (ConstantOfShape). Everything else an LSTM node can
// say (sequence lengths, given states, peepholes, clip, other activations,
// h_n or c_n read after it) is refused with the reason, as the IR's lstm
// is one layer from zero states.
//
// nn.GRU exports the same way as ONNX GRU (linear_before_reset 1, as
// PyTorch computes r (W_hn h + b_hn)), its 3 gates reordered from PyTorch's
// (r, z, n) to ONNX's (z, r, h): Slices of rows [H, 2H), [0, H), [2H, 3H).
// nn.RNN exports as ONNX RNN (activations Tanh or Relu), its one block of
// weights Unsqueezed as it is.
#include "import_onnx_graph.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>

namespace dlplan::onnx_import {
namespace {

bool has_perm(const onnx::NodeProto& n, const std::vector<int64_t>& perm) {
  return n.op_type() == "Transpose" && attr_ints(n, "perm") == perm;
}

// A Squeeze of axis 1 only (the directions axis of an LSTM's Y).
bool squeezes_axis_1(const Graph& g, const onnx::NodeProto& n) {
  if (n.op_type() != "Squeeze") return false;
  std::vector<int64_t> axes = attr_ints(n, "axes");
  if (n.input_size() > 1 && !n.input(1).empty()) {
    const auto v = g.values(n.input(1));
    if (!v) return false;
    axes.assign(v->begin(), v->end());
  }
  return axes == std::vector<int64_t>{1} || axes == std::vector<int64_t>{-3};
}

// All zeros: an absent input, or a constant (ConstantOfShape of 0, folded or
// not), or a part of one (a layer's Slice of nn.LSTM's [layers, b, H] zeros).
bool zero_state(const Graph& g, const std::string& t, int depth = 0) {
  if (t.empty()) return true;
  const int p = g.producer_of(t);
  static const std::set<std::string> kParts = {"Slice", "Gather", "Squeeze", "Unsqueeze", "Expand", "Reshape"};
  if (p >= 0 && depth < 4 && kParts.count(g.node(p).op_type()) && g.node(p).input_size() > 0)
    return zero_state(g, g.node(p).input(0), depth + 1);
  if (p >= 0 && g.node(p).op_type() == "ConstantOfShape") {
    const auto* v = attr(g.node(p), "value");
    if (!v) return true;
    const auto vals = tensor_values(v->t());
    return vals && std::all_of(vals->begin(), vals->end(), [](double e) { return e == 0.0; });
  }
  // A learned initial state is a parameter even while it holds zeros.
  if (g.is_learned(t)) return false;
  const auto vals = g.values(t);
  return vals && std::all_of(vals->begin(), vals->end(), [](double e) { return e == 0.0; });
}

// Rows [begin, end) of axis 0 that Slice node n takes from its data input.
std::optional<std::pair<int64_t, int64_t>> slice_rows(const Graph& g, const onnx::NodeProto& n) {
  if (n.op_type() != "Slice" || n.input_size() < 3) return std::nullopt;
  const auto starts = g.values(n.input(1)), ends = g.values(n.input(2));
  const auto axes = n.input_size() > 3 && !n.input(3).empty() ? g.values(n.input(3)) : std::vector<double>{0};
  const auto steps = n.input_size() > 4 && !n.input(4).empty() ? g.values(n.input(4)) : std::vector<double>{1};
  if (!starts || !ends || !axes || !steps || starts->size() != 1 || ends->size() != 1 || *axes != std::vector<double>{0} ||
      *steps != std::vector<double>{1})
    return std::nullopt;
  return std::make_pair(static_cast<int64_t>((*starts)[0]), static_cast<int64_t>((*ends)[0]));
}

// Concat(Slice(p, rows [0, n)), Slice(p, [3n, 4n)), Slice(p, [n, 3n))) of one
// learned tensor p with 4n rows: PyTorch's i, f, g, o reordered to ONNX's
// i, o, f, c (LSTM, 4 gates); for a GRU's 3, rows [n, 2n), [0, n), [2n,
// 3n): r, z, n to z, r, h. Returns p, and adds the nodes to `nodes`.
std::optional<std::string> reordered_gates(const Graph& g, const std::string& t, int64_t n, int gates,
                                           std::vector<int>& nodes) {
  if (gates == 1) {  // an RNN's one block: the parameter itself
    const auto ps = g.shape(t);
    if (!g.is_learned(t) || !ps || ps->empty() || (*ps)[0] != n) return std::nullopt;
    return t;
  }
  const int c = g.producer_of(t);
  if (c < 0 || g.node(c).op_type() != "Concat" || attr_int(g.node(c), "axis", 0) != 0 || g.node(c).input_size() != 3)
    return std::nullopt;
  const std::pair<int64_t, int64_t> lstm[3] = {{0, n}, {3 * n, 4 * n}, {n, 3 * n}};
  const std::pair<int64_t, int64_t> gru[3] = {{n, 2 * n}, {0, n}, {2 * n, 3 * n}};
  const auto* want = gates == 4 ? lstm : gru;
  std::string source;
  std::vector<int> found{c};
  for (int k = 0; k < 3; ++k) {
    const int s = g.producer_of(g.node(c).input(k));
    const auto rows = s >= 0 ? slice_rows(g, g.node(s)) : std::nullopt;
    if (!rows || *rows != want[k]) return std::nullopt;
    const std::string& p = g.node(s).input(0);
    if (!g.is_learned(p) || (!source.empty() && p != source)) return std::nullopt;
    const auto ps = g.shape(p);
    if (!ps || ps->empty() || (*ps)[0] != gates * n) return std::nullopt;
    source = p;
    found.push_back(s);
  }
  nodes.insert(nodes.end(), found.begin(), found.end());
  return source;
}

// The node producing t if it is an Unsqueeze of axis 0 (the directions axis).
std::optional<int> unsqueezed(const Graph& g, const std::string& t) {
  const int u = g.producer_of(t);
  if (u < 0 || g.node(u).op_type() != "Unsqueeze") return std::nullopt;
  std::vector<int64_t> axes = attr_ints(g.node(u), "axes");
  if (g.node(u).input_size() > 1 && !g.node(u).input(1).empty()) {
    const auto v = g.values(g.node(u).input(1));
    if (!v) return std::nullopt;
    axes.assign(v->begin(), v->end());
  }
  if (axes != std::vector<int64_t>{0}) return std::nullopt;
  return u;
}

// A two-input Concat on axis 0 producing t: its node.
std::optional<int> concat_of_two(const Graph& g, const std::string& t) {
  const int c = g.producer_of(t);
  if (c < 0 || g.node(c).op_type() != "Concat" || g.node(c).input_size() != 2 || attr_int(g.node(c), "axis", 0) != 0)
    return std::nullopt;
  return c;
}

// The parts of W, R or B a direction each: t itself for one direction, the
// two inputs of its Concat for two.
std::optional<std::vector<std::string>> per_direction(const Graph& g, const std::string& t, int dirs,
                                                      std::vector<int>& nodes) {
  if (dirs == 1) return std::vector<std::string>{t};
  const auto c = concat_of_two(g, t);
  if (!c) return std::nullopt;
  nodes.push_back(*c);
  return std::vector<std::string>{g.node(*c).input(0), g.node(*c).input(1)};
}

// A folded initializer of W, R or B: `rows` rows of one gate set a direction.
std::vector<WeightRef> folded_rows(const std::string& init, int dirs, int rows, int gates) {
  std::vector<WeightRef> out;
  for (int r = 0; r < dirs * rows; ++r) {
    WeightRef w{init, false, r, r + 1};
    w.onnx_gates = gates;
    out.push_back(w);
  }
  return out;
}

// W, R or B [dirs, parts x G H(, cols)]: for each direction, `parts` PyTorch
// tensors (W, R: the weight; B: bias_ih and bias_hh), each reordered to
// ONNX's gates and Unsqueezed to a direction (B: Concatenated first); or the
// folded initializer's rows in ONNX's gate order.
std::optional<std::vector<WeightRef>> gate_params(const Graph& g, const std::string& t, int64_t H, int gates,
                                                  int dirs, int parts, std::vector<int>& nodes) {
  if (g.is_init(t)) return folded_rows(t, dirs, parts, gates);
  std::vector<int> found;
  const auto per_dir = per_direction(g, t, dirs, found);
  if (!per_dir) return std::nullopt;
  std::vector<WeightRef> out;
  for (const auto& d : *per_dir) {
    const auto u = unsqueezed(g, d);
    if (!u) return std::nullopt;
    found.push_back(*u);
    std::vector<std::string> reordered{g.node(*u).input(0)};
    if (parts == 2) {
      const auto c = concat_of_two(g, reordered[0]);
      if (!c) return std::nullopt;
      found.push_back(*c);
      reordered = {g.node(*c).input(0), g.node(*c).input(1)};
    }
    for (const auto& r : reordered) {
      const auto p = reordered_gates(g, r, H, gates, found);
      if (!p) return std::nullopt;
      out.push_back(WeightRef{*p});
    }
  }
  nodes.insert(nodes.end(), found.begin(), found.end());
  return out;
}

// The node that makes an LSTM's Y sequence-first [T, b, dirs H]: the
// Squeeze of its directions axis (one direction), or the Transpose(0, 2, 1,
// 3) and Reshape (two): those nodes, the last giving the sequence; or nothing.
std::optional<std::vector<int>> sequence_of(const Graph& g, const std::string& y, int dirs, int64_t H) {
  const auto& readers = g.consumers_of(y);
  if (readers.size() != 1) return std::nullopt;
  const auto& r = g.node(readers[0]);
  if (dirs == 1) {
    if (!squeezes_axis_1(g, r)) return std::nullopt;
    return std::vector<int>{readers[0]};
  }
  if (!has_perm(r, {0, 2, 1, 3})) return std::nullopt;
  const auto& next = g.consumers_of(r.output(0));
  if (next.size() != 1 || g.node(next[0]).op_type() != "Reshape") return std::nullopt;
  const auto shape = g.shape(g.node(next[0]).output(0));
  if (!shape || shape->size() != 3 || shape->back() != 2 * H) return std::nullopt;
  return std::vector<int>{readers[0], next[0]};
}

bool is_graph_output(const Graph& g, const std::string& t) {
  for (const auto& o : g.g.output())
    if (o.name() == t) return true;
  return false;
}

// Whether t is another LSTM's (GRU's) sequence-first output (the layer below).
bool from_layer_below(const Graph& g, const std::string& t, const std::string& op) {
  const int p = g.producer_of(t);
  if (p < 0) return false;
  const auto& n = g.node(p);
  const auto lstm_of = [&](const std::string& y) {
    const int l = g.producer_of(y);
    return l >= 0 && g.node(l).op_type() == op && g.node(l).output(0) == y;
  };
  if (squeezes_axis_1(g, n)) return lstm_of(n.input(0));
  if (n.op_type() != "Reshape") return false;
  const int tr = g.producer_of(n.input(0));
  return tr >= 0 && has_perm(g.node(tr), {0, 2, 1, 3}) && lstm_of(g.node(tr).input(0));
}

}  // namespace

std::optional<Fusion> match_recurrent(const Graph& g, int node, std::string& why) {
  const auto& n = g.node(node);
  const std::string& op = n.op_type();  // LSTM, GRU or RNN
  const bool lstm = op == "LSTM", rnn = op == "RNN";
  const int gates = lstm ? 4 : rnn ? 1 : 3;
  const char* irop = lstm ? "lstm" : rnn ? "rnn" : "gru";
  const auto input = [&](int k) -> std::string { return n.input_size() > k ? n.input(k) : std::string(); };
  const int64_t H = attr_int(n, "hidden_size", 0);
  const std::string direction = attr_text(n, "direction", "forward");
  if (direction != "forward" && direction != "bidirectional") {
    why = fmt::format("direction '{}', which nn.{} does not export (forward, or bidirectional)", direction, op);
    return std::nullopt;
  }
  const int dirs = direction == "bidirectional" ? 2 : 1;
  if (attr_int(n, "layout", 0) != 0 || attr(n, "clip") || attr_int(n, "input_forget", 0) != 0 || H <= 0) {
    why = fmt::format("a layout, clip, input_forget or missing hidden_size that nn.{} does not export", op);
    return std::nullopt;
  }
  if (op == "GRU" && attr_int(n, "linear_before_reset", 0) != 1) {
    why = "linear_before_reset 0: the reset gate applied before W_hn, where nn.GRU applies it after";
    return std::nullopt;
  }
  // nn.RNN's nonlinearity: Tanh (ONNX's default) or Relu, the same for both directions.
  std::string nonlinearity = "tanh";
  if (const auto acts = attr(n, "activations"); acts && acts->strings_size() > 0) {
    std::vector<std::string> a(acts->strings().begin(), acts->strings().end());
    if (rnn) {
      const bool same = std::all_of(a.begin(), a.end(), [&](const std::string& e) { return e == a[0]; });
      if (!same || a.size() > 2 || (a[0] != "Tanh" && a[0] != "Relu")) {
        why = "activations other than nn.RNN's (tanh or relu, the same in both directions)";
        return std::nullopt;
      }
      nonlinearity = a[0] == "Relu" ? "relu" : "tanh";
    } else {
      const std::vector<std::string> torch = lstm ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
                                                  : std::vector<std::string>{"Sigmoid", "Tanh"};
      if (a != torch && a.size() != 2 * torch.size()) {  // (bidirectional: both directions', each as torch's)
        why = fmt::format("activations other than nn.{}'s (sigmoid, tanh)", op);
        return std::nullopt;
      }
    }
  }
  if (!input(4).empty() || (lstm && !input(7).empty())) {
    why = "sequence lengths (a packed sequence) or peepholes, which a plain forward does not export";
    return std::nullopt;
  }
  if (!zero_state(g, input(5)) || (lstm && !zero_state(g, input(6)))) {
    why = fmt::format("its initial state ({}) is given; dlplan's {} starts from zeros, as nn.{} does without one",
                      lstm ? "h_0, c_0" : "h_0", irop, op);
    return std::nullopt;
  }
  for (int k = 1; k < std::min(n.output_size(), 3); ++k)
    if (!n.output(k).empty() && !g.consumers_of(n.output(k)).empty()) {
      why = fmt::format("its final {} state is read after it; dlplan's {} gives the output sequence only "
                        "(for a one-layer forward {}, output[:, -1] is h_n)",
                        k == 1 ? "hidden (h_n)" : "cell (c_n)", irop, op);
      return std::nullopt;
    }

  Fusion f;
  f.kind = irop;
  f.name = n.name().empty() ? n.output(0) : n.name();
  f.unit_source = n.name();
  f.nodes = {node};
  // The input: a batch_first tensor transposed to sequence-first, or the
  // previous layer's output (sequence-first, read by no other node).
  const int xp = g.producer_of(input(0));
  if (xp >= 0 && has_perm(g.node(xp), {1, 0, 2}) && g.consumers_of(input(0)).size() == 1) {
    f.x = g.node(xp).input(0);
    f.nodes.push_back(xp);
  } else if (from_layer_below(g, input(0), op)) {
    f.x = input(0);
  } else {
    why = fmt::format("its input is not a batch_first tensor (nn.{}(batch_first=True)) or the layer below's output; "
                      "dlplan plans per sample with the batch axis first",
                      op);
    return std::nullopt;
  }
  // The output made sequence-first [T, b, dirs H], then either the
  // transpose back to batch_first or the next layers alone.
  const auto seq_nodes = sequence_of(g, n.output(0), dirs, H);
  if (!seq_nodes) {
    why = fmt::format("its output is not made [T, b, directions x hidden] as nn.{}'s export does", op);
    return std::nullopt;
  }
  f.nodes.insert(f.nodes.end(), seq_nodes->begin(), seq_nodes->end());
  const std::string& seq = g.node(seq_nodes->back()).output(0);
  // Its readers, less dead ones: where one nn.GRU's output goes straight into
  // another, torch cancels the transpose back against the next one's but
  // leaves the first in the graph, read by nothing.
  std::vector<int> readers;
  for (int r : g.consumers_of(seq))
    if (!g.consumers_of(g.node(r).output(0)).empty() || is_graph_output(g, g.node(r).output(0))) readers.push_back(r);
  if (readers.size() == 1 && has_perm(g.node(readers[0]), {1, 0, 2})) {
    f.nodes.push_back(readers[0]);
    f.out = g.node(readers[0]).output(0);
  } else if (!readers.empty() && std::all_of(readers.begin(), readers.end(), [&](int r) {
               return g.node(r).op_type() == op && g.node(r).input(0) == seq;
             })) {
    f.out = seq;
  } else {
    why = "its sequence-first output is read by something other than the transpose back to batch_first or the next "
          "layer (dropout between layers, or batch_first=False)";
    return std::nullopt;
  }

  const auto w = gate_params(g, input(1), H, gates, dirs, 1, f.nodes);
  const auto r = w ? gate_params(g, input(2), H, gates, dirs, 1, f.nodes) : std::nullopt;
  if (!w || !r) {
    why = fmt::format("its weights are neither nn.{}'s weight_ih and weight_hh reordered to ONNX's gate order nor "
                      "initializers",
                      op);
    return std::nullopt;
  }
  const bool bias = !input(3).empty();
  const auto b = bias ? gate_params(g, input(3), H, gates, dirs, 2, f.nodes) : std::vector<WeightRef>{};
  if (!b) {
    why = fmt::format("its bias is neither nn.{}'s bias_ih and bias_hh reordered to ONNX's gate order nor an "
                      "initializer",
                      op);
    return std::nullopt;
  }
  for (int d = 0; d < dirs; ++d) {  // the IR's parameters: weight_ih, weight_hh[, bias_ih, bias_hh], then _reverse
    const std::string s = d == 0 ? "" : "_reverse";
    f.weights.push_back({"weight_ih" + s, (*w)[static_cast<size_t>(d)]});
    f.weights.push_back({"weight_hh" + s, (*r)[static_cast<size_t>(d)]});
    if (bias) {
      f.weights.push_back({"bias_ih" + s, (*b)[static_cast<size_t>(2 * d)]});
      f.weights.push_back({"bias_hh" + s, (*b)[static_cast<size_t>(2 * d + 1)]});
    }
  }
  f.attrs["hidden"] = H;
  f.attrs["bias"] = bias;
  if (dirs == 2) f.attrs["bidirectional"] = true;
  if (rnn) f.attrs["nonlinearity"] = nonlinearity;
  return f;
}

}  // namespace dlplan::onnx_import
