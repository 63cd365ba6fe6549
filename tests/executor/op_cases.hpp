// The op test table shared by ops_grad_test.cpp (finite-difference gradients)
// and ops_decl_test.cpp (allocations against the op declarations): one tiny
// model per case, and a harness that runs one node of it on the CPU backend
// with random inputs and parameters (ggml's test-backend-ops idea).
#pragma once

#include "dlplan/exec/backend.hpp"
#include "dlplan/fine_tuning.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/ops.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace dlplan::exec::testing {

using Json = nlohmann::json;

enum class Gen {
  normal,    // N(0, 1)
  away,      // |x| >= 0.2 (kinks at 0: relu)
  away_one,  // |x| >= 0.2 and ||x| - 1| >= 0.2 (kinks at -1 and 1: clip to [-1, 1])
  away_three,  // N(0, 2.5) with ||x| - 3| >= 0.2 (kinks at -3 and 3: hardsigmoid, hardswish)
  distinct,  // a shuffled grid 0.05 apart (max pooling: no near-ties)
  positive,  // 0.5 + |N(0, 1)| (sqrt, reciprocal, a fractional power)
  inside_one,  // 0.8 tanh(N(0, 1)): inside (-1, 1), away from its ends (acos)
  distinct_positive,  // the grid shifted to start at 0.5 (a top-k of probabilities: no ties, even in bf16)
};

struct OpCase {
  std::string name;
  Json ir;                              // {"name", "inputs", "nodes"}
  std::string node;                     // node under test ("" = the node named "op")
  std::map<std::string, int> id_range;  // i32 inputs: values in [0, range)
  Gen gen = Gen::normal;
  bool flash = false;
  bool training = true;
  double grad_scale = 1.0;
  double tol = 2e-2;
  FineTuning fine_tuning;  // LoRA adapters on the node (every parameter's gradient is still checked)
};

// gtest prints a parameter by its name.
inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

inline Json make_ir(const std::string& name, Json inputs, Json nodes) {
  return Json{{"name", name}, {"inputs", std::move(inputs)}, {"nodes", std::move(nodes)}};
}
inline Json f32(Json shape) { return Json{{"shape", std::move(shape)}, {"dtype", "f32"}}; }
inline Json i32(Json shape) { return Json{{"shape", std::move(shape)}, {"dtype", "i32"}}; }

// One node on input x [shape] (f32): {"name": "op", "op": op, "in": ["x"], attrs...}.
inline OpCase unary(const std::string& name, Json shape, Json node, Gen gen = Gen::normal) {
  node["name"] = "op";
  node["in"] = Json::array({"x"});
  OpCase c;
  c.name = name;
  c.ir = make_ir(name, Json{{"x", f32(std::move(shape))}}, Json::array({node}));
  c.gen = gen;
  return c;
}

inline OpCase attention_case(const std::string& name, Json attrs, bool flash = false, int64_t T = 5, int64_t D = 8) {
  attrs["op"] = "attention";
  OpCase c = unary(name, Json::array({T, D}), std::move(attrs));
  c.flash = flash;
  return c;
}

