// Shared device helpers of the CUDA backend's kernels: launch geometry,
// block reductions, and Philox4x32-10 bit-identical to executor/cpu/philox.cpp.
#pragma once

#include "kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dlplan::exec::cuda {

constexpr int kThreads = 256;

// Storage loads and stores: fp32 as is, bf16 and fp16 widened exactly and
// rounded to nearest even (as dlplan/exec/bf16.hpp on the host; fp16 beyond
// 65504 becomes +-inf). Arithmetic is fp32.
__device__ inline float ld(const float* p, int64_t i) { return p[i]; }
__device__ inline float ld(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ inline float ld(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ inline void st(float* p, int64_t i, float v) { p[i] = v; }
__device__ inline void st(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
__device__ inline void st(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }

// The launchers' dispatch on a storage type: calls f(StoreTag<T>{}) with T the
// device type of `store` (float, __nv_bfloat16, __half), so that a launcher
// picks the instantiation of a kernel templated on it:
//   with_store(store, [&](auto tag) { using T = typename decltype(tag)::type; k<T><<<...>>>(...); });
template <typename T>
struct StoreTag {
  using type = T;
};
template <typename F>
inline void with_store(Store store, F&& f) {
  switch (store) {
    case Store::f32: f(StoreTag<float>{}); return;
    case Store::bf16: f(StoreTag<__nv_bfloat16>{}); return;
    case Store::f16: f(StoreTag<__half>{}); return;
  }
}

inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 65535LL * 16) b = 65535LL * 16;  // grid-stride loops cover the rest
  return static_cast<unsigned>(b);
}

#define DLPLAN_GRID_LOOP(i, n) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); i += int64_t{blockDim.x} * gridDim.x)

// Sum / max over the block (blockDim.x a multiple of 32, <= 1024). Every thread
// gets the result. `scratch` holds 32 values; the call synchronises.
template <typename T>
__device__ inline T block_sum(T v, T* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T r = 0;
  for (int w = 0; w < warps; ++w) r += scratch[w];
  return r;
}

__device__ inline float block_max(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < warps; ++w) r = fmaxf(r, scratch[w]);
  return r;
}

// Column sums in a fixed order (no atomics; bit-identical run to run): a block
// of (kColTile, kColLanes) threads owns kColTile adjacent columns (a 32-byte
// sector of each row it reads). Lane y sums its slice of rows [y c, (y + 1) c),
// c = ceil(rows / kColLanes), in order (lane_rows); lanes_total then adds the
// kColLanes slice sums, in lane order, onto the start value (the output's old
// value). The order depends on the shape only. With rows <= kColLanes every
// slice is one row, so the sum is start + a_0 + a_1 + ... in row order: the CPU
// loop's, bit for bit.
constexpr int kColTile = 8;
constexpr int kColLanes = 64;

// This lane's rows [*r0, *r1).
__device__ inline void lane_rows(int64_t rows, int64_t* r0, int64_t* r1) {
  const int64_t c = (rows + kColLanes - 1) / kColLanes, b = threadIdx.y * c;
  *r0 = b < rows ? b : rows;
  *r1 = b + c < rows ? b + c : rows;
}

// start + the lanes' partials v in lane order, per threadIdx.x; meaningful in
// lane 0 (threadIdx.y == 0), which passes the start. Every thread of the block
// must call it (it synchronises); `sm` is kColLanes x kColTile shared values.
template <typename T>
__device__ inline T lanes_total(T start, T v, T (*sm)[kColTile]) {
  sm[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  T acc = start;
  if (threadIdx.y == 0)
    for (int y = 0; y < kColLanes; ++y) acc += sm[y][threadIdx.x];
  __syncthreads();
  return acc;
}

// The launch: column_lanes_grid(cols) blocks of column_lanes_block() threads.
inline dim3 column_lanes_block() { return dim3(kColTile, kColLanes); }
inline unsigned column_lanes_grid(int64_t cols) { return static_cast<unsigned>((cols + kColTile - 1) / kColTile); }

// Philox4x32-10 (Salmon et al. SC'11; Random123's constants), as philox.cpp.
__device__ inline uint32_t philox_first(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return c0;
}

// dropout_uniform(seed, node, sample, element) of philox.cpp: out[0] * 2^-32,
// the uint32 -> float conversion rounding to nearest (as static_cast on the host).
__device__ inline float dropout_u(uint64_t seed, int node, int64_t sample, int64_t element) {
  const uint64_t e = static_cast<uint64_t>(element);
  const uint32_t x = philox_first(static_cast<uint32_t>(e), static_cast<uint32_t>(sample), static_cast<uint32_t>(node),
                                  static_cast<uint32_t>(e >> 32), static_cast<uint32_t>(seed),
                                  static_cast<uint32_t>(seed >> 32));
  return __uint2float_rn(x) * 0x1p-32f;
}

}  // namespace dlplan::exec::cuda
