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
// bf16-mixed (CudaOpBf16) and fp16-mixed (CudaOpF16): every op case again
// with 16-bit inputs, parameters, output and gradients on both backends (the
// same bf16 / fp16 values), compared at bf16's precision (conservative for
// fp16, which has 3 more mantissa bits), and the GPU's allocations against the
// op's declaration with 2-byte compute elements (what ops_bf16_test.cpp checks
// on the CPU).
//
// Without a usable GPU (or a build without CUDA) every test skips, saying why.
#include <gtest/gtest.h>

#ifndef DLPLAN_HAVE_CUDA

TEST(CudaOps, Skipped) { GTEST_SKIP() << "built without CUDA"; }

#else

#include "op_cases.hpp"

#include "dlplan/error.hpp"
#include "dlplan/exec/bf16.hpp"
#include "dlplan/exec/cuda_backend.hpp"
#include "dlplan/exec/trainer.hpp"

#include <algorithm>
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

// The CUDA engine does not run fine-tuning plans (LoRA adapters) in this
// version (docs/fine-tuning.md), nor what gpu_engine_lacks names (partial
// rotary, a scaled embedding, an offset RMSNorm; the trainer refuses those):
// such cases are the CPU's alone.
std::vector<OpCase> cuda_op_cases() {
  std::vector<OpCase> v = op_cases();
  std::erase_if(v, [](const OpCase& c) {
    return c.fine_tuning.active() || gpu_engine_lacks(parse_model(with_loss(c.ir), c.name)).has_value();
  });
  return v;
}

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

INSTANTIATE_TEST_SUITE_P(Ops, CudaOp, ::testing::ValuesIn(cuda_op_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& i) { return i.param.name; });

// ---- bf16-mixed and fp16-mixed: both backends store in 16 bits, compute in fp32 ---------

// Both sides widen the same bf16 values and round fp32 results back to bf16,
// but cuBLAS and OpenBLAS sum in different orders, so a stored value may land
// one bf16 step (2^-8 relative) apart, and later stages of the op read it:
// relative L2 over the tensor below 1e-2 (about 2.5 bf16 steps). fp16 (a step
// of 2^-11 relative) is held to the same bound.
constexpr double kHalfTol = 1e-2;

int64_t stored_bytes(const Tensor& t) { return is_byte_buffer(t) ? t.numel() : t.bytes(); }
const char* raw(const Tensor& t) {
  return static_cast<const char*>(t.storage->data) + t.offset * (is_byte_buffer(t) ? 1 : dtype_size(t.dtype));
}

// A device copy of a host tensor of any dtype (masks: 1 byte an element).
Tensor copy_to(Allocator& dev, const Tensor& h) {
  Tensor d = is_byte_buffer(h) ? dev.bytes_buffer(h.numel(), h.storage->category, h.storage->what)
                               : dev.empty(h.shape, h.dtype, h.storage->category, h.storage->what);
  copy_to_device(d.storage->data, raw(h), stored_bytes(h));
  return d;
}

// t's values as `half` (bf16 or f16, rounded to nearest even), a new host tensor.
Tensor narrowed(Allocator& a, const Tensor& t, DType half, Category c, const std::string& what) {
  Tensor b = a.empty(t.shape, half, c, what);
  f32_to_half(half, t.f(), b.h(), t.numel());
  return b;
}

std::vector<char> raw_bytes(const Tensor& t, bool device) {
  std::vector<char> v(static_cast<size_t>(stored_bytes(t)));
  if (device) copy_to_host(v.data(), raw(t), stored_bytes(t));
  else std::memcpy(v.data(), raw(t), v.size());
  return v;
}

// The values of an f32, bf16 or f16 tensor, as floats.
std::vector<float> values(const Tensor& t, bool device) {
  const std::vector<char> b = raw_bytes(t, device);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (is_half(t.dtype)) {
    std::vector<uint16_t> h(v.size());
    std::memcpy(h.data(), b.data(), h.size() * 2);
    half_to_f32(t.dtype, h.data(), v.data(), t.numel());
  } else {
    std::memcpy(v.data(), b.data(), v.size() * 4);
  }
  return v;
}

