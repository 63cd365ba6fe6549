// The model IR (DESIGN.md, "Model IR"): a DAG of ops over per-sample tensors.
// The batch dimension is implicit; the plan chooses the micro-batch.
//
// A Model is what the loader produces from IR JSON after validation and shape
// inference: tensors (model inputs first, then one output per node), nodes in
// a topological order (Boost.Graph), units, and the parameter list.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dlplan {

// f32 and i32 in the IR; bf16 and f16 are storage types of the executor
// (bf16-mixed and fp16-mixed keep parameters, gradients and activations in
// them), never IR dtypes.
enum class DType { f32, i32, bf16, f16 };
const char* to_string(DType d);

using Shape = std::vector<int64_t>;
int64_t numel(const Shape& s);
std::string to_string(const Shape& s);
// NumPy broadcasting: the shapes aligned from the last dimension, each pair
// equal or one of them 1. nullopt when they do not broadcast.
std::optional<Shape> broadcast_shape(const Shape& a, const Shape& b);
// For each element of an array of shape `extent`, in row-major order, the
// offset sum_k index[k] * stride[k]: where a strided view (a permutation, a
// broadcast with stride 0) reads it.
std::vector<int64_t> strided_offsets(const Shape& extent, const std::vector<int64_t>& stride);
// NumPy broadcasting of `in` to `out` (broadcast_shape's result): for each
// element of `out`, in row-major order, the offset of the element of `in` it
// reads. The ONNX importer's constant folding and the CPU engine's
// broadcasting ops both use it.
std::vector<int64_t> broadcast_offsets(const Shape& out, const Shape& in);

enum class OpKind {
  embedding, pos_embedding, cls_token, linear, conv2d, batchnorm, layernorm,
  rmsnorm, gelu, relu, silu, tanh, sigmoid, clip, hardsigmoid, hardswish, add, mul, scale,
  affine, pow, sqrt, reciprocal, reduce_mean, concat, transpose, reshape, slice, attention, moe_router, moe_expert,
  moe_combine, maxpool2d,
  avgpool2d, global_avgpool, flatten, tokens, select, dropout, cross_entropy, opaque,
  relative_position_bias, matmul, softmax, causal_mask, alibi, rope, leaky_relu, elu, softplus, mish, prelu,
  groupnorm, upsample, conv_transpose2d, lstm, gru, rnn, window_position_bias, window_mask, shift, erf, drop_path, pad, reduce_sum, reduce_l2, acos,
  parameter,
};
const char* to_string(OpKind op);

// ALiBi's slope of each of `heads` heads (Press et al. 2022, "Train Short,
// Test Long", Sec. 3; the closest-power-of-two rule of BLOOM's
// build_alibi_tensor for other head counts).
std::vector<double> alibi_slopes(int64_t heads);

// Swin's relative position index (Liu et al. 2021, "Swin Transformer",
// Sec. 3.2; torchvision's _get_relative_position_index): the row of the
// [(2 Wh - 1)(2 Ww - 1), heads] bias table that query p and key q of one
// Wh x Ww window read, from their 2-D offset. Positions run row-major over the
// window (p = y Ww + x).
int64_t window_relative_index(int64_t p, int64_t q, int64_t window_h, int64_t window_w);
// The same with a class token at position 0 of Wh Ww + 1 (BEiT's relative
// position bias, Bao et al. 2022, "BEiT", Sec. 2.2; transformers'
// BeitRelativePositionBias): the patches read window_relative_index of
// p - 1 and q - 1, and three more rows after the (2 Wh - 1)(2 Ww - 1) serve
// the class token: class to patch, patch to class, class to class.
int64_t window_relative_index_with_cls(int64_t p, int64_t q, int64_t window_h, int64_t window_w);

// Swin's shifted-window mask (torchvision 0.14's shifted_window_attention):
// the padded map of windows[0] x windows[1] windows of window[0] x window[1],
// rolled back by shift, falls into 3 x 3 regions; whether query p and key q
// of window w (row-major over the windows) come from different regions, and
// so are masked.
bool window_mask_hides(int64_t w, int64_t p, int64_t q, const std::array<int64_t, 2>& windows,
                       const std::array<int64_t, 2>& window, const std::array<int64_t, 2>& shift);

