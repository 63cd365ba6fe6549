// torch.repeat_interleave(x, r, dim=d) with a constant r, as PyTorch 1.13
// exports it at opset 13+ (symbolic_opset13.repeat_interleave): x and the
// per-slice repeats split into sequences (SplitToSequence), a Loop over the
// slices that unsqueezes each after axis d, expands the new axis to its
// repeat count and reshapes it back, and a ConcatFromSequence of the results
// along d. GPT-J and CodeGen write their rotary sin and cos this way (d the
// last axis); Funnel's decoder upsamples its sequence so (d = 1). A Loop
// holds a subgraph, so ONNX shape inference did not run and nothing after it
// had a shape; here it becomes, before inference, the body applied to the
// whole tensor:
//   Unsqueeze(x, [d + 1]) -> Expand(.., [1, .., 1, r, 1, ..]) -> Reshape(.., shape)
// with the body's own reshape target, which merges axis d with the new one
// after it (r x its length). Applied to one slice (axis d of length 1) that
// is the body; to all of them, the slices interleaved in order, which is the
// ConcatFromSequence. Only that shape of the pattern is rewritten (repeats all
// equal, slices of one); any other Loop is left as it is.
#include "import_onnx_graph.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace dlplan::onnx_import {
namespace {

const onnx::GraphProto* body_of(const onnx::NodeProto& n) {
  for (const auto& a : n.attribute())
    if (a.name() == "body" && a.has_g()) return &a.g();
  return nullptr;
}

int64_t attr_int_of(const onnx::NodeProto& n, const std::string& name, int64_t fallback) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return a.i();
  return fallback;
}

// The integer values of a Constant node's tensor.
std::optional<std::vector<int64_t>> constant_ints(const onnx::NodeProto& n) {
  if (n.op_type() != "Constant") return std::nullopt;
  for (const auto& a : n.attribute())
    if (a.name() == "value" && a.has_t()) {
      const auto v = tensor_values(a.t());
      if (!v) return std::nullopt;
      std::vector<int64_t> out;
      for (double x : *v) out.push_back(static_cast<int64_t>(x));
      return out;
    }
  return std::nullopt;
}

struct RepeatLoop {
  int loop = -1, concat = -1;   // the Loop and its ConcatFromSequence (main graph)
  std::string x;                // the tensor repeated (SplitToSequence's input)
  int64_t rank = 0, axis = 0, repeats = 0;
  std::vector<int64_t> reshape; // the body's reshape target
};

// The values of main-graph Constant nodes by output name.
using Constants = std::map<std::string, const onnx::NodeProto*>;

std::optional<int64_t> constant_scalar(const Constants& k, const std::string& t) {
  const auto it = k.find(t);
  if (it == k.end()) return std::nullopt;
  const auto v = constant_ints(*it->second);
  if (!v || v->size() != 1) return std::nullopt;
  return (*v)[0];
}

