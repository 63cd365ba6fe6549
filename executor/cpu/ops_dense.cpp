// Dense and shape ops: embedding, pos_embedding, cls_token, linear, select,
// tokens, flatten.
#include "cpu/ops.hpp"

#include "dlplan/ops.hpp"

#include <fmt/format.h>

#include <cstring>

namespace dlplan::exec::cpu {

// ---- embedding ---------------------------------------------------------------
// ids: [b, *] i32; weight: [num, dim]; out: [b, *, dim] = scale weight[ids]
// (scale 1 but for Gemma's sqrt(hidden_size) normalizer).

void embedding_forward(OpContext& c) {
  const int64_t num = c.node->attrs.integer("num"), dim = c.node->attrs.integer("dim");
  const int64_t n = c.batch * numel(in_shape(c, 0));
  const int32_t* ids = c.in[0].i();
  const float* w = c.params[0].f();
  float* y = c.out.f();
  const auto scale = static_cast<float>(c.node->attrs.number("scale"));
  for (int64_t r = 0; r < n; ++r) {
    if (ids[r] < 0 || ids[r] >= num) op_error(c, fmt::format("token id {} is outside [0, {})", ids[r], num));
    std::memcpy(y + r * dim, w + int64_t{ids[r]} * dim, static_cast<size_t>(dim) * sizeof(float));
    if (scale != 1.0f)
      for (int64_t j = 0; j < dim; ++j) y[r * dim + j] *= scale;
  }
}

// dweight[ids[r]] += scale dout[r] (scatter-add; the ids get no gradient),
// but for the padding_idx row, which nn.Embedding leaves untouched.
void embedding_backward(OpContext& c) {
  const int64_t dim = c.node->attrs.integer("dim");
  const int64_t n = c.batch * numel(in_shape(c, 0));
  float* dw = grad_or_null(c.dparams[0]);
  if (!dw) return;  // frozen: the ids get no gradient either
  const int32_t* ids = c.in[0].i();
  const float* dy = c.dout.f();
  const auto scale = static_cast<float>(c.node->attrs.number("scale"));
  const int64_t pad = c.node->attrs.has("padding_idx") ? c.node->attrs.integer("padding_idx") : -1;
  for (int64_t r = 0; r < n; ++r) {
    if (ids[r] == pad) continue;
    float* row = dw + int64_t{ids[r]} * dim;
    for (int64_t j = 0; j < dim; ++j) row[j] += scale * dy[r * dim + j];
  }
}

// ---- pos_embedding -------------------------------------------------------------
// x: [b, T, D]; table: [max_len, D]; out = x + table[offset..offset+T)
// (offset absent: 0), or with `row` r, out[t] = x[t] + table[r] for every t;
// with `sinusoidal`, the table is fixed (no parameter) and computed.

namespace {
// The table row position t reads, as an offset into the table.
struct PosRows {
  int64_t row = -1, offset = 0, dim = 0;
  explicit PosRows(const OpContext& c) : dim(in_shape(c, 0).back()) {
    if (c.node->attrs.has("row")) row = c.node->attrs.integer("row");
    if (c.node->attrs.has("offset")) offset = c.node->attrs.integer("offset");
  }
  int64_t at(int64_t t) const { return (row < 0 ? offset + t : row) * dim; }
};
}  // namespace

// Fixed sinusoidal positions (the `sinusoidal` attribute): rows offset ..
// offset + T of the table ops.hpp's sinusoidal_position defines, computed in
// double and rounded to float, as PyTorch's fp32 buffer holds them.
std::vector<float> sinusoidal_table(const OpContext& c) {
  const Shape& s = in_shape(c, 0);
  const int64_t T = s[0], D = s[1];
  const int64_t offset = c.node->attrs.has("offset") ? c.node->attrs.integer("offset") : 0;
  const bool interleaved = c.node->attrs.text("sinusoidal") == "interleaved";
  const double step = c.node->attrs.number("frequency_step");
  std::vector<float> table(static_cast<size_t>(T * D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D; ++i)
      table[static_cast<size_t>(t * D + i)] = static_cast<float>(sinusoidal_position(interleaved, step, offset + t, i, D));
  return table;
}

void pos_embedding_forward(OpContext& c) {
  const int64_t td = numel(in_shape(c, 0));
  const float* x = c.in[0].f();
  float* y = c.out.f();
  if (c.node->attrs.has("sinusoidal")) {
    const std::vector<float> table = sinusoidal_table(c);
    for (int64_t s = 0; s < c.batch; ++s)
      for (int64_t i = 0; i < td; ++i) y[s * td + i] = x[s * td + i] + table[static_cast<size_t>(i)];
    return;
  }
  const PosRows rows(c);
  const float* w = c.params[0].f();
  for (int64_t s = 0; s < c.batch; ++s)
    for (int64_t i = 0; i < td; ++i) y[s * td + i] = x[s * td + i] + w[rows.at(i / rows.dim) + i % rows.dim];
}

void pos_embedding_backward(OpContext& c) {
  const int64_t td = numel(in_shape(c, 0));
  const PosRows rows(c);
  const float* dy = c.dout.f();
  if (float* dw = c.dparams.empty() ? nullptr : grad_or_null(c.dparams[0]))
    for (int64_t s = 0; s < c.batch; ++s)
      for (int64_t i = 0; i < td; ++i) dw[rows.at(i / rows.dim) + i % rows.dim] += dy[s * td + i];
  if (c.din[0].defined()) {
    float* dx = c.din[0].f();
    for (int64_t i = 0; i < c.batch * td; ++i) dx[i] += dy[i];
  }
}

// ---- cls_token -----------------------------------------------------------------
// x: [b, T, D]; weight: [D]; out: [b, T+1, D], row 0 the class token.

void cls_token_forward(OpContext& c) {
  const int64_t T = in_shape(c, 0)[0], D = in_shape(c, 0)[1];
  const float* x = c.in[0].f();
  const float* w = c.params[0].f();
  float* y = c.out.f();
  for (int64_t s = 0; s < c.batch; ++s) {
    float* ys = y + s * (T + 1) * D;
    std::memcpy(ys, w, static_cast<size_t>(D) * sizeof(float));
    std::memcpy(ys + D, x + s * T * D, static_cast<size_t>(T * D) * sizeof(float));
  }
}

void cls_token_backward(OpContext& c) {
  const int64_t T = in_shape(c, 0)[0], D = in_shape(c, 0)[1];
  const float* dy = c.dout.f();
  float* dw = grad_or_null(c.dparams[0]);
  for (int64_t s = 0; s < c.batch; ++s) {
    const float* dys = dy + s * (T + 1) * D;
    if (dw)
      for (int64_t j = 0; j < D; ++j) dw[j] += dys[j];
    if (c.din[0].defined()) {
      float* dx = c.din[0].f() + s * T * D;
      for (int64_t i = 0; i < T * D; ++i) dx[i] += dys[D + i];
    }
  }
}

// ---- parameter: y = W, once per step (y [1, ...shape]); dW += dy ---------------------
void parameter_forward(OpContext& c) {
  std::memcpy(c.out.f(), c.params[0].f(), static_cast<size_t>(c.out.numel()) * sizeof(float));
}

void parameter_backward(OpContext& c) {
  float* dw = grad_or_null(c.dparams[0]);
  if (!dw) return;
  const float* dy = c.dout.f();
  for (int64_t i = 0, n = c.dout.numel(); i < n; ++i) dw[i] += dy[i];
}

// ---- linear --------------------------------------------------------------------
// x: [R, in] (R = b x leading dims); weight W: [out, in] (tied: the embedding's
// [num, dim], passed as params[0] all the same); bias: [out].
// y = x W^T + bias.

namespace {
// The input's factor (attribute scale, absent 1): folded into the GEMMs' alpha.
float input_scale(const OpContext& c) {
  return c.node->attrs.has("scale") ? static_cast<float>(c.node->attrs.number("scale")) : 1.0f;
}
}  // namespace

void linear_forward(OpContext& c) {
  const int64_t in = in_shape(c, 0).back(), o = out_shape(c).back();
  const int64_t R = c.batch * numel(in_shape(c, 0)) / in;
  float* y = c.out.f();
  const bool bias = c.node->attrs.flag("bias");
  const float s = input_scale(c);
  if (bias) {
    const float* bv = c.params[1].f();
    for (int64_t r = 0; r < R; ++r) std::memcpy(y + r * o, bv, static_cast<size_t>(o) * sizeof(float));
  }
  gemm(false, true, R, o, in, s, c.in[0].f(), in, c.params[0].f(), in, bias ? 1.0f : 0.0f, y, o);
  // LoRA (ops_lora.cpp): its A and B are the node's last two parameters.
  for (const LoraAdapter& a : lora_adapters(*c.model, *c.node)) {
    const size_t n = c.params.size();
    Tensor xa = alloc_saved(c, {R, a.rank}, compute(c), "lora_xa");
    Fp32Buffer xb(xa);
    // x A^T is kept unscaled; the input's factor joins the adapter's.
    lora_forward(c.in[0].f(), c.params[n - 2].f(), c.params[n - 1].f(), static_cast<float>(a.scale) * s, xb.data(), y,
                 R, in, o, a.rank);
    xb.store();
    c.saved.push_back(xa);
  }
}

// dx += s dy W;  dW += s dy^T x;  dbias += sum_r dy (s: the input's factor).
void linear_backward(OpContext& c) {
  const int64_t in = in_shape(c, 0).back(), o = out_shape(c).back();
  const int64_t R = c.batch * numel(in_shape(c, 0)) / in;
  const float* dy = c.dout.f();
  const float s = input_scale(c);
  if (c.din[0].defined()) gemm(false, false, R, in, o, s, dy, o, c.params[0].f(), in, 1.0f, c.din[0].f(), in);
  // A frozen weight: no dW, and the input (not kept) is not read.
  if (float* dw = grad_or_null(c.dparams[0])) gemm(true, false, o, in, R, s, dy, o, c.in[0].f(), in, 1.0f, dw, in);
  if (c.node->attrs.flag("bias") && c.dparams[1].defined()) {
    float* db = c.dparams[1].f();
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < o; ++j) db[j] += dy[r * o + j];
  }
  for (const LoraAdapter& a : lora_adapters(*c.model, *c.node)) {
    const size_t n = c.params.size();
    Tensor dxa = alloc_temp(c, {R, a.rank}, "lora_dxa");
    Fp32Buffer dxb(dxa);
    lora_backward(c.in[0].f(), c.params[n - 2].f(), c.params[n - 1].f(), static_cast<float>(a.scale) * s,
                  saved_named(c, "lora_xa").f(), dy, dxb.data(), grad_or_null(c.dparams[n - 2]),
                  grad_or_null(c.dparams[n - 1]), grad_or_null(c.din[0]), R, in, o, a.rank);
  }
}

// ---- select --------------------------------------------------------------------
// x: [b, T, D] -> out: [b, D] = x[:, index].

void select_forward(OpContext& c) {
  const int64_t T = in_shape(c, 0)[0], D = in_shape(c, 0)[1], idx = c.node->attrs.integer("index");
  for (int64_t s = 0; s < c.batch; ++s)
    std::memcpy(c.out.f() + s * D, c.in[0].f() + (s * T + idx) * D, static_cast<size_t>(D) * sizeof(float));
}

void select_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const int64_t T = in_shape(c, 0)[0], D = in_shape(c, 0)[1], idx = c.node->attrs.integer("index");
  for (int64_t s = 0; s < c.batch; ++s) {
    float* dx = c.din[0].f() + (s * T + idx) * D;
    const float* dy = c.dout.f() + s * D;
    for (int64_t j = 0; j < D; ++j) dx[j] += dy[j];
  }
}