inline std::vector<OpCase> op_cases() {
  std::vector<OpCase> v;
  auto arr = [](std::initializer_list<int64_t> l) { return Json(std::vector<int64_t>(l)); };

  {  // embedding: ids [2, 3] -> [2, 3, 4]
    OpCase c;
    c.name = "embedding";
    c.ir = make_ir("embedding", Json{{"ids", i32(arr({2, 3}))}},
                   Json::array({Json{{"name", "op"}, {"op", "embedding"}, {"in", {"ids"}}, {"num", 7}, {"dim", 4}}}));
    c.id_range["ids"] = 7;
    v.push_back(c);
    c.name = "embedding_scaled";  // Gemma's sqrt(hidden_size) normalizer
    c.ir["nodes"][0]["scale"] = 2.0;
    v.push_back(c);
  }
  v.push_back(unary("pos_embedding", arr({4, 3}), Json{{"op", "pos_embedding"}, {"max_len", 6}}));
  // BERT's token types: every position adds row 1 of a [2, D] table
  v.push_back(unary("pos_embedding_row", arr({4, 3}), Json{{"op", "pos_embedding"}, {"max_len", 2}, {"row", 1}}));
  // OPT's learned positions start at row 2: rows 2..5 of a 6-row table
  v.push_back(unary("pos_embedding_offset", arr({4, 3}), Json{{"op", "pos_embedding"}, {"max_len", 6}, {"offset", 2}}));
  // Fixed sinusoidal positions, no table to learn: XGLM's halves from row 2
  // (fairseq's step ln(10000) / (D/2 - 1)) and Vaswani's interleaved pairs
  v.push_back(unary("pos_embedding_sinusoidal", arr({5, 4}),
                    Json{{"op", "pos_embedding"}, {"sinusoidal", "halves"}, {"offset", 2},
                         {"frequency_step", std::log(10000.0) / 1.0}}));
  v.push_back(unary("pos_embedding_sinusoidal_interleaved", arr({5, 4}),
                    Json{{"op", "pos_embedding"}, {"sinusoidal", "interleaved"}, {"frequency_step", std::log(10000.0) / 2.0}}));
  v.push_back(unary("cls_token", arr({4, 3}), Json{{"op", "cls_token"}}));
  v.push_back(unary("linear", arr({2, 3, 5}), Json{{"op", "linear"}, {"out", 4}}));
  v.push_back(unary("linear_nobias", arr({5}), Json{{"op", "linear"}, {"out", 3}, {"bias", false}}));
  // T5's tied head reads its input times d_model^-1/2
  v.push_back(unary("linear_input_scale", arr({3, 5}), Json{{"op", "linear"}, {"out", 4}, {"scale", 0.35}}));
  {  // tied: the linear's weight is the embedding's [num, dim] = [out, in]; it
     // reads the embedding's output (as a language model's head reads what the
     // embedding began), since every node must lead to the loss
    OpCase c;
    c.name = "linear_tied";
    c.ir = make_ir("linear_tied", Json{{"ids", i32(arr({3}))}},
                   Json::array({Json{{"name", "emb"}, {"op", "embedding"}, {"in", {"ids"}}, {"num", 4}, {"dim", 5}},
                                Json{{"name", "op"}, {"op", "linear"}, {"in", {"emb"}}, {"out", 4}, {"tie", "emb"}}}));
    c.id_range["ids"] = 4;
    v.push_back(c);
  }
  {  // LoRA (ops_lora.cpp): A [2, 5] and B [4, 2] beside W, scale alpha / r = 3 / 2
    OpCase c = unary("linear_lora", arr({2, 3, 5}), Json{{"op", "linear"}, {"out", 4}});
    c.fine_tuning.lora_rank = 2;
    c.fine_tuning.lora_targets = {"op"};
    c.fine_tuning.lora_alpha = 3;
    v.push_back(c);
    c.name = "linear_lora_input_scale";  // the input's factor reaches the adapter too
    c.ir["nodes"][0]["scale"] = 0.35;
    v.push_back(c);
  }
  v.push_back(unary("select", arr({4, 3}), Json{{"op", "select"}, {"index", 2}}));
  v.push_back(unary("tokens", arr({3, 2, 2}), Json{{"op", "tokens"}}));
  v.push_back(unary("flatten", arr({2, 3, 2}), Json{{"op", "flatten"}}));
  v.push_back(unary("conv2d_s2_pad_groups_rect", arr({4, 7, 6}),
                    Json{{"op", "conv2d"}, {"out", 6}, {"kernel", arr({3, 2})}, {"stride", 2}, {"padding", 1}, {"groups", 2}}));
  v.push_back(unary("conv2d_3x3_nobias", arr({3, 5, 5}),
                    Json{{"op", "conv2d"}, {"out", 4}, {"kernel", 3}, {"padding", 1}, {"bias", false}}));
  v.push_back(unary("conv2d_1x1_direct", arr({3, 4, 3}), Json{{"op", "conv2d"}, {"out", 5}, {"kernel", 1}}));
  // Dilated (nn.Conv2d's dilation): taps d apart, a window of extent d (k - 1) + 1.
  v.push_back(unary("conv2d_dilated_rect", arr({4, 8, 9}),
                    Json{{"op", "conv2d"}, {"out", 4}, {"kernel", arr({3, 2})}, {"stride", arr({1, 2})},
                         {"padding", arr({2, 1})}, {"dilation", arr({2, 3})}, {"groups", 2}}));
  // A 1-D convolution over [C, L] (PyTorch's Conv1d: conv_window.hpp): strided
  // and padded with groups, and the pair form [1, k] of the width's window.
  v.push_back(unary("conv1d_strided_groups", arr({4, 9}),
                    Json{{"op", "conv2d"}, {"out", 6}, {"kernel", 3}, {"stride", 2}, {"padding", 1}, {"groups", 2}}));
  v.push_back(unary("conv1d_dilated", arr({3, 11}),  // a temporal convolution network's layer
                    Json{{"op", "conv2d"}, {"out", 4}, {"kernel", 3}, {"padding", 4}, {"dilation", 4}}));
  v.push_back(unary("conv1d_pair_window", arr({3, 7}),
                    Json{{"op", "conv2d"}, {"out", 4}, {"kernel", arr({1, 4})}, {"padding", arr({0, 1})}}));
  // nn.ConvTranspose2d / ConvTranspose1d: strided with padding, groups and an
  // output_padding (rows and columns no window reaches: the bias alone), and
  // a stride-1 one without bias.
  v.push_back(unary("conv_transpose2d_s2_pad_groups_outpad", arr({4, 3, 4}),
                    Json{{"op", "conv_transpose2d"}, {"out", 6}, {"kernel", arr({3, 2})}, {"stride", 2}, {"padding", 1},
                         {"output_padding", arr({1, 0})}, {"groups", 2}}));
  v.push_back(unary("conv_transpose2d_nobias", arr({3, 3, 3}),
                    Json{{"op", "conv_transpose2d"}, {"out", 2}, {"kernel", 2}, {"bias", false}}));
  v.push_back(unary("conv_transpose1d_strided", arr({3, 5}),
                    Json{{"op", "conv_transpose2d"}, {"out", 4}, {"kernel", 4}, {"stride", 3}, {"padding", 1},
                         {"output_padding", 2}}));
  // nn.LSTM: one layer over 5 steps (the gradient flows back through every
  // step's h and c), one without biases, and a bidirectional one.
  v.push_back(unary("lstm", arr({5, 3}), Json{{"op", "lstm"}, {"hidden", 4}}));
  v.push_back(unary("lstm_bidirectional", arr({4, 3}), Json{{"op", "lstm"}, {"hidden", 3}, {"bidirectional", true}}));
  // nn.GRU likewise.
  v.push_back(unary("gru", arr({5, 3}), Json{{"op", "gru"}, {"hidden", 4}}));
  v.push_back(unary("gru_nobias", arr({4, 2}), Json{{"op", "gru"}, {"hidden", 3}, {"bias", false}}));
  v.push_back(unary("gru_bidirectional", arr({4, 3}), Json{{"op", "gru"}, {"hidden", 3}, {"bidirectional", true}}));
  v.push_back(unary("lstm_nobias", arr({4, 2}), Json{{"op", "lstm"}, {"hidden", 3}, {"bias", false}}));
  // nn.RNN: tanh over 5 steps, one without biases, and a bidirectional relu one.
  v.push_back(unary("rnn", arr({5, 3}), Json{{"op", "rnn"}, {"hidden", 4}}));
  v.push_back(unary("rnn_nobias", arr({4, 2}), Json{{"op", "rnn"}, {"hidden", 3}, {"bias", false}}));
  v.push_back(unary("rnn_relu_bidirectional", arr({4, 3}),
                    Json{{"op", "rnn"}, {"hidden", 3}, {"bidirectional", true}, {"nonlinearity", "relu"}}));
  v.push_back(unary("maxpool2d_pad", arr({2, 7, 7}), Json{{"op", "maxpool2d"}, {"kernel", 3}, {"stride", 2}, {"padding", 1}},
                    Gen::distinct));
  v.push_back(unary("avgpool2d_pad", arr({2, 6, 5}),
                    Json{{"op", "avgpool2d"}, {"kernel", arr({3, 2})}, {"stride", arr({2, 1})}, {"padding", 1}}));
  // PoolFormer's: border windows divided by the elements inside (3 x 3, stride 1, padding 1)
  v.push_back(unary("avgpool2d_exclude_pad", arr({2, 5, 4}),
                    Json{{"op", "avgpool2d"}, {"kernel", 3}, {"stride", 1}, {"padding", 1},
                         {"count_include_pad", false}, {"eager", true}}));
  v.push_back(unary("global_avgpool", arr({3, 4, 5}), Json{{"op", "global_avgpool"}}));
  v.push_back(unary("global_avgpool_1d", arr({3, 5}), Json{{"op", "global_avgpool"}, {"keepdims", true}}));
  // MaxPool1d and AvgPool1d over [C, L]: padded and strided, ceil_mode, eager.
  v.push_back(unary("maxpool1d_pad", arr({2, 9}), Json{{"op", "maxpool2d"}, {"kernel", 3}, {"stride", 2}, {"padding", 1}},
                    Gen::distinct));
  v.push_back(unary("maxpool1d_ceil_eager", arr({2, 8}),
                    Json{{"op", "maxpool2d"}, {"kernel", 3}, {"stride", 2}, {"ceil_mode", true}, {"eager", true}},
                    Gen::distinct));
  v.push_back(unary("avgpool1d_pad", arr({3, 7}), Json{{"op", "avgpool2d"}, {"kernel", 3}, {"stride", 2}, {"padding", 1}}));
  v.push_back(unary("batchnorm_2d", arr({3, 4, 4}), Json{{"op", "batchnorm"}}));
  v.push_back(unary("batchnorm_1d", arr({4}), Json{{"op", "batchnorm"}, {"eps", 1e-3}}));
  {
    OpCase c = unary("batchnorm_eval", arr({3, 2, 2}), Json{{"op", "batchnorm"}});
    c.training = false;
    v.push_back(c);
  }
  v.push_back(unary("layernorm", arr({3, 6}), Json{{"op", "layernorm"}}));
  v.push_back(unary("layernorm_nobias", arr({3, 6}), Json{{"op", "layernorm"}, {"bias", false}}));
  // nn.LayerNorm([C, H, W]): three trailing axes together, a weight of their shape
  v.push_back(unary("layernorm_chw", arr({2, 3, 2}), Json{{"op", "layernorm"}, {"dims", 3}}));
  v.push_back(unary("layernorm_two_axes", arr({2, 3, 2}), Json{{"op", "layernorm"}, {"dims", 2}, {"bias", false}}));
  // nn.GroupNorm: two groups of two channels over 3x3 positions; one group
  // (a LayerNorm over [C, H, W] with a weight per channel); a channel a group
  // (InstanceNorm); without the affine parameters; over [C, L]
  v.push_back(unary("groupnorm", arr({4, 3, 3}), Json{{"op", "groupnorm"}, {"groups", 2}}));
  v.push_back(unary("groupnorm_one_group", arr({3, 2, 2}), Json{{"op", "groupnorm"}, {"groups", 1}, {"eps", 1e-3}}));
  v.push_back(unary("groupnorm_instance", arr({3, 2, 2}), Json{{"op", "groupnorm"}, {"groups", 3}}));
  // nn.Upsample(scale_factor, mode="nearest"): 2x2, 1x3, and over [C, L]
  v.push_back(unary("upsample_2x", arr({2, 3, 2}), Json{{"op", "upsample"}, {"scale", 2}}));
  v.push_back(unary("upsample_1x3", arr({2, 2, 3}), Json{{"op", "upsample"}, {"scale", {1, 3}}}));
  v.push_back(unary("upsample_1d", arr({2, 4}), Json{{"op", "upsample"}, {"scale", 2}}));
  // mode="bilinear" / "linear": half-pixel sources clamped at 0, and align_corners
  v.push_back(unary("upsample_bilinear_2x", arr({2, 3, 2}), Json{{"op", "upsample"}, {"scale", 2}, {"mode", "linear"}}));
  v.push_back(unary("upsample_bilinear_3x2_corners", arr({2, 2, 3}),
                    Json{{"op", "upsample"}, {"scale", {3, 2}}, {"mode", "linear"}, {"align_corners", true}}));
  v.push_back(unary("upsample_linear_1d", arr({2, 4}), Json{{"op", "upsample"}, {"scale", 3}, {"mode", "linear"}}));
  v.push_back(unary("upsample_linear_1d_corners", arr({2, 4}),
                    Json{{"op", "upsample"}, {"scale", 2}, {"mode", "linear"}, {"align_corners", true}}));
  v.push_back(unary("groupnorm_no_affine", arr({4, 5}), Json{{"op", "groupnorm"}, {"groups", 2}, {"affine", false}}));
  v.push_back(unary("rmsnorm", arr({3, 6}), Json{{"op", "rmsnorm"}}));
  v.push_back(unary("rmsnorm_offset", arr({3, 6}), Json{{"op", "rmsnorm"}, {"offset", 1.0}}));  // Gemma: x rstd (1 + w)
  v.push_back(unary("gelu", arr({3, 4}), Json{{"op", "gelu"}}));
  v.push_back(unary("gelu_tanh", arr({3, 4}), Json{{"op", "gelu"}, {"approximate", "tanh"}}));
  v.push_back(unary("relu", arr({3, 4}), Json{{"op", "relu"}}, Gen::away));
  v.push_back(unary("silu", arr({3, 4}), Json{{"op", "silu"}}));
  v.push_back(unary("tanh", arr({3, 4}), Json{{"op", "tanh"}}));
  v.push_back(unary("sigmoid", arr({3, 4}), Json{{"op", "sigmoid"}}));
  v.push_back(unary("clip_relu6", arr({3, 4}), Json{{"op", "clip"}, {"min", 0.0}, {"max", 6.0}}, Gen::away));
  v.push_back(unary("clip_hardtanh", arr({3, 4}), Json{{"op", "clip"}, {"min", -1.0}, {"max", 1.0}}, Gen::away_one));
  v.push_back(unary("hardsigmoid", arr({3, 4}), Json{{"op", "hardsigmoid"}}, Gen::away_three));
  v.push_back(unary("hardswish", arr({3, 4}), Json{{"op", "hardswish"}}, Gen::away_three));
  // torch.nn's LeakyReLU, ELU and Softplus (a user's own model)
  v.push_back(unary("leaky_relu", arr({3, 4}), Json{{"op", "leaky_relu"}, {"slope", 0.1}}, Gen::away));
  v.push_back(unary("elu", arr({3, 4}), Json{{"op", "elu"}, {"alpha", 0.7}}, Gen::away));
  v.push_back(unary("softplus", arr({3, 4}), Json{{"op", "softplus"}}));
  v.push_back(unary("mish", arr({3, 4}), Json{{"op", "mish"}}));
  v.push_back(unary("prelu_one", arr({3, 4}), Json{{"op", "prelu"}, {"shape", {1}}}, Gen::away));
  v.push_back(unary("prelu_channels", arr({3, 2, 2}), Json{{"op", "prelu"}, {"shape", {3, 1, 1}}}, Gen::away));
  // a learned bias added outside a projection (I-BERT's written-out LayerNorm)
  v.push_back(unary("shift_last_axis", arr({3, 4}), Json{{"op", "shift"}, {"shape", {4}}}));
  v.push_back(unary("shift_channels", arr({3, 2, 2}), Json{{"op", "shift"}, {"shape", {3, 1, 1}}}));
  // Written-out math (--fusion eager): gelu_new's pieces and LlamaRMSNorm's
  v.push_back(unary("affine", arr({3, 4}), Json{{"op", "affine"}, {"scale", -0.75}, {"shift", 0.5}}));
  v.push_back(unary("pow_cube", arr({3, 4}), Json{{"op", "pow"}, {"exponent", 3.0}}));
  v.push_back(unary("pow_square", arr({3, 4}), Json{{"op", "pow"}, {"exponent", 2.0}}));
  v.push_back(unary("pow_fractional", arr({3, 4}), Json{{"op", "pow"}, {"exponent", -1.5}}, Gen::positive));
  v.push_back(unary("sqrt", arr({3, 4}), Json{{"op", "sqrt"}}, Gen::positive));
  v.push_back(unary("reciprocal", arr({3, 4}), Json{{"op", "reciprocal"}}, Gen::positive));
  v.push_back(unary("erf", arr({3, 4}), Json{{"op", "erf"}}));
  v.push_back(unary("acos", arr({3, 4}), Json{{"op", "acos"}}, Gen::inside_one));
  v.push_back(unary("reduce_mean_keepdims", arr({3, 5}), Json{{"op", "reduce_mean"}, {"keepdims", true}}));
  v.push_back(unary("reduce_mean", arr({2, 3, 5}), Json{{"op", "reduce_mean"}}));
  // over a middle or the first per-sample axis (a mean over the sequence)
  v.push_back(unary("reduce_mean_axis1", arr({2, 3, 5}), Json{{"op", "reduce_mean"}, {"axis", 1}}));
  v.push_back(unary("reduce_mean_axis0_keepdims", arr({3, 4}), Json{{"op", "reduce_mean"}, {"axis", 0}, {"keepdims", true}}));
  // x.sum over the tokens (SwiftFormer's), and over the last axis keeping it
  v.push_back(unary("reduce_sum_axis0", arr({4, 3}), Json{{"op", "reduce_sum"}, {"axis", 0}}));
  v.push_back(unary("reduce_sum_keepdims", arr({2, 3, 5}), Json{{"op", "reduce_sum"}, {"keepdims", true}}));
  // F.normalize's norm over the width, and torch.norm over a middle axis
  v.push_back(unary("reduce_l2_keepdims", arr({3, 5}), Json{{"op", "reduce_l2"}, {"keepdims", true}}));
  v.push_back(unary("reduce_l2_axis1", arr({2, 4, 3}), Json{{"op", "reduce_l2"}, {"axis", 1}}));
  // Outside an attention pattern: softmax over the last axis, and the product
  // of two activations, batched, and with Falcon's one KV head broadcast
  // against the query heads ([2, 3, 4] x [1, 4, 5]).
  v.push_back(unary("softmax", arr({3, 5}), Json{{"op", "softmax"}}));
  // A causal mask the graph builds itself: added above the diagonal (OPT), or
  // filling it (GPT-NeoX's torch.where); a small value keeps the test's
  // finite differences meaningful.
  v.push_back(unary("causal_mask", arr({2, 4, 4}), Json{{"op", "causal_mask"}, {"value", -2.5}}));
  v.push_back(unary("causal_mask_fill", arr({2, 4, 4}), Json{{"op", "causal_mask"}, {"value", -2.5}, {"fill", true}}));
  // GPT-BigCode's multi-query scores [T, H, T]: the queries' axis is not the second to last
  v.push_back(unary("causal_mask_query_axis", arr({4, 3, 4}),
                    Json{{"op", "causal_mask"}, {"value", -2.5}, {"fill", true}, {"query_axis", 0}}));
  // ALiBi's bias over scores [H, T, Tk] (BLOOM), 3 heads: slopes 1/16 and 1/256, then 1/4
  v.push_back(unary("alibi", arr({3, 2, 4}), Json{{"op", "alibi"}}));
  // Swin's relative position bias: 2 windows of 2 heads over a 2 x 3 window
  // (a [15, 2] table), and one [H, T, T] block over a 2 x 2 window
  v.push_back(unary("window_position_bias", arr({2, 2, 6, 6}), Json{{"op", "window_position_bias"}, {"window", {2, 3}}}));
  v.push_back(unary("window_position_bias_square", arr({3, 4, 4}), Json{{"op", "window_position_bias"}, {"window", 2}}));
  // BEiT's: a class token at 0 besides a 2 x 3 window (7 positions, 5 x 3 + 3 table rows)
  v.push_back(unary("window_position_bias_cls", arr({2, 7, 7}),
                    Json{{"op", "window_position_bias"}, {"window", {2, 3}}, {"cls", true}}));
  // Swin's shifted-window mask: a 2 x 2 grid of 2 x 3 windows shifted by (1, 1);
  // a small value keeps the finite differences meaningful
  v.push_back(unary("window_mask", arr({4, 2, 6, 6}),
                    Json{{"op", "window_mask"}, {"windows", 2}, {"window", {2, 3}}, {"shift", {1, 1}}, {"value", -2.5}}));
  // RoPE outside an attention (GPT-NeoX): [heads 2, T 3, d 4], a small theta
  // so that every pair turns visibly
  v.push_back(unary("rope", arr({2, 3, 4}), Json{{"op", "rope"}, {"theta", 3.0}}));
  // GPT-J's interleaved pairs (2i, 2i + 1) on [T 3, heads 2, d 6]: the
  // positions' axis is -3, and both heads of a position share its angles
  v.push_back(unary("rope_interleaved", arr({3, 2, 6}),
                    Json{{"op", "rope"}, {"theta", 3.0}, {"interleaved", true}, {"position_axis", -3}}));
  for (const auto& [name, a, b] : {std::tuple{"matmul", arr({3, 4}), arr({4, 2})},
                                   std::tuple{"matmul_batched", arr({2, 3, 4}), arr({2, 4, 5})},
                                   std::tuple{"matmul_broadcast", arr({2, 3, 4}), arr({1, 4, 5})},
                                   std::tuple{"matmul_broadcast_left", arr({1, 3, 4}), arr({2, 2, 4, 2})}}) {
    OpCase c;
    c.name = name;
    c.ir = make_ir(name, Json{{"a", f32(a)}, {"b", f32(b)}},
                   Json::array({Json{{"name", "op"}, {"op", "matmul"}, {"in", {"a", "b"}}}}));
    v.push_back(c);
  }
  // A tensor without the batch axis (a `parameter`, computed once per step)
  // read beside a per-sample one: broadcast over the samples, its gradient
  // summed over them. Each reads `w`, the parameter node, and `x`.
  for (const auto& [name, op, x, w, w_first] :
       {std::tuple{"matmul_once_per_step", "matmul", arr({3, 4}), arr({4, 5}), false},  // MobileBERT's head
        std::tuple{"matmul_once_per_step_left", "matmul", arr({2, 4, 3}), arr({5, 4}), true},
        std::tuple{"add_once_per_step", "add", arr({2, 3, 4}), arr({3, 4}), false},  // Swin V2's position bias
        std::tuple{"mul_once_per_step", "mul", arr({3, 4}), arr({3, 4}), true}}) {   // its logit scale
    OpCase c;
    c.name = name;
    c.ir = make_ir(name, Json{{"x", f32(x)}},
                   Json::array({Json{{"name", "w"}, {"op", "parameter"}, {"in", Json::array()}, {"shape", w}},
                                Json{{"name", "op"}, {"op", op}, {"in", w_first ? Json{"w", "x"} : Json{"x", "w"}}}}));
    v.push_back(c);
  }
  {  // the parameter itself: y = W, dW = dy
    OpCase c;
    c.name = "parameter";
    c.node = "w";
    c.ir = make_ir("parameter", Json{{"x", f32(arr({3, 4}))}},
                   Json::array({Json{{"name", "w"}, {"op", "parameter"}, {"in", Json::array()}, {"shape", {3, 4}}},
                                Json{{"name", "op"}, {"op", "mul"}, {"in", {"x", "w"}}}}));
    v.push_back(c);
  }
  {  // a squeeze-and-excitation scale: x [3, 2, 2] * s [3, 1, 1], and the operands the other way round
    OpCase c;
    c.name = "mul_broadcast";
    c.ir = make_ir("mul_broadcast", Json{{"x", f32(arr({3, 2, 2}))}, {"s", f32(arr({3, 1, 1}))}},
                   Json::array({Json{{"name", "op"}, {"op", "mul"}, {"in", {"x", "s"}}}}));
    v.push_back(c);
    c.name = "mul_broadcast_both";  // [2, 1, 3] * [4, 1]: each operand repeats along a dimension of the other
    c.ir = make_ir("mul_broadcast_both", Json{{"a", f32(arr({2, 1, 3}))}, {"b", f32(arr({4, 1}))}},
                   Json::array({Json{{"name", "op"}, {"op", "mul"}, {"in", {"a", "b"}}}}));
    v.push_back(c);
  }
  {  // x - x.mean(-1, keepdim=True): [3, 4] + [3, 1], and both operands repeating
    OpCase c;
    c.name = "add_broadcast";
    c.ir = make_ir("add_broadcast", Json{{"x", f32(arr({3, 4}))}, {"m", f32(arr({3, 1}))}},
                   Json::array({Json{{"name", "op"}, {"op", "add"}, {"in", {"x", "m"}}}}));
    v.push_back(c);
    c.name = "add_broadcast_both";  // [2, 1, 3] + [4, 1]
    c.ir = make_ir("add_broadcast_both", Json{{"a", f32(arr({2, 1, 3}))}, {"b", f32(arr({4, 1}))}},
                   Json::array({Json{{"name", "op"}, {"op", "add"}, {"in", {"a", "b"}}}}));
    v.push_back(c);
  }
  {  // ConvNeXt's permutes around its LayerNorm, and a cyclic one of three unequal axes
    OpCase c;
    c.name = "transpose_to_channels_last";
    c.ir = make_ir("transpose_to_channels_last", Json{{"x", f32(arr({3, 2, 4}))}},
                   Json::array({Json{{"name", "op"}, {"op", "transpose"}, {"in", {"x"}}, {"perm", {1, 2, 0}}}}));
    v.push_back(c);
    c.name = "transpose_cyclic";
    c.ir = make_ir("transpose_cyclic", Json{{"x", f32(arr({2, 3, 4}))}},
                   Json::array({Json{{"name", "op"}, {"op", "transpose"}, {"in", {"x"}}, {"perm", {2, 0, 1}}}}));
    v.push_back(c);
  }
  {  // ShuffleNetV2's channel split (both halves) and a range of a later axis
    OpCase c;
    c.name = "slice_channels";
    c.ir = make_ir("slice_channels", Json{{"x", f32(arr({4, 2, 3}))}},
                   Json::array({Json{{"name", "op"}, {"op", "slice"}, {"in", {"x"}}, {"axis", 0}, {"start", 2}, {"end", 4}}}));
    v.push_back(c);
    c.name = "slice_middle_axis";
    c.ir = make_ir("slice_middle_axis", Json{{"x", f32(arr({2, 5, 3}))}},
                   Json::array({Json{{"name", "op"}, {"op", "slice"}, {"in", {"x"}}, {"axis", 1}, {"start", 1}, {"end", 4}}}));
    v.push_back(c);    // Swin's patch merging x[:, 1::2]: an odd extent, so the last kept row ends it
    c.name = "slice_strided";
    c.ir = make_ir("slice_strided", Json{{"x", f32(arr({3, 7, 2}))}},
                   Json::array({Json{{"name", "op"}, {"op", "slice"}, {"in", {"x"}}, {"axis", 1}, {"start", 1},
                                     {"end", 7}, {"step", 2}}}));
    v.push_back(c);
  }
  {  // TensorFlow's "same" padding ahead of a stride-2 convolution (Hugging Face's
     // MobileNets): one row and column after, none before on H; and a value
    OpCase c;
    c.name = "pad_tf_same";
    c.ir = make_ir("pad_tf_same", Json{{"x", f32(arr({3, 5, 4}))}},
                   Json::array({Json{{"name", "op"}, {"op", "pad"}, {"in", {"x"}}, {"pads", {0, 0, 1, 0, 1, 1}}}}));
    v.push_back(c);
    c.name = "pad_value";
    c.ir = make_ir("pad_value", Json{{"x", f32(arr({4, 6}))}},
                   Json::array({Json{{"name", "op"}, {"op", "pad"}, {"in", {"x"}}, {"pads", {1, 0, 2, 3}},
                                     {"value", 0.5}}}));
    v.push_back(c);
  }
  {  // heads split out of the width, as a view does: [6, 4] -> [6, 2, 2]
    OpCase c;
    c.name = "reshape_split_heads";
    c.ir = make_ir("reshape_split_heads", Json{{"x", f32(arr({6, 4}))}},
                   Json::array({Json{{"name", "op"}, {"op", "reshape"}, {"in", {"x"}}, {"shape", {6, 2, 2}}}}));
    v.push_back(c);
  }
  {  // a learned per-channel gain (ConvNeXt's layer_scale [C, 1, 1]) and one over the last axis
    OpCase c;
    c.name = "scale_channels";
    c.ir = make_ir("scale_channels", Json{{"x", f32(arr({3, 2, 2}))}},
                   Json::array({Json{{"name", "op"}, {"op", "scale"}, {"in", {"x"}}, {"shape", {3, 1, 1}}}}));
    v.push_back(c);
    c.name = "scale_last_axis";
    c.ir = make_ir("scale_last_axis", Json{{"x", f32(arr({2, 4}))}},
                   Json::array({Json{{"name", "op"}, {"op", "scale"}, {"in", {"x"}}, {"shape", {4}}}}));
    v.push_back(c);
  }
  {  // concat of three inputs along the channels (DenseNet) and along a later axis
    OpCase c;
    c.name = "concat_channels";
    c.ir = make_ir("concat_channels",
                   Json{{"a", f32(arr({2, 3, 2}))}, {"b", f32(arr({1, 3, 2}))}, {"c", f32(arr({3, 3, 2}))}},
                   Json::array({Json{{"name", "op"}, {"op", "concat"}, {"in", {"a", "b", "c"}}}}));
    v.push_back(c);
    c.name = "concat_axis1";
    c.ir = make_ir("concat_axis1", Json{{"a", f32(arr({2, 3, 2}))}, {"b", f32(arr({2, 1, 2}))}},
                   Json::array({Json{{"name", "op"}, {"op", "concat"}, {"in", {"a", "b"}}, {"axis", 1}}}));
    v.push_back(c);
  }
  // SqueezeNet's 3x3 stride-2 pooling with ceil_mode: 7 -> 3 rows, 6 -> 3 columns (the last window half outside)
  v.push_back(unary("maxpool2d_ceil", arr({2, 7, 6}),
                    Json{{"op", "maxpool2d"}, {"kernel", 3}, {"stride", 2}, {"ceil_mode", true}}, Gen::distinct));
  // --fusion eager's max pool: PyTorch's int64 indices, and the input kept
  v.push_back(unary("maxpool2d_eager", arr({2, 7, 6}),
                    Json{{"op", "maxpool2d"}, {"kernel", 3}, {"stride", 2}, {"ceil_mode", true}, {"eager", true}},
                    Gen::distinct));
  v.push_back(unary("global_avgpool_keepdims", arr({3, 4, 5}), Json{{"op", "global_avgpool"}, {"keepdims", true}}));
  for (const char* op : {"add", "mul"}) {
    OpCase c;
    c.name = op;
    c.ir = make_ir(op, Json{{"a", f32(arr({3, 4}))}, {"b", f32(arr({3, 4}))}},
                   Json::array({Json{{"name", "op"}, {"op", op}, {"in", {"a", "b"}}}}));
    v.push_back(c);
  }
  v.push_back(unary("dropout", arr({4, 5}), Json{{"op", "dropout"}, {"p", 0.3}}));
  v.push_back(unary("dropout_p0", arr({4, 5}), Json{{"op", "dropout"}, {"p", 0.0}}));
  v.push_back(unary("drop_path", arr({4, 5}), Json{{"op", "drop_path"}, {"p", 0.5}}));
  v.push_back(unary("drop_path_p0", arr({4, 5}), Json{{"op", "drop_path"}, {"p", 0.0}}));

  // Attention: x [5, 8].
  v.push_back(attention_case("attention", Json{{"heads", 2}}));
  v.push_back(attention_case("attention_causal", Json{{"heads", 2}, {"causal", true}}));
  v.push_back(attention_case("attention_gqa_nobias", Json{{"heads", 4}, {"kv_heads", 2}, {"bias", false}, {"causal", true}}));
  v.push_back(attention_case("attention_head_dim3", Json{{"heads", 2}, {"head_dim", 3}}));
  v.push_back(attention_case("attention_rope_gqa",
                             Json{{"heads", 2}, {"kv_heads", 1}, {"rope", true}, {"causal", true}, {"rope_theta", 100.0}}));
  v.push_back(attention_case("attention_dropout", Json{{"heads", 2}, {"causal", true}, {"dropout", 0.2}}));
  // Qwen2: biases on q, k, v only; Phi: RoPE on the first 2 of 4 head dims, biases everywhere.
  v.push_back(attention_case("attention_qkv_bias_gqa",
                             Json{{"heads", 4}, {"kv_heads", 2}, {"bias", false}, {"qkv_bias", true}, {"rope", true}, {"causal", true}}));
  v.push_back(attention_case("attention_out_bias_only", Json{{"heads", 2}, {"bias", false}, {"out_bias", true}}));
  v.push_back(attention_case("attention_partial_rotary",
                             Json{{"heads", 2}, {"rope", true}, {"rotary_dim", 2}, {"causal", true}, {"rope_theta", 50.0}}));
  {  // LoRA after a q, k, v-only bias: the adapters' parameter indices follow the biases present
    OpCase c = attention_case("attention_qkv_bias_lora_o",
                              Json{{"heads", 2}, {"bias", false}, {"qkv_bias", true}, {"causal", true}});
    c.fine_tuning.lora_rank = 2;
    c.fine_tuning.lora_targets = {"q", "o"};
    v.push_back(c);
  }
  v.push_back(attention_case("flash_attention", Json{{"heads", 2}}, true));
  for (bool flash : {false, true}) {  // LoRA on every projection, with RoPE and GQA
    OpCase c = attention_case(flash ? "flash_attention_lora_qkvo" : "attention_lora_qkvo",
                              Json{{"heads", 4}, {"kv_heads", 2}, {"rope", true}, {"causal", true}}, flash);
    c.fine_tuning.lora_rank = 2;
    c.fine_tuning.lora_targets = {"q", "k", "v", "o"};
    c.fine_tuning.lora_alpha = 4;
    v.push_back(c);
  }
  v.push_back(attention_case("flash_attention_causal_gqa_rope",
                             Json{{"heads", 4}, {"kv_heads", 2}, {"rope", true}, {"causal", true}, {"bias", false}}, true));
  v.push_back(attention_case("flash_attention_dropout", Json{{"heads", 2}, {"causal", true}, {"dropout", 0.2}}, true));
  v.push_back(attention_case("flash_attention_partial_rotary_qkv_bias",
                             Json{{"heads", 2}, {"bias", false}, {"qkv_bias", true}, {"rope", true}, {"rotary_dim", 2},
                                  {"causal", true}},
                             true));

  // T5's pieces: cross attention (T = 4 queries of width 8 reading Tk = 6
  // keys of width 6), a position bias [heads, T, Tk] input added to the
  // scores with T5's scale 1, and both, in the math and the flash forms.
  {
    auto t5_case = [&](const std::string& name, bool cross, bool bias, bool flash, Json attrs) {
      const int64_t T = 4, Tk = cross ? 6 : 4;
      Json inputs{{"x", f32(arr({T, 8}))}};
      Json in = Json::array({"x"});
      if (cross) {
        inputs["mem"] = f32(arr({Tk, 6}));
        in.push_back("mem");
        attrs["cross"] = true;
      }
      if (bias) {
        inputs["pb"] = f32(arr({2, T, Tk}));
        in.push_back("pb");
        attrs["position_bias"] = true;
        attrs["scale"] = 1.0;
      }
      attrs["name"] = "op";
      attrs["op"] = "attention";
      attrs["in"] = in;
      attrs["heads"] = 2;
      OpCase c;
      c.name = name;
      c.ir = make_ir(name, inputs, Json::array({attrs}));
      c.flash = flash;
      return c;
    };
    for (bool flash : {false, true}) {
      const std::string f = flash ? "flash_" : "";
      v.push_back(t5_case(f + "attention_cross", true, false, flash, Json{{"bias", false}}));
      v.push_back(t5_case(f + "attention_position_bias_causal_dropout", false, true, flash,
                          Json{{"bias", false}, {"causal", true}, {"dropout", 0.2}}));
      v.push_back(t5_case(f + "attention_cross_position_bias_gqa", true, true, flash,
                          Json{{"kv_heads", 1}, {"head_dim", 3}}));
    }
    OpCase c = t5_case("attention_cross_lora_qkvo", true, false, false, Json{{"bias", false}});
    c.fine_tuning.lora_rank = 2;
    c.fine_tuning.lora_targets = {"q", "k", "v", "o"};
    c.fine_tuning.lora_alpha = 4;
    v.push_back(c);
  }
  // T5's relative position bias over 12 positions: 8 buckets reach exact
  // offsets below 2 (4 without bidirectional) and logarithmic ones up to 10.
  for (bool bidirectional : {true, false}) {
    OpCase c;
    c.name = bidirectional ? "relative_position_bias" : "relative_position_bias_causal";
    c.ir = make_ir(c.name, Json{{"ids", i32(arr({12}))}},
                   Json::array({Json{{"name", "op"}, {"op", "relative_position_bias"}, {"in", {"ids"}}, {"heads", 2},
                                     {"buckets", 8}, {"max_distance", 10}, {"bidirectional", bidirectional}}}));
    c.id_range["ids"] = 5;
    v.push_back(c);
  }

  // Mixture of experts (ops_moe.cpp), T = 6 tokens of width 4, 4 experts of
  // hidden width 5. The expert and the combine read probabilities: a factor
  // of 0.5 gives 2 places per expert, 8 for 12 choices, so that at least 4
  // are dropped; 2 gives 6 places (none dropped); Switch's top-1 keeps the
  // raw gate. The expert's routing passes no gradient to the probabilities
  // (finite differences find none either: the choices do not move). The
  // probabilities are positive, as a softmax's, so that the renormalising sum
  // stays away from zero, and apart, so that no top-k has a tie (bf16's
  // rounding makes ties of random values, across which the finite
  // differences jump).
  v.push_back(unary("moe_router", arr({6, 4}), Json{{"op", "moe_router"}, {"experts", 4}}));
  for (const auto& [name, factor] : {std::pair{"moe_expert_drops", 0.5}, std::pair{"moe_expert_dropless", 2.0}}) {
    OpCase c;
    c.name = name;
    c.ir = make_ir(name, Json{{"x", f32(arr({6, 4}))}, {"probs", f32(arr({6, 4}))}},
                   Json::array({Json{{"name", "op"}, {"op", "moe_expert"}, {"in", {"x", "probs"}}, {"expert", 1},
                                     {"hidden", 5}, {"top_k", 2}, {"capacity_factor", factor}}}));
    c.gen = Gen::distinct_positive;
    v.push_back(c);
  }
  for (const auto& [name, top_k, factor, places] :
       {std::tuple{"moe_combine_drops", 2, 0.5, 2}, std::tuple{"moe_combine_dropless", 2, 2.0, 6},
        std::tuple{"moe_combine_switch_top1", 1, 1.25, 2}}) {
    OpCase c;
    c.name = name;
    Json inputs{{"probs", f32(arr({6, 4}))}};
    Json in = Json::array({"probs"});
    for (int e = 0; e < 4; ++e) {
      inputs["out" + std::to_string(e)] = f32(arr({places, 4}));
      in.push_back("out" + std::to_string(e));
    }
    Json node{{"name", "op"}, {"op", "moe_combine"}, {"in", in}, {"top_k", top_k}, {"capacity_factor", factor}};
    if (top_k == 1) node["normalize"] = false;
    c.ir = make_ir(name, inputs, Json::array({node}));
    c.gen = Gen::distinct_positive;
    v.push_back(c);
  }

  {  // cross_entropy on [K] logits (one label per sample) and on [T, K]
    OpCase c;
    c.name = "cross_entropy_K";
    c.ir = make_ir("ce", Json{{"logits", f32(arr({5}))}, {"targets", i32(Json::array())}},
                   Json::array({Json{{"name", "op"}, {"op", "cross_entropy"}, {"in", {"logits", "targets"}}}}));
    c.id_range["targets"] = 5;
    v.push_back(c);
    c.name = "cross_entropy_TK_scaled";
    c.ir["inputs"] = Json{{"logits", f32(arr({3, 5}))}, {"targets", i32(arr({3}))}};
    c.grad_scale = 0.5;
    v.push_back(c);
    c.name = "cross_entropy_fused";  // keeps the logits and lse, recomputes the softmax in backward
    c.ir["nodes"][0]["fused"] = true;
    v.push_back(c);
  }
  return v;
}

