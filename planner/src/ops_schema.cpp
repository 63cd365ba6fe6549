// Attribute schemas and shape inference for every op of DESIGN.md's table.
#include "dlplan/conv_window.hpp"
#include "dlplan/norm_width.hpp"
#include "dlplan/error.hpp"
#include "dlplan/ops.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <optional>

namespace dlplan {
namespace {

using Json = nlohmann::json;

enum class AttrType { integer, number, boolean, text, int_or_pair, int_list };

// `def` null: required. A string "(derived)" default: filled by shape inference.
// `optional_null`: may be absent and stays null (linear's tie).
struct AttrSpec {
  const char* key;
  AttrType type;
  Json def;
  bool optional_null = false;
};

struct OpSpec {
  OpKind kind;
  const char* name;
  int inputs;  // kVariadic: one or more
  std::vector<AttrSpec> attrs;
};

const Json kDerived = "(derived)";

const std::vector<OpSpec>& op_table() {
  using T = AttrType;
  static const std::vector<OpSpec> table = {
      // tie: another embedding node whose table this one reads (T5's encoder
      // and decoder share one); the table and its gradient are that node's.
      {OpKind::embedding, "embedding", 1,
       {{"num", T::integer, nullptr}, {"dim", T::integer, nullptr}, {"scale", T::number, 1.0},
        {"padding_idx", T::integer, nullptr, true}, {"tie", T::text, nullptr, true}}},
      {OpKind::pos_embedding, "pos_embedding", 1,
       {{"max_len", T::integer, kDerived}, {"row", T::integer, nullptr, true}, {"offset", T::integer, nullptr, true},
        {"sinusoidal", T::text, nullptr, true}, {"frequency_step", T::number, nullptr, true}}},
      {OpKind::cls_token, "cls_token", 1, {}},
      // scale: the input's factor, out = (scale x) W^T + b (absent: 1; T5's
      // tied head reads the decoder's output times d_model^-1/2)
      {OpKind::linear, "linear", 1,
       {{"out", T::integer, nullptr}, {"bias", T::boolean, true}, {"tie", T::text, nullptr, true},
        {"scale", T::number, nullptr, true}}},
      {OpKind::conv2d, "conv2d", 1,
       {{"out", T::integer, nullptr}, {"kernel", T::int_or_pair, nullptr}, {"stride", T::int_or_pair, 1},
        {"padding", T::int_or_pair, 0}, {"dilation", T::int_or_pair, 1}, {"groups", T::integer, 1},
        {"bias", T::boolean, true}}},
      {OpKind::conv_transpose2d, "conv_transpose2d", 1,
       {{"out", T::integer, nullptr}, {"kernel", T::int_or_pair, nullptr}, {"stride", T::int_or_pair, 1},
        {"padding", T::int_or_pair, 0}, {"output_padding", T::int_or_pair, 0}, {"groups", T::integer, 1},
        {"bias", T::boolean, true}}},
      // nn.LSTM, one layer: [T, in] -> [T, hidden], gates in PyTorch's order
      // (input, forget, cell, output); bidirectional: a second direction over
      // the reversed sequence, its hidden states beside the first's, [T, 2 hidden].
      {OpKind::lstm, "lstm", 1,
       {{"hidden", T::integer, nullptr}, {"bias", T::boolean, true}, {"bidirectional", T::boolean, false}}},
      // nn.GRU, one layer, as lstm: gates in PyTorch's order (reset, update, new).
      {OpKind::gru, "gru", 1,
       {{"hidden", T::integer, nullptr}, {"bias", T::boolean, true}, {"bidirectional", T::boolean, false}}},
      // nn.RNN (Elman), one layer, as lstm: h_t = act(x_t W_ih^T + b_ih +
      // h_{t-1} W_hh^T + b_hh), nonlinearity "tanh" or "relu".
      {OpKind::rnn, "rnn", 1,
       {{"hidden", T::integer, nullptr}, {"bias", T::boolean, true}, {"bidirectional", T::boolean, false},
        {"nonlinearity", T::text, "tanh"}}},
      {OpKind::batchnorm, "batchnorm", 1, {{"eps", T::number, 1e-5}, {"momentum", T::number, 0.1}}},
      // dims: the trailing per-sample axes normalised together, 1 (the last)
      // by default; nn.LayerNorm([C, H, W]) is 3. Weight and bias: their shape.
      {OpKind::layernorm, "layernorm", 1,
       {{"eps", T::number, 1e-5}, {"bias", T::boolean, true}, {"dims", T::integer, 1}}},
      {OpKind::rmsnorm, "rmsnorm", 1, {{"eps", T::number, 1e-6}, {"offset", T::number, 0.0}}},
      // GroupNorm (Wu & He 2018): x [C, ...] in `groups` groups of C/groups
      // channels, each group of a sample normalised over its channels and
      // positions; affine: a weight and a bias [C] (nn.GroupNorm's default)
      {OpKind::groupnorm, "groupnorm", 1,
       {{"groups", T::integer, nullptr}, {"eps", T::number, 1e-5}, {"affine", T::boolean, true}}},
      // nn.Upsample(scale_factor=s, mode="nearest"), F.interpolate's default:
      // each value of x [C, H, W] repeated s_h x s_w times (whole factors; an
      // integer, or [s_h, s_w]); over [C, L], the length's (s, or [1, s])
      {OpKind::upsample, "upsample", 1,
       {{"scale", T::int_or_pair, nullptr}, {"mode", T::text, "nearest"}, {"align_corners", T::boolean, false}}},
      {OpKind::gelu, "gelu", 1, {{"approximate", T::text, "none"}}},
      {OpKind::relu, "relu", 1, {}},
      {OpKind::silu, "silu", 1, {}},
      {OpKind::tanh, "tanh", 1, {}},
      {OpKind::sigmoid, "sigmoid", 1, {}},
      // min(max(x, min), max): ReLU6 (0, 6), Hardtanh (-1, 1); ONNX Clip
      {OpKind::clip, "clip", 1, {{"min", T::number, nullptr}, {"max", T::number, nullptr}}},
      // PyTorch's Hardsigmoid relu6(x + 3) / 6 and Hardswish x relu6(x + 3) / 6
      // (MobileNetV3); ONNX HardSigmoid (alpha 1/6, beta 0.5) and HardSwish
      {OpKind::hardsigmoid, "hardsigmoid", 1, {}},
      {OpKind::hardswish, "hardswish", 1, {}},
      // PyTorch's LeakyReLU (ONNX LeakyRelu, alpha): x for x > 0, else slope x
      {OpKind::leaky_relu, "leaky_relu", 1, {{"slope", T::number, 0.01}}},
      // ELU (ONNX Elu): x for x > 0, else alpha (exp(x) - 1)
      {OpKind::elu, "elu", 1, {{"alpha", T::number, 1.0}}},
      // Softplus (ONNX Softplus): log(1 + exp(x)), and x above PyTorch's
      // threshold 20 (beta 1; torch exports another beta around it)
      {OpKind::softplus, "softplus", 1, {}},
      // Mish (Misra 2019): x tanh(softplus(x)); torch exports nn.Mish below
      // opset 18 as Softplus, Tanh and Mul, which the importer fuses back
      {OpKind::mish, "mish", 1, {}},
      // PReLU: x for x > 0, else a x with a learned slope a of `shape`,
      // broadcast as scale's gamma ([1]: one slope; [C, 1, 1]: one a channel)
      {OpKind::prelu, "prelu", 1, {{"shape", T::int_list, nullptr}}},
      // x + b with a learned b of `shape`, broadcast as scale's gamma: a bias
      // added outside a projection (I-BERT's LayerNorm written out in Python,
      // x * weight + bias; GPT-NeoX-Japanese's bias added after its dropout)
      {OpKind::shift, "shift", 1, {{"shape", T::int_list, nullptr}}},
      {OpKind::add, "add", 2, {}},
      // Elementwise math that Python writes out (Hugging Face's NewGELUActivation,
      // LlamaRMSNorm), planned op by op as PyTorch's eager autograd runs it
      // (ONNX import with --fusion eager):
      // scale x + shift, both constants (x * 0.5, x + 1, x / c, c - x)
      {OpKind::affine, "affine", 1, {{"scale", T::number, 1.0}, {"shift", T::number, 0.0}}},
      // x^exponent, a constant exponent (torch.pow(x, 3.0), x.pow(2))
      {OpKind::pow, "pow", 1, {{"exponent", T::number, nullptr}}},
      {OpKind::sqrt, "sqrt", 1, {}},
      {OpKind::reciprocal, "reciprocal", 1, {}},
      // the error function (a GELU written out in Python: ESM's)
      {OpKind::erf, "erf", 1, {}},
      // arccos (YOSO's expected collision probability 1 - acos(q k) / pi)
      {OpKind::acos, "acos", 1, {}},
      // x.mean(axis, keepdim): the mean over one per-sample axis (negative:
      // from the last; -1, the last, by default)
      {OpKind::reduce_mean, "reduce_mean", 1, {{"keepdims", T::boolean, false}, {"axis", T::integer, -1}}},
      // x.sum(axis, keepdim) over one per-sample axis (SwiftFormer's sum of
      // its weighted queries over the tokens)
      {OpKind::reduce_sum, "reduce_sum", 1, {{"keepdims", T::boolean, false}, {"axis", T::integer, -1}}},
      // sqrt(sum of x^2) over one per-sample axis: torch.norm(x, dim=k) and
      // F.normalize's norm (SwiftFormer's), ONNX ReduceL2
      {OpKind::reduce_l2, "reduce_l2", 1, {{"keepdims", T::boolean, false}, {"axis", T::integer, -1}}},
      {OpKind::mul, "mul", 2, {}},
      // The product of two activations outside an attention pattern (torch's
      // matmul, bmm, @): a [..., M, K] x b [..., K, N] -> [..., M, N], the
      // leading per-sample dimensions NumPy-broadcast (Falcon's one KV head
      // against its query heads).
      {OpKind::matmul, "matmul", 2, {}},
      // softmax over the last axis, outside an attention pattern
      {OpKind::softmax, "softmax", 1, {}},
      // A causal mask a graph builds itself, over the last two axes [..., T, T]
      // (key j, query i): x + `value` where j > i, x elsewhere (OPT adds
      // finfo.min); with `fill`, `value` replaces x there (GPT-NeoX's
      // torch.where(causal, x, finfo.min)). Keeps nothing.
      // query_axis (absent: the second to last): the queries' axis, the keys'
      // being the last; GPT-BigCode's multi-query scores are [T, H, T].
      {OpKind::causal_mask, "causal_mask", 1,
       {{"value", T::number, nullptr}, {"fill", T::boolean, false}, {"query_axis", T::integer, kDerived}}},
      // ALiBi's linear position bias on scores [..., H, T, Tk]: head h adds
      // slope_h * j at key j (alibi_slopes; BLOOM's baddbmm with its alibi
      // tensor). Keeps nothing.
      {OpKind::alibi, "alibi", 1, {}},
      // Swin's relative position bias on the scores of each window [..., H,
      // T, T], T = window[0] * window[1]: query p and key q of head h add
      // table[window_relative_index(p, q), h] of a learned [(2 Wh - 1)(2 Ww -
      // 1), H] table (torchvision's relative_position_bias_table read at
      // relative_position_index). Keeps nothing.
      // cls (absent: false): a class token at position 0 besides the Wh Ww
      // patches, reading three more rows (BEiT's; window_relative_index_with_cls).
      {OpKind::window_position_bias, "window_position_bias", 1,
       {{"window", T::int_or_pair, nullptr}, {"cls", T::boolean, kDerived}}},
      // Swin's shifted-window mask on scores [windows[0] windows[1], H, T, T]:
      // `value` (torchvision: -100) added where query and key of a window
      // came from different regions of the rolled map (window_mask_hides).
      // Keeps nothing.
      {OpKind::window_mask, "window_mask", 1,
       {{"windows", T::int_or_pair, nullptr}, {"window", T::int_or_pair, nullptr},
        {"shift", T::int_or_pair, nullptr}, {"value", T::number, -100.0}}},
      // Rotary position embedding outside an attention pattern (GPT-NeoX's,
      // Falcon's), rotate-half form on x [..., T, d]: for position t and
      // i < d/2, angle t theta^(-2i/d), (x_i, x_{i+d/2}) -> (x_i cos - x_{i+d/2}
      // sin, x_{i+d/2} cos + x_i sin). `interleaved` (GPT-J's, CodeGen's
      // rotate_every_two): the pairs are (x_2i, x_2i+1) instead. The positions
      // are axis `position_axis` of x (counted from the end; -2, or -3 for
      // GPT-J's [T, H, d], whose axes between it and d share its angle).
      // Keeps nothing (the tables are constants).
      {OpKind::rope, "rope", 1,
       {{"theta", T::number, 10000.0}, {"interleaved", T::boolean, false}, {"position_axis", T::integer, -2}}},
      // x times a learned tensor of per-sample shape `shape` that broadcasts
      // to x's (ConvNeXt's layer_scale gamma [C, 1, 1], CaiT's LayerScale), plus
      // `offset`: x (w + offset), w starting at 0 when offset is 1 (a written-
      // out GemmaRMSNorm's weight, as rmsnorm's offset)
      {OpKind::scale, "scale", 1, {{"shape", T::int_list, nullptr}, {"offset", T::number, 0.0}}},
      // torch.cat along a per-sample axis (0: channels of [C, H, W]); DenseNet, SqueezeNet
      {OpKind::concat, "concat", kVariadic, {{"axis", T::integer, 0}}},
      // x.permute(perm) over the per-sample axes (ConvNeXt's [C, H, W] ->
      // [H, W, C] around its LayerNorm); the output is a contiguous copy
      {OpKind::transpose, "transpose", 1, {{"perm", T::int_list, nullptr}}},
      // x.reshape(shape) over the per-sample axes (view/reshape/squeeze/
      // unsqueeze); the same elements in the same order. view (absent:
      // false): PyTorch's view of its input, as slice's below.
      {OpKind::reshape, "reshape", 1, {{"shape", T::int_list, nullptr}, {"view", T::boolean, kDerived}}},
      // x.narrow(axis, start, end - start) over a per-sample axis (ShuffleNetV2's
      // channel split, torch.chunk)
      // view (absent: false): PyTorch's view of its input (x[..., a:b],
      // torch.chunk), as --fusion eager plans an imported graph: an op that
      // keeps it for backward keeps the input's whole storage (the step
      // program keeps the input and cuts the slice again for that backward).
      // step (absent: 1): every step-th element from start, x[..., a:b:s]
      // (Swin's patch merging reads x[:, 0::2, 1::2, :]).
      {OpKind::slice, "slice", 1,
       {{"axis", T::integer, nullptr}, {"start", T::integer, nullptr}, {"end", T::integer, nullptr},
        {"step", T::integer, 1}, {"view", T::boolean, kDerived}}},
      // F.pad(x, ..., "constant", value) over the per-sample axes: `pads` holds
      // the elements added before each axis, then after each (ONNX Pad's
      // order, the batch's left out), none negative; the added elements
      // hold `value`. Hugging Face's MobileNets pad TensorFlow's "same"
      // way, more after than before, ahead of a convolution without padding.
      {OpKind::pad, "pad", 1, {{"pads", T::int_list, nullptr}, {"value", T::number, 0.0}}},
      // Inputs: x [T, D]; with cross, then the sequence keys and values are
      // projected from, memory [Tk, Dm] (an encoder's output: T5's
      // EncDecAttention); with position_bias, last a bias [heads, T, Tk] added
      // to the scaled scores (T5's relative position bias). scale: the
      // scores' factor, absent 1/sqrt(head_dim) (T5 folds it into its
      // initialisation and uses 1).
      {OpKind::attention, "attention", kVariadic,
       {{"heads", T::integer, nullptr}, {"kv_heads", T::integer, kDerived}, {"head_dim", T::integer, kDerived},
        {"causal", T::boolean, false}, {"bias", T::boolean, true}, {"qkv_bias", T::boolean, kDerived},
        {"out_bias", T::boolean, kDerived}, {"dropout", T::number, 0.0}, {"rope", T::boolean, false},
        {"rope_theta", T::number, 10000.0}, {"rotary_dim", T::integer, kDerived}, {"cross", T::boolean, kDerived},
        {"position_bias", T::boolean, kDerived}, {"scale", T::number, nullptr, true}}},
      // T5's relative position bias (Raffel et al. 2020, Sec. 2.1; HF
      // T5Attention.compute_bias): a learned table [buckets, heads] read at
      // the bucket of each key's offset from its query, out [heads, T, T]
      // for the T positions of the input (ids [T]; their values are not
      // read). Offsets bucket exactly below buckets/4 (/2 when
      // not bidirectional), logarithmically up to max_distance, one bucket
      // beyond; bidirectional halves the buckets between earlier and later
      // keys (the encoder), else only earlier keys count (the decoder).
      {OpKind::relative_position_bias, "relative_position_bias", 1,
       {{"heads", T::integer, nullptr}, {"buckets", T::integer, 32}, {"max_distance", T::integer, 128},
        {"bidirectional", T::boolean, true}}},
      // A mixture-of-experts feed-forward layer (Mixtral's block_sparse_moe;
      // GShard, Lepikhin et al. 2020; Switch, Fedus et al. 2021) as 2 + E
      // nodes (ops.hpp, MoeRouting). moe_router: x [T, D] -> softmax(x W^T)
      // [T, experts]. moe_expert `expert` of width `hidden`: (x, the router's
      // probabilities) -> the SwiGLU MLP on the tokens routed to it, in
      // place order [capacity, D]. moe_combine: (probabilities, the experts'
      // places in expert order) -> each token's expert outputs times its
      // gates [T, D]. Experts and combine route alike: the top_k experts of
      // each token; every expert takes at most `capacity` tokens of a sample
      // (derived: min(T, ceil(capacity_factor T top_k / experts))) and the
      // choices over it are dropped, so that every buffer is fixed and
      // declared. normalize: the chosen gates are renormalised to sum to one
      // (Mixtral); false keeps the softmax probabilities (Switch).
      {OpKind::moe_router, "moe_router", 1, {{"experts", T::integer, nullptr}}},
      {OpKind::moe_expert, "moe_expert", 2,
       {{"expert", T::integer, nullptr}, {"hidden", T::integer, nullptr}, {"top_k", T::integer, 2},
        {"capacity_factor", T::number, 1.25}, {"capacity", T::integer, kDerived}}},
      {OpKind::moe_combine, "moe_combine", kVariadic,
       {{"top_k", T::integer, 2}, {"capacity_factor", T::number, 1.25}, {"capacity", T::integer, kDerived},
        {"normalize", T::boolean, true}}},
      // ceil_mode (absent: false): PyTorch's, rounding the output size up (SqueezeNet).
      // eager (absent: false): keep what PyTorch's max_pool2d_with_indices keeps
      // for backward (derivatives.yaml: self and the int64 indices), as
      // --fusion eager plans an imported graph; else only int32 indices, as
      // dlplan's engines need.
      {OpKind::maxpool2d, "maxpool2d", 1,
       {{"kernel", T::int_or_pair, nullptr}, {"stride", T::int_or_pair, kDerived}, {"padding", T::int_or_pair, 0},
        {"ceil_mode", T::boolean, kDerived}, {"eager", T::boolean, kDerived}}},
      // count_include_pad (absent: true): divide by the whole window, zeros
      // of the padding included, as nn.AvgPool2d's default; false: by the
      // elements inside the input (PoolFormer's). eager (absent: false): keep
      // the input, as PyTorch's avg_pool2d does (derivatives.yaml:
      // avg_pool2d_backward(grad, self, ...)); dlplan's engines need only
      // the sizes.
      {OpKind::avgpool2d, "avgpool2d", 1,
       {{"kernel", T::int_or_pair, nullptr}, {"stride", T::int_or_pair, kDerived}, {"padding", T::int_or_pair, 0},
        {"count_include_pad", T::boolean, kDerived}, {"eager", T::boolean, kDerived}}},
      // keepdims (absent: false): [C, 1, 1] instead of [C], as a squeeze-and-
      // excitation block's 1x1 convolutions read it (ONNX GlobalAveragePool).
      {OpKind::global_avgpool, "global_avgpool", 1, {{"keepdims", T::boolean, kDerived}}},
      {OpKind::flatten, "flatten", 1, {{"view", T::boolean, kDerived}}},  // view: as reshape's
      {OpKind::tokens, "tokens", 1, {}},
      // x[:, index] over the first per-sample axis; view (absent: false):
      // PyTorch's view of its input, as slice's (an LSTM's output[:, -1]).
      {OpKind::select, "select", 1, {{"index", T::integer, 0}, {"view", T::boolean, kDerived}}},
      {OpKind::dropout, "dropout", 1, {{"p", T::number, nullptr}}},
      // Stochastic depth (Huang et al. 2016, "Deep Networks with Stochastic
      // Depth"; timm's and Hugging Face's drop_path): each sample is kept
      // with probability 1 - p, as a whole, and scaled by 1 / (1 - p):
      // y = x floor(1 - p + u) / (1 - p), u uniform per sample. Keeps that
      // factor, one float a sample (PyTorch's mul keeps its random tensor).
      {OpKind::drop_path, "drop_path", 1, {{"p", T::number, nullptr}}},
      {OpKind::cross_entropy, "cross_entropy", 2, {{"fused", T::boolean, false}}},
      // A learned tensor of `shape`, read as a tensor rather than applied by an
      // op: a weight the graph builds from parameters (MobileBERT's head
      // multiplies by cat([E^T, W])). No inputs; its output has no batch axis
      // (TensorInfo::batched). tie: the embedding whose table it is.
      {OpKind::parameter, "parameter", 0, {{"shape", T::int_list, nullptr}, {"tie", T::text, nullptr, true}}},
      // An op of an imported graph that dlplan does not know (`source`: the
      // ONNX op type): planned with its output (per-sample `shape`) and every
      // input kept for backward, the conservative choice; no engine trains it
      // keep_inputs (absent: true): false where the op's derivative is known to
      // need none of them (adding a constant the importer evaluated).
      {OpKind::opaque, "opaque", kVariadic,
       {{"shape", T::int_list, nullptr}, {"source", T::text, ""}, {"keep_inputs", T::boolean, kDerived}}},
  };
  return table;
}

const OpSpec& spec_of(OpKind k) {
  for (const auto& s : op_table())
    if (s.kind == k) return s;
  throw std::logic_error("op without a spec");
}

const char* type_name(AttrType t) {
  switch (t) {
    case AttrType::integer: return "an integer";
    case AttrType::number: return "a number";
    case AttrType::boolean: return "true or false";
    case AttrType::text: return "a string";
    case AttrType::int_or_pair: return "an integer or [h, w]";
    case AttrType::int_list: return "a list of integers";
  }
  return "?";
}

bool type_ok(AttrType t, const Json& v) {
  switch (t) {
    case AttrType::integer: return v.is_number_integer();
    case AttrType::number: return v.is_number();
    case AttrType::boolean: return v.is_boolean();
    case AttrType::text: return v.is_string();
    case AttrType::int_or_pair:
      return v.is_number_integer() ||
             (v.is_array() && v.size() == 2 && v[0].is_number_integer() && v[1].is_number_integer());
    case AttrType::int_list:
      return v.is_array() && std::all_of(v.begin(), v.end(), [](const Json& e) { return e.is_number_integer(); });
  }
  return false;
}

// Error helper: "<file>: node '<name>' (<op>): <message>".
struct NodeError {
  const std::string& where;
  const Node& n;
  template <typename... Args>
  [[noreturn]] void operator()(fmt::format_string<Args...> f, Args&&... args) const {
    node_error(where, n, fmt::format(f, std::forward<Args>(args)...));
  }
};

// Sizes beyond 2^48 elements per tensor are refused: far beyond any device,
// and products of such sizes would overflow 64-bit byte counts.
constexpr int64_t kMaxElems = int64_t{1} << 48;

int64_t checked_numel(const Shape& s, const NodeError& fail) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d <= 0) fail("output shape {} has a non-positive dimension", to_string(s));
    if (n > kMaxElems / d) fail("output shape {} is too large (more than 2^48 elements)", to_string(s));
    n *= d;
  }
  return n;
}

