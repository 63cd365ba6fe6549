// The CUDA backend against the CPU reference: every op case of op_cases.hpp
// runs on both backends from the same random inputs, parameters and buffers
// (copied host -> device), and the forward output, every saved tensor, every
// input and parameter gradient and the buffers (BatchNorm's running
// statistics) must agree: ||cuda - cpu|| / max(||cpu||, 1e-3) < 1e-5 for fp32,
// exactly for masks and argmax, no NaN. The two allocators must also have
// counted the same bytes per category (the CUDA backend allocates exactly the
// CPU's saved tensors and temporaries). Controls: a 0.1% perturbation of the
// reference fails the same check.
//
// Without a usable GPU (or a build without CUDA) every test skips, saying why.
#include <gtest/gtest.h>

#ifndef DLPLAN_HAVE_CUDA

TEST(CudaOps, Skipped) { GTEST_SKIP() << "built without CUDA"; }

#else

#include "op_cases.hpp"

#include "dlplan/error.hpp"
#include "dlplan/exec/cuda_backend.hpp"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace dlplan::exec::testing {
namespace {

#define DLPLAN_REQUIRE_GPU()                                   \
  do {                                                         \
    std::string why_;                                          \
    if (!cuda_available(&why_)) GTEST_SKIP() << why_;          \
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

double rel_l2(const std::vector<float>& got, const std::vector<float>& ref, bool* nan) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(got[i])) *nan = true;
    num += (double{got[i]} - ref[i]) * (double{got[i]} - ref[i]);
    den += double{ref[i]} * ref[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-3);
}

std::vector<float> as_floats(const std::vector<char>& b) {
  std::vector<float> f(b.size() / 4);
  std::memcpy(f.data(), b.data(), f.size() * 4);
  return f;
}

// Compares one tensor: fp32 by relative L2 (with the control), others exactly.
void expect_same(const std::string& what, const Tensor& cuda_t, const Tensor& cpu_t) {
  ASSERT_EQ(cuda_t.defined(), cpu_t.defined()) << what;
  if (!cpu_t.defined()) return;
  ASSERT_EQ(cuda_t.shape, cpu_t.shape) << what;
  const auto got = host_bytes(cuda_t, true), ref = host_bytes(cpu_t, false);
  if (is_byte_buffer(cpu_t) || cpu_t.dtype == DType::i32) {
    EXPECT_TRUE(got == ref) << what << " differs (compared exactly)";
    return;
  }
  bool nan = false;
  const auto g = as_floats(got), r = as_floats(ref);
  const double err = rel_l2(g, r, &nan);
  EXPECT_FALSE(nan) << what << " has NaN";
  EXPECT_LT(err, kTol) << what;
  // Control: the reference 0.1% off (plus a nudge for zeros) must fail.
  std::vector<float> off = r;
  for (auto& x : off) x = x * 1.001f + 1e-3f;
  bool unused = false;
  EXPECT_GT(rel_l2(g, off, &unused), kTol) << what << " (control)";
}

class CudaOp : public ::testing::TestWithParam<OpCase> {};