// ---- harness ---------------------------------------------------------------------

// One node of a case's model, with its inputs, parameters and buffers allocated
// (categories: inputs workspace, parameters and buffers params).
struct OpRun {
  Model model;
  int node = -1;
  OpDecl decl;
  Allocator* alloc = nullptr;
  OpContext ctx;
  std::vector<int> float_inputs;  // indices into ctx.in of f32 inputs
  std::mt19937 rng;

  const Node& n() const { return model.nodes[static_cast<size_t>(node)]; }
  Shape out_shape() const {
    const Shape& s = model.output_of(n()).shape;
    if (n().op == OpKind::cross_entropy) return {};  // the scalar loss
    Shape b{ctx.batch};
    b.insert(b.end(), s.begin(), s.end());
    return b;
  }
};

// An input whose gradient is zero by definition: an expert's routing is a
// top-k of the probabilities, which passes no gradient (the gates do, in
// moe_combine).
inline bool input_grad_is_zero(const OpRun& r, size_t input) { return r.n().op == OpKind::moe_expert && input == 1; }

inline void fill(Tensor& t, Gen gen, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = t.numel();
  if (gen == Gen::distinct || gen == Gen::distinct_positive) {
    const int64_t first = gen == Gen::distinct ? -(n / 2) : 10;  // 0.5 = 10 steps of 0.05
    std::vector<float> vals(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) vals[static_cast<size_t>(i)] = 0.05f * static_cast<float>(first + i);
    std::shuffle(vals.begin(), vals.end(), rng);
    for (int64_t i = 0; i < n; ++i) t.f()[i] = vals[static_cast<size_t>(i)];
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    float x = nd(rng) * scale;
    if (gen == Gen::away || gen == Gen::away_one) x = (x < 0 ? -1.0f : 1.0f) * (0.2f + std::fabs(x));
    if (gen == Gen::away_one && std::fabs(std::fabs(x) - 1.0f) < 0.2f) x += x < 0 ? -0.4f : 0.4f;
    if (gen == Gen::positive) x = 0.5f + std::fabs(x);
    if (gen == Gen::inside_one) x = 0.8f * std::tanh(x);
    if (gen == Gen::away_three) {
      x *= 2.5f;
      if (std::fabs(std::fabs(x) - 3.0f) < 0.2f) x += x < 0 ? -0.4f : 0.4f;
    }
    t.f()[i] = x;
  }
}

