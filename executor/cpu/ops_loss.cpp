// cross_entropy: logits [R, K] (R = b x every label position), targets [R] i32.
// out (a scalar) = mean_r -log softmax(logits_r)[target_r] over this rank's
// micro-batch. Saves the fp32 probabilities [R, K]; fused (the node's "fused"
// attribute) saves one fp32 log-sum-exp per row instead and reads the kept
// logits again in backward: softmax = exp(z - lse).
#include "cpu/ops.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace dlplan::exec::cpu {

void cross_entropy_forward(OpContext& c) {
  const int64_t K = in_shape(c, 0).back(), R = c.batch * numel(in_shape(c, 0)) / K;
  const bool fused = c.node->attrs.flag("fused");
  Tensor kept = fused ? alloc_saved(c, {R}, DType::f32, "lse") : alloc_saved(c, {R, K}, DType::f32, "probs");
  const int32_t* t = c.in[1].i();
  double loss = 0;
  for (int64_t r = 0; r < R; ++r) {
    if (t[r] < 0 || t[r] >= K) op_error(c, fmt::format("target {} is outside [0, {})", t[r], K));
    const float* z = c.in[0].f() + r * K;
    const float mx = *std::max_element(z, z + K);
    double sum = 0;
    if (fused) {
      for (int64_t j = 0; j < K; ++j) sum += std::exp(z[j] - mx);
      kept.f()[r] = static_cast<float>(mx + std::log(sum));
    } else {
      float* p = kept.f() + r * K;
      for (int64_t j = 0; j < K; ++j) {
        p[j] = std::exp(z[j] - mx);
        sum += p[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j < K; ++j) p[j] *= inv;
    }
    // -log p_t = log(sum) + max - z_t, without the rounding of p_t.
    loss += std::log(sum) + mx - z[t[r]];
  }
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
  if (c.node->attrs.flag("fused")) {
    const float* z = c.in[0].f();
    const float* lse = c.saved[0].f();
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t j = 0; j < K; ++j) dz[r * K + j] += k * std::exp(z[r * K + j] - lse[r]);
      dz[r * K + t[r]] -= k;
    }
    return;
  }
  const float* p = c.saved[0].f();
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t j = 0; j < K; ++j) dz[r * K + j] += k * p[r * K + j];
    dz[r * K + t[r]] -= k;
  }
}

}  // namespace dlplan::exec::cpu