std::optional<RepeatLoop> match(const onnx::GraphProto& g, int i, const std::map<std::string, int>& producer,
                                const std::map<std::string, std::vector<int>>& consumers, const Constants& k) {
  const auto& loop = g.node(i);
  const onnx::GraphProto* body = body_of(loop);
  if (!body || loop.input_size() != 3 || loop.output_size() != 1 || body->input_size() != 3 || body->output_size() != 2)
    return std::nullopt;
  auto made_by = [&](const std::string& t, const char* op) -> const onnx::NodeProto* {
    const auto p = producer.find(t);
    return p != producer.end() && g.node(p->second).op_type() == op ? &g.node(p->second) : nullptr;
  };
  if (!made_by(loop.input(2), "SequenceEmpty")) return std::nullopt;
  const auto readers = consumers.find(loop.output(0));
  if (readers == consumers.end() || readers->second.size() != 1) return std::nullopt;
  const auto& cat = g.node(readers->second[0]);
  if (cat.op_type() != "ConcatFromSequence" || attr_int_of(cat, "new_axis", 0) != 0) return std::nullopt;

  // The body, by its outputs' producers: SequenceInsert(seq, Reshape(Expand(
  // Unsqueeze(SequenceAt(xs, iter), [rank]), shape), target)).
  std::map<std::string, const onnx::NodeProto*> body_producer;
  Constants body_k;
  for (const auto& n : body->node()) {
    for (const auto& o : n.output()) body_producer[o] = &n;
    if (n.op_type() == "Constant" && n.output_size() == 1) body_k[n.output(0)] = &n;
  }
  auto body_made_by = [&](const std::string& t, const char* op) -> const onnx::NodeProto* {
    const auto p = body_producer.find(t);
    return p != body_producer.end() && p->second->op_type() == op ? p->second : nullptr;
  };
  const std::string& iter = body->input(0).name();
  const auto* insert = body_made_by(body->output(1).name(), "SequenceInsert");
  if (!insert || insert->input_size() != 2 || insert->input(0) != body->input(2).name()) return std::nullopt;
  const auto* reshape = body_made_by(insert->input(1), "Reshape");
  if (!reshape || reshape->input_size() != 2) return std::nullopt;
  const auto* expand = body_made_by(reshape->input(0), "Expand");
  const auto target_node = body_k.find(reshape->input(1));
  if (!expand || target_node == body_k.end()) return std::nullopt;
  const auto target = constant_ints(*target_node->second);
  const auto* unsqueeze = body_made_by(expand->input(0), "Unsqueeze");
  if (!target || !unsqueeze || unsqueeze->input_size() != 2) return std::nullopt;
  const auto* at_x = body_made_by(unsqueeze->input(0), "SequenceAt");
  const auto axes_node = body_k.find(unsqueeze->input(1));
  if (!at_x || at_x->input_size() != 2 || at_x->input(1) != iter || axes_node == body_k.end()) return std::nullopt;
  const auto axes = constant_ints(*axes_node->second);

  // The sequences: x split into slices of 1 along its last axis, and the
  // repeats, Expand(r) split into ones, r a constant.
  const auto* split_x = made_by(at_x->input(0), "SplitToSequence");
  if (!split_x || split_x->input_size() < 1) return std::nullopt;
  RepeatLoop m;
  m.loop = i;
  m.concat = readers->second[0];
  m.x = split_x->input(0);
  m.rank = static_cast<int64_t>(target->size());  // the reshape gives back x's rank
  m.reshape = *target;
  if (m.rank < 1 || !axes || axes->size() != 1) return std::nullopt;
  // Slices of one that keep their axis: an explicit split (Funnel's ones) or
  // keepdims (the default).
  if (split_x->input_size() < 2 && attr_int_of(*split_x, "keepdims", 1) != 1) return std::nullopt;
  const auto normal = [](int64_t a, int64_t rank) { return a < 0 ? a + rank : a; };
  m.axis = normal(attr_int_of(*split_x, "axis", 0), m.rank);
  if (m.axis < 0 || m.axis >= m.rank || normal(attr_int_of(cat, "axis", 0), m.rank) != m.axis ||
      normal((*axes)[0], m.rank + 1) != m.axis + 1)
    return std::nullopt;
  // The reshape merges axis d with the new one after it, and only them: its
  // one -1 at d, no 0 (copy the input's axis) after it, where the axes of
  // the expanded tensor are one further on.
  if (std::count(target->begin(), target->end(), -1) != 1 || (*target)[static_cast<size_t>(m.axis)] != -1 ||
      std::count(target->begin() + m.axis, target->end(), 0) != 0)
    return std::nullopt;
  // The repeat count: the other SequenceAt of the body reads Split(Expand(r)).
  std::optional<int64_t> r;
  for (const auto& n : body->node()) {
    if (n.op_type() != "SequenceAt" || &n == at_x || n.input_size() != 2 || n.input(1) != iter) continue;
    const auto* split_r = made_by(n.input(0), "SplitToSequence");
    const auto* expand_r = split_r && split_r->input_size() >= 1 ? made_by(split_r->input(0), "Expand") : nullptr;
    if (!expand_r || expand_r->input_size() != 2) return std::nullopt;
    const auto value = constant_scalar(k, expand_r->input(0));
    if (!value || (r && *r != *value)) return std::nullopt;
    r = value;
  }
  if (!r || *r < 1) return std::nullopt;
  m.repeats = *r;
  return m;
}

onnx::NodeProto constant_node(const std::string& out, const std::vector<int64_t>& v) {
  onnx::NodeProto n;
  n.set_op_type("Constant");
  n.set_name(out);
  n.add_output(out);
  auto* a = n.add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  auto* t = a->mutable_t();
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_dims(static_cast<int64_t>(v.size()));
  for (int64_t x : v) t->add_int64_data(x);
  return n;
}

onnx::NodeProto op_node(const std::string& op, const std::string& name, std::vector<std::string> in, const std::string& out) {
  onnx::NodeProto n;
  n.set_op_type(op);
  n.set_name(name);
  for (auto& s : in) n.add_input(s);
  n.add_output(out);
  return n;
}

