// Elementwise ops: gelu (exact and tanh), relu, silu, tanh, sigmoid, add, mul,
// dropout. All work on the flat [b x per-sample numel] buffer.
#include "cpu/ops.hpp"
#include "cpu/parallel.hpp"
#include "cpu/vec_math.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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
// The tanh form is computed through 0.5 (1 + tanh u) = sigmoid(2u), which has
// no cancellation where tanh u is near -1 and vectorizes (vec_math.hpp):
//   y = x s,  y' = s + x 2 s (1 - s) sqrt(2/pi) (1 + 3 0.044715 x^2),  s = sigmoid(2u)
// (1 - tanh^2 u = 4 s (1 - s)).

namespace {

DLPLAN_SIMD_CLONES void gelu_tanh_forward(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = v * sigmoid(2.0f * kSqrt2OverPi * (v + kGeluC * v * v * v));
  }
}

DLPLAN_SIMD_CLONES void gelu_tanh_backward(const float* x, const float* dy, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float s = sigmoid(2.0f * kSqrt2OverPi * (v + kGeluC * v * v * v));
    dx[i] += dy[i] * (s + v * 2.0f * s * (1.0f - s) * kSqrt2OverPi * (1.0f + 3.0f * kGeluC * v * v));
  }
}

// exact, through erf_fast (vec_math.hpp): y' = Phi(x) + x phi(x), phi(x) =
// e^{-x^2/2} / sqrt(2 pi).
DLPLAN_SIMD_CLONES void gelu_erf_forward(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + erf_fast(x[i] * kInvSqrt2));
}

DLPLAN_SIMD_CLONES void gelu_erf_backward(const float* x, const float* dy, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float d = 0.5f * (1.0f + erf_fast(v * kInvSqrt2)) + v * kInvSqrt2Pi * exp_clamped(-0.5f * v * v);
    dx[i] += dy[i] * d;
  }
}

}  // namespace

void gelu_forward(OpContext& c) {
  const float* x = c.in[0].f();
  float* y = c.out.f();
  const int64_t n = total(c);
  if (c.node->attrs.text("approximate") == "tanh")
    parallel_for(n, grain_elements() / 4, [&](int64_t b, int64_t e) { gelu_tanh_forward(x + b, y + b, e - b); });
  else
    parallel_for(n, grain_elements() / 4, [&](int64_t b, int64_t e) { gelu_erf_forward(x + b, y + b, e - b); });
}

void gelu_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const float* x = c.in[0].f();
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  const int64_t n = total(c);
  if (c.node->attrs.text("approximate") == "tanh")
    return parallel_for(n, grain_elements() / 4,
                        [&](int64_t b, int64_t e) { gelu_tanh_backward(x + b, dy + b, dx + b, e - b); });
  parallel_for(n, grain_elements() / 4, [&](int64_t b, int64_t e) { gelu_erf_backward(x + b, dy + b, dx + b, e - b); });
}

// ---- relu, tanh, sigmoid: the derivative from the saved output ------------------

void relu_forward(OpContext& c) {
  const float* x = c.in[0].f();
  float* y = c.out.f();
  parallel_for(total(c), grain_elements(), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  });
}

void relu_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const float* y = c.out.f();
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  parallel_for(total(c), grain_elements(), [&](int64_t begin, int64_t end) {
    // A select rather than a branch (half the branches mispredict), so that
    // it vectorizes; adding 0 leaves dx as it was (but for -0 becoming +0).
    // dy[i] is read whatever the condition: a load under a condition is one
    // the compiler may not hoist, and the loop stayed scalar (6 % of
    // ResNet-18's step).
    for (int64_t i = begin; i < end; ++i) {
      const float g = dy[i];
      dx[i] += y[i] > 0.0f ? g : 0.0f;
    }
  });
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

namespace {

DLPLAN_SIMD_CLONES void sigmoid_rows(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = sigmoid(x[i]);  // vec_math.hpp
}

}  // namespace

void sigmoid_forward(OpContext& c) {
  const float* x = c.in[0].f();
  float* y = c.out.f();
  parallel_for(total(c), grain_elements() / 4, [&](int64_t b, int64_t e) { sigmoid_rows(x + b, y + b, e - b); });
}

