// Max / average / global-average pooling over [b, C, H, W] planes
// (executor/cpu/ops_conv.cpp): padding is -inf for max, counted for average.
#include "common.cuh"

namespace dlplan::exec::cuda {
namespace {

__global__ void maxpool_fwd_k(Geom g, const float* x, float* y, int32_t* am, int64_t planes) {
  const int64_t P = g.OH * g.OW;
  DLPLAN_GRID_LOOP(i, planes * P) {
    const int64_t pl = i / P, p = i - pl * P, oh = p / g.OW, ow = p - oh * g.OW;
    const float* xp = x + pl * g.H * g.W;
    float best = -INFINITY;
    int64_t arg = -1;
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      const int64_t ih = oh * g.sh - g.ph + ki;
      if (ih < 0 || ih >= g.H) continue;
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        const int64_t iw = ow * g.sw - g.pw + kj;
        if (iw < 0 || iw >= g.W) continue;
        const float v = xp[ih * g.W + iw];
        if (arg < 0 || v > best || v != v) {
          best = v;
          arg = ih * g.W + iw;
        }
      }
    }
    y[i] = best;
    am[i] = static_cast<int32_t>(arg);
  }
}

// Thread per input pixel (a gather, no atomics): adds dy of every window whose
// argmax is this pixel, windows in output order (oh, then ow, ascending) — the
// CPU's scatter order, so the sum is the CPU's bit for bit. Window oh covers
// rows [oh sh - ph, oh sh - ph + kh), i.e. oh in [ceil((ih + ph - kh + 1) / sh),
// floor((ih + ph) / sh)] within [0, OH); the same for columns.
__global__ void maxpool_bwd_k(Geom g, const float* dy, const int32_t* am, float* dx, int64_t planes) {
  const int64_t HW = g.H * g.W, P = g.OH * g.OW;
  DLPLAN_GRID_LOOP(i, planes * HW) {
    const int64_t pl = i / HW, r = i - pl * HW, ih = r / g.W, iw = r - ih * g.W;
    const int64_t th = ih + g.ph - g.kh + 1, tw = iw + g.pw - g.kw + 1;
    const int64_t oh0 = th > 0 ? (th + g.sh - 1) / g.sh : 0, ow0 = tw > 0 ? (tw + g.sw - 1) / g.sw : 0;
    const int64_t oh1 = min((ih + g.ph) / g.sh, g.OH - 1), ow1 = min((iw + g.pw) / g.sw, g.OW - 1);
    const float* dyp = dy + pl * P;
    const int32_t* amp = am + pl * P;
    float acc = dx[i];
    bool hit = false;
    for (int64_t oh = oh0; oh <= oh1; ++oh)
      for (int64_t ow = ow0; ow <= ow1; ++ow)
        if (amp[oh * g.OW + ow] == r) {
          acc += dyp[oh * g.OW + ow];
          hit = true;
        }
    if (hit) dx[i] = acc;
  }
}

__global__ void avgpool_fwd_k(Geom g, const float* x, float* y, int64_t planes, float inv) {
  const int64_t P = g.OH * g.OW;
  DLPLAN_GRID_LOOP(i, planes * P) {
    const int64_t pl = i / P, p = i - pl * P, oh = p / g.OW, ow = p - oh * g.OW;
    const float* xp = x + pl * g.H * g.W;
    float acc = 0;
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      const int64_t ih = oh * g.sh - g.ph + ki;
      if (ih < 0 || ih >= g.H) continue;
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        const int64_t iw = ow * g.sw - g.pw + kj;
        if (iw >= 0 && iw < g.W) acc += xp[ih * g.W + iw];
      }
    }
    y[i] = acc * inv;
  }
}

// Thread per input pixel: gathers every window that covers it (no atomics).
__global__ void avgpool_bwd_k(Geom g, const float* dy, float* dx, int64_t planes, float inv) {
  const int64_t HW = g.H * g.W, P = g.OH * g.OW;
  DLPLAN_GRID_LOOP(i, planes * HW) {
    const int64_t pl = i / HW, r = i - pl * HW, ih = r / g.W, iw = r - ih * g.W;
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
        if (ow < g.OW) acc += dy[pl * P + oh * g.OW + ow] * inv;
      }
    }
    dx[i] += acc;
  }
}

// Block per plane, the mean in double (as the CPU).
__global__ void gap_fwd_k(const float* x, float* y, int64_t hw) {
  __shared__ double scratch[32];
  const float* xp = x + blockIdx.x * hw;
  double acc = 0;
  for (int64_t i = threadIdx.x; i < hw; i += blockDim.x) acc += xp[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) y[blockIdx.x] = static_cast<float>(acc / static_cast<double>(hw));
}

__global__ void gap_bwd_k(const float* dy, float* dx, int64_t planes, int64_t hw) {
  DLPLAN_GRID_LOOP(i, planes * hw) dx[i] += dy[i / hw] / static_cast<float>(hw);
}

}  // namespace

void maxpool_forward(const Geom& g, const float* x, float* y, int32_t* argmax, int64_t planes, cudaStream_t s) {
  const int64_t n = planes * g.OH * g.OW;
  if (n > 0) maxpool_fwd_k<<<blocks_for(n), kThreads, 0, s>>>(g, x, y, argmax, planes);
}
void maxpool_backward(const Geom& g, const float* dy, const int32_t* argmax, float* dx, int64_t planes, cudaStream_t s) {
  const int64_t n = planes * g.H * g.W;
  if (n > 0) maxpool_bwd_k<<<blocks_for(n), kThreads, 0, s>>>(g, dy, argmax, dx, planes);
}
void avgpool_forward(const Geom& g, const float* x, float* y, int64_t planes, cudaStream_t s) {
  const int64_t n = planes * g.OH * g.OW;
  if (n > 0) avgpool_fwd_k<<<blocks_for(n), kThreads, 0, s>>>(g, x, y, planes, 1.0f / static_cast<float>(g.kh * g.kw));
}
void avgpool_backward(const Geom& g, const float* dy, float* dx, int64_t planes, cudaStream_t s) {
  const int64_t n = planes * g.H * g.W;
  if (n > 0) avgpool_bwd_k<<<blocks_for(n), kThreads, 0, s>>>(g, dy, dx, planes, 1.0f / static_cast<float>(g.kh * g.kw));
}
void global_avgpool_forward(const float* x, float* y, int64_t planes, int64_t hw, cudaStream_t s) {
  if (planes > 0) gap_fwd_k<<<static_cast<unsigned>(planes), kThreads, 0, s>>>(x, y, hw);
}
void global_avgpool_backward(const float* dy, float* dx, int64_t planes, int64_t hw, cudaStream_t s) {
  if (planes * hw > 0) gap_bwd_k<<<blocks_for(planes * hw), kThreads, 0, s>>>(dy, dx, planes, hw);
}

}  // namespace dlplan::exec::cuda
