// The trainer's gradient copies with a scale (DeviceOps::scaled_copy /
// scaled_add, dlplan/exec/device_ops.hpp) over fp32, bf16 or fp16 buffers:
// fp32 arithmetic rounded as the CPU's loops round (a product, then a sum: no
// fused multiply-add), so the averaged gradients are bit-identical to the
// CPU's; 16-bit results round to nearest even once. Also the 16-bit <-> fp32
// widening and narrowing of whole buffers. Launchers declared in kernels.hpp;
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

template <typename T>
__global__ void widen_k(float* dst, const T* src, int64_t n) {
  DLPLAN_GRID_LOOP(e, n) dst[e] = ld(src, e);
}

template <typename T>
__global__ void narrow_k(T* dst, const float* src, int64_t n) {
  DLPLAN_GRID_LOOP(e, n) st(dst, e, src[e]);
}

// dst = round(twin); twin = the stored value (so later fp32 arithmetic reads
// what the 16-bit tensor holds).
template <typename T>
__global__ void round_store_k(T* dst, float* twin, int64_t n) {
  DLPLAN_GRID_LOOP(e, n) {
    st(dst, e, twin[e]);
    twin[e] = ld(dst, e);
  }
}

}  // namespace

void scaled_copy(void* dst, const void* src, Store store, float scale, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  with_store(store, [&](auto tag) {
    using T = typename decltype(tag)::type;
    scaled_copy_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(dst), static_cast<const T*>(src), scale, n);
  });
}

void scaled_add(void* dst, const void* src, Store store, float scale, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  with_store(store, [&](auto tag) {
    using T = typename decltype(tag)::type;
    scaled_add_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(dst), static_cast<const T*>(src), scale, n);
  });
}

void half_widen(float* dst, const void* src, Store half, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  with_store(half, [&](auto tag) {
    using T = typename decltype(tag)::type;
    widen_k<<<blocks_for(n), kThreads, 0, s>>>(dst, static_cast<const T*>(src), n);
  });
}

void half_narrow(void* dst, const float* src, Store half, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  with_store(half, [&](auto tag) {
    using T = typename decltype(tag)::type;
    narrow_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(dst), src, n);
  });
}

void half_round_store(void* dst, float* twin, Store half, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  with_store(half, [&](auto tag) {
    using T = typename decltype(tag)::type;
    round_store_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(dst), twin, n);
  });
}

}  // namespace dlplan::exec::cuda
