// The CUDA backend is deterministic: every reduction runs in a fixed order (no
// float atomics, executor/cuda/kernels.hpp), so running an op's forward and
// backward twice on identical inputs gives bit-identical outputs, saved
// tensors and gradients (memcmp). Each case exercises a reduction that used
// to be an atomic scatter or is tiled: bias column sums (linear), norm weight
// / bias gradients, embedding backward (a stable sort by id; also
// GPT-2-vocabulary-sized), max-pool backward (a gather), conv bias, flash
// attention's backward (FlashAttention-2 passes, several tiles, GQA, dropout,
// odd head sizes) and the gradient sum of squares. Every result must also
// match the CPU reference (relative L2 < 1e-5, as cuda_ops_test.cpp); where the
// GPU adds in the CPU's order (embedding, max-pool) it must equal it bit for bit.
// A bad id or label names the lowest bad row, as the CPU.
//
// Without a usable GPU (or a build without CUDA) every test skips, saying why.
#include <gtest/gtest.h>

#ifndef DLPLAN_HAVE_CUDA

TEST(CudaDeterminism, Skipped) { GTEST_SKIP() << "built without CUDA"; }

#else

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dlplan/error.hpp"
#include "dlplan/exec/cuda_backend.hpp"
#include "op_cases.hpp"

