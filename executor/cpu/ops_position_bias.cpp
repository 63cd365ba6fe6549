// T5's relative position bias (ops_schema.cpp): out[s, h, i, j] =
// weight[bucket(j - i), h] for every sample s, the buckets of
// relative_position_bucket. Backward scatters the output's gradient into the
// table: dweight[bucket(j - i), h] += sum_s dout[s, h, i, j].
#include "cpu/ops.hpp"

#include <algorithm>
#include <vector>

namespace dlplan::exec::cpu {
namespace {

struct BiasShape {
  int64_t H, B, T;
  std::vector<int64_t> bucket;  // of offset j - i, at index j - i + T - 1
};

BiasShape bias_shape(const OpContext& c) {
  const Attrs& a = c.node->attrs;
  BiasShape s{a.integer("heads"), a.integer("buckets"), in_shape(c, 0)[0], {}};
  s.bucket.resize(static_cast<size_t>(2 * s.T - 1));
  for (int64_t off = 1 - s.T; off < s.T; ++off)
    s.bucket[static_cast<size_t>(off + s.T - 1)] =
        relative_position_bucket(off, s.B, a.integer("max_distance"), a.flag("bidirectional"));
  return s;
}

}  // namespace

void relative_position_bias_forward(OpContext& c) {
  const BiasShape s = bias_shape(c);
  const float* w = c.params[0].f();  // [B, H]
  float* y = c.out.f();
  const int64_t per_sample = s.H * s.T * s.T;
  for (int64_t h = 0; h < s.H; ++h)
    for (int64_t i = 0; i < s.T; ++i)
      for (int64_t j = 0; j < s.T; ++j) y[(h * s.T + i) * s.T + j] = w[s.bucket[static_cast<size_t>(j - i + s.T - 1)] * s.H + h];
  for (int64_t b = 1; b < c.batch; ++b) std::copy(y, y + per_sample, y + b * per_sample);
}

void relative_position_bias_backward(OpContext& c) {
  float* dw = grad_or_null(c.dparams[0]);
  if (!dw) return;  // frozen
  const BiasShape s = bias_shape(c);
  const float* dy = c.dout.f();
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.T; ++i)
        for (int64_t j = 0; j < s.T; ++j)
          dw[s.bucket[static_cast<size_t>(j - i + s.T - 1)] * s.H + h] += dy[((b * s.H + h) * s.T + i) * s.T + j];
}

}  // namespace dlplan::exec::cpu