// sigmoid' = y (1 - y).
void sigmoid_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const float* y = c.out.f();
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  parallel_for(total(c), grain_elements(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dx[i] += dy[i] * y[i] * (1.0f - y[i]);
  });
}

// ---- clip (ReLU6, Hardtanh) ------------------------------------------------------
// y = min(max(x, lo), hi); dy/dx = 0 where x <= lo or x >= hi, else 1
// (PyTorch's hardtanh_backward: 0 at the bounds themselves, 1 for NaN).
// Saves its input, as PyTorch's hardtanh does.

void clip_forward(OpContext& c) {
  const float lo = static_cast<float>(c.node->attrs.number("min")), hi = static_cast<float>(c.node->attrs.number("max"));
  const float* x = c.in[0].f();
  float* y = c.out.f();
  parallel_for(total(c), grain_elements(), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = std::min(std::max(x[i], lo), hi);
  });
}

void clip_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const float lo = static_cast<float>(c.node->attrs.number("min")), hi = static_cast<float>(c.node->attrs.number("max"));
  const float* x = c.in[0].f();
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  parallel_for(total(c), grain_elements(), [&](int64_t begin, int64_t end) {
    // Both comparisons evaluated, joined by a bitwise or: a short-circuit
    // was control flow GCC would not vectorize, and on a ReLU6 after batch
    // norm (MobileNetV2) half its branches mispredicted, 16x the forward's
    // time. The test is "outside", as PyTorch 1.13's hardtanh_backward
    // writes it: a NaN input compares false both ways and passes its
    // gradient (torch.nn.functional.hardtanh and relu6 do so).
    for (int64_t i = begin; i < end; ++i) {
      const float g = dy[i], v = x[i];  // read unconditionally, so that the loop vectorizes (relu_backward)
      const bool outside = (v <= lo) | (v >= hi);
      dx[i] += outside ? 0.0f : g;
    }
  });
}

// ---- hardsigmoid, hardswish (MobileNetV3) -------------------------------------------
// h(x) = min(max(x + 3, 0), 6) / 6;  h'(x) = 1/6 on (-3, 3), else 0.
// hardswish(x) = x h(x);  its derivative, as PyTorch's hardswish_backward:
// 0 for x < -3, x / 3 + 1/2 on [-3, 3], 1 above. Both keep their input.

void hardsigmoid_forward(OpContext& c) {
  const float* x = c.in[0].f();
  float* y = c.out.f();
  parallel_for(total(c), grain_elements(), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = std::min(std::max(x[i] + 3.0f, 0.0f), 6.0f) / 6.0f;
  });
}

void hardsigmoid_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const float* x = c.in[0].f();
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  parallel_for(total(c), grain_elements(), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float g = dy[i] / 6.0f;  // read unconditionally, so that the loop vectorizes (relu_backward)
      dx[i] += (x[i] > -3.0f && x[i] < 3.0f) ? g : 0.0f;
    }
  });
}

void hardswish_forward(OpContext& c) {
  const float* x = c.in[0].f();
  float* y = c.out.f();
  parallel_for(total(c), grain_elements(), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = x[i] * std::min(std::max(x[i] + 3.0f, 0.0f), 6.0f) / 6.0f;
  });
}

void hardswish_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const float* x = c.in[0].f();
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  parallel_for(total(c), grain_elements(), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float g = dy[i];  // read unconditionally, so that the loop vectorizes (relu_backward)
      dx[i] += x[i] < -3.0f ? 0.0f : x[i] <= 3.0f ? g * (x[i] / 3.0f + 0.5f) : g;
    }
  });
}

// ---- silu ----------------------------------------------------------------------
// y = x sigmoid(x);  y' = s (1 + x (1 - s)). Saves its input.

namespace {

DLPLAN_SIMD_CLONES void silu_forward(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid(x[i]);
}

DLPLAN_SIMD_CLONES void silu_backward(const float* x, const float* dy, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float s = sigmoid(x[i]);
    dx[i] += dy[i] * s * (1.0f + x[i] * (1.0f - s));
  }
}

}  // namespace

void silu_forward(OpContext& c) {
  const float* x = c.in[0].f();
  float* y = c.out.f();
  parallel_for(total(c), grain_elements() / 4, [&](int64_t b, int64_t e) { silu_forward(x + b, y + b, e - b); });
}

