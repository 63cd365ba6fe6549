// Every op's backward against central finite differences of its forward, on
// the CPU backend (the independent reference: the forward itself, evaluated in
// double around a float perturbation). Loss L = sum(out * r) for a random r,
// so backward runs with dout = r. Each check has a control that must fail: the
// same comparison against a gradient 10% off, and a non-zero numeric gradient.
#include "op_cases.hpp"

#include "dlplan/error.hpp"
#include "dlplan/exec/trainer.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>

namespace dlplan::exec::testing {
namespace {

class OpGrad : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpGrad, MatchesFiniteDifferences) {
  const OpCase& c = GetParam();
  Allocator alloc;
  auto be = make_cpu_backend();
  OpRun run = make_run(c, alloc, 2);
  forward(*be, run);
  const std::vector<float> r = random_r(run.ctx.out.numel(), 99);
  Tensor dout = alloc.empty(run.ctx.out.shape, DType::f32, Category::workspace, "dout");
  std::copy(r.begin(), r.end(), dout.f());
  prepare_backward(run, dout);
  be->backward(run.ctx);

  // The analytic gradients (copied: finite differences re-run forward).
  struct Check {
    std::string what;
    Tensor* t;
    std::vector<float> analytic;
    bool zero = false;  // exactly zero in exact arithmetic
  };
  std::vector<Check> checks;
  for (int i : run.float_inputs) {
    const Tensor& d = run.ctx.din[static_cast<size_t>(i)];
    checks.push_back({"d input " + std::to_string(i), &run.ctx.in[static_cast<size_t>(i)],
                      std::vector<float>(d.f(), d.f() + d.numel()), input_grad_is_zero(run, static_cast<size_t>(i))});
  }
  const size_t tied = run.ctx.params.size() - run.decl.params.size();  // the tied embedding weight comes first
  for (size_t p = 0; p < run.ctx.params.size(); ++p) {
    const Tensor& d = run.ctx.dparams[p];
    const std::string suffix = p < tied ? "tied weight" : run.decl.params[p - tied].suffix;
    // Attention's k.bias adds q_i . b_k to a whole row of scores, which the
    // softmax ignores: its gradient is zero (unless RoPE rotates it per position).
    const bool zero = suffix == "k.bias" && !run.n().attrs.flag("rope");
    checks.push_back({"d " + suffix, &run.ctx.params[p], std::vector<float>(d.f(), d.f() + d.numel()), zero});
  }
  ASSERT_FALSE(checks.empty());
  for (auto& ck : checks) {
    std::vector<double> num = numeric_grad(*be, run, *ck.t, r);
    for (auto& x : num) x *= c.grad_scale;  // cross_entropy: d(step loss)/d(its mean)
    if (ck.zero) {
      for (size_t i = 0; i < num.size(); ++i) {
        EXPECT_LT(std::fabs(ck.analytic[i]), 1e-5) << c.name << ": " << ck.what;
        EXPECT_LT(std::fabs(num[i]), 5e-3) << c.name << ": " << ck.what;
      }
      continue;
    }
    const double err = rel_error(ck.analytic.data(), num);
    EXPECT_LT(err, c.tol) << c.name << ": " << ck.what;
    // Controls: the numeric gradient is not trivially zero, and a 10% error fails.
    double mx = 0;
    for (double x : num) mx = std::max(mx, std::fabs(x));
    EXPECT_GT(mx, 1e-2) << c.name << ": " << ck.what << " has a vanishing numeric gradient";
    std::vector<float> wrong = ck.analytic;
    for (auto& x : wrong) x *= 1.1f;
    EXPECT_GT(rel_error(wrong.data(), num), c.tol) << c.name << ": " << ck.what << " (control)";
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpGrad, ::testing::ValuesIn(op_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& i) { return i.param.name; });

OpCase find_case(const std::string& name) {
  for (auto& c : op_cases())
    if (c.name == name) return c;
  throw std::runtime_error("no case " + name);
}

// ---- Philox ----------------------------------------------------------------------

// Known-answer vectors of Random123 (kat_vectors, philox4x32 10 rounds).
TEST(OpPhilox, KnownAnswers) {
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const auto& k : kats) {
    uint32_t out[4];
    philox4x32_10(k.ctr, k.key, out);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], k.out[i]) << i;
  }
  // Control: one counter bit changes the output.
  uint32_t ctr[4] = {1, 0, 0, 0}, key[2] = {0, 0}, out[4];
  philox4x32_10(ctr, key, out);
  EXPECT_NE(out[0], 0x6627e8d5u);
}

TEST(OpPhilox, DropoutUniformKeying) {
  // u = out[0] / 2^32 with key = seed, counter = (element, sample, node, element >> 32).
  const uint64_t seed = 0x123456789abcdefULL;
  uint32_t ctr[4] = {7, 3, 2, 0}, key[2] = {0x89abcdefu, 0x01234567u}, out[4];
  philox4x32_10(ctr, key, out);
  EXPECT_EQ(dropout_uniform(seed, 2, 3, 7), static_cast<float>(out[0]) * 0x1p-32f);
  EXPECT_NE(dropout_uniform(seed, 2, 3, 7), dropout_uniform(seed, 2, 4, 7));  // another sample
  EXPECT_NE(dropout_uniform(seed, 2, 3, 7), dropout_uniform(seed, 1, 3, 7));  // another node
  // Uniform on [0, 1): mean ~ 1/2 over many elements.
  double sum = 0;
  for (int e = 0; e < 20000; ++e) sum += dropout_uniform(seed, 0, 0, e);
  EXPECT_NEAR(sum / 20000, 0.5, 0.01);
}

TEST(OpPhilox, BatchedUniformsEqualOneByOne) {
  // dropout_uniforms (sixteen lanes at a time where the CPU has AVX-512, eight
  // with AVX2) gives the scalar function's bits: across blocks, ragged tails,
  // a first element not a multiple of 8, and the carry of the element index
  // into its high word (inside a block and at its edge).
  const uint64_t seed = 0xfedcba9876543210ULL;
  for (const int64_t first : {int64_t{0}, int64_t{13}, int64_t{0xFFFFFFFF} - 20, int64_t{0xFFFFFFFF} - 15,
                              int64_t{0x2FFFFFFFA}})
    for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{16}, int64_t{17}, int64_t{61}, int64_t{256}}) {
      std::vector<float> u(static_cast<size_t>(n));
      dropout_uniforms(seed, 5, 9, first, n, u.data());
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(u[static_cast<size_t>(i)], dropout_uniform(seed, 5, 9, first + i)) << "first " << first << " i " << i;
    }
}

