// bf16-mixed and fp16-mixed on the CPU backend (DESIGN.md: 16-bit storage,
// fp32 arithmetic):
//  - the roundings themselves against hand-worked bit patterns;
//  - every op of op_cases.hpp run with bf16 (and again with fp16) inputs,
//    parameters, output and gradients: its gradients against central finite
//    differences of the fp32 op at the same (representable) point, at a
//    tolerance for bf16's 8-bit mantissa (fp16's 11 bits meet it with room);
//    controls: a 10% error fails, and the 16-bit gradients are not the fp32
//    ones (the run really stored in 16 bits);
//  - what each op allocates under bf16 and fp16 against its declaration with
//    2-byte compute elements (ops_decl_test.cpp does the same for fp32).
#include "op_cases.hpp"

#include "dlplan/exec/bf16.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

namespace dlplan::exec::testing {
namespace {

// ---- rounding ----------------------------------------------------------------------

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(to_bf16(-2.0f), 0xC000);
  // 1 + 2^-8 lies halfway between 1 (0x3F80, even) and 1 + 2^-7 (0x3F81): even wins.
  EXPECT_EQ(to_bf16(from_bits(0x3F808000u)), 0x3F80);
  // 1 + 3 * 2^-8 lies halfway between 0x3F81 (odd) and 0x3F82 (even): up.
  EXPECT_EQ(to_bf16(from_bits(0x3F818000u)), 0x3F82);
  // Just above halfway rounds up, just below down.
  EXPECT_EQ(to_bf16(from_bits(0x3F808001u)), 0x3F81);
  EXPECT_EQ(to_bf16(from_bits(0x3F807FFFu)), 0x3F80);
  // The largest float rounds to infinity (it is above bf16's largest finite value).
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the dropped bits stays a NaN (not infinity).
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(from_bits(0x7F800001u)))));
  // Widening is exact: every bf16 value comes back bit for bit.
  for (uint32_t h = 0; h < 0x10000u; h += 7) {
    const auto b = static_cast<uint16_t>(h);
    if (std::isnan(from_bf16(b))) continue;
    EXPECT_EQ(to_bf16(from_bf16(b)), b);
    EXPECT_EQ(bits(from_bf16(b)), h << 16);
  }
}