// The loader wants exactly one cross_entropy node: a case without one gets
// flatten(op) -> cross_entropy with a per-sample label (not run by the tests).
inline Json with_loss(Json ir) {
  for (const auto& n : ir["nodes"])
    if (n["op"] == "cross_entropy") return ir;
  ir["inputs"]["loss_targets"] = i32(Json::array());
  ir["nodes"].push_back(Json{{"name", "loss_flat"}, {"op", "flatten"}, {"in", {"op"}}});
  ir["nodes"].push_back(Json{{"name", "loss"}, {"op", "cross_entropy"}, {"in", {"loss_flat", "loss_targets"}}});
  return ir;
}

// Builds the model, allocates and fills everything the node reads. `seed` keys
// the random values (and the dropout seed).
inline OpRun make_run(const OpCase& c, Allocator& alloc, int64_t batch, uint32_t seed = 1234) {
  OpRun r;
  r.model = parse_model(with_loss(c.ir), c.name);
  apply_fine_tuning(r.model, c.fine_tuning);
  r.node = r.model.node_index(c.node.empty() ? "op" : c.node);
  r.decl = declare(r.model, r.n(), DeclOptions{c.flash});
  r.alloc = &alloc;
  r.rng.seed(seed);
  OpContext& ctx = r.ctx;
  ctx.model = &r.model;  // re-pointed by callers after moves (see bind)
  ctx.node_index = r.node;
  ctx.alloc = &alloc;
  ctx.batch = r.model.output_of(r.n()).batched ? batch : 1;  // computed once per step: one "sample"
  ctx.first_sample = 10;
  ctx.seed = 42;
  ctx.training = c.training;
  ctx.grad_scale = c.grad_scale;
  for (size_t i = 0; i < r.n().inputs.size(); ++i) {
    const TensorInfo& ti = r.model.tensor(r.n().inputs[i]);
    Shape s{ti.batched ? batch : 1};
    s.insert(s.end(), ti.shape.begin(), ti.shape.end());
    Tensor t = alloc.empty(s, ti.dtype, Category::workspace, "input " + ti.name);
    if (ti.dtype == DType::i32) {
      std::uniform_int_distribution<int> ud(0, c.id_range.at(ti.name) - 1);
      for (int64_t k = 0; k < t.numel(); ++k) t.i()[k] = ud(r.rng);
    } else {
      fill(t, c.gen, r.rng);
      r.float_inputs.push_back(static_cast<int>(i));
    }
    ctx.in.push_back(t);
  }
  if (r.n().op == OpKind::linear && r.n().attrs.has("tie")) {  // the embedding's weight comes first
    const Node& e = r.model.nodes[static_cast<size_t>(r.model.node_index(r.n().attrs.text("tie")))];
    Tensor w = alloc.empty({e.attrs.integer("num") * e.attrs.integer("dim")}, DType::f32, Category::params, "tied weight");
    fill(w, Gen::normal, r.rng, 0.5f);
    ctx.params.push_back(w);
  }
  for (const auto& p : r.decl.params) {
    Tensor w = alloc.empty({p.numel}, DType::f32, Category::params, p.suffix);
    fill(w, Gen::normal, r.rng, 0.5f);
    ctx.params.push_back(w);
  }
  for (const auto& b : r.decl.buffers) {  // BatchNorm: running_mean ~ N(0, 0.3), running_var in [0.5, 1.5]
    Tensor t = alloc.empty({b.numel}, DType::f32, Category::params, b.suffix);
    std::uniform_real_distribution<float> ud(0.5f, 1.5f);
    std::normal_distribution<float> nd(0.0f, 0.3f);
    for (int64_t k = 0; k < t.numel(); ++k) t.f()[k] = b.suffix == "running_var" ? ud(r.rng) : nd(r.rng);
    ctx.buffers.push_back(t);
  }
  return r;
}

