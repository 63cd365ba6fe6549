// Structural checks of an untrusted ONNX graph before libonnx's shape
// inference sees it. libonnx's inference functions trust their input (a
// stride of 0 divides by zero in convPoolShapeInference; a malformed Scan
// body crashes ScanInferenceFunction), so inference runs only on a graph
// every node of which matches its op's schema (OpSchema::Verify: inputs,
// outputs, attribute names and types), whose window attributes are sane, and
// which holds no subgraphs (control flow, which dlplan cannot plan anyway:
// the importer then works from the shapes stored in the file).
#ifdef DLPLAN_HAVE_ONNX  // compiled only with ONNX, as import_onnx_fuse.cpp
#include "import_onnx_graph.hpp"

#include "dlplan/error.hpp"
#include "dlplan/limits.hpp"

#include <fmt/format.h>
#include <onnx/defs/schema.h>

#include <limits>

namespace dlplan::onnx_import {
namespace {

constexpr int64_t kMaxRank = 16;
constexpr int64_t kMaxWindow = int64_t{1} << 31;

void check_dims(const onnx::ValueInfoProto& vi, const std::string& src) {
  if (!vi.type().has_tensor_type() || !vi.type().tensor_type().has_shape()) return;
  const auto& shape = vi.type().tensor_type().shape();
  if (shape.dim_size() > kMaxRank)
    throw Error(fmt::format("{}: tensor '{}' has rank {}, more than {}", src, vi.name(), shape.dim_size(), kMaxRank));
  for (const auto& d : shape.dim())
    if (d.has_dim_value() && (d.dim_value() < 0 || d.dim_value() > kMaxTensorElements))
      throw Error(fmt::format("{}: tensor '{}' has dimension {}, outside [0, 2^48]", src, vi.name(), d.dim_value()));
}

void check_initializer(const onnx::TensorProto& t, const std::string& src) {
  if (t.dims_size() > kMaxRank)
    throw Error(fmt::format("{}: initializer '{}' has rank {}, more than {}", src, t.name(), t.dims_size(), kMaxRank));
  // Each dimension, then their product (checked before it can overflow: the
  // importer multiplies initializer shapes freely from here on).
  int64_t elements = 1;
  for (int64_t d : t.dims()) {
    if (d < 0 || d > kMaxTensorElements)
      throw Error(fmt::format("{}: initializer '{}' has dimension {}, outside [0, 2^48]", src, t.name(), d));
    if (d > 0 && elements > kMaxTensorElements / d)
      throw Error(fmt::format("{}: initializer '{}' has more than 2^48 elements", src, t.name()));
    elements *= d;
  }
}

// kernel_shape, strides, dilations >= 1; pads >= 0; group >= 1 (every op that has them).
void check_window(const onnx::NodeProto& n, int i, const std::string& src) {
  for (const auto& a : n.attribute()) {
    const std::string& k = a.name();
    const bool positive = k == "kernel_shape" || k == "strides" || k == "dilations";
    if (!positive && k != "pads" && k != "group") continue;
    std::vector<int64_t> values(a.ints().begin(), a.ints().end());
    if (a.has_i()) values.push_back(a.i());
    const int64_t lo = k == "pads" ? 0 : 1;
    for (int64_t v : values)
      if (v < lo || v > kMaxWindow)
        throw Error(fmt::format("{}: {}: attribute '{}' holds {}, outside [{}, 2^31]", src, label(n, i), k, v, lo));
  }
}

}  // namespace

int64_t default_opset(const onnx::ModelProto& model) {
  int64_t opset = -1;
  for (const auto& o : model.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") opset = o.version();
  return opset;
}

std::string check_before_inference(const onnx::ModelProto& model, const std::string& src) {
  const auto& g = model.graph();
  if (g.node_size() > kMaxNodes)
    throw Error(fmt::format("{}: {} nodes are more than dlplan's limit of {}", src, g.node_size(), kMaxNodes));
  for (const auto& vi : g.input()) check_dims(vi, src);
  for (const auto& vi : g.value_info()) check_dims(vi, src);
  for (const auto& vi : g.output()) check_dims(vi, src);
  for (const auto& t : g.initializer()) check_initializer(t, src);

  const int64_t opset = default_opset(model);
  std::string skip;
  if (opset <= 0 || opset > std::numeric_limits<int>::max()) skip = "the model declares no opset for the ONNX domain";
  for (int i = 0; i < g.node_size(); ++i) {
    const auto& n = g.node(i);
    check_window(n, i, src);
    for (const auto& a : n.attribute())
      if (a.type() == onnx::AttributeProto::GRAPH || a.type() == onnx::AttributeProto::GRAPHS || a.has_g() ||
          a.graphs_size() > 0)
        if (skip.empty()) skip = fmt::format("{} holds a subgraph (control flow)", label(n, i));
    if (opset <= 0 || opset > std::numeric_limits<int>::max()) continue;
    const std::string domain = n.domain() == "ai.onnx" ? "" : n.domain();
    const onnx::OpSchema* schema = onnx::OpSchemaRegistry::Schema(n.op_type(), static_cast<int>(opset), domain);
    if (schema == nullptr) continue;  // an op libonnx does not know: inference passes it by
    try {
      schema->Verify(n);
    } catch (const std::exception& e) {
      throw Error(fmt::format("{}: {} does not match the ONNX schema of {} (opset {}): {}", src, label(n, i), n.op_type(),
                              opset, e.what()));
    }
  }
  return skip;
}

}  // namespace dlplan::onnx_import

#endif  // DLPLAN_HAVE_ONNX
