// Swin's window attention terms (ops_schema.cpp), added to the scores of
// each window [..., H, T, T]; neither keeps anything.
//   window_position_bias: y[.., h, p, q] = x[.., h, p, q] + table[idx(p, q), h],
//     idx = window_relative_index; backward dx += dy and
//     dtable[idx(p, q), h] += the sum of dy[.., h, p, q] over the batch and
//     the leading axes (the windows).
//   window_mask: y[w, h, p, q] = x[w, h, p, q] + value where
//     window_mask_hides(w, p, q); backward dx += dy.
#include "cpu/ops.hpp"
#include "cpu/parallel.hpp"

#include <vector>

namespace dlplan::exec::cpu {
namespace {

// The table row each (p, q) of a window reads, row-major over [T, T]
// (with a class token at 0: BEiT's).
std::vector<int64_t> relative_rows(const OpContext& c) {
  const auto [wh, ww] = c.node->attrs.pair("window");
  const bool cls = c.node->attrs.has("cls") && c.node->attrs.flag("cls");
  const int64_t T = wh * ww + (cls ? 1 : 0);
  std::vector<int64_t> row(static_cast<size_t>(T * T));
  for (int64_t p = 0; p < T; ++p)
    for (int64_t q = 0; q < T; ++q)
      row[static_cast<size_t>(p * T + q)] =
          cls ? window_relative_index_with_cls(p, q, wh, ww) : window_relative_index(p, q, wh, ww);
  return row;
}

}  // namespace

void window_position_bias_forward(OpContext& c) {
  const Shape& s = in_shape(c, 0);
  const int64_t T = s.back(), H = s[s.size() - 3], TT = T * T;
  const int64_t blocks = c.batch * numel(s) / (H * TT);  // every (sample, window)
  const auto row = relative_rows(c);
  std::vector<float> bias(static_cast<size_t>(H * TT));  // [H, T, T], gathered once
  const float* table = c.params[0].f();                  // [rows, H]
  for (int64_t h = 0; h < H; ++h)
    for (int64_t e = 0; e < TT; ++e) bias[static_cast<size_t>(h * TT + e)] = table[row[static_cast<size_t>(e)] * H + h];
  const float* x = c.in[0].f();
  float* y = c.out.f();
  parallel_for(blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      for (int64_t e = 0; e < H * TT; ++e) y[b * H * TT + e] = x[b * H * TT + e] + bias[static_cast<size_t>(e)];
  });
}

void window_position_bias_backward(OpContext& c) {
  const Shape& s = in_shape(c, 0);
  const int64_t T = s.back(), H = s[s.size() - 3], TT = T * T;
  const int64_t blocks = c.batch * numel(s) / (H * TT);
  const float* dy = c.dout.f();
  if (c.din[0].defined()) {
    float* dx = c.din[0].f();
    for (int64_t e = 0; e < blocks * H * TT; ++e) dx[e] += dy[e];
  }
  float* dtable = grad_or_null(c.dparams[0]);
  if (!dtable) return;  // frozen
  // Summed over the blocks first (in double: thousands of windows), then
  // scattered: each table row collects every (p, q) at its offset.
  std::vector<double> sum(static_cast<size_t>(H * TT), 0.0);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t e = 0; e < H * TT; ++e) sum[static_cast<size_t>(e)] += dy[b * H * TT + e];
  const auto row = relative_rows(c);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t e = 0; e < TT; ++e)
      dtable[row[static_cast<size_t>(e)] * H + h] += static_cast<float>(sum[static_cast<size_t>(h * TT + e)]);
}

void window_mask_forward(OpContext& c) {
  const Shape& s = in_shape(c, 0);  // [windows, H, T, T]
  const int64_t W = s[0], H = s[1], T = s[3];
  const auto windows = c.node->attrs.pair("windows"), window = c.node->attrs.pair("window");
  const auto shift = c.node->attrs.pair("shift");
  const auto value = static_cast<float>(c.node->attrs.number("value"));
  std::vector<float> add(static_cast<size_t>(W * T * T));  // [windows, T, T]
  for (int64_t w = 0; w < W; ++w)
    for (int64_t p = 0; p < T; ++p)
      for (int64_t q = 0; q < T; ++q)
        add[static_cast<size_t>((w * T + p) * T + q)] = window_mask_hides(w, p, q, windows, window, shift) ? value : 0.0f;
  const float* x = c.in[0].f();
  float* y = c.out.f();
  parallel_for(c.batch * W * H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {  // b = (sample, window, head)
      const float* m = add.data() + ((b / H) % W) * T * T;
      for (int64_t e = 0; e < T * T; ++e) y[b * T * T + e] = x[b * T * T + e] + m[e];
    }
  });
}

void window_mask_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  const int64_t n = c.batch * numel(in_shape(c, 0));
  for (int64_t e = 0; e < n; ++e) dx[e] += dy[e];
}

}  // namespace dlplan::exec::cpu