TEST(OpPhilox, FirstWordsEqualOneByOne) {
  // philox_first_words (the synthetic data's hashes) against one philox4x32_10
  // call per counter: blocks, ragged tails, and c0 wrapping past 2^32 - 1.
  const uint32_t key[2] = {0x89abcdefu, 0x01234567u};
  for (const uint32_t c0 : {0u, 1000u, 0xFFFFFFFFu - 12})
    for (const int64_t n : {int64_t{1}, int64_t{8}, int64_t{16}, int64_t{29}, int64_t{40}}) {
      std::vector<uint32_t> w(static_cast<size_t>(n));
      philox_first_words(key, c0, 7, 0, 0x0DA7A, n, w.data());
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t counter[4] = {c0 + static_cast<uint32_t>(i), 7, 0, 0x0DA7A};
        uint32_t out[4];
        philox4x32_10(counter, key, out);
        ASSERT_EQ(w[static_cast<size_t>(i)], out[0]) << "c0 " << c0 << " i " << i;
      }
    }
}

// ---- dropout ---------------------------------------------------------------------

TEST(OpDropout, MaskKeyedBySeedAndGlobalSample) {
  OpCase c = unary("dropout_big", Json::array({40, 50}), Json{{"op", "dropout"}, {"p", 0.3}});
  Allocator alloc;
  auto be = make_cpu_backend();
  OpRun a = make_run(c, alloc, 2);
  forward(*be, a);
  const int64_t n = a.ctx.in[0].numel();
  std::vector<uint8_t> mask(a.ctx.saved[0].u8(), a.ctx.saved[0].u8() + n);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    kept += mask[static_cast<size_t>(i)];
    const float want = mask[static_cast<size_t>(i)] ? a.ctx.in[0].f()[i] * static_cast<float>(1.0 / 0.7) : 0.0f;
    ASSERT_EQ(a.ctx.out.f()[i], want);
  }
  EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(n), 0.7, 0.02);

  // Gradient = mask / (1 - p), exactly.
  Tensor dout = alloc.empty(a.ctx.out.shape, DType::f32, Category::workspace, "dout");
  for (int64_t i = 0; i < n; ++i) dout.f()[i] = 1.0f;
  prepare_backward(a, dout);
  be->backward(a.ctx);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(a.ctx.din[0].f()[i], mask[static_cast<size_t>(i)] ? static_cast<float>(1.0 / 0.7) : 0.0f);

  // Control: another seed gives another mask.
  a.ctx.seed = 43;
  forward(*be, a);
  EXPECT_NE(0, std::memcmp(mask.data(), a.ctx.saved[0].u8(), static_cast<size_t>(n)));

  // Sample 1 of a batch starting at global sample 10 == sample 0 of a batch starting at 11.
  a.ctx.seed = 42;
  OpRun b = make_run(c, alloc, 1);
  b.ctx.first_sample = 11;
  std::copy(a.ctx.in[0].f() + n / 2, a.ctx.in[0].f() + n, b.ctx.in[0].f());
  forward(*be, b);
  EXPECT_EQ(0, std::memcmp(mask.data() + n / 2, b.ctx.saved[0].u8(), static_cast<size_t>(n / 2)));

  // Eval: the identity.
  a.ctx.training = false;
  forward(*be, a);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(a.ctx.out.f()[i], a.ctx.in[0].f()[i]);
}

// Stochastic depth (Hugging Face's drop_path): each sample is kept whole, scaled
// by 1 / (1 - p), or dropped whole, as floor(1 - p + u) / (1 - p) of its own
// uniform says; the gradient is that factor; out of training, the identity.
TEST(OpDropPath, WholeSamplesKeptOrDropped) {
  OpCase c = unary("drop_path_big", Json::array({6, 8}), Json{{"op", "drop_path"}, {"p", 0.25}});
  Allocator alloc;
  auto be = make_cpu_backend();
  const int64_t B = 200;
  OpRun a = make_run(c, alloc, B);
  forward(*be, a);
  const int64_t per = 48;
  const float* f = a.ctx.saved[0].f();
  int64_t kept = 0;
  for (int64_t s = 0; s < B; ++s) {
    float u = 0.0f;
    dropout_uniforms(a.ctx.seed, a.ctx.node_index, a.ctx.first_sample + s, 0, 1, &u);
    const float want = std::floor(0.75f + u) / 0.75f;
    ASSERT_EQ(f[s], want) << "sample " << s;
    kept += f[s] != 0.0f;
    for (int64_t e = 0; e < per; ++e)
      ASSERT_EQ(a.ctx.out.f()[s * per + e], a.ctx.in[0].f()[s * per + e] * want) << "sample " << s;
  }
  EXPECT_GT(kept, 0.6 * B);  // about 0.75 B: some dropped, most kept
  EXPECT_LT(kept, 0.9 * B);

  Tensor dout = alloc.empty(a.ctx.out.shape, DType::f32, Category::workspace, "dout");
  for (int64_t i = 0; i < B * per; ++i) dout.f()[i] = 1.0f;
  prepare_backward(a, dout);
  be->backward(a.ctx);
  for (int64_t i = 0; i < B * per; ++i) ASSERT_EQ(a.ctx.din[0].f()[i], f[i / per]);

  a.ctx.training = false;
  forward(*be, a);
  for (int64_t i = 0; i < B * per; ++i) ASSERT_EQ(a.ctx.out.f()[i], a.ctx.in[0].f()[i]);
}

// F.pad by hand: the input sits at (pads before) in a tensor of the value,
// element by element, per sample; the gradient is the output gradient read
// back at the same places (the padding's own is dropped).
TEST(OpPad, InputSitsAtThePadsBeforeInATensorOfTheValue) {
  OpCase c = unary("pad_hand", Json::array({2, 3, 2}),
                   Json{{"op", "pad"}, {"pads", Json::array({1, 0, 2, 0, 2, 1})}, {"value", -1.5}});
  Allocator alloc;
  auto be = make_cpu_backend();
  const int64_t B = 3, C = 2, H = 3, W = 2, Hp = 5, Wo = 5;  // [2, 3, 2] -> [3, 5, 5]
  OpRun a = make_run(c, alloc, B);
  forward(*be, a);
  const int64_t in_per = C * H * W, out_per = 3 * Hp * Wo;
  ASSERT_EQ(numel(a.ctx.out.shape), B * out_per);
  for (int64_t s = 0; s < B; ++s)
    for (int64_t o = 0; o < 3; ++o)
      for (int64_t h = 0; h < Hp; ++h)
        for (int64_t w = 0; w < Wo; ++w) {
          const int64_t ci = o - 1, hi = h, wi = w - 2;  // pads before: 1, 0, 2
          const bool inside = ci >= 0 && ci < C && hi < H && wi >= 0 && wi < W;
          const float want = inside ? a.ctx.in[0].f()[s * in_per + (ci * H + hi) * W + wi] : -1.5f;
          ASSERT_EQ(a.ctx.out.f()[s * out_per + (o * Hp + h) * Wo + w], want) << s << " " << o << " " << h << " " << w;
        }
  Tensor dout = alloc.empty(a.ctx.out.shape, DType::f32, Category::workspace, "dout");
  for (int64_t i = 0; i < B * out_per; ++i) dout.f()[i] = static_cast<float>(i);
  prepare_backward(a, dout);
  be->backward(a.ctx);
  for (int64_t s = 0; s < B; ++s)
    for (int64_t ci = 0; ci < C; ++ci)
      for (int64_t hi = 0; hi < H; ++hi)
        for (int64_t wi = 0; wi < W; ++wi)
          ASSERT_EQ(a.ctx.din[0].f()[s * in_per + (ci * H + hi) * W + wi],
                    static_cast<float>(s * out_per + ((ci + 1) * Hp + hi) * Wo + wi + 2));
}

