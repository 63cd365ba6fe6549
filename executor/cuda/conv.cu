// conv2d's lowering kernels (executor/cpu/ops_conv.cpp): im2col for one sample
// into the declared [C kh kw, OH OW] column buffer, its adjoint col2im (a
// gather per input pixel, no atomics), and the bias broadcast / reduction.
// The GEMMs are cuBLAS calls in cuda_ops.cpp.
#include "common.cuh"

namespace dlplan::exec::cuda {
namespace {

__global__ void im2col_k(Geom g, const float* x, float* col) {
  const int64_t P = g.OH * g.OW, rows = g.C * g.kh * g.kw;
  DLPLAN_GRID_LOOP(i, rows * P) {
    const int64_t row = i / P, p = i - row * P;
    const int64_t ch = row / (g.kh * g.kw), kk = row - ch * g.kh * g.kw, ki = kk / g.kw, kj = kk - ki * g.kw;
    const int64_t oh = p / g.OW, ow = p - oh * g.OW;
    const int64_t ih = oh * g.sh - g.ph + ki, iw = ow * g.sw - g.pw + kj;
    col[i] = (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) ? x[(ch * g.H + ih) * g.W + iw] : 0.0f;
  }
}

__global__ void col2im_k(Geom g, const float* dcol, float* dx) {
  const int64_t P = g.OH * g.OW, HW = g.H * g.W;
  DLPLAN_GRID_LOOP(i, g.C * HW) {
    const int64_t ch = i / HW, r = i - ch * HW, ih = r / g.W, iw = r - ih * g.W;
    float acc = 0;
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      const int64_t t = ih + g.ph - ki;
      if (t < 0 || t % g.sh) continue;
      const int64_t oh = t / g.sh;
      if (oh >= g.OH) continue;
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        const int64_t u = iw + g.pw - kj;
        if (u < 0 || u % g.sw) continue;
        const int64_t ow = u / g.sw;
        if (ow < g.OW) acc += dcol[((ch * g.kh + ki) * g.kw + kj) * P + oh * g.OW + ow];
      }
    }
    dx[i] += acc;
  }
}

__global__ void fill_channels_k(float* y, const float* bias, int64_t batch, int64_t O, int64_t P) {
  DLPLAN_GRID_LOOP(i, batch * O * P) y[i] = bias[(i / P) % O];
}

// Block per channel o: sum over samples and pixels (float, as the CPU's per-sample
// sums). Fixed order: each thread its strided pixels in order, then block_sum's
// fixed tree (no atomics, deterministic).
__global__ void channel_sum_k(const float* dy, float* db, int64_t batch, int64_t O, int64_t P) {
  __shared__ float scratch[32];
  const int64_t o = blockIdx.x;
  float acc = 0;
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t p = threadIdx.x; p < P; p += blockDim.x) acc += dy[(s * O + o) * P + p];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) db[o] += acc;
}

}  // namespace

void im2col(const Geom& g, const float* x, float* col, cudaStream_t s) {
  const int64_t n = g.C * g.kh * g.kw * g.OH * g.OW;
  if (n > 0) im2col_k<<<blocks_for(n), kThreads, 0, s>>>(g, x, col);
}
void col2im_add(const Geom& g, const float* dcol, float* dx, cudaStream_t s) {
  const int64_t n = g.C * g.H * g.W;
  if (n > 0) col2im_k<<<blocks_for(n), kThreads, 0, s>>>(g, dcol, dx);
}
void fill_channels(float* y, const float* bias, int64_t batch, int64_t O, int64_t P, cudaStream_t s) {
  if (batch * O * P > 0) fill_channels_k<<<blocks_for(batch * O * P), kThreads, 0, s>>>(y, bias, batch, O, P);
}
void channel_sum_add(const float* dy, float* db, int64_t batch, int64_t O, int64_t P, cudaStream_t s) {
  if (O > 0) channel_sum_k<<<static_cast<unsigned>(O), kThreads, 0, s>>>(dy, db, batch, O, P);
}

}  // namespace dlplan::exec::cuda
