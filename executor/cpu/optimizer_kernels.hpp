// The optimizer's per-element loops on the CPU: fp32 AdamW's update and the
// gradients' sum of squares (global-norm clipping). Both run once a step over
// every parameter, so on a convolutional network of 11.7 M parameters they
// are a tenth of what is left of a step outside its convolutions.
#pragma once

#include <cstdint>

namespace dlplan::exec::cpu {

// One AdamW step's scalars (Loshchilov & Hutter, decoupled weight decay),
// all in double, as DeviceOps::optimizer_step derives them:
// keep = 1 - lr x weight decay, bc1 = 1 - beta1^t, bc2 = 1 - beta2^t,
// clip the gradient's global-norm scale.
struct AdamWScalars {
  double lr, clip, keep, beta1, beta2, eps, bc1, bc2;
};

// For e in [begin, end), in double, rounding m, v and p to float where they
// are stored:
//   grad = g x clip
//   m = beta1 m + (1 - beta1) grad
//   v = beta2 v + (1 - beta2) grad grad
//   p = p keep - lr (m / bc1) / (sqrt(v / bc2) + eps)
// Built for AVX-512 and AVX2 too (GCC's target clones), each vectorized, with
// no fused multiply-add, so every clone gives the bits of the baseline loop.
void adamw_f32(const AdamWScalars& s, float* p, const float* g, float* m, float* v, int64_t begin, int64_t end);

// sum over e < n of x[e]^2 in double, on the rank's threads. The order of
// addition depends on n only (fixed chunks of 2^15 elements, each summed over
// eight lanes, the chunks' sums added in order), not on the thread count.
double sum_of_squares_f32(const float* x, int64_t n);

}  // namespace dlplan::exec::cpu
