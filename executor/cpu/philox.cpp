// Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy
// as 1, 2, 3", SC'11; constants as Random123's philox.h) and dropout's uniform.
//
// Dropout, identically on every backend (DESIGN.md, "Determinism"):
//   key     = (seed low 32 bits, seed high 32 bits)
//   counter = (element index low 32 bits, global sample index, node index,
//              element index high 32 bits)
//   u       = float(out[0]) * 2^-32   (round-to-nearest conversion, in float)
// An element is dropped where u < float(p); kept ones are multiplied by
// float(1 / (1 - p)). The element index is the position inside one sample's
// tensor (attention: inside its [heads, T, T] probabilities).
#include "dlplan/exec/backend.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dlplan::exec {

namespace {
constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
}  // namespace

void philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    const uint64_t p0 = uint64_t{kM0} * c0, p1 = uint64_t{kM1} * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

float dropout_uniform(uint64_t seed, int node_index, int64_t sample, int64_t element) {
  const uint64_t e = static_cast<uint64_t>(element);
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  const uint32_t counter[4] = {static_cast<uint32_t>(e), static_cast<uint32_t>(sample),
                               static_cast<uint32_t>(node_index), static_cast<uint32_t>(e >> 32)};
  uint32_t out[4];
  philox4x32_10(counter, key, out);
  return static_cast<float>(out[0]) * 0x1p-32f;
}

#if defined(__x86_64__)
namespace {

// The high and low 32-bit halves of a * m (unsigned, 64-bit product) in all
// eight lanes: _mm256_mul_epu32 multiplies the even lanes, so the odd ones
// are shifted down, multiplied, and blended back.
__attribute__((target("avx2"))) inline void mul_hi_lo(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(a, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

// philox4x32_10's ten rounds on eight counters at once; the first output word of each.
__attribute__((target("avx2"))) inline __m256i first_word8(__m256i c0, __m256i c1, __m256i c2, __m256i c3, uint32_t k0,
                                                           uint32_t k1) {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(kM0)), m1 = _mm256_set1_epi32(static_cast<int>(kM1));
  for (int round = 0; round < 10; ++round) {
    __m256i hi0, lo0, hi1, lo1;
    mul_hi_lo(c0, m0, hi0, lo0);
    mul_hi_lo(c2, m1, hi1, lo1);
    c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
    c1 = lo1;
    c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return c0;
}

__attribute__((target("avx2"))) void first_words_avx2(const uint32_t key[2], uint32_t c0, uint32_t c1, uint32_t c2,
                                                     uint32_t c3, int64_t n, uint32_t* out) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i first = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(c0 + static_cast<uint32_t>(i))), lanes);
    const __m256i w = first_word8(first, _mm256_set1_epi32(static_cast<int>(c1)), _mm256_set1_epi32(static_cast<int>(c2)),
                                  _mm256_set1_epi32(static_cast<int>(c3)), key[0], key[1]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), w);
  }
  for (; i < n; ++i) {
    const uint32_t counter[4] = {c0 + static_cast<uint32_t>(i), c1, c2, c3};
    uint32_t words[4];
    philox4x32_10(counter, key, words);
    out[i] = words[0];
  }
}

// philox4x32_10's rounds on eight counters at once; returns u for each
// (out[0] / 2^32). The counters are (e low, sample, node, e high) for e = first .. first + 7.
__attribute__((target("avx2"))) void uniforms_avx2(uint64_t seed, int node_index, int64_t sample, int64_t first,
                                                  int64_t n, float* u) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    alignas(32) uint32_t lo_words[8], hi_words[8];
    for (int l = 0; l < 8; ++l) {
      const uint64_t e = static_cast<uint64_t>(first + i + l);
      lo_words[l] = static_cast<uint32_t>(e);
      hi_words[l] = static_cast<uint32_t>(e >> 32);
    }
    __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo_words));
    __m256i c1 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(sample)));
    __m256i c2 = _mm256_set1_epi32(node_index);
    __m256i c3 = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi_words));
    c0 = first_word8(c0, c1, c2, c3, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
    // float(c0) of an unsigned word, rounded once as the scalar cast rounds:
    // hi16 * 65536 and lo16 are both exact in float, so their sum is the only rounding.
    const __m256 high = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c0, 16)), _mm256_set1_ps(65536.0f));
    const __m256 low = _mm256_cvtepi32_ps(_mm256_and_si256(c0, _mm256_set1_epi32(0xFFFF)));
    _mm256_storeu_ps(u + i, _mm256_mul_ps(_mm256_add_ps(high, low), _mm256_set1_ps(0x1p-32f)));
  }
  for (; i < n; ++i) u[i] = dropout_uniform(seed, node_index, sample, first + i);
}

