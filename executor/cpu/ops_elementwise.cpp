// Elementwise ops: gelu (exact and tanh), relu, silu, tanh, sigmoid, add, mul,
// dropout. All work on the flat [b x per-sample numel] buffer.
#include "cpu/ops.hpp"

#include <cmath>
#include <cstring>

namespace dlplan::exec::cpu {
namespace {

int64_t total(const OpContext& c) { return c.batch * numel(in_shape(c, 0)); }

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kGeluC = 0.044715f;

}  // namespace

// ---- gelu ----------------------------------------------------------------------
// exact:  y = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2));  y' = Phi(x) + x phi(x).
// tanh (GPT-2): y = 0.5 x (1 + tanh u), u = sqrt(2/pi) (x + 0.044715 x^3);
//   y' = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 0.044715 x^2).
// (Hendrycks & Gimpel 2016.) Saves its input.

void gelu_forward(OpContext& c) {
  const bool approx = c.node->attrs.text("approximate") == "tanh";
  const float* x = c.in[0].f();
  float* y = c.out.f();
  const int64_t n = total(c);
  if (approx) {
    for (int64_t i = 0; i < n; ++i) {
      const float u = kSqrt2OverPi * (x[i] + kGeluC * x[i] * x[i] * x[i]);
      y[i] = 0.5f * x[i] * (1.0f + std::tanh(u));
    }
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kInvSqrt2));
  }
}

void gelu_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const bool approx = c.node->attrs.text("approximate") == "tanh";
  const float* x = c.in[0].f();
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  const int64_t n = total(c);
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    float d;
    if (approx) {
      const float t = std::tanh(kSqrt2OverPi * (v + kGeluC * v * v * v));
      d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluC * v * v);
    } else {
      d = 0.5f * (1.0f + std::erf(v * kInvSqrt2)) + v * kInvSqrt2Pi * std::exp(-0.5f * v * v);
    }
    dx[i] += dy[i] * d;
  }
}

// ---- relu, tanh, sigmoid: the derivative from the saved output ------------------

void relu_forward(OpContext& c) {
  const float* x = c.in[0].f();
  float* y = c.out.f();
  for (int64_t i = 0, n = total(c); i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void relu_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const float* y = c.out.f();
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  for (int64_t i = 0, n = total(c); i < n; ++i)
    if (y[i] > 0.0f) dx[i] += dy[i];
}

void tanh_forward(OpContext& c) {
  const float* x = c.in[0].f();
  float* y = c.out.f();
  for (int64_t i = 0, n = total(c); i < n; ++i) y[i] = std::tanh(x[i]);
}

// tanh' = 1 - y^2.
void tanh_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const float* y = c.out.f();
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  for (int64_t i = 0, n = total(c); i < n; ++i) dx[i] += dy[i] * (1.0f - y[i] * y[i]);
}

void sigmoid_forward(OpContext& c) {
  const float* x = c.in[0].f();
  float* y = c.out.f();
  for (int64_t i = 0, n = total(c); i < n; ++i) y[i] = 1.0f / (1.0f + std::exp(-x[i]));
}

// sigmoid' = y (1 - y).
void sigmoid_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const float* y = c.out.f();
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  for (int64_t i = 0, n = total(c); i < n; ++i) dx[i] += dy[i] * y[i] * (1.0f - y[i]);
}

// ---- silu ----------------------------------------------------------------------
// y = x sigmoid(x);  y' = s (1 + x (1 - s)). Saves its input.

void silu_forward(OpContext& c) {
  const float* x = c.in[0].f();
  float* y = c.out.f();
  for (int64_t i = 0, n = total(c); i < n; ++i) y[i] = x[i] / (1.0f + std::exp(-x[i]));
}

void silu_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const float* x = c.in[0].f();
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  for (int64_t i = 0, n = total(c); i < n; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-x[i]));
    dx[i] += dy[i] * s * (1.0f + x[i] * (1.0f - s));
  }
}

// ---- add, mul ------------------------------------------------------------------

void add_forward(OpContext& c) {
  const float* a = c.in[0].f();
  const float* b = c.in[1].f();
  float* y = c.out.f();
  for (int64_t i = 0, n = total(c); i < n; ++i) y[i] = a[i] + b[i];
}

void add_backward(OpContext& c) {
  const float* dy = c.dout.f();
  const int64_t n = total(c);
  for (int k = 0; k < 2; ++k) {
    if (!c.din[static_cast<size_t>(k)].defined()) continue;
    float* dx = c.din[static_cast<size_t>(k)].f();
    for (int64_t i = 0; i < n; ++i) dx[i] += dy[i];
  }
}

void mul_forward(OpContext& c) {
  const float* a = c.in[0].f();
  const float* b = c.in[1].f();
  float* y = c.out.f();
  for (int64_t i = 0, n = total(c); i < n; ++i) y[i] = a[i] * b[i];
}

// da += dy b;  db += dy a (both inputs are saved).
void mul_backward(OpContext& c) {
  const float* dy = c.dout.f();
  const int64_t n = total(c);
  for (int k = 0; k < 2; ++k) {
    if (!c.din[static_cast<size_t>(k)].defined()) continue;
    float* dx = c.din[static_cast<size_t>(k)].f();
    const float* other = c.in[static_cast<size_t>(1 - k)].f();
    for (int64_t i = 0; i < n; ++i) dx[i] += dy[i] * other[i];
  }
}

// ---- dropout -------------------------------------------------------------------
// y = x mask / (1 - p), mask from Philox (philox.cpp: keyed by seed, node index,
// global sample index ctx.first_sample + s, element index within the sample).
// Saves the mask, 1 byte an element (1 = kept), when p > 0; in eval mode the op
// is the identity and the mask (still allocated, as declared) is all ones.

void dropout_forward(OpContext& c) {
  const double p = c.node->attrs.number("p");
  const int64_t per = numel(in_shape(c, 0)), n = c.batch * per;
  const float* x = c.in[0].f();
  float* y = c.out.f();
  if (p <= 0.0) {
    std::memcpy(y, x, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  Tensor mask = alloc_saved_bytes(c, n, "mask");
  uint8_t* m = mask.u8();
  if (!c.training) {
    std::memset(m, 1, static_cast<size_t>(n));
    std::memcpy(y, x, static_cast<size_t>(n) * sizeof(float));
  } else {
    const float pf = static_cast<float>(p), scale = static_cast<float>(1.0 / (1.0 - p));
    for (int64_t s = 0; s < c.batch; ++s)
      for (int64_t e = 0; e < per; ++e) {
        const int64_t i = s * per + e;
        const bool keep = !(dropout_uniform(c.seed, c.node_index, c.first_sample + s, e) < pf);
        m[i] = keep ? 1 : 0;
        y[i] = keep ? x[i] * scale : 0.0f;
      }
  }
  c.saved.push_back(std::move(mask));
}

// dx += dy mask / (1 - p).
void dropout_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const double p = c.node->attrs.number("p");
  const int64_t n = total(c);
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  if (p <= 0.0) {
    for (int64_t i = 0; i < n; ++i) dx[i] += dy[i];
    return;
  }
  const uint8_t* m = c.saved[0].u8();
  const float scale = c.training ? static_cast<float>(1.0 / (1.0 - p)) : 1.0f;
  for (int64_t i = 0; i < n; ++i)
    if (m[i]) dx[i] += dy[i] * scale;
}

}  // namespace dlplan::exec::cpu