void silu_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const float* x = c.in[0].f();
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  parallel_for(total(c), grain_elements() / 4, [&](int64_t b, int64_t e) { silu_backward(x + b, dy + b, dx + b, e - b); });
}

// ---- add, mul ------------------------------------------------------------------

namespace {

// Per-sample NumPy broadcasting uses ir.hpp's broadcast_offsets over one
// sample's shapes: an operand with the batch axis advances numel(in) a
// sample; one computed once per step (input_batched false) is read again by
// every sample, its per-sample step 0.

struct BroadcastOperands {
  std::vector<int64_t> a, b;  // broadcast_offsets of each input
  int64_t per_out = 0, per_a = 0, per_b = 0;  // elements a sample advances
};

BroadcastOperands broadcast_operands(const OpContext& c) {
  const Shape &o = out_shape(c), &a = in_shape(c, 0), &b = in_shape(c, 1);
  return {broadcast_offsets(o, a), broadcast_offsets(o, b), numel(o), input_batched(c, 0) ? numel(a) : 0,
          input_batched(c, 1) ? numel(b) : 0};
}

// Both operands per-sample tensors of one shape: the plain elementwise loop.
bool same_shapes(const OpContext& c) {
  return in_shape(c, 0) == in_shape(c, 1) && input_batched(c, 0) && input_batched(c, 1);
}

// y = op(a, b) over every sample and output element, each operand read at
// its broadcast offset (the plain loop when the shapes are equal).
template <class Op>
void broadcast_forward(OpContext& c, Op op) {
  const float* a = c.in[0].f();
  const float* b = c.in[1].f();
  float* y = c.out.f();
  if (same_shapes(c)) {
    parallel_for(total(c), grain_elements(), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) y[i] = op(a[i], b[i]);
    });
    return;
  }
  const BroadcastOperands m = broadcast_operands(c);
  for (int64_t s = 0; s < c.batch; ++s)
    for (int64_t i = 0; i < m.per_out; ++i)
      y[s * m.per_out + i] = op(a[s * m.per_a + m.a[static_cast<size_t>(i)]], b[s * m.per_b + m.b[static_cast<size_t>(i)]]);
}

// For each operand k that needs a gradient: dx_k += dy * factor(other, at),
// where other[at] is the other operand's value at the same output element
// (read only by a factor that needs it: add keeps no input, so `other` may
// be gone by its backward). A broadcast operand sums over the elements it
// was repeated to.
template <class Factor>
void broadcast_backward(OpContext& c, Factor factor) {
  const float* dy = c.dout.f();
  const bool same = same_shapes(c);
  const BroadcastOperands m = same ? BroadcastOperands{} : broadcast_operands(c);
  for (int k = 0; k < 2; ++k) {
    if (!c.din[static_cast<size_t>(k)].defined()) continue;
    float* dx = c.din[static_cast<size_t>(k)].f();
    const Tensor& o = c.in[static_cast<size_t>(1 - k)];
    const float* other = o.defined() ? o.f() : nullptr;
    if (same) {
      parallel_for(total(c), grain_elements(), [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) dx[i] += dy[i] * factor(other, i);
      });
      continue;
    }
    const auto &mine = k == 0 ? m.a : m.b, &theirs = k == 0 ? m.b : m.a;
    const int64_t per_mine = k == 0 ? m.per_a : m.per_b, per_theirs = k == 0 ? m.per_b : m.per_a;
    for (int64_t s = 0; s < c.batch; ++s)
      for (int64_t i = 0; i < m.per_out; ++i)
        dx[s * per_mine + mine[static_cast<size_t>(i)]] +=
            dy[s * m.per_out + i] * factor(other, s * per_theirs + theirs[static_cast<size_t>(i)]);
  }
}

}  // namespace

void add_forward(OpContext& c) {
  broadcast_forward(c, [](float a, float b) { return a + b; });
}

// da += dy; db += dy (nothing saved).
void add_backward(OpContext& c) {
  broadcast_backward(c, [](const float*, int64_t) { return 1.0f; });
}

void mul_forward(OpContext& c) {
  broadcast_forward(c, [](float a, float b) { return a * b; });
}