namespace dlplan::exec::testing {
namespace {

#define DLPLAN_REQUIRE_GPU()                          \
  do {                                                \
    std::string why_;                                 \
    if (!cuda_available(&why_)) GTEST_SKIP() << why_; \
  } while (0)

constexpr double kTol = 1e-5;

bool is_byte_buffer(const Tensor& t) {
  const std::string& w = t.storage->what;
  return w.size() >= 4 && w.compare(w.size() - 4, 4, "mask") == 0;
}
int64_t byte_size(const Tensor& t) { return is_byte_buffer(t) ? t.numel() : t.numel() * 4; }

Tensor to_device(Allocator& dev, const Tensor& h) {
  Tensor d = is_byte_buffer(h) ? dev.bytes_buffer(h.numel(), h.storage->category, h.storage->what)
                               : dev.empty(h.shape, h.dtype, h.storage->category, h.storage->what);
  copy_to_device(d.storage->data, static_cast<const char*>(h.storage->data) + h.offset * 4, byte_size(h));
  return d;
}

std::vector<char> host_bytes(const Tensor& t, bool device) {
  std::vector<char> v(static_cast<size_t>(byte_size(t)));
  const char* src = static_cast<const char*>(t.storage->data) + t.offset * (is_byte_buffer(t) ? 1 : 4);
  if (device)
    copy_to_host(v.data(), src, byte_size(t));
  else
    std::memcpy(v.data(), src, v.size());
  return v;
}

double rel_l2(const std::vector<char>& got_b, const std::vector<char>& ref_b, bool* nan) {
  std::vector<float> got(got_b.size() / 4), ref(ref_b.size() / 4);
  std::memcpy(got.data(), got_b.data(), got.size() * 4);
  std::memcpy(ref.data(), ref_b.data(), ref.size() * 4);
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(got[i])) *nan = true;
    num += (double{got[i]} - ref[i]) * (double{got[i]} - ref[i]);
    den += double{ref[i]} * ref[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-3);
}

// Everything one run produced, host copies in a fixed order: out, saved
// tensors, defined input gradients, parameter gradients, buffers.
struct Outputs {
  std::vector<std::string> names;
  std::vector<std::vector<char> > bytes;
  std::vector<bool> exact;  // i32 / byte buffers: compared exactly with the CPU
  void add(const std::string& name, const Tensor& t, bool device) {
    if (!t.defined()) return;
    names.push_back(name);
    bytes.push_back(host_bytes(t, device));
    exact.push_back(is_byte_buffer(t) || t.dtype == DType::i32);
  }
};

Outputs collect(const OpRun& r, bool device) {
  Outputs o;
  o.add("out", r.ctx.out, device);
  for (const auto& t : r.ctx.saved) o.add("saved " + t.storage->what, t, device);
  for (size_t i = 0; i < r.ctx.din.size(); ++i) o.add("din " + std::to_string(i), r.ctx.din[i], device);
  for (size_t i = 0; i < r.ctx.dparams.size(); ++i) o.add("dparam " + std::to_string(i), r.ctx.dparams[i], device);
  for (const auto& t : r.ctx.buffers) o.add("buffer " + t.storage->what, t, device);
  return o;
}

std::vector<float> upstream(int64_t n) {
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  return v;
}

// Forward and backward of `a`'s node on the CPU (a is run in place).
Outputs run_cpu(OpRun& a, const std::vector<float>& dout) {
  auto cpu = make_cpu_backend();
  forward(*cpu, a);
  Tensor d = a.alloc->empty(a.ctx.out.shape, DType::f32, Category::workspace, "dout");
  std::copy(dout.begin(), dout.end(), d.f());
  prepare_backward(a, d);
  cpu->backward(a.ctx);
  return collect(a, false);
}

// The same on a fresh CUDA backend, from device copies of `a`'s inputs,
// parameters and buffers (a must not have run yet).
Outputs run_gpu(const OpRun& a, const std::vector<float>& dout) {
  auto gpu = make_cuda_backend(0);
  Allocator dev(make_cuda_plain_memory(0));
  OpRun g = a;
  g.alloc = &dev;
  g.ctx.alloc = &dev;
  for (auto& t : g.ctx.in) t = to_device(dev, t);
  for (auto& t : g.ctx.params) t = to_device(dev, t);
  for (auto& t : g.ctx.buffers) t = to_device(dev, t);
  forward(*gpu, g);
  Tensor d = dev.empty(g.ctx.out.shape, DType::f32, Category::workspace, "dout");
  copy_to_device(d.f(), dout.data(), static_cast<int64_t>(dout.size() * 4));
  prepare_backward(g, d);
  gpu->backward(g.ctx);
  gpu->synchronize();
  return collect(g, true);
}

struct DetCase {
  OpCase op;
  bool cpu_exact = false;             // the GPU adds in the CPU's order: equal bit for bit
  std::function<void(OpRun&)> tweak;  // edits the host inputs after make_run
};
void PrintTo(const DetCase& c, std::ostream* os) { *os << c.op.name; }

std::vector<DetCase> det_cases() {
  auto arr = [](std::initializer_list<int64_t> l) { return Json(std::vector<int64_t>(l)); };
  auto embedding = [&](const std::string& name, int64_t ids, int64_t num, int64_t dim) {
    OpCase c;
    c.name = name;
    c.ir =
        make_ir(name, Json{{"ids", i32(arr({ids}))}},
                Json::array({Json{{"name", "op"}, {"op", "embedding"}, {"in", {"ids"}}, {"num", num}, {"dim", dim}}}));
    c.id_range["ids"] = static_cast<int>(num);
    return c;
  };
  std::vector<DetCase> v;
  auto add = [&](OpCase c, bool exact = false, std::function<void(OpRun&)> tweak = {}) {
    v.push_back(DetCase{std::move(c), exact, std::move(tweak)});
  };
  // Bias column sums over 600 rows, columns in two partial 32-wide tiles.
  add(unary("linear_rows600", arr({300, 70}), Json{{"op", "linear"}, {"out", 45}}));
  // Norm parameter gradients over 514 rows.
  add(unary("layernorm_rows514", arr({257, 96}), Json{{"op", "layernorm"}}));
  add(unary("layernorm_nobias_rows514", arr({257, 70}), Json{{"op", "layernorm"}, {"bias", false}}));
  add(unary("rmsnorm_rows600", arr({300, 70}), Json{{"op", "rmsnorm"}}));
  // Conv bias (block per channel), overlapping max-pool windows (a gather in the CPU's order).
  add(unary("conv2d_bias", arr({3, 9, 9}), Json{{"op", "conv2d"}, {"out", 5}, {"kernel", 3}, {"padding", 1}}));
  add(unary("maxpool2d_overlap", arr({3, 11, 10}),
            Json{{"op", "maxpool2d"}, {"kernel", 3}, {"stride", 1}, {"padding", 1}}, Gen::distinct),
      true);
  {
    OpCase c = unary("maxpool2d_s2_pad", arr({2, 9, 9}),
                     Json{{"op", "maxpool2d"}, {"kernel", 3}, {"stride", 2}, {"padding", 1}}, Gen::distinct);
    add(c, true);
  }
  // Embedding: 200 ids over 7 rows (long runs), 33 columns.
  {
    OpCase c = embedding("embedding_repeats", 100, 7, 33);
    add(c, true);
  }
  // GPT-2's vocabulary: 512 ids (2 x 256), most from 8 frequent ids including
  // the first and last rows, the rest spread over all 50257.
  add(embedding("embedding_gpt2_vocab", 256, 50257, 64), true, [](OpRun& r) {
    std::mt19937 rng(7);
    const int32_t frequent[] = {0, 50256, 13, 262, 11, 13, 198, 50256};
    std::uniform_int_distribution<int> pick(0, 7), any(0, 50256), coin(0, 9);
    int32_t* ids = r.ctx.in[0].i();
    for (int64_t k = 0; k < r.ctx.in[0].numel(); ++k) ids[k] = coin(rng) < 7 ? frequent[pick(rng)] : any(rng);
  });
  // Flash attention: T = 77 (3 key / query tiles of 32, the last partial).
  // Without biases: k's bias has a zero gradient (softmax ignores a shift),
  // whose rounding noise no two summation orders share. Inputs of width 16
  // keep the scores moderate (a near one-hot softmax makes dS = P (dP - D)
  // cancellation noise).
  add(attention_case("flash_hd64_T77", Json{{"heads", 2}, {"head_dim", 64}, {"bias", false}}, true, 77, 16));
  add(attention_case("flash_causal_gqa_rope_T77",
                     Json{{"heads", 4}, {"kv_heads", 2}, {"rope", true}, {"causal", true}, {"bias", false}}, true, 77,
                     128));
  add(attention_case("flash_dropout_causal_T77",
                     Json{{"heads", 2}, {"causal", true}, {"dropout", 0.2}, {"bias", false}}, true, 77, 64));
  add(attention_case("flash_head_dim3_T40", Json{{"heads", 2}, {"head_dim", 3}, {"causal", true}, {"bias", false}},
                     true, 40, 8));
  // hd 128: 16-row tiles.
  add(attention_case("flash_hd128_gqa_T50",
                     Json{{"heads", 2}, {"kv_heads", 1}, {"head_dim", 128}, {"causal", true}, {"bias", false}}, true,
                     50, 16));
  return v;
}

class CudaDeterminismOp : public ::testing::TestWithParam<DetCase> {};

TEST_P(CudaDeterminismOp, BitIdenticalTwiceAndMatchesCpu) {
  DLPLAN_REQUIRE_GPU();
  const DetCase& dc = GetParam();
  const OpCase& c = dc.op;
  Allocator host;
  OpRun a = make_run(c, host, 2);
  if (dc.tweak) dc.tweak(a);
  bind(a);
  const std::vector<float> dout = upstream([&] {
    int64_t n = 1;
    for (const int64_t e : a.out_shape()) n *= e;
    return n;
  }());

  const Outputs g1 = run_gpu(a, dout);
  const Outputs g2 = run_gpu(a, dout);
  const Outputs ref = run_cpu(a, dout);

  ASSERT_EQ(g1.names, ref.names) << c.name;
  ASSERT_EQ(g2.names, ref.names) << c.name;
  for (size_t i = 0; i < ref.names.size(); ++i) {
    const std::string what = c.name + ": " + ref.names[i];
    ASSERT_EQ(g1.bytes[i].size(), ref.bytes[i].size()) << what;
    EXPECT_TRUE(g1.bytes[i] == g2.bytes[i]) << what << " differs between two identical GPU runs";
    if (ref.exact[i] || dc.cpu_exact) {
      EXPECT_TRUE(g1.bytes[i] == ref.bytes[i]) << what << " differs from the CPU (compared exactly)";
      continue;
    }
    bool nan = false;
    const double err = rel_l2(g1.bytes[i], ref.bytes[i], &nan);
    EXPECT_FALSE(nan) << what << " has NaN";
    EXPECT_LT(err, kTol) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(CudaDeterminism, CudaDeterminismOp, ::testing::ValuesIn(det_cases()),
                         [](const ::testing::TestParamInfo<DetCase>& i) { return i.param.op.name; });

// The gradient norm's sum of squares over more elements than 1024 blocks of
// 256 cover (grid-stride, partials, then one ordered pass): the same double
// twice, and the host's sum to rounding.
TEST(CudaDeterminism, SumOfSquaresBitIdentical) {
  DLPLAN_REQUIRE_GPU();
  const int64_t n = 3'000'017;
  std::vector<float> h(static_cast<size_t>(n));
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& x : h) x = nd(rng);
  Allocator dev(make_cuda_plain_memory(0));
  Tensor t = dev.empty({n}, DType::f32, Category::grads, "g");
  copy_to_device(t.f(), h.data(), n * 4);
  const double a = cuda_sum_of_squares(t.f(), n, nullptr);
  const double b = cuda_sum_of_squares(t.f(), n, nullptr);
  EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0) << a << " vs " << b;
  double ref = 0;
  for (const float x : h) ref += double{x} * x;
  EXPECT_NEAR(a, ref, 1e-10 * ref);
}

// ---- the lowest bad row is the one reported, as on the CPU ---------------------------

TEST(CudaDeterminism, FirstBadTokenIdIsReported) {
  DLPLAN_REQUIRE_GPU();
  OpCase c;
  c.name = "embedding_bad";
  c.ir = make_ir("embedding_bad", Json{{"ids", i32(Json::array({600}))}},
                 Json::array({Json{{"name", "op"}, {"op", "embedding"}, {"in", {"ids"}}, {"num", 7}, {"dim", 4}}}));
  c.id_range["ids"] = 7;
  auto gpu = make_cuda_backend(0);
  Allocator host;
  Allocator dev(make_cuda_plain_memory(0));
  OpRun a = make_run(c, host, 2);
  // Bad ids at rows 1100, 700 and 1199 (of 1200): row 700's id is reported.
  a.ctx.in[0].i()[1100] = 8;
  a.ctx.in[0].i()[700] = 9;
  a.ctx.in[0].i()[1199] = 10;
  OpRun g = a;
  g.alloc = &dev;
  g.ctx.alloc = &dev;
  for (auto& t : g.ctx.in) t = to_device(dev, t);
  for (auto& t : g.ctx.params) t = to_device(dev, t);
  for (int rep = 0; rep < 3; ++rep) {
    try {
      forward(*gpu, g);
      FAIL() << "no error for bad token ids";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("token id 9 "), std::string::npos) << e.what();
    }
  }
  // Control: with the ids fixed the forward runs (the flag was reset).
  a.ctx.in[0].i()[1100] = a.ctx.in[0].i()[700] = a.ctx.in[0].i()[1199] = 1;
  g.ctx.in[0] = to_device(dev, a.ctx.in[0]);
  EXPECT_NO_THROW(forward(*gpu, g));
}

TEST(CudaDeterminism, FirstBadTargetIsReported) {
  DLPLAN_REQUIRE_GPU();
  OpCase c;
  c.name = "ce_bad";
  c.ir = make_ir("ce_bad", Json{{"logits", f32(Json::array({300, 5}))}, {"targets", i32(Json::array({300}))}},
                 Json::array({Json{{"name", "op"}, {"op", "cross_entropy"}, {"in", {"logits", "targets"}}}}));
  c.id_range["targets"] = 5;
  auto gpu = make_cuda_backend(0);
  Allocator host;
  Allocator dev(make_cuda_plain_memory(0));
  OpRun a = make_run(c, host, 2);
  a.ctx.in[1].i()[590] = 6;
  a.ctx.in[1].i()[301] = 7;
  a.ctx.in[1].i()[599] = -1;
  OpRun g = a;
  g.alloc = &dev;
  g.ctx.alloc = &dev;
  for (auto& t : g.ctx.in) t = to_device(dev, t);
  try {
    forward(*gpu, g);
    FAIL() << "no error for bad targets";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 7 "), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dlplan::exec::testing

#endif  // DLPLAN_HAVE_CUDA