// The context's pointers into the OpRun (call after the OpRun has its final address).
inline void bind(OpRun& r) {
  r.ctx.model = &r.model;
  r.ctx.node = &r.model.nodes[static_cast<size_t>(r.node)];
  r.ctx.decl = &r.decl;
}

// Forward with a fresh output tensor; saved tensors replace the previous ones.
inline void forward(Backend& be, OpRun& r) {
  bind(r);
  r.ctx.saved.clear();
  r.ctx.out = r.alloc->empty(r.out_shape(), DType::f32, Category::activations, "out");
  be.forward(r.ctx);
}

// Zeroed din (f32 inputs only) and dparams, dout = r.
inline void prepare_backward(OpRun& r, const Tensor& dout) {
  r.ctx.dout = dout;
  r.ctx.din.clear();
  for (size_t i = 0; i < r.ctx.in.size(); ++i) {
    const Tensor& x = r.ctx.in[i];
    r.ctx.din.push_back(x.dtype == DType::f32 ? r.alloc->zeros(x.shape, DType::f32, Category::workspace, "din")
                                              : Tensor{});
  }
  r.ctx.dparams.clear();
  for (const auto& p : r.ctx.params) r.ctx.dparams.push_back(r.alloc->zeros(p.shape, DType::f32, Category::grads, "dparam"));
}