// The same on sixteen lanes (AVX-512F): the multiply takes the even lanes,
// as its AVX2 counterpart does. The zero-masked forms with every lane
// selected are the plain intrinsics without their undefined pass-through
// operand, which GCC 12 reports as maybe-uninitialized (GCC bug 105593).
__attribute__((target("avx512f"))) inline void mul_hi_lo16(__m512i a, __m512i m, __m512i& hi, __m512i& lo) {
  constexpr __mmask8 all = 0xFF;
  const __m512i even = _mm512_maskz_mul_epu32(all, a, m);
  const __m512i odd = _mm512_maskz_mul_epu32(all, _mm512_maskz_srli_epi64(all, a, 32), m);
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_maskz_srli_epi64(all, even, 32), odd);
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_maskz_slli_epi64(all, odd, 32));
}

__attribute__((target("avx512f"))) inline __m512i first_word16(__m512i c0, __m512i c1, __m512i c2, __m512i c3, uint32_t k0,
                                                              uint32_t k1) {
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(kM0)), m1 = _mm512_set1_epi32(static_cast<int>(kM1));
  for (int round = 0; round < 10; ++round) {
    __m512i hi0, lo0, hi1, lo1;
    mul_hi_lo16(c0, m0, hi0, lo0);
    mul_hi_lo16(c2, m1, hi1, lo1);
    c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32(static_cast<int>(k0)));
    c1 = lo1;
    c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32(static_cast<int>(k1)));
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return c0;
}

__attribute__((target("avx512f"))) void first_words_avx512(const uint32_t key[2], uint32_t c0, uint32_t c1, uint32_t c2,
                                                         uint32_t c3, int64_t n, uint32_t* out) {
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i first = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(c0 + static_cast<uint32_t>(i))), lanes);
    const __m512i w = first_word16(first, _mm512_set1_epi32(static_cast<int>(c1)), _mm512_set1_epi32(static_cast<int>(c2)),
                                   _mm512_set1_epi32(static_cast<int>(c3)), key[0], key[1]);
    _mm512_storeu_si512(out + i, w);
  }
  if (i < n) first_words_avx2(key, c0 + static_cast<uint32_t>(i), c1, c2, c3, n - i, out + i);
}

// uniforms_avx2 on sixteen lanes. The element index's low word takes the
// lane offsets by one vector add unless it carries into the high word inside
// the block (then the lanes are filled one by one); float(c0) is AVX-512's
// unsigned conversion, rounded once to nearest as the scalar cast is.
__attribute__((target("avx512f"))) void uniforms_avx512(uint64_t seed, int node_index, int64_t sample, int64_t first,
                                                      int64_t n, float* u) {
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i c1 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(sample)));
  const __m512i c2 = _mm512_set1_epi32(node_index);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const uint64_t e = static_cast<uint64_t>(first + i);
    const auto lo = static_cast<uint32_t>(e), hi = static_cast<uint32_t>(e >> 32);
    __m512i c0, c3;
    if (lo <= 0xFFFFFFFFu - 15) {
      c0 = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(lo)), lanes);
      c3 = _mm512_set1_epi32(static_cast<int>(hi));
    } else {
      alignas(64) uint32_t lo_words[16], hi_words[16];
      for (int l = 0; l < 16; ++l) {
        lo_words[l] = static_cast<uint32_t>(e + static_cast<uint64_t>(l));
        hi_words[l] = static_cast<uint32_t>((e + static_cast<uint64_t>(l)) >> 32);
      }
      c0 = _mm512_load_si512(lo_words);
      c3 = _mm512_load_si512(hi_words);
    }
    c0 = first_word16(c0, c1, c2, c3, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
    _mm512_storeu_ps(u + i, _mm512_mul_ps(_mm512_maskz_cvtepu32_ps(0xFFFF, c0), _mm512_set1_ps(0x1p-32f)));
  }
  if (i < n) uniforms_avx2(seed, node_index, sample, first + i, n - i, u + i);
}

}  // namespace
#endif

void philox_first_words(const uint32_t key[2], uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, int64_t n,
                        uint32_t* out) {
#if defined(__x86_64__)
  static const bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2");
  if (avx512) return first_words_avx512(key, c0, c1, c2, c3, n, out);
  if (avx2) return first_words_avx2(key, c0, c1, c2, c3, n, out);
#endif
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t counter[4] = {c0 + static_cast<uint32_t>(i), c1, c2, c3};
    uint32_t words[4];
    philox4x32_10(counter, key, words);
    out[i] = words[0];
  }
}

void dropout_uniforms(uint64_t seed, int node_index, int64_t sample, int64_t first, int64_t n, float* u) {
#if defined(__x86_64__)
  static const bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2");
  if (avx512) return uniforms_avx512(seed, node_index, sample, first, n, u);
  if (avx2) return uniforms_avx2(seed, node_index, sample, first, n, u);
#endif
  for (int64_t i = 0; i < n; ++i) u[i] = dropout_uniform(seed, node_index, sample, first + i);
}

}  // namespace dlplan::exec