// One tensor, GPU against CPU under bf16- or fp16-mixed: the same dtype; masks
// and argmax exactly; floats (stored 16-bit or fp32) by relative L2 < kHalfTol.
void expect_close_half(const std::string& what, const Tensor& cuda_t, const Tensor& cpu_t) {
  ASSERT_EQ(cuda_t.defined(), cpu_t.defined()) << what;
  if (!cpu_t.defined()) return;
  ASSERT_EQ(cuda_t.shape, cpu_t.shape) << what;
  ASSERT_EQ(cuda_t.dtype, cpu_t.dtype) << what << ": stored in another dtype";
  if (is_byte_buffer(cpu_t) || cpu_t.dtype == DType::i32) {
    EXPECT_TRUE(raw_bytes(cuda_t, true) == raw_bytes(cpu_t, false)) << what << " differs (compared exactly)";
    return;
  }
  bool nan = false;
  const auto g = values(cuda_t, true), r = values(cpu_t, false);
  const double err = rel_l2(g, r, &nan);
  EXPECT_FALSE(nan) << what << " has NaN";
  EXPECT_LT(err, kHalfTol) << what;
  // Control: the reference 5% off (plus a nudge for zeros) must fail.
  std::vector<float> off = r;
  for (auto& x : off) x = x * 1.05f + 5e-2f;
  bool unused = false;
  EXPECT_GT(rel_l2(g, off, &unused), kHalfTol) << what << " (control)";
}

int64_t decl_bytes(Elem e) { return elem_bytes(e, 2); }