// ---- attention: flash == math ------------------------------------------------------

// Math and flash forms of the same attention, same parameters: the same output
// (1e-5) and gradients, different saved tensors. T = 150 spans three 64-wide
// flash blocks (the last one partial).
void compare_flash_math(Json attrs, int64_t T) {
  OpCase mc = attention_case("math", attrs, false, T, 16);
  OpCase fc = attention_case("flash", attrs, true, T, 16);
  Allocator alloc;
  auto be = make_cpu_backend();
  OpRun m = make_run(mc, alloc, 2, 7), f = make_run(fc, alloc, 2, 7);
  forward(*be, m);
  forward(*be, f);
  double out_scale = 0, out_diff = 0;
  for (int64_t i = 0; i < m.ctx.out.numel(); ++i) {
    out_scale = std::max(out_scale, double{std::fabs(m.ctx.out.f()[i])});
    out_diff = std::max(out_diff, double{std::fabs(m.ctx.out.f()[i] - f.ctx.out.f()[i])});
  }
  EXPECT_LT(out_diff, 1e-5 * std::max(1.0, out_scale)) << attrs.dump();
  // Different saved tensors: probabilities [b, H, T, T] versus log-sum-exp [b, H, T].
  const int64_t H = attrs["heads"].get<int64_t>();
  ASSERT_GE(m.ctx.saved.size(), 5u);
  ASSERT_EQ(f.ctx.saved.size(), 5u);
  EXPECT_EQ(m.ctx.saved[4].numel(), 2 * H * T * T);
  EXPECT_EQ(f.ctx.saved[4].numel(), 2 * H * T);
  EXPECT_EQ(f.decl.saved.back().what, "lse");

  // lse = log sum_j exp(s_ij): from math's probabilities, lse_i = s_ij - log p_ij for any visible j (j = 0).
  // Check through the output instead: both backward passes agree.
  Tensor dout = alloc.empty(m.ctx.out.shape, DType::f32, Category::workspace, "dout");
  auto r = random_r(dout.numel(), 5);
  std::copy(r.begin(), r.end(), dout.f());
  prepare_backward(m, dout);
  prepare_backward(f, dout);
  be->backward(m.ctx);
  be->backward(f.ctx);
  // Relative to the largest gradient of all (k.bias's is zero in exact
  // arithmetic: softmax ignores a shift of a whole row of scores).
  double scale = 0;
  for (const auto& t : m.ctx.dparams)
    for (int64_t i = 0; i < t.numel(); ++i) scale = std::max(scale, double{std::fabs(t.f()[i])});
  auto compare = [&](const Tensor& a, const Tensor& b, const std::string& what) {
    double diff = 0;
    for (int64_t i = 0; i < a.numel(); ++i) diff = std::max(diff, double{std::fabs(a.f()[i] - b.f()[i])});
    EXPECT_LT(diff, 1e-5 * scale) << what << " " << attrs.dump();
  };
  EXPECT_GT(scale, 1e-2);
  compare(m.ctx.din[0], f.ctx.din[0], "dx");
  for (size_t p = 0; p < m.ctx.dparams.size(); ++p) compare(m.ctx.dparams[p], f.ctx.dparams[p], "dparam " + std::to_string(p));

  // Control: another dropout seed (or, without dropout, other inputs) changes the output.
  if (attrs.value("dropout", 0.0) > 0)
    f.ctx.seed = 77;
  else
    f.ctx.in[0].f()[0] += 1.0f;
  forward(*be, f);
  double ctl = 0;
  for (int64_t i = 0; i < m.ctx.out.numel(); ++i) ctl = std::max(ctl, double{std::fabs(m.ctx.out.f()[i] - f.ctx.out.f()[i])});
  EXPECT_GT(ctl, 1e-3);
}

TEST(OpAttention, FlashEqualsMathNonCausal) { compare_flash_math(Json{{"heads", 4}}, 150); }
TEST(OpAttention, FlashEqualsMathCausalGqaRope) {
  compare_flash_math(Json{{"heads", 4}, {"kv_heads", 2}, {"causal", true}, {"rope", true}, {"bias", false}}, 150);
}
TEST(OpAttention, FlashEqualsMathDropout) {
  compare_flash_math(Json{{"heads", 2}, {"causal", true}, {"dropout", 0.25}}, 130);
}

TEST(OpAttention, CausalIgnoresTheFuture) {
  for (bool causal : {true, false}) {
    for (bool flash : {false, true}) {
      OpCase c = attention_case("a", Json{{"heads", 2}, {"causal", causal}}, flash, 6, 8);
      Allocator alloc;
      auto be = make_cpu_backend();
      OpRun r = make_run(c, alloc, 1);
      forward(*be, r);
      std::vector<float> before(r.ctx.out.f(), r.ctx.out.f() + r.ctx.out.numel());
      for (int64_t j = 0; j < 8; ++j) r.ctx.in[0].f()[5 * 8 + j] += 1.0f;  // the last token
      forward(*be, r);
      double diff = 0;
      for (int64_t i = 0; i < 5 * 8; ++i) diff = std::max(diff, double{std::fabs(before[static_cast<size_t>(i)] - r.ctx.out.f()[i])});
      if (causal)
        EXPECT_EQ(diff, 0.0) << "flash " << flash;
      else
        EXPECT_GT(diff, 1e-3) << "flash " << flash;  // control
    }
  }
}

// RoPE against HF Llama's formula: with every token equal, q before RoPE is
// the same at every position; after it, position t holds
// (q1 cos - q2 sin, q2 cos + q1 sin) at angle t theta^(-2i/hd). Control:
// without RoPE the positions stay equal.
TEST(OpAttention, RopeRotatesLikeHfLlama) {
  for (bool rope : {false, true}) {
    OpCase c = attention_case("a", Json{{"heads", 2}, {"rope", rope}, {"rope_theta", 100.0}}, false, 4, 8);
    Allocator alloc;
    auto be = make_cpu_backend();
    OpRun r = make_run(c, alloc, 1);
    for (int64_t t = 1; t < 4; ++t)
      for (int64_t j = 0; j < 8; ++j) r.ctx.in[0].f()[t * 8 + j] = r.ctx.in[0].f()[j];
    forward(*be, r);
    const float* q = r.ctx.saved[0].f();  // [T, H hd] = [4, 8], hd = 4
    for (int64_t t = 0; t < 4; ++t)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < 2; ++i) {
          const float q1 = q[h * 4 + i], q2 = q[h * 4 + i + 2];  // position 0: unrotated
          const double ang = rope ? static_cast<double>(t) * std::pow(100.0, -2.0 * static_cast<double>(i) / 4) : 0.0;
          EXPECT_NEAR(q[t * 8 + h * 4 + i], q1 * std::cos(ang) - q2 * std::sin(ang), 1e-5);
          EXPECT_NEAR(q[t * 8 + h * 4 + i + 2], q2 * std::cos(ang) + q1 * std::sin(ang), 1e-5);
        }
    double diff = 0;
    for (int64_t j = 0; j < 8; ++j) diff = std::max(diff, double{std::fabs(q[j] - q[3 * 8 + j])});
    if (rope)
      EXPECT_GT(diff, 1e-3);
    else
      EXPECT_EQ(diff, 0.0);
  }
}