struct TensorInfo {
  std::string name;   // model input name, or the producing node's name
  Shape shape;        // per sample
  DType dtype = DType::f32;
  int producer = -1;  // node index, -1 for a model input
  // False for a tensor computed once per step rather than per sample: a
  // `parameter` node's output and whatever is computed from such tensors
  // alone (MobileBERT's head weight cat([E^T, W]), Swin V2's logit scale).
  // The planner counts it once, not per sample; the engines hold it as
  // [1, ...], and add, mul and matmul broadcast it over the micro-batch.
  bool batched = true;
};

// Attributes with every default filled in (the loader validates names/types).
struct Attrs {
  nlohmann::ordered_json values = nlohmann::ordered_json::object();
  int64_t integer(const char* key) const;
  double number(const char* key) const;
  bool flag(const char* key) const;
  std::string text(const char* key) const;
  std::array<int64_t, 2> pair(const char* key) const;  // int or [h, w]
  std::vector<int64_t> ints(const char* key) const;    // a list of integers
  bool has(const char* key) const { return values.contains(key) && !values[key].is_null(); }
};

struct Node {
  std::string name;
  OpKind op{};
  std::vector<int> inputs;  // tensor ids
  int output = -1;          // tensor id
  int unit = 0;             // index into Model::units; 0 is the root unit
  Attrs attrs;
};

// A causal_mask's queries' axis among the `rank` per-sample axes of its
// input: the attribute query_axis, or the second to last (the keys' axis is
// the last).
int64_t causal_query_axis(const Node& n, size_t rank);

// One parameter tensor (or buffer) with the node that owns it.
struct ParamInfo {
  std::string name;     // "<node>.weight", "<node>.bias", ...
  int node = -1;
  int unit = 0;         // tied parameters belong to the root unit
  int64_t numel = 0;
  bool weight_decay = false;  // weights of linear, conv and embedding
  Shape shape;                // PyTorch's layout (ParamDecl::shape), for exported weights
  bool trainable = true;      // false: frozen (--freeze, or a base weight under --lora)
  bool adapter = false;       // a LoRA adapter (lora_A, lora_B), added by apply_fine_tuning
};

// "node 'h.0.attn' (attention)": how every message names a node.
std::string node_label(const Node& n);
// Throws dlplan::Error "<source>: node '<name>' (<op>): <message>".
[[noreturn]] void node_error(const std::string& source, const Node& n, const std::string& message);

struct Model {
  std::string name;
  std::string source;                 // file name or zoo name, for messages
  std::vector<TensorInfo> tensors;    // model inputs first, then node outputs
  std::vector<int> inputs;            // tensor ids of the model inputs
  std::vector<Node> nodes;            // topological order
  std::vector<std::string> units;     // units[0] == "" is the root unit
  std::vector<ParamInfo> params;      // parameters, in node order
  std::vector<ParamInfo> buffers;     // non-trainable state (BN running stats)
  nlohmann::ordered_json ir;          // the IR with defaults made explicit
  // Filled by importers (ONNX, Hugging Face): what the importer could not map
  // or had to assume, one line each, and the activation bytes per sample of
  // unmapped ops that the plan does not count (reported, never hidden).
  std::vector<std::string> notes;
  int64_t unaccounted_bytes = 0;

  int64_t parameter_count() const;            // adapters included
  int64_t trainable_parameter_count() const;  // what the optimizer updates
  int64_t base_parameter_count() const;       // the model's own, without adapters
  int64_t buffer_count() const;
  const TensorInfo& tensor(int id) const { return tensors.at(static_cast<size_t>(id)); }
  const TensorInfo& output_of(const Node& n) const { return tensor(n.output); }
  int node_index(const std::string& name) const;  // -1 if absent
};

}  // namespace dlplan