// ---- tokens --------------------------------------------------------------------
// x: [b, C, H, W] -> out: [b, H*W, C] (ViT's patch tokens: flatten(2).transpose(1, 2)).

void tokens_forward(OpContext& c) {
  const int64_t C = in_shape(c, 0)[0], P = in_shape(c, 0)[1] * in_shape(c, 0)[2];
  for (int64_t s = 0; s < c.batch; ++s) {
    const float* x = c.in[0].f() + s * C * P;
    float* y = c.out.f() + s * C * P;
    for (int64_t ch = 0; ch < C; ++ch)
      for (int64_t p = 0; p < P; ++p) y[p * C + ch] = x[ch * P + p];
  }
}

void tokens_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const int64_t C = in_shape(c, 0)[0], P = in_shape(c, 0)[1] * in_shape(c, 0)[2];
  for (int64_t s = 0; s < c.batch; ++s) {
    float* dx = c.din[0].f() + s * C * P;
    const float* dy = c.dout.f() + s * C * P;
    for (int64_t ch = 0; ch < C; ++ch)
      for (int64_t p = 0; p < P; ++p) dx[ch * P + p] += dy[p * C + ch];
  }
}

// ---- flatten, reshape -------------------------------------------------------------
// Same memory, new shape: a copy forward, an add backward.

void flatten_forward(OpContext& c) {
  std::memcpy(c.out.f(), c.in[0].f(), static_cast<size_t>(c.batch * numel(in_shape(c, 0))) * sizeof(float));
}

void flatten_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const int64_t n = c.batch * numel(in_shape(c, 0));
  float* dx = c.din[0].f();
  const float* dy = c.dout.f();
  for (int64_t i = 0; i < n; ++i) dx[i] += dy[i];
}

}  // namespace dlplan::exec::cpu
