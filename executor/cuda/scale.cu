// The trainer's gradient copies with a scale (DeviceOps::scaled_copy /
// scaled_add / fill, dlplan/exec/device_ops.hpp): fp32, rounded as the CPU's
// loops round (a product, then a sum: no fused multiply-add), so the averaged
// gradients are bit-identical to the CPU's. Launchers declared in
// device_ops_cuda.cpp; like the other .cu files this includes no dlplan header.
#include "common.cuh"

namespace dlplan::exec::cuda {
namespace {

__global__ void scaled_copy_k(float* dst, const float* src, float scale, int64_t n) {
  DLPLAN_GRID_LOOP(e, n) dst[e] = __fmul_rn(src[e], scale);
}

__global__ void scaled_add_k(float* dst, const float* src, float scale, int64_t n) {
  DLPLAN_GRID_LOOP(e, n) dst[e] = __fadd_rn(dst[e], __fmul_rn(src[e], scale));
}

__global__ void fill_k(float* p, float value, int64_t n) {
  DLPLAN_GRID_LOOP(e, n) p[e] = value;
}

}  // namespace

void scaled_copy(float* dst, const float* src, float scale, int64_t n, cudaStream_t s) {
  if (n > 0) scaled_copy_k<<<blocks_for(n), kThreads, 0, s>>>(dst, src, scale, n);
}

void scaled_add(float* dst, const float* src, float scale, int64_t n, cudaStream_t s) {
  if (n > 0) scaled_add_k<<<blocks_for(n), kThreads, 0, s>>>(dst, src, scale, n);
}

void fill(float* p, float value, int64_t n, cudaStream_t s) {
  if (n > 0) fill_k<<<blocks_for(n), kThreads, 0, s>>>(p, value, n);
}

}  // namespace dlplan::exec::cuda