TEST_P(CudaOp, MatchesCpu) {
  DLPLAN_REQUIRE_GPU();
  const OpCase& c = GetParam();
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  Allocator host;
  Allocator dev(make_cuda_plain_memory(0));

  OpRun a = make_run(c, host, 2);
  OpRun g = a;  // same model and decl; tensors replaced by device copies below
  g.alloc = &dev;
  g.ctx.alloc = &dev;
  for (auto& t : g.ctx.in) t = to_device(dev, t);
  for (auto& t : g.ctx.params) t = to_device(dev, t);
  for (auto& t : g.ctx.buffers) t = to_device(dev, t);

  forward(*cpu, a);
  forward(*gpu, g);
  const std::vector<float> r = [&] {
    std::mt19937 rng(99);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(a.ctx.out.numel()));
    for (auto& x : v) x = nd(rng);
    return v;
  }();
  Tensor dout_h = host.empty(a.ctx.out.shape, DType::f32, Category::workspace, "dout");
  std::copy(r.begin(), r.end(), dout_h.f());
  Tensor dout_d = dev.empty(a.ctx.out.shape, DType::f32, Category::workspace, "dout");
  copy_to_device(dout_d.f(), r.data(), static_cast<int64_t>(r.size() * 4));
  prepare_backward(a, dout_h);
  prepare_backward(g, dout_d);
  cpu->backward(a.ctx);
  gpu->backward(g.ctx);
  gpu->synchronize();

  expect_same(c.name + ": out", g.ctx.out, a.ctx.out);
  ASSERT_EQ(g.ctx.saved.size(), a.ctx.saved.size()) << c.name << ": saved tensors";
  for (size_t i = 0; i < a.ctx.saved.size(); ++i) {
    EXPECT_EQ(g.ctx.saved[i].storage->what, a.ctx.saved[i].storage->what) << c.name;
    expect_same(c.name + ": saved " + a.ctx.saved[i].storage->what, g.ctx.saved[i], a.ctx.saved[i]);
  }
  for (size_t i = 0; i < a.ctx.din.size(); ++i) expect_same(c.name + ": din " + std::to_string(i), g.ctx.din[i], a.ctx.din[i]);
  const size_t tied = a.ctx.params.size() - a.decl.params.size();  // a tied embedding weight comes first
  double scale = 0;  // the largest parameter gradient of the op, on the CPU
  for (const Tensor& d : a.ctx.dparams)
    for (int64_t e = 0; e < d.numel(); ++e) scale = std::max(scale, std::fabs(double{d.f()[e]}));
  for (size_t i = 0; i < a.ctx.dparams.size(); ++i) {
    const std::string what = c.name + ": dparam " + std::to_string(i);
    // Attention's k.bias gradient is zero in exact arithmetic (the softmax
    // cancels a per-row shift, ops_grad_test.cpp); both backends leave only
    // rounding noise, which a relative error would magnify: compared at the
    // scale of the op's gradients instead.
    if (i >= tied && a.decl.params[i - tied].suffix == "k.bias" && !a.n().attrs.flag("rope")) {
      const auto got = as_floats(host_bytes(g.ctx.dparams[i], true));
      for (float x : got) EXPECT_LE(std::fabs(x), 1e-5 * scale) << what << " (zero in exact arithmetic)";
      continue;
    }
    expect_same(what, g.ctx.dparams[i], a.ctx.dparams[i]);
  }
  for (size_t i = 0; i < a.ctx.buffers.size(); ++i)
    expect_same(c.name + ": buffer " + a.ctx.buffers[i].storage->what, g.ctx.buffers[i], a.ctx.buffers[i]);

  // Same allocations, category by category (the declaration's, via the CPU's).
  EXPECT_EQ(dev.allocated_total(), host.allocated_total()) << c.name;
  const auto dm = dev.max_each(), hm = host.max_each();
  for (size_t k = 0; k < hm.size(); ++k) EXPECT_EQ(dm[k], hm[k]) << c.name << ": category " << k;
  EXPECT_EQ(dev.peak(), host.peak()) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaOp, ::testing::ValuesIn(op_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& i) { return i.param.name; });

// ---- Philox: the device draws are the host's, bit for bit -------------------------

TEST(CudaOps, PhiloxBitIdentical) {
  DLPLAN_REQUIRE_GPU();
  const int64_t n = 5000;
  std::vector<float> d(static_cast<size_t>(n));
  for (const uint64_t seed : {uint64_t{0}, uint64_t{42}, uint64_t{0x123456789abcdefULL}}) {
    cuda_dropout_uniforms(seed, 3, 77, n, d.data());
    for (int64_t e = 0; e < n; ++e)
      ASSERT_EQ(d[static_cast<size_t>(e)], dropout_uniform(seed, 3, 77, e)) << "seed " << seed << " element " << e;
  }
  // Control: another sample gives other draws.
  cuda_dropout_uniforms(42, 3, 78, n, d.data());
  int same = 0;
  for (int64_t e = 0; e < n; ++e) same += d[static_cast<size_t>(e)] == dropout_uniform(42, 3, 77, e);
  EXPECT_LT(same, 10);
}