// ---- finite differences (ops_grad_test, ops_bf16_test) -----------------------------

// The scalar the gradient checks differentiate: sum of out x r.
inline double loss_of(const Tensor& out, const std::vector<float>& r) {
  double l = 0;
  for (int64_t i = 0; i < out.numel(); ++i) l += double{out.f()[i]} * r[static_cast<size_t>(i)];
  return l;
}

// max |a - n| / (max |n| + 1e-3).
inline double rel_error(const float* a, const std::vector<double>& n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n.size(); ++i) {
    num = std::max(num, std::fabs(a[i] - n[i]));
    den = std::max(den, std::fabs(n[i]));
  }
  return num / (den + 1e-3);
}

// dL/dt by central differences, t (fp32) one of run's input or parameter tensors.
inline std::vector<double> numeric_grad(Backend& be, OpRun& run, Tensor& t, const std::vector<float>& r) {
  std::vector<double> g(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = t.f()[i];
    const float eps = 1e-3f * std::max(1.0f, std::fabs(v));
    const float hi = v + eps, lo = v - eps;
    t.f()[i] = hi;
    forward(be, run);
    const double lp = loss_of(run.ctx.out, r);
    t.f()[i] = lo;
    forward(be, run);
    const double lm = loss_of(run.ctx.out, r);
    t.f()[i] = v;
    g[static_cast<size_t>(i)] = (lp - lm) / (double{hi} - double{lo});
  }
  return g;
}

inline std::vector<float> random_r(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> r(static_cast<size_t>(n));
  for (auto& x : r) x = nd(rng);
  return r;
}

}  // namespace dlplan::exec::testing
