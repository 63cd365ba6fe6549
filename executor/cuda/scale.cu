// The trainer's gradient copies with a scale (DeviceOps::scaled_copy /
// scaled_add, dlplan/exec/device_ops.hpp) over fp32 or bf16 buffers: fp32
// arithmetic rounded as the CPU's loops round (a product, then a sum: no fused
// multiply-add), so the averaged gradients are bit-identical to the CPU's;
// bf16 results round to nearest even once. Also the bf16 <-> fp32 widening
// and narrowing of whole buffers. Launchers declared in device_ops_cuda.cpp;
// like the other .cu files this includes no dlplan header.
#include "common.cuh"

namespace dlplan::exec::cuda {
namespace {

template <typename T>
__global__ void scaled_copy_k(T* dst, const T* src, float scale, int64_t n) {
  DLPLAN_GRID_LOOP(e, n) st(dst, e, __fmul_rn(ld(src, e), scale));
}

template <typename T>
__global__ void scaled_add_k(T* dst, const T* src, float scale, int64_t n) {
  DLPLAN_GRID_LOOP(e, n) st(dst, e, __fadd_rn(ld(dst, e), __fmul_rn(ld(src, e), scale)));
}

__global__ void widen_k(float* dst, const __nv_bfloat16* src, int64_t n) {
  DLPLAN_GRID_LOOP(e, n) dst[e] = __bfloat162float(src[e]);
}

__global__ void narrow_k(__nv_bfloat16* dst, const float* src, int64_t n) {
  DLPLAN_GRID_LOOP(e, n) dst[e] = __float2bfloat16_rn(src[e]);
}

// dst = round(twin); twin = the stored value (so later fp32 arithmetic reads
// what the bf16 tensor holds).
__global__ void round_store_k(__nv_bfloat16* dst, float* twin, int64_t n) {
  DLPLAN_GRID_LOOP(e, n) {
    const __nv_bfloat16 h = __float2bfloat16_rn(twin[e]);
    dst[e] = h;
    twin[e] = __bfloat162float(h);
  }
}

}  // namespace

void scaled_copy(void* dst, const void* src, bool bf16, float scale, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  if (bf16)
    scaled_copy_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(dst),
                                                       static_cast<const __nv_bfloat16*>(src), scale, n);
  else
    scaled_copy_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<float*>(dst), static_cast<const float*>(src), scale, n);
}

void scaled_add(void* dst, const void* src, bool bf16, float scale, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  if (bf16)
    scaled_add_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(dst),
                                                      static_cast<const __nv_bfloat16*>(src), scale, n);
  else
    scaled_add_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<float*>(dst), static_cast<const float*>(src), scale, n);
}

void bf16_widen(float* dst, const void* src, int64_t n, cudaStream_t s) {
  if (n > 0) widen_k<<<blocks_for(n), kThreads, 0, s>>>(dst, static_cast<const __nv_bfloat16*>(src), n);
}

void bf16_narrow(void* dst, const float* src, int64_t n, cudaStream_t s) {
  if (n > 0) narrow_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(dst), src, n);
}

void bf16_round_store(void* dst, float* twin, int64_t n, cudaStream_t s) {
  if (n > 0) round_store_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(dst), twin, n);
}

}  // namespace dlplan::exec::cuda
