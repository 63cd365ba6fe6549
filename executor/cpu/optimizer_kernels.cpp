// optimizer_kernels.hpp. Built with -ffp-contract=off (executor/CMakeLists.txt):
// with AVX-512 GCC may fuse a multiply and an add into one FMA, which rounds
// once where the scalar loop rounds twice, and the paths would then differ
// in their last bits.
#include "cpu/optimizer_kernels.hpp"

#include "cpu/parallel.hpp"
#include "cpu/row_reduce.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DLPLAN_X86_SIMD 1
#endif

namespace dlplan::exec::cpu {
namespace {

void adamw_scalar(const AdamWScalars& s, float* p, const float* g, float* m, float* v, int64_t begin, int64_t end) {
  for (int64_t e = begin; e < end; ++e) {
    const double grad = static_cast<double>(g[e]) * s.clip;
    double w = p[e] * s.keep;
    m[e] = static_cast<float>(s.beta1 * m[e] + (1 - s.beta1) * grad);
    v[e] = static_cast<float>(s.beta2 * v[e] + (1 - s.beta2) * grad * grad);
    w -= s.lr * (m[e] / s.bc1) / (std::sqrt(v[e] / s.bc2) + s.eps);
    p[e] = static_cast<float>(w);
  }
}

#ifdef DLPLAN_X86_SIMD
// Helpers, not lambdas: a lambda does not take its enclosing function's
// target. Zero-masked forms with every lane set: the unmasked ones start from
// an undefined vector, which GCC 12 warns of as uninitialised (GCC bug 105593).
__attribute__((target("avx512f"))) inline __m512d cvt8_pd(__m256 x) { return _mm512_maskz_cvtps_pd(0xFF, x); }
__attribute__((target("avx512f"))) inline __m256 cvt8_ps(__m512d x) { return _mm512_maskz_cvtpd_ps(0xFF, x); }
__attribute__((target("avx512f"))) inline __m512d sqrt8(__m512d x) { return _mm512_maskz_sqrt_pd(0xFF, x); }
// Floats widened to double (exact).
__attribute__((target("avx512f"))) inline __m512d wide8(const float* x) { return cvt8_pd(_mm256_loadu_ps(x)); }
__attribute__((target("avx2"))) inline __m256d wide4(const float* x) { return _mm256_cvtps_pd(_mm_loadu_ps(x)); }

// The scalar loop, eight elements at a time: floats widened to double
// (exact), each operation of the scalar expression in its order, and the
// stored m and v read back as the float they were rounded to. Returns where
// it stopped (the tail is the scalar loop's).
__attribute__((target("avx512f"))) int64_t adamw_avx512(const AdamWScalars& s, float* p, const float* g, float* m,
                                                        float* v, int64_t begin, int64_t end) {
  const __m512d clip = _mm512_set1_pd(s.clip), keep = _mm512_set1_pd(s.keep), b1 = _mm512_set1_pd(s.beta1),
                one_b1 = _mm512_set1_pd(1 - s.beta1), b2 = _mm512_set1_pd(s.beta2),
                one_b2 = _mm512_set1_pd(1 - s.beta2), lr = _mm512_set1_pd(s.lr), bc1 = _mm512_set1_pd(s.bc1),
                bc2 = _mm512_set1_pd(s.bc2), eps = _mm512_set1_pd(s.eps);
  int64_t e = begin;
  for (; e + 8 <= end; e += 8) {
    const __m512d grad = _mm512_mul_pd(wide8(g + e), clip);
    const __m512d w = _mm512_mul_pd(wide8(p + e), keep);
    const __m256 mf = cvt8_ps(_mm512_add_pd(_mm512_mul_pd(b1, wide8(m + e)), _mm512_mul_pd(one_b1, grad)));
    const __m256 vf =
        cvt8_ps(_mm512_add_pd(_mm512_mul_pd(b2, wide8(v + e)), _mm512_mul_pd(_mm512_mul_pd(one_b2, grad), grad)));
    _mm256_storeu_ps(m + e, mf);
    _mm256_storeu_ps(v + e, vf);
    const __m512d step = _mm512_mul_pd(lr, _mm512_div_pd(cvt8_pd(mf), bc1));
    const __m512d denom = _mm512_add_pd(sqrt8(_mm512_div_pd(cvt8_pd(vf), bc2)), eps);
    _mm256_storeu_ps(p + e, cvt8_ps(_mm512_sub_pd(w, _mm512_div_pd(step, denom))));
  }
  return e;
}

// The same, four elements at a time.
__attribute__((target("avx2"))) int64_t adamw_avx2(const AdamWScalars& s, float* p, const float* g, float* m,
                                                   float* v, int64_t begin, int64_t end) {
  const __m256d clip = _mm256_set1_pd(s.clip), keep = _mm256_set1_pd(s.keep), b1 = _mm256_set1_pd(s.beta1),
                one_b1 = _mm256_set1_pd(1 - s.beta1), b2 = _mm256_set1_pd(s.beta2),
                one_b2 = _mm256_set1_pd(1 - s.beta2), lr = _mm256_set1_pd(s.lr), bc1 = _mm256_set1_pd(s.bc1),
                bc2 = _mm256_set1_pd(s.bc2), eps = _mm256_set1_pd(s.eps);
  int64_t e = begin;
  for (; e + 4 <= end; e += 4) {
    const __m256d grad = _mm256_mul_pd(wide4(g + e), clip);
    const __m256d w = _mm256_mul_pd(wide4(p + e), keep);
    const __m128 mf = _mm256_cvtpd_ps(_mm256_add_pd(_mm256_mul_pd(b1, wide4(m + e)), _mm256_mul_pd(one_b1, grad)));
    const __m128 vf =
        _mm256_cvtpd_ps(_mm256_add_pd(_mm256_mul_pd(b2, wide4(v + e)), _mm256_mul_pd(_mm256_mul_pd(one_b2, grad), grad)));
    _mm_storeu_ps(m + e, mf);
    _mm_storeu_ps(v + e, vf);
    const __m256d step = _mm256_mul_pd(lr, _mm256_div_pd(_mm256_cvtps_pd(mf), bc1));
    const __m256d denom = _mm256_add_pd(_mm256_sqrt_pd(_mm256_div_pd(_mm256_cvtps_pd(vf), bc2)), eps);
    _mm_storeu_ps(p + e, _mm256_cvtpd_ps(_mm256_sub_pd(w, _mm256_div_pd(step, denom))));
  }
  return e;
}
#endif

}  // namespace

void adamw_f32(const AdamWScalars& s, float* p, const float* g, float* m, float* v, int64_t begin, int64_t end) {
#ifdef DLPLAN_X86_SIMD
  // Division and square root in double are the loop's cost (a scalar or
  // two-lane SSE2 division takes several cycles), so wider lanes pay even
  // though the loop also streams four arrays.
  static const bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2");
  if (avx512) begin = adamw_avx512(s, p, g, m, v, begin, end);
  else if (avx2) begin = adamw_avx2(s, p, g, m, v, begin, end);
#endif
  adamw_scalar(s, p, g, m, v, begin, end);
}

double sum_of_squares_f32(const float* x, int64_t n) {
  constexpr int64_t kChunk = int64_t{1} << 15;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks));
  parallel_for(chunks, std::max<int64_t>(1, grain_elements() / kChunk), [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      const float* chunk = x + c * kChunk;
      partial[static_cast<size_t>(c)] = lane_sum(std::min(kChunk, n - c * kChunk), [chunk](int64_t i) {
        const double d = chunk[i];
        return d * d;
      });
    }
  });
  double sum = 0;
  for (double s : partial) sum += s;
  return sum;
}

}  // namespace dlplan::exec::cpu
