// conv2d's oneDNN lowering (executor/cpu/ops_conv_onednn.cpp) against the
// im2col + OpenBLAS lowering, which ops_grad_test checks against the
// definition and finite differences: the same inputs, weights and upstream
// gradient through both, with dx and dW holding earlier contributions (both
// lowerings accumulate). The oneDNN run allocates exactly the buffers the
// planner declares (planner/src/cpu_conv.cpp), no more.
#include "op_cases.hpp"

#include "dlplan/cpu_conv.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace dlplan::exec::testing {
namespace {

float worst_diff(const Tensor& a, const Tensor& b) {
  float worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) worst = std::max(worst, std::fabs(a.f()[i] - b.f()[i]));
  return worst;
}

int64_t declared_bytes(const std::vector<TempTensor>& temps) {
  int64_t n = 0;
  for (const TempTensor& t : temps) n += t.numel * 4;
  return n;
}

// Per case: C, H, W, out, kernel, stride, padding, groups, bias, dilation.
struct Geometry {
  const char* name;
  int64_t C, H, W, O, k, s, p, g;
  bool bias;
  int64_t d = 1;
};

TEST(OnednnConv, MatchesIm2colForwardAndBackward) {
  if (!onednn_conv_enabled()) GTEST_SKIP() << "built without oneDNN (libdnnl-dev) or DLPLAN_CPU_CONV=im2col";
  const Geometry cases[] = {
      {"3x3_pad", 16, 9, 9, 16, 3, 1, 1, 1, true},      // blocked layouts (channels a multiple of 8)
      {"7x7_s2_rgb", 3, 17, 17, 8, 7, 2, 3, 1, false},  // ResNet's stem: plain input, blocked output
      {"1x1_s2", 16, 8, 8, 24, 1, 2, 0, 1, false},      // the downsample path (a scratchpad)
      {"odd_channels", 5, 7, 6, 6, 3, 2, 1, 1, true},   // padded blocks
      {"groups", 8, 6, 6, 12, 3, 1, 1, 2, true},
      // Dilated (DeepLab's atrous convolution, VAN's): oneDNN's own dilated
      // kernels, an implementation independent of the im2col taps.
      {"dilated_2", 16, 11, 11, 16, 3, 1, 2, 1, true, 2},
      {"dilated_3_s2", 8, 13, 12, 8, 3, 2, 2, 1, false, 3},
      {"dilated_groups", 8, 9, 9, 8, 3, 1, 4, 8, true, 4},  // depthwise, extent 9 over 9 + 2 * 4
  };
  const int64_t batch = 3;
  auto be = make_cpu_backend();
  for (const Geometry& c : cases) {
    SCOPED_TRACE(c.name);
    const OpCase oc = unary(c.name, Json::array({c.C, c.H, c.W}),
                            Json{{"op", "conv2d"}, {"out", c.O}, {"kernel", c.k}, {"stride", c.s}, {"padding", c.p},
                                 {"groups", c.g}, {"bias", c.bias}, {"dilation", c.d}});
    Allocator alloc_ref, alloc_dnn;
    OpRun ref = make_run(oc, alloc_ref, batch), dnn = make_run(oc, alloc_dnn, batch);
    const Shape y = ref.model.output_of(ref.n()).shape;
    const ConvGeometry g{batch, c.C, c.H, c.W, c.O, y[1], y[2], c.k, c.k, c.s, c.s, c.p, c.p, c.g, c.bias, c.d, c.d};
    const int threads = cpu_threads_per_rank(1);
    dnn.decl.onednn_conv = true;
    auto as_temps = [](const std::vector<ConvBuffer>& bufs) {
      std::vector<TempTensor> t;
      for (const ConvBuffer& b : bufs) t.push_back({b.what, (b.bytes + 3) / 4, Elem::f32, true});
      return t;
    };
    const auto fwd = onednn_conv_forward_buffers(g, threads), bwd = onednn_conv_backward_buffers(g, threads, true, true);
    ASSERT_TRUE(fwd && bwd) << "oneDNN has a kernel for every convolution here";
    dnn.decl.fwd_temps = as_temps(*fwd);
    dnn.decl.bwd_temps = as_temps(*bwd);

    forward(*be, ref);
    const int64_t before_fwd = alloc_dnn.current()[static_cast<size_t>(Category::workspace)];
    alloc_dnn.reset_peak();
    forward(*be, dnn);
    const int64_t fwd_peak_ws = alloc_dnn.at_peak()[static_cast<size_t>(Category::workspace)] - before_fwd;
    EXPECT_EQ(fwd_peak_ws, declared_bytes(dnn.decl.fwd_temps)) << "forward allocates exactly the declared buffers";
    EXPECT_LT(worst_diff(ref.ctx.out, dnn.ctx.out), 1e-4f);

    Tensor dy = alloc_ref.empty(ref.ctx.out.shape, DType::f32, Category::workspace, "dy");
    fill(dy, Gen::normal, ref.rng);
    Tensor dy2 = alloc_dnn.empty(dy.shape, DType::f32, Category::workspace, "dy");
    std::copy(dy.f(), dy.f() + dy.numel(), dy2.f());
    prepare_backward(ref, dy);
    prepare_backward(dnn, dy2);
    // Earlier contributions that both must keep.
    for (OpRun* r : {&ref, &dnn}) {
      for (int64_t i = 0; i < r->ctx.din[0].numel(); ++i) r->ctx.din[0].f()[i] = 0.25f;
      for (auto& d : r->ctx.dparams)
        for (int64_t i = 0; i < d.numel(); ++i) d.f()[i] = -0.5f;
    }
    be->backward(ref.ctx);
    const int64_t before_bwd = alloc_dnn.current()[static_cast<size_t>(Category::workspace)];
    alloc_dnn.reset_peak();
    be->backward(dnn.ctx);
    const int64_t bwd_peak_ws = alloc_dnn.at_peak()[static_cast<size_t>(Category::workspace)] - before_bwd;
    EXPECT_EQ(bwd_peak_ws, declared_bytes(dnn.decl.bwd_temps)) << "backward allocates exactly the declared buffers";
    EXPECT_LT(worst_diff(ref.ctx.din[0], dnn.ctx.din[0]), 1e-4f);
    for (size_t k = 0; k < ref.ctx.dparams.size(); ++k)
      EXPECT_LT(worst_diff(ref.ctx.dparams[k], dnn.ctx.dparams[k]), 2e-4f) << "dparam " << k;
  }
}

}  // namespace
}  // namespace dlplan::exec::testing
