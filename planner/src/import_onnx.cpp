// ONNX file -> IR (DESIGN.md: "Other inputs a user has ... become this IR
// through importers"). Steps:
//   1. load the ModelProto (initializer data is never read: dims are enough,
//      so external-data files may be missing and tensors may be empty);
//   2. give symbolic input dims values (leading dim: --micro-batch, others:
//      --seq-len) and run ONNX shape inference;
//   3. fuse patterns into IR ops (import_onnx_fuse.cpp): attention, GELU
//      (Erf and Tanh forms), SiLU;
//   4. walk back from the graph output to find the data path (shape
//      computations and attention-mask plumbing fall away);
//   5. map each data-path node to an IR op; an unknown op becomes the IR's
//      `opaque` op (its output planned, every input kept for backward),
//      named in the notes, and refused only when its output shape is unknown;
//   6. units from node-name prefixes that repeat (encoder.layers.3);
//   7. a cross_entropy loss on the first graph output (the ONNX graph has none);
//   8. parse_model validates and infers shapes like any IR file.
// What the importer could not map or had to assume goes to Model::notes.
#include "dlplan/error.hpp"
#include "dlplan/format.hpp"
#include "dlplan/limits.hpp"
#include "dlplan/importers.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/ops.hpp"

#include <fmt/format.h>

#ifdef DLPLAN_HAVE_ONNX
#include "import_onnx_graph.hpp"

#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <numeric>
#include <regex>
#include <set>
#include <tuple>
#include <sstream>
#endif