// IEEE binary16: 1 sign, 5 exponent, 10 mantissa bits; ties to even,
// subnormals below 2^-14, infinity from 65520 on (the value halfway between
// the largest finite 65504 and 2^16).
TEST(Fp16, RoundsToNearestEvenWithSubnormalsAndOverflow) {
  EXPECT_EQ(to_f16(1.0f), 0x3C00);
  EXPECT_EQ(to_f16(-2.0f), 0xC000);
  EXPECT_EQ(to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(to_f16(65519.0f), 0x7BFF);  // below halfway: the largest finite
  EXPECT_EQ(to_f16(65520.0f), 0x7C00);  // halfway, the even neighbour is 2^16: infinity
  EXPECT_EQ(to_f16(-1e6f), 0xFC00);
  // 1 + 2^-11 lies halfway between 1 (0x3C00, even) and 1 + 2^-10: even wins;
  // 1 + 3 * 2^-11 between 0x3C01 (odd) and 0x3C02: up.
  EXPECT_EQ(to_f16(1.0f + 0x1p-11f), 0x3C00);
  EXPECT_EQ(to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);
  EXPECT_EQ(to_f16(0x1p-14f), 0x0400);  // the smallest normal
  EXPECT_EQ(to_f16(0x1p-24f), 0x0001);  // the smallest subnormal
  EXPECT_EQ(to_f16(0x1p-25f), 0x0000);  // halfway to it: even (zero)
  EXPECT_EQ(to_f16(0x1.8p-25f), 0x0001);
  EXPECT_TRUE(std::isnan(from_f16(to_f16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(from_f16(0x7C00)));
  // Widening is exact: every finite fp16 value comes back bit for bit.
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const auto b = static_cast<uint16_t>(h);
    if (std::isnan(from_f16(b))) continue;
    ASSERT_EQ(to_f16(from_f16(b)), b) << h;
  }
  EXPECT_EQ(from_f16(0x3555), 0x1.554p-2f);  // 1/3 rounded: 0.333251953125
  EXPECT_EQ(from_f16(0x0001), 0x1p-24f);
  EXPECT_EQ(from_f16(0x03FF), 0x3FFp-24f);     // the largest subnormal
  EXPECT_EQ(from_f16(0x7BFF), 65504.0f);
  EXPECT_EQ(from_f16(0x8000), -0.0f);
  EXPECT_TRUE(std::signbit(from_f16(0x8000)));
  // Rounding, exhaustively: between each pair of neighbouring positive fp16
  // values a and b (b the next), the midpoint (exact in float) goes to the
  // even one of the two, a float just below it to a, just above to b.
  for (uint16_t lo = 0; lo < 0x7BFF; ++lo) {
    const auto hi = static_cast<uint16_t>(lo + 1);
    const float a = from_f16(lo), b = from_f16(hi), mid = (a + b) / 2;
    ASSERT_EQ(to_f16(mid), (lo & 1u) ? hi : lo) << lo;
    ASSERT_EQ(to_f16(std::nextafter(mid, 0.0f)), lo) << lo;
    ASSERT_EQ(to_f16(std::nextafter(mid, 1e9f)), hi) << lo;
    ASSERT_EQ(to_f16(-mid), static_cast<uint16_t>(0x8000u | ((lo & 1u) ? hi : lo))) << lo;
  }
}

// ---- ops ---------------------------------------------------------------------------

// A 16-bit tensor (bf16 or f16) holding t's values rounded (t itself is
// rounded in place, so the fp32 reference sees exactly the 16-bit point).
Tensor narrowed(Allocator& a, Tensor& t, DType half, Category c, const std::string& what) {
  Tensor b = a.empty(t.shape, half, c, what);
  for (int64_t i = 0; i < t.numel(); ++i) {
    b.h()[i] = to_half(half, t.f()[i]);
    t.f()[i] = from_half(half, b.h()[i]);
  }
  return b;
}

std::vector<float> widened(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (is_half(t.dtype)) half_to_f32(t.dtype, t.h(), v.data(), t.numel());
  else std::copy(t.f(), t.f() + t.numel(), v.begin());
  return v;
}

// random_r with every value representable in `half`: the same dout for both runs.
std::vector<float> representable_r(int64_t n, uint32_t seed, DType half) {
  std::vector<float> r = random_r(n, seed);
  for (auto& x : r) x = from_half(half, to_half(half, x));
  return r;
}

// bf16's relative step is 2^-8; an op chains a few roundings (attention: q, k,
// v, scores, probabilities, context, and back), each at most half a step.
constexpr double kBf16Tol = 6e-2;

// The 16-bit twin of run's context: inputs, parameters, output and gradients
// in bf16 or f16 (the loss stays an fp32 scalar), buffers as they are.
struct Bf16Run {
  OpContext ctx;
};

Bf16Run make_bf16(OpRun& run, Allocator& a, DType half) {
  Bf16Run b;
  b.ctx = run.ctx;
  b.ctx.act_dtype = half;
  b.ctx.saved.clear();
  for (size_t i = 0; i < run.ctx.in.size(); ++i)
    if (run.ctx.in[i].dtype == DType::f32)
      b.ctx.in[i] = narrowed(a, run.ctx.in[i], half, Category::workspace, "16-bit input");
  for (size_t p = 0; p < run.ctx.params.size(); ++p)
    b.ctx.params[p] = narrowed(a, run.ctx.params[p], half, Category::params, "16-bit param");
  const bool loss = run.n().op == OpKind::cross_entropy;
  b.ctx.out = a.empty(run.out_shape(), loss ? DType::f32 : half, Category::activations, "out");
  return b;
}

void prepare_bf16_backward(Bf16Run& b, Allocator& a, const std::vector<float>& r) {
  const DType half = b.ctx.act_dtype;
  const bool loss = b.ctx.out.dtype == DType::f32;
  b.ctx.dout = a.empty(b.ctx.out.shape, loss ? DType::f32 : half, Category::workspace, "dout");
  for (int64_t i = 0; i < b.ctx.dout.numel(); ++i) {
    if (loss) b.ctx.dout.f()[i] = r[static_cast<size_t>(i)];
    else b.ctx.dout.h()[i] = to_half(half, r[static_cast<size_t>(i)]);
  }
  b.ctx.din.clear();
  for (const Tensor& x : b.ctx.in)
    b.ctx.din.push_back(x.dtype == half ? a.zeros(x.shape, half, Category::workspace, "din") : Tensor{});
  b.ctx.dparams.clear();
  for (const Tensor& p : b.ctx.params) b.ctx.dparams.push_back(a.zeros(p.shape, half, Category::grads, "dparam"));
}

using HalfCase = std::tuple<OpCase, DType>;
std::string half_case_name(const ::testing::TestParamInfo<HalfCase>& i) {
  return std::get<0>(i.param).name + (std::get<1>(i.param) == DType::f16 ? "_fp16" : "_bf16");
}

class OpBf16 : public ::testing::TestWithParam<HalfCase> {};

TEST_P(OpBf16, GradientsMatchFp32FiniteDifferences) {
  const OpCase& c = std::get<0>(GetParam());
  const DType half = std::get<1>(GetParam());
  Allocator alloc;
  auto be = make_cpu_backend();
  OpRun run = make_run(c, alloc, 2);
  bind(run);
  Bf16Run b = make_bf16(run, alloc, half);  // rounds run's inputs and parameters to the 16-bit point
  be->forward(b.ctx);
  const std::vector<float> r = representable_r(b.ctx.out.numel(), 99, half);
  prepare_bf16_backward(b, alloc, r);
  be->backward(b.ctx);

  // The same op in fp32 at the same point: its own analytic gradients (the
  // control that bf16 changed something) and the finite differences.
  forward(*be, run);
  Tensor dout = alloc.empty(run.ctx.out.shape, DType::f32, Category::workspace, "dout");
  std::copy(r.begin(), r.end(), dout.f());
  prepare_backward(run, dout);
  be->backward(run.ctx);

  const size_t tied = run.ctx.params.size() - run.decl.params.size();
  bool any_differs = false;
  double scale = 0;  // the op's largest gradient, for the ones that are zero in exact arithmetic
  auto check = [&](const std::string& what, Tensor& x, const Tensor& g16, const Tensor& g32, bool zero) {
    const std::vector<float> got = widened(g16), fp32 = widened(g32);
    any_differs |= got != fp32;
    std::vector<double> num = numeric_grad(*be, run, x, r);
    for (auto& v : num) v *= c.grad_scale;
    if (zero) {
      // Attention's k.bias: the softmax cancels it exactly in exact arithmetic;
      // in bf16 only up to the rounding of the scores and of dS, so what is
      // left is bounded by the tolerance at the scale of the op's gradients.
      for (float v : got) EXPECT_LE(std::fabs(v), kBf16Tol * scale) << c.name << ": " << what;
      return;
    }
    for (double v : num) scale = std::max(scale, std::fabs(v));
    const double err = rel_error(got.data(), num);
    EXPECT_LT(err, kBf16Tol) << c.name << ": " << what;
    std::vector<float> wrong = got;
    for (auto& v : wrong) v *= 1.1f;
    EXPECT_GT(rel_error(wrong.data(), num), kBf16Tol) << c.name << ": " << what << " (control)";
  };
  for (int i : run.float_inputs)
    check("d input " + std::to_string(i), run.ctx.in[static_cast<size_t>(i)], b.ctx.din[static_cast<size_t>(i)],
          run.ctx.din[static_cast<size_t>(i)], input_grad_is_zero(run, static_cast<size_t>(i)));
  for (int pass = 0; pass < 2; ++pass)  // the exactly-zero gradients last, once the scale is known
    for (size_t p = 0; p < run.ctx.params.size(); ++p) {
      const std::string suffix = p < tied ? "tied weight" : run.decl.params[p - tied].suffix;
      const bool zero = suffix == "k.bias" && !run.n().attrs.flag("rope");
      if (zero == (pass == 1)) check("d " + suffix, run.ctx.params[p], b.ctx.dparams[p], run.ctx.dparams[p], zero);
    }
  // Ops that only move data (flatten, select, tokens, dropout's mask) give
  // the same gradients in both precisions; everything that computes differs.
  // (drop_path's case scales by 0 or 1 / (1 - 0.5) = 2, exact in both;
  // reduce_sum's gradient is the output's, repeated; a parameter is copied.)
  static const std::set<std::string> exact = {"select", "tokens", "flatten", "dropout", "dropout_p0", "drop_path",
                                              "drop_path_p0", "embedding",
                                              "cls_token", "pos_embedding", "pos_embedding_row", "pos_embedding_sinusoidal",
                                              "pos_embedding_sinusoidal_interleaved", "relu", "clip_relu6", "clip_hardtanh",
                                              "add", "causal_mask", "causal_mask_fill", "causal_mask_query_axis", "alibi", "maxpool2d_pad",
                                              "maxpool1d_pad", "maxpool1d_ceil_eager", "concat_channels", "concat_axis1",
                                              "transpose_to_channels_last", "transpose_cyclic",
                                              "reshape_split_heads", "slice_channels", "slice_middle_axis", "slice_strided",
                                              "pad_tf_same", "pad_value", "reduce_sum_axis0",
                                              "reduce_sum_keepdims", "window_mask", "parameter"};
  if (!exact.count(c.name)) {
    EXPECT_TRUE(any_differs) << c.name << ": the 16-bit run equals the fp32 one bit for bit";
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpBf16, ::testing::Combine(::testing::ValuesIn(op_cases()), ::testing::Values(DType::bf16, DType::f16)),
                         half_case_name);

// What each op allocates under bf16: its own saved tensors and temporaries at
// the declaration's size with 2-byte compute elements.
int64_t bf16_bytes(Elem e) { return elem_bytes(e, 2); }

class OpBf16Allocations : public ::testing::TestWithParam<HalfCase> {};

TEST_P(OpBf16Allocations, AllocationsMatchTheDeclaration) {
  const OpCase& c = std::get<0>(GetParam());
  const DType half = std::get<1>(GetParam());
  constexpr int64_t kBatch = 3;
  Allocator alloc;
  auto be = make_cpu_backend();
  OpRun run = make_run(c, alloc, kBatch);
  bind(run);
  Bf16Run b = make_bf16(run, alloc, half);
  int64_t total0 = alloc.allocated_total(), live0 = dlplan::total(alloc.current());
  be->forward(b.ctx);
  const int64_t fwd_alloc = alloc.allocated_total() - total0, fwd_live = dlplan::total(alloc.current()) - live0;

  std::vector<const SavedTensor*> own;
  for (const auto& s : run.decl.saved)
    if (s.ref == SavedTensor::Ref::own) own.push_back(&s);
  ASSERT_EQ(b.ctx.saved.size(), own.size()) << c.name;
  int64_t saved_bytes = 0;
  for (size_t i = 0; i < own.size(); ++i) {
    const int64_t want = own[i]->numel * (own[i]->per_batch ? 1 : kBatch) * bf16_bytes(own[i]->elem);
    EXPECT_EQ(b.ctx.saved[i].storage->bytes, want) << c.name << ": saved " << own[i]->what;
    saved_bytes += b.ctx.saved[i].storage->bytes;
  }
  int64_t fwd_temps = 0, bwd_temps = 0;
  for (const auto& t : run.decl.fwd_temps) fwd_temps += t.numel * (t.per_batch ? 1 : kBatch) * bf16_bytes(t.elem);
  for (const auto& t : run.decl.bwd_temps) bwd_temps += t.numel * (t.per_batch ? 1 : kBatch) * bf16_bytes(t.elem);
  EXPECT_EQ(fwd_alloc - saved_bytes, fwd_temps) << c.name << ": forward temporaries";
  EXPECT_EQ(fwd_live, saved_bytes) << c.name << ": after forward only the saved tensors are new";

  prepare_bf16_backward(b, alloc, representable_r(b.ctx.out.numel(), 5, half));
  total0 = alloc.allocated_total();
  live0 = dlplan::total(alloc.current());
  be->backward(b.ctx);
  EXPECT_EQ(alloc.allocated_total() - total0, bwd_temps) << c.name << ": backward temporaries";
  EXPECT_EQ(dlplan::total(alloc.current()) - live0, 0) << c.name << ": backward frees its temporaries";
}

INSTANTIATE_TEST_SUITE_P(Ops, OpBf16Allocations,
                         ::testing::Combine(::testing::ValuesIn(op_cases()), ::testing::Values(DType::bf16, DType::f16)),
                         half_case_name);

}  // namespace
}  // namespace dlplan::exec::testing
