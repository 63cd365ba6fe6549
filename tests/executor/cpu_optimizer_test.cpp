// The CPU's optimizer loops (executor/cpu/optimizer_kernels.cpp) through
// DeviceOps: fp32 AdamW, which runs on AVX-512 or AVX2 lanes where the CPU
// has them, against AdamW's update written out here in double, one element
// at a time (Loshchilov & Hutter 2019, Algorithm 2, with Adam's bias
// corrections); and the gradients' sum of squares against a long double sum.
#include "dlplan/exec/device_ops.hpp"
#include "dlplan/exec/tensor.hpp"
#include "dlplan/training.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace dlplan::exec::testing {
namespace {

Span f32_span(std::vector<float>& x) { return Span{x.data(), static_cast<int64_t>(x.size()), DType::f32}; }

struct State {
  std::vector<float> p, g, m, v;
};

State random_state(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(-6.0f, 2.0f);  // magnitudes 1e-6 .. 1e2
  State s;
  for (int64_t e = 0; e < n; ++e) {
    const float mag = std::pow(10.0f, scale(rng));
    s.p.push_back(normal(rng));
    s.g.push_back(normal(rng) * mag);
    s.m.push_back(normal(rng) * mag * 0.1f);
    s.v.push_back(std::abs(normal(rng)) * mag * mag * 0.01f);
  }
  return s;
}

TEST(CpuOptimizer, Fp32AdamWMatchesTheUpdateWrittenOutBitForBit) {
  OptimizerConfig cfg;  // AdamW, betas 0.9 / 0.95, eps 1e-8, weight decay 0.1
  auto ops = make_cpu_device_ops();
  // Lengths around the 4- and 8-lane blocks, and one long enough for threads.
  for (const int64_t n : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{31},
                          int64_t{1000}, int64_t{300007}})
    for (const bool decay : {true, false}) {
      const OptimizerUpdate u{1e-3, 0.37, 5, decay};
      State got = random_state(n, static_cast<uint32_t>(n) * 2 + decay);
      State want = got;
      ops->optimizer_step(cfg, u, f32_span(got.p), f32_span(got.g), nullptr, got.m.data(), got.v.data());

      const double wd = decay ? cfg.weight_decay : 0.0;
      const double bc1 = 1 - std::pow(cfg.beta1, 5.0), bc2 = 1 - std::pow(cfg.beta2, 5.0);
      for (size_t e = 0; e < want.p.size(); ++e) {
        const double grad = double{want.g[e]} * u.clip_scale;
        const float m = static_cast<float>(cfg.beta1 * want.m[e] + (1 - cfg.beta1) * grad);
        const float v = static_cast<float>(cfg.beta2 * want.v[e] + (1 - cfg.beta2) * grad * grad);
        double w = want.p[e] * (1.0 - u.lr * wd);  // decoupled decay
        w -= u.lr * (m / bc1) / (std::sqrt(v / bc2) + cfg.eps);
        ASSERT_EQ(got.m[e], m) << "n " << n << " element " << e;
        ASSERT_EQ(got.v[e], v) << "n " << n << " element " << e;
        ASSERT_EQ(got.p[e], static_cast<float>(w)) << "n " << n << " element " << e << " decay " << decay;
      }
    }
}

TEST(CpuOptimizer, SumOfSquaresAgreesWithALongDoubleSum) {
  auto ops = make_cpu_device_ops();
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{9}, int64_t{32768}, int64_t{32769}, int64_t{200003}}) {
    State s = random_state(n, 7 + static_cast<uint32_t>(n));
    long double want = 2.5L;  // what the caller carries in from earlier segments
    for (float x : s.g) want += static_cast<long double>(x) * x;
    const double got = ops->sum_of_squares(f32_span(s.g), 2.5);
    EXPECT_NEAR(got, static_cast<double>(want), 1e-13 * static_cast<double>(want)) << "n " << n;
  }
}

}  // namespace
}  // namespace dlplan::exec::testing