// ---- batchnorm ---------------------------------------------------------------------

TEST(OpBatchNorm, EvalUsesRunningStatsTrainingUpdatesThem) {
  OpCase c = find_case("batchnorm_2d");
  Allocator alloc;
  auto be = make_cpu_backend();
  OpRun r = make_run(c, alloc, 2);
  std::vector<float> rm(r.ctx.buffers[0].f(), r.ctx.buffers[0].f() + 3), rv(r.ctx.buffers[1].f(), r.ctx.buffers[1].f() + 3);
  r.ctx.training = false;
  forward(*be, r);
  const float* x = r.ctx.in[0].f();
  const float* g = r.ctx.params[0].f();
  const float* bta = r.ctx.params[1].f();
  for (int64_t s = 0; s < 2; ++s)
    for (int64_t ch = 0; ch < 3; ++ch)
      for (int64_t i = 0; i < 16; ++i) {
        const int64_t k = (s * 3 + ch) * 16 + i;
        const double want = (x[k] - rm[static_cast<size_t>(ch)]) / std::sqrt(rv[static_cast<size_t>(ch)] + 1e-5) * g[ch] + bta[ch];
        ASSERT_NEAR(r.ctx.out.f()[k], want, 1e-5);
      }
  EXPECT_EQ(r.ctx.buffers[0].f()[0], rm[0]);  // eval leaves the running stats alone

  // Training: batch statistics, and running = 0.9 running + 0.1 batch (unbiased var).
  r.ctx.training = true;
  forward(*be, r);
  for (int64_t ch = 0; ch < 3; ++ch) {
    double m = 0, v = 0;
    for (int64_t s = 0; s < 2; ++s)
      for (int64_t i = 0; i < 16; ++i) m += x[(s * 3 + ch) * 16 + i];
    m /= 32;
    for (int64_t s = 0; s < 2; ++s)
      for (int64_t i = 0; i < 16; ++i) v += std::pow(x[(s * 3 + ch) * 16 + i] - m, 2);
    EXPECT_NEAR(r.ctx.buffers[0].f()[ch], 0.9 * rm[static_cast<size_t>(ch)] + 0.1 * m, 1e-5);
    EXPECT_NEAR(r.ctx.buffers[1].f()[ch], 0.9 * rv[static_cast<size_t>(ch)] + 0.1 * v / 31, 1e-5);
    EXPECT_NEAR(r.ctx.saved[0].f()[ch], m, 1e-5);
    EXPECT_NEAR(r.ctx.saved[1].f()[ch], 1 / std::sqrt(v / 32 + 1e-5), 1e-4);
    EXPECT_GT(std::fabs(r.ctx.saved[0].f()[ch] - rm[static_cast<size_t>(ch)]), 1e-4);  // control: not the running mean
  }
}

// SyncBN with group_size 1 hooks equals plain BN; with two ranks (threads, a
// fake in-process collective) each holding half the batch, it equals plain BN
// over the whole batch — outputs, running stats and input gradients.
TEST(OpBatchNorm, SyncBnEqualsPlainOverTheGlobalBatch) {
  OpCase c = find_case("batchnorm_2d");
  auto be = make_cpu_backend();
  Allocator alloc;
  OpRun full = make_run(c, alloc, 4, 11);
  std::vector<std::vector<float>> running0;
  for (const auto& b : full.ctx.buffers) running0.emplace_back(b.f(), b.f() + 3);
  forward(*be, full);
  Tensor dout = alloc.empty(full.ctx.out.shape, DType::f32, Category::workspace, "dout");
  auto r = random_r(dout.numel(), 3);
  std::copy(r.begin(), r.end(), dout.f());
  prepare_backward(full, dout);
  be->backward(full.ctx);

  {  // group of one: hooks never needed, result identical
    OpRun one = make_run(c, alloc, 4, 11);
    SyncBnHooks hooks;
    hooks.group_size = 1;
    int calls = 0;
    hooks.all_gather = [&](float*, int64_t) { ++calls; };
    hooks.all_reduce_sum = [&](float*, int64_t) { ++calls; };
    one.ctx.syncbn = &hooks;
    forward(*be, one);
    prepare_backward(one, dout);
    be->backward(one.ctx);
    for (int64_t i = 0; i < full.ctx.out.numel(); ++i) ASSERT_EQ(one.ctx.out.f()[i], full.ctx.out.f()[i]);
    for (int64_t i = 0; i < full.ctx.in[0].numel(); ++i) ASSERT_EQ(one.ctx.din[0].f()[i], full.ctx.din[0].f()[i]);
    EXPECT_EQ(calls, 0);
  }

  // Two ranks: rank k holds samples 2k, 2k+1.
  const int64_t per = full.ctx.in[0].numel() / 4;
  std::vector<float> gather_buf, reduce_buf;
  std::barrier sync(2);
  std::vector<std::vector<float>> out(2), dx(2), rvar(2), dgamma(2);
  auto rank_main = [&](int rank) {
    Allocator a;
    OpRun part = make_run(c, a, 2, 11);
    std::copy(full.ctx.in[0].f() + rank * 2 * per, full.ctx.in[0].f() + (rank + 1) * 2 * per, part.ctx.in[0].f());
    for (size_t p = 0; p < 2; ++p) {
      std::copy(full.ctx.params[p].f(), full.ctx.params[p].f() + 3, part.ctx.params[p].f());
      std::copy(running0[p].begin(), running0[p].end(), part.ctx.buffers[p].f());
    }
    SyncBnHooks hooks;
    hooks.group_size = 2;
    hooks.all_gather = [&](float* buf, int64_t n) {  // slot `rank` is this rank's
      if (rank == 0) gather_buf.assign(static_cast<size_t>(2 * n), 0.0f);
      sync.arrive_and_wait();
      std::copy(buf + rank * n, buf + (rank + 1) * n, gather_buf.begin() + rank * n);
      sync.arrive_and_wait();
      std::copy(gather_buf.begin(), gather_buf.end(), buf);
      sync.arrive_and_wait();
    };
    hooks.all_reduce_sum = [&](float* buf, int64_t n) {
      if (rank == 0) reduce_buf.assign(static_cast<size_t>(n), 0.0f);
      sync.arrive_and_wait();
      if (rank == 0)
        for (int64_t i = 0; i < n; ++i) reduce_buf[static_cast<size_t>(i)] += buf[i];
      sync.arrive_and_wait();
      if (rank == 1)
        for (int64_t i = 0; i < n; ++i) reduce_buf[static_cast<size_t>(i)] += buf[i];
      sync.arrive_and_wait();
      std::copy(reduce_buf.begin(), reduce_buf.end(), buf);
      sync.arrive_and_wait();
    };
    part.ctx.syncbn = &hooks;
    forward(*be, part);
    Tensor d = a.empty(part.ctx.out.shape, DType::f32, Category::workspace, "dout");
    std::copy(dout.f() + rank * 2 * per, dout.f() + (rank + 1) * 2 * per, d.f());
    prepare_backward(part, d);
    be->backward(part.ctx);
    out[static_cast<size_t>(rank)].assign(part.ctx.out.f(), part.ctx.out.f() + 2 * per);
    dx[static_cast<size_t>(rank)].assign(part.ctx.din[0].f(), part.ctx.din[0].f() + 2 * per);
    rvar[static_cast<size_t>(rank)].assign(part.ctx.buffers[1].f(), part.ctx.buffers[1].f() + 3);
    dgamma[static_cast<size_t>(rank)].assign(part.ctx.dparams[0].f(), part.ctx.dparams[0].f() + 3);
  };
  std::thread t1(rank_main, 1);
  rank_main(0);
  t1.join();
  for (int rank = 0; rank < 2; ++rank)
    for (int64_t i = 0; i < 2 * per; ++i) {
      ASSERT_NEAR(out[static_cast<size_t>(rank)][static_cast<size_t>(i)], full.ctx.out.f()[rank * 2 * per + i], 2e-5);
      ASSERT_NEAR(dx[static_cast<size_t>(rank)][static_cast<size_t>(i)], full.ctx.din[0].f()[rank * 2 * per + i], 2e-5);
    }
  for (int64_t ch = 0; ch < 3; ++ch) {
    EXPECT_NEAR(rvar[0][static_cast<size_t>(ch)], full.ctx.buffers[1].f()[ch], 1e-5);  // running var, global count
    // Parameter gradients are local: their sum over ranks is the full batch's.
    EXPECT_NEAR(dgamma[0][static_cast<size_t>(ch)] + dgamma[1][static_cast<size_t>(ch)], full.ctx.dparams[0].f()[ch], 1e-4);
  }
  // Control: a rank's half alone (no sync) normalises differently.
  OpRun alone = make_run(c, alloc, 2, 11);
  std::copy(full.ctx.in[0].f(), full.ctx.in[0].f() + 2 * per, alone.ctx.in[0].f());
  for (size_t p = 0; p < 2; ++p) std::copy(full.ctx.params[p].f(), full.ctx.params[p].f() + 3, alone.ctx.params[p].f());
  forward(*be, alone);
  double diff = 0;
  for (int64_t i = 0; i < 2 * per; ++i) diff = std::max(diff, double{std::fabs(alone.ctx.out.f()[i] - out[0][static_cast<size_t>(i)])});
  EXPECT_GT(diff, 1e-3);
}

