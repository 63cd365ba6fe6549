// The indexed view of an ONNX graph the importer works on (Graph, declared
// in import_onnx_graph.hpp) and the small readers of nodes and tensors it
// shares with the pattern matcher and the shape folder.
#include "dlplan/ir.hpp"
#include "import_onnx_graph.hpp"

#include <fmt/format.h>

#include <cstring>

namespace dlplan::onnx_import {

bool is_float(int32_t t) {
  using TP = onnx::TensorProto;
  return t == TP::FLOAT || t == TP::DOUBLE || t == TP::FLOAT16 || t == TP::BFLOAT16;
}

Graph::Graph(onnx::ModelProto& model, std::string src) : m(model), g(*model.mutable_graph()), src(std::move(src)) {}

void Graph::index() {
  for (const auto& t : g.initializer()) inits[t.name()] = &t;
  for (const auto& vi : g.input())
    if (!inits.count(vi.name())) inputs.push_back(vi.name());
  for (int i = 0; i < g.node_size(); ++i) {
    const auto& n = g.node(i);
    for (const auto& o : n.output())
      if (!o.empty()) producer[o] = i;
    for (const auto& in : n.input())
      if (!in.empty()) consumers[in].push_back(i);
  }
  auto read = [&](const onnx::ValueInfoProto& vi) {
    if (!vi.type().has_tensor_type()) return;
    const auto& tt = vi.type().tensor_type();
    elem_type[vi.name()] = tt.elem_type();
    if (!tt.has_shape()) return;
    Dims d;
    for (const auto& dim : tt.shape().dim()) d.push_back(dim.has_dim_value() ? dim.dim_value() : -1);
    shapes[vi.name()] = d;
  };
  for (const auto& vi : g.input()) read(vi);
  for (const auto& vi : g.value_info()) read(vi);
  for (const auto& vi : g.output()) read(vi);
}

const onnx::NodeProto& Graph::node(int i) const { return g.node(i); }

int Graph::producer_of(const std::string& t) const {
  auto it = producer.find(t);
  return it == producer.end() ? -1 : it->second;
}

const std::vector<int>& Graph::consumers_of(const std::string& t) const {
  static const std::vector<int> none;
  auto it = consumers.find(t);
  return it == consumers.end() ? none : it->second;
}

bool Graph::is_init(const std::string& t) const { return inits.count(t) > 0; }

bool Graph::is_const(const std::string& t) const {
  if (t.empty() || is_init(t)) return true;
  int p = producer_of(t);
  if (p < 0) return false;
  const auto& op = node(p).op_type();
  return op == "Constant" || op == "ConstantOfShape";
}

std::optional<Dims> Graph::shape(const std::string& t) const {
  if (auto it = inits.find(t); it != inits.end()) return Dims(it->second->dims().begin(), it->second->dims().end());
  if (auto it = shapes.find(t); it != shapes.end()) return it->second;
  return std::nullopt;
}

int32_t Graph::dtype(const std::string& t) const {
  if (auto it = inits.find(t); it != inits.end()) return it->second->data_type();
  if (auto it = elem_type.find(t); it != elem_type.end()) return it->second;
  return onnx::TensorProto::FLOAT;
}

std::optional<std::vector<double>> tensor_values(const onnx::TensorProto& t) {
  using TP = onnx::TensorProto;
  if (t.data_location() == TP::EXTERNAL) return std::nullopt;
  std::vector<double> v;
  const std::string& raw = t.raw_data();
  auto from_raw = [&](auto tag) {
    using T = decltype(tag);
    for (size_t i = 0; i + sizeof(T) <= raw.size(); i += sizeof(T)) {
      T x;
      std::memcpy(&x, raw.data() + i, sizeof(T));
      v.push_back(static_cast<double>(x));
    }
  };
  switch (t.data_type()) {
    case TP::FLOAT:
      if (!raw.empty()) from_raw(float{});
      for (float x : t.float_data()) v.push_back(x);
      break;
    case TP::DOUBLE:
      if (!raw.empty()) from_raw(double{});
      for (double x : t.double_data()) v.push_back(x);
      break;
    case TP::INT64:
      if (!raw.empty()) from_raw(int64_t{});
      for (auto x : t.int64_data()) v.push_back(static_cast<double>(x));
      break;
    case TP::INT32:
      if (!raw.empty()) from_raw(int32_t{});
      for (auto x : t.int32_data()) v.push_back(x);
      break;
    case TP::BOOL: case TP::UINT8:
      if (!raw.empty()) from_raw(uint8_t{});
      for (auto x : t.int32_data()) v.push_back(x);
      break;
    case TP::INT8:  // signed: raw bytes read as uint8 made -1 into 255
      if (!raw.empty()) from_raw(int8_t{});
      for (auto x : t.int32_data()) v.push_back(x);
      break;
    default: return std::nullopt;
  }
  return v;
}

std::optional<std::vector<double>> tensor_elements(const onnx::TensorProto& t, const std::vector<int64_t>& at) {
  using TP = onnx::TensorProto;
  if (t.data_location() == TP::EXTERNAL) return std::nullopt;
  const std::string& raw = t.raw_data();
  std::vector<double> v;
  v.reserve(at.size());
  // From raw bytes when the file holds them, else from the typed field.
  auto read = [&](auto tag, const auto& typed) -> bool {
    using T = decltype(tag);
    const auto n = static_cast<int64_t>(raw.empty() ? typed.size() : raw.size() / sizeof(T));
    for (int64_t i : at) {
      if (i < 0 || i >= n) return false;
      if (raw.empty()) {
        v.push_back(static_cast<double>(typed.Get(static_cast<int>(i))));
      } else {
        T x;
        std::memcpy(&x, raw.data() + static_cast<size_t>(i) * sizeof(T), sizeof(T));
        v.push_back(static_cast<double>(x));
      }
    }
    return true;
  };
  bool ok = false;
  switch (t.data_type()) {
    case TP::FLOAT: ok = read(float{}, t.float_data()); break;
    case TP::DOUBLE: ok = read(double{}, t.double_data()); break;
    case TP::INT64: ok = read(int64_t{}, t.int64_data()); break;
    case TP::INT32: ok = read(int32_t{}, t.int32_data()); break;
    case TP::BOOL: case TP::UINT8: ok = read(uint8_t{}, t.int32_data()); break;
    case TP::INT8: ok = read(int8_t{}, t.int32_data()); break;
    default: return std::nullopt;
  }
  if (!ok) return std::nullopt;
  return v;
}

std::optional<std::vector<double>> Graph::values(const std::string& t) const {
  if (auto it = inits.find(t); it != inits.end()) return tensor_values(*it->second);
  int p = producer_of(t);
  if (p < 0) return std::nullopt;
  const auto& n = node(p);
  if (n.op_type() != "Constant") return std::nullopt;
  for (const auto& a : n.attribute()) {
    if (a.name() == "value") return tensor_values(a.t());
    if (a.name() == "value_float") return std::vector<double>{a.f()};
    if (a.name() == "value_int") return std::vector<double>{static_cast<double>(a.i())};
    if (a.name() == "value_ints") return std::vector<double>(a.ints().begin(), a.ints().end());
    if (a.name() == "value_floats") return std::vector<double>(a.floats().begin(), a.floats().end());
  }
  return std::nullopt;
}

std::optional<std::pair<int64_t, int64_t>> Graph::matmul_weight(const std::string& t) const {
  std::string w = t;
  bool transposed = false;
  if (!is_init(t)) {
    const int p = producer_of(t);
    if (p < 0 || node(p).op_type() != "Transpose" || node(p).input_size() != 1 || !is_init(node(p).input(0)))
      return std::nullopt;
    const auto perm = attr_ints(node(p), "perm");
    if (!perm.empty() && perm != std::vector<int64_t>{1, 0}) return std::nullopt;
    w = node(p).input(0);
    transposed = true;
  }
  const auto s = shape(w);
  if (!s || s->size() != 2) return std::nullopt;
  return transposed ? std::make_pair((*s)[1], (*s)[0]) : std::make_pair((*s)[0], (*s)[1]);
}

WeightRef Graph::matmul_weight_ref(const std::string& t) const {
  if (is_init(t)) return WeightRef{t, true};  // W [in, out]
  return WeightRef{node(producer_of(t)).input(0), false};  // Transpose(W [out, in])
}

bool Graph::is_learned(const std::string& t) const {
  return is_init(t) && is_float(dtype(t)) && t.rfind("onnx::", 0) != 0;
}

std::optional<std::pair<std::string, double>> Graph::offset_weight(const std::string& t) const {
  const int p = producer_of(t);
  if (p < 0 || node(p).op_type() != "Add" || node(p).input_size() != 2) return std::nullopt;
  for (int k = 0; k < 2; ++k) {
    const std::string& w = node(p).input(k);
    const auto c = scalar(node(p).input(1 - k));
    const auto s = shape(w);
    if (is_learned(w) && c && s && !s->empty()) return std::make_pair(w, *c);
  }
  return std::nullopt;
}

std::optional<double> Graph::scalar(const std::string& t) const {
  auto v = values(t);
  if (!v || v->size() != 1) return std::nullopt;
  return (*v)[0];
}

const onnx::AttributeProto* attr(const onnx::NodeProto& n, const char* name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}
int64_t attr_int(const onnx::NodeProto& n, const char* name, int64_t def) {
  auto a = attr(n, name);
  return a ? a->i() : def;
}
double attr_float(const onnx::NodeProto& n, const char* name, double def) {
  auto a = attr(n, name);
  return a ? a->f() : def;
}
bool is_torch_hardsigmoid(const onnx::NodeProto& n) {
  return n.op_type() == "HardSigmoid" && std::fabs(attr_float(n, "alpha", 0.2) - 1.0 / 6.0) <= 1e-6 &&
         std::fabs(attr_float(n, "beta", 0.5) - 0.5) <= 1e-6;
}

std::vector<int64_t> attr_ints(const onnx::NodeProto& n, const char* name) {
  auto a = attr(n, name);
  if (!a) return {};
  return {a->ints().begin(), a->ints().end()};
}
std::string attr_text(const onnx::NodeProto& n, const char* name, const std::string& def) {
  auto a = attr(n, name);
  return a ? a->s() : def;
}

std::string label(const onnx::NodeProto& n, int index) {
  if (!n.name().empty()) return fmt::format("node '{}' ({})", n.name(), n.op_type());
  return fmt::format("node #{} ({})", index, n.op_type());
}

}  // namespace dlplan::onnx_import