int64_t positive(const Node& n, const char* key, const NodeError& fail) {
  int64_t v = n.attrs.integer(key);
  if (v <= 0) fail("attribute '{}' must be positive, got {}", key, v);
  if (v > kMaxElems) fail("attribute '{}' = {} is too large", key, v);
  return v;
}

const TensorInfo& expect_rank(const Model& m, const Node& n, int input, size_t min_rank, size_t max_rank,
                              const char* what, const NodeError& fail) {
  const TensorInfo& t = m.tensor(n.inputs[static_cast<size_t>(input)]);
  if (t.shape.size() < min_rank || t.shape.size() > max_rank)
    fail("input '{}' has shape {}, expected {}", t.name, to_string(t.shape), what);
  return t;
}

void expect_float(const TensorInfo& t, const NodeError& fail) {
  if (t.dtype != DType::f32) fail("input '{}' is {}, expected f32", t.name, to_string(t.dtype));
}

// A parameter tensor obeys the same bound as activations: a product of sizes
// each allowed on its own (num x dim, in x out) could otherwise overflow the
// 64-bit counts downstream and come out as a silent wrong number.
void check_weight(const char* what, std::initializer_list<int64_t> dims, const NodeError& fail) {
  double n = 1;
  for (int64_t d : dims) n *= static_cast<double>(d);
  if (n > static_cast<double>(kMaxElems))
    fail("{} would hold {:.3g} elements, too large (more than 2^48)", what, n);
}