// ---- the rest ------------------------------------------------------------------------

TEST(OpCrossEntropy, ValueIsTheMeanNegativeLogLikelihood) {
  OpCase c = find_case("cross_entropy_TK_scaled");
  Allocator alloc;
  auto be = make_cpu_backend();
  OpRun r = make_run(c, alloc, 2);
  forward(*be, r);
  double want = 0;
  for (int64_t row = 0; row < 6; ++row) {
    const float* z = r.ctx.in[0].f() + row * 5;
    double s = 0;
    for (int j = 0; j < 5; ++j) s += std::exp(double{z[j]});
    want += std::log(s) - z[r.ctx.in[1].i()[row]];
  }
  EXPECT_NEAR(r.ctx.out.f()[0], want / 6, 1e-5);
  EXPECT_EQ(r.ctx.out.numel(), 1);
  r.ctx.in[1].i()[0] = 9;  // control: an out-of-range target is a named error
  EXPECT_THROW(forward(*be, r), dlplan::Error);
}

TEST(OpEmbedding, TiedLinearUsesTheEmbeddingWeight) {
  OpCase c = find_case("linear_tied");
  Allocator alloc;
  auto be = make_cpu_backend();
  OpRun r = make_run(c, alloc, 1);
  ASSERT_EQ(r.ctx.params.size(), 2u);  // the embedding's weight [4 x 5], then the bias
  EXPECT_EQ(r.ctx.params[0].numel(), 20);
  forward(*be, r);
  // out[t, o] = sum_i x[t, i] W[o, i] + b[o], W the embedding's [num, dim].
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t o = 0; o < 4; ++o) {
      double s = r.ctx.params[1].f()[o];
      for (int64_t i = 0; i < 5; ++i) s += double{r.ctx.in[0].f()[t * 5 + i]} * r.ctx.params[0].f()[o * 5 + i];
      EXPECT_NEAR(r.ctx.out.f()[t * 4 + o], s, 1e-5);
    }
}

TEST(OpEmbedding, OutOfRangeIdIsANamedError) {
  OpCase c = find_case("embedding");
  Allocator alloc;
  auto be = make_cpu_backend();
  OpRun r = make_run(c, alloc, 1);
  forward(*be, r);  // control: in range works
  r.ctx.in[0].i()[1] = 7;
  try {
    forward(*be, r);
    FAIL() << "no error";
  } catch (const dlplan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'op'"), std::string::npos) << e.what();
  }
}

TEST(OpPool, MaxPoolSavesArgmax) {
  OpCase c = find_case("maxpool2d_pad");
  Allocator alloc;
  auto be = make_cpu_backend();
  OpRun r = make_run(c, alloc, 1);
  forward(*be, r);
  // out [2, 4, 4]; each value is the input at its argmax, the max of its window.
  const int32_t* am = r.ctx.saved[0].i();
  for (int64_t ch = 0; ch < 2; ++ch)
    for (int64_t p = 0; p < 16; ++p)
      EXPECT_EQ(r.ctx.out.f()[ch * 16 + p], r.ctx.in[0].f()[ch * 49 + am[ch * 16 + p]]);
  // Output (0, 0): the window rows -1..1, cols -1..1 holds inputs (0,0), (0,1), (1,0), (1,1).
  int32_t best = 0;
  for (int32_t k : {1, 7, 8})
    if (r.ctx.in[0].f()[k] > r.ctx.in[0].f()[best]) best = k;
  EXPECT_EQ(am[0], best);
}

