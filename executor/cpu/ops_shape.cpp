// Ops that move elements without arithmetic: transpose (x.permute(perm) over
// the per-sample axes, made contiguous), slice (a range along one axis,
// strided or not) and pad (x inside a larger tensor of a constant).
// Nothing is saved; backward moves the gradient back where it came from.
#include "ops.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

namespace dlplan::exec::cpu {
namespace {

// For each element of one sample's output, in order, the offset within the
// sample of the input element it copies: output axis k walks input axis
// perm[k], so its stride is that axis's row-major stride in the input.
std::vector<int64_t> permuted_offsets(const Shape& in, const std::vector<int64_t>& perm) {
  const size_t rank = in.size();
  std::vector<int64_t> in_stride(rank, 1);
  for (size_t k = rank; k-- > 1;) in_stride[k - 1] = in_stride[k] * in[k];
  std::vector<int64_t> stride(rank);
  Shape extent(rank);
  for (size_t k = 0; k < rank; ++k) {
    stride[k] = in_stride[static_cast<size_t>(perm[k])];
    extent[k] = in[static_cast<size_t>(perm[k])];
  }
  return strided_offsets(extent, stride);
}

}  // namespace

// slice: per sample, with outer = the product of the dimensions before the
// axis, each outer row of the output is the run [start, end) of the input's
// row along the axis (and everything after it), or with a step, every
// step-th block of `inner` elements of that run.
namespace {

template <typename Fn>  // fn(out_offset, in_offset, count)
void for_each_slice_run(const OpContext& c, Fn fn) {
  const auto axis = static_cast<size_t>(c.node->attrs.integer("axis"));
  const int64_t start = c.node->attrs.integer("start"), step = c.node->attrs.integer("step");
  const Shape& in = in_shape(c, 0);
  int64_t outer = c.batch, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= in[d];
  for (size_t d = axis + 1; d < in.size(); ++d) inner *= in[d];
  const int64_t kept = out_shape(c)[axis], in_row = in[axis] * inner, out_row = kept * inner;
  for (int64_t r = 0; r < outer; ++r) {
    if (step == 1) {
      fn(r * out_row, r * in_row + start * inner, out_row);
      continue;
    }
    for (int64_t k = 0; k < kept; ++k) fn(r * out_row + k * inner, r * in_row + (start + k * step) * inner, inner);
  }
}

}  // namespace

void slice_forward(OpContext& c) {
  const float* x = c.in[0].f();
  float* y = c.out.f();
  for_each_slice_run(c, [&](int64_t o, int64_t i, int64_t n) {
    std::memcpy(y + o, x + i, static_cast<size_t>(n) * sizeof(float));
  });
}

void slice_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  for_each_slice_run(c, [&](int64_t o, int64_t i, int64_t n) {
    for (int64_t e = 0; e < n; ++e) dx[i + e] += dy[o + e];
  });
}

void transpose_forward(OpContext& c) {
  const auto off = permuted_offsets(in_shape(c, 0), c.node->attrs.ints("perm"));
  const int64_t per = static_cast<int64_t>(off.size());
  const float* x = c.in[0].f();
  float* y = c.out.f();
  for (int64_t s = 0; s < c.batch; ++s)
    for (int64_t i = 0; i < per; ++i) y[s * per + i] = x[s * per + off[static_cast<size_t>(i)]];
}

void transpose_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const auto off = permuted_offsets(in_shape(c, 0), c.node->attrs.ints("perm"));
  const int64_t per = static_cast<int64_t>(off.size());
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  for (int64_t s = 0; s < c.batch; ++s)
    for (int64_t i = 0; i < per; ++i) dx[s * per + off[static_cast<size_t>(i)]] += dy[s * per + i];
}

// pad: per sample, input element i lands at output offset base + off[i], where
// off walks the input's extents with the output's row-major strides and base
// is the output offset of the first input element (pads before each axis).
namespace {

std::vector<int64_t> padded_offsets(const Shape& in, const Shape& out, const std::vector<int64_t>& pads) {
  const size_t rank = in.size();
  std::vector<int64_t> stride(rank, 1);
  for (size_t k = rank; k-- > 1;) stride[k - 1] = stride[k] * out[k];
  int64_t base = 0;
  for (size_t k = 0; k < rank; ++k) base += pads[k] * stride[k];
  auto off = strided_offsets(in, stride);
  for (auto& o : off) o += base;
  return off;
}

}  // namespace

void pad_forward(OpContext& c) {
  const auto off = padded_offsets(in_shape(c, 0), out_shape(c), c.node->attrs.ints("pads"));
  const int64_t in_per = static_cast<int64_t>(off.size()), out_per = numel(out_shape(c));
  const float value = static_cast<float>(c.node->attrs.number("value"));
  const float* x = c.in[0].f();
  float* y = c.out.f();
  std::fill(y, y + c.batch * out_per, value);
  for (int64_t s = 0; s < c.batch; ++s)
    for (int64_t i = 0; i < in_per; ++i) y[s * out_per + off[static_cast<size_t>(i)]] = x[s * in_per + i];
}

void pad_backward(OpContext& c) {  // the gradient of the input's elements; the padding's is dropped
  if (!c.din[0].defined()) return;
  const auto off = padded_offsets(in_shape(c, 0), out_shape(c), c.node->attrs.ints("pads"));
  const int64_t in_per = static_cast<int64_t>(off.size()), out_per = numel(out_shape(c));
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  for (int64_t s = 0; s < c.batch; ++s)
    for (int64_t i = 0; i < in_per; ++i) dx[s * in_per + i] += dy[s * out_per + off[static_cast<size_t>(i)]];
}

}  // namespace dlplan::exec::cpu
