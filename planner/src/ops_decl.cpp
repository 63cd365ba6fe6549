// The per-op declaration: parameters, FLOPs, saved tensors and temporaries.
// This is the one place that says what each op keeps for backward; the step
// walk (memory.cpp) and the executor both read it.
//
// FLOPs count multiply-adds as 2. Backward of a GEMM is 2x forward (input
// gradient and weight gradient). Attention counts the full T x T score matrix
// even when causal, as model-FLOPs conventions do (PaLM, appendix B).
#include "dlplan/ops.hpp"

#include "dlplan/conv_window.hpp"
#include "dlplan/error.hpp"
#include "dlplan/limits.hpp"
#include "dlplan/norm_width.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <initializer_list>

namespace dlplan {
namespace {

using Ref = SavedTensor::Ref;

SavedTensor keep_input(int i) { return {Ref::input, i, "", 0, Elem::compute, false}; }
SavedTensor keep_output() { return {Ref::output, -1, "", 0, Elem::compute, false}; }
SavedTensor keep_own(std::string what, int64_t numel, Elem e, bool per_batch = false) {
  return {Ref::own, -1, std::move(what), numel, e, per_batch};
}

// The sizes an op derives from its shapes beyond its output (attention's T x T
// scores, a convolution's im2col columns) obey the loader's per-tensor limit;
// checked in double where the op's shapes are read, so that the int64
// products below cannot overflow.
void check_size(const Model& m, const Node& n, const char* what, std::initializer_list<int64_t> dims) {
  double size = 1;
  for (int64_t d : dims) size *= static_cast<double>(d);
  if (size > static_cast<double>(kMaxTensorElements))
    node_error(m.source, n, fmt::format("{} would hold {:.4g} elements per sample, more than 2^48", what, size));
}

// Rows of a [*, D] tensor: every dimension but the last.
int64_t rows(const Shape& s) { return s.empty() ? 1 : numel(s) / s.back(); }

// The q, k, v and o projections' forward FLOPs: q and o over the T queries,
// k and v over the Tk keys (the memory's rows under cross attention).
double attention_projection_flops(const AttentionShape& a) {
  return 2.0 * a.T * a.D * a.H * a.hd + 2.0 * a.Tk * a.Dm * 2 * a.KV * a.hd + 2.0 * a.T * a.H * a.hd * a.D;
}

void declare_attention(const Model& m, const Node& n, const DeclOptions& opt, OpDecl& d) {
  const AttentionShape a = attention_shape(m, n);
  const int64_t T = a.T, Tk = a.Tk, D = a.D, Dm = a.Dm, H = a.H, KV = a.KV, hd = a.hd;
  const double p = a.dropout;

  d.params = {{"q.weight", D * H * hd, true, {H * hd, D}}, {"k.weight", Dm * KV * hd, true, {KV * hd, Dm}},
              {"v.weight", Dm * KV * hd, true, {KV * hd, Dm}}, {"o.weight", H * hd * D, true, {D, H * hd}}};
  if (a.qkv_bias)
    for (auto [suffix, size] : {std::pair{"q.bias", H * hd}, {"k.bias", KV * hd}, {"v.bias", KV * hd}})
      d.params.push_back({suffix, size, false, {size}});
  if (a.out_bias) d.params.push_back({"o.bias", D, false, {D}});

  const double proj = attention_projection_flops(a);
  const double scores = 2.0 * H * T * Tk * hd;  // Q K^T, and again for P V
  d.fwd_flops = proj + 2 * scores;
  d.bwd_flops = 2 * d.fwd_flops;
  d.gemms = 4;

  // Saved for backward (Korthikanti et al. 2022, Sec. 4.1, with h = H*hd):
  // the QKV GEMM's input 2sbh, Q and K 4sbh, V 2sbh, the output projection's
  // input 2sbh; math: softmax output 2as^2b, its dropout mask as^2b and the
  // dropped probabilities 2as^2b; flash: only the log-sum-exp (fp32).
  // Cross attention keeps the memory too (the k and v GEMMs' input); the
  // position bias is kept only by the flash form, which recomputes the scores.
  d.saved.push_back(keep_input(0));
  if (a.cross) d.saved.push_back(keep_input(1));
  d.saved.push_back(keep_own("q", T * H * hd, Elem::compute));
  d.saved.push_back(keep_own("k", Tk * KV * hd, Elem::compute));
  d.saved.push_back(keep_own("v", Tk * KV * hd, Elem::compute));
  d.saved.push_back(keep_own("context", T * H * hd, Elem::compute));
  if (opt.flash_attention) {
    if (a.bias_input >= 0) d.saved.push_back(keep_input(a.bias_input));
    d.saved.push_back(keep_own("lse", H * T, Elem::f32));
    d.bwd_temps = {{"dq", T * H * hd, Elem::compute}, {"dk", Tk * KV * hd, Elem::compute},
                   {"dv", Tk * KV * hd, Elem::compute}, {"dcontext", T * H * hd, Elem::compute}};
  } else {
    d.saved.push_back(keep_own("probs", H * T * Tk, Elem::compute));
    if (p > 0) {
      d.saved.push_back(keep_own("probs_mask", H * T * Tk, Elem::u8));
      d.saved.push_back(keep_own("probs_dropped", H * T * Tk, Elem::compute));
    }
    d.fwd_temps = {{"scores", H * T * Tk, Elem::compute}};
    d.bwd_temps = {{"dq", T * H * hd, Elem::compute}, {"dk", Tk * KV * hd, Elem::compute},
                   {"dv", Tk * KV * hd, Elem::compute}, {"dcontext", T * H * hd, Elem::compute},
                   {"dprobs", H * T * Tk, Elem::compute}};
  }
}

// T5's relative position bias: a gather from a [buckets, heads] table into
// the [heads, T, T] output; its backward scatters the output's gradient,
// summed over the batch, back into the table. Nothing kept (the buckets
// follow from the positions).
void declare_relative_position_bias(const Model& m, const Node& n, OpDecl& d) {
  const int64_t H = n.attrs.integer("heads"), B = n.attrs.integer("buckets");
  const int64_t T = m.tensor(n.inputs[0]).shape[0];
  // Not decayed: HF's Trainer decays no parameter whose name holds "bias"
  // (relative_attention_bias.weight among them).
  d.params.push_back({"weight", B * H, false, {B, H}});
  d.fwd_flops = 0;
  d.bwd_flops = static_cast<double>(H * T * T);  // one add per element
}

// Swin's relative position bias (ops_schema.cpp): an add of a table read at
// constant indices. Keeps nothing: the gather's backward needs only the
// indices (a buffer), the add's nothing. Backward scatters the gradient,
// summed over the batch and the windows, into the table.
void declare_window_position_bias(const Model& m, const Node& n, OpDecl& d) {
  const Shape& x = m.tensor(n.inputs[0]).shape;
  const auto [wh, ww] = n.attrs.pair("window");
  const bool cls = n.attrs.has("cls") && n.attrs.flag("cls");  // BEiT's three rows for the class token
  const int64_t H = x[x.size() - 3], rows = (2 * wh - 1) * (2 * ww - 1) + (cls ? 3 : 0);
  // Not decayed: torchvision's Swin recipe trains it with
  // --transformer-embedding-decay 0, as position embeddings.
  d.params.push_back({"table", rows * H, false, {rows, H}});
  d.fwd_flops = static_cast<double>(numel(x));
  d.bwd_flops = static_cast<double>(numel(x));
}

// Mixture of experts (MoeRouting), as autograd keeps it in Mixtral's eager
// loop. The router: logits x W^T and their softmax; it keeps its input (for
// the weight gradient) and its output (the softmax's backward).
void declare_moe_router(const Model& m, const Node& n, OpDecl& d) {
  const Shape& x = m.tensor(n.inputs[0]).shape;
  const int64_t T = x[0], D = x[1], E = n.attrs.integer("experts");
  d.params.push_back({"weight", E * D, true, {E, D}});
  d.fwd_flops = 2.0 * T * D * E;
  d.bwd_flops = 2 * d.fwd_flops;
  d.gemms = 1;
  d.saved = {keep_input(0), keep_output()};
  d.bwd_temps = {{"dlogits", T * E, Elem::compute}};
}

// An expert: its routed tokens copied into its C places (the dispatch),
// h1 = X W1^T, h3 = X W3^T, act = silu(h1) * h3, out = act W2^T. It keeps
// the probabilities (to find its tokens again in backward), its gathered
// input (for w1's and w3's gradients), h1 (the SiLU's), silu(h1) and h3 (the
// product's) and the product (w2's). FLOPs are model FLOPs: the T k / E rows
// an expert gets on average, not its empty places.
void declare_moe_expert(const Model& m, const Node& n, OpDecl& d) {
  const MoeRouting r = moe_routing(m, n);
  const int64_t D = m.tensor(n.inputs[0]).shape[1], F = n.attrs.integer("hidden"), C = r.C;
  d.params.push_back({"w1.weight", F * D, true, {F, D}});
  d.params.push_back({"w2.weight", D * F, true, {D, F}});
  d.params.push_back({"w3.weight", F * D, true, {F, D}});
  const double rows = static_cast<double>(r.T * r.k) / static_cast<double>(r.E);
  d.fwd_flops = rows * (6.0 * D * F + F);
  d.bwd_flops = 2 * d.fwd_flops;
  d.gemms = 3;
  d.saved = {keep_input(1),
             keep_own("dispatched", C * D, Elem::compute),
             keep_own("h1", C * F, Elem::compute),
             keep_own("silu", C * F, Elem::compute),
             keep_own("h3", C * F, Elem::compute),
             keep_own("act", C * F, Elem::compute)};
  d.bwd_temps = {{"dact", C * F, Elem::compute},
                 {"dh1", C * F, Elem::compute},
                 {"dh3", C * F, Elem::compute},
                 {"ddispatched", C * D, Elem::compute}};
}

// The combine: y_t = sum over t's choices not dropped of gate * out[place].
// It keeps the probabilities (the gates' gradient goes back through them)
// and every expert's places (each gate's gradient is dy . out[place]).
void declare_moe_combine(const Model& m, const Node& n, OpDecl& d) {
  const MoeRouting r = moe_routing(m, n);
  const int64_t D = m.tensor(n.output).shape[1];
  d.fwd_flops = static_cast<double>(r.T * r.k * D);
  d.bwd_flops = 2 * d.fwd_flops;
  for (int i = 0; i < static_cast<int>(n.inputs.size()); ++i) d.saved.push_back(keep_input(i));
}

// LoRA (Hu et al. 2021, Sec. 4.1; peft's Linear layer): h = x W^T + (alpha/r)
// (x A^T) B^T beside each targeted weight. Parameters A [r, in] and B [out, r]
// (adapters: they alone train); forward two thin GEMMs and the scaled add;
// backward dB, d(xA), dA and the input's share dX; kept for backward: the
// input (for dA, already kept by the base op unless its weight is frozen, see
// restrict_to_needs) and the thin x A^T [rows, r] (for dB); a temporary
// d(x A^T) [rows, r] in backward.
void declare_lora(const Model& m, const Node& n, OpDecl& d) {
  for (const LoraAdapter& a : lora_adapters(m, n)) {
    check_size(m, n, "the LoRA adapter", {a.out, a.rank});
    d.params.push_back({a.prefix + "lora_A", a.rank * a.in, true, {a.rank, a.in}, true});
    d.params.push_back({a.prefix + "lora_B", a.out * a.rank, true, {a.out, a.rank}, true});
    d.fwd_flops += 2.0 * a.rows * a.rank * (a.in + a.out) + 2.0 * a.rows * a.out;
    d.bwd_flops += 2.0 * a.rows * a.rank * (2 * a.out + 2 * a.in);
    d.saved.push_back(keep_own(a.prefix + "lora_xa", a.rows * a.rank, Elem::compute));
    d.bwd_temps.push_back({a.prefix + "lora_dxa", a.rows * a.rank, Elem::compute});  // d(x A^T)
    d.gemms += 2;
  }
}

}  // namespace

AttentionShape attention_shape(const Model& m, const Node& n) {
  const Shape& x = m.tensor(n.inputs[0]).shape;
  AttentionShape a;
  a.T = a.Tk = x[0];
  a.D = a.Dm = x[1];
  a.cross = n.attrs.has("cross") && n.attrs.flag("cross");
  if (a.cross) {
    const Shape& mem = m.tensor(n.inputs[1]).shape;
    a.Tk = mem[0];
    a.Dm = mem[1];
  }
  if (n.attrs.has("position_bias") && n.attrs.flag("position_bias")) a.bias_input = a.cross ? 2 : 1;
  a.H = n.attrs.integer("heads");
  a.KV = n.attrs.integer("kv_heads");
  a.hd = n.attrs.integer("head_dim");
  a.causal = n.attrs.flag("causal");
  // qkv_bias and out_bias default to bias (all four, or none).
  a.qkv_bias = n.attrs.has("qkv_bias") ? n.attrs.flag("qkv_bias") : n.attrs.flag("bias");
  a.out_bias = n.attrs.has("out_bias") ? n.attrs.flag("out_bias") : n.attrs.flag("bias");
  a.rope = n.attrs.flag("rope");
  a.rotary_dim = !a.rope ? 0 : n.attrs.has("rotary_dim") ? n.attrs.integer("rotary_dim") : n.attrs.integer("head_dim");
  a.dropout = n.attrs.number("dropout");
  a.rope_theta = n.attrs.number("rope_theta");
  a.scale = n.attrs.has("scale") ? n.attrs.number("scale") : 1.0 / std::sqrt(static_cast<double>(a.hd));
  check_size(m, n, a.cross ? "the attention scores (heads x T x Tk)" : "the attention scores (heads x T x T)",
             {a.H, a.T, a.Tk});
  check_size(m, n, "the keys (keys x heads x head_dim)", {a.Tk, a.KV, a.hd});
  check_size(m, n, "the queries (T x heads x head_dim)", {a.T, std::max(a.H, a.KV), a.hd});
  return a;
}

int64_t relative_position_bucket(int64_t offset, int64_t buckets, int64_t max_distance, bool bidirectional) {
  int64_t bucket = 0, distance = 0;
  if (bidirectional) {
    buckets /= 2;
    if (offset > 0) bucket += buckets;
    distance = offset < 0 ? -offset : offset;
  } else {
    distance = offset < 0 ? -offset : 0;
  }
  const int64_t exact = buckets / 2;
  if (distance < exact) return bucket + distance;
  // exact + log(distance / exact) / log(max_distance / exact) * (buckets - exact),
  // truncated, as torch computes it: float32 throughout but for the second
  // log (Python's math.log, a double rounded to float32 when it divides).
  const float ratio = static_cast<float>(distance) / static_cast<float>(exact);
  const auto denom = static_cast<float>(std::log(static_cast<double>(max_distance) / static_cast<double>(exact)));
  const float scaled = std::log(ratio) / denom * static_cast<float>(buckets - exact);
  const int64_t large = exact + static_cast<int64_t>(scaled);
  return bucket + std::min(large, buckets - 1);
}

MoeRouting moe_routing(const Model& m, const Node& n) {
  const Shape& probs = m.tensor(n.inputs[n.op == OpKind::moe_expert ? 1 : 0]).shape;
  MoeRouting r;
  r.T = probs[0];
  r.E = probs[1];
  r.k = n.attrs.integer("top_k");
  r.C = n.attrs.integer("capacity");
  r.normalize = n.op == OpKind::moe_combine ? n.attrs.flag("normalize") : true;
  return r;
}

bool keeps_log_sum_exp(const OpDecl& d) {
  for (const auto& s : d.saved)
    if (s.ref == SavedTensor::Ref::own && s.what == "lse") return true;
  return false;
}

namespace {

// What lstm and gru share: per direction, PyTorch's weight_ih [G H, in],
// weight_hh [G H, H], bias_ih and bias_hh [G H] (G gates: 4 or 3), then the
// "_reverse" set; the input kept once and a state of 7 hidden a step and
// direction (each op's case says which); the GEMMs x W_ih^T and h W_hh^T
// and about 12 flops an element of hidden for the gates, and backward's
// dh_{t-1} = dgates W_hh, dW_hh, dW_ih and dx: the GEMMs twice over.
void declare_recurrent(const Node& n, const Shape& x, int64_t gates, int64_t state, OpDecl& d) {
  const int64_t T = x[0], in = x[1], H = n.attrs.integer("hidden"), G = gates * H;
  const int64_t dirs = n.attrs.flag("bidirectional") ? 2 : 1;
  for (const char* dir : {"", "_reverse"}) {  // nn.LSTM's order: weight_ih_l0, ..., weight_ih_l0_reverse, ...
    if (*dir && dirs == 1) break;
    const std::string s = dir;
    d.params.push_back({"weight_ih" + s, G * in, true, {G, in}});
    d.params.push_back({"weight_hh" + s, G * H, true, {G, H}});
    if (n.attrs.flag("bias"))
      for (const char* b : {"bias_ih", "bias_hh"}) d.params.push_back({b + s, G, false, {G}});
  }
  d.saved = {keep_input(0), keep_own("state", dirs * state, Elem::compute)};  // state: a direction's
  d.fwd_flops = dirs * (2.0 * T * G * (in + H) + 12.0 * T * H);
  d.bwd_flops = dirs * (2.0 * (2.0 * T * G * (in + H)) + 16.0 * T * H);
  d.gemms = 2;  // x W_ih^T, then h W_hh^T a step
}

}  // namespace

int64_t recurrent_gates(OpKind op) { return op == OpKind::lstm ? 4 : op == OpKind::gru ? 3 : 1; }

OpDecl declare(const Model& m, const Node& n, const DeclOptions& opt) {
  OpDecl d;
  const TensorInfo& out = m.output_of(n);
  const int64_t out_elems = numel(out.shape);
  auto in_shape = [&](int i) -> const Shape& { return m.tensor(n.inputs[static_cast<size_t>(i)]).shape; };

  switch (n.op) {
    case OpKind::embedding: {
      if (!n.attrs.has("tie"))  // tied: the table is the other embedding's
        d.params = {{"weight", n.attrs.integer("num") * n.attrs.integer("dim"), true,
                     {n.attrs.integer("num"), n.attrs.integer("dim")}}};
      d.saved = {keep_input(0)};  // the ids, to scatter the gradient
      d.fwd_flops = 0;
      d.bwd_flops = static_cast<double>(out_elems);  // scatter-add
      break;
    }
    case OpKind::pos_embedding: {
      d.fwd_flops = static_cast<double>(out_elems);
      d.bwd_flops = static_cast<double>(out_elems);
      if (n.attrs.has("sinusoidal")) break;  // fixed positions: no table to learn, and add keeps nothing
      d.params = {{"weight", n.attrs.integer("max_len") * in_shape(0)[1], true, {n.attrs.integer("max_len"), in_shape(0)[1]}}};
      break;
    }
    case OpKind::cls_token: {
      d.params = {{"weight", in_shape(0)[1], false, {1, 1, in_shape(0)[1]}}};
      break;
    }
    case OpKind::parameter: {  // its output is a copy of the weight, made once per step; keeps nothing
      const Shape shape = n.attrs.ints("shape");
      // Decayed when it is a matrix or more, as nanoGPT's configure_optimizers
      // decides for every parameter (vectors and scalars are biases, norms
      // and scales).
      if (!n.attrs.has("tie")) d.params = {{"weight", numel(shape), shape.size() >= 2, shape}};
      d.fwd_flops = static_cast<double>(out_elems);
      d.bwd_flops = static_cast<double>(out_elems);
      break;
    }
    case OpKind::linear: {
      const int64_t in = in_shape(0).back(), o = n.attrs.integer("out");
      if (!n.attrs.has("tie")) d.params.push_back({"weight", in * o, true, {o, in}});
      if (n.attrs.flag("bias")) d.params.push_back({"bias", o, false, {o}});
      d.saved = {keep_input(0)};
      d.fwd_flops = 2.0 * rows(in_shape(0)) * in * o;
      d.bwd_flops = 2 * d.fwd_flops;
      d.gemms = 1;
      break;
    }
    case OpKind::conv2d: {
      const int64_t c = in_shape(0)[0], o = n.attrs.integer("out"), g = n.attrs.integer("groups");
      const ConvWindow w = conv_window(in_shape(0), n.attrs);
      const std::array<int64_t, 2> k = {w.kh, w.kw};
      const int64_t pixels = numel(out.shape) / o;  // OH OW, or OL (1-D)
      d.params = {{"weight", o * (c / g) * k[0] * k[1], true,
                   w.one_d ? Shape{o, c / g, k[1]} : Shape{o, c / g, k[0], k[1]}}};
      if (n.attrs.flag("bias")) d.params.push_back({"bias", o, false, {o}});
      d.saved = {keep_input(0)};
      // im2col lowering (executor/cpu/ops_conv.cpp): one column matrix
      // [C kh kw, OH OW], reused sample by sample; backward rebuilds it for
      // the weight gradient and reuses it for the column gradient. A 1x1,
      // stride-1, unpadded convolution reads its input directly and needs none.
      // Dilation spaces the taps: the columns, FLOPs and weight are the same.
      const bool direct = w.kh == 1 && w.kw == 1 && w.sh == 1 && w.sw == 1 && w.ph == 0 && w.pw == 0;
      if (!direct) {
        check_size(m, n, "the im2col columns", {c, k[0], k[1], pixels});
        const int64_t cols = c * k[0] * k[1] * pixels;
        d.fwd_temps = {{"im2col", cols, Elem::compute, true}};
        d.bwd_temps = {{"im2col", cols, Elem::compute, true}};
      }
      d.fwd_flops = 2.0 * out_elems * (c / g) * k[0] * k[1];
      d.bwd_flops = 2 * d.fwd_flops;
      d.gemms = 1;
      break;
    }
    case OpKind::conv_transpose2d: {
      const int64_t c = in_shape(0)[0], o = n.attrs.integer("out"), g = n.attrs.integer("groups");
      const ConvWindow w = conv_window(in_shape(0), n.attrs);
      const int64_t pixels = numel(in_shape(0)) / c;  // the input's H W, or L (1-D)
      d.params = {{"weight", c * (o / g) * w.kh * w.kw, true,
                   w.one_d ? Shape{c, o / g, w.kw} : Shape{c, o / g, w.kh, w.kw}}};
      if (n.attrs.flag("bias")) d.params.push_back({"bias", o, false, {o}});
      // derivatives.yaml: convolution_backward(grad, input, weight, ...)
      // keeps the input (transposed is one of convolution's arguments).
      d.saved = {keep_input(0)};
      // Lowered as conv2d's adjoint (executor/cpu/ops_conv.cpp): per sample,
      // columns [out kh kw, H W] = W^T x scattered into the output by col2im;
      // backward gathers dy's columns (im2col) for dx = W dcol and
      // dW = x dcol^T. One column matrix, reused sample by sample.
      check_size(m, n, "the col2im columns", {o, w.kh, w.kw, pixels});
      const int64_t cols = o * w.kh * w.kw * pixels;
      d.fwd_temps = {{"col2im", cols, Elem::compute, true}};
      d.bwd_temps = {{"im2col", cols, Elem::compute, true}};
      d.fwd_flops = 2.0 * numel(in_shape(0)) * (o / g) * w.kh * w.kw;
      d.bwd_flops = 2 * d.fwd_flops;
      d.gemms = 1;
      break;
    }
    case OpKind::lstm: {
      // PyTorch 1.13 runs nn.LSTM on the CPU as aten's decomposed cell
      // (LSTMCell in ATen's RNN.cpp): one linear over the whole sequence,
      // gates_t = linear_ih(x)_t + linear_hh(h_{t-1}), then sigmoid_/tanh_ in
      // place on the gates' chunks, c_t = f c_{t-1} + i g, h_t = o tanh(c_t),
      // and a stack of the h_t. Autograd keeps, per step: h_{t-1} (addmm's
      // mat1), the activated gates (one storage, 4 hidden), c_{t-1} (mul's
      // other operand) and tanh(c_t) (tanh's result): 7 hidden a step, h_0
      // and c_0 (zeros) included; and the input x, for linear_ih's weight
      // gradient. The pack hook measures exactly this
      // (tests/fixtures/exports/weights: tiny-lstm). A bidirectional layer
      // runs a second cell over the reversed sequence (ATen's
      // ReversedFullLayer), keeping as much again; both read the one input.
      declare_recurrent(n, in_shape(0), 4, in_shape(0)[0] * 7 * n.attrs.integer("hidden"), d);
      // Backward, one direction after the other: the gates' gradients for the
      // whole sequence (then dW and dx are one GEMM each) and the running dh, dc.
      d.bwd_temps = {{"dgates", in_shape(0)[0] * 4 * n.attrs.integer("hidden"), Elem::compute},
                     {"dstate", 2 * n.attrs.integer("hidden"), Elem::compute}};
      break;
    }
    case OpKind::gru: {
      // nn.GRU on the CPU runs ATen's decomposed GRUCell (RNN.cpp), with
      // r, z, n the reset, update and new gates:
      //   hg = linear_hh(h_{t-1}); r = sigmoid_(hg_r + ig_r); z = sigmoid_(hg_z + ig_z)
      //   n = tanh_(ig_n + hg_n.mul_(r)); h_t = (h_{t-1} - n).mul_(z).add_(n)
      // over ig = linear_ih(x) for the whole sequence. Autograd keeps, per
      // step: h_{t-1} (addmm's mat1), hg's storage (3 hidden: r and z after
      // sigmoid_, hg_n after mul_), hg_n before its in-place mul_ (the other
      // factor of r's gradient), n (tanh_'s result) and h_{t-1} - n (mul_'s
      // other operand): 7 hidden a step, as the pack hook measures; and the
      // input, once. The input projection ig is a temporary of the forward.
      const int64_t T = in_shape(0)[0], H = n.attrs.integer("hidden");
      declare_recurrent(n, in_shape(0), 3, T * 7 * H, d);
      d.fwd_temps = {{"igates", T * 3 * H, Elem::compute}};
      // Backward: the input side's and the hidden side's gate gradients (they
      // differ in n's: dn, and dn r), and the running dh.
      d.bwd_temps = {{"dgates", T * 6 * H, Elem::compute}, {"dstate", H, Elem::compute}};
      break;
    }
    case OpKind::rnn: {
      // nn.RNN on the CPU runs ATen's SimpleCell (RNN.cpp): h_t =
      // tanh(linear_hh(h_{t-1}) + linear_ih(x_t)) (relu_ for "relu"), over the
      // input projection of the whole sequence. Autograd keeps h_{t-1}
      // (addmm's mat1) and the activation's output h_t, one storage with the
      // next step's h_{t-1}: T + 1 hidden states a direction, h_0 included,
      // as the pack hook measures (a layer 24 wide over 16 steps: 408
      // floats); and the input once.
      const int64_t T = in_shape(0)[0], H = n.attrs.integer("hidden");
      declare_recurrent(n, in_shape(0), 1, (T + 1) * H, d);
      // Backward: the pre-activations' gradients for the whole sequence, and the running dh.
      d.bwd_temps = {{"dgates", T * H, Elem::compute}, {"dstate", H, Elem::compute}};
      break;
    }
    case OpKind::batchnorm: {
      const int64_t c = in_shape(0)[0];
      d.params = {{"weight", c, false, {c}}, {"bias", c, false, {c}}};
      d.buffers = {{"running_mean", c, false, {c}}, {"running_var", c, false, {c}}};
      // Batch statistics are per channel over the whole micro-batch.
      d.saved = {keep_input(0), keep_own("mean", c, Elem::f32, true), keep_own("invstd", c, Elem::f32, true)};
      d.fwd_flops = 8.0 * out_elems;
      d.bwd_flops = 12.0 * out_elems;
      break;
    }
    case OpKind::layernorm: {
      const Shape normalised = layernorm_shape(in_shape(0), n.attrs);
      const int64_t dim = numel(normalised), r = numel(in_shape(0)) / dim;
      d.params = {{"weight", dim, false, normalised}};
      if (n.attrs.flag("bias")) d.params.push_back({"bias", dim, false, normalised});
      d.saved = {keep_input(0), keep_own("mean", r, Elem::f32), keep_own("rstd", r, Elem::f32)};
      d.fwd_flops = 8.0 * out_elems;
      d.bwd_flops = 12.0 * out_elems;
      break;
    }
    case OpKind::upsample:
      // derivatives.yaml: upsample_nearest2d_backward(grad, output_size,
      // input_size, scales) and upsample_(bi)linear*_backward(grad,
      // output_size, input_size, align_corners, scales) need only the sizes:
      // nothing kept. Nearest copies forward and sums each block of the
      // output's gradient backward. Linear blends 2 source elements an output
      // element along a length (3 flops) and 4 over [H, W] (a blend of two
      // blends: 9 flops), and backward scatters each gradient as many times.
      if (n.attrs.text("mode") == "linear") {
        const double per = in_shape(0).size() == 2 ? 3.0 : 9.0;
        d.fwd_flops = per * static_cast<double>(out_elems);
        d.bwd_flops = per * static_cast<double>(out_elems);
      } else {
        d.fwd_flops = 0;
        d.bwd_flops = static_cast<double>(out_elems);
      }
      break;
    case OpKind::groupnorm: {
      // derivatives.yaml: native_group_norm_backward(grad, input, mean, rstd,
      // weight, ...) keeps the input and the statistics, a (sample, group) pair
      // each: [N, groups] fp32 for an fp32 input.
      const int64_t c = in_shape(0)[0], groups = n.attrs.integer("groups");
      if (n.attrs.flag("affine")) d.params = {{"weight", c, false, {c}}, {"bias", c, false, {c}}};
      d.saved = {keep_input(0), keep_own("mean", groups, Elem::f32), keep_own("rstd", groups, Elem::f32)};
      d.fwd_flops = 8.0 * out_elems;
      d.bwd_flops = 12.0 * out_elems;
      break;
    }
    case OpKind::rmsnorm: {
      d.params = {{"weight", in_shape(0).back(), false, {in_shape(0).back()}}};
      d.saved = {keep_input(0), keep_own("rstd", rows(in_shape(0)), Elem::f32)};
      d.fwd_flops = 6.0 * out_elems;
      d.bwd_flops = 10.0 * out_elems;
      break;
    }
    case OpKind::gelu:
    case OpKind::silu:
      d.saved = {keep_input(0)};
      d.fwd_flops = 8.0 * out_elems;
      d.bwd_flops = 12.0 * out_elems;
      break;
    case OpKind::clip:
      // 1 where min < x < max. PyTorch's hardtanh keeps its input for this
      // (derivatives.yaml: hardtanh_backward(grad, self, ...)); measured with
      // PyTorch 1.13, ReLU6(inplace=True) too keeps a storage apart from the
      // output the next op keeps.
      d.saved = {keep_input(0)};
      d.fwd_flops = 2.0 * out_elems;
      d.bwd_flops = 2.0 * out_elems;
      break;
    case OpKind::hardsigmoid:
    case OpKind::hardswish:
      // PyTorch keeps the input of both (derivatives.yaml: hardsigmoid_backward(grad, self),
      // hardswish_backward(grad, self)); the derivative is piecewise in x.
      d.saved = {keep_input(0)};
      d.fwd_flops = 4.0 * out_elems;
      d.bwd_flops = 4.0 * out_elems;
      break;
    case OpKind::leaky_relu:  // leaky_relu_backward(grad, self, negative_slope, false)
    case OpKind::elu:         // elu_backward(grad, alpha, scale, input_scale, false, self)
    case OpKind::softplus:    // softplus_backward(grad, self, beta, threshold)
    case OpKind::mish:        // mish_backward(grad, self)
      // derivatives.yaml: each keeps its input (not in place, as nn's are by default).
      d.saved = {keep_input(0)};
      d.fwd_flops = (n.op == OpKind::leaky_relu ? 2.0 : 4.0) * out_elems;
      d.bwd_flops = (n.op == OpKind::leaky_relu ? 2.0 : 4.0) * out_elems;
      break;
    case OpKind::relu:
    case OpKind::tanh:
    case OpKind::sigmoid:
      d.saved = {keep_output()};  // the derivative is a function of the output
      d.fwd_flops = 4.0 * out_elems;
      d.bwd_flops = 2.0 * out_elems;
      break;
    case OpKind::add:
    case OpKind::causal_mask:  // an add of a constant: keeps nothing (derivatives.yaml: add)
    case OpKind::alibi:
    case OpKind::window_mask:
      d.fwd_flops = static_cast<double>(out_elems);
      break;
    case OpKind::window_position_bias:
      declare_window_position_bias(m, n, d);
      break;
    case OpKind::rope:  // products by constant tables: only the tables, shared by the batch, kept
      d.fwd_flops = 3.0 * static_cast<double>(out_elems);
      d.bwd_flops = 3.0 * static_cast<double>(out_elems);
      break;
    // Written-out elementwise math (--fusion eager). What each keeps is what
    // PyTorch 1.13's autograd keeps (derivatives.yaml), checked with a
    // saved_tensors_hooks pack hook (tests/tools/eager_saved.py):
    case OpKind::affine:  // x * c keeps only the 0-dim c, x + c nothing
      d.fwd_flops = static_cast<double>(out_elems);
      d.bwd_flops = static_cast<double>(out_elems);
      break;
    case OpKind::pow:  // pow_backward(grad, self, exponent)
      d.saved = {keep_input(0)};
      d.fwd_flops = 2.0 * out_elems;
      d.bwd_flops = 3.0 * out_elems;
      break;
    case OpKind::acos:  // derivatives.yaml: grad * -((-self * self + 1).rsqrt())
    case OpKind::erf:  // 2 / sqrt(pi) exp(-self^2) grad
      d.saved = {keep_input(0)};
      d.fwd_flops = static_cast<double>(out_elems);
      d.bwd_flops = 3.0 * out_elems;
      break;
    case OpKind::sqrt:        // grad / (2 result)
    case OpKind::reciprocal:  // -grad result^2
      d.saved = {keep_output()};
      d.fwd_flops = static_cast<double>(out_elems);
      d.bwd_flops = 2.0 * out_elems;
      break;
    case OpKind::reduce_l2:
      // derivatives.yaml: norm_backward(grad, self, p, result, dim, keepdim)
      // keeps the input and the norm: dx = dy x / y (0 where y is 0).
      d.saved = {keep_input(0), keep_output()};
      d.fwd_flops = 2.0 * numel(in_shape(0));
      d.bwd_flops = 3.0 * numel(in_shape(0));
      break;
    case OpKind::reduce_sum:  // keeps nothing (derivatives.yaml: sum_backward needs only the sizes)
      d.fwd_flops = static_cast<double>(numel(in_shape(0)));
      d.bwd_flops = static_cast<double>(numel(in_shape(0)));
      break;
    case OpKind::reduce_mean:
      // The backward needs only the input's size, yet PyTorch 1.13's mean.dim
      // keeps the input itself (the pack hook sees it): the RMSNorm's x^2.
      d.saved = {keep_input(0)};
      d.fwd_flops = static_cast<double>(numel(in_shape(0)));
      d.bwd_flops = static_cast<double>(numel(in_shape(0)));
      break;
    case OpKind::concat:
      // Keeps nothing (derivatives.yaml: cat's gradient is split by the input sizes);
      // one copy of each element each way.
      d.fwd_flops = static_cast<double>(out_elems);
      d.bwd_flops = static_cast<double>(out_elems);
      break;
    case OpKind::scale: {
      // y = x gamma: PyTorch's mul keeps x for gamma's gradient (gamma, a
      // parameter, is not an activation). No weight decay: a per-channel
      // gain, as norm weights and biases are.
      const Shape gamma = n.attrs.ints("shape");
      d.params = {{"weight", numel(gamma), false, gamma}};
      d.saved = {keep_input(0)};
      d.fwd_flops = static_cast<double>(out_elems);
      d.bwd_flops = 2.0 * out_elems;
      break;
    }
    case OpKind::shift: {
      // y = x + b: add keeps nothing (derivatives.yaml: self and other get the
      // gradient, b's summed over the elements it was broadcast to). No weight
      // decay: a bias, as norm biases are.
      const Shape beta = n.attrs.ints("shape");
      d.params = {{"bias", numel(beta), false, beta}};
      d.fwd_flops = static_cast<double>(out_elems);
      d.bwd_flops = static_cast<double>(out_elems);
      break;
    }
    case OpKind::prelu: {
      // derivatives.yaml: _prelu_kernel_backward(grad, self, weight) keeps the
      // input (the weight is a parameter). No weight decay, as scale's gamma.
      const Shape slope = n.attrs.ints("shape");
      d.params = {{"weight", numel(slope), false, slope}};
      d.saved = {keep_input(0)};
      d.fwd_flops = 2.0 * out_elems;
      d.bwd_flops = 4.0 * out_elems;
      break;
    }
    case OpKind::pad:  // keeps nothing (derivatives.yaml: constant_pad_nd_backward needs only the pads)
      d.fwd_flops = static_cast<double>(out_elems);
      d.bwd_flops = static_cast<double>(numel(in_shape(0)));
      break;
    case OpKind::slice:  // keeps nothing (derivatives.yaml: slice_backward needs only the sizes)
    case OpKind::transpose:
      // Keeps nothing (derivatives.yaml: permute's gradient is the inverse
      // permute); the output is a contiguous copy, one move per element.
      d.fwd_flops = static_cast<double>(out_elems);
      d.bwd_flops = static_cast<double>(out_elems);
      break;
    case OpKind::mul:
      d.saved = {keep_input(0), keep_input(1)};
      d.fwd_flops = static_cast<double>(out_elems);
      d.bwd_flops = 2.0 * out_elems;
      break;
    case OpKind::matmul:  // derivatives.yaml: mm keeps self and mat2 (each for the other's gradient)
      d.saved = {keep_input(0), keep_input(1)};
      d.fwd_flops = 2.0 * static_cast<double>(out_elems) * static_cast<double>(in_shape(0).back());
      d.bwd_flops = 2 * d.fwd_flops;
      break;
    case OpKind::softmax:  // _softmax_backward_data(grad, result): the output
      d.saved = {keep_output()};
      d.fwd_flops = 5.0 * out_elems;
      d.bwd_flops = 4.0 * out_elems;
      break;
    case OpKind::relative_position_bias:
      declare_relative_position_bias(m, n, d);
      break;
    case OpKind::attention:
      declare_attention(m, n, opt, d);
      break;
    case OpKind::moe_router:
      declare_moe_router(m, n, d);
      break;
    case OpKind::moe_expert:
      declare_moe_expert(m, n, d);
      break;
    case OpKind::moe_combine:
      declare_moe_combine(m, n, d);
      break;
    case OpKind::maxpool2d: {
      const ConvWindow w = conv_window(in_shape(0), n.attrs);
      const std::array<int64_t, 2> k = {w.kh, w.kw};
      if (n.attrs.has("eager") && n.attrs.flag("eager"))
        d.saved = {keep_input(0), keep_own("argmax", out_elems, Elem::i64)};
      else
        d.saved = {keep_own("argmax", out_elems, Elem::i32)};
      d.fwd_flops = static_cast<double>(out_elems) * k[0] * k[1];
      d.bwd_flops = static_cast<double>(out_elems);
      break;
    }
    case OpKind::avgpool2d: {
      const ConvWindow w = conv_window(in_shape(0), n.attrs);
      const std::array<int64_t, 2> k = {w.kh, w.kw};
      if (n.attrs.has("eager") && n.attrs.flag("eager")) d.saved = {keep_input(0)};
      d.fwd_flops = static_cast<double>(out_elems) * k[0] * k[1];
      d.bwd_flops = d.fwd_flops;
      break;
    }
    case OpKind::global_avgpool:
      // PyTorch 1.13 runs adaptive_avg_pool2d(x, 1) and x.mean([2, 3]) as
      // mean.dim, which keeps its input (measured with the pack hook, as
      // reduce_mean's): free where the op before keeps the same tensor
      // (ReLU keeps its output), a tensor of its own after SiLU or PReLU.
      d.saved = {keep_input(0)};
      d.fwd_flops = static_cast<double>(numel(in_shape(0)));
      d.bwd_flops = d.fwd_flops;
      break;
    case OpKind::flatten:
    case OpKind::reshape:  // keeps nothing: view's gradient is the reshaped gradient
    case OpKind::tokens:
    case OpKind::select:
      break;
    case OpKind::opaque:
      // Unknown math: every input kept for backward (the most any derivative
      // formula could need), and one FLOP an output element in each
      // direction, a nominal cost the notes of the import name.
      if (!n.attrs.has("keep_inputs") || n.attrs.flag("keep_inputs"))
        for (int k = 0; k < static_cast<int>(n.inputs.size()); ++k) d.saved.push_back(keep_input(k));
      d.fwd_flops = static_cast<double>(out_elems);
      d.bwd_flops = static_cast<double>(out_elems);
      break;
    case OpKind::drop_path:  // the sample's factor, 0 or 1 / (1 - p)
      if (n.attrs.number("p") > 0) d.saved = {keep_own("mask", 1, Elem::f32)};
      d.fwd_flops = static_cast<double>(out_elems);
      d.bwd_flops = static_cast<double>(out_elems);
      break;
    case OpKind::dropout:
      if (n.attrs.number("p") > 0) d.saved = {keep_own("mask", out_elems, Elem::u8)};
      d.fwd_flops = 2.0 * out_elems;
      d.bwd_flops = 1.0 * out_elems;
      break;
    case OpKind::cross_entropy: {
      const Shape& logits = in_shape(0);
      if (n.attrs.flag("fused")) {
        // Fused (flash-attn's CrossEntropyLoss, llm-foundry's default loss_fn):
        // keeps the logits themselves and one fp32 log-sum-exp per row, and
        // recomputes softmax = exp(z - lse) in backward; no probabilities.
        d.saved = {keep_input(0), keep_own("lse", rows(logits), Elem::f32), keep_input(1)};
        d.fwd_flops = 4.0 * numel(logits);  // max, exp, sum
        d.bwd_flops = 3.0 * numel(logits);  // exp(z - lse), minus onehot, scale
        break;
      }
      // The softmax probabilities in fp32 (its gradient is probs - onehot), and
      // the targets, which are part of the batch.
      d.saved = {keep_own("probs", numel(logits), Elem::f32), keep_input(1)};
      d.fwd_flops = 5.0 * numel(logits);
      d.bwd_flops = 2.0 * numel(logits);
      break;
    }
  }
  declare_lora(m, n, d);
  // `shares`: the node applies an earlier node's parameters (ALBERT's one
  // layer at every depth); they are that node's, counted and updated once.
  if (n.attrs.has("shares")) d.params.clear();
  // Computed once per step (TensorInfo::batched): what it keeps and its
  // temporaries are one tensor for the micro-batch, not one per sample.
  if (!out.batched) {
    for (auto& s : d.saved)
      if (s.ref == Ref::own) s.per_batch = true;  // (an input or the output counts as its tensor does)
    for (auto* temps : {&d.fwd_temps, &d.bwd_temps})
      for (auto& t : *temps) t.per_batch = true;
  }
  return d;
}

std::vector<LoraAdapter> lora_adapters(const Model& m, const Node& n) {
  std::vector<LoraAdapter> out;
  if (!n.attrs.has("lora_rank")) return out;
  const int64_t r = n.attrs.integer("lora_rank");
  const double s = n.attrs.has("lora_scale") ? n.attrs.number("lora_scale") : 1.0;
  if (n.op == OpKind::linear) {
    const Shape& x = m.tensor(n.inputs[0]).shape;
    out.push_back({"", x.back(), n.attrs.integer("out"), rows(x), r, false, s});
  } else if (n.op == OpKind::attention) {
    const AttentionShape a = attention_shape(m, n);
    const std::string targets = n.attrs.text("lora_targets");  // "q,v": in q, k, v, o order
    auto has = [&](char c) { return targets.find(c) != std::string::npos; };
    if (has('q')) out.push_back({"q.", a.D, a.H * a.hd, a.T, r, false, s});
    if (has('k')) out.push_back({"k.", a.Dm, a.KV * a.hd, a.Tk, r, false, s});
    if (has('v')) out.push_back({"v.", a.Dm, a.KV * a.hd, a.Tk, r, false, s});
    if (has('o')) out.push_back({"o.", a.H * a.hd, a.D, a.T, r, true, s});
  }
  return out;
}

bool needs_backward(const GradNeeds& g, const OpDecl& d) {
  bool adapters = false;
  for (const auto& p : d.params) adapters |= p.adapter;
  for (bool in : g.inputs)
    if (in) return true;
  return g.base || adapters;
}

void restrict_to_needs(const Model& m, const Node& n, const GradNeeds& g, OpDecl& d) {
  if (!needs_backward(g, d)) {
    // No backward: nothing kept. The op still makes its own tensors (the
    // step program then counts them as temporaries, as in a checkpointed
    // unit's no-grad forward), so only the references go.
    d.saved.erase(std::remove_if(d.saved.begin(), d.saved.end(), [](const SavedTensor& s) { return s.ref != Ref::own; }),
                  d.saved.end());
    d.bwd_temps.clear();
    d.bwd_flops = 0;
    return;
  }
  const std::vector<LoraAdapter> lora = lora_adapters(m, n);
  auto input_grad = [&](size_t k) { return k < g.inputs.size() && g.inputs[k]; };
  auto drop = [&](auto pred) { d.saved.erase(std::remove_if(d.saved.begin(), d.saved.end(), pred), d.saved.end()); };
  auto is_input = [](int k) { return [k](const SavedTensor& s) { return s.ref == Ref::input && s.input == k; }; };
  // The adapters' own GEMMs (declare_lora): forward 2 r (in + out) per row;
  // backward dB and d(xA) 2 r out each, dA 2 r in, and dX 2 r in only when
  // the input needs its gradient.
  double lora_bwd = 0, lora_bwd_dx = 0;
  for (const auto& a : lora) {
    lora_bwd += 2.0 * a.rows * a.rank * (2 * a.out + a.in);
    lora_bwd_dx += 2.0 * a.rows * a.rank * a.in;
  }
  const double base_bwd = d.bwd_flops - lora_bwd - lora_bwd_dx;  // as declared: every gradient
  switch (n.op) {
    case OpKind::lstm:
    case OpKind::gru:
    case OpKind::rnn: {
      // A frozen LSTM, GRU or RNN keeps no input (dx = dgates W_ih needs only
      // W_ih), as addmm keeps mat1 only for the weight's gradient; the gates,
      // states and the recurrence dh_{t-1} = dgates W_hh are needed either way.
      const Shape& x = m.tensor(n.inputs[0]).shape;
      const int64_t T = x[0], in = x[1], H = n.attrs.integer("hidden"), G = recurrent_gates(n.op) * H;
      const double dirs = n.attrs.flag("bidirectional") ? 2 : 1;
      if (!g.base) drop(is_input(0));
      const double ih = 2.0 * T * G * in, hh = 2.0 * T * G * H;
      d.bwd_flops = dirs * (hh + 16.0 * T * H + (input_grad(0) ? ih : 0) + (g.base ? ih + hh : 0));
      break;
    }
    case OpKind::linear:
    case OpKind::conv2d:
    case OpKind::conv_transpose2d: {
      // dX = dY W and dW = dY^T X: one forward GEMM's FLOPs each.
      if (!g.base && lora.empty()) drop(is_input(0));
      d.bwd_flops = base_bwd / 2 * ((input_grad(0) ? 1 : 0) + (g.base ? 1 : 0)) + lora_bwd +
                    (input_grad(0) ? lora_bwd_dx : 0);
      break;
    }
    case OpKind::embedding:
    case OpKind::scale:  // x serves gamma's gradient only
      if (!g.base) drop(is_input(0));
      break;
    case OpKind::mul:
    case OpKind::matmul:
      if (!input_grad(1)) drop(is_input(0));
      if (!input_grad(0)) drop(is_input(1));
      break;
    case OpKind::attention: {
      const AttentionShape a = attention_shape(m, n);
      bool lora_x = false, lora_o = false;
      for (const auto& ad : lora) (ad.reads_context ? lora_o : lora_x) = true;
      if (!g.base && !lora_x) drop(is_input(0));
      if (a.cross && !g.base && !lora_x) drop(is_input(1));  // the memory serves dW_k and dW_v alone
      // The context feeds dW_o, and in the flash form the core's backward too
      // (D_i = dO_i . O_i): the math form with W_o frozen drops it.
      if (!g.base && !lora_o && !keeps_log_sum_exp(d)) {  // still made in forward: a temporary there
        d.saved.erase(std::remove_if(d.saved.begin(), d.saved.end(),
                                     [](const SavedTensor& s) { return s.ref == Ref::own && s.what == "context"; }),
                      d.saved.end());
        d.fwd_temps.push_back({"context", a.T * a.H * a.hd, Elem::compute});
      }
      // Projections: 2x their forward FLOPs when every gradient is computed;
      // the core's backward runs whenever any does.
      const bool any_input = input_grad(0) || (a.cross && input_grad(1));
      d.bwd_flops = base_bwd - attention_projection_flops(a) * ((any_input ? 0 : 1) + (g.base ? 0 : 1)) + lora_bwd +
                    (any_input ? lora_bwd_dx : 0);
      break;
    }
    default: break;
  }
}

}  // namespace dlplan