// A mixture of experts' routing input: the router's probabilities [T, E]
// (T = tokens when given).
const TensorInfo& moe_probabilities(const Model& m, const Node& n, int input, int64_t tokens, const NodeError& fail) {
  const TensorInfo& p = expect_rank(m, n, input, 2, 2, "the router's probabilities [T, experts]", fail);
  expect_float(p, fail);
  if (tokens >= 0 && p.shape[0] != tokens)
    fail("the router's probabilities '{}' {} are not over the {} tokens of its input", p.name, to_string(p.shape), tokens);
  return p;
}

// Places per expert: `capacity`, or GShard's capacity_factor * T * top_k /
// experts (rounded up), at most every token of the sample.
int64_t fill_capacity(Node& n, int64_t T, int64_t E, const NodeError& fail) {
  const int64_t k = positive(n, "top_k", fail);
  if (k > E) fail("top_k {} exceeds the router's {} experts", k, E);
  const double cf = n.attrs.number("capacity_factor");
  if (!(cf > 0 && std::isfinite(cf))) fail("attribute 'capacity_factor' must be positive, got {}", cf);
  if (!n.attrs.has("capacity")) {
    const double c = std::ceil(cf * static_cast<double>(T) * static_cast<double>(k) / static_cast<double>(E));
    n.attrs.values["capacity"] = static_cast<int64_t>(std::min(static_cast<double>(T), c));
  }
  const int64_t C = positive(n, "capacity", fail);
  if (C > T) fail("capacity {} exceeds the {} tokens of a sample", C, T);
  return C;
}

