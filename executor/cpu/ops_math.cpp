// Written-out elementwise math, planned op by op as PyTorch's eager autograd
// runs it (ONNX import with --fusion eager; docs/onnx.md): affine, pow, sqrt,
// reciprocal, erf and the mean over one axis. Backward reads pow's and erf's input and
// sqrt's and reciprocal's output, which their declarations keep (ops_decl.cpp);
// affine and reduce_mean read nothing but sizes (reduce_mean's declaration
// still keeps its input, as PyTorch 1.13's mean does). Then torch.nn's
// LeakyReLU, ELU, Softplus and Mish, whose backward reads the kept input.
#include "cpu/ops.hpp"
#include "cpu/parallel.hpp"

#include <cmath>

namespace dlplan::exec::cpu {
namespace {

int64_t total(const OpContext& c) { return c.batch * numel(in_shape(c, 0)); }

float number(const OpContext& c, const char* key) { return static_cast<float>(c.node->attrs.number(key)); }

// y[i] = f(x[i]) over the whole batch.
template <typename F>
void map_elements(OpContext& c, int64_t grain, F f) {
  const float* x = c.in[0].f();
  float* y = c.out.f();
  parallel_for(total(c), grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = f(x[i]);
  });
}

// dx[i] += dy[i] * slope(i), where the input wants a gradient; slope reads
// what the op kept (its input or its output) at element i.
template <typename F>
void accumulate_input_grad(OpContext& c, int64_t grain, F slope) {
  if (!c.din[0].defined()) return;
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  parallel_for(total(c), grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dx[i] += dy[i] * slope(i);
  });
}

}  // namespace

// affine: y = scale x + shift;  dx = scale dy
void affine_forward(OpContext& c) {
  const float a = number(c, "scale"), b = number(c, "shift");
  map_elements(c, grain_elements(), [=](float x) { return a * x + b; });
}

void affine_backward(OpContext& c) {
  const float a = number(c, "scale");
  accumulate_input_grad(c, grain_elements(), [=](int64_t) { return a; });
}

// pow: y = x^p;  dx = p x^(p-1) dy (PyTorch's pow_backward; 0 where p = 0)
void pow_forward(OpContext& c) {
  const float p = number(c, "exponent");
  map_elements(c, grain_elements() / 4, [=](float x) { return std::pow(x, p); });
}

void pow_backward(OpContext& c) {
  const float p = number(c, "exponent");
  if (p == 0.0f) return;
  const float* x = c.din[0].defined() ? c.in[0].f() : nullptr;
  accumulate_input_grad(c, grain_elements() / 4, [=](int64_t i) { return p * std::pow(x[i], p - 1.0f); });
}

// sqrt: dx = dy / (2 y);  reciprocal: y = 1 / x, dx = -dy y^2 (both from the output)
void sqrt_forward(OpContext& c) { map_elements(c, grain_elements(), [](float x) { return std::sqrt(x); }); }

void sqrt_backward(OpContext& c) {
  const float* y = c.out.f();
  accumulate_input_grad(c, grain_elements(), [=](int64_t i) { return 0.5f / y[i]; });
}

void reciprocal_forward(OpContext& c) { map_elements(c, grain_elements(), [](float x) { return 1.0f / x; }); }

void reciprocal_backward(OpContext& c) {
  const float* y = c.out.f();
  accumulate_input_grad(c, grain_elements(), [=](int64_t i) { return -y[i] * y[i]; });
}

// acos: dx = -dy / sqrt(1 - x^2) (from the input)
void acos_forward(OpContext& c) { map_elements(c, grain_elements() / 4, [](float x) { return std::acos(x); }); }

void acos_backward(OpContext& c) {
  const float* x = c.din[0].defined() ? c.in[0].f() : nullptr;
  accumulate_input_grad(c, grain_elements() / 4, [=](int64_t i) { return -1.0f / std::sqrt(1.0f - x[i] * x[i]); });
}

// erf: dx = 2 / sqrt(pi) exp(-x^2) dy (from the input)
void erf_forward(OpContext& c) { map_elements(c, grain_elements() / 4, [](float x) { return std::erf(x); }); }

void erf_backward(OpContext& c) {
  const float* x = c.din[0].defined() ? c.in[0].f() : nullptr;
  constexpr float k = 1.1283791670955126f;  // 2 / sqrt(pi)
  accumulate_input_grad(c, grain_elements() / 4, [=](int64_t i) { return k * std::exp(-x[i] * x[i]); });
}

// ---- reduce_mean, reduce_sum, reduce_l2 over one axis --------------------------------
// The input as [rows, D, inner] around the reduced axis (the batch and the axes
// before it in rows; inner 1 for the last axis):
//   reduce_mean: y[r, i] = sum_j x[r, j, i] / D;  dx[r, j, i] = dy[r, i] / D.

struct MeanLayout {
  int64_t rows, D, inner;
};

MeanLayout mean_layout(const OpContext& c) {
  const Shape& s = in_shape(c, 0);  // per sample
  const auto rank = static_cast<int64_t>(s.size());
  int64_t axis = c.node->attrs.integer("axis");
  if (axis < 0) axis += rank;
  int64_t inner = 1;
  for (int64_t k = axis + 1; k < rank; ++k) inner *= s[static_cast<size_t>(k)];
  const int64_t D = s[static_cast<size_t>(axis)];
  return {total(c) / (D * inner), D, inner};
}