// The kernel splits each row into windows that reach the padding and a run of
// inside windows compared with selects; both must pick what one plain loop
// over each window picks (row-major, first of equals, a NaN wins), here with
// many ties (values 0..3) and NaNs, on planes large enough to have both kinds.
// The plain loop is PyTorch's rule: torch 1.13's F.max_pool2d(..., return_indices=True)
// on these five inputs gives the same argmax at all 438 outputs (checked once,
// with Debian's /usr/bin/python3).
TEST(OpPool, MaxPoolMatchesAPlainLoopWithTiesAndNaNs) {
  struct Geo {
    int64_t H, W, k, s, p;
    bool ceil;
  };
  for (const Geo geo : {Geo{13, 12, 3, 2, 1, false}, Geo{9, 14, 2, 2, 0, false}, Geo{11, 10, 3, 1, 1, false},
                        Geo{10, 11, 3, 2, 0, true}, Geo{6, 20, 5, 3, 2, false}}) {
    Json node{{"op", "maxpool2d"}, {"kernel", geo.k}, {"stride", geo.s}, {"padding", geo.p}};
    if (geo.ceil) node["ceil_mode"] = true;
    OpCase c = unary("maxpool_plain", Json::array({2, geo.H, geo.W}), node);
    Allocator alloc;
    auto be = make_cpu_backend();
    OpRun r = make_run(c, alloc, 1);
    float* x = r.ctx.in[0].f();
    for (int64_t i = 0; i < 2 * geo.H * geo.W; ++i)
      x[i] = i % 17 == 5 ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>((i * 7919) % 4);
    forward(*be, r);
    const int64_t OH = r.ctx.out.shape[r.ctx.out.shape.size() - 2], OW = r.ctx.out.shape.back();
    const int32_t* am = r.ctx.saved[0].i();
    for (int64_t ch = 0; ch < 2; ++ch)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          float best = 0;
          int64_t arg = -1;
          for (int64_t ih = oh * geo.s - geo.p; ih < oh * geo.s - geo.p + geo.k; ++ih)
            for (int64_t iw = ow * geo.s - geo.p; iw < ow * geo.s - geo.p + geo.k; ++iw) {
              if (ih < 0 || ih >= geo.H || iw < 0 || iw >= geo.W) continue;
              const float v = x[ch * geo.H * geo.W + ih * geo.W + iw];
              if (arg < 0 || v > best || std::isnan(v)) best = v, arg = ih * geo.W + iw;
            }
          const int64_t o = (ch * OH + oh) * OW + ow;
          EXPECT_EQ(am[o], arg) << "H " << geo.H << " W " << geo.W << " k " << geo.k << " at " << ch << "," << oh << ","
                                << ow;
          if (std::isnan(best))
            EXPECT_TRUE(std::isnan(r.ctx.out.f()[o]));
          else
            EXPECT_EQ(r.ctx.out.f()[o], best);
        }
  }
}

// ---- forwards against independent references --------------------------------------

TEST(OpForward, ActivationsKnownValues) {
  // Values at x = 1 and x = -0.5 (PyTorch's gelu, gelu(approximate="tanh"), silu, ...).
  struct Ref {
    Json node;
    double at1, at_m05;
  };
  const Ref refs[] = {
      {Json{{"op", "gelu"}}, 0.8413447460685429, -0.15426876153408767},
      {Json{{"op", "gelu"}, {"approximate", "tanh"}}, 0.8411919906082768, -0.15428599017272266},
      {Json{{"op", "silu"}}, 0.7310585786300049, -0.18877033439},
      {Json{{"op", "sigmoid"}}, 0.7310585786300049, 0.3775406687981454},
      {Json{{"op", "tanh"}}, 0.7615941559557649, -0.46211715726000974},
      {Json{{"op", "relu"}}, 1.0, 0.0},
      {Json{{"op", "clip"}, {"min", -0.25}, {"max", 0.75}}, 0.75, -0.25},  // F.hardtanh(x, -0.25, 0.75)
      {Json{{"op", "clip"}, {"min", 0.0}, {"max", 6.0}}, 1.0, 0.0},        // F.relu6
      {Json{{"op", "hardsigmoid"}}, 4.0 / 6.0, 2.5 / 6.0},                  // relu6(x + 3) / 6
      {Json{{"op", "hardswish"}}, 4.0 / 6.0, -0.5 * 2.5 / 6.0},             // x relu6(x + 3) / 6
  };
  auto be = make_cpu_backend();
  for (const auto& ref : refs) {
    OpCase c = unary("act", Json::array({2}), ref.node);
    Allocator alloc;
    OpRun r = make_run(c, alloc, 1);
    r.ctx.in[0].f()[0] = 1.0f;
    r.ctx.in[0].f()[1] = -0.5f;
    forward(*be, r);
    EXPECT_NEAR(r.ctx.out.f()[0], ref.at1, 1e-6) << ref.node.dump();
    EXPECT_NEAR(r.ctx.out.f()[1], ref.at_m05, 1e-6) << ref.node.dump();
  }
}

// The exact GELU (erf, vectorized: vec_math.hpp's erf_fast, 1.5e-7 absolute)
// against double precision's std::erf, forward and backward, over [-9, 9] in
// steps of 1/128: 2305 elements, so the vector loop, its tail and the rank's
// threads all run. GELU's tanh form is up to 4.7e-4 away from the exact one,
// so an approximation of that kind fails it.
TEST(OpForward, ExactGeluMatchesDoublePrecisionErf) {
  OpCase c = unary("gelu_exact", Json::array({2305}), Json{{"op", "gelu"}});
  Allocator alloc;
  auto be = make_cpu_backend();
  OpRun r = make_run(c, alloc, 1);
  const int64_t n = r.ctx.in[0].numel();
  for (int64_t i = 0; i < n; ++i) r.ctx.in[0].f()[i] = -9.0f + static_cast<float>(i) / 128.0f;
  forward(*be, r);
  Tensor dout = alloc.empty(r.ctx.out.shape, DType::f32, Category::workspace, "dout");
  for (int64_t i = 0; i < n; ++i) dout.f()[i] = 1.0f;
  prepare_backward(r, dout);
  for (int64_t i = 0; i < n; ++i) r.ctx.din[0].f()[i] = 0.0f;
  be->backward(r.ctx);
  for (int64_t i = 0; i < n; ++i) {
    const double x = r.ctx.in[0].f()[i];
    const double phi_cdf = 0.5 * (1.0 + std::erf(x / std::sqrt(2.0)));
    const double y = x * phi_cdf, dy = phi_cdf + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
    const double tol = 3e-7 * std::max(1.0, std::fabs(x));
    EXPECT_NEAR(r.ctx.out.f()[i], y, tol) << "gelu(" << x << ")";
    EXPECT_NEAR(r.ctx.din[0].f()[i], dy, tol) << "gelu'(" << x << ")";
  }
}