// moe_combine's input e + 1, when a moe_expert made it, must be expert e of
// the same router, routing as the combine does: else a token's gate would
// weigh another token's output.
void check_expert_routes_alike(const Model& m, const Node& combine, int e, const NodeError& fail) {
  const TensorInfo& places = m.tensor(combine.inputs[static_cast<size_t>(e + 1)]);
  if (places.producer < 0) return;
  const Node& x = m.nodes[static_cast<size_t>(places.producer)];
  if (x.op != OpKind::moe_expert) return;
  if (x.attrs.integer("expert") != e)
    fail("input {} is expert {}'s places ('{}'), where expert {}'s belong", e + 1, x.attrs.integer("expert"), x.name, e);
  if (x.inputs[1] != combine.inputs[0])
    fail("expert '{}' is routed by '{}', the combine by '{}'", x.name, m.tensor(x.inputs[1]).name,
         m.tensor(combine.inputs[0]).name);
  for (const char* key : {"top_k", "capacity"})
    if (x.attrs.integer(key) != combine.attrs.integer(key))
      fail("expert '{}' has {} {}, the combine {}", x.name, key, x.attrs.integer(key), combine.attrs.integer(key));
}

// Output size of a window op (conv, pooling): floor((in + 2p - k) / s) + 1.
int64_t window_out(int64_t in, int64_t k, int64_t s, int64_t p, const char* axis, const NodeError& fail) {
  if (k <= 0 || s <= 0 || p < 0) fail("kernel and stride must be positive and padding non-negative");
  if (k > kMaxElems || s > kMaxElems || p > kMaxElems) fail("kernel, stride or padding is too large");
  int64_t span = in + 2 * p - k;
  if (span < 0) fail("kernel {} does not fit the input's {} of {} with padding {}", k, axis, in, p);
  return span / s + 1;
}

// A convolution's or a transposed one's input ([C, H, W], or [C, L] for
// 1-D), out channels and groups (dividing both channel counts), and window.
struct ConvInput {
  const TensorInfo& x;
  int64_t out, groups;
  ConvWindow window;
};
ConvInput conv_input(const Model& m, const Node& n, const NodeError& fail) {
  const auto& x = expect_rank(m, n, 0, 2, 3, "[C, H, W], or [C, L] (1-D)", fail);
  expect_float(x, fail);
  const int64_t o = positive(n, "out", fail), g = positive(n, "groups", fail);
  if (x.shape[0] % g != 0 || o % g != 0)
    fail("groups {} must divide both the input channels {} and out {}", g, x.shape[0], o);
  return {x, o, g, conv_window(x.shape, n.attrs)};
}

// A transposed convolution's output along an axis (PyTorch's ConvTranspose2d):
// (in - 1) s - 2 p + k + output_padding, where output_padding < s picks
// among the sizes a strided convolution maps to `in`.
int64_t transposed_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t a, const char* axis,
                       const NodeError& fail) {
  if (k <= 0 || s <= 0 || p < 0 || a < 0) fail("kernel and stride must be positive, padding and output_padding non-negative");
  if (k > kMaxElems || s > kMaxElems || p > kMaxElems) fail("kernel, stride or padding is too large");
  if (a >= s) fail("output_padding {} must be smaller than the stride {} (PyTorch's rule)", a, s);
  const int64_t out = (in - 1) * s - 2 * p + k + a;
  if (out < 1) fail("padding {} leaves no output along the {} (input {}, kernel {}, stride {})", p, axis, in, k, s);
  return out;
}

// PyTorch's ceil_mode size (pooling_output_shape in ATen's Pool.h):
// ceil((in + 2p - k) / s) + 1, less one when the last window would start in
// the right padding or past it. window_out has checked the window fits.
int64_t ceil_window_out(int64_t in, int64_t k, int64_t s, int64_t p) {
  int64_t out = (in + 2 * p - k + s - 1) / s + 1;
  if ((out - 1) * s >= in + p) --out;
  return out;
}

// Whether n's output carries the batch axis: a parameter's does not, and
// an op computes once per step what it computes from such tensors alone.
// Beside per-sample inputs, only add, mul and matmul read one (broadcast
// over the micro-batch); BatchNorm's batch statistics and the loss need
// samples.
bool batched_output(const Model& m, const Node& n, const NodeError& fail) {
  if (n.op == OpKind::parameter) return false;
  bool any = false;
  std::string once;
  for (int id : n.inputs) {
    if (m.tensor(id).batched) any = true;
    else if (once.empty()) once = m.tensor(id).name;
  }
  if (once.empty()) return true;
  if (n.op == OpKind::batchnorm || n.op == OpKind::cross_entropy)
    fail("input '{}' has no batch axis (computed once per step from parameters); a {} cannot read it (it needs the "
         "samples)", once, to_string(n.op));
  const bool broadcasts = n.op == OpKind::add || n.op == OpKind::mul || n.op == OpKind::matmul;
  if (any && !broadcasts)
    fail("input '{}' has no batch axis (computed once per step from parameters); beside per-sample inputs, only add, "
         "mul and matmul read it, broadcasting it over the micro-batch", once);
  return any;
}

}  // namespace

const char* to_string(OpKind op) { return spec_of(op).name; }

int op_input_count(OpKind op) { return spec_of(op).inputs; }

bool op_from_string(const std::string& s, OpKind& out) {
  for (const auto& spec : op_table())
    if (s == spec.name) {
      out = spec.kind;
      return true;
    }
  return false;
}

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  for (const auto& spec : op_table()) names.emplace_back(spec.name);
  return names;
}

void check_and_fill_attrs(Node& n, const nlohmann::json& raw, const std::string& where) {
  const OpSpec& spec = spec_of(n.op);
  NodeError fail{where, n};
  for (const auto& [key, value] : raw.items()) {
    if (key == "name" || key == "op" || key == "in" || key == "unit") continue;
    if (key == "shares") {  // any op with parameters (loader.cpp checks the node it names)
      if (!value.is_string() || value.get<std::string>().empty())
        fail("attribute 'shares' must be the name of an earlier node, got {}", value.dump());
      n.attrs.values["shares"] = value;
      continue;
    }
    const AttrSpec* a = nullptr;
    for (const auto& s : spec.attrs)
      if (key == s.key) a = &s;
    if (!a) {
      std::vector<std::string> known;
      for (const auto& s : spec.attrs) known.emplace_back(s.key);
      fail("unknown attribute '{}' (known: {})", key, known.empty() ? "none" : fmt::format("{}", fmt::join(known, ", ")));
    }
    if (!type_ok(a->type, value)) fail("attribute '{}' must be {}, got {}", key, type_name(a->type), value.dump());
  }
  for (const auto& s : spec.attrs) {
    if (raw.contains(s.key)) {
      n.attrs.values[s.key] = raw.at(s.key);
    } else if (s.optional_null) {
      n.attrs.values[s.key] = nullptr;
    } else if (s.def.is_null()) {
      fail("missing required attribute '{}'", s.key);
    } else if (s.def != kDerived) {
      n.attrs.values[s.key] = s.def;
    }
  }
  if (n.op == OpKind::gelu) {
    auto a = n.attrs.text("approximate");
    if (a != "none" && a != "tanh") fail("attribute 'approximate' must be \"none\" or \"tanh\", got \"{}\"", a);
  }
  if (n.op == OpKind::upsample) {
    auto mode = n.attrs.text("mode");
    if (mode != "nearest" && mode != "linear") fail("attribute 'mode' must be \"nearest\" or \"linear\", got \"{}\"", mode);
    if (mode == "nearest" && n.attrs.flag("align_corners"))
      fail("attribute 'align_corners' applies to mode \"linear\" only, as in PyTorch");
  }
  for (const char* key : {"dropout", "p"})
    if (n.attrs.has(key)) {
      double p = n.attrs.number(key);
      if (!(p >= 0.0 && p < 1.0)) fail("attribute '{}' must be in [0, 1), got {}", key, p);
    }
  for (const char* key : {"eps", "rope_theta"})
    if (n.attrs.has(key) && !(n.attrs.number(key) > 0)) fail("attribute '{}' must be positive", key);
  if (n.op == OpKind::embedding && !std::isfinite(n.attrs.number("scale"))) fail("attribute 'scale' must be finite");
  if (n.op == OpKind::linear && n.attrs.has("scale") && !(std::isfinite(n.attrs.number("scale")) && n.attrs.number("scale") != 0))
    fail("attribute 'scale' must be finite and not zero, got {}", n.attrs.number("scale"));
  if ((n.op == OpKind::rmsnorm || n.op == OpKind::scale) && !std::isfinite(n.attrs.number("offset")))
    fail("attribute 'offset' must be finite");
  if (n.op == OpKind::affine && !(std::isfinite(n.attrs.number("scale")) && std::isfinite(n.attrs.number("shift"))))
    fail("attributes 'scale' {} and 'shift' {} must be finite", n.attrs.number("scale"), n.attrs.number("shift"));
  if (n.op == OpKind::pow && !std::isfinite(n.attrs.number("exponent")))
    fail("attribute 'exponent' must be finite, got {}", n.attrs.number("exponent"));
  if (n.op == OpKind::clip) {
    const double lo = n.attrs.number("min"), hi = n.attrs.number("max");
    if (!(std::isfinite(lo) && std::isfinite(hi) && lo < hi))
      fail("attributes 'min' {} and 'max' {} must be finite with min < max", lo, hi);
  }
}

