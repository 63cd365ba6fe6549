#include "cpu/row_reduce.hpp"

#include "cpu/vec_math.hpp"

#include <limits>

namespace dlplan::exec::cpu {

// Eight running maxima, element by element, so that the loop is a vector max
// (a scalar reduction of floats does not vectorize without -ffast-math).
DLPLAN_SIMD_CLONES float row_max(const float* x, int64_t n) {
  float lane[8];
  for (float& l : lane) l = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lane[j] = lane[j] > x[i + j] ? lane[j] : x[i + j];
  for (int j = 0; i < n; ++i, ++j) lane[j] = lane[j] > x[i] ? lane[j] : x[i];
  float m = lane[0];
  for (int j = 1; j < 8; ++j) m = m > lane[j] ? m : lane[j];
  return m;
}

DLPLAN_SIMD_CLONES void exp_shifted(const float* x, float shift, float* out, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float d = x[j] - shift;
    out[j] = d < -87.0f ? 0.0f : exp_clamped(d);
  }
}

DLPLAN_SIMD_CLONES double exp_shifted_sum(const float* x, float shift, float* out, int64_t n) {
  exp_shifted(x, shift, out, n);
  return lane_sum(n, [out](int64_t j) { return double{out[j]}; });
}

}  // namespace dlplan::exec::cpu
