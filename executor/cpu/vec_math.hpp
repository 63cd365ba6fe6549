// exp for float written so that a loop over it vectorizes (no calls, no
// branches), and the attribute that builds such a loop for AVX2 as well as for
// the baseline x86-64 (GCC picks the clone at load time). The CPU backend is
// compiled with -fopenmp-simd (for `#pragma omp simd`) and -fno-trapping-math
// (so the clamps below become min/max instructions rather than branches).
#pragma once

#include <bit>
#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DLPLAN_SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DLPLAN_SIMD_CLONES
#endif

namespace dlplan::exec::cpu {

// e^x within 2 ulp for x in [-87, 88]; x is clamped to that range (e^-87 and
// e^88 are still normal floats), which the callers below absorb: they only use
// e^x inside 1 / (1 + e^x).
// Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, with ln2 split in two so
// n ln2 is exact; e^r from the degree-6 polynomial of Cephes' expf.c
// (S. Moshier), and 2^n assembled in the exponent bits. n is rounded with the
// 1.5 * 2^23 trick: adding it leaves n in the low mantissa bits.
inline float exp_clamped(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  const float shifted = x * 1.44269504088896341f + kRound;
  const float n = shifted - kRound;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t n_int = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRound);
  return p * std::bit_cast<float>((n_int + 127) << 23);
}

// 1 / (1 + e^-x).
inline float sigmoid(float x) { return 1.0f / (1.0f + exp_clamped(-x)); }

// erf(x) within 1.5e-7 absolute (Abramowitz & Stegun 7.1.26):
//   erf(|x|) = 1 - t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) e^{-x^2},
//   t = 1 / (1 + p |x|),
// odd in x. PyTorch's vectorized CPU erf (ATen's Vectorized<float>::erf,
// which its exact GELU runs through) uses the same formula. No branches, so
// a loop over it vectorizes where std::erf is a call per element.
inline float erf_fast(float x) {
  constexpr float p = 0.3275911f;
  constexpr float a1 = 0.254829592f, a2 = -0.284496736f, a3 = 1.421413741f, a4 = -1.453152027f, a5 = 1.061405429f;
  const float ax = x < 0 ? -x : x;
  const float t = 1.0f / (1.0f + p * ax);
  const float poly = t * (a1 + t * (a2 + t * (a3 + t * (a4 + t * a5))));
  const float r = 1.0f - poly * exp_clamped(-ax * ax);
  return x < 0 ? -r : r;
}

}  // namespace dlplan::exec::cpu