namespace dlplan {

const char* to_string(FusionMode f) { return f == FusionMode::eager ? "eager" : "engine"; }

std::optional<FusionMode> fusion_from_string(const std::string& s) {
  if (s == "engine") return FusionMode::engine;
  if (s == "eager") return FusionMode::eager;
  return std::nullopt;
}

#ifndef DLPLAN_HAVE_ONNX

bool onnx_supported() { return false; }

Model import_onnx(const std::string& path, const ImportOptions&) {
  throw Error(fmt::format("{}: dlplan was built without ONNX support (install libonnx-dev and libprotobuf-dev, then "
                          "re-run cmake)", path));
}

std::vector<ImportedWeight> import_onnx_weights(const std::string& path, const ImportOptions& opt, bool) {
  import_onnx(path, opt);  // throws
  return {};
}

#else

bool onnx_supported() { return true; }

namespace onnx_import {

namespace {

using OJson = nlohmann::ordered_json;

// "/encoder/layers.3/attn/MatMul" -> "encoder.layers.3.attn.MatMul".
std::string normalize(const std::string& name) {
  std::string s;
  for (char c : name) {
    char d = c == '/' || c == ':' ? '.' : c;
    if (d == '.' && (s.empty() || s.back() == '.')) continue;
    s.push_back(d);
  }
  while (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// The repeated-block prefix of a node name: everything up to and including the
// first numeric component ("encoder.layers.3"), with the stem ("encoder.layers").
std::optional<std::pair<std::string, std::string>> unit_prefix(const std::string& name) {
  static const std::regex re(R"(^((?:[A-Za-z_][\w]*\.)*?[A-Za-z_][\w]*)[._](\d+)(?:\.|$))");
  std::smatch mt;
  auto n = normalize(name);
  if (!std::regex_search(n, mt, re)) return std::nullopt;
  const std::string stem = mt[1].str();
  const std::string sep = n.substr(static_cast<size_t>(mt.length(1)), 1);
  return std::make_pair(stem + sep + mt[2].str(), stem);
}

class Importer {
  // A table read at indices computed in the graph (see table_read), added
  // to the token embeddings as positions.
  struct PosTable {
    int64_t rows = 0;
    std::optional<int64_t> row;  // every position reads this row
    int64_t offset = 0;          // else position t reads row offset + t
    std::string table;           // the initializer
  };
  // Swin's relative position table read at relative_position_index, on its
  // way to the scores (map_window_table).
  struct WindowTable {
    std::string table;  // the initializer [(2 Wh - 1)(2 Ww - 1), heads]
    std::array<int64_t, 2> window;
    int64_t heads = 0;
    bool heads_first = false;  // permuted to [heads, T, T]; else the gathered [T, T, heads] order
    // T5's relative-position buckets over `positions` (MPNet's), in place of a window
    std::optional<RelativeBuckets> buckets;
    int64_t positions = 0;
    std::string gather;  // the Gather that read the table (names the IR node)
    // A causal mask added to the bias before the scores (T5's decoder): the
    // value added above the diagonal, which the scores then take as the IR's
    // causal_mask.
    std::optional<double> causal_fill;
    bool cls = false;  // a class token at position 0 besides the window (BEiT's)
  };

 public:
  Importer(Graph& g, FusionMode fusion, int64_t micro_batch) : g_(g), fusion_(fusion), micro_batch_(micro_batch) {}

  const std::map<std::string, WeightRef>& weights() const { return weights_; }

  Model run() {
    for (int i = 0; i < g_.g.node_size(); ++i) check_arity(i);
    fusions_ = find_fusions(g_, fusion_, &unfused_);
    for (size_t i = 0; i < fusions_.size(); ++i) {
      fusion_by_out_[fusions_[i].out] = static_cast<int>(i);
      for (int n : fusions_[i].nodes) fused_node_[n] = static_cast<int>(i);
    }
    if (g_.g.output_size() == 0) fail("the graph has no outputs");
    if (g_.g.output_size() > 1)
      notes_.push_back(fmt::format("graph has {} outputs; the loss is planned on the first, '{}'", g_.g.output_size(),
                                   g_.g.output(0).name()));
    std::string logits = g_.g.output(0).name();
    bool has_loss = false;
    if (int p = g_.producer_of(logits); p >= 0 && !fused_node_.count(p)) {
      const auto& op = g_.node(p).op_type();
      if (op == "Softmax" || op == "LogSoftmax") {
        notes_.push_back(fmt::format("final {} folded into the cross_entropy loss", op));
        logits = g_.node(p).input(0);
      } else if (op == "SoftmaxCrossEntropyLoss") {
        has_loss = true;
      }
    }
    find_data_path(logits);
    refuse_unmatched_recurrent();
    map_nodes();
    if (!has_loss) add_loss(logits);
    assign_units();
    return finish();
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const { throw Error(fmt::format("{}: {}", g_.src, msg)); }

  // An LSTM, GRU or RNN on the data path that match_recurrent did not take:
  // refused with its reason, before the transposes around it fail for want
  // of a batch axis.
  void refuse_unmatched_recurrent() const {
    for (int i : needed_) {
      const std::string& op = g_.node(i).op_type();
      if (op != "LSTM" && op != "GRU" && op != "RNN") continue;
      std::string why;
      if (!match_recurrent(g_, i, why))
        fail(fmt::format("{}: an nn.{} dlplan cannot plan: {}", label(g_.node(i), i), op, why));
    }
  }

  // Inputs of a node that carry data (not shapes, indices of constants, ...).
  std::vector<std::string> data_inputs(const onnx::NodeProto& n) const {
    const auto& op = n.op_type();
    std::vector<std::string> out;
    auto first = [&] {
      if (n.input_size() > 0 && !g_.is_const(n.input(0))) out.push_back(n.input(0));
    };
    if (op == "Shape" || op == "Size" || op == "Constant" || op == "ConstantOfShape" || op == "Range" ||
        op == "EyeLike")
      return out;
    if (op == "Reshape" || op == "Expand" || op == "Tile" || op == "Slice" || op == "Squeeze" || op == "Unsqueeze" ||
        op == "Dropout" || op == "Pad" || op == "Resize" || op == "Split" || op == "TopK" || op == "ReduceMean" ||
        op == "ReduceSum") {
      first();
      return out;
    }
    if (op == "Gather" && n.input_size() == 2) {
      if (g_.is_init(n.input(0))) {  // an embedding; positions (not from an input) are a table, no data
        if (!g_.is_const(n.input(1)) && depends_on_input(n.input(1))) out.push_back(n.input(1));
      } else {
        first();
      }
      return out;
    }
    for (int k = 0; k < n.input_size(); ++k) {
      const auto& in = n.input(k);
      if (in.empty() || g_.is_const(in)) continue;
      if (op == "MatMul" && k == 1 && g_.matmul_weight(in)) continue;  // Transpose(W): a weight, not data
      if (op == "Mul" && g_.offset_weight(in)) continue;                 // 1 + w: a weight (Gemma's RMSNorm)
      if (op == "PRelu" && k == 1 && prelu_slope(in, n.input(0))) continue;  // Unsqueeze(a): a weight
      out.push_back(in);
    }
    return out;
  }

  void find_data_path(const std::string& logits) {
    std::vector<std::string> work{logits};
    std::set<std::string> seen;
    while (!work.empty()) {
      auto t = work.back();
      work.pop_back();
      if (!seen.insert(t).second) continue;
      if (auto f = fusion_by_out_.find(t); f != fusion_by_out_.end()) {
        needed_fusions_.insert(f->second);
        work.push_back(fusions_[static_cast<size_t>(f->second)].x);
        continue;
      }
      int p = g_.producer_of(t);
      if (p < 0) {
        if (!g_.is_init(t)) used_inputs_.insert(t);
        continue;
      }
      if (fused_node_.count(p))
        fail(fmt::format("{}: output '{}' is used outside the {} pattern it belongs to; cannot plan it",
                         label(g_.node(p), p), t, fusions_[static_cast<size_t>(fused_node_.at(p))].kind));
      needed_.insert(p);
      for (const auto& in : data_inputs(g_.node(p))) work.push_back(in);
    }
  }

  // Does `t` depend on a graph input through data edges? A depth-first
  // search with its own stack (a graph may be a chain of many thousand
  // nodes); a tensor on a cycle reads as not depending.
  bool depends_on_input(const std::string& t) const {
    std::vector<std::pair<std::string, bool>> stack{{t, false}};  // (tensor, its inputs are done)
    while (!stack.empty()) {
      auto [cur, inputs_done] = stack.back();
      stack.pop_back();
      const int p = g_.producer_of(cur);
      if (inputs_done) {
        bool r = false;
        for (const auto& in : data_inputs(g_.node(p))) r = r || dep_memo_[in];
        dep_memo_[cur] = r;
        continue;
      }
      if (dep_memo_.count(cur)) continue;
      if (p < 0) {
        dep_memo_[cur] = !g_.is_init(cur);
        continue;
      }
      dep_memo_[cur] = false;  // in progress
      stack.emplace_back(cur, true);
      for (const auto& in : data_inputs(g_.node(p)))
        if (!dep_memo_.count(in)) stack.emplace_back(in, false);
    }
    return dep_memo_.at(t);
  }

  std::string unique_name(const std::string& base) {
    std::string n = base.empty() ? "node" : base;
    std::string cand = n;
    for (int i = 2; used_names_.count(cand); ++i) cand = fmt::format("{}_{}", n, i);
    used_names_.insert(cand);
    return cand;
  }

  std::string ir_name_for(const onnx::NodeProto& n) {
    std::string base = normalize(n.name());
    if (base.empty()) base = normalize(n.output_size() > 0 ? n.output(0) : n.op_type());
    return unique_name(base);
  }

  const std::string& ir_of(const std::string& t, const onnx::NodeProto& n, int i) {
    auto it = ir_.find(t);
    if (const auto v = param_views_.find(t); it == ir_.end() && v != param_views_.end())
      fail(fmt::format("{}: input '{}' is parameter '{}' reshaped in the graph, which dlplan plans only as a bias "
                       "added to an activation or a scale multiplying one",
                       label(n, i), t, v->second));
    if (it == ir_.end())
      fail(fmt::format("{}: input '{}' is not something dlplan can plan (it comes from an op that was not mapped)",
                       label(n, i), t));
    return it->second;
  }

  void emit(const std::string& ir_name, const char* op, std::vector<std::string> in, const OJson& attrs,
            const std::string& out_tensor, const std::string& onnx_name) {
    OJson node{{"name", ir_name}, {"op", op}, {"in", std::move(in)}};
    for (const auto& [k, v] : attrs.items()) node[k] = v;
    nodes_.push_back(std::move(node));
    onnx_names_.push_back(onnx_name);
    ir_[out_tensor] = ir_name;
    last_emitted_ = ir_name;
  }

  // Where the values of the parameter `suffix` of the node just emitted are
  // in the file (read only by import_onnx_weights).
  void weigh(const std::string& suffix, const WeightRef& ref) { weights_[last_emitted_ + "." + suffix] = ref; }

  // Whether ONNX tensor t is computed once per step with every axis its
  // own (batch_free_ without a leading axis of the batch's, unit_batch_).
  bool own_axes(const std::string& t) const { return batch_free_.count(t) && !unit_batch_.count(t); }

  Dims per_sample(const std::string& t) const {
    auto s = g_.shape(t);
    if (s && s->empty() && batch_free_.count(t)) return {1};  // a 0-d parameter (a learned scalar) as [1]
    if (!s || s->empty()) return {};
    if (own_axes(t)) return *s;
    if (const auto b2 = batch_second_.find(t); b2 != batch_second_.end() && s->size() >= 2 && (*s)[1] > 0) {
      Dims d = *s;  // [k, b m, ...] -> [k, m, ...]; [k, b, ...] -> [k, ...]
      if (b2->second > 0) d[1] /= b2->second;
      else d.erase(d.begin() + 1);
      return d;
    }
    Dims d(s->begin() + 1, s->end());
    if (auto f = batch_folded_.find(t); f != batch_folded_.end() && (*s)[0] > 0)
      d.insert(d.begin(), (*s)[0] / f->second);  // [b m, ...] -> [m, ...]
    return d;
  }

  // The axes of ONNX tensor t are the IR's per-sample axes with the batch
  // axis in front ([b, T, D] is [T, D] per sample), unless the batch is
  // folded into the first axis ([b H, T, hd] is [H, T, hd] per sample, the
  // same rank). batch_axes: how many leading ONNX axes the IR drops.
  int64_t batch_axes(const std::string& t) const {
    return batch_folded_.count(t) || own_axes(t) ? 0 : 1;
  }
  // The IR axis of ONNX axis `axis` (non-negative) of t; none for axis 0,
  // which is or holds the batch. Every mapper that takes an axis reads it here.
  std::optional<int64_t> per_sample_axis(const std::string& t, int64_t axis) const {
    if (own_axes(t)) return axis;  // no batch axis to skip
    if (axis < 1) return std::nullopt;
    return axis - batch_axes(t);
  }

  // An integer or [h, w] pair: one value when both are equal.
  static OJson pair(int64_t a, int64_t b) { return a == b ? OJson(a) : OJson::array({a, b}); }

  OJson pool_geometry(const onnx::NodeProto& n, int i, OJson attrs, int64_t kh, int64_t kw) {
    auto strides = attr_ints(n, "strides");
    auto pads = attr_ints(n, "pads");
    auto dil = attr_ints(n, "dilations");
    const auto auto_pad = attr_text(n, "auto_pad", "NOTSET");
    if (auto_pad != "NOTSET" && auto_pad != "VALID")
      fail(fmt::format("{}: auto_pad {} is not supported (export with explicit pads)", label(n, i), auto_pad));
    const bool dilated = std::any_of(dil.begin(), dil.end(), [](int64_t d) { return d != 1; });
    if (dilated && (n.op_type() != "Conv" || dil.size() != 2))  // the IR dilates conv2d only
      fail(fmt::format("{}: dilation [{}] is not supported", label(n, i), fmt::join(dil, ", ")));
    if (dilated) attrs["dilation"] = pair(dil[0], dil[1]);
    if (!pads.empty() && (pads.size() != 4 || pads[0] != pads[2] || pads[1] != pads[3]))
      fail(fmt::format("{}: asymmetric pads [{}] are not supported", label(n, i), fmt::join(pads, ", ")));
    attrs["kernel"] = pair(kh, kw);
    const int64_t sh = strides.size() == 2 ? strides[0] : 1, sw = strides.size() == 2 ? strides[1] : 1;
    attrs["stride"] = pair(sh, sw);
    attrs["padding"] = pads.empty() ? OJson(0) : pair(pads[0], pads[1]);
    return attrs;
  }

  // A 1-D window (Conv1d): kernel, stride and padding of the length, as
  // integers (conv_window.hpp reads them as the width's of [C, 1, L]).
  OJson window_1d(const onnx::NodeProto& n, int i, OJson attrs, int64_t k) {
    auto strides = attr_ints(n, "strides");
    auto pads = attr_ints(n, "pads");
    const auto auto_pad = attr_text(n, "auto_pad", "NOTSET");
    if (auto_pad != "NOTSET" && auto_pad != "VALID")
      fail(fmt::format("{}: auto_pad {} is not supported (export with explicit pads)", label(n, i), auto_pad));
    const auto dil = attr_ints(n, "dilations");
    const bool dilated = std::any_of(dil.begin(), dil.end(), [](int64_t d) { return d != 1; });
    if (dilated && (n.op_type() != "Conv" || dil.size() != 1))  // the IR dilates conv2d only
      fail(fmt::format("{}: dilation [{}] is not supported", label(n, i), fmt::join(dil, ", ")));
    if (dilated) attrs["dilation"] = dil[0];
    if (!pads.empty() && (pads.size() != 2 || pads[0] != pads[1]))
      fail(fmt::format("{}: asymmetric pads [{}] are not supported", label(n, i), fmt::join(pads, ", ")));
    attrs["kernel"] = k;
    attrs["stride"] = strides.size() == 1 ? strides[0] : 1;
    attrs["padding"] = pads.empty() ? 0 : pads[0];
    return attrs;
  }

  // Absorbs a following Add of a bias initializer with `out` elements.
  std::optional<int> bias_add_after(const std::string& t, int64_t out) {
    const auto& cons = g_.consumers_of(t);
    if (cons.size() != 1 || !needed_.count(cons[0])) return std::nullopt;
    const auto& a = g_.node(cons[0]);
    if (a.op_type() != "Add" || a.input_size() != 2) return std::nullopt;
    const std::string& other = a.input(0) == t ? a.input(1) : a.input(0);
    if (!g_.is_init(other)) return std::nullopt;
    auto s = g_.shape(other);
    int64_t n = 1;
    for (auto d : *s) n *= d;
    if (n != out || s->empty() || s->back() != out) return std::nullopt;
    return cons[0];
  }

  void map_linear(const onnx::NodeProto& n, int i, const std::string& x, int64_t out, bool bias) {
    const auto name = ir_name_for(n);
    std::string result = n.output(0);
    int absorbed_bias = -1;
    if (!bias)
      if (auto add = bias_add_after(n.output(0), out)) {
        bias = true;
        absorbed_bias = *add;
        absorbed_.insert(*add);
        result = g_.node(*add).output(0);
        carry_batch_fold({n.output(0)}, {result});  // the absorbed Add is not walked: [b m, T, N] stays folded
      }
    OJson a{{"out", out}, {"bias", bias}};
    // A head reading an embedding's own table (GPT-2's lm_head is
    // x @ Transpose(wte)) shares its weight: the linear is tied to it.
    std::string w = n.input_size() > 1 ? n.input(1) : std::string();
    if (int p = g_.producer_of(w); p >= 0 && g_.node(p).op_type() == "Transpose") w = g_.node(p).input(0);
    if (auto e = embedding_of_table_.find(w); e != embedding_of_table_.end()) a["tie"] = e->second;
    emit(name, "linear", {ir_of(x, n, i)}, a, result, n.name());
    if (!a.contains("tie"))
      weigh("weight", n.op_type() == "Gemm" ? WeightRef{n.input(1), attr_int(n, "transB", 0) == 0}
                                            : g_.matmul_weight_ref(n.input(1)));
    if (bias) {
      const auto* add = absorbed_bias >= 0 ? &g_.node(absorbed_bias) : nullptr;
      weigh("bias", WeightRef{!add ? n.input(2) : add->input(0) == n.output(0) ? add->input(1) : add->input(0)});
    }
  }

  // The indices a table is read with when they are not the model's input:
  // positions offset, offset + 1, ..., offset + T-1 (OPT's learned positions
  // start at row 2), or one row for every position (BERT's token_type_ids
  // default to a buffer of zeros, expanded to [b, T]). Indices that are
  // neither, or that the importer could not evaluate, are refused, naming
  // the node: assuming 0..T-1 would train the wrong rows.
  PosTable table_read(const onnx::NodeProto& n, int i, int64_t rows) const {
    const auto v = g_.values(n.input(1));
    if (!v || v->empty())
      fail(fmt::format("{}: reads table '{}' at indices computed in the graph that dlplan could not evaluate at "
                       "import (an op its constant folding lacks); the rows it reads are unknown",
                       label(n, i), n.input(0)));
    const auto s = g_.shape(n.input(1));
    const int64_t per = s && s->size() >= 2 ? s->back() : static_cast<int64_t>(v->size());
    const double first = (*v)[0];
    bool positions = per > 0, same = true;
    for (size_t k = 0; k < v->size(); ++k) {
      positions = positions && (*v)[k] == first + static_cast<double>(static_cast<int64_t>(k) % per);
      same = same && (*v)[k] == first;
    }
    PosTable t{rows, std::nullopt, 0, n.input(0)};
    if (first < 0 || first >= static_cast<double>(rows)) positions = same = false;
    if (positions && per > 1 && first + static_cast<double>(per) <= static_cast<double>(rows)) {
      t.offset = static_cast<int64_t>(first);
      return t;
    }
    if (same) {
      t.row = static_cast<int64_t>(first);
      return t;
    }
    fail(fmt::format("{}: reads table '{}' at constant indices that are neither consecutive positions nor one row "
                     "of it for every position; such a lookup is not supported",
                     label(n, i), n.input(0)));
  }

  // The per-sample shape of a learned tensor `t` that a Mul applies to `x`
  // (ConvNeXt's layer_scale [C, 1, 1]): a float initializer torch named after
  // a module parameter (its own constants are 'onnx::...'), which broadcasts to
  // x without growing it. Nothing when it is not one.
  std::optional<Dims> learned_scale(const std::string& t, const std::string& x) const {
    if (!g_.is_learned(t) || !g_.shape(t)) return std::nullopt;
    return broadcast_per_sample(*g_.shape(t), x);
  }

  // nn.PReLU's slope: an initializer, or for an image (PReLU(C) on
  // [b, C, H, W]) the initializer [C] through an Unsqueeze to [C, 1, 1]. The
  // initializer and the slope's per-sample shape; nothing for other slopes.
  std::optional<std::pair<std::string, Dims>> prelu_slope(const std::string& t, const std::string& x) const {
    if (const auto s = learned_scale(t, x)) return std::make_pair(t, *s);
    const int p = g_.producer_of(t);
    if (p < 0 || g_.node(p).op_type() != "Unsqueeze" || !g_.is_learned(g_.node(p).input(0)) || !g_.shape(t))
      return std::nullopt;
    if (const auto s = broadcast_per_sample(*g_.shape(t), x)) return std::make_pair(g_.node(p).input(0), *s);
    return std::nullopt;
  }

  // `gamma` as a learned tensor multiplying x [b, ...] per sample: without a
  // leading batch axis of 1, and broadcasting to x's per-sample shape.
  std::optional<Dims> broadcast_per_sample(Dims gamma, const std::string& x) const {
    const auto full = g_.shape(x);
    if (!full || full->size() < 2) return std::nullopt;
    if (gamma.size() == full->size()) {  // [1, C, 1, 1]: a leading batch axis of 1
      if (gamma[0] != 1) return std::nullopt;
      gamma.erase(gamma.begin());
    }
    const Dims xs(full->begin() + 1, full->end());
    if (gamma.empty() || gamma.size() > xs.size()) return std::nullopt;
    for (auto d : xs)
      if (d <= 0) return std::nullopt;
    if (broadcast_shape(Shape(xs.begin(), xs.end()), Shape(gamma.begin(), gamma.end())) != Shape(xs.begin(), xs.end()))
      return std::nullopt;
    return gamma;
  }

  // A Slice bound on an axis of `dim` (positive step), clamped as ONNX does:
  // negative counts from the end, then [0, dim].
  static int64_t slice_bound(double v, int64_t dim) {
    const double b = v < 0 ? v + static_cast<double>(dim) : v;
    return static_cast<int64_t>(std::clamp(b, 0.0, static_cast<double>(dim)));
  }

  // A Slice of one per-sample axis with a positive step and constant bounds
  // (after fold_shape_subgraphs): the axis (of the full shape), [start, end)
  // clamped as ONNX does, and the step. Nothing for any other Slice.
  std::optional<std::tuple<int64_t, int64_t, int64_t, int64_t>> sliced(const onnx::NodeProto& n) const {
    const auto s = g_.shape(n.input(0));
    const auto starts = g_.values(n.input(1)), ends = g_.values(n.input(2));
    std::optional<std::vector<double>> axes, steps;
    if (n.input_size() > 3 && !n.input(3).empty()) axes = g_.values(n.input(3));
    if (n.input_size() > 4 && !n.input(4).empty()) steps = g_.values(n.input(4));
    if (!s || !starts || !ends || starts->size() != 1 || ends->size() != 1) return std::nullopt;
    if ((n.input_size() > 3 && !n.input(3).empty() && (!axes || axes->size() != 1)) ||
        (n.input_size() > 4 && !n.input(4).empty() && (!steps || steps->size() != 1 || !((*steps)[0] >= 1.0) ||
                                                       (*steps)[0] > static_cast<double>(kMaxTensorElements))))
      return std::nullopt;
    const auto step = steps ? static_cast<int64_t>((*steps)[0]) : 1;
    const auto rank = static_cast<int64_t>(s->size());
    for (const auto* v : {&*starts, &*ends})
      if (std::isnan((*v)[0])) return std::nullopt;
    if (axes && !(std::fabs((*axes)[0]) <= static_cast<double>(rank))) return std::nullopt;
    int64_t axis = axes ? static_cast<int64_t>((*axes)[0]) : 0;
    if (axis < 0) axis += rank;
    if (axis < 1 || axis >= rank || (*s)[static_cast<size_t>(axis)] <= 0) return std::nullopt;  // not the batch axis
    const int64_t dim = (*s)[static_cast<size_t>(axis)];
    const int64_t start = slice_bound((*starts)[0], dim), end = slice_bound((*ends)[0], dim);
    if (start >= end) return std::nullopt;
    return std::make_tuple(axis, start, end, step);
  }

  // The per-sample shape a Reshape, Squeeze or Unsqueeze of `x` gives, when
  // shape inference knows both sides (after fold_shape_subgraphs, a view's
  // computed shape is known).
  //
  // Every tensor here is batch-major: sample s is one contiguous block,
  // either because the batch is the first axis ([b, T, D]) or because a
  // reshape folded it into the first axis as its outer factor ([b T, D],
  // GPT-2's Conv1D; `batch_folded_` holds b). A reshape between two
  // batch-major layouts is a reshape of each sample's block, since a
  // reshape never moves data in row-major order. Any other first axis would
  // mix samples, and the node is refused, naming both shapes.
  std::optional<Dims> reshaped(const onnx::NodeProto& n, int i, const std::string& x) {
    const auto in = g_.shape(x), out = g_.shape(n.output(0));
    auto known = [](const std::optional<Dims>& d) {
      return d && !d->empty() && std::all_of(d->begin(), d->end(), [](int64_t v) { return v > 0; });
    };
    if (!known(in) || !known(out)) return std::nullopt;
    if (own_axes(x)) return *out;  // (the element counts agree)
    // (A file may fix its batch at a size other than --micro-batch: the
    // batch is the input's, not the option.)
    const auto f = batch_folded_.find(x);
    const int64_t batch = f != batch_folded_.end() ? f->second : (*in)[0];
    const Dims in_sample = per_sample(x);
    const Dims rest(out->begin() + 1, out->end());
    auto numel = [](const Dims& d) {  // saturates: a hostile shape cannot overflow
      int64_t c = 1;
      for (auto v : d) c = v > 0 && c > kMaxTensorElements / v ? kMaxTensorElements : c * v;
      return c;
    };
    const auto sample_elems = numel(in_sample), rest_elems = numel(rest);
    if ((*out)[0] == batch && rest_elems == sample_elems) return rest;
    // (Compared by division: a hostile file's dimensions could overflow a product.)
    if ((*out)[0] % batch == 0 && sample_elems % rest_elems == 0 && sample_elems / rest_elems == (*out)[0] / batch) {
      batch_folded_[n.output(0)] = batch;
      Dims d = rest;
      d.insert(d.begin(), (*out)[0] / batch);
      return d;
    }
    fail(fmt::format("{}: reshapes [{}] to [{}], which moves the batch axis or mixes samples; dlplan plans per sample, "
                     "so each sample must stay one contiguous block led by the first axis",
                     label(n, i), fmt::join(*in, ", "), fmt::join(*out, ", ")));
  }

  void alias(const onnx::NodeProto& n, int i, const std::string& from) { ir_[n.output(0)] = ir_of(from, n, i); }

  // Why the attention patterns nearby did not match: an unsupported op is
  // often plumbing inside an attention block that was not recognised. The
  // first two misses, and how many more (MaxViT has 22 alike).
  std::string attention_hint() const {
    constexpr size_t kShown = 2;
    std::string hint;
    size_t k = 0;
    for (const auto& [sm, why] : unfused_)
      if (k++ < kShown) hint += fmt::format("; attention not recognised at {}: {}", label(g_.node(sm), sm), why);
    if (unfused_.size() > kShown) hint += fmt::format("; and at {} more Softmax nodes", unfused_.size() - kShown);
    return hint;
  }

  // Why shapes are missing, where shape inference did not run or stopped
  // (a Loop's subgraph: torch.repeat_interleave exports as one).
  std::string inference_hint() const {
    for (const auto& n : notes_pre_)
      if (n.rfind("ONNX shape inference", 0) == 0) return "; " + n;
    return "";
  }

  // An op the importer does not map (or a MatMul of two activations outside
  // a recognised attention): planned as the IR's `opaque` op, with
  // its output (the shape ONNX shape inference gives) and every data input
  // kept for backward (the conservative choice), and named in the notes. No
  // engine trains it. Refused, naming the node, when the output shape is not
  // known or the op has no data input to depend on.
  void unknown(const onnx::NodeProto& n, int i, const std::vector<std::string>& data, bool keep_inputs = true) {
    const auto key = n.domain().empty() || n.domain() == "ai.onnx" ? n.op_type() : n.domain() + "." + n.op_type();
    if (data.empty())
      fail(fmt::format("{}: op '{}' is not supported and has no data input to plan through{}", label(n, i), key,
                       weights_alone(n)));
    const auto out = g_.shape(n.output(0));
    const Dims ps = per_sample(n.output(0));
    if (!out || ps.empty() || std::any_of(ps.begin(), ps.end(), [](int64_t d) { return d <= 0; }))
      fail(fmt::format(
          "{}: op '{}' is not supported, and ONNX shape inference does not give its output's shape{}, so "
          "it cannot be planned even as an opaque op{}{}",
          label(n, i), key, out ? fmt::format(" (got [{}])", fmt::join(*out, ", ")) : "", attention_hint(),
          inference_hint()));
    if (!is_float(g_.dtype(n.output(0))))
      fail(
          fmt::format("{}: op '{}' is not supported, and its output is not floating point, so it cannot be planned "
                      "as an opaque op",
                      label(n, i), key));
    // Products are checked against the tensor limit before they can overflow
    // (a fuzzed file once multiplied past int64); the sums below then stay
    // far below it (limits.hpp: 2^48 elements a tensor, 2^20 nodes).
    auto too_large = [&](const char* what) {
      fail(fmt::format("{}: {} of op '{}' has more than {} elements", label(n, i), what, key, kMaxTensorElements));
    };
    int64_t elems = 1;
    for (auto d : ps) {
      if (elems > kMaxTensorElements / d) too_large("the output");
      elems *= d;
    }
    auto& u = unknown_[key];
    u.count += 1;
    u.bytes += elems * 4;  // planned in the compute dtype; fp32 here
    for (const auto& t : n.input())
      if (g_.is_init(t) && is_float(g_.dtype(t))) {
        const Dims s = g_.shape(t).value();
        int64_t c = 1;
        for (auto d : s) {
          if (d < 0 || (d > 0 && c > kMaxTensorElements / d)) too_large("an initializer");
          c *= d;
        }
        u.params += c;
      }
    std::vector<std::string> ins;
    for (const auto& t : data) ins.push_back(ir_of(t, n, i));
    OJson a{{"shape", ps}, {"source", key}};
    if (!keep_inputs) {
      a["keep_inputs"] = false;
      u.keeping_nothing += 1;
    }
    emit(ir_name_for(n), "opaque", ins, a, n.output(0), n.name());
  }

  // The inputs and outputs the fusions and mappings index, checked for every
  // node before either runs: a file whose nodes were not verified against
  // their schemas (no opset declared) can hold fewer. Every op reads at
  // least one input except the sources, and every op writes an output.
  void check_arity(int i) const {
    const auto& n = g_.node(i);
    const auto& op = n.op_type();
    static const std::map<std::string, int> kInputsRead = {{"MatMul", 2},
                                                           {"Gemm", 2},
                                                           {"Conv", 2},
                                                           {"ConvTranspose", 2},
                                                           {"Gather", 2},
                                                           {"SoftmaxCrossEntropyLoss", 2},
                                                           {"BatchNormalization", 1},
                                                           {"LayerNormalization", 1}};
    static const std::set<std::string> kSources = {"Constant", "RandomNormal", "RandomUniform", "SequenceEmpty"};
    const auto it = kInputsRead.find(op);
    const int needed = it != kInputsRead.end() ? it->second : kSources.count(op) ? 0 : 1;
    if (n.input_size() < needed)
      fail(fmt::format("{}: has {} input{}; {} takes {}", label(n, i), n.input_size(), n.input_size() == 1 ? "" : "s",
                       op, it != kInputsRead.end() ? std::to_string(needed) : "at least 1"));
    if (n.output_size() < 1) fail(fmt::format("{}: has no output", label(n, i)));
  }

  void map_node(int i) {
    const auto& n = g_.node(i);
    const auto& op = n.op_type();
    auto data = data_inputs(n);
    if (std::all_of(data.begin(), data.end(), [&](const std::string& t) { return param_views_.count(t) > 0; }))
      if (const auto root = param_view_source(n)) {
        param_views_[n.output(0)] = *root;
        return;
      }
    for (const auto& t : data)
      if (window_tables_.count(t)) return map_window_table(n, i, data, t);
    read_parameters(n, i, data);
    // Computed from tensors without the batch axis alone: none either (known
    // before the mapper runs, which reads its output's per-sample shape).
    if (!data.empty() && std::all_of(data.begin(), data.end(), [&](const std::string& t) { return batch_free_.count(t); }))
      for (const auto& o : n.output())
        if (!o.empty()) once_per_step(o, data);
    if (const auto h = handlers().find(op); h != handlers().end()) return (this->*(h->second))(n, i, data);
    unknown(n, i, data);
  }

  // A node that computes from learned initializers alone (MobileBERT's head
  // weight cat([E^T, W]): a Transpose of the word embeddings, then a Concat
  // with a second weight) reads each as the IR's `parameter`, a tensor
  // without the batch axis, computed once per step. So does a Concat of such
  // tensors and initializers. An op that applies an initializer as its own
  // weight (a MatMul, an Add of a bias) keeps reading it that way.
  void read_parameters(const onnx::NodeProto& n, int i, std::vector<std::string>& data) {
    // (A Gather of a table at constant rows is a position table, an Expand
    // or Tile of one a learned token broadcast: their mappers read the
    // initializer themselves.)
    static const std::set<std::string> kOwnReaders = {"Constant", "Gather", "Expand", "Tile"};
    const bool views = !data.empty() && !kOwnReaders.count(n.op_type()) &&
                       std::all_of(data.begin(), data.end(), [&](const std::string& t) {
                         return param_views_.count(t) || batch_free_.count(t);
                       }) &&
                       std::any_of(data.begin(), data.end(), [&](const std::string& t) { return param_views_.count(t); });
    if (views)
      for (const auto& t : data)
        if (param_views_.count(t) && !ir_.count(t)) materialize_view(n, t);
    const bool alone = data.empty() && !kOwnReaders.count(n.op_type());
    const bool parts = n.op_type() == "Concat" && !data.empty() &&
                       std::all_of(data.begin(), data.end(), [&](const std::string& t) { return batch_free_.count(t); });
    if (!alone && !parts) return;
    // A product of a constant tensor the graph computed (Swin V2's table of
    // coordinates, through its position-bias MLP) has no IR form yet.
    if (alone && (n.op_type() == "MatMul" || n.op_type() == "Gemm"))
      for (const auto& t : n.input())
        if (!t.empty() && !g_.is_learned(t) && g_.is_const(t) && is_float(g_.dtype(t)))
          fail(fmt::format("{}: multiplies constant tensor '{}' by parameters, a tensor without the batch axis "
                           "computed once per step from a constant, which dlplan's IR cannot hold yet (it holds "
                           "such tensors computed from parameters alone)",
                           label(n, i), t));
    std::vector<std::string> read;
    for (const auto& t : n.input()) {
      if (!t.empty() && g_.is_learned(t)) {
        parameter_node(t);
        read.push_back(t);
      } else if (std::find(data.begin(), data.end(), t) != data.end()) {
        read.push_back(t);
      }
    }
    if (read.size() > data.size()) data = read;
  }

  // The IR `parameter` that holds learned initializer t (one per initializer;
  // tied to the embedding that reads the same table, MobileBERT's).
  void parameter_node(const std::string& t) {
    if (ir_.count(t) || !g_.shape(t)) return;
    std::string base = normalize(t);
    if (base.size() > 7 && base.compare(base.size() - 7, 7, ".weight") == 0) base.resize(base.size() - 7);
    once_per_step(t, {});
    OJson a{{"shape", per_sample(t)}};
    const auto table = embedding_of_table_.find(t);
    if (table != embedding_of_table_.end()) a["tie"] = table->second;
    emit(unique_name(base), "parameter", {}, a, t, t);
    if (table == embedding_of_table_.end()) weigh("weight", WeightRef{t});
  }

  // Marks ONNX tensor t as computed once per step from `from` (nothing: a
  // parameter). A leading axis of 1 stands for the batch, as a [1, N, C]
  // position table's (PVT's) does where it meets [b, N, C]: the IR tensor
  // is then [N, C], without that axis (unit_batch_). So is the axis of an
  // op's output when its inputs have it, or lack it with fewer axes.
  void once_per_step(const std::string& t, const std::vector<std::string>& from) {
    batch_free_.insert(t);
    const auto s = g_.shape(t);
    if (!s || s->size() < 2 || (*s)[0] != 1) return;
    bool unit = from.empty();
    for (const auto& f : from) {
      if (unit_batch_.count(f)) unit = true;
      else if (const auto fs = g_.shape(f); !fs || fs->size() >= s->size()) return;
    }
    if (unit) unit_batch_.insert(t);
  }

  // Operand t of a broadcasting op (Add, Mul, Sub, Div, MatMul) whose other
  // operand carries the batch axis. ONNX aligns shapes from the last axis,
  // so where a tensor without the batch axis (not unit_batch_) has as many
  // axes as the output, its leading ones align with the batch axis or
  // before it: they must be 1, and the IR reads it without them (a [1, 1, D]
  // gate on [b, T, D] is [1, D] beside the per-sample [T, D]).
  const std::string& operand(const std::string& t, const onnx::NodeProto& n, int i) {
    const auto s = g_.shape(t), y = g_.shape(n.output(0));
    const bool mixed = std::any_of(n.input().begin(), n.input().end(), [&](const std::string& o) {
      return !o.empty() && !g_.is_const(o) && !batch_free_.count(o) && !param_views_.count(o);
    });
    if (!mixed || !own_axes(t) || !s || !y || s->size() < y->size() || y->empty())
      return ir_of(t, n, i);
    const size_t lead = s->size() - y->size() + 1;
    for (size_t k = 0; k < lead; ++k)
      if ((*s)[k] != 1)
        fail(fmt::format("{}: operand '{}' [{}] is computed once per step, and its axis {} of {} aligns with the "
                         "batch axis or before it", label(n, i), t, fmt::join(*s, ", "), k, (*s)[k]));
    Dims rest(s->begin() + static_cast<std::ptrdiff_t>(lead), s->end());
    if (rest.empty()) rest = {1};
    const std::string aligned = t + "#per_sample";
    if (!ir_.count(aligned))
      emit(unique_name(normalize(t) + ".per_sample"), "reshape", {ir_of(t, n, i)}, OJson{{"shape", rest}}, aligned,
           n.name());
    return ir_.at(aligned);
  }

  // A view of a parameter (param_view_source) read by an op that is no view
  // (PVT's position table reshaped to [1, H, W, C], then permuted): the
  // parameter, then the IR's reshape to the view's shape.
  void materialize_view(const onnx::NodeProto& n, const std::string& view) {
    const std::string& root = param_views_.at(view);
    parameter_node(root);
    if (!ir_.count(root)) return;  // (no shape: the reader's ir_of names the view)
    once_per_step(view, {root});
    const Dims to = per_sample(view);
    if (to == per_sample(root)) {
      ir_[view] = ir_.at(root);
      return;
    }
    emit(unique_name(normalize(view)), "reshape", {ir_.at(root)}, OJson{{"shape", to}}, view, n.name());
  }

  // The node's first data input; an error naming the node when it has none.
  const std::string& first_data(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) const {
    if (data.empty()) fail(fmt::format("{}: has no data input{}", label(n, i), weights_alone(n)));
    return data[0];
  }

  // A learned initializer given another shape in the graph, its elements in
  // the same order: Unsqueeze, Squeeze, Reshape, Flatten, Identity, and a
  // Transpose that moves only axes of size 1. DeBERTa adds its q_bias to the
  // queries as transpose_for_scores(q_bias[None, None, :]): [D] viewed as
  // [1, 1, H, d], permuted to [1, H, 1, d]. The Add or Mul that applies such
  // a view to an activation is the IR's shift or scale over the view's shape
  // (map_arithmetic), and its weights are the initializer's, read in order.
  // The initializer the node's output holds; nothing for any other node.
  std::optional<std::string> param_view_source(const onnx::NodeProto& n) const {
    // (Cast: BART's final_logits_bias.to(logits.dtype), float to float.)
    static const std::set<std::string> kViews = {"Unsqueeze", "Squeeze", "Reshape", "Flatten",
                                                 "Identity", "Transpose", "Cast"};
    if (!kViews.count(n.op_type()) || n.input_size() < 1 || n.output_size() < 1) return std::nullopt;
    const std::string& src = n.input(0);
    if (n.op_type() == "Cast" && (!is_float(g_.dtype(src)) || g_.dtype(src) != g_.dtype(n.output(0))))
      return std::nullopt;
    std::string root;
    if (g_.is_learned(src)) root = src;
    else if (const auto v = param_views_.find(src); v != param_views_.end()) root = v->second;
    else return std::nullopt;
    for (int k = 1; k < n.input_size(); ++k)
      if (!n.input(k).empty() && !g_.is_const(n.input(k))) return std::nullopt;
    const auto in = g_.shape(src), out = g_.shape(n.output(0));
    auto count = [](const Dims& d) -> std::optional<int64_t> {
      int64_t c = 1;
      for (auto e : d) {
        if (e <= 0 || c > kMaxTensorElements / e) return std::nullopt;
        c *= e;
      }
      return c;
    };
    if (!in || !out || !count(*in) || count(*in) != count(*out)) return std::nullopt;
    if (n.op_type() == "Transpose") {
      auto perm = attr_ints(n, "perm");
      if (perm.empty())
        for (auto k = static_cast<int64_t>(in->size()); k-- > 0;) perm.push_back(k);
      if (perm.size() != in->size()) return std::nullopt;
      int64_t last = -1;  // the axes longer than 1 keep their order
      for (auto p : perm) {
        if (p < 0 || p >= static_cast<int64_t>(in->size())) return std::nullopt;
        if ((*in)[static_cast<size_t>(p)] == 1) continue;
        if (p < last) return std::nullopt;
        last = p;
      }
    }
    return root;
  }

  // Why a node without a data input cannot be planned, when it reads
  // parameters: a Gather, Expand or Tile of an initializer is read by its own
  // mapper (a position table, a learned token broadcast), which did not
  // match; other ops read such inputs as the IR's `parameter` (read_parameters).
  std::string weights_alone(const onnx::NodeProto& n) const {
    std::vector<std::string> read;
    for (const auto& t : n.input())
      if (!t.empty() && g_.is_learned(t)) read.push_back("'" + t + "'");
    if (read.empty()) return "";
    return fmt::format(": it reads parameter{} {} alone, which dlplan maps for this op only as a position table read "
                       "at constant rows or a learned token broadcast over the batch",
                       read.size() > 1 ? "s" : "", fmt::join(read, ", "));
  }

  using Handler = void (Importer::*)(const onnx::NodeProto&, int, const std::vector<std::string>&);

  // ONNX op type -> its mapping; an op not here is planned as opaque (unknown).
  static const std::map<std::string, Handler>& handlers() {
    static const std::map<std::string, Handler> table = {
        {"Identity", &Importer::map_identity},
        {"Cast", &Importer::map_identity},
        {"Pad", &Importer::map_pad},
        {"Dropout", &Importer::map_dropout},
        {"Gemm", &Importer::map_gemm},
        {"MatMul", &Importer::map_mat_mul},
        {"Conv", &Importer::map_conv},
        {"ConvTranspose", &Importer::map_conv_transpose},
        {"BatchNormalization", &Importer::map_batch_normalization},
        {"LayerNormalization", &Importer::map_layer_normalization},
        {"Clip", &Importer::map_clip},
        {"Max", &Importer::map_max_min},
        {"Where", &Importer::map_where},
        {"Min", &Importer::map_max_min},
        {"HardSwish", &Importer::map_hard_swish},
        {"HardSigmoid", &Importer::map_hard_sigmoid},
        {"Relu", &Importer::map_activation},
        {"Tanh", &Importer::map_activation},
        {"LeakyRelu", &Importer::map_activation},
        {"Elu", &Importer::map_activation},
        {"Softplus", &Importer::map_activation},
        {"PRelu", &Importer::map_prelu},
        {"Pow", &Importer::map_pow},
        {"Sqrt", &Importer::map_unary_math},
        {"Erf", &Importer::map_unary_math},
        {"Acos", &Importer::map_unary_math},
        {"Softmax", &Importer::map_softmax},
        {"Neg", &Importer::map_neg},
        {"Reciprocal", &Importer::map_unary_math},
        {"Sigmoid", &Importer::map_activation},
        {"Gelu", &Importer::map_gelu},
        {"FastGelu", &Importer::map_gelu},
        {"Gather", &Importer::map_gather},
        {"Add", &Importer::map_arithmetic},
        {"Mul", &Importer::map_arithmetic},
        {"Sub", &Importer::map_arithmetic},
        {"Div", &Importer::map_arithmetic},
        {"Slice", &Importer::map_slice},
        {"Split", &Importer::map_split},
        {"Transpose", &Importer::map_transpose},
        {"MaxPool", &Importer::map_pool},
        {"AveragePool", &Importer::map_pool},
        {"ReduceMean", &Importer::map_reduce_mean},
        {"ReduceSum", &Importer::map_reduce_mean},
        {"ReduceL2", &Importer::map_reduce_l2},
        {"GlobalAveragePool", &Importer::map_global_average_pool},
        {"Resize", &Importer::map_resize},
        {"Flatten", &Importer::map_reshape},
        {"Reshape", &Importer::map_reshape},
        {"Squeeze", &Importer::map_reshape},
        {"Unsqueeze", &Importer::map_reshape},
        {"Expand", &Importer::map_expand},
        {"Tile", &Importer::map_expand},
        {"Concat", &Importer::map_concat},
        {"SoftmaxCrossEntropyLoss", &Importer::map_softmax_cross_entropy_loss}};
    return table;
  }

  // Identity, Cast
  void map_identity(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    // Positions read from a table and cast to the embeddings' float type
    // (BART's learned positions, `.to(inputs_embeds.dtype)`): the same read.
    if (const auto t = pos_tables_.find(n.input(0)); t != pos_tables_.end() && is_float(g_.dtype(n.output(0)))) {
      pos_tables_.emplace(n.output(0), t->second);
      return;
    }
    return alias(n, i, first_data(n, i, data));
  }

  void map_pad(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    // all-zero pads: torch's avg_pool2d exports one before AveragePool
    if (n.input_size() >= 2) {
      const auto pads = g_.values(n.input(1));
      if (pads && std::all_of(pads->begin(), pads->end(), [](double v) { return v == 0.0; }))
        return alias(n, i, first_data(n, i, data));
      // F.avg_pool2d(x, k, s, padding=p) with count_include_pad (Inception-v3)
      // exports as Pad(zeros, H and W by p on both sides) + AveragePool
      // without pads: the IR's avgpool2d with padding p, which divides by
      // k*k, counting the zeros, as the pair does.
      const auto s = g_.shape(n.input(0));
      const auto& users = g_.consumers_of(n.output(0));
      const auto fill = n.input_size() >= 3 && !n.input(2).empty() ? g_.scalar(n.input(2)) : std::optional<double>(0.0);
      if (pads && s && s->size() == 4 && pads->size() == 8 && attr_text(n, "mode", "constant") == "constant" &&
          fill && *fill == 0.0 && users.size() == 1 && g_.node(users[0]).op_type() == "AveragePool") {
        const auto& p = *pads;  // [N, C, H, W begins, N, C, H, W ends]
        const auto small = [&s](double v) {  // a whole number of rows or columns, no more than the plane has
          return v >= 0 && v <= static_cast<double>((*s)[2] + (*s)[3]) && v == std::floor(v);
        };
        const bool spatial = p[0] == 0 && p[1] == 0 && p[4] == 0 && p[5] == 0 && p[2] == p[6] && p[3] == p[7] &&
                             small(p[2]) && small(p[3]);
        const auto pool_pads = attr_ints(g_.node(users[0]), "pads");
        if (spatial && std::all_of(pool_pads.begin(), pool_pads.end(), [](int64_t v) { return v == 0; })) {
          padded_for_pool_[n.output(0)] = {static_cast<int64_t>(p[2]), static_cast<int64_t>(p[3])};
          return alias(n, i, first_data(n, i, data));
        }
      }
      // F.pad(x, pads, "constant", v) off the batch axis (Hugging Face's
      // MobileNets' TensorFlow "same" padding): the IR's pad, a new tensor
      // that keeps nothing for backward.
      const auto full = g_.shape(n.input(0));
      const bool axes_given = n.input_size() >= 4 && !n.input(3).empty();
      if (pads && full && !full->empty() && pads->size() == 2 * full->size() && !axes_given &&
          attr_text(n, "mode", "constant") == "constant" && fill && batch_axes(n.input(0)) == 1 &&
          !batch_second_.count(n.input(0)) && data.size() == 1 && data[0] == n.input(0)) {
        const size_t rank = full->size();
        std::vector<int64_t> per(2 * (rank - 1));
        bool whole = (*pads)[0] == 0 && (*pads)[rank] == 0;  // nothing added along the batch
        for (size_t k = 1; k < rank && whole; ++k) {
          const double b = (*pads)[k], e = (*pads)[rank + k];
          whole = b >= 0 && e >= 0 && b == std::floor(b) && e == std::floor(e);
          per[k - 1] = static_cast<int64_t>(b);
          per[rank - 1 + k - 1] = static_cast<int64_t>(e);
        }
        if (whole)
          return emit(ir_name_for(n), "pad", {ir_of(n.input(0), n, i)}, OJson{{"pads", per}, {"value", *fill}},
                      n.output(0), n.name());
      }
    }
    unknown(n, i, data);
  }

  void map_dropout(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    const std::string& x = first_data(n, i, data);
    double p = attr_float(n, "ratio", 0.5);
    if (n.input_size() > 1 && !n.input(1).empty())
      if (auto v = g_.scalar(n.input(1))) p = *v;
    bool training = true;
    if (n.input_size() > 2 && !n.input(2).empty())
      if (auto v = g_.scalar(n.input(2))) training = *v != 0.0;
    p = std::round(p * 1e6) / 1e6;  // a float32 in the file: 0.1f -> 0.1
    if (p <= 0.0 || !training) return alias(n, i, x);
    return emit(ir_name_for(n), "dropout", {ir_of(x, n, i)}, OJson{{"p", p}}, n.output(0), n.name());
  }

  void map_gemm(const onnx::NodeProto& n, int i, const std::vector<std::string>& /*data*/) {
    if (n.input_size() < 2 || !g_.is_init(n.input(1)) || attr_int(n, "transA", 0) != 0)
      fail(fmt::format("{}: only x @ W (+ b) with W an initializer is supported", label(n, i)));
    auto w = *g_.shape(n.input(1));
    if (w.size() != 2) fail(fmt::format("{}: weight '{}' is not 2-D", label(n, i), n.input(1)));
    const int64_t out = attr_int(n, "transB", 0) ? w[0] : w[1];
    return map_linear(n, i, n.input(0), out, n.input_size() > 2 && !n.input(2).empty());
  }

  void map_mat_mul(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    if (g_.is_init(n.input(1)) && !g_.is_init(n.input(0))) {
      const auto w = g_.matmul_weight(n.input(1));
      if (!w) fail(fmt::format("{}: weight '{}' is not 2-D", label(n, i), n.input(1)));
      return map_linear(n, i, n.input(0), w->second, false);
    }
    if (const auto w = g_.matmul_weight(n.input(1)); w && !g_.is_init(n.input(0)))
      return map_linear(n, i, n.input(0), w->second, false);
    // Two activations outside a recognised attention: the generic matmul,
    // where their per-sample shapes multiply to the output's (else opaque).
    const Dims a = per_sample(n.input(0)), b = per_sample(n.input(1)), y = per_sample(n.output(0));
    if (data.size() == 2 && a.size() >= 2 && b.size() >= 2 && a.back() == b[b.size() - 2]) {
      auto batch = broadcast_shape(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2));
      if (batch) {
        batch->push_back(a[a.size() - 2]);
        batch->push_back(b.back());
      }
      if (batch && *batch == Shape(y.begin(), y.end()))
        return emit(ir_name_for(n), "matmul", {operand(n.input(0), n, i), operand(n.input(1), n, i)}, OJson::object(),
                    n.output(0), n.name());
    }
    return unknown(n, i, data);
  }

  // Softmax over the last axis outside a recognised attention: the generic
  // softmax (another axis: opaque). The axis is read where the file states
  // it (torch always does); absent, opset 13 means the last axis and older
  // opsets axis 1, the last only of a 2-D input.
  void map_softmax(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    const auto s = g_.shape(n.input(0));
    const int64_t rank = s ? static_cast<int64_t>(s->size()) : 0;
    const int64_t axis = attr_int(n, "axis", rank == 2 ? 1 : -2);  // -2: not known to be the last
    if (data.size() == 1 && rank >= 2 && (axis == -1 || axis == rank - 1))
      return emit(ir_name_for(n), "softmax", {ir_of(n.input(0), n, i)}, OJson::object(), n.output(0), n.name());
    return unknown(n, i, data);
  }

  // Neg: -x, an affine with scale -1 (rotate_half in Falcon's and GPT-NeoX's RoPE)
  void map_neg(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    return emit(ir_name_for(n), "affine", {ir_of(first_data(n, i, data), n, i)}, OJson{{"scale", -1.0}, {"shift", 0.0}},
                n.output(0), n.name());
  }

  void map_conv(const onnx::NodeProto& n, int i, const std::vector<std::string>& /*data*/) {
    if (batch_free_.count(n.input(1)))
      fail(fmt::format("{}: its weight '{}' is computed in the graph from parameters (a standardized weight, BiT's), "
                       "and the IR's conv2d reads its weight as a parameter only",
                       label(n, i), n.input(1)));
    auto w = g_.shape(n.input(1));
    if (!g_.is_init(n.input(1)) || !w || (w->size() != 4 && w->size() != 3))
      fail(fmt::format("{}: only 1-D and 2-D convolutions with an initializer weight are supported", label(n, i)));
    OJson a{{"out", (*w)[0]}};
    a = w->size() == 3 ? window_1d(n, i, a, (*w)[2]) : pool_geometry(n, i, a, (*w)[2], (*w)[3]);
    a["groups"] = attr_int(n, "group", 1);
    a["bias"] = n.input_size() > 2 && !n.input(2).empty();
    if (a["bias"].get<bool>()) {
      const auto& b = n.input(2);
      if (b.rfind("onnx::", 0) == 0 || b.find("fused") != std::string::npos) {
        folded_convs_ += 1;
        folded_channels_ += (*w)[0];
      }
    }
    emit(ir_name_for(n), "conv2d", {ir_of(n.input(0), n, i)}, a, n.output(0), n.name());
    weigh("weight", WeightRef{n.input(1)});
    if (a["bias"].get<bool>()) weigh("bias", WeightRef{n.input(2)});
  }

  // nn.ConvTranspose2d / ConvTranspose1d: weight [C, out/group, kh, kw] (or
  // [C, out/group, k]), the window's kernel, strides and pads as Conv's, and
  // output_padding. torch writes no output_shape; one (where ONNX derives
  // the pads from it, possibly uneven) is refused, naming the node.
  void map_conv_transpose(const onnx::NodeProto& n, int i, const std::vector<std::string>& /*data*/) {
    auto w = g_.shape(n.input(1));
    if (!g_.is_init(n.input(1)) || !w || (w->size() != 4 && w->size() != 3))
      fail(fmt::format("{}: only 1-D and 2-D transposed convolutions with an initializer weight are supported",
                       label(n, i)));
    if (!attr_ints(n, "output_shape").empty())
      fail(fmt::format("{}: a transposed convolution given an output_shape is not supported (export with pads "
                       "and output_padding, as torch.onnx.export does)", label(n, i)));
    const int64_t group = attr_int(n, "group", 1);
    OJson a{{"out", (*w)[1] * group}};
    a = w->size() == 3 ? window_1d(n, i, a, (*w)[2]) : pool_geometry(n, i, a, (*w)[2], (*w)[3]);
    a["groups"] = group;
    const std::vector<int64_t> extra = attr_ints(n, "output_padding");
    if (!extra.empty()) a["output_padding"] = extra.size() == 1 ? OJson(extra[0]) : OJson(extra);
    a["bias"] = n.input_size() > 2 && !n.input(2).empty();
    emit(ir_name_for(n), "conv_transpose2d", {ir_of(n.input(0), n, i)}, a, n.output(0), n.name());
    weigh("weight", WeightRef{n.input(1)});
    if (a["bias"].get<bool>()) weigh("bias", WeightRef{n.input(2)});
  }

  void map_batch_normalization(const onnx::NodeProto& n, int i, const std::vector<std::string>& /*data*/) {
    const double onnx_momentum = attr_float(n, "momentum", 0.9);
    // ONNX keeps momentum of the running average (0.9); PyTorch the new sample's weight (0.1). Rounded
    // to 6 digits: the attribute is a float32.
    OJson a{{"eps", attr_float(n, "epsilon", 1e-5)}, {"momentum", std::round((1.0 - onnx_momentum) * 1e6) / 1e6}};
    bn_layers_ += 1;
    emit(ir_name_for(n), "batchnorm", {ir_of(n.input(0), n, i)}, a, n.output(0), n.name());
    weigh("weight", WeightRef{n.input(1)});
    weigh("bias", WeightRef{n.input(2)});
  }

  void map_layer_normalization(const onnx::NodeProto& n, int i, const std::vector<std::string>& /*data*/) {
    // From `axis` on: nn.LayerNorm([C, H, W]) on [b, C, H, W] is axis 1, the
    // IR's dims 3 (the trailing axes normalised together); never the batch.
    const auto s = g_.shape(n.input(0));
    int64_t axis = attr_int(n, "axis", -1);
    const auto rank = s ? static_cast<int64_t>(s->size()) : 0;
    if (axis < 0) axis += rank;
    if (!s || axis < 1 || axis >= rank)
      fail(fmt::format("{}: normalises from axis {} of a {}-D input; dlplan normalises per sample, after the batch "
                       "axis", label(n, i), attr_int(n, "axis", -1), rank));
    OJson a{{"eps", attr_float(n, "epsilon", 1e-5)}, {"bias", n.input_size() > 2 && !n.input(2).empty()}};
    if (rank - axis > 1) a["dims"] = rank - axis;
    emit(ir_name_for(n), "layernorm", {ir_of(n.input(0), n, i)}, a, n.output(0), n.name());
    weigh("weight", WeightRef{n.input(1)});
    if (a["bias"].get<bool>()) weigh("bias", WeightRef{n.input(2)});
  }

  void map_clip(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    const std::string& x = first_data(n, i, data);
    // torch exports ReLU6 and Hardtanh as Clip. Its bounds are inputs from
    // opset 11 (attributes before); an absent bound is unbounded.
    auto bound = [&](int input, const char* attr, double unbounded) {
      if (n.input_size() > input && !n.input(input).empty()) {
        const auto v = g_.scalar(n.input(input));
        if (!v) fail(fmt::format("{}: its {} '{}' is not a constant", label(n, i), attr, n.input(input)));
        return *v;
      }
      return attr_float(n, attr, unbounded);
    };
    const double inf = std::numeric_limits<double>::infinity();
    const double lo = bound(1, "min", -inf), hi = bound(2, "max", inf);
    if (lo == 0.0 && hi == inf)
      return emit(ir_name_for(n), "relu", {ir_of(x, n, i)}, OJson::object(), n.output(0), n.name());
    // One-sided (F.normalize's clamp_min(eps)): the other bound the largest
    // float, as map_max_min's; clamp_min keeps its input, as clip does.
    const double big = std::numeric_limits<float>::max();
    const double low = std::isfinite(lo) ? lo : -big, high = std::isfinite(hi) ? hi : big;
    if ((std::isfinite(lo) || std::isfinite(hi)) && low < high)
      return emit(ir_name_for(n), "clip", {ir_of(x, n, i)}, OJson{{"min", low}, {"max", high}}, n.output(0),
                  n.name());
    return unknown(n, i, data);  // unbounded or empty: planned as an opaque op, and noted
  }

  // torch.max(x, c) with c a constant scalar (OPT clamps its masked scores at
  // finfo.min): a one-sided clip, the other bound the largest float. Both keep
  // x (derivatives.yaml: maximum's gradient masks by self and other, the
  // 0-dim other costing nothing).
  void map_max_min(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    if (data.size() != 1 || n.input_size() != 2) return unknown(n, i, data);
    const std::string& x = data[0];
    const auto c = g_.scalar(n.input(n.input(0) == x ? 1 : 0));
    if (!c || !std::isfinite(*c)) return unknown(n, i, data);
    const double big = std::numeric_limits<float>::max();
    const bool max = n.op_type() == "Max";
    return emit(ir_name_for(n), "clip", {ir_of(x, n, i)}, OJson{{"min", max ? *c : -big}, {"max", max ? big : *c}},
                n.output(0), n.name());
  }

  // torch.where(causal, x, c) with `causal` a constant mask that keeps each
  // key j <= query i of x's scores [..., T, T] and c a constant scalar
  // (GPT-NeoX, BLOOM): the causal_mask that fills with c. Keeps nothing (the
  // mask is a constant; derivatives.yaml keeps where's condition only).
  void map_where(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    if (data.size() != 1 || n.input_size() != 3 || n.input(0) == data[0]) return unknown(n, i, data);
    const bool x_if_true = n.input(1) == data[0];
    const auto c = g_.scalar(n.input(x_if_true ? 2 : 1));
    const auto cond = g_.values(n.input(0));
    if (!c || !std::isfinite(*c) || !cond) return unknown(n, i, data);
    // keep x where the mask says so: cond where x is the true branch, else its negation
    std::vector<double> added(cond->size());
    for (size_t e = 0; e < cond->size(); ++e) added[e] = ((*cond)[e] != 0) == x_if_true ? 0.0 : 1.0;
    // A mask that fills nothing (DeBERTa's XSoftmax under an attention mask
    // of ones, the default when none is given) leaves x as it is: a no-op,
    // as an Add of zeros, when the output has x's shape.
    if (std::all_of(added.begin(), added.end(), [](double a) { return a == 0.0; }) && g_.shape(n.output(0)) &&
        g_.shape(n.output(0)) == g_.shape(data[0])) {
      constant_elementwise_ += 1;
      return alias(n, i, data[0]);
    }
    const auto cm = causal_mask_value(n.input(0), added, data[0]);
    if (!cm || !per_sample_axis(data[0], cm->query_axis)) return unknown(n, i, data);
    OJson a = causal_mask_attrs(*cm, data[0]);
    a["value"] = *c;
    a["fill"] = true;
    return emit(ir_name_for(n), "causal_mask", {ir_of(data[0], n, i)}, a, n.output(0), n.name());
  }

  void map_hard_swish(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    // x HardSigmoid(x) with alpha 1/6, beta 1/2: PyTorch's Hardswish

    return emit(ir_name_for(n), "hardswish", {ir_of(first_data(n, i, data), n, i)}, OJson::object(), n.output(0),
                n.name());
  }

  void map_hard_sigmoid(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    // max(0, min(1, alpha x + beta)); other alphas and betas are opaque
    if (!is_torch_hardsigmoid(n)) return unknown(n, i, data);
    return emit(ir_name_for(n), "hardsigmoid", {ir_of(first_data(n, i, data), n, i)}, OJson::object(), n.output(0),
                n.name());
  }

  // Relu, Tanh, Sigmoid
  // Relu, Tanh, Sigmoid, LeakyRelu (alpha: the slope), Elu (alpha), Softplus
  void map_activation(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    const auto& op = n.op_type();
    OJson a = OJson::object();
    std::string irop = op == "Relu" ? "relu" : op == "Tanh" ? "tanh" : op == "Sigmoid" ? "sigmoid" : "";
    if (op == "LeakyRelu") irop = "leaky_relu", a["slope"] = attr_float(n, "alpha", 0.01);
    if (op == "Elu") irop = "elu", a["alpha"] = attr_float(n, "alpha", 1.0);
    if (op == "Softplus") irop = "softplus";
    return emit(ir_name_for(n), irop.c_str(), {ir_of(first_data(n, i, data), n, i)}, a, n.output(0), n.name());
  }

  // PRelu(x, slope) with a learned slope (nn.PReLU: [1], or one a channel,
  // [C, 1, 1] for an image); any other slope is planned as opaque.
  void map_prelu(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    if (data.size() != 1 || n.input_size() != 2 || n.input(0) != data[0]) return unknown(n, i, data);
    const auto slope = prelu_slope(n.input(1), data[0]);
    if (!slope) return unknown(n, i, data);
    emit(ir_name_for(n), "prelu", {ir_of(data[0], n, i)}, OJson{{"shape", slope->second}}, n.output(0), n.name());
    return weigh("weight", WeightRef{slope->first});
  }

  // x^p with a constant exponent p (torch.pow(x, 3.0), x.pow(2))
  void map_pow(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    const auto p = g_.scalar(n.input(1));
    if (data.size() != 1 || n.input(0) != data[0] || !p) return unknown(n, i, data);
    return emit(ir_name_for(n), "pow", {ir_of(data[0], n, i)}, OJson{{"exponent", *p}}, n.output(0), n.name());
  }

  // Sqrt, Reciprocal, Erf, Acos
  void map_unary_math(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    const auto& t = n.op_type();
    const char* irop = t == "Sqrt" ? "sqrt" : t == "Erf" ? "erf" : t == "Acos" ? "acos" : "reciprocal";
    return emit(ir_name_for(n), irop, {ir_of(first_data(n, i, data), n, i)}, OJson::object(), n.output(0), n.name());
  }

  // Gelu, FastGelu
  void map_gelu(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    const auto& op = n.op_type();
    const auto approx = op == "FastGelu" ? std::string("tanh") : attr_text(n, "approximate", "none");
    return emit(ir_name_for(n), "gelu", {ir_of(first_data(n, i, data), n, i)}, OJson{{"approximate", approx}},
                n.output(0), n.name());
  }

  void map_gather(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    if (g_.is_init(n.input(0))) {
      auto w = *g_.shape(n.input(0));
      if (w.size() != 2) fail(fmt::format("{}: embedding table '{}' is not 2-D", label(n, i), n.input(0)));
      if (!depends_on_input(n.input(1))) {  // positions: a table added to the token embeddings
        const auto idx = g_.values(n.input(1));  // read once: a [T, T] index of a large window is big
        if (idx)
          if (const auto window = window_of_relative_index(*idx, w[0])) {  // Swin's relative position bias
            window_tables_[n.output(0)] = WindowTable{n.input(0), *window, w[1], false, std::nullopt, 0, n.name(), std::nullopt};
            return;
          }
        if (idx)
          if (const auto window = window_of_relative_index_with_cls(*idx, w[0])) {  // BEiT's, with a class token
            window_tables_[n.output(0)] =
                WindowTable{n.input(0), *window, w[1], false, std::nullopt, 0, n.name(), std::nullopt, true};
            return;
          }
        // T5's relative-position buckets of a [T, T] index (MPNet's, computed in the graph)
        if (idx && g_.shape(n.input(1)) && g_.shape(n.input(1))->size() == 2)
          if (const auto rb = relative_buckets_of_index(*idx, w[0])) {
            window_tables_[n.output(0)] =
                WindowTable{n.input(0), {0, 0}, w[1], false, *rb, (*g_.shape(n.input(1)))[0], n.name(), std::nullopt};
            return;
          }
        pos_tables_[n.output(0)] = table_read(n, i, w[0]);
        return;
      }
      const auto name = ir_name_for(n);
      embedding_of_table_.emplace(n.input(0), name);
      emit(name, "embedding", {ir_of(n.input(1), n, i)}, OJson{{"num", w[0]}, {"dim", w[1]}}, n.output(0), n.name());
      notes_.push_back(
          fmt::format("embedding '{}': an ONNX Gather has no padding_idx, so training updates every row "
                      "of '{}' (PyTorch's nn.Embedding(padding_idx=p) leaves row p's gradient zero)",
                      name, n.input(0)));
      return weigh("weight", WeightRef{n.input(0)});
    }
    auto idx = g_.values(n.input(1));
    const auto idx_shape = g_.shape(n.input(1));
    const int64_t axis = attr_int(n, "axis", 0);
    if (batch_second_.count(n.input(0))) return map_part_of_batch_second(n, i, data);
    const bool folded = batch_folded_.count(n.input(0)) > 0;
    if (axis == 1 && !folded && idx && idx->size() == 1) {
      // x[:, -1] (the last step of an LSTM's output) counts from the end.
      // A view in PyTorch: what keeps it keeps x's storage (--fusion eager).
      const auto xs = g_.shape(n.input(0));
      int64_t k = static_cast<int64_t>((*idx)[0]);
      if (k < 0 && xs && xs->size() > 1 && (*xs)[1] > 0) k += (*xs)[1];
      OJson a{{"index", k}};
      if (fusion_ == FusionMode::eager) a["view"] = true;
      return emit(ir_name_for(n), "select", {ir_of(n.input(0), n, i)}, a, n.output(0), n.name());
    }
    // x[..., k, ...] at a constant k of a later axis (BLOOM's fused query_key_value
    // [b, T, H, 3, hd] read at 0, 1, 2): a slice of width 1, which keeps nothing
    // (derivatives.yaml: select_backward needs only the sizes), and a reshape
    // that drops the axis. x[..., [k], ...] (Falcon's key and value of its
    // fused QKV) keeps the axis: the slice alone.
    const auto xs = g_.shape(n.input(0));
    const auto at_axis = per_sample_axis(n.input(0), axis);
    const bool scalar_index = idx_shape && idx_shape->empty(), one_index = idx_shape && *idx_shape == Dims{1};
    if (at_axis && idx && idx->size() == 1 && (scalar_index || one_index) && xs &&
        axis < static_cast<int64_t>(xs->size()) && g_.shape(n.output(0))) {
      const int64_t extent = (*xs)[static_cast<size_t>(axis)], k = static_cast<int64_t>((*idx)[0]);
      const int64_t at = k < 0 ? k + extent : k;
      if (at >= 0 && at < extent) {
        OJson range{{"axis", *at_axis}, {"start", at}, {"end", at + 1}};
        // x[..., k, ...] is a view in PyTorch; x[..., [k], ...] a copy (index).
        if (fusion_ == FusionMode::eager && scalar_index) range["view"] = true;
        if (one_index) return emit(ir_name_for(n), "slice", {ir_of(n.input(0), n, i)}, range, n.output(0), n.name());
        const std::string sliced = n.output(0) + "#slice";
        emit(ir_name_for(n), "slice", {ir_of(n.input(0), n, i)}, range, sliced, n.name());
        // The axis dropped is part of the same view (select's), under eager:
        // an op keeping x[..., k] keeps x (a TCN's head reading the last step).
        OJson squeeze{{"shape", per_sample(n.output(0))}};
        if (range.contains("view")) squeeze["view"] = true;
        return emit(unique_name(normalize(n.name()) + ".squeeze"), "reshape", {ir_[sliced]}, squeeze, n.output(0),
                    n.name());
      }
    }
    return unknown(n, i, data);
  }

  // Swin's relative position bias between its Gather and the scores (`from`
  // holds the gathered table): views of the gathered [T T, H] rows ([T, T,
  // H], unsqueezed), one permute to [H, T, T], and the Add to the scores
  // [.., H, T, T], which is the IR's window_position_bias of the table. Any
  // other use is refused, naming the node.
  void map_window_table(const onnx::NodeProto& n, int i, const std::vector<std::string>& data,
                        const std::string& from) {
    WindowTable wt = window_tables_.at(from);
    const int64_t T = wt.buckets ? wt.positions : wt.window[0] * wt.window[1] + (wt.cls ? 1 : 0), H = wt.heads;
    const auto& op = n.op_type();
    // Leading 1s dropped, and the batch axis where a mask broadcast the bias
    // over it ([b, H, T, T]: imported at micro-batch b, the mask's rows are
    // alike).
    auto squeezed = [&](const std::string& t) {
      Dims d = g_.shape(t).value_or(Dims{});
      if (d.size() > 3 && d.front() == micro_batch_) d.erase(d.begin());
      while (d.size() > 1 && d.front() == 1) d.erase(d.begin());
      return d;
    };
    const Dims layout = wt.heads_first ? Dims{H, T, T} : Dims{T, T, H};
    // (Expand: MPNet's bias.expand(b, -1, T, T), leading axes only, per sample the same)
    static const std::set<std::string> kViews = {"Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Cast",
                                                 "Expand"};
    if (data.size() == 1 && kViews.count(op)) {
      const Dims out = squeezed(n.output(0));
      if (out == layout || (!wt.heads_first && out == Dims{T * T, H})) {
        window_tables_[n.output(0)] = wt;
        return;
      }
    } else if (data.size() == 1 && op == "Transpose" && !wt.heads_first && g_.shape(from) == Dims{T, T, H} &&
               attr_ints(n, "perm") == std::vector<int64_t>{2, 0, 1}) {
      wt.heads_first = true;
      window_tables_[n.output(0)] = wt;
      return;
    } else if (op == "Add" && data.size() == 1 && n.input_size() == 2) {
      // A mask of zeros added to the bias before the scores (T5's
      // position_bias + mask under an attention mask of ones): the same bias.
      const std::string& other = n.input(0) == from ? n.input(1) : n.input(0);
      const auto v = g_.values(other);
      const Dims out = squeezed(n.output(0));
      const bool same_layout =
          Dims(out.end() - std::min<size_t>(out.size(), 3), out.end()) == layout &&
          std::all_of(out.begin(), out.end() - std::min<size_t>(out.size(), 3), [](int64_t d) { return d == 1; });
      if (v && same_layout && std::all_of(v->begin(), v->end(), [](double e) { return e == 0.0; })) {
        constant_elementwise_ += 1;
        window_tables_[n.output(0)] = wt;
        return;
      }
      // T5's decoder: position_bias + the causal mask (finfo.min above the
      // diagonal), added to the scores of every layer. (s + (b + m)) is
      // (s + b) + m: the bias added, then the mask.
      if (v && same_layout && wt.buckets && wt.heads_first && !wt.causal_fill)
        if (const auto cm = causal_mask_value(other, *v, n.output(0));
            cm && cm->query_axis == static_cast<int64_t>(g_.shape(n.output(0))->size()) - 2) {
          wt.causal_fill = cm->fill;
          window_tables_[n.output(0)] = wt;
          return;
        }
    } else if (op == "Add" && data.size() == 2 && wt.heads_first) {
      const std::string& x = data[0] == from ? data[1] : data[0];
      const Dims px = per_sample(x);
      if (!window_tables_.count(x) && px.size() >= 3 && Dims(px.end() - 3, px.end()) == layout && wt.buckets)
        return map_relative_bucket_bias(n, i, x, wt);
      if (!window_tables_.count(x) && px.size() >= 3 && Dims(px.end() - 3, px.end()) == layout) {
        OJson a{{"window", pair(wt.window[0], wt.window[1])}};
        if (wt.cls) a["cls"] = true;
        emit(ir_name_for(n), "window_position_bias", {ir_of(x, n, i)}, a, n.output(0), n.name());
        last_window_ = wt.window;
        return weigh("table", WeightRef{wt.table});
      }
    }
    if (wt.buckets)
      fail(fmt::format("{}: reads the relative position bias table '{}' (T5's buckets over {} positions, as MPNet's) in "
                       "a way dlplan does not follow: views of the gathered [T, T, heads] rows, one permute to "
                       "[heads, T, T], then an Add to scores [heads, T, T]",
                       label(n, i), wt.table, T));
    fail(fmt::format("{}: reads the relative position bias table '{}' (a {} x {} window's, as Swin's) in a way dlplan "
                     "does not follow: views of the gathered rows, one permute to [heads, T, T], then an Add to "
                     "scores [.., heads, T, T]",
                     label(n, i), wt.table, wt.window[0], wt.window[1]));
  }

  // The scores x plus T5's relative position bias (MPNet's: one table read at
  // the buckets of every key's offset from its query, computed once and added
  // in every layer). The bias is the IR's relative_position_bias of the ids,
  // emitted at its first Add and read by every later one, so its table is
  // counted once; the Add is the IR's add of two [heads, T, T] tensors.
  void map_relative_bucket_bias(const onnx::NodeProto& n, int i, const std::string& x, const WindowTable& wt) {
    const int64_t T = wt.positions;
    auto bias = relative_bias_nodes_.find(wt.table);
    if (bias == relative_bias_nodes_.end()) {
      std::string ids;
      for (const auto& [name, spec] : input_specs_.items())
        if (spec["dtype"] == "i32" && spec["shape"] == OJson::array({T})) {
          ids = name;
          break;
        }
      if (ids.empty())
        fail(fmt::format("{}: adds T5's relative position bias (table '{}', {} positions), which dlplan computes "
                         "from token ids [{}], and the model has no such input",
                         label(n, i), wt.table, T, T));
      const OJson a{{"heads", wt.heads},
                    {"buckets", wt.buckets->buckets},
                    {"max_distance", wt.buckets->max_distance},
                    {"bidirectional", wt.buckets->bidirectional}};
      const std::string name = unique_name(normalize(wt.gather));
      emit(name, "relative_position_bias", {ids}, a, wt.table + "#bias", wt.gather);
      weigh("weight", WeightRef{wt.table});
      const auto& rb = *wt.buckets;
      notes_.push_back(fmt::format(
          "'{}' is T5's relative position bias: its {} buckets ({}directional, max_distance {}) are the file's "
          "indices for every query and key of the {} positions{}",
          name, rb.buckets, rb.bidirectional ? "bi" : "uni", rb.max_distance, T,
          rb.reads_alike_to > rb.reads_alike_from
              ? fmt::format(" (at this length any max_distance from {} to {} reads them alike{})", rb.reads_alike_from,
                            rb.reads_alike_to, rb.max_distance == kT5MaxDistance ? fmt::format("; {} is T5's and MPNet's", kT5MaxDistance) : "")
              : ""));
      bias = relative_bias_nodes_.emplace(wt.table, name).first;
    }
    if (!wt.causal_fill)
      return emit(ir_name_for(n), "add", {ir_of(x, n, i), bias->second}, OJson::object(), n.output(0), n.name());
    const std::string biased = n.output(0) + "#biased";
    emit(ir_name_for(n), "add", {ir_of(x, n, i), bias->second}, OJson::object(), biased, n.name());
    emit(unique_name(normalize(n.name()) + ".causal"), "causal_mask", {ir_[biased]}, OJson{{"value", *wt.causal_fill}},
         n.output(0), n.name());
  }

  // Whether every reader of t takes one part of its first axis at a constant
  // index (Gather, axis 0, a scalar): q, k and v of Swin's fused qkv.
  bool read_by_parts(const std::string& t) const {
    const auto& cons = g_.consumers_of(t);
    return !cons.empty() && std::all_of(cons.begin(), cons.end(), [&](int c) {
      const auto& r = g_.node(c);
      const auto idx = r.op_type() == "Gather" ? g_.values(r.input(1)) : std::nullopt;
      const auto is = r.op_type() == "Gather" ? g_.shape(r.input(1)) : std::nullopt;
      return r.input(0) == t && attr_int(r, "axis", 0) == 0 && idx && idx->size() == 1 && is && is->empty();
    });
  }

  // qkv.permute(2, 0, 3, 1, 4) of [b m, T, 3, H, hd] (or [b, T, 3, H, hd]):
  // the batch lands on axis 1, and each reader then takes one of the 3 parts
  // (read_by_parts), which is batch-major again. Per sample the same permute
  // of [m, T, 3, H, hd] (or, without the batch axis, of [T, 3, H, hd]); the
  // parts are map_part_of_batch_second's.
  void map_batch_second(const onnx::NodeProto& n, int i, const std::string& x, const std::vector<int64_t>& perm) {
    const auto f = batch_folded_.find(x);
    OJson per = OJson::array();
    for (auto p : perm)
      if (f != batch_folded_.end()) per.push_back(p);
      else if (p != 0) per.push_back(p - 1);
    batch_second_[n.output(0)] = f != batch_folded_.end() ? f->second : 0;
    emit(ir_name_for(n), "transpose", {ir_of(x, n, i)}, OJson{{"perm", per}}, n.output(0), n.name());
  }

  // t[k] of a tensor map_batch_second made: per sample a slice of width 1
  // of the first axis and a reshape that drops it. Copies under both
  // fusions: PyTorch's select is a view, but each part's matmul reads it as
  // [b m H, T, hd], which the permuted layout cannot give without a copy (the
  // windows' stride is not the heads' times their count), and keeps that
  // part-sized copy, not the fused qkv's storage. (With b m = 1, Swin's last
  // stage at batch 1, it would keep the storage: 2 of 3 parts more there.)
  void map_part_of_batch_second(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    const std::string& x = n.input(0);
    const auto idx = g_.values(n.input(1));
    const auto xs = g_.shape(x);
    const auto is = g_.shape(n.input(1));
    if (attr_int(n, "axis", 0) != 0 || !idx || idx->size() != 1 || !is || !is->empty() || !xs || (*xs)[0] <= 0)
      return unknown(n, i, data);
    int64_t k = static_cast<int64_t>((*idx)[0]);
    if (k < 0) k += (*xs)[0];
    if (k < 0 || k >= (*xs)[0]) return unknown(n, i, data);
    if (const int64_t b = batch_second_.at(x); b > 0) batch_folded_[n.output(0)] = b;
    const OJson range{{"axis", 0}, {"start", k}, {"end", k + 1}};
    const OJson squeeze{{"shape", per_sample(n.output(0))}};
    const std::string part = n.output(0) + "#slice";
    emit(ir_name_for(n), "slice", {ir_of(x, n, i)}, range, part, n.name());
    emit(unique_name(normalize(n.name()) + ".squeeze"), "reshape", {ir_[part]}, squeeze, n.output(0), n.name());
  }

  // Add, Mul, Sub, Div
  void map_arithmetic(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    const auto& op = n.op_type();
    const std::string& x = first_data(n, i, data);
    if (data.size() == 2) {
      // A learned bias expanded to the other operand's shape, then added
      // (GPT-NeoX-Japanese's bias_dropout_add: bias.expand_as(residual)).
      for (int k = 0; k < 2; ++k)
        if (const auto e = expanded_params_.find(data[static_cast<size_t>(k)]); op == "Add" && e != expanded_params_.end())
          if (const auto beta = learned_scale(e->second, data[static_cast<size_t>(1 - k)])) {
            emit(ir_name_for(n), "shift", {ir_of(data[static_cast<size_t>(1 - k)], n, i)}, OJson{{"shape", *beta}},
                 n.output(0), n.name());
            return weigh("bias", WeightRef{e->second});
          }
      // A learned initializer viewed in another shape (param_view_source),
      // added to or multiplying an activation: a shift or scale of that shape.
      for (int k = 0; k < 2; ++k)
        if (const auto v = param_views_.find(data[static_cast<size_t>(k)]);
            (op == "Add" || op == "Mul") && v != param_views_.end() && !param_views_.count(data[static_cast<size_t>(1 - k)]))
          if (const auto s = broadcast_per_sample(g_.shape(v->first).value(), data[static_cast<size_t>(1 - k)])) {
            emit(ir_name_for(n), op == "Add" ? "shift" : "scale", {ir_of(data[static_cast<size_t>(1 - k)], n, i)},
                 OJson{{"shape", *s}}, n.output(0), n.name());
            return weigh(op == "Add" ? "bias" : "weight", WeightRef{v->second});
          }
      for (int k = 0; k < 2; ++k)
        if (op == "Add" && pos_tables_.count(data[static_cast<size_t>(k)])) {
          const PosTable& t = pos_tables_.at(data[static_cast<size_t>(k)]);
          OJson a{{"max_len", t.rows}};
          if (t.row) a["row"] = *t.row;
          if (t.offset != 0) a["offset"] = t.offset;
          emit(ir_name_for(n), "pos_embedding", {ir_of(data[static_cast<size_t>(1 - k)], n, i)}, a, n.output(0),
               n.name());
          return weigh("weight", WeightRef{t.table});
        }
      if (op == "Add" || op == "Mul")
        return emit(ir_name_for(n), op == "Add" ? "add" : "mul", {operand(data[0], n, i), operand(data[1], n, i)},
                    OJson::object(), n.output(0), n.name());
      // a - b is a + (-1 b); a / b is a (1 / b). Each keeps what PyTorch's
      // keeps (derivatives.yaml: sub nothing; div self and other, here a and
      // 1 / b, the reciprocal's output, of b's size), with one more
      // intermediate of b's size alive while the op runs.
      const std::string b = normalize(n.name()) + (op == "Sub" ? ".neg" : ".reciprocal");
      const std::string b_out = n.output(0) + (op == "Sub" ? "#neg" : "#reciprocal");
      if (op == "Sub")
        emit(unique_name(b), "affine", {operand(data[1], n, i)}, OJson{{"scale", -1.0}, {"shift", 0.0}}, b_out, n.name());
      else
        emit(unique_name(b), "reciprocal", {operand(data[1], n, i)}, OJson::object(), b_out, n.name());
      return emit(ir_name_for(n), op == "Sub" ? "add" : "mul", {operand(data[0], n, i), ir_[b_out]}, OJson::object(),
                  n.output(0), n.name());
    }
    // One data operand and a scalar constant: y = scale x + shift (x * c,
    // x + c, x / c, c - x), or 1 / x. Each keeps nothing but a 0-dim constant
    // (reciprocal: its output), as PyTorch's arithmetic with a Python number.
    if (data.size() == 1 && n.input_size() == 2) {
      const bool data_first = n.input(0) == x;
      if (const auto c = g_.scalar(n.input(data_first ? 1 : 0)); c && std::isfinite(*c)) {
        if (op == "Div" && !data_first) {
          if (*c != 1.0) return unknown(n, i, data);
          return emit(ir_name_for(n), "reciprocal", {ir_of(x, n, i)}, OJson::object(), n.output(0), n.name());
        }
        if (op == "Div" && *c == 0.0) return unknown(n, i, data);
        double scale = 1.0, shift = 0.0;
        if (op == "Mul") scale = *c;
        else if (op == "Div") scale = 1.0 / *c;
        else if (op == "Add") shift = *c;
        else if (data_first) shift = -*c;  // x - c
        else scale = -1.0, shift = *c;     // c - x
        return emit(ir_name_for(n), "affine", {ir_of(x, n, i)}, OJson{{"scale", scale}, {"shift", shift}}, n.output(0),
                    n.name());
      }
    }
    // x (w + c), w learned: a scale with offset c (GemmaRMSNorm's 1 + w, unfused)
    if (op == "Mul" && data.size() == 1)
      for (const auto& t : n.input())
        if (const auto ow = t == x ? std::nullopt : g_.offset_weight(t))
          if (auto gamma = learned_scale(ow->first, x)) {
            emit(ir_name_for(n), "scale", {ir_of(x, n, i)}, OJson{{"shape", *gamma}, {"offset", ow->second}},
                 n.output(0), n.name());
            return weigh("weight", WeightRef{ow->first});
          }
    // One data operand and a constant or initializer.
    for (const auto& t : n.input()) {
      if (!g_.is_init(t)) continue;
      auto s = *g_.shape(t);
      int64_t c = 1;
      for (auto d : s) c *= d;
      if (op == "Mul" && c > 1 && data.size() == 1)
        if (auto gamma = learned_scale(t, data[0])) {  // ConvNeXt's layer_scale
          emit(ir_name_for(n), "scale", {ir_of(data[0], n, i)}, OJson{{"shape", *gamma}}, n.output(0), n.name());
          return weigh("weight", WeightRef{t});
        }
      // A learned position table [1, T, D] or [T, D]: rows of the model's
      // width D, x's last axis.
      const auto xs = g_.shape(x);
      const bool table = s.size() >= 2 && s[s.size() - 2] > 1 && xs && !xs->empty() && s.back() == xs->back();
      // A learned bias added outside a projection, [D], [C, 1, 1] (I-BERT's
      // LayerNorm written out: x * weight + bias) or [C, 1] on [b, C, T]
      // (ConvBERT's separable convolution): the IR's shift.
      if (op == "Add" && data.size() == 1 && !table)
        if (auto beta = learned_scale(t, data[0])) {
          emit(ir_name_for(n), "shift", {ir_of(data[0], n, i)}, OJson{{"shape", *beta}}, n.output(0), n.name());
          return weigh("bias", WeightRef{t});
        }
      if (op == "Add" && table && c > 1) {
        const int64_t len = s[s.size() - 2];
        emit(ir_name_for(n), "pos_embedding", {ir_of(x, n, i)}, OJson{{"max_len", len}}, n.output(0), n.name());
        return weigh("weight", WeightRef{t});
      }
      // Another float initializer (a bias added outside a projection): its
      // values change the math, and a stripped file does not hold them, so
      // the op is opaque, its initializer noted as not counted; it used to be
      // passed through as a no-op, which trained a model without it.
      if (c > 1 && is_float(g_.dtype(t))) return unknown(n, i, data, /*keep_inputs=*/op == "Mul" || op == "Div");
    }
    // A constant tensor whose values the importer knows (a mask of zeros, a
    // RoPE cos table evaluated at import): a no-op only where it is neutral
    // (adding zeros, multiplying by ones); anything else changes the math,
    // which the IR cannot carry, so the op is planned as opaque and no engine
    // trains it, instead of training a model without it.
    // (An initializer operand is noted above as a parameter not counted; its
    // values, absent from a stripped file, are not read here, so that a file
    // plans the same with and without its weights.)
    if (data.size() == 1)
      for (const auto& t : n.input())
        if (t != x && !g_.is_init(t))
          if (const auto v = g_.values(t)) {
            if (const auto ms = g_.shape(t); op == "Add" && ms)
              if (const auto sp = sinusoidal_table(*v, *ms, per_sample(x))) {  // XGLM's positions
                return emit(ir_name_for(n), "pos_embedding", {ir_of(x, n, i)}, sinusoidal_attrs(*sp), n.output(0),
                            n.name());
              }
            if (op == "Add" && is_alibi(t, *v, x))
              return emit(ir_name_for(n), "alibi", {ir_of(x, n, i)}, OJson::object(), n.output(0), n.name());
            if (const auto ms = g_.shape(t); op == "Add" && ms)
              if (const auto wm = match_window_mask(*v, *ms, per_sample(x), last_window_)) {
                const OJson a{{"windows", pair(wm->windows[0], wm->windows[1])},
                              {"window", pair(wm->window[0], wm->window[1])},
                              {"shift", pair(wm->shift[0], wm->shift[1])},
                              {"value", wm->value}};
                return emit(ir_name_for(n), "window_mask", {ir_of(x, n, i)}, a, n.output(0), n.name());
              }
            if (op == "Add")
              if (const auto cm = causal_mask_value(t, *v, x); cm && per_sample_axis(x, cm->query_axis))
                return emit(ir_name_for(n), "causal_mask", {ir_of(x, n, i)}, causal_mask_attrs(*cm, x), n.output(0),
                            n.name());
            const double neutral = op == "Add" || op == "Sub" ? 0.0 : 1.0;
            const bool divides_it = op == "Div" && n.input(0) == t, subtracts_it = op == "Sub" && n.input(0) == t;
            if (divides_it || subtracts_it ||
                std::any_of(v->begin(), v->end(), [&](double e) { return e != neutral; }))
              return unknown(n, i, data, /*keep_inputs=*/op == "Mul" || op == "Div");  // add's gradient needs neither
          }
    constant_elementwise_ += 1;
    return alias(n, i, x);
  }

  // pos_embedding's attributes for fixed sinusoidal positions.
  static OJson sinusoidal_attrs(const SinusoidalPositions& sp) {
    OJson a{{"sinusoidal", sp.interleaved ? "interleaved" : "halves"}, {"frequency_step", sp.step}};
    if (sp.offset != 0) a["offset"] = sp.offset;
    return a;
  }

  // Fixed sinusoidal positions added to x [T, D] per sample: a constant
  // [.., T, D] whose leading axes (1, or a batch the file fixed) are copies
  // of one table that match_sinusoidal_positions (ops.hpp) recognises.
  static std::optional<SinusoidalPositions> sinusoidal_table(const std::vector<double>& v, const Dims& shape,
                                                             const Dims& x) {
    if (x.size() != 2 || shape.size() < 2 || shape[shape.size() - 2] != x[0] || shape.back() != x[1])
      return std::nullopt;
    const auto table = static_cast<size_t>(x[0] * x[1]);
    if (table == 0 || v.size() % table != 0) return std::nullopt;
    for (size_t e = table; e < v.size(); ++e)
      if (v[e] != v[e % table]) return std::nullopt;
    return match_sinusoidal_positions(std::vector<double>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(table)),
                                      x[0], x[1]);
  }

  // Whether `bias` (values v) is ALiBi's over x's scores: x [.., H, T, Tk] per
  // sample, bias [.., H, 1, Tk] broadcasting over the queries, every head h
  // adding alibi_slopes(H)[h] * j at key j (BLOOM's alibi tensor, [b H, 1, Tk]
  // with the batch folded with the heads; its slopes are fp32, so compared
  // to a relative 1e-6).
  bool is_alibi(const std::string& bias, const std::vector<double>& v, const std::string& x) const {
    const auto bs = g_.shape(bias), xs = g_.shape(x);
    const Dims px = per_sample(x);
    if (!bs || !xs || bs->size() != xs->size() || px.size() < 3 || bs->size() < 3) return false;
    const int64_t H = px[px.size() - 3], Tk = px.back();
    if ((*bs)[bs->size() - 2] != 1 || bs->back() != Tk || Tk < 2) return false;
    for (size_t k = 0; k + 2 < bs->size(); ++k)
      if ((*bs)[k] != (*xs)[k]) return false;  // one row of bias per (sample, head): no broadcast there
    if (v.empty() || v.size() % static_cast<size_t>(H * Tk) != 0) return false;
    const auto slopes = alibi_slopes(H);
    for (size_t e = 0; e < v.size(); ++e) {
      const auto j = static_cast<double>(e % static_cast<size_t>(Tk));
      const double want = slopes[(e / static_cast<size_t>(Tk)) % static_cast<size_t>(H)] * j;
      if (std::fabs(v[e] - want) > 1e-6 * std::fabs(want)) return false;
    }
    return true;
  }

  // An additive causal mask `mask` (values v) over x's scores: 0 where key
  // j <= query i, one finite value above (OPT's _make_causal_mask with
  // finfo.min), every other slice alike. The keys are x's last axis; the
  // queries the last axis before it where the mask has length T: the second
  // to last ([..., T, T]), or an earlier one with only broadcast axes
  // between (GPT-BigCode's multi-query [b, T, H, T] under a [1, T, 1, T]
  // mask). The mask's shape must broadcast to x's without growing it.
  struct CausalMask {
    double fill;
    int64_t query_axis;  // of x's ONNX axes
  };
  std::optional<CausalMask> causal_mask_value(const std::string& mask, const std::vector<double>& v,
                                              const std::string& x) const {
    const auto ms = g_.shape(mask), xs = g_.shape(x);
    if (!ms || !xs || ms->size() < 2 || xs->size() < 2 || ms->size() > xs->size()) return std::nullopt;
    const int64_t T = xs->back(), lead = static_cast<int64_t>(xs->size() - ms->size());
    if (ms->back() != T || T < 2) return std::nullopt;
    for (size_t k = 0; k < ms->size(); ++k)
      if ((*ms)[k] != 1 && (*ms)[k] != (*xs)[static_cast<size_t>(lead) + k]) return std::nullopt;
    int64_t q = static_cast<int64_t>(ms->size()) - 2;  // the queries' axis, of the mask's
    while (q >= 0 && (*ms)[static_cast<size_t>(q)] == 1) --q;
    if (q < 0 || (*ms)[static_cast<size_t>(q)] != T) return std::nullopt;
    if (v.size() != static_cast<size_t>(std::accumulate(ms->begin(), ms->end(), int64_t{1}, std::multiplies<>())))
      return std::nullopt;
    int64_t inner = 1;  // the mask's elements between one query and the next
    for (size_t k = static_cast<size_t>(q) + 1; k < ms->size(); ++k) inner *= (*ms)[k];
    const double fill = v[1];  // query 0, key 1: above the diagonal
    if (!std::isfinite(fill) || fill == 0.0) return std::nullopt;
    for (size_t e = 0; e < v.size(); ++e) {
      const auto i = static_cast<int64_t>(e) / inner % T, j = static_cast<int64_t>(e) % T;
      if (v[e] != (j > i ? fill : 0.0)) return std::nullopt;
    }
    return CausalMask{fill, lead + q};
  }
  // The IR attributes of a causal mask over x: the value, and the queries'
  // per-sample axis where it is not the second to last.
  OJson causal_mask_attrs(const CausalMask& cm, const std::string& x) const {
    OJson a{{"value", cm.fill}};
    const auto rank = static_cast<int64_t>(g_.shape(x)->size());
    if (cm.query_axis != rank - 2) a["query_axis"] = *per_sample_axis(x, cm.query_axis);
    return a;
  }

  void map_slice(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    if (data.empty() && g_.is_init(n.input(0)))
      fail(fmt::format("{}: slices initializer '{}' alone, which dlplan plans only when its values are fixed "
                       "sinusoidal positions ({}); there is no data input to plan it per sample",
                       label(n, i), n.input(0),
                       g_.values(n.input(0)) ? "they are not" : "the file does not hold them: stripped?"));
    const std::string& x = first_data(n, i, data);
    // An empty part: torch.roll by 0 along one axis (Swin's windows as tall
    // as the map) exports Slice [0, 0) and a Concat of it with the rest.
    // Nothing to plan; map_concat leaves it out.
    if (const auto out = g_.shape(n.output(0)), in = g_.shape(x);
        out && in && out->size() == in->size() && std::count(out->begin(), out->end(), 0) == 1 &&
        std::count(in->begin(), in->end(), 0) == 0) {
      empty_.insert(n.output(0));
      return;
    }
    if (n.input_size() >= 3) {
      if (auto r = sliced(n)) {
        const auto& [axis, start, end, step] = *r;
        if (start == 0 && end == (*g_.shape(x))[static_cast<size_t>(axis)] && step == 1) return alias(n, i, x);
        OJson a{{"axis", *per_sample_axis(x, axis)}, {"start", start}, {"end", end}};
        if (step != 1) a["step"] = step;  // x[:, 0::2] (Swin's patch merging)
        if (fusion_ == FusionMode::eager) a["view"] = true;  // x[..., a:b:s] and torch.chunk are views
        return emit(ir_name_for(n), "slice", {ir_of(x, n, i)}, a, n.output(0), n.name());
      }
      return unknown(n, i, data);
    }
    unknown(n, i, data);
  }

  // Split of an activation along a per-sample axis (torch.split with sizes,
  // F.glu): one slice per output, each keeping nothing, as slices do. The
  // sizes come from the `split` input (opset 13 on), the attribute before,
  // or equal parts.
  void map_split(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    const std::string& x = first_data(n, i, data);
    const auto s = g_.shape(x);
    const auto rank = s ? static_cast<int64_t>(s->size()) : 0;
    int64_t axis = attr_int(n, "axis", 0);
    if (axis < 0) axis += rank;
    const auto at = per_sample_axis(x, axis);
    if (!s || !at || axis >= rank || (*s)[static_cast<size_t>(axis)] <= 0) return unknown(n, i, data);
    const int64_t dim = (*s)[static_cast<size_t>(axis)], parts = n.output_size();
    std::vector<int64_t> sizes = attr_ints(n, "split");
    if (n.input_size() > 1 && !n.input(1).empty()) {
      const auto v = g_.values(n.input(1));
      if (!v) return unknown(n, i, data);
      sizes.assign(v->begin(), v->end());
    }
    if (sizes.empty() && parts > 0 && dim % parts == 0) sizes.assign(static_cast<size_t>(parts), dim / parts);
    int64_t total = 0;
    for (int64_t v : sizes) total += v > 0 ? v : dim + 1;  // a size of 0 or less: not planned as slices
    if (static_cast<int64_t>(sizes.size()) != parts || total != dim) return unknown(n, i, data);
    int64_t start = 0;
    for (int k = 0; k < parts; ++k) {
      const int64_t end = start + sizes[static_cast<size_t>(k)];
      if (!n.output(k).empty()) {
        // Not views under --fusion eager, unlike Slice: F.glu exports as this
        // Split, a Sigmoid and a Mul, and PyTorch's glu keeps its input,
        // the bytes of the two parts kept as copies (tiny-mlp-glu: exact).
        const OJson a{{"axis", *at}, {"start", start}, {"end", end}};
        emit(k == 0 ? ir_name_for(n) : unique_name(fmt::format("{}.{}", normalize(n.name()), k)), "slice",
             {ir_of(x, n, i)}, a, n.output(k), n.name());
      }
      start = end;
    }
  }

  void map_transpose(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    const std::string& x = first_data(n, i, data);
    // A permutation of the per-sample axes (ConvNeXt's [C, H, W] <-> [H, W, C]);
    // the batch axis must stay first. ONNX's default perm reverses the axes.
    const auto s = g_.shape(x);
    if (!s) fail(fmt::format("{}: the shape of its input '{}' is unknown after shape inference", label(n, i), x));
    auto perm = attr_ints(n, "perm");
    if (perm.empty())
      for (auto k = static_cast<int64_t>(s->size()); k-- > 0;) perm.push_back(k);
    // (A tensor computed once per step has no batch axis: every axis is its own.)
    const bool own = own_axes(x);
    if (!own && perm.size() == s->size() && perm.size() >= 3 && perm[0] != 0 && perm[1] == 0 &&
        read_by_parts(n.output(0)))
      return map_batch_second(n, i, x, perm);
    if (perm.size() != s->size() || (!own && perm[0] != 0))
      fail(
          fmt::format("{}: perm [{}] moves the batch axis of its input {}; dlplan plans per sample, so the batch "
                      "must stay first",
                      label(n, i), fmt::join(perm, ", "), fmt::join(*s, ", ")));
    // Per sample, the batch axis is gone ([b, T, D]: perm [0, 2, 1] is [1, 0]),
    // unless the batch is folded into the first axis ([b H, T, hd], OPT's
    // heads: per sample [H, T, hd], the same perm).
    const int64_t drop = batch_axes(x);
    OJson per = OJson::array();
    bool identity = true;
    for (size_t k = 0; k < perm.size(); ++k) identity = identity && perm[k] == static_cast<int64_t>(k);
    for (auto k = static_cast<size_t>(drop); k < perm.size(); ++k) per.push_back(perm[k] - drop);
    if (identity) return alias(n, i, x);
    return emit(ir_name_for(n), "transpose", {ir_of(x, n, i)}, OJson{{"perm", per}}, n.output(0), n.name());
  }

  // MaxPool, AveragePool
  void map_pool(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    const auto& op = n.op_type();
    auto k = attr_ints(n, "kernel_shape");
    if (k.size() != 2 && k.size() != 1) fail(fmt::format("{}: only 1-D and 2-D pooling is supported", label(n, i)));
    const bool ceil = attr_int(n, "ceil_mode", 0) != 0;
    if (ceil && op == "AveragePool") fail(fmt::format("{}: ceil_mode 1 is supported for MaxPool only", label(n, i)));
    auto a = k.size() == 1 ? window_1d(n, i, OJson::object(), k[0]) : pool_geometry(n, i, OJson::object(), k[0], k[1]);
    const auto padded = padded_for_pool_.find(n.input(0));
    if (padded != padded_for_pool_.end()) {
      if (k.size() == 1) fail(fmt::format("{}: a 1-D pooling after a Pad is not supported", label(n, i)));
      a["padding"] = pair(padded->second.first, padded->second.second);
    }
    if (ceil) a["ceil_mode"] = true;
    if (fusion_ == FusionMode::eager) a["eager"] = true;  // PyTorch's saved tensors
    // ONNX's default is 0, nn.AvgPool2d's True (which torch writes as 1);
    // without padding, or with the zeros of a Pad before, the two agree.
    if (op == "AveragePool" && attr_int(n, "count_include_pad", 0) == 0 && a["padding"] != OJson(0) &&
        padded == padded_for_pool_.end())
      a["count_include_pad"] = false;
    return emit(ir_name_for(n), op == "MaxPool" ? "maxpool2d" : "avgpool2d", {ir_of(first_data(n, i, data), n, i)}, a,
                n.output(0), n.name());
  }

  // A Reduce*'s axes over x, sorted and non-negative where x's rank is known:
  // an attribute up to opset 17 (ReduceSum: 12), an input from then on.
  std::vector<int64_t> reduce_axes(const onnx::NodeProto& n, const std::optional<Dims>& x_shape) const {
    auto axes = attr_ints(n, "axes");
    if (n.input_size() > 1 && !n.input(1).empty())
      if (auto v = g_.values(n.input(1))) axes.assign(v->begin(), v->end());
    for (auto& a : axes)
      if (x_shape && a < 0) a += static_cast<int64_t>(x_shape->size());
    std::sort(axes.begin(), axes.end());
    return axes;
  }

  void map_reduce_mean(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    const std::string& x = first_data(n, i, data);
    // x.mean([2, 3]) of [b, C, H, W]: MNASNet's pooling, a global_avgpool
    const auto s = g_.shape(x);
    const auto axes = reduce_axes(n, s);
    const bool sum = n.op_type() == "ReduceSum";
    if (!sum && s && s->size() == 4 && axes == std::vector<int64_t>{2, 3}) {
      OJson a = attr_int(n, "keepdims", 1) ? OJson{{"keepdims", true}} : OJson::object();
      return emit(ir_name_for(n), "global_avgpool", {ir_of(x, n, i)}, a, n.output(0), n.name());
    }
    // x.mean(k) over one per-sample axis (not the batch's): the last (RMSNorm's
    // x^2), or another (a text classifier's mean over the sequence); x.sum(k)
    // alike (ReduceSum)
    if (s && s->size() >= 2 && axes.size() == 1 && axes[0] < static_cast<int64_t>(s->size()))
      if (const auto a = per_sample_axis(x, axes[0]); a && !(batch_axes(x) == 0 && *a == 0)) {
        OJson attrs{{"keepdims", attr_int(n, "keepdims", 1) != 0}};
        if (axes[0] != static_cast<int64_t>(s->size()) - 1) attrs["axis"] = *a;
        return emit(ir_name_for(n), sum ? "reduce_sum" : "reduce_mean", {ir_of(x, n, i)}, attrs, n.output(0),
                    n.name());
      }
    return unknown(n, i, data);
  }

  // torch.norm(x, p=2, dim) and F.normalize's norm: ReduceL2 over one
  // per-sample axis is the IR's reduce_l2. Over adjacent ones (ConvNeXt V2's
  // global response normalization, torch.norm over H and W of [b, H, W, C])
  // it is the norm over their product: a reshape merging them (a view, as
  // PyTorch reads them in place), reduce_l2, and a reshape to the output.
  void map_reduce_l2(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    const std::string& x = first_data(n, i, data);
    const auto s = g_.shape(x);
    const auto axes = reduce_axes(n, s);
    if (!s || axes.empty() || !g_.shape(n.output(0))) return unknown(n, i, data);
    const bool keep = attr_int(n, "keepdims", 1) != 0;
    const auto first = per_sample_axis(x, axes.front());
    bool adjacent = first && !(batch_axes(x) == 0 && *first == 0) && axes.back() < static_cast<int64_t>(s->size());
    for (size_t k = 1; k < axes.size() && adjacent; ++k) adjacent = axes[k] == axes[k - 1] + 1;
    if (!adjacent) return unknown(n, i, data);
    if (axes.size() == 1)
      return emit(ir_name_for(n), "reduce_l2", {ir_of(x, n, i)}, OJson{{"keepdims", keep}, {"axis", *first}},
                  n.output(0), n.name());
    Dims merged = per_sample(x);
    const auto a0 = static_cast<size_t>(*first), count = axes.size();
    int64_t product = 1;
    for (size_t k = 0; k < count; ++k) product *= merged[a0 + k];
    merged.erase(merged.begin() + static_cast<std::ptrdiff_t>(a0 + 1),
                 merged.begin() + static_cast<std::ptrdiff_t>(a0 + count));
    merged[a0] = product;
    OJson view{{"shape", merged}};
    if (fusion_ == FusionMode::eager) view["view"] = true;
    const std::string flat = n.output(0) + "#merged", normed = n.output(0) + "#norm";
    emit(unique_name(normalize(n.name()) + ".merge"), "reshape", {ir_of(x, n, i)}, view, flat, n.name());
    emit(ir_name_for(n), "reduce_l2", {ir_[flat]}, OJson{{"keepdims", true}, {"axis", *first}}, normed, n.name());
    OJson back{{"shape", per_sample(n.output(0))}};
    if (fusion_ == FusionMode::eager) back["view"] = true;
    return emit(unique_name(normalize(n.name()) + ".unmerge"), "reshape", {ir_[normed]}, back, n.output(0), n.name());
  }

  void map_global_average_pool(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    // [C, 1, 1] kept where something other than a flatten reads it: a
    // squeeze-and-excitation block's 1x1 convolution, or the Mul it scales.
    const auto& cons = g_.consumers_of(n.output(0));
    const bool flattened = std::all_of(cons.begin(), cons.end(), [&](int c) {
      const auto& t = g_.node(c).op_type();
      return t == "Flatten" || t == "Reshape" || t == "Squeeze";
    });
    emit(ir_name_for(n), "global_avgpool", {ir_of(first_data(n, i, data), n, i)},
         flattened ? OJson::object() : OJson{{"keepdims", true}}, n.output(0), n.name());
    if (flattened) pooled_.insert(n.output(0));  // a later Flatten of it is the IR's [C] already
  }

  // Resize by whole factors. Nearest: nn.Upsample(scale_factor=s) and
  // F.interpolate's default export it with asymmetric coordinates and floor
  // (scales, or sizes), where output pixel i reads input pixel i / s; the
  // half-pixel coordinates at a whole factor read the same pixels. Linear:
  // mode="bilinear" (over [H, W]) or "linear" (over [L]) exports as mode
  // "linear" with half_pixel coordinates (torch 1.13; pytorch_half_pixel in
  // other exporters, the same but for an output of one element, which a
  // whole factor makes only from an input of one), or align_corners ones
  // for align_corners=True. The factors come from the inferred shapes, so
  // scales and sizes read alike. Any other Resize (cubic, a fractional factor, a
  // tf_crop_and_resize) is planned opaque.
  void map_resize(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    const std::string& x = first_data(n, i, data);
    const std::string mode = attr_text(n, "mode", "nearest");
    const std::string ctm = attr_text(n, "coordinate_transformation_mode", "half_pixel");
    const std::string rounding = attr_text(n, "nearest_mode", "round_prefer_floor");
    const bool half_pixel = ctm == "half_pixel" || ctm == "pytorch_half_pixel";
    const bool nearest_floor =
        mode == "nearest" && ((ctm == "asymmetric" && rounding == "floor") ||
                              (half_pixel && rounding.rfind("round_prefer_", 0) == 0));
    const bool linear = mode == "linear" && (half_pixel || ctm == "align_corners");
    const Dims in = per_sample(x), out = per_sample(n.output(0));
    const auto factor = [&](size_t a) -> int64_t {  // out[a] / in[a] when whole, else 0
      return in[a] > 0 && out[a] % in[a] == 0 ? out[a] / in[a] : 0;
    };
    if (!(nearest_floor || linear) || data.size() != 1 || in.size() != out.size() || in.size() < 2 ||
        in.size() > 3 || in[0] != out[0])
      return unknown(n, i, data);
    const std::vector<int64_t> scale =
        in.size() == 2 ? std::vector<int64_t>{1, factor(1)} : std::vector<int64_t>{factor(1), factor(2)};
    if (scale[0] < 1 || scale[1] < 1) return unknown(n, i, data);
    OJson attrs{{"scale", scale}};
    if (linear) {
      attrs["mode"] = "linear";
      if (ctm == "align_corners") attrs["align_corners"] = true;
    }
    emit(ir_name_for(n), "upsample", {ir_of(x, n, i)}, attrs, n.output(0), n.name());
  }

  // Flatten, Reshape, Squeeze, Unsqueeze
  void map_reshape(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    const auto& op = n.op_type();
    // Positions read from a table as [T, D] and given a leading batch axis of
    // 1 (Speech2Text2's sinusoids gathered by a flat index): the same read.
    if (const auto t = pos_tables_.find(n.input(0)); t != pos_tables_.end()) {
      auto lead_ones_dropped = [&](const std::string& v) {
        Dims d = g_.shape(v).value_or(Dims{});
        while (d.size() > 2 && d.front() == 1) d.erase(d.begin());
        return d;
      };
      const Dims in = lead_ones_dropped(n.input(0));
      if (in.size() == 2 && in == lead_ones_dropped(n.output(0))) {
        pos_tables_.emplace(n.output(0), t->second);
        return;
      }
    }
    const std::string& x = first_data(n, i, data);
    const auto out = per_sample(n.output(0));
    if (pooled_.count(x) && out.size() <= 1) {  // [C, 1, 1] -> [C]: the IR's global_avgpool is [C] already
      pooled_.insert(n.output(0));
      return alias(n, i, x);
    }
    // (A Reshape of [b, T, D] to [b T, D] at batch 1 looks like [T, D] -> [D]
    // per sample; it is a batch fold, which reshaped() below tells.)
    const auto si = g_.shape(x), so = g_.shape(n.output(0));
    const bool folds = si && so && !si->empty() && !so->empty() && (*so)[0] > 0 &&
                       (*so)[0] != (batch_folded_.count(x) ? batch_folded_.at(x) : (*si)[0]);
    if (si && so && *si == *so && std::all_of(si->begin(), si->end(), [](int64_t d) { return d > 0; }))
      return alias(n, i, x);  // input_ids.view(-1, T) of [b, T]: GPT-2's first node
    // --fusion eager: x.view(...), x.flatten(1) and squeeze/unsqueeze are
    // PyTorch's views of x, as its slices are (step_program.cpp's is_view).
    const OJson view = fusion_ == FusionMode::eager ? OJson{{"view", true}} : OJson::object();
    if ((op == "Flatten" && attr_int(n, "axis", 1) == 1) || (op != "Flatten" && out.size() == 1 && !folds))
      return emit(ir_name_for(n), "flatten", {ir_of(x, n, i)}, view, n.output(0), n.name());
    // [C, H, W] -> [C, H*W] followed by Transpose to [H*W, C]: ViT's patch tokens.
    const auto& cons = g_.consumers_of(n.output(0));
    if (!folds && out.size() == 2 && cons.size() == 1 && g_.node(cons[0]).op_type() == "Transpose" &&
        attr_ints(g_.node(cons[0]), "perm") == std::vector<int64_t>{0, 2, 1} && per_sample(x).size() == 3) {
      absorbed_.insert(cons[0]);
      return emit(ir_name_for(n), "tokens", {ir_of(x, n, i)}, OJson::object(), g_.node(cons[0]).output(0), n.name());
    }
    if (const auto s = reshaped(n, i, x)) {
      if (*s == per_sample(x)) return alias(n, i, x);
      OJson a = view;
      a["shape"] = *s;
      return emit(ir_name_for(n), "reshape", {ir_of(x, n, i)}, a, n.output(0), n.name());
    }
    return unknown(n, i, data);
  }

  // Expand, Tile
  void map_expand(const onnx::NodeProto& n, int i, const std::vector<std::string>& data) {
    if (g_.is_init(n.input(0))) {  // a class token broadcast over the batch (see Concat), a bias (see Add)
      if (g_.is_learned(n.input(0))) expanded_params_.emplace(n.output(0), n.input(0));
      return;
    }
    // Positions read from a table, broadcast over the batch before they are
    // added (XLM's position_embeddings(positions).expand_as(tensor)): the
    // same table read, the Add broadcasts it alike. Flaubert expands the
    // positions to [b, T] before the read, so the read is already [b, T, D]
    // (table_read checked that every sample reads the same rows).
    if (const auto t = pos_tables_.find(n.input(0)); t != pos_tables_.end() && n.op_type() == "Expand") {
      const auto in = g_.shape(n.input(0)), out = g_.shape(n.output(0));
      const auto broadcast = [&](size_t k) {
        return (*in)[k] == 1 || (k == 0 && in->size() == out->size() && (*in)[0] == micro_batch_ &&
                                 (*out)[0] == micro_batch_);
      };
      bool leading_broadcast = in && out && in->size() <= out->size() && in->size() >= 2;
      for (size_t k = 0; leading_broadcast && k + 2 < in->size(); ++k) leading_broadcast = broadcast(k);
      if (leading_broadcast && std::equal(in->end() - 2, in->end(), out->end() - 2)) {
        pos_tables_.emplace(n.output(0), t->second);
        return;
      }
    }
    if (data.size() == 1 && data[0] == n.input(0)) {
      // an Expand to the shape it has (torch's export of x.repeat writes one
      // before its Tile) is the input
      const auto in = g_.shape(n.input(0)), out = g_.shape(n.output(0));
      if (n.op_type() == "Expand" && in && out && *in == *out) return alias(n, i, n.input(0));
      if (n.op_type() == "Expand" && expanded_for_broadcast(n)) return alias(n, i, n.input(0));
      // x.repeat(..) along axes of length 1 (SwiftFormer's global query
      // repeated over the tokens) copies as expand's copy does
      if (batch_axes(n.input(0)) == 1 && broadcast_one_axis(n, i)) return;
    }
    return unknown(n, i, data);
  }

  // x.expand_as(y) read only by elementwise Add, Sub, Mul or Div whose result
  // has the expanded shape (F.normalize's x / norm.expand_as(x)): those
  // broadcast x themselves, so the Expand is the input, as PyTorch's expand
  // is a view of it. The batch axis is not expanded.
  bool expanded_for_broadcast(const onnx::NodeProto& n) const {
    const auto in = g_.shape(n.input(0)), out = g_.shape(n.output(0));
    if (!in || !out || in->size() != out->size() || in->empty() || (*in)[0] != (*out)[0]) return false;
    const auto& users = g_.consumers_of(n.output(0));
    return !users.empty() && std::all_of(users.begin(), users.end(), [&](int u) {
      const auto& c = g_.node(u);
      const auto& t = c.op_type();
      return (t == "Add" || t == "Sub" || t == "Mul" || t == "Div") && g_.shape(c.output(0)) == out;
    });
  }

  // An activation broadcast along one per-sample axis of length 1 to r
  // (x.unsqueeze(d + 1).expand(.., r, ..): torch.repeat_interleave as
  // import_onnx_loops.cpp rewrites it). That is nearest upsampling by r of a
  // [C, 1, W] view of x, C the product of the axes before, W of those after:
  // out[c, h, w] = x[c, 0, w]; its backward sums the r copies, as expand's
  // does. The upsample's output is the copy PyTorch makes where the expanded
  // view is reshaped (into the interleaved sequence).
  bool broadcast_one_axis(const onnx::NodeProto& n, int i) {
    const auto full_in = g_.shape(n.input(0)), full_out = g_.shape(n.output(0));
    if (!full_in || !full_out || full_in->size() != full_out->size() || full_in->empty() ||
        (*full_in)[0] != (*full_out)[0])
      return false;
    const Dims in = per_sample(n.input(0)), out = per_sample(n.output(0));
    int64_t axis = -1;
    for (size_t a = 0; a < in.size(); ++a) {
      if (in[a] == out[a]) continue;
      if (axis >= 0 || in[a] != 1 || out[a] < 2) return false;
      axis = static_cast<int64_t>(a);
    }
    if (axis < 0) return false;
    const auto product = [](auto first, auto last) { return std::accumulate(first, last, int64_t{1}, std::multiplies<>()); };
    const int64_t before = product(in.begin(), in.begin() + axis), after = product(in.begin() + axis + 1, in.end());
    const std::string view = n.output(0) + "#view", upsampled = n.output(0) + "#upsampled";
    emit(unique_name(normalize(n.name()) + ".view"), "reshape", {ir_of(n.input(0), n, i)},
         OJson{{"shape", Dims{before, 1, after}}}, view, n.name());
    emit(ir_name_for(n), "upsample", {ir_[view]}, OJson{{"scale", {out[static_cast<size_t>(axis)], 1}}}, upsampled,
         n.name());
    emit(unique_name(normalize(n.name()) + ".shape"), "reshape", {ir_[upsampled]}, OJson{{"shape", out}}, n.output(0),
         n.name());
    return true;
  }

  void map_concat(const onnx::NodeProto& n, int i, const std::vector<std::string>& all_data) {
    std::vector<std::string> data;  // the empty parts left out (map_slice)
    std::copy_if(all_data.begin(), all_data.end(), std::back_inserter(data),
                 [&](const std::string& t) { return !empty_.count(t); });
    if (data.size() == 1 && static_cast<size_t>(n.input_size()) == all_data.size() && data.size() < all_data.size())
      return alias(n, i, data[0]);
    // Learned tokens put before the sequence (ViT's class token; DeiT's
    // class and distillation tokens), each an initializer or one broadcast
    // over the batch, then one activation: a cls_token each, the last token
    // first, so that the first ends up in front.
    if (n.input_size() >= 2 && attr_int(n, "axis", 0) == 1) {
      auto learned_token = [&](const std::string& t) -> std::optional<std::string> {
        const int p = g_.producer_of(t);
        if (g_.is_init(t)) return t;
        if (p >= 0 && (g_.node(p).op_type() == "Expand" || g_.node(p).op_type() == "Tile") &&
            g_.is_init(g_.node(p).input(0)))
          return g_.node(p).input(0);
        return std::nullopt;
      };
      const std::string& x = n.input(n.input_size() - 1);
      const auto xs = g_.shape(x);
      std::vector<std::string> tokens;
      for (int k = 0; k + 1 < n.input_size(); ++k)
        if (const auto t = learned_token(n.input(k)); t && xs && !xs->empty() && g_.shape(*t) &&
                                                      numel(*g_.shape(*t)) == xs->back())
          tokens.push_back(*t);
      if (!learned_token(x) && tokens.size() + 1 == static_cast<size_t>(n.input_size())) {
        std::string in = ir_of(x, n, i);
        for (size_t k = tokens.size(); k-- > 0;) {
          const std::string out = k == 0 ? n.output(0) : fmt::format("{}#token{}", n.output(0), k);
          emit(k == 0 ? ir_name_for(n) : unique_name(fmt::format("{}.token{}", normalize(n.name()), k)), "cls_token",
               {in}, OJson::object(), out, n.name());
          weigh("weight", WeightRef{tokens[k]});
          in = ir_[out];
        }
        return;
      }
    }
    if (!data.empty() && all_data.size() == static_cast<size_t>(n.input_size())) {
      // Every input an activation (DenseNet's features so far, SqueezeNet's
      // expand branches): the IR's concat along the per-sample axis.
      // An input whose shape inference could not tell (shufflenet's Slice
      // with computed ends) may be the pass-through of an op the importer
      // does not know, so its planned shape is not to be trusted here.
      for (const auto& t : data) {
        const auto ts = g_.shape(t);
        if (!ts || ts->size() < 2 || std::any_of(ts->begin() + 1, ts->end(), [](int64_t d) { return d <= 0; })) {
          const int p = g_.producer_of(t);
          fail(
              fmt::format("{}: the shape of its input '{}' is unknown after shape inference{}, so the concatenation "
                          "cannot be planned",
                          label(n, i), t, p >= 0 ? fmt::format(" (made by {})", label(g_.node(p), p)) : ""));
        }
      }
      const auto s = g_.shape(n.output(0));
      int64_t axis = attr_int(n, "axis", 0);
      if (s && axis < 0) axis += static_cast<int64_t>(s->size());
      // Every input must read the axis alike (all batch-major, or all with
      // the batch folded into the first axis).
      const auto at = per_sample_axis(data[0], axis);
      const bool alike = std::all_of(data.begin(), data.end(),
                                     [&](const std::string& t) { return batch_axes(t) == batch_axes(data[0]); });
      if (at && alike) {
        std::vector<std::string> ins;
        for (const auto& t : data) ins.push_back(ir_of(t, n, i));
        return emit(ir_name_for(n), "concat", ins, OJson{{"axis", *at}}, n.output(0), n.name());
      }
    }
    unknown(n, i, data);
  }

  void map_softmax_cross_entropy_loss(const onnx::NodeProto& n, int i, const std::vector<std::string>& /*data*/) {
    loss_emitted_ = true;
    return emit(ir_name_for(n), "cross_entropy", {ir_of(n.input(0), n, i), ir_of(n.input(1), n, i)}, OJson::object(),
                n.output(0), n.name());
  }

  void map_fusion(const Fusion& f) {
    OJson a = f.attrs;
    static const std::set<std::string> kinds = {"attention", "silu", "hardswish", "gelu", "layernorm", "rmsnorm",
                                                "rope", "mish", "groupnorm", "lstm", "gru", "rnn", "drop_path"};
    if (!kinds.count(f.kind)) fail(fmt::format("internal: a fused pattern of unknown kind '{}'", f.kind));
    const char* op = kinds.find(f.kind)->c_str();
    auto it = ir_.find(f.x);
    if (it == ir_.end()) fail(fmt::format("the {} pattern named '{}' reads '{}', which was not mapped", f.kind, f.name, f.x));
    emit(unique_name(normalize(f.name)), op, {it->second}, a, f.out, f.unit_source);
    for (const auto& [suffix, ref] : f.weights) weigh(suffix, ref);
    if (!f.note.empty() && std::find(notes_.begin(), notes_.end(), f.note) == notes_.end()) notes_.push_back(f.note);
    carry_batch_fold({f.x}, {f.out});
  }

  void map_nodes() {
    // Model inputs: the graph inputs on the data path, per sample.
    for (const auto& name : g_.inputs) {
      if (!used_inputs_.count(name)) continue;
      auto s = g_.shape(name);
      if (!s || s->empty()) fail(fmt::format("input '{}' has no shape (the leading dimension must be the batch)", name));
      Dims ps(s->begin() + 1, s->end());
      for (auto d : ps)
        if (d <= 0) fail(fmt::format("input '{}' has an unknown dimension after shape inference", name));
      const int32_t t = g_.dtype(name);
      input_specs_[name] = OJson{{"shape", ps}, {"dtype", is_float(t) ? "f32" : "i32"}};
      ir_[name] = name;
      used_names_.insert(name);
    }
    for (int i = 0; i < g_.g.node_size(); ++i) {
      if (auto f = fused_node_.find(i); f != fused_node_.end()) {
        const auto& fu = fusions_[static_cast<size_t>(f->second)];
        if (needed_fusions_.count(f->second) && g_.node(i).output_size() > 0 &&
            std::find(g_.node(i).output().begin(), g_.node(i).output().end(), fu.out) != g_.node(i).output().end())
          map_fusion(fu);
        continue;
      }
      if (!needed_.count(i) || absorbed_.count(i)) continue;
      carry_batch_fold(i);  // first: a mapper reads its output's per-sample shape
      map_node(i);
    }
  }

  // A node that keeps the first axis of a batch-folded input ([b T, D] ->
  // [b T, N]: a Gemm, an Add of its bias, an activation) gives a
  // batch-folded output. Views decide for themselves (reshaped).
  void carry_batch_fold(int i) {
    const auto& n = g_.node(i);
    static const std::set<std::string> kViews = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"};
    if (kViews.count(n.op_type())) return;
    carry_batch_fold({n.input().begin(), n.input().end()}, {n.output().begin(), n.output().end()});
  }
  void carry_batch_fold(const std::vector<std::string>& inputs, const std::vector<std::string>& outputs) {
    if (batch_folded_.empty()) return;
    for (const auto& t : inputs) {
      const auto f = batch_folded_.find(t);
      if (f == batch_folded_.end()) continue;
      const auto in = g_.shape(t);
      for (const auto& o : outputs) {
        const auto out = g_.shape(o);
        if (in && out && !in->empty() && !out->empty() && (*out)[0] == (*in)[0] && !batch_folded_.count(o))
          batch_folded_[o] = f->second;
      }
    }
  }

  void add_loss(const std::string& logits) {
    auto it = ir_.find(logits);
    if (it == ir_.end()) fail(fmt::format("graph output '{}' could not be mapped", logits));
    Dims s = per_sample(logits);
    if (s.empty()) fail(fmt::format("graph output '{}' has no known shape; cannot attach a loss", logits));
    Dims t(s.begin(), s.end() - 1);
    const std::string target = t.empty() ? "label" : "targets";
    if (input_specs_.contains(target)) fail(fmt::format("an input named '{}' already exists; cannot add the loss targets", target));
    input_specs_[target] = OJson{{"shape", t}, {"dtype", "i32"}};
    used_names_.insert(target);
    nodes_.push_back(OJson{{"name", unique_name("loss")}, {"op", "cross_entropy"}, {"in", {it->second, target}}});
    onnx_names_.push_back("");
    notes_.push_back(fmt::format("loss: cross_entropy on '{}' with integer targets added (the ONNX graph has none)", logits));
  }

  // Units: node-name prefixes with a numeric component ("encoder.layers.3")
  // whose stem occurs with at least two indices.
  void assign_units() {
    std::map<std::string, std::set<std::string>> by_stem;
    std::vector<std::optional<std::pair<std::string, std::string>>> pre;
    for (const auto& on : onnx_names_) {
      pre.push_back(on.empty() ? std::nullopt : unit_prefix(on));
      if (pre.back()) by_stem[pre.back()->second].insert(pre.back()->first);
    }
    for (size_t k = 0; k < nodes_.size(); ++k)
      if (pre[k] && by_stem[pre[k]->second].size() >= 2) nodes_[k]["unit"] = pre[k]->first;
  }

  Model finish() {
    OJson ir{{"name", std::filesystem::path(g_.src).stem().string()}, {"inputs", OJson::object()}, {"nodes", nodes_}};
    ir["inputs"] = input_specs_;
    if (!g_.g.name().empty() && g_.g.name() != "main_graph" && g_.g.name() != "torch_jit") ir["name"] = g_.g.name();
    Model m = parse_model(nlohmann::json(ir), g_.src);
    if (share_repeated_weights(m)) {
      ir["nodes"] = nodes_;
      m = parse_model(nlohmann::json(ir), g_.src);
    }

    for (const auto& [op, u] : unknown_) {
      const std::string kept =
          u.keeping_nothing == 0 ? "every input kept for backward"
          : u.keeping_nothing == u.count
              ? "nothing kept for backward (each adds a constant or an initializer)"
              : fmt::format("every input kept for backward but by the {} that add a constant or an initializer",
                            u.keeping_nothing);
      std::string line = fmt::format("{} x {} (unknown to dlplan: planned as opaque, its output {}/sample fp32 and "
                                     "{}; no engine trains it",
                                     u.count, op, format_bytes(static_cast<double>(u.bytes)), kept);
      if (u.params) line += fmt::format("; {} parameters in its initializers not counted", u.params);
      if (op == "MatMul" || op == "Softmax") line += attention_hint();
      notes_.push_back(line + ")");
    }
    if (folded_convs_ > 0 && bn_layers_ == 0)
      notes_.push_back(fmt::format(
          "BatchNorm appears folded into {} Conv layer{} (eval-mode export: their biases are constants named "
          "'onnx::...'): parameters are counted as in the file; the model as trained has about {} more (BN weight and "
          "bias 2C per layer in place of the conv bias C), and SyncBatchNorm advice does not apply. Export with "
          "training=torch.onnx.TrainingMode.TRAINING to keep BatchNorm",
          folded_convs_, folded_convs_ == 1 ? "" : "s", folded_channels_));
    if (constant_elementwise_ > 0)
      notes_.push_back(fmt::format("{} elementwise op{} with constants (scales, shifts) planned as no-ops: no parameters and "
                                   "nothing saved for backward",
                                   constant_elementwise_, constant_elementwise_ == 1 ? "" : "s"));
    for (const auto& n : notes_pre_) notes_.insert(notes_.begin(), n);
    m.notes = notes_;
    return m;
  }

  // ALBERT applies one layer's initializers at every depth. A node whose
  // every parameter reads the same part of the same initializer as an earlier
  // node's, with the same op and attributes, applies that node's parameters
  // (`shares`): counted and trained once, as PyTorch's one nn.Module. Returns
  // whether any node was marked (the IR is then parsed again). Parameters
  // shared only in part stay, and refuse_shared_weights names them.
  bool share_repeated_weights(const Model& m) {
    std::map<int, std::vector<size_t>> params_of;
    for (size_t k = 0; k < m.params.size(); ++k) params_of[m.params[k].node].push_back(k);
    std::map<std::string, size_t> json_index;
    for (size_t j = 0; j < nodes_.size(); ++j) json_index[nodes_[j]["name"].get<std::string>()] = j;
    std::map<std::string, std::string> first_reader;  // signature -> the node that owns those parameters
    int shared = 0;
    for (const auto& [i, ks] : params_of) {
      const Node& n = m.nodes[static_cast<size_t>(i)];
      if (n.attrs.has("tie")) continue;
      std::string sig = fmt::format("{} {}", to_string(n.op), nlohmann::json(n.attrs.values).dump());
      for (int t : n.inputs) sig += fmt::format(" [{}]", fmt::join(m.tensor(t).shape, ","));
      bool traced = true;
      for (size_t k : ks) {
        const auto w = weights_.find(m.params[k].name);
        if (w == weights_.end()) traced = false;
        else sig += fmt::format(" {}{}[{}:{}]", w->second.init, w->second.transpose ? "^T" : "", w->second.begin, w->second.end);
      }
      if (!traced) continue;
      const auto [owner, fresh] = first_reader.emplace(sig, n.name);
      if (fresh) continue;
      nodes_[json_index.at(n.name)]["shares"] = owner->second;
      for (size_t k : ks) weights_.erase(m.params[k].name);
      ++shared;
    }
    if (shared > 0)
      notes_.push_back(fmt::format("{} node{} apply the parameters of an earlier node (`shares`: one initializer read at "
                                   "several depths, as ALBERT's shared layers): counted and trained once",
                                   shared, shared == 1 ? "" : "s"));
    return shared > 0;
  }

  struct Unknown {
    int count = 0;
    int64_t bytes = 0;
    int64_t params = 0;
    int keeping_nothing = 0;  // of count: a constant added, whose gradient needs no input
  };

  Graph& g_;
  std::vector<Fusion> fusions_;
  std::map<int, std::string> unfused_;
  std::map<std::string, int> fusion_by_out_;
  std::map<int, int> fused_node_;
  std::set<int> needed_fusions_, needed_, absorbed_;
  std::set<std::string> used_inputs_, used_names_, pooled_, empty_;
  mutable std::map<std::string, bool> dep_memo_;
  std::map<std::string, std::string> ir_;  // ONNX tensor -> IR tensor (node or input name)
  std::map<std::string, int64_t> batch_folded_;  // ONNX tensor [b m, ...] -> b (see reshaped)
  std::set<std::string> batch_free_;  // ONNX tensors computed once per step, from parameters (read_parameters)
  std::set<std::string> unit_batch_;  // those of them whose leading axis of 1 stands for the batch (once_per_step)
  std::map<std::string, std::string> embedding_of_table_;  // initializer -> the IR embedding reading it
  std::map<std::string, PosTable> pos_tables_;
  std::map<std::string, std::string> expanded_params_;  // Expand's output -> the learned initializer it broadcasts
  std::map<std::string, std::string> param_views_;  // ONNX tensor -> the learned initializer it reshapes (same order)
  std::map<std::string, WindowTable> window_tables_;
  std::map<std::string, std::string> relative_bias_nodes_;  // table -> its relative_position_bias node
  std::optional<std::array<int64_t, 2>> last_window_;  // the last window_position_bias's window
  // ONNX tensor [k, b m, ...] or [k, b, ...], whose batch a Transpose moved
  // to axis 1 (Swin's qkv.permute(2, 0, 3, 1, 4)) -> b when folded into m, else 0
  std::map<std::string, int64_t> batch_second_;
  std::map<std::string, Unknown> unknown_;
  std::string last_emitted_;
  std::map<std::string, WeightRef> weights_;
  std::map<std::string, std::pair<int64_t, int64_t>> padded_for_pool_;  // a Pad's output -> the AveragePool's padding  // IR parameter ("h.0.attn.q.weight") -> its values in the file
  OJson nodes_ = OJson::array();
  std::vector<std::string> onnx_names_;
  OJson input_specs_ = OJson::object();
  std::vector<std::string> notes_, notes_pre_;
  int folded_convs_ = 0;
  int64_t folded_channels_ = 0;
  int bn_layers_ = 0;
  int constant_elementwise_ = 0;
  FusionMode fusion_ = FusionMode::engine;
  int64_t micro_batch_ = 1;  // the batch the graph's inputs were bound to (bind_symbolic_dims)
  bool loss_emitted_ = false;

 public:
  void pre_note(std::string n) { notes_pre_.push_back(std::move(n)); }
};

// Symbolic dims of the graph inputs: leading -> micro_batch, others -> seq_len.
std::vector<std::string> bind_symbolic_dims(onnx::GraphProto& g, const std::set<std::string>& inits, const std::string& src,
                                            const ImportOptions& opt) {
  std::vector<std::string> notes;
  for (auto& vi : *g.mutable_input()) {
    if (inits.count(vi.name()) || !vi.type().has_tensor_type()) continue;
    auto* tt = vi.mutable_type()->mutable_tensor_type();
    if (!tt->has_shape()) throw Error(fmt::format("{}: input '{}' has no shape", src, vi.name()));
    auto* shape = tt->mutable_shape();
    for (int d = 0; d < shape->dim_size(); ++d) {
      auto* dim = shape->mutable_dim(d);
      if (dim->has_dim_value()) {
        if (d == 0 && dim->dim_value() != opt.micro_batch)
          notes.push_back(fmt::format("input '{}': batch dimension fixed at {} in the file; the plan's micro-batch is set "
                                      "separately", vi.name(), dim->dim_value()));
        continue;
      }
      const std::string sym = dim->has_dim_param() ? dim->dim_param() : std::string("?");
      int64_t v = 0;
      if (d == 0) {
        v = opt.micro_batch;
      } else if (opt.seq_len > 0) {
        v = opt.seq_len;
      } else {
        throw Error(fmt::format("{}: input '{}' has symbolic dimension '{}' (position {}); give its value with --seq-len",
                                src, vi.name(), sym, d));
      }
      dim->set_dim_value(v);
    }
  }
  return notes;
}

// The values of parameter `p` from the initializer `ref` names, in
// PyTorch's layout (see WeightRef).
ImportedWeight read_weight(const Graph& g, const ParamInfo& p, const WeightRef& ref, bool with_values) {
  const auto it = g.inits.find(ref.init);
  if (it == g.inits.end())
    throw Error(fmt::format("{}: parameter '{}' is read from '{}', which is not an initializer", g.src, p.name, ref.init));
  Dims dims(it->second->dims().begin(), it->second->dims().end());
  std::vector<double> vals;
  if (with_values) {
    auto v = tensor_values(*it->second);
    if (!v || v->empty() || !is_float(it->second->data_type()))
      throw Error(fmt::format("{}: initializer '{}' (parameter '{}') holds no float32 data in the file (exported "
                              "without its weights, or as external data, which --init does not read: export with "
                              "export_params=True into one file of under 2 GiB)",
                              g.src, ref.init, p.name));
    if (static_cast<int64_t>(v->size()) != numel(dims))
      throw Error(fmt::format("{}: initializer '{}' has {} values for dims [{}]", g.src, ref.init, v->size(),
                              fmt::join(dims, ", ")));
    vals = std::move(*v);
  }
  if (ref.transpose) {  // [in, out] -> [out, in]
    if (dims.size() != 2) throw Error(fmt::format("{}: initializer '{}' is not 2-D", g.src, ref.init));
    const int64_t a = dims[0], b = dims[1];
    if (with_values) {
      std::vector<double> t(vals.size());
      for (int64_t i = 0; i < a; ++i)
        for (int64_t j = 0; j < b; ++j) t[static_cast<size_t>(j * a + i)] = vals[static_cast<size_t>(i * b + j)];
      vals = std::move(t);
    }
    dims = {b, a};
  }
  if (ref.onnx_gates) {  // rows of one gate set each: [directions (x 2 for B), the parameter]
    if (p.numel <= 0 || numel(dims) % p.numel != 0)
      throw Error(fmt::format("{}: initializer '{}' does not hold whole copies of parameter '{}' ({} values)", g.src,
                              ref.init, p.name, p.numel));
    dims = {numel(dims) / p.numel, p.numel};
  }
  int64_t count = numel(dims);
  if (ref.end >= 0) {  // rows [begin, end) of the leading axis
    const int64_t rows = dims.empty() ? 0 : dims[0], row = rows > 0 ? count / rows : 0;
    if (ref.begin < 0 || ref.end > rows || ref.begin >= ref.end)
      throw Error(fmt::format("{}: rows [{}, {}) of initializer '{}' (parameter '{}') are outside its {} rows", g.src,
                              ref.begin, ref.end, ref.init, p.name, rows));
    count = (ref.end - ref.begin) * row;
    if (with_values) vals = std::vector<double>(vals.begin() + ref.begin * row, vals.begin() + ref.end * row);
  }
  if (count != p.numel)
    throw Error(fmt::format("{}: initializer '{}' gives {} values; parameter '{}' has {}", g.src, ref.init, count,
                            p.name, p.numel));
  if (ref.onnx_gates && with_values) {  // ONNX's gate blocks -> PyTorch's
    const size_t gates = static_cast<size_t>(ref.onnx_gates);
    if (count % ref.onnx_gates != 0 || (gates != 4 && gates != 3 && gates != 1))
      throw Error(fmt::format("{}: initializer '{}' (parameter '{}') does not hold {} gate blocks", g.src, ref.init,
                              p.name, ref.onnx_gates));
    const size_t block = static_cast<size_t>(count) / gates;
    // LSTM: i, o, f, c -> i, f, g (c), o; GRU: z, r, h -> r, z, n (h); RNN: its one block.
    const size_t from[3][4] = {{0, 2, 3, 1}, {1, 0, 2, 0}, {0, 0, 0, 0}};
    const size_t* order = from[gates == 4 ? 0 : gates == 3 ? 1 : 2];
    std::vector<double> t(vals.size());
    for (size_t k = 0; k < gates; ++k)
      std::copy_n(vals.begin() + static_cast<std::ptrdiff_t>(order[k] * block), block,
                  t.begin() + static_cast<std::ptrdiff_t>(k * block));
    vals = std::move(t);
  }
  ImportedWeight w{p.name, p.shape.empty() ? Shape{p.numel} : p.shape, {}, ref.init};
  if (ref.transpose) w.source += "^T";
  if (ref.end >= 0) w.source += fmt::format("[{}:{}]", ref.begin, ref.end);
  if (ref.onnx_gates == 4) w.source += " (gates i, o, f, c -> i, f, g, o)";
  if (ref.onnx_gates == 3) w.source += " (gates z, r, h -> r, z, n)";
  w.values.assign(vals.begin(), vals.end());
  return w;
}

}  // namespace

// Weights shared between layers (ALBERT applies one layer's initializers at
// every depth) are one initializer read by two IR parameters. A whole node
// repeated with the same weights applies the first one's (`shares`,
// share_repeated_weights); what is left reads an initializer in part shared
// with another node, which would be planned and trained with the weights
// counted twice: refused, naming both. (A tied head reads its embedding's
// table through `tie`, not a parameter of its own, and parts of one fused
// initializer are disjoint ranges.)
void refuse_shared_weights(const std::string& path, const std::map<std::string, WeightRef>& weights) {
  std::map<std::string, std::vector<std::pair<const std::string*, const WeightRef*>>> by_init;
  for (const auto& [param, ref] : weights) by_init[ref.init].push_back({&param, &ref});
  for (const auto& [init, readers] : by_init)
    for (size_t a = 0; a < readers.size(); ++a)
      for (size_t b = a + 1; b < readers.size(); ++b) {
        const WeightRef &x = *readers[a].second, &y = *readers[b].second;
        const bool whole = x.end < 0 || y.end < 0;
        if (whole || (x.begin < y.end && y.begin < x.end))
          throw Error(fmt::format("{}: initializer '{}' holds the weights of both '{}' and '{}' (one layer's weights "
                                  "applied at several depths, as ALBERT does); dlplan gives every node parameters of "
                                  "its own, so it would count and train them twice",
                                  path, init, *readers[a].first, *readers[b].first));
      }
}

// import_onnx, and with `weights` the values of every parameter read from
// the file's initializers.
Model import_file(const std::string& path, const ImportOptions& opt, std::vector<ImportedWeight>* weights,
                  bool with_values) {
  if (opt.micro_batch <= 0) throw Error(fmt::format("{}: micro-batch must be positive", path));
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw Error(fmt::format("{}: is a folder, not an ONNX file", path));
  if (const auto size = std::filesystem::file_size(path, ec); !ec && size > (uintmax_t{2} << 30))
    throw Error(fmt::format("{}: {} bytes, more than protobuf's 2 GiB; export the weights as external data", path, size));
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(fmt::format("{}: cannot open ONNX file", path));
  std::stringstream buf;
  buf << f.rdbuf();
  const std::string bytes = buf.str();
  onnx::ModelProto model;
  if (bytes.empty() || !model.ParseFromString(bytes))
    throw Error(fmt::format("{}: not a valid ONNX model (malformed or truncated protobuf, {} bytes)", path, bytes.size()));
  if (!model.has_graph() || model.graph().node_size() == 0)
    throw Error(fmt::format("{}: the ONNX model has no graph nodes (truncated or not an ONNX model)", path));

  // Every node input must be defined before use: a truncated file fails here.
  {
    std::set<std::string> defined;
    for (const auto& t : model.graph().initializer()) defined.insert(t.name());
    for (const auto& vi : model.graph().input()) defined.insert(vi.name());
    for (int i = 0; i < model.graph().node_size(); ++i) {
      const auto& n = model.graph().node(i);
      if (n.op_type().empty()) throw Error(fmt::format("{}: node #{} has no op type (malformed file)", path, i));
      for (const auto& in : n.input())
        if (!in.empty() && !defined.count(in))
          throw Error(fmt::format("{}: {}: input '{}' is not defined by an earlier node, initializer or graph input "
                                  "(truncated file, or nodes not in topological order)",
                                  path, label(n, i), in));
      for (const auto& o : n.output()) defined.insert(o);
    }
    for (const auto& o : model.graph().output())
      if (!defined.count(o.name()))
        throw Error(fmt::format("{}: graph output '{}' is produced by no node (truncated file)", path, o.name()));
  }

  std::set<std::string> inits;
  for (const auto& t : model.graph().initializer()) inits.insert(t.name());
  auto pre = bind_symbolic_dims(*model.mutable_graph(), inits, path, opt);

  if (const int lowered = lower_repeat_interleave_loops(model); lowered > 0)
    pre.push_back(fmt::format("{} Loop node{} of torch.repeat_interleave planned as Unsqueeze, Expand and Reshape",
                              lowered, lowered == 1 ? "" : "s"));
  if (const int lowered = lower_einsum_matmuls(model); lowered > 0)
    pre.push_back(fmt::format("{} Einsum node{} of a batched matrix product planned as MatMul", lowered,
                              lowered == 1 ? "" : "s"));
  std::vector<std::string> inference_notes;
  if (const std::string skip = check_before_inference(model, path); !skip.empty()) {
    inference_notes.push_back(fmt::format("ONNX shape inference not run ({}); shapes stored in the file are used", skip));
  } else {
    try {
      onnx::ShapeInferenceOptions so(false, 0, true);
      onnx::shape_inference::InferShapes(model, onnx::OpSchemaRegistry::Instance(), so);
    } catch (const std::exception& e) {
      inference_notes.push_back(fmt::format("ONNX shape inference stopped ({}); shapes stored in the file are used", e.what()));
    }
    if (inference_notes.empty()) {
      try {
        std::vector<std::string> assumed;
        if (const int folded = fold_shape_subgraphs(model, path, &assumed); folded > 0)
          inference_notes.push_back(fmt::format(
              "{} node{} computing shapes, positions or masks evaluated at import (micro-batch {}{})", folded,
              folded == 1 ? "" : "s", opt.micro_batch, opt.seq_len > 0 ? fmt::format(", sequence {}", opt.seq_len) : ""));
        inference_notes.insert(inference_notes.end(), assumed.begin(), assumed.end());
      } catch (const Error&) {
        throw;  // the fold found the file wrong for these options (an index past its table)
      } catch (const std::exception& e) {
        inference_notes.push_back(fmt::format("ONNX shape inference stopped after shapes were evaluated ({})", e.what()));
      }
    }
  }

  Graph g(model, path);
  g.index();
  Importer imp(g, opt.fusion, opt.micro_batch);
  if (opt.fusion == FusionMode::eager)
    imp.pre_note("--fusion eager: math written out in Python (gelu_new's tanh form, RMSNorm) planned op by op, as "
                 "PyTorch's eager autograd runs it; slices and reshapes are views, an op keeping one keeps the tensor "
                 "it was made from (the engine makes it again for that op's backward)");
  for (auto& n : pre) imp.pre_note(n);
  for (auto& n : inference_notes) imp.pre_note(n);
  try {
    Model m = imp.run();
    refuse_shared_weights(path, imp.weights());
    if (weights)
      for (const ParamInfo& p : m.params) {
        const auto ref = imp.weights().find(p.name);
        if (ref == imp.weights().end())
          throw Error(fmt::format("{}: parameter '{}' was not traced to an initializer of the file, so its weights "
                                  "cannot be read",
                                  path, p.name));
        weights->push_back(read_weight(g, p, ref->second, with_values));
      }
    return m;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(fmt::format("{}: cannot import: {}", path, e.what()));
  }
}

}  // namespace onnx_import

Model import_onnx(const std::string& path, const ImportOptions& opt) {
  return onnx_import::import_file(path, opt, nullptr, false);
}

std::vector<ImportedWeight> import_onnx_weights(const std::string& path, const ImportOptions& opt, bool with_values) {
  std::vector<ImportedWeight> w;
  onnx_import::import_file(path, opt, &w, with_values);
  return w;
}

#endif  // DLPLAN_HAVE_ONNX

}  // namespace dlplan