// ---- a bad token id is an error naming the node, not a crash ------------------------

TEST(CudaOps, BadTokenIdIsAnError) {
  DLPLAN_REQUIRE_GPU();
  OpCase c = op_cases().front();  // embedding, num 7
  ASSERT_EQ(c.name, "embedding");
  auto gpu = make_cuda_backend(0);
  Allocator host;
  Allocator dev(make_cuda_plain_memory(0));
  OpRun a = make_run(c, host, 2);
  a.ctx.in[0].i()[3] = 9;
  OpRun g = a;
  g.alloc = &dev;
  g.ctx.alloc = &dev;
  for (auto& t : g.ctx.in) t = to_device(dev, t);
  for (auto& t : g.ctx.params) t = to_device(dev, t);
  try {
    forward(*gpu, g);
    FAIL() << "no error for token id 9";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 9"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'op'"), std::string::npos) << e.what();
  }
}

// ---- SyncBN: hooks get device pointers; result equals the CPU's with host hooks ----

TEST(CudaOps, SyncBatchNormMatchesCpu) {
  DLPLAN_REQUIRE_GPU();
  OpCase c = unary("bn_sync", Json::array({3, 2, 2}), Json{{"op", "batchnorm"}});
  // A group of two ranks holding the same batch: the gather copies slot 0 to
  // slot 1, the all-reduce doubles. Host hooks for the CPU, device ones for CUDA.
  SyncBnHooks hh, dh;
  hh.group_size = dh.group_size = 2;
  hh.all_gather = [](float* b, int64_t n) { std::memcpy(b + n, b, static_cast<size_t>(n) * 4); };
  hh.all_reduce_sum = [](float* b, int64_t n) {
    for (int64_t i = 0; i < n; ++i) b[i] *= 2;
  };
  dh.all_gather = [](float* b, int64_t n) {
    std::vector<float> t(static_cast<size_t>(n));
    copy_to_host(t.data(), b, n * 4);
    copy_to_device(b + n, t.data(), n * 4);
  };
  dh.all_reduce_sum = [](float* b, int64_t n) {
    std::vector<float> t(static_cast<size_t>(n));
    copy_to_host(t.data(), b, n * 4);
    for (auto& x : t) x *= 2;
    copy_to_device(b, t.data(), n * 4);
    copy_to_host(t.data(), b, 4);  // waits for the copy
  };
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  Allocator host;
  Allocator dev(make_cuda_plain_memory(0));
  OpRun a = make_run(c, host, 2);
  OpRun g = a;
  g.alloc = &dev;
  g.ctx.alloc = &dev;
  for (auto& t : g.ctx.in) t = to_device(dev, t);
  for (auto& t : g.ctx.params) t = to_device(dev, t);
  for (auto& t : g.ctx.buffers) t = to_device(dev, t);
  a.ctx.syncbn = &hh;
  g.ctx.syncbn = &dh;
  forward(*cpu, a);
  forward(*gpu, g);
  std::vector<float> r(static_cast<size_t>(a.ctx.out.numel()));
  for (size_t i = 0; i < r.size(); ++i) r[i] = std::sin(static_cast<float>(i));
  Tensor dh_out = host.empty(a.ctx.out.shape, DType::f32, Category::workspace, "dout");
  std::copy(r.begin(), r.end(), dh_out.f());
  Tensor dd_out = dev.empty(a.ctx.out.shape, DType::f32, Category::workspace, "dout");
  copy_to_device(dd_out.f(), r.data(), static_cast<int64_t>(r.size() * 4));
  prepare_backward(a, dh_out);
  prepare_backward(g, dd_out);
  cpu->backward(a.ctx);
  gpu->backward(g.ctx);
  gpu->synchronize();
  expect_same("syncbn out", g.ctx.out, a.ctx.out);
  for (size_t i = 0; i < a.ctx.saved.size(); ++i) expect_same("syncbn saved", g.ctx.saved[i], a.ctx.saved[i]);
  expect_same("syncbn din", g.ctx.din[0], a.ctx.din[0]);
  for (size_t i = 0; i < 2; ++i) expect_same("syncbn dparam", g.ctx.dparams[i], a.ctx.dparams[i]);
  for (size_t i = 0; i < 2; ++i) expect_same("syncbn buffer", g.ctx.buffers[i], a.ctx.buffers[i]);
}