// y[r, i] = finish(sum_j term(x[r, j, i])), the sum in double: a row of
// 4096 fp32 terms loses digits otherwise. reduce_mean: x, then / D;
// reduce_sum: x; reduce_l2: x^2, then sqrt.
template <typename Term, typename Finish>
static void reduce_over_axis(OpContext& c, Term term, Finish finish) {
  const MeanLayout l = mean_layout(c);
  const float* x = c.in[0].f();
  float* y = c.out.f();
  parallel_for(l.rows * l.inner, grain_elements() / l.D + 1, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const int64_t r = o / l.inner, i = o % l.inner;
      const float* xr = x + r * l.D * l.inner + i;
      double sum = 0;
      for (int64_t j = 0; j < l.D; ++j) sum += term(static_cast<double>(xr[j * l.inner]));
      y[o] = static_cast<float>(finish(sum, l.D));
    }
  });
}

// dx[r, j, i] += dy[r, i] / D (reduce_mean) or dy[r, i] (reduce_sum)
static void reduce_backward(OpContext& c, bool mean) {
  if (!c.din[0].defined()) return;
  const MeanLayout l = mean_layout(c);
  const float inv = mean ? 1.0f / static_cast<float>(l.D) : 1.0f;
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  parallel_for(l.rows, grain_elements() / (l.D * l.inner) + 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t j = 0; j < l.D; ++j)
        for (int64_t i = 0; i < l.inner; ++i) dx[(r * l.D + j) * l.inner + i] += dy[r * l.inner + i] * inv;
  });
}

// reduce_l2: y[r, i] = sqrt(sum_j x[r, j, i]^2);  dx = dy x / y, 0 where y = 0
// (PyTorch's norm_backward for p = 2).
void reduce_l2_forward(OpContext& c) {
  reduce_over_axis(c, [](double v) { return v * v; }, [](double sum, int64_t) { return std::sqrt(sum); });
}

void reduce_l2_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const MeanLayout l = mean_layout(c);
  const float* x = c.in[0].f();
  const float* y = c.out.f();
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  parallel_for(l.rows, grain_elements() / (l.D * l.inner) + 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t j = 0; j < l.D; ++j)
        for (int64_t i = 0; i < l.inner; ++i) {
          const float norm = y[r * l.inner + i];
          const int64_t at = (r * l.D + j) * l.inner + i;
          if (norm != 0.0f) dx[at] += dy[r * l.inner + i] / norm * x[at];
        }
  });
}

void reduce_mean_forward(OpContext& c) {
  reduce_over_axis(c, [](double v) { return v; }, [](double sum, int64_t D) { return sum / static_cast<double>(D); });
}
void reduce_mean_backward(OpContext& c) { reduce_backward(c, true); }
void reduce_sum_forward(OpContext& c) {
  reduce_over_axis(c, [](double v) { return v; }, [](double sum, int64_t) { return sum; });
}
void reduce_sum_backward(OpContext& c) { reduce_backward(c, false); }

// ---- torch.nn's activations ---------------------------------------------------------
// Each derivative is PyTorch's (derivatives.yaml), read from the kept input:
//   leaky_relu: x for x > 0, else slope x;  1, else slope;
//   elu:        x for x > 0, else alpha (exp(x) - 1);  1, else alpha exp(x)
//               (elu_backward with is_result false);
//   softplus:   log1p(exp(x)), x above nn.Softplus's threshold 20 (beta 1);
//               z / (z + 1) with z = exp(x), 1 above the threshold;
//   mish:       x tanh(softplus(x)), softplus without a threshold (PyTorch's
//               kernel);  t + x sigmoid(x) (1 - t^2) with t = tanh(softplus(x)).

constexpr float kSoftplusThreshold = 20.0f;

void leaky_relu_forward(OpContext& c) {
  const float a = number(c, "slope");
  map_elements(c, grain_elements(), [=](float x) { return x > 0.0f ? x : a * x; });
}

void leaky_relu_backward(OpContext& c) {
  const float a = number(c, "slope");
  const float* x = c.in[0].f();
  accumulate_input_grad(c, grain_elements(), [=](int64_t i) { return x[i] > 0.0f ? 1.0f : a; });
}

void elu_forward(OpContext& c) {
  const float a = number(c, "alpha");
  map_elements(c, grain_elements(), [=](float x) { return x > 0.0f ? x : a * std::expm1(x); });
}

void elu_backward(OpContext& c) {
  const float a = number(c, "alpha");
  const float* x = c.in[0].f();
  accumulate_input_grad(c, grain_elements(), [=](int64_t i) { return x[i] > 0.0f ? 1.0f : a * std::exp(x[i]); });
}

void softplus_forward(OpContext& c) {
  map_elements(c, grain_elements(), [](float x) { return x > kSoftplusThreshold ? x : std::log1p(std::exp(x)); });
}

void softplus_backward(OpContext& c) {
  const float* x = c.in[0].f();
  accumulate_input_grad(c, grain_elements(), [=](int64_t i) {
    const float z = std::exp(x[i]);
    return x[i] > kSoftplusThreshold ? 1.0f : z / (z + 1.0f);
  });
}

void mish_forward(OpContext& c) {
  map_elements(c, grain_elements(), [](float x) { return x * std::tanh(std::log1p(std::exp(x))); });
}

void mish_backward(OpContext& c) {
  const float* x = c.in[0].f();
  accumulate_input_grad(c, grain_elements(), [=](int64_t i) {
    const float t = std::tanh(std::log1p(std::exp(x[i]))), s = 1.0f / (1.0f + std::exp(-x[i]));
    return t + x[i] * s * (1.0f - t * t);
  });
}

}  // namespace dlplan::exec::cpu