// Nodes that made `seeds` and whose outputs nothing reads any more (no node,
// no subgraph, no graph output), and in turn what made their inputs: the
// sequences and repeat counts a rewritten Loop read. Nodes elsewhere are
// left as they are.
void remove_unread(onnx::GraphProto& g, std::vector<std::string> seeds) {
  std::set<int> removed;
  for (;;) {
    std::map<std::string, int> reads, producer;
    for (int i = 0; i < g.node_size(); ++i) {
      if (removed.count(i)) continue;
      const auto& n = g.node(i);
      for (const auto& o : n.output()) producer[o] = i;
      for (const auto& in : n.input()) ++reads[in];
      for (const auto& a : n.attribute())
        if (a.has_g())
          for (const auto& b : a.g().node())
            for (const auto& in : b.input()) ++reads[in];
    }
    for (const auto& o : g.output()) ++reads[o.name()];
    std::vector<std::string> next;
    for (const auto& t : seeds) {
      const auto p = producer.find(t);
      if (p == producer.end() || removed.count(p->second)) continue;
      const auto& n = g.node(p->second);
      if (std::any_of(n.output().begin(), n.output().end(), [&](const std::string& o) { return reads[o] > 0; }))
        continue;
      removed.insert(p->second);
      next.insert(next.end(), n.input().begin(), n.input().end());
    }
    if (next.empty()) break;
    seeds = std::move(next);
  }
  google::protobuf::RepeatedPtrField<onnx::NodeProto> kept;
  for (int i = 0; i < g.node_size(); ++i)
    if (!removed.count(i)) *kept.Add() = g.node(i);
  g.mutable_node()->Swap(&kept);
}

}  // namespace

int lower_repeat_interleave_loops(onnx::ModelProto& model) {
  auto& g = *model.mutable_graph();
  std::map<std::string, int> producer;
  std::map<std::string, std::vector<int>> consumers;
  Constants k;
  for (int i = 0; i < g.node_size(); ++i) {
    const auto& n = g.node(i);
    for (const auto& o : n.output()) producer[o] = i;
    for (const auto& in : n.input()) consumers[in].push_back(i);
    if (n.op_type() == "Constant" && n.output_size() == 1) k[n.output(0)] = &n;
  }
  // Matched first, rewritten after: each Loop's replacement in its place,
  // its ConcatFromSequence removed.
  std::map<int, std::vector<onnx::NodeProto>> replace;
  std::set<int> drop;
  std::vector<std::string> seeds;
  for (int i = 0; i < g.node_size(); ++i) {
    if (g.node(i).op_type() != "Loop") continue;
    const auto m = match(g, i, producer, consumers, k);
    if (!m) continue;
    const auto& cat = g.node(m->concat);
    const std::string base = g.node(i).name().empty() ? cat.output(0) : g.node(i).name();
    std::vector<int64_t> shape(static_cast<size_t>(m->rank + 1), 1);
    shape[static_cast<size_t>(m->axis + 1)] = m->repeats;
    std::vector<onnx::NodeProto> nodes;
    nodes.push_back(constant_node(base + "/repeat_axes", {m->axis + 1}));
    nodes.push_back(op_node("Unsqueeze", base + "/repeat_unsqueeze", {m->x, base + "/repeat_axes"}, base + "/repeat_unsqueezed"));
    nodes.push_back(constant_node(base + "/repeat_shape", shape));
    nodes.push_back(op_node("Expand", base + "/repeat_expand", {base + "/repeat_unsqueezed", base + "/repeat_shape"},
                            base + "/repeat_expanded"));
    nodes.push_back(constant_node(base + "/repeat_target", m->reshape));
    nodes.push_back(op_node("Reshape", base + "/repeat_reshape", {base + "/repeat_expanded", base + "/repeat_target"},
                            cat.output(0)));
    replace[i] = std::move(nodes);
    drop.insert(m->concat);
    // What fed the Loop (the sequences, the trip count) is read by nothing now.
    for (const auto& in : g.node(i).input()) seeds.push_back(in);
    for (const auto& n : body_of(g.node(i))->node())
      for (const auto& in : n.input()) seeds.push_back(in);
  }
  if (replace.empty()) return 0;
  google::protobuf::RepeatedPtrField<onnx::NodeProto> out;
  for (int i = 0; i < g.node_size(); ++i) {
    if (drop.count(i)) continue;
    if (const auto r = replace.find(i); r != replace.end()) {
      for (auto& n : r->second) *out.Add() = std::move(n);
      continue;
    }
    *out.Add() = g.node(i);
  }
  g.mutable_node()->Swap(&out);
  remove_unread(g, seeds);
  return static_cast<int>(replace.size());
}

}  // namespace dlplan::onnx_import