TensorInfo infer_output(const Model& m, Node& n, const std::string& where) {
  NodeError fail{where, n};
  TensorInfo out;
  out.name = n.name;
  out.dtype = DType::f32;
  auto in = [&](int i) -> const TensorInfo& { return m.tensor(n.inputs[static_cast<size_t>(i)]); };
  auto any_rank = std::numeric_limits<size_t>::max();

  switch (n.op) {
    case OpKind::embedding: {
      const auto& ids = in(0);
      if (ids.dtype != DType::i32) fail("input '{}' must be i32 ids, got {}", ids.name, to_string(ids.dtype));
      int64_t num = positive(n, "num", fail), dim = positive(n, "dim", fail);
      check_weight("the weight [num, dim]", {num, dim}, fail);
      if (n.attrs.has("tie")) {
        const auto target = n.attrs.text("tie");
        const int t = m.node_index(target);
        if (t < 0 || target == n.name) fail("tie names '{}', which is not a node before this one", target);
        const Node& e = m.nodes[static_cast<size_t>(t)];
        if (e.op != OpKind::embedding || e.attrs.has("tie"))
          fail("tie names '{}', which is not an embedding with a table of its own", target);
        if (e.attrs.integer("num") != num || e.attrs.integer("dim") != dim)
          fail("tie to '{}' needs [num, dim] = [{}, {}] to equal its [{}, {}]", target, num, dim, e.attrs.integer("num"),
               e.attrs.integer("dim"));
      }
      // padding_idx: the row whose lookups give it no gradient (nn.Embedding's).
      if (n.attrs.has("padding_idx") && (n.attrs.integer("padding_idx") < 0 || n.attrs.integer("padding_idx") >= num))
        fail("padding_idx {} is outside [0, {})", n.attrs.integer("padding_idx"), num);
      out.shape = ids.shape;
      out.shape.push_back(dim);
      break;
    }
    case OpKind::pos_embedding: {
      const auto& x = expect_rank(m, n, 0, 2, 2, "[T, D]", fail);
      expect_float(x, fail);
      if (!n.attrs.has("max_len")) n.attrs.values["max_len"] = x.shape[0];
      // Fixed sinusoidal positions have no table to run past: theirs is as
      // long as the sequence read from `offset` needs, up to 2^40 positions
      // (a negative offset is refused below, as a learned table's).
      if (n.attrs.has("sinusoidal")) {
        constexpr int64_t kMaxPosition = int64_t{1} << 40;
        const int64_t from = n.attrs.has("offset") ? n.attrs.integer("offset") : 0;
        if (from > kMaxPosition)
          fail("offset {} is past the {} positions sinusoidal positions are computed for", from, kMaxPosition);
        n.attrs.values["max_len"] = std::max<int64_t>(from, 0) + x.shape[0];
      }
      int64_t max_len = positive(n, "max_len", fail);
      // `row`: every position adds that one row (BERT's token-type table
      // [2, D] read with the all-zero token_type_ids it defaults to).
      // `offset`: position t adds row offset + t (OPT's table starts at row 2).
      const int64_t offset = n.attrs.has("offset") ? n.attrs.integer("offset") : 0;
      if (n.attrs.has("row") && n.attrs.has("offset")) fail("row and offset exclude each other");
      if (n.attrs.has("row")) {
        if (n.attrs.integer("row") < 0 || n.attrs.integer("row") >= max_len)
          fail("row {} is outside the table's [0, {})", n.attrs.integer("row"), max_len);
      } else if (offset < 0 || offset >= max_len) {
        fail("offset {} is outside the table's [0, {})", offset, max_len);
      } else if (x.shape[0] > max_len - offset) {
        fail("sequence length {} exceeds the position table's max_len {}{}", x.shape[0], max_len,
             offset ? fmt::format(" (read from row {})", offset) : "");
      }
      // `sinusoidal` ("halves" or "interleaved"): the table is fixed, not
      // learned (ops.hpp, sinusoidal_position), pair i's frequency
      // exp(-i frequency_step); positions offset + t.
      if (n.attrs.has("sinusoidal")) {
        const std::string layout = n.attrs.text("sinusoidal");
        if (layout != "halves" && layout != "interleaved")
          fail("sinusoidal must be \"halves\" or \"interleaved\", not \"{}\"", layout);
        if (n.attrs.has("row")) fail("row and sinusoidal exclude each other");
        if (!n.attrs.has("frequency_step")) fail("sinusoidal positions need frequency_step");
        const double step = n.attrs.number("frequency_step");
        if (!std::isfinite(step) || step < 0 || step > 100) fail("frequency_step {} is not in [0, 100]", step);
        if (x.shape[1] % 2 != 0) fail("sinusoidal positions need an even width, not {}", x.shape[1]);
      } else {
        if (n.attrs.has("frequency_step")) fail("frequency_step belongs to sinusoidal positions");
        check_weight("the position table [max_len, D]", {max_len, x.shape[1]}, fail);
      }
      out.shape = x.shape;
      break;
    }
    case OpKind::cls_token: {
      const auto& x = expect_rank(m, n, 0, 2, 2, "[T, D]", fail);
      expect_float(x, fail);
      out.shape = {x.shape[0] + 1, x.shape[1]};
      break;
    }
    case OpKind::linear: {
      const auto& x = expect_rank(m, n, 0, 1, any_rank, "[*, in]", fail);
      expect_float(x, fail);
      out.shape = x.shape;
      out.shape.back() = positive(n, "out", fail);
      if (!n.attrs.has("tie")) check_weight("the weight [out, in]", {out.shape.back(), x.shape.back()}, fail);
      if (n.attrs.has("tie")) {
        auto target = n.attrs.text("tie");
        int t = m.node_index(target);
        if (t < 0) fail("tie names '{}', which is not a node", target);
        const Node& e = m.nodes[static_cast<size_t>(t)];
        if (e.op != OpKind::embedding) fail("tie names '{}', which is a {}, not an embedding", target, to_string(e.op));
        if (e.attrs.integer("num") != out.shape.back() || e.attrs.integer("dim") != x.shape.back())
          fail("tie to '{}' needs [out, in] = [{}, {}] to equal its [num, dim] = [{}, {}]", target,
               out.shape.back(), x.shape.back(), e.attrs.integer("num"), e.attrs.integer("dim"));
      }
      break;
    }
    case OpKind::conv2d: {
      const auto [x, o, g, w] = conv_input(m, n, fail);
      if (w.one_d && (w.kh != 1 || w.sh != 1 || w.ph != 0 || w.dh != 1))
        fail("a 1-D convolution over [C, L] takes the width's kernel, stride, padding and dilation: integers, or "
             "pairs [1, k], [1, s], [0, p], [1, d]");
      // A dilated kernel reads a window of extent d (k - 1) + 1 (nn.Conv2d's docs).
      if (w.dh < 1 || w.dw < 1 || w.kh < 1 || w.kw < 1 || w.dh > kMaxElems / w.kh || w.dw > kMaxElems / w.kw)
        fail("kernel and dilation must be positive and their window below 2^48 (dilation [{}, {}])", w.dh, w.dw);
      const int64_t OH = window_out(w.H, w.extent_h(), w.sh, w.ph, "height", fail);
      const int64_t OW = window_out(w.W, w.extent_w(), w.sw, w.pw, w.one_d ? "length" : "width", fail);
      out.shape = w.one_d ? Shape{o, OW} : Shape{o, OH, OW};
      check_weight("the weight [out, C/groups, kh, kw]", {o, x.shape[0] / g, w.kh, w.kw}, fail);
      break;
    }
    case OpKind::conv_transpose2d: {  // nn.ConvTranspose2d / ConvTranspose1d: conv2d's adjoint
      const auto [x, o, g, w] = conv_input(m, n, fail);
      const auto op = transposed_output_padding(x.shape, n.attrs);
      if (w.one_d && (w.kh != 1 || w.sh != 1 || w.ph != 0 || op[0] != 0))
        fail("a 1-D transposed convolution over [C, L] takes the width's kernel, stride, padding and output_padding: "
             "integers, or pairs [1, k], [1, s], [0, p], [0, a]");
      const int64_t OH = transposed_out(w.H, w.kh, w.sh, w.ph, op[0], "height", fail);
      const int64_t OW = transposed_out(w.W, w.kw, w.sw, w.pw, op[1], w.one_d ? "length" : "width", fail);
      out.shape = w.one_d ? Shape{o, OW} : Shape{o, OH, OW};
      check_weight("the weight [C, out/groups, kh, kw]", {x.shape[0], o / g, w.kh, w.kw}, fail);
      checked_numel(out.shape, fail);
      break;
    }
    case OpKind::rnn:
      if (const auto a = n.attrs.text("nonlinearity"); a != "tanh" && a != "relu")
        fail("nonlinearity '{}' is not nn.RNN's (tanh or relu)", a);
      [[fallthrough]];
    case OpKind::lstm:
    case OpKind::gru: {  // a sequence [T, in] -> the hidden state at each step [T, hidden]
      const auto& x = expect_rank(m, n, 0, 2, 2, "[T, in]", fail);
      expect_float(x, fail);
      const int64_t H = positive(n, "hidden", fail), dirs = n.attrs.flag("bidirectional") ? 2 : 1;
      check_weight("the gates' weights [4 hidden, in + hidden]", {4 * H, x.shape[1] + H}, fail);  // (GRU: 3)
      out.shape = {x.shape[0], dirs * H};
      checked_numel({x.shape[0], dirs, 7 * H}, fail);  // what it keeps a step (ops_decl.cpp)
      break;
    }
    case OpKind::batchnorm: {
      const auto& x = expect_rank(m, n, 0, 1, any_rank, "[C, ...]", fail);
      expect_float(x, fail);
      out.shape = x.shape;
      break;
    }
    case OpKind::groupnorm: {
      const auto& x = expect_rank(m, n, 0, 1, any_rank, "[C, ...]", fail);
      expect_float(x, fail);
      const int64_t groups = n.attrs.integer("groups");
      if (groups < 1 || x.shape[0] % groups != 0)
        fail("groups {} does not divide the input's {} channels", groups, x.shape[0]);
      out.shape = x.shape;
      break;
    }
    case OpKind::layernorm: {
      const auto dims = n.attrs.integer("dims");
      if (dims < 1) fail("dims must be at least 1, got {}", dims);
      const std::string want = fmt::format("at least {} dimension{} (dims)", dims, dims == 1 ? "" : "s");
      const auto& x = expect_rank(m, n, 0, static_cast<size_t>(dims), any_rank, want.c_str(), fail);
      expect_float(x, fail);
      out.shape = x.shape;
      break;
    }
    case OpKind::rmsnorm:
    case OpKind::gelu:
    case OpKind::relu:
    case OpKind::silu:
    case OpKind::tanh:
    case OpKind::sigmoid:
    case OpKind::clip:
    case OpKind::hardsigmoid:
    case OpKind::hardswish:
    case OpKind::leaky_relu:
    case OpKind::elu:
    case OpKind::softplus:
    case OpKind::mish:
    case OpKind::affine:
    case OpKind::pow:
    case OpKind::sqrt:
    case OpKind::reciprocal:
    case OpKind::erf:
    case OpKind::acos:
    case OpKind::softmax:
    case OpKind::drop_path:
    case OpKind::dropout: {
      const auto& x = expect_rank(m, n, 0, 1, any_rank, "at least one dimension", fail);
      expect_float(x, fail);
      out.shape = x.shape;
      break;
    }
    case OpKind::causal_mask: {
      const auto& x = expect_rank(m, n, 0, 2, any_rank, "[..., T, T]", fail);
      expect_float(x, fail);
      const auto rank = static_cast<int64_t>(x.shape.size());
      const int64_t q = causal_query_axis(n, x.shape.size());
      if (q < 0 || q >= rank - 1)
        fail("query_axis {} is not an axis before the last (the keys') of '{}' {}", q, x.name, to_string(x.shape));
      if (x.shape[static_cast<size_t>(q)] != x.shape.back())
        fail("input '{}' {}: the queries' axis {} and the keys' (the last) must have the same length", x.name,
             to_string(x.shape), q);
      if (!std::isfinite(n.attrs.number("value"))) fail("value must be finite");
      out.shape = x.shape;
      break;
    }
    case OpKind::rope: {
      const auto& x = expect_rank(m, n, 0, 2, any_rank, "[..., T, d]", fail);
      expect_float(x, fail);
      if (x.shape.back() % 2 != 0) fail("input '{}' {}: d must be even (pairs of features)", x.name, to_string(x.shape));
      if (!(n.attrs.number("theta") > 0)) fail("theta must be positive");
      const int64_t pa = n.attrs.integer("position_axis");
      if (pa > -2 || pa < -static_cast<int64_t>(x.shape.size()))
        fail("position_axis {} is not an axis before the last of '{}' {}", pa, x.name, to_string(x.shape));
      out.shape = x.shape;
      break;
    }
    case OpKind::alibi: {
      const auto& x = expect_rank(m, n, 0, 3, any_rank, "[..., H, T, Tk]", fail);
      expect_float(x, fail);
      out.shape = x.shape;
      break;
    }
    case OpKind::window_position_bias: {
      const auto& x = expect_rank(m, n, 0, 3, any_rank, "[..., H, T, T]", fail);
      expect_float(x, fail);
      const auto [wh, ww] = n.attrs.pair("window");
      if (wh <= 0 || ww <= 0 || wh > 4096 || ww > 4096) fail("window [{}, {}] must be positive (and at most 4096)", wh, ww);
      const int64_t T = x.shape.back(), H = x.shape[x.shape.size() - 3];
      const bool cls = n.attrs.has("cls") && n.attrs.flag("cls");
      if (x.shape[x.shape.size() - 2] != T || T != wh * ww + (cls ? 1 : 0))
        fail("input '{}' {}: the last two axes must both be the window's {} x {} = {} positions{}", x.name,
             to_string(x.shape), wh, ww, wh * ww, cls ? " and the class token" : "");
      check_weight("the bias table [(2 Wh - 1)(2 Ww - 1), H]", {2 * wh - 1, 2 * ww - 1, H}, fail);
      out.shape = x.shape;
      break;
    }
    case OpKind::window_mask: {
      const auto& x = expect_rank(m, n, 0, 4, 4, "[windows, H, T, T]", fail);
      expect_float(x, fail);
      const auto [nh, nw] = n.attrs.pair("windows");
      const auto [wh, ww] = n.attrs.pair("window");
      const auto [sh, sw] = n.attrs.pair("shift");
      if (nh <= 0 || nw <= 0 || wh <= 0 || ww <= 0 || wh > 4096 || ww > 4096 || nh > 4096 || nw > 4096)
        fail("windows [{}, {}] and window [{}, {}] must be positive (and at most 4096)", nh, nw, wh, ww);
      if (sh < 0 || sw < 0 || sh >= wh || sw >= ww)
        fail("shift [{}, {}] must lie within the window [{}, {}]", sh, sw, wh, ww);
      if (x.shape[0] != nh * nw || x.shape[2] != wh * ww || x.shape[3] != wh * ww)
        fail("input '{}' {}: expected [{} windows, H, {}, {}]", x.name, to_string(x.shape), nh * nw, wh * ww, wh * ww);
      if (!std::isfinite(n.attrs.number("value"))) fail("value must be finite");
      out.shape = x.shape;
      break;
    }
    case OpKind::reduce_sum:
    case OpKind::reduce_l2:
    case OpKind::reduce_mean: {
      const bool keep = n.attrs.flag("keepdims");
      const char* want = keep ? "at least one dimension"
                              : "at least two dimensions (the mean of a sample's one axis is a scalar; give keepdims)";
      const auto& x = expect_rank(m, n, 0, keep ? 1 : 2, any_rank, want, fail);
      expect_float(x, fail);
      const auto rank = static_cast<int64_t>(x.shape.size()), axis = n.attrs.integer("axis");
      if (axis < -rank || axis >= rank) fail("axis {} is outside the input's {} per-sample axes", axis, rank);
      const auto a = static_cast<size_t>(axis < 0 ? axis + rank : axis);
      out.shape = x.shape;
      if (keep) out.shape[a] = 1;
      else out.shape.erase(out.shape.begin() + static_cast<std::ptrdiff_t>(a));
      break;
    }
    case OpKind::add:    // NumPy broadcasting of the per-sample shapes, as mul (x - x.mean(-1, keepdim=True))
    case OpKind::mul: {  // NumPy broadcasting of the per-sample shapes (an SE block's x [C, H, W] * s [C, 1, 1])
      const auto &a = in(0), &b = in(1);
      expect_float(a, fail);
      expect_float(b, fail);
      auto shape = broadcast_shape(a.shape, b.shape);
      if (!shape)
        fail("inputs '{}' {} and '{}' {} do not broadcast (each dimension, aligned from the last, must be equal or 1)",
             a.name, to_string(a.shape), b.name, to_string(b.shape));
      out.shape = *shape;
      break;
    }
    case OpKind::matmul: {
      const auto& a = expect_rank(m, n, 0, 2, any_rank, "at least two dimensions ([..., M, K])", fail);
      const auto& b = expect_rank(m, n, 1, 2, any_rank, "at least two dimensions ([..., K, N])", fail);
      expect_float(a, fail);
      expect_float(b, fail);
      const int64_t K = a.shape.back(), Kb = b.shape[b.shape.size() - 2];
      if (K != Kb)
        fail("inputs '{}' {} and '{}' {} do not multiply: {} columns against {} rows", a.name, to_string(a.shape),
             b.name, to_string(b.shape), K, Kb);
      const auto batch = broadcast_shape(Shape(a.shape.begin(), a.shape.end() - 2), Shape(b.shape.begin(), b.shape.end() - 2));
      if (!batch)
        fail("inputs '{}' {} and '{}' {}: the dimensions before the last two do not broadcast", a.name,
             to_string(a.shape), b.name, to_string(b.shape));
      out.shape = *batch;
      out.shape.push_back(a.shape[a.shape.size() - 2]);
      out.shape.push_back(b.shape.back());
      checked_numel(out.shape, fail);
      break;
    }
    case OpKind::prelu:
    case OpKind::shift:
    case OpKind::scale: {
      const auto& x = expect_rank(m, n, 0, 1, any_rank, "at least one dimension", fail);
      expect_float(x, fail);
      const Shape gamma = n.attrs.ints("shape");
      for (int64_t d : gamma)
        if (d <= 0) fail("attribute 'shape' {} has a non-positive dimension", to_string(gamma));
      checked_numel(gamma, fail);
      if (broadcast_shape(x.shape, gamma) != x.shape)
        fail("its learned tensor's shape {} does not broadcast to input '{}' {} (each dimension, aligned from the "
             "last, must be equal or 1, and no longer than the input)",
             to_string(gamma), x.name, to_string(x.shape));
      out.shape = x.shape;
      break;
    }
    case OpKind::transpose: {
      const auto& x = in(0);
      expect_float(x, fail);
      const auto perm = n.attrs.ints("perm");
      std::vector<bool> seen(x.shape.size(), false);
      if (perm.size() != x.shape.size())
        fail("perm [{}] must name each of the {} per-sample axes of '{}' {} once", fmt::join(perm, ", "),
             x.shape.size(), x.name, to_string(x.shape));
      out.shape.clear();
      for (int64_t a : perm) {
        if (a < 0 || a >= static_cast<int64_t>(x.shape.size()) || seen[static_cast<size_t>(a)])
          fail("perm [{}] must name each of the {} per-sample axes of '{}' {} once", fmt::join(perm, ", "),
               x.shape.size(), x.name, to_string(x.shape));
        seen[static_cast<size_t>(a)] = true;
        out.shape.push_back(x.shape[static_cast<size_t>(a)]);
      }
      break;
    }
    case OpKind::opaque: {
      const Shape shape = n.attrs.ints("shape");
      if (shape.empty()) fail("attribute 'shape' must name the per-sample output dimensions");
      for (int64_t d : shape)
        if (d <= 0) fail("attribute 'shape' {} has a non-positive dimension", to_string(shape));
      checked_numel(shape, fail);
      out.shape = shape;
      break;
    }
    case OpKind::reshape: {
      const auto& x = in(0);
      expect_float(x, fail);
      const Shape shape = n.attrs.ints("shape");
      for (int64_t d : shape)
        if (d <= 0) fail("attribute 'shape' {} has a non-positive dimension", to_string(shape));
      if (checked_numel(shape, fail) != numel(x.shape))
        fail("cannot reshape '{}' {} ({} elements) to {} ({} elements)", x.name, to_string(x.shape), numel(x.shape),
             to_string(shape), numel(shape));
      out.shape = shape;
      break;
    }
    case OpKind::slice: {
      const auto& x = in(0);
      expect_float(x, fail);
      const int64_t axis = n.attrs.integer("axis"), start = n.attrs.integer("start"), end = n.attrs.integer("end");
      if (axis < 0 || axis >= static_cast<int64_t>(x.shape.size()))
        fail("axis {} is outside the per-sample dimensions of '{}' {}", axis, x.name, to_string(x.shape));
      const int64_t dim = x.shape[static_cast<size_t>(axis)], step = n.attrs.integer("step");
      if (start < 0 || end > dim || start >= end)
        fail("[start, end) = [{}, {}) is not a non-empty range within axis {} of '{}' {}", start, end, axis, x.name,
             to_string(x.shape));
      if (step < 1) fail("step {} must be positive", step);
      out.shape = x.shape;
      out.shape[static_cast<size_t>(axis)] = (end - start + step - 1) / step;
      break;
    }
    case OpKind::pad: {
      const auto& x = in(0);
      expect_float(x, fail);
      const auto pads = n.attrs.ints("pads");
      const size_t rank = x.shape.size();
      if (pads.size() != 2 * rank)
        fail("attribute 'pads' has {} values; '{}' {} has {} per-sample dimensions, so it needs {} (before each, then "
             "after each)", pads.size(), x.name, to_string(x.shape), rank, 2 * rank);
      out.shape = x.shape;
      for (size_t k = 0; k < rank; ++k) {
        if (pads[k] < 0 || pads[rank + k] < 0)
          fail("attribute 'pads' {} is negative on axis {} (cropping is a slice)", to_string(Shape(pads)), k);
        out.shape[k] += pads[k] + pads[rank + k];
      }
      break;
    }
    case OpKind::concat: {
      const auto& first = in(0);
      const int64_t axis = n.attrs.integer("axis");
      if (axis < 0 || axis >= static_cast<int64_t>(first.shape.size()))
        fail("axis {} is outside the per-sample dimensions of '{}' {}", axis, first.name, to_string(first.shape));
      out.shape = first.shape;
      out.shape[static_cast<size_t>(axis)] = 0;
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        const auto& x = in(static_cast<int>(k));
        expect_float(x, fail);
        Shape rest = x.shape;
        if (rest.size() == first.shape.size()) rest[static_cast<size_t>(axis)] = first.shape[static_cast<size_t>(axis)];
        if (rest != first.shape)
          fail("input '{}' {} must match '{}' {} in every dimension but axis {}", x.name, to_string(x.shape),
               first.name, to_string(first.shape), axis);
        out.shape[static_cast<size_t>(axis)] += x.shape[static_cast<size_t>(axis)];
      }
      break;
    }
    case OpKind::attention: {
      const auto& x = expect_rank(m, n, 0, 2, 2, "[T, D]", fail);
      expect_float(x, fail);
      int64_t d = x.shape[1], heads = positive(n, "heads", fail);
      if (!n.attrs.has("kv_heads")) n.attrs.values["kv_heads"] = heads;
      if (!n.attrs.has("head_dim")) {
        if (d % heads != 0) fail("model width {} is not divisible by heads {}; give head_dim", d, heads);
        n.attrs.values["head_dim"] = d / heads;
      }
      int64_t kv = positive(n, "kv_heads", fail);
      int64_t hd = positive(n, "head_dim", fail);
      check_weight("the q, k, v projections", {d, heads + 2 * kv, hd}, fail);
      if (heads % kv != 0) fail("kv_heads {} must divide heads {}", kv, heads);
      // rotary_dim: the leading dimensions of each head that RoPE rotates
      // (Phi's partial_rotary_factor x head_dim); absent, all of them.
      if (n.attrs.has("rotary_dim")) {
        if (!n.attrs.flag("rope")) fail("attribute 'rotary_dim' needs rope true");
        const int64_t rot = positive(n, "rotary_dim", fail);
        if (rot > hd || rot % 2 != 0) fail("rotary_dim {} must be even and at most head_dim {}", rot, hd);
      } else if (n.attrs.flag("rope") && hd % 2 != 0) {
        fail("rope needs an even head_dim");
      }
      // cross and position_bias: absent, false (kept absent, so that a model
      // written before them reads as it did).
      const bool cross = n.attrs.has("cross") && n.attrs.flag("cross");
      const bool with_bias = n.attrs.has("position_bias") && n.attrs.flag("position_bias");
      const size_t want = 1 + (cross ? 1 : 0) + (with_bias ? 1 : 0);
      if (n.inputs.size() != want)
        fail("takes {} input{} (x{}{}), got {}", want, want == 1 ? "" : "s", cross ? ", memory" : "",
             with_bias ? ", position bias" : "", n.inputs.size());
      int64_t keys = x.shape[0];
      if (cross) {
        const auto& mem = expect_rank(m, n, 1, 2, 2, "[Tk, Dm] (the memory keys and values read)", fail);
        expect_float(mem, fail);
        keys = mem.shape[0];
        check_weight("the k, v projections", {mem.shape[1], 2 * kv, hd}, fail);
        if (n.attrs.flag("causal")) fail("cross attention cannot be causal (its keys are another sequence)");
        if (n.attrs.flag("rope")) fail("cross attention with rope is not supported");
      }
      if (with_bias) {
        const auto& b = in(static_cast<int>(want) - 1);
        expect_float(b, fail);
        if (b.shape != Shape{heads, x.shape[0], keys})
          fail("position bias '{}' has shape {}, expected {}", b.name, to_string(b.shape), to_string(Shape{heads, x.shape[0], keys}));
      }
      if (n.attrs.has("scale") && !(std::isfinite(n.attrs.number("scale")) && n.attrs.number("scale") > 0))
        fail("attribute 'scale' must be positive and finite, got {}", n.attrs.number("scale"));
      out.shape = x.shape;
      break;
    }
    case OpKind::parameter: {
      out.shape = n.attrs.ints("shape");
      if (out.shape.empty()) fail("attribute 'shape' is empty (a learned scalar is shape [1])");
      for (int64_t d : out.shape)
        if (d <= 0) fail("attribute 'shape' {} has a non-positive dimension", to_string(out.shape));
      checked_numel(out.shape, fail);
      if (n.attrs.has("tie")) {
        const auto target = n.attrs.text("tie");
        const int t = m.node_index(target);
        if (t < 0) fail("tie names '{}', which is not a node before this one", target);
        const Node& e = m.nodes[static_cast<size_t>(t)];
        if (e.op != OpKind::embedding || e.attrs.has("tie"))
          fail("tie names '{}', which is not an embedding with a table of its own", target);
        const Shape table = {e.attrs.integer("num"), e.attrs.integer("dim")};
        if (out.shape != table)
          fail("tie to '{}' needs shape {} to equal its table [num, dim] = {}", target, to_string(out.shape),
               to_string(table));
      }
      break;
    }
    case OpKind::relative_position_bias: {
      const auto& x = expect_rank(m, n, 0, 1, 1, "[T] ids", fail);
      if (x.dtype != DType::i32) fail("input '{}' must be i32 ids, got {}", x.name, to_string(x.dtype));
      const int64_t heads = positive(n, "heads", fail), buckets = positive(n, "buckets", fail);
      const int64_t max_distance = positive(n, "max_distance", fail);
      const int64_t exact = (n.attrs.flag("bidirectional") ? buckets / 2 : buckets) / 2;
      if (exact < 1) fail("buckets {} leaves no exact bucket (at least {} needed)", buckets, n.attrs.flag("bidirectional") ? 4 : 2);
      if (max_distance <= exact) fail("max_distance {} must exceed the {} exactly bucketed offsets", max_distance, exact);
      check_weight("the bias table [buckets, heads]", {buckets, heads}, fail);
      check_weight("the bias [heads, T, T]", {heads, x.shape[0], x.shape[0]}, fail);
      out.shape = {heads, x.shape[0], x.shape[0]};
      break;
    }
    case OpKind::moe_router: {
      const auto& x = expect_rank(m, n, 0, 2, 2, "[T, D]", fail);
      expect_float(x, fail);
      const int64_t E = positive(n, "experts", fail);
      check_weight("the router's weight [experts, D]", {E, x.shape[1]}, fail);
      out.shape = {x.shape[0], E};
      break;
    }
    case OpKind::moe_expert: {
      const auto& x = expect_rank(m, n, 0, 2, 2, "[T, D]", fail);
      const auto& probs = moe_probabilities(m, n, 1, x.shape[0], fail);
      expect_float(x, fail);
      const int64_t E = probs.shape[1], e = n.attrs.integer("expert"), F = positive(n, "hidden", fail);
      if (e < 0 || e >= E) fail("expert {} is not one of the router's {} experts", e, E);
      const int64_t C = fill_capacity(n, x.shape[0], E, fail);
      check_weight("the expert's weights [3, hidden, D]", {3, F, x.shape[1]}, fail);
      out.shape = {C, x.shape[1]};
      break;
    }
    case OpKind::moe_combine: {
      const auto& probs = moe_probabilities(m, n, 0, -1, fail);
      const int64_t T = probs.shape[0], E = probs.shape[1];
      if (static_cast<int64_t>(n.inputs.size()) != E + 1)
        fail("takes the router's probabilities and its {} experts' places, got {} inputs", E, n.inputs.size());
      const int64_t C = fill_capacity(n, T, E, fail);
      const int64_t D = in(1).shape.size() == 2 ? in(1).shape[1] : -1;
      for (int64_t e = 0; e < E; ++e) {
        const auto& places = in(static_cast<int>(e + 1));
        expect_float(places, fail);
        if (places.shape != Shape{C, D})
          fail("input {} ('{}') must be expert {}'s places [{}, {}], got {}", e + 1, places.name, e, C, D,
               to_string(places.shape));
        check_expert_routes_alike(m, n, static_cast<int>(e), fail);
      }
      out.shape = {T, D};
      break;
    }
    case OpKind::maxpool2d:
    case OpKind::avgpool2d: {  // over [C, H, W], or [C, L] (1-D: MaxPool1d, AvgPool1d; conv_window.hpp)
      const auto& x = expect_rank(m, n, 0, 2, 3, "[C, H, W], or [C, L] (1-D)", fail);
      expect_float(x, fail);
      if (!n.attrs.has("stride")) n.attrs.values["stride"] = n.attrs.values["kernel"];
      const ConvWindow w = conv_window(x.shape, n.attrs);
      if (w.one_d && (w.kh != 1 || w.sh != 1 || w.ph != 0))
        fail("a 1-D pooling over [C, L] takes the width's kernel, stride and padding: integers, or pairs "
             "[1, k], [1, s], [0, p]");
      if (w.ph * 2 > w.kh || w.pw * 2 > w.kw) fail("padding must be at most half the kernel");
      int64_t OH = window_out(w.H, w.kh, w.sh, w.ph, "height", fail);
      int64_t OW = window_out(w.W, w.kw, w.sw, w.pw, w.one_d ? "length" : "width", fail);
      if (n.attrs.has("ceil_mode") && n.attrs.flag("ceil_mode")) {
        OH = ceil_window_out(w.H, w.kh, w.sh, w.ph);
        OW = ceil_window_out(w.W, w.kw, w.sw, w.pw);
      }
      out.shape = w.one_d ? Shape{x.shape[0], OW} : Shape{x.shape[0], OH, OW};
      break;
    }
    case OpKind::upsample: {
      const auto& x = expect_rank(m, n, 0, 2, 3, "[C, H, W], or [C, L] (1-D)", fail);
      expect_float(x, fail);
      const auto s = upsample_factors(x.shape, n.attrs);
      if (s[0] < 1 || s[1] < 1) fail("scale must be a whole factor of at least 1, got [{}, {}]", s[0], s[1]);
      out.shape = x.shape;
      if (x.shape.size() == 2) {
        if (s[0] != 1) fail("a 1-D upsample over [C, L] takes the length's factor: an integer, or [1, s]");
        out.shape[1] = x.shape[1] * s[1];
      } else {
        out.shape[1] = x.shape[1] * s[0];
        out.shape[2] = x.shape[2] * s[1];
      }
      checked_numel(out.shape, fail);
      break;
    }
    case OpKind::global_avgpool: {  // the mean of each channel: over [H, W], or over [L] (1-D)
      const auto& x = expect_rank(m, n, 0, 2, 3, "[C, H, W], or [C, L] (1-D)", fail);
      expect_float(x, fail);
      const bool keep = n.attrs.has("keepdims") && n.attrs.flag("keepdims");
      out.shape = !keep ? Shape{x.shape[0]} : x.shape.size() == 2 ? Shape{x.shape[0], 1} : Shape{x.shape[0], 1, 1};
      break;
    }
    case OpKind::flatten: {
      const auto& x = in(0);
      expect_float(x, fail);
      out.shape = {numel(x.shape)};
      break;
    }
    case OpKind::tokens: {
      const auto& x = expect_rank(m, n, 0, 3, 3, "[C, H, W]", fail);
      expect_float(x, fail);
      out.shape = {x.shape[1] * x.shape[2], x.shape[0]};
      break;
    }
    case OpKind::select: {
      const auto& x = expect_rank(m, n, 0, 2, 2, "[T, D]", fail);
      expect_float(x, fail);
      int64_t i = n.attrs.integer("index");
      if (i < 0 || i >= x.shape[0]) fail("index {} is outside [0, {})", i, x.shape[0]);
      out.shape = {x.shape[1]};
      break;
    }
    case OpKind::cross_entropy: {
      const auto& logits = expect_rank(m, n, 0, 1, any_rank, "[*, K]", fail);
      const auto& targets = in(1);
      expect_float(logits, fail);
      if (targets.dtype != DType::i32) fail("targets '{}' must be i32, got {}", targets.name, to_string(targets.dtype));
      Shape lead(logits.shape.begin(), logits.shape.end() - 1);
      if (lead != targets.shape)
        fail("targets '{}' have shape {}, expected {} to match logits {}", targets.name, to_string(targets.shape),
             to_string(lead), to_string(logits.shape));
      out.shape = {};
      break;
    }
  }
  checked_numel(out.shape, fail);
  out.batched = batched_output(m, n, fail);
  return out;
}

}  // namespace dlplan
