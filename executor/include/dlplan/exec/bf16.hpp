// Half-precision storage types of the executor. bfloat16: the upper 16 bits of an IEEE float32 (1 sign, 8 exponent,
// 7 mantissa bits). Rounding float -> bf16 is to nearest, ties to even, as
// PyTorch's c10::BFloat16 and CUDA's __float2bfloat16_rn do; NaN stays a
// (quiet) NaN. bf16 -> float is exact.
#pragma once

#include "dlplan/ir.hpp"

#include <cstdint>
#include <cstring>

namespace dlplan::exec {

inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN: keep it quiet
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate.
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The value a float takes once stored as bf16.
inline float round_bf16(float f) { return from_bf16(to_bf16(f)); }

void bf16_to_f32(const uint16_t* src, float* dst, int64_t n);
void f32_to_bf16(const float* src, uint16_t* dst, int64_t n);

// IEEE binary16 storage (fp16-mixed): 1 sign, 5 exponent, 10 mantissa bits.
// float -> fp16 rounds to nearest, ties to even, with subnormals; beyond
// 65504 (after rounding) it is +-inf, as a GPU's __float2half_rn and
// PyTorch's c10::Half; NaN stays NaN. fp16 -> float is exact.
uint16_t to_f16(float f);
float from_f16(uint16_t h);
inline float round_f16(float f) { return from_f16(to_f16(f)); }

// The two 16-bit float storage types, by dtype (bf16 or f16).
inline bool is_half(DType d) { return d == DType::bf16 || d == DType::f16; }
inline uint16_t to_half(DType d, float f) { return d == DType::f16 ? to_f16(f) : to_bf16(f); }
inline float from_half(DType d, uint16_t h) { return d == DType::f16 ? from_f16(h) : from_bf16(h); }
void half_to_f32(DType d, const uint16_t* src, float* dst, int64_t n);
void f32_to_half(DType d, const float* src, uint16_t* dst, int64_t n);

}  // namespace dlplan::exec