// ---- the optimizer's fused step and the sum of squares ------------------------------

TEST(CudaOps, OptimizerStepMatchesHostFormula) {
  DLPLAN_REQUIRE_GPU();
  const int64_t n = 1000;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> p0(n), g(n), m0(n), v0(n);
  for (int64_t i = 0; i < n; ++i) {
    p0[i] = nd(rng);
    g[i] = nd(rng);
    m0[i] = 0.1f * nd(rng);
    v0[i] = std::fabs(0.1f * nd(rng));
  }
  Allocator dev(make_cuda_plain_memory(0));
  auto up = [&](const std::vector<float>& h) {
    Tensor t = dev.empty({n}, DType::f32, Category::optimizer, "t");
    copy_to_device(t.f(), h.data(), n * 4);
    return t;
  };
  auto down = [&](const Tensor& t) {
    std::vector<float> h(static_cast<size_t>(n));
    copy_to_host(h.data(), t.f(), n * 4);
    return h;
  };
  for (const auto kind : {CudaOptimizer::adamw, CudaOptimizer::sgd, CudaOptimizer::sgd_momentum})
    for (const bool decay : {true, false}) {
      CudaOptimizerStep s;
      s.kind = kind;
      s.lr = 1e-2;
      s.weight_decay = 0.1;
      s.momentum = 0.9;
      s.t = 3;
      s.clip_scale = 0.5;
      Tensor P = up(p0), G = up(g), M = up(m0), V = up(v0);
      cuda_optimizer_step(s, decay, P.f(), G.f(), M.f(), V.f(), n, nullptr);
      const auto pg = down(P), mg = down(M), vg = down(V);
      // executor/src/optimizer.cpp's loop, on the host.
      const double bc1 = 1 - std::pow(s.beta1, 3.0), bc2 = 1 - std::pow(s.beta2, 3.0), wd = decay ? 0.1 : 0.0;
      for (int64_t e = 0; e < n; ++e) {
        float p = p0[e], m = m0[e], v = v0[e];
        const double grad = g[e] * s.clip_scale;
        if (kind == CudaOptimizer::adamw) {
          double w = p * (1.0 - s.lr * wd);
          m = static_cast<float>(s.beta1 * m + (1 - s.beta1) * grad);
          v = static_cast<float>(s.beta2 * v + (1 - s.beta2) * grad * grad);
          w -= s.lr * (m / bc1) / (std::sqrt(v / bc2) + s.eps);
          p = static_cast<float>(w);
        } else if (kind == CudaOptimizer::sgd) {
          p = static_cast<float>(p - s.lr * (grad + wd * p));
        } else {
          m = static_cast<float>(s.momentum * m + grad + wd * p);
          p = static_cast<float>(p - s.lr * m);
        }
        ASSERT_NEAR(pg[e], p, 1e-6f * (1 + std::fabs(p))) << e;
        if (kind != CudaOptimizer::sgd) {
          ASSERT_NEAR(mg[e], m, 1e-6f * (1 + std::fabs(m))) << e;
        }
        if (kind == CudaOptimizer::adamw) {
          ASSERT_NEAR(vg[e], v, 1e-6f * (1 + std::fabs(v))) << e;
        }
      }
      // Control: the step moved the parameters.
      EXPECT_NE(pg[0], p0[0]);
    }
  Tensor G = up(g);
  double ref = 0;
  for (float x : g) ref += double{x} * x;
  EXPECT_NEAR(cuda_sum_of_squares(G.f(), n, nullptr), ref, 1e-9 * ref);
}

}  // namespace
}  // namespace dlplan::exec::testing

#endif  // DLPLAN_HAVE_CUDA
