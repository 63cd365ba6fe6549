// cross_entropy: logits [R, K] (R = b x every label position), targets [R] i32.
// out (a scalar) = mean_r -log softmax(logits_r)[target_r] over this rank's
// micro-batch. Saves the fp32 probabilities [R, K]; fused (the node's "fused"
// attribute) saves one fp32 log-sum-exp per row instead and reads the kept
// logits again in backward: softmax = exp(z - lse).
#include "cpu/ops.hpp"
#include "cpu/parallel.hpp"
#include "cpu/row_reduce.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace dlplan::exec::cpu {

namespace {

// Rows of R x K per parallel range: about grain_elements() logits.
int64_t row_grain(int64_t K) { return grain_elements() / K + 1; }

}  // namespace

void cross_entropy_forward(OpContext& c) {
  const int64_t K = in_shape(c, 0).back(), R = c.batch * numel(in_shape(c, 0)) / K;
  const bool fused = c.node->attrs.flag("fused");
  Tensor kept = fused ? alloc_saved(c, {R}, DType::f32, "lse") : alloc_saved(c, {R, K}, DType::f32, "probs");
  const int32_t* t = c.in[1].i();
  for (int64_t r = 0; r < R; ++r)
    if (t[r] < 0 || t[r] >= K) op_error(c, fmt::format("target {} is outside [0, {})", t[r], K));
  // Each row's loss apart, then their sum in row order: the same bits with
  // any number of threads.
  std::vector<double> row_loss(static_cast<size_t>(R));
  parallel_for(R, row_grain(K), [&](int64_t r_begin, int64_t r_end) {
    std::vector<float> scratch(fused ? static_cast<size_t>(K) : 0);  // the fused form keeps no probabilities
    for (int64_t r = r_begin; r < r_end; ++r) {
      const float* z = c.in[0].f() + r * K;
      const float mx = row_max(z, K);
      float* p = fused ? scratch.data() : kept.f() + r * K;
      const double sum = exp_shifted_sum(z, mx, p, K);
      if (fused) {
        kept.f()[r] = static_cast<float>(mx + std::log(sum));
      } else {
        const float inv = static_cast<float>(1.0 / sum);
        for (int64_t j = 0; j < K; ++j) p[j] *= inv;
      }
      // -log p_t = log(sum) + max - z_t, without the rounding of p_t.
      row_loss[static_cast<size_t>(r)] = std::log(sum) + mx - z[t[r]];
    }
  });
  double loss = 0;
  for (const double l : row_loss) loss += l;
  c.out.f()[0] = static_cast<float>(loss / static_cast<double>(R));
  c.saved.push_back(std::move(kept));
}

// dlogits += grad_scale dout (probs - onehot(target)) / R.
void cross_entropy_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const int64_t K = in_shape(c, 0).back(), R = c.batch * numel(in_shape(c, 0)) / K;
  const float k = static_cast<float>(c.grad_scale * c.dout.f()[0] / static_cast<double>(R));
  const int32_t* t = c.in[1].i();
  float* dz = c.din[0].f();
  const bool fused = c.node->attrs.flag("fused");
  parallel_for(R, row_grain(K), [&](int64_t r_begin, int64_t r_end) {
    std::vector<float> p(fused ? static_cast<size_t>(K) : 0);
    for (int64_t r = r_begin; r < r_end; ++r) {
      const float* pr = c.saved[0].f() + r * K;
      if (fused) {  // softmax = exp(z - lse), from the kept logits
        exp_shifted(c.in[0].f() + r * K, c.saved[0].f()[r], p.data(), K);
        pr = p.data();
      }
      float* dzr = dz + r * K;
      for (int64_t j = 0; j < K; ++j) dzr[j] += k * pr[j];
      dzr[t[r]] -= k;
    }
  });
}

}  // namespace dlplan::exec::cpu
