// optimizer_kernels.hpp. Built with -ffp-contract=off (executor/CMakeLists.txt):
// in the AVX-512 clone GCC could fuse a multiply and an add into one FMA,
// which rounds once where the baseline rounds twice, and the clones would
// then differ in their last bits.
#include "cpu/optimizer_kernels.hpp"

#include "cpu/parallel.hpp"
#include "cpu/row_reduce.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

// The update's cost is its double divisions and square root (several cycles
// each, two lanes at a time in the baseline build's SSE2), so the loop is
// built for AVX-512 and AVX2 as well, and GCC picks the clone at load time; in
// each, GCC vectorizes it over the widest lanes.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DLPLAN_WIDE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DLPLAN_WIDE_CLONES
#endif

namespace dlplan::exec::cpu {

DLPLAN_WIDE_CLONES
void adamw_f32(const AdamWScalars& s, float* __restrict p, const float* __restrict g, float* __restrict m,
               float* __restrict v, int64_t begin, int64_t end) {
  for (int64_t e = begin; e < end; ++e) {
    const double grad = static_cast<double>(g[e]) * s.clip;
    double w = p[e] * s.keep;
    m[e] = static_cast<float>(s.beta1 * m[e] + (1 - s.beta1) * grad);
    v[e] = static_cast<float>(s.beta2 * v[e] + (1 - s.beta2) * grad * grad);
    w -= s.lr * (m[e] / s.bc1) / (std::sqrt(v[e] / s.bc2) + s.eps);
    p[e] = static_cast<float>(w);
  }
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
