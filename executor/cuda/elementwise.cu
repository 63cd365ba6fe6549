// Elementwise kernels: gelu (exact, tanh), relu, silu, tanh, sigmoid, add, mul,
// dropout (Philox), and the small broadcast / reduction helpers the dense ops
// share. Formulas as executor/cpu/ops_elementwise.cpp.
#include "common.cuh"

namespace dlplan::exec::cuda {
namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kGeluC = 0.044715f;

__global__ void unary_fwd_k(Unary f, const float* x, float* y, int64_t n) {
  DLPLAN_GRID_LOOP(i, n) {
    const float v = x[i];
    float r;
    switch (f) {
      case Unary::gelu: r = 0.5f * v * (1.0f + erff(v * kInvSqrt2)); break;
      case Unary::gelu_tanh: r = 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + kGeluC * v * v * v))); break;
      case Unary::relu: r = v > 0.0f ? v : 0.0f; break;
      case Unary::silu: r = v / (1.0f + expf(-v)); break;
      case Unary::tanh: r = tanhf(v); break;
      default: r = 1.0f / (1.0f + expf(-v)); break;
    }
    y[i] = r;
  }
}

__global__ void unary_bwd_k(Unary f, const float* x, const float* y, const float* dy, float* dx, int64_t n) {
  DLPLAN_GRID_LOOP(i, n) {
    float d;
    switch (f) {
      case Unary::gelu: {
        const float v = x[i];
        d = 0.5f * (1.0f + erff(v * kInvSqrt2)) + v * kInvSqrt2Pi * expf(-0.5f * v * v);
        break;
      }
      case Unary::gelu_tanh: {
        const float v = x[i];
        const float t = tanhf(kSqrt2OverPi * (v + kGeluC * v * v * v));
        d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluC * v * v);
        break;
      }
      case Unary::relu: d = y[i] > 0.0f ? 1.0f : 0.0f; break;
      case Unary::silu: {
        const float v = x[i], sg = 1.0f / (1.0f + expf(-v));
        d = sg * (1.0f + v * (1.0f - sg));
        break;
      }
      case Unary::tanh: d = 1.0f - y[i] * y[i]; break;
      default: d = y[i] * (1.0f - y[i]); break;
    }
    if (f == Unary::relu) {
      if (d > 0.0f) dx[i] += dy[i];
    } else {
      dx[i] += dy[i] * d;
    }
  }
}

__global__ void add_k(const float* a, const float* b, float* y, int64_t n) { DLPLAN_GRID_LOOP(i, n) y[i] = a[i] + b[i]; }
__global__ void mul_k(const float* a, const float* b, float* y, int64_t n) { DLPLAN_GRID_LOOP(i, n) y[i] = a[i] * b[i]; }
__global__ void acc_k(const float* dy, const float* o, float* dx, int64_t n) {
  DLPLAN_GRID_LOOP(i, n) dx[i] += o ? dy[i] * o[i] : dy[i];
}

__global__ void dropout_k(const float* x, float* y, uint8_t* m, int64_t batch, int64_t per, uint64_t seed, int node,
                          int64_t first, float p, float scale) {
  DLPLAN_GRID_LOOP(i, batch * per) {
    const int64_t s = i / per, e = i - s * per;
    const bool keep = !(dropout_u(seed, node, first + s, e) < p);
    m[i] = keep ? 1 : 0;
    y[i] = keep ? x[i] * scale : 0.0f;
  }
}

__global__ void masked_acc_k(const float* dy, const uint8_t* m, float scale, float* dx, int64_t n) {
  DLPLAN_GRID_LOOP(i, n) if (m[i]) dx[i] += dy[i] * scale;
}

__global__ void fill_rows_k(float* y, const float* bias, int64_t rows, int64_t cols) {
  DLPLAN_GRID_LOOP(i, rows * cols) y[i] = bias[i % cols];
}

// out[j] += sum_r a[r, j] in a fixed order (common.cuh, column lanes): lane y
// sums its slice of rows, then lane 0 adds the slices in order onto out[j].
__global__ void column_sum_k(const float* a, float* out, int64_t rows, int64_t cols) {
  __shared__ float sm[kColLanes][kColTile];
  const int64_t j = blockIdx.x * int64_t{kColTile} + threadIdx.x;
  int64_t r0, r1;
  lane_rows(rows, &r0, &r1);
  float acc = 0;
  if (j < cols)
#pragma unroll 4  // loads in flight; the order of the adds is unchanged
    for (int64_t r = r0; r < r1; ++r) acc += a[r * cols + j];
  const bool lead = threadIdx.y == 0 && j < cols;
  acc = lanes_total(lead ? out[j] : 0.0f, acc, sm);
  if (lead) out[j] = acc;
}

__global__ void philox_k(uint64_t seed, int node, int64_t sample, int64_t n, float* out) {
  DLPLAN_GRID_LOOP(i, n) out[i] = dropout_u(seed, node, sample, i);
}

}  // namespace

void unary_forward(Unary f, const float* x, float* y, int64_t n, cudaStream_t s) {
  if (n > 0) unary_fwd_k<<<blocks_for(n), kThreads, 0, s>>>(f, x, y, n);
}
void unary_backward(Unary f, const float* x, const float* y, const float* dy, float* dx, int64_t n, cudaStream_t s) {
  if (n > 0) unary_bwd_k<<<blocks_for(n), kThreads, 0, s>>>(f, x, y, dy, dx, n);
}
void add_forward(const float* a, const float* b, float* y, int64_t n, cudaStream_t s) {
  if (n > 0) add_k<<<blocks_for(n), kThreads, 0, s>>>(a, b, y, n);
}
void mul_forward(const float* a, const float* b, float* y, int64_t n, cudaStream_t s) {
  if (n > 0) mul_k<<<blocks_for(n), kThreads, 0, s>>>(a, b, y, n);
}
void accumulate(const float* dy, const float* other, float* dx, int64_t n, cudaStream_t s) {
  if (n > 0) acc_k<<<blocks_for(n), kThreads, 0, s>>>(dy, other, dx, n);
}
void dropout_forward(const float* x, float* y, uint8_t* mask, int64_t batch, int64_t per, uint64_t seed, int node,
                     int64_t first_sample, float p, float scale, cudaStream_t s) {
  if (batch * per > 0)
    dropout_k<<<blocks_for(batch * per), kThreads, 0, s>>>(x, y, mask, batch, per, seed, node, first_sample, p, scale);
}
void masked_accumulate(const float* dy, const uint8_t* mask, float scale, float* dx, int64_t n, cudaStream_t s) {
  if (n > 0) masked_acc_k<<<blocks_for(n), kThreads, 0, s>>>(dy, mask, scale, dx, n);
}
void fill_rows(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows * cols > 0) fill_rows_k<<<blocks_for(rows * cols), kThreads, 0, s>>>(y, bias, rows, cols);
}
void column_sum_add(const float* a, float* out, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  column_sum_k<<<column_lanes_grid(cols), column_lanes_block(), 0, s>>>(a, out, rows, cols);
}
void philox_uniforms(uint64_t seed, int node, int64_t sample, int64_t n, float* out, cudaStream_t s) {
  if (n > 0) philox_k<<<blocks_for(n), kThreads, 0, s>>>(seed, node, sample, n, out);
}

}  // namespace dlplan::exec::cuda