// clip's gradient is stopped where x <= lo or x >= hi and passes elsewhere,
// added into what dx held. The reference is PyTorch 1.13 itself:
//   x = [-1, -0.25, 0, 0.5, 0.75, 2, nan], F.hardtanh(x, -0.25, 0.75)
//   backward with dy = [1..7] gives [0, 0, 3, 4, 0, 0, 7]
// (0 at the bounds themselves, and a NaN passes its gradient). 37 elements,
// so that the vector loop and its tail both run; the finite differences
// (which stay away from the bounds) cannot see the bounds.
TEST(OpBackward, ClipPassesTheGradientStrictlyInsideItsBounds) {
  const float lo = -0.25f, hi = 0.75f;
  const float values[] = {-1.0f, lo, 0.0f, 0.5f, hi, 2.0f, std::nanf("")};
  OpCase c = unary("clip_bounds", Json::array({37}), Json{{"op", "clip"}, {"min", lo}, {"max", hi}});
  Allocator alloc;
  auto be = make_cpu_backend();
  OpRun r = make_run(c, alloc, 1);
  const int64_t n = r.ctx.in[0].numel();
  for (int64_t i = 0; i < n; ++i) r.ctx.in[0].f()[i] = values[i % 7];
  forward(*be, r);
  Tensor dout = alloc.empty(r.ctx.out.shape, DType::f32, Category::workspace, "dout");
  for (int64_t i = 0; i < n; ++i) dout.f()[i] = static_cast<float>(i + 1);
  prepare_backward(r, dout);
  for (int64_t i = 0; i < n; ++i) r.ctx.din[0].f()[i] = 0.5f;
  be->backward(r.ctx);
  for (int64_t i = 0; i < n; ++i) {
    const float v = values[i % 7];
    const bool inside = v == 0.0f || v == 0.5f || std::isnan(v);
    EXPECT_EQ(r.ctx.din[0].f()[i], 0.5f + (inside ? static_cast<float>(i + 1) : 0.0f)) << "x = " << v << " at " << i;
  }
}

// rope with interleaved pairs on x [T 3, H 2, d 4] (GPT-J's layout; the
// positions are axis -3), against the definition written out here in double:
// pair i of position t turns (x_2i, x_2i+1) by t theta^(-2i/d), the same angle
// for both heads.
TEST(OpForward, RopeInterleavedTurnsPairsByPosition) {
  const double theta = 3.0;
  OpCase c = unary("rope_pairs", Json::array({3, 2, 4}),
                   Json{{"op", "rope"}, {"theta", theta}, {"interleaved", true}, {"position_axis", -3}});
  Allocator alloc;
  auto be = make_cpu_backend();
  OpRun r = make_run(c, alloc, 2);
  const int64_t n = r.ctx.in[0].numel();
  for (int64_t e = 0; e < n; ++e) r.ctx.in[0].f()[e] = static_cast<float>(std::sin(0.7 * static_cast<double>(e) + 0.3));
  forward(*be, r);
  const float* x = r.ctx.in[0].f();
  for (int64_t s = 0; s < 2; ++s)
    for (int64_t t = 0; t < 3; ++t)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < 2; ++i) {
          const int64_t at = ((s * 3 + t) * 2 + h) * 4 + 2 * i;
          const double a = static_cast<double>(t) * std::pow(theta, -2.0 * static_cast<double>(i) / 4.0);
          EXPECT_NEAR(r.ctx.out.f()[at], x[at] * std::cos(a) - x[at + 1] * std::sin(a), 1e-6) << s << " " << t << " " << h;
          EXPECT_NEAR(r.ctx.out.f()[at + 1], x[at + 1] * std::cos(a) + x[at] * std::sin(a), 1e-6) << s << " " << t << " " << h;
        }
}

// transpose against the definition: y[s, a1, a2, a0] = x[s, a0, a1, a2] for
// perm [1, 2, 0], element by element over two samples.
TEST(OpForward, TransposeMatchesTheDefinition) {
  OpCase c = find_case("transpose_to_channels_last");  // x [3, 2, 4] -> [2, 4, 3]
  Allocator alloc;
  auto be = make_cpu_backend();
  OpRun r = make_run(c, alloc, 2);
  forward(*be, r);
  const int64_t A = 3, B = 2, C = 4;
  ASSERT_EQ(r.ctx.out.numel(), 2 * A * B * C);
  for (int64_t s = 0; s < 2; ++s)
    for (int64_t a = 0; a < A; ++a)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t k = 0; k < C; ++k)
          ASSERT_EQ(r.ctx.out.f()[((s * B + b) * C + k) * A + a], r.ctx.in[0].f()[((s * A + a) * B + b) * C + k])
              << "sample " << s << " at [" << a << ", " << b << ", " << k << "]";
}

// conv2d against the definition, in double: y[o, i, j] = b[o] + sum over the
// group's channels and the kernel of w x (zero padding).
TEST(OpForward, ConvMatchesTheDefinition) {
  OpCase c = find_case("conv2d_s2_pad_groups_rect");  // x [4, 7, 6], out 6, k [3, 2], s 2, p 1, groups 2
  Allocator alloc;
  auto be = make_cpu_backend();
  OpRun r = make_run(c, alloc, 2);
  forward(*be, r);
  const int64_t C = 4, H = 7, W = 6, O = 6, kh = 3, kw = 2, OH = 4, OW = 4, Cg = 2, Og = 3;
  ASSERT_EQ(r.ctx.out.numel(), 2 * O * OH * OW);
  const float* x = r.ctx.in[0].f();
  const float* w = r.ctx.params[0].f();
  const float* bias = r.ctx.params[1].f();
  double worst = 0;
  for (int64_t s = 0; s < 2; ++s)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < OH; ++i)
        for (int64_t j = 0; j < OW; ++j) {
          double acc = bias[o];
          const int64_t g = o / Og;
          for (int64_t cc = 0; cc < Cg; ++cc)
            for (int64_t ki = 0; ki < kh; ++ki)
              for (int64_t kj = 0; kj < kw; ++kj) {
                const int64_t ih = i * 2 - 1 + ki, iw = j * 2 - 1 + kj;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += double{w[((o * Cg + cc) * kh + ki) * kw + kj]} * x[((s * C + g * Cg + cc) * H + ih) * W + iw];
              }
          worst = std::max(worst, std::fabs(acc - r.ctx.out.f()[((s * O + o) * OH + i) * OW + j]));
        }
  EXPECT_LT(worst, 1e-5);
  // Control: groups = 1 reads other channels and gives other numbers.
  OpCase c1 = unary("conv_g1", Json::array({4, 7, 6}),
                    Json{{"op", "conv2d"}, {"out", 6}, {"kernel", Json::array({3, 2})}, {"stride", 2}, {"padding", 1}});
  OpRun r1 = make_run(c1, alloc, 2);
  std::copy(x, x + r.ctx.in[0].numel(), r1.ctx.in[0].f());
  forward(*be, r1);
  double diff = 0;
  for (int64_t i = 0; i < r.ctx.out.numel(); ++i) diff = std::max(diff, double{std::fabs(r.ctx.out.f()[i] - r1.ctx.out.f()[i])});
  EXPECT_GT(diff, 1e-2);
}