// da += dy b;  db += dy a (both inputs are saved).
void mul_backward(OpContext& c) {
  broadcast_backward(c, [](const float* other, int64_t at) { return other[at]; });
}

// ---- scale -----------------------------------------------------------------------
// y = x gamma, gamma a parameter of per-sample shape `shape` broadcast to x's
// (ConvNeXt's layer_scale [C, 1, 1]): dx += dy gamma; dgamma += the sum of
// dy x over the samples and the elements gamma was repeated to.

namespace {

// fn(e, k) for every element e of the batch and the element k of the
// learned tensor of per-sample shape `shape` broadcast to it (scale, prelu).
template <typename Fn>
void for_each_broadcast_param(const OpContext& c, Fn fn) {
  const Shape& x_shape = in_shape(c, 0);
  const auto at = broadcast_offsets(x_shape, c.node->attrs.ints("shape"));
  const int64_t per = numel(x_shape);
  for (int64_t s = 0; s < c.batch; ++s)
    for (int64_t i = 0; i < per; ++i) fn(s * per + i, static_cast<size_t>(at[static_cast<size_t>(i)]));
}

}  // namespace

void scale_forward(OpContext& c) {
  const float* x = c.in[0].f();
  const float* g = c.params[0].f();
  const auto off = static_cast<float>(c.node->attrs.number("offset"));
  float* y = c.out.f();
  for_each_broadcast_param(c, [&](int64_t e, size_t k) { y[e] = x[e] * (g[k] + off); });
}

void scale_backward(OpContext& c) {
  const float* dy = c.dout.f();
  const float* g = c.params[0].f();
  float* dx = c.din[0].defined() ? c.din[0].f() : nullptr;
  float* dg = grad_or_null(c.dparams[0]);
  const float* x = dg ? c.in[0].f() : nullptr;  // kept only when gamma trains
  const auto off = static_cast<float>(c.node->attrs.number("offset"));
  for_each_broadcast_param(c, [&](int64_t e, size_t k) {
    if (dx) dx[e] += dy[e] * (g[k] + off);
    if (dg) dg[k] += dy[e] * x[e];
  });
}

// ---- shift: y = x + b, b a parameter broadcast as scale's gamma -----------------------
// dx += dy;  db += the sum of dy over the samples and the elements b was
// repeated to (PyTorch's add: nothing saved).

void shift_forward(OpContext& c) {
  const float* x = c.in[0].f();
  const float* b = c.params[0].f();
  float* y = c.out.f();
  for_each_broadcast_param(c, [&](int64_t e, size_t k) { y[e] = x[e] + b[k]; });
}

void shift_backward(OpContext& c) {
  const float* dy = c.dout.f();
  float* dx = c.din[0].defined() ? c.din[0].f() : nullptr;
  float* db = grad_or_null(c.dparams[0]);
  for_each_broadcast_param(c, [&](int64_t e, size_t k) {
    if (dx) dx[e] += dy[e];
    if (db) db[k] += dy[e];
  });
}

// ---- prelu: y = x for x > 0, else a x, the slope a broadcast as scale's gamma --------
// dx = dy for x > 0, else a dy;  da += dy x where x <= 0 (PyTorch's
// _prelu_kernel_backward).

void prelu_forward(OpContext& c) {
  const float* x = c.in[0].f();
  const float* a = c.params[0].f();
  float* y = c.out.f();
  for_each_broadcast_param(c, [&](int64_t e, size_t k) { y[e] = x[e] > 0.0f ? x[e] : a[k] * x[e]; });
}

void prelu_backward(OpContext& c) {
  const float* x = c.in[0].f();
  const float* dy = c.dout.f();
  const float* a = c.params[0].f();
  float* dx = c.din[0].defined() ? c.din[0].f() : nullptr;
  float* da = grad_or_null(c.dparams[0]);
  for_each_broadcast_param(c, [&](int64_t e, size_t k) {
    if (x[e] > 0.0f) {
      if (dx) dx[e] += dy[e];
      return;
    }
    if (dx) dx[e] += a[k] * dy[e];
    if (da) da[k] += dy[e] * x[e];
  });
}

// ---- concat ----------------------------------------------------------------------
// Per sample, the output along `axis` is the inputs one after another: with
// outer = the product of the dimensions before the axis, each outer row of
// the output is input 0's row, then input 1's, ... (torch.cat). Backward hands
// each input its part of the gradient; nothing is saved.