// One op case under a mixed precision whose storage dtype is `half` (bf16 or
// f16): GPU against CPU, and the GPU's allocations against the declaration.
void check_half_op(const OpCase& c, DType half) {
  constexpr int64_t kBatch = 2;
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  Allocator host;
  Allocator dev(make_cuda_plain_memory(0));  // counts requests as asked: the declaration's bytes exactly

  OpRun run = make_run(c, host, kBatch);
  bind(run);
  const bool loss = run.n().op == OpKind::cross_entropy;
  const DType out_dt = loss ? DType::f32 : half;  // the loss is one fp32 scalar in either precision
  OpContext a = run.ctx;  // the CPU's 16-bit context: the run's values rounded to `half`
  a.act_dtype = half;
  a.saved.clear();
  for (auto& t : a.in)
    if (t.dtype == DType::f32) t = narrowed(host, t, half, Category::workspace, "half input");
  for (auto& t : a.params) t = narrowed(host, t, half, Category::params, "half param");
  OpContext g = a;  // the GPU's: device copies of the same 16-bit values (buffers stay fp32)
  g.alloc = &dev;
  for (auto& t : g.in) t = copy_to(dev, t);
  for (auto& t : g.params) t = copy_to(dev, t);
  for (auto& t : g.buffers) t = copy_to(dev, t);
  a.out = host.empty(run.out_shape(), out_dt, Category::activations, "out");
  g.out = dev.empty(run.out_shape(), out_dt, Category::activations, "out");

  int64_t total0 = dev.allocated_total(), live0 = dlplan::total(dev.current());
  cpu->forward(a);
  gpu->forward(g);
  const int64_t fwd_alloc = dev.allocated_total() - total0, fwd_live = dlplan::total(dev.current()) - live0;

  const std::vector<float> r = [&] {
    std::mt19937 rng(99);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(a.out.numel()));
    for (auto& x : v) x = from_half(half, to_half(half, nd(rng)));  // representable: the same dout on both
    return v;
  }();
  Tensor dout_h = host.empty(a.out.shape, out_dt, Category::workspace, "dout");
  if (loss) std::copy(r.begin(), r.end(), dout_h.f());
  else f32_to_half(half, r.data(), dout_h.h(), dout_h.numel());
  a.dout = dout_h;
  g.dout = copy_to(dev, dout_h);
  a.din.clear();
  g.din.clear();
  for (size_t i = 0; i < a.in.size(); ++i) {
    const bool fl = a.in[i].dtype == half;
    a.din.push_back(fl ? host.zeros(a.in[i].shape, half, Category::workspace, "din") : Tensor{});
    g.din.push_back(fl ? dev.zeros(a.in[i].shape, half, Category::workspace, "din") : Tensor{});
  }
  a.dparams.clear();
  g.dparams.clear();
  for (const Tensor& p : a.params) {
    a.dparams.push_back(host.zeros(p.shape, half, Category::grads, "dparam"));
    g.dparams.push_back(dev.zeros(p.shape, half, Category::grads, "dparam"));
  }
  total0 = dev.allocated_total();
  live0 = dlplan::total(dev.current());
  cpu->backward(a);
  gpu->backward(g);
  gpu->synchronize();
  const int64_t bwd_alloc = dev.allocated_total() - total0, bwd_live = dlplan::total(dev.current()) - live0;

  // Values, at bf16's precision (for fp16 too).
  EXPECT_EQ(g.out.dtype, out_dt) << c.name;
  expect_close_half(c.name + ": out", g.out, a.out);
  ASSERT_EQ(g.saved.size(), a.saved.size()) << c.name << ": saved tensors";
  for (size_t i = 0; i < a.saved.size(); ++i) {
    EXPECT_EQ(g.saved[i].storage->what, a.saved[i].storage->what) << c.name;
    expect_close_half(c.name + ": saved " + a.saved[i].storage->what, g.saved[i], a.saved[i]);
  }
  for (size_t i = 0; i < a.din.size(); ++i) expect_close_half(c.name + ": din " + std::to_string(i), g.din[i], a.din[i]);
  const size_t tied = a.params.size() - run.decl.params.size();
  double scale = 0;  // the largest parameter gradient of the op, on the CPU
  for (const Tensor& d : a.dparams)
    for (float x : values(d, false)) scale = std::max(scale, std::fabs(double{x}));
  for (size_t i = 0; i < a.dparams.size(); ++i) {
    const std::string what = c.name + ": dparam " + std::to_string(i);
    // Attention's k.bias gradient: zero in exact arithmetic, rounding noise
    // here; bounded at the scale of the op's gradients (ops_bf16_test.cpp's 6%).
    if (i >= tied && run.decl.params[i - tied].suffix == "k.bias" && !run.n().attrs.flag("rope")) {
      for (float x : values(g.dparams[i], true)) EXPECT_LE(std::fabs(x), 6e-2 * scale) << what << " (zero in exact arithmetic)";
      continue;
    }
    expect_close_half(what, g.dparams[i], a.dparams[i]);
  }
  for (size_t i = 0; i < a.buffers.size(); ++i)
    expect_close_half(c.name + ": buffer " + a.buffers[i].storage->what, g.buffers[i], a.buffers[i]);

  // The GPU's allocations against the declaration, 2-byte compute elements.
  std::vector<const SavedTensor*> own;
  for (const auto& st : run.decl.saved)
    if (st.ref == SavedTensor::Ref::own) own.push_back(&st);
  ASSERT_EQ(g.saved.size(), own.size()) << c.name;
  int64_t saved_bytes = 0;
  for (size_t i = 0; i < own.size(); ++i) {
    const int64_t want = own[i]->numel * (own[i]->per_batch ? 1 : kBatch) * decl_bytes(own[i]->elem);
    EXPECT_EQ(g.saved[i].storage->bytes, want) << c.name << ": saved " << own[i]->what;
    saved_bytes += g.saved[i].storage->bytes;
  }
  int64_t fwd_temps = 0, bwd_temps = 0;
  for (const auto& t : run.decl.fwd_temps) fwd_temps += t.numel * (t.per_batch ? 1 : kBatch) * decl_bytes(t.elem);
  for (const auto& t : run.decl.bwd_temps) bwd_temps += t.numel * (t.per_batch ? 1 : kBatch) * decl_bytes(t.elem);
  EXPECT_EQ(fwd_alloc - saved_bytes, fwd_temps) << c.name << ": forward temporaries";
  EXPECT_EQ(fwd_live, saved_bytes) << c.name << ": after forward only the saved tensors are new";
  EXPECT_EQ(bwd_alloc, bwd_temps) << c.name << ": backward temporaries";
  EXPECT_EQ(bwd_live, 0) << c.name << ": backward frees its temporaries";
}

class CudaOpBf16 : public ::testing::TestWithParam<OpCase> {};

TEST_P(CudaOpBf16, MatchesCpuAndTheDeclaration) {
  DLPLAN_REQUIRE_GPU();
  check_half_op(GetParam(), DType::bf16);
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaOpBf16, ::testing::ValuesIn(cuda_op_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& i) { return i.param.name; });

class CudaOpF16 : public ::testing::TestWithParam<OpCase> {};

TEST_P(CudaOpF16, MatchesCpuAndTheDeclaration) {
  DLPLAN_REQUIRE_GPU();
  check_half_op(GetParam(), DType::f16);
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaOpF16, ::testing::ValuesIn(cuda_op_cases()),
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