// Attention against a direct double-precision implementation of the formula
// (HF Llama-style GQA and RoPE, 1/sqrt(head_dim), causal mask), math and flash.
TEST(OpForward, AttentionMatchesTheDefinition) {
  const int64_t T = 6, D = 8, H = 4, KV = 2, hd = 3 * 2;  // head_dim 6 != D / H
  for (bool flash : {false, true}) {
    OpCase c = attention_case("a", Json{{"heads", H}, {"kv_heads", KV}, {"head_dim", hd}, {"causal", true}, {"rope", true}},
                              flash, T, D);
    Allocator alloc;
    auto be = make_cpu_backend();
    OpRun r = make_run(c, alloc, 1);
    forward(*be, r);
    const float* x = r.ctx.in[0].f();
    auto P = [&](int i) { return r.ctx.params[static_cast<size_t>(i)].f(); };
    // Projections: wq [H hd, D], wk, wv [KV hd, D], wo [D, H hd]; biases after.
    auto proj = [&](int wi, int bi, int64_t width) {
      std::vector<double> y(static_cast<size_t>(T * width));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t o = 0; o < width; ++o) {
          double acc = P(bi)[o];
          for (int64_t i = 0; i < D; ++i) acc += double{P(wi)[o * D + i]} * x[t * D + i];
          y[static_cast<size_t>(t * width + o)] = acc;
        }
      return y;
    };
    auto q = proj(0, 4, H * hd), k = proj(1, 5, KV * hd), v = proj(2, 6, KV * hd);
    auto rope = [&](std::vector<double>& a, int64_t heads) {
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t i = 0; i < hd / 2; ++i) {
            const double ang = static_cast<double>(t) * std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
            double& a1 = a[static_cast<size_t>(t * heads * hd + h * hd + i)];
            double& a2 = a[static_cast<size_t>(t * heads * hd + h * hd + i + hd / 2)];
            const double x1 = a1, x2 = a2;
            a1 = x1 * std::cos(ang) - x2 * std::sin(ang);
            a2 = x2 * std::cos(ang) + x1 * std::sin(ang);
          }
    };
    rope(q, H);
    rope(k, KV);
    std::vector<double> ctx(static_cast<size_t>(T * H * hd), 0.0);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / KV);
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(static_cast<size_t>(i + 1));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < hd; ++e)
            dot += q[static_cast<size_t>(i * H * hd + h * hd + e)] * k[static_cast<size_t>(j * KV * hd + g * hd + e)];
          s[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[static_cast<size_t>(j)]);
        }
        for (auto& e : s) sum += (e = std::exp(e - mx));
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < hd; ++e)
            ctx[static_cast<size_t>(i * H * hd + h * hd + e)] +=
                s[static_cast<size_t>(j)] / sum * v[static_cast<size_t>(j * KV * hd + g * hd + e)];
      }
    }
    double worst = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < D; ++o) {
        double acc = P(7)[o];
        for (int64_t i = 0; i < H * hd; ++i) acc += double{P(3)[o * H * hd + i]} * ctx[static_cast<size_t>(t * H * hd + i)];
        worst = std::max(worst, std::fabs(acc - r.ctx.out.f()[t * D + o]));
      }
    EXPECT_LT(worst, 1e-5) << "flash " << flash;
  }
}

TEST(OpForward, NormsMatchTheDefinition) {
  auto be = make_cpu_backend();
  for (const char* op : {"layernorm", "rmsnorm"}) {
    OpCase c = find_case(op);  // x [3, 6]
    Allocator alloc;
    OpRun r = make_run(c, alloc, 2);
    forward(*be, r);
    const bool ln = std::string(op) == "layernorm";
    const double eps = ln ? 1e-5 : 1e-6;
    double worst = 0;
    for (int64_t row = 0; row < 6; ++row) {
      const float* x = r.ctx.in[0].f() + row * 6;
      double m = 0, v = 0;
      for (int j = 0; j < 6; ++j) m += x[j];
      m = ln ? m / 6 : 0.0;
      for (int j = 0; j < 6; ++j) v += (x[j] - m) * (x[j] - m);
      const double rstd = 1 / std::sqrt(v / 6 + eps);
      for (int j = 0; j < 6; ++j) {
        const double want = (x[j] - m) * rstd * r.ctx.params[0].f()[j] + (ln ? r.ctx.params[1].f()[j] : 0.0);
        worst = std::max(worst, std::fabs(want - r.ctx.out.f()[row * 6 + j]));
      }
    }
    EXPECT_LT(worst, 1e-5) << op;
  }
}

// The CUDA engine's add is same-shape only: a broadcasting add (the importer's
// a - b of [T, D] and [T, 1]) is refused before the first step, naming the
// node and both shapes; a same-shape add is not.
TEST(OpGpuRefusal, TheGpuEngineNamesTheBroadcastingAdd) {
  const OpCase c = find_case("add_broadcast");
  const auto why = gpu_engine_lacks(parse_model(with_loss(c.ir), c.name));
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("node 'op' adds [3, 4] and [3, 1] with broadcasting"), std::string::npos) << *why;
  const OpCase same = find_case("add");
  EXPECT_FALSE(gpu_engine_lacks(parse_model(with_loss(same.ir), same.name)).has_value());
}

// groupnorm, upsample (nearest or linear), conv_transpose2d, lstm and gru run on the
// CPU engine only: a plan holding one is refused on CUDA before the first
// step, naming the node and the op; a layernorm over [C, H, W] (dims 3) runs
// on the CUDA engine's row kernels.
TEST(OpGpuRefusal, TheGpuEngineNamesGroupnormUpsampleConvTransposeAndRecurrentOps) {
  for (const char* name :
       {"groupnorm", "upsample_2x", "upsample_bilinear_2x", "conv_transpose2d_nobias", "lstm", "gru"}) {
    const OpCase c = find_case(name);
    const auto why = gpu_engine_lacks(parse_model(with_loss(c.ir), c.name));
    ASSERT_TRUE(why.has_value()) << name;
    const std::string op = c.ir["nodes"][0]["op"].get<std::string>();
    EXPECT_NE(why->find("node 'op' is a " + op + ", which the CPU engine trains"), std::string::npos) << *why;
  }
  const OpCase chw = find_case("layernorm_chw");
  EXPECT_FALSE(gpu_engine_lacks(parse_model(with_loss(chw.ir), chw.name)).has_value());
}

// A dilated convolution runs on the CPU engine only (im2col or oneDNN): its
// plan is refused on CUDA naming the node and the dilation; the undilated
// convolution is not.
TEST(OpGpuRefusal, TheGpuEngineNamesADilatedConvolution) {
  const OpCase c = find_case("conv2d_dilated_rect");
  const auto why = gpu_engine_lacks(parse_model(with_loss(c.ir), c.name));
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("node 'op' is a dilated convolution (dilation [2,3])"), std::string::npos) << *why;
  const OpCase plain = find_case("conv2d_s2_pad_groups_rect");
  EXPECT_FALSE(gpu_engine_lacks(parse_model(with_loss(plain.ir), plain.name)).has_value());
}

}  // namespace
}  // namespace dlplan::exec::testing