namespace {

template <typename Fn>  // fn(k, out_offset, in_offset, count): one contiguous run of input k
void for_each_concat_run(const OpContext& c, Fn fn) {
  const int64_t axis = c.node->attrs.integer("axis");
  const Shape& out = out_shape(c);
  int64_t outer = c.batch;
  for (int64_t d = 0; d < axis; ++d) outer *= out[static_cast<size_t>(d)];
  const int64_t out_row = numel(out) * c.batch / outer;
  int64_t at = 0;  // where input k's run starts within an output row
  for (size_t k = 0; k < c.in.size(); ++k) {
    const int64_t run = numel(in_shape(c, static_cast<int>(k))) * c.batch / outer;
    for (int64_t r = 0; r < outer; ++r) fn(k, r * out_row + at, r * run, run);
    at += run;
  }
}

}  // namespace

void concat_forward(OpContext& c) {
  float* y = c.out.f();
  for_each_concat_run(c, [&](size_t k, int64_t o, int64_t i, int64_t n) {
    std::memcpy(y + o, c.in[k].f() + i, static_cast<size_t>(n) * sizeof(float));
  });
}

void concat_backward(OpContext& c) {
  const float* dy = c.dout.f();
  for_each_concat_run(c, [&](size_t k, int64_t o, int64_t i, int64_t n) {
    if (!c.din[k].defined()) return;
    float* dx = c.din[k].f() + i;
    for (int64_t e = 0; e < n; ++e) dx[e] += dy[o + e];
  });
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
    constexpr int64_t kChunk = 1024;
    const int64_t chunks = (per + kChunk - 1) / kChunk;  // per sample
    parallel_for(c.batch * chunks, grain_elements() / 8 / kChunk + 1, [&](int64_t begin, int64_t end) {
      float u[kChunk];
      for (int64_t k = begin; k < end; ++k) {
        const int64_t s = k / chunks, e0 = (k % chunks) * kChunk;
        const int64_t len = std::min(kChunk, per - e0);
        dropout_uniforms(c.seed, c.node_index, c.first_sample + s, e0, len, u);
        for (int64_t j = 0; j < len; ++j) {
          const int64_t i = s * per + e0 + j;
          const bool keep = !(u[j] < pf);
          m[i] = keep ? 1 : 0;
          y[i] = keep ? x[i] * scale : 0.0f;
        }
      }
    });
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

// Stochastic depth: sample s's factor f_s = floor(1 - p + u_s) / (1 - p),
// u_s its own uniform (keyed as dropout's, element 0 of the sample), so a
// whole sample is kept, scaled, or dropped; y = f_s x. The factors are kept
// (one float a sample). Out of training, or at p = 0, y = x.
void drop_path_forward(OpContext& c) {
  const double p = c.node->attrs.number("p");
  const int64_t per = numel(in_shape(c, 0));
  const float* x = c.in[0].f();
  float* y = c.out.f();
  if (p <= 0.0) {
    std::memcpy(y, x, static_cast<size_t>(c.batch * per) * sizeof(float));
    return;
  }
  Tensor factors = alloc_saved(c, Shape{c.batch, 1}, DType::f32, "mask");
  float* f = factors.f();
  const float keep = static_cast<float>(1.0 - p);
  for (int64_t s = 0; s < c.batch; ++s) {
    float u = 0.0f;
    dropout_uniforms(c.seed, c.node_index, c.first_sample + s, 0, 1, &u);
    f[s] = c.training ? std::floor(keep + u) / keep : 1.0f;
  }
  parallel_for(c.batch * per, grain_elements(), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = x[i] * f[i / per];
  });
  c.saved.push_back(std::move(factors));
}

// dx += f_s dy.
void drop_path_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const double p = c.node->attrs.number("p");
  const int64_t per = numel(in_shape(c, 0)), n = total(c);
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  if (p <= 0.0) {
    for (int64_t i = 0; i < n; ++i) dx[i] += dy[i];
    return;
  }
  const float* f = c.saved[0].f();
  for (int64_t i = 0; i < n; ++i) dx[i] += dy[i] * f[i / per];
}

}  // namespace dlplan::exec::cpu
