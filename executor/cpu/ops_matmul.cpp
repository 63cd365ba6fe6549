// The two generic ops an imported graph has outside its attention patterns:
// the product of two activations and the softmax over the last axis.
//
// matmul: a [b, ..., M, K] x c [b, ..., K, N] -> y [b, ..., M, N], the
// per-sample dimensions before the last two NumPy-broadcast (and the sample
// axis, for an input computed once per step). Backward (both
// inputs kept, ops_decl.cpp): da += dy c^T, dc += a^T dy, where a broadcast
// operand's gradient sums over the products that read it.
// softmax: y = exp(x - max) / sum; dx += y (dy - sum(dy y)), from the output.
// causal_mask: over the queries' axis (the second to last, or query_axis) and
// the keys' (the last), where key j > query i, y = x + value
// (dx += dy) or, with `fill`, y = value (dx gets nothing); elsewhere y = x.
// alibi: y[h, i, j] = x[h, i, j] + slope_h j over scores [..., H, T, Tk]; dx += dy.
// rope: x [..., T, d] rotated in pairs (i, i + d/2) by t theta^(-2i/d); dx is
// dy rotated back (the rotation's transpose).
#include "cpu/ops.hpp"
#include "cpu/parallel.hpp"
#include "cpu/row_reduce.hpp"

#include <algorithm>
#include <cmath>

namespace dlplan::exec::cpu {
namespace {

// The products of one matmul: for each of the `count` output matrices (the
// broadcast batch, samples included), which matrix of each input it reads.
struct Products {
  int64_t M = 0, N = 0, K = 0, count = 0;
  std::vector<int64_t> a_at, b_at;  // matrix index into a and b for each product
};

Products products(const OpContext& c) {
  const Shape &a = in_shape(c, 0), &b = in_shape(c, 1);
  Products p;
  p.M = a[a.size() - 2];
  p.K = a.back();
  p.N = b.back();
  // Batch shapes with the sample axis first, the per-sample ones padded with
  // leading 1s to one rank (NumPy aligns them from the last); broadcast_offsets
  // then counts matrices.
  const size_t rank = std::max(a.size(), b.size()) - 2;
  Shape ab(rank - (a.size() - 2), 1), bb(rank - (b.size() - 2), 1);
  ab.insert(ab.end(), a.begin(), a.end() - 2);
  bb.insert(bb.end(), b.begin(), b.end() - 2);
  ab.insert(ab.begin(), input_batched(c, 0) ? c.batch : 1);  // a tensor without the batch axis: broadcast
  bb.insert(bb.begin(), input_batched(c, 1) ? c.batch : 1);
  const Shape out = *broadcast_shape(ab, bb);
  p.a_at = broadcast_offsets(out, ab);
  p.b_at = broadcast_offsets(out, bb);
  p.count = numel(out);
  return p;
}

}  // namespace

void matmul_forward(OpContext& c) {
  const Products p = products(c);
  const float *a = c.in[0].f(), *b = c.in[1].f();
  float* y = c.out.f();
  parallel_for(p.count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      gemm(false, false, p.M, p.N, p.K, 1.0f, a + p.a_at[i] * p.M * p.K, p.K, b + p.b_at[i] * p.K * p.N, p.N, 0.0f,
           y + i * p.M * p.N, p.N);
  });
}

void matmul_backward(OpContext& c) {
  const Products p = products(c);
  const float *a = c.in[0].f(), *b = c.in[1].f(), *dy = c.dout.f();
  // Sequential over the products: a broadcast operand's gradient block is
  // written by several of them.
  if (c.din[0].defined())
    for (int64_t i = 0; i < p.count; ++i)  // da[M, K] += dy[M, N] b^T
      gemm(false, true, p.M, p.K, p.N, 1.0f, dy + i * p.M * p.N, p.N, b + p.b_at[i] * p.K * p.N, p.N, 1.0f,
           c.din[0].f() + p.a_at[i] * p.M * p.K, p.K);
  if (c.din[1].defined())
    for (int64_t i = 0; i < p.count; ++i)  // db[K, N] += a^T dy
      gemm(true, false, p.K, p.N, p.M, 1.0f, a + p.a_at[i] * p.M * p.K, p.K, dy + i * p.M * p.N, p.N, 1.0f,
           c.din[1].f() + p.b_at[i] * p.K * p.N, p.N);
}

void softmax_forward(OpContext& c) {
  const int64_t L = in_shape(c, 0).back(), rows = c.batch * numel(in_shape(c, 0)) / L;
  const float* x = c.in[0].f();
  float* y = c.out.f();
  parallel_for(rows, grain_elements() / L + 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * L;
      float* yr = y + r * L;
      const double sum = exp_shifted_sum(xr, row_max(xr, L), yr, L);  // row_reduce.hpp: vectorized
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j < L; ++j) yr[j] *= inv;
    }
  });
}

void softmax_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const int64_t L = in_shape(c, 0).back(), rows = c.batch * numel(in_shape(c, 0)) / L;
  const float *y = c.out.f(), *dy = c.dout.f();
  float* dx = c.din[0].f();
  parallel_for(rows, grain_elements() / L + 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float *yr = y + r * L, *dyr = dy + r * L;
      const auto dot = static_cast<float>(lane_sum(L, [&](int64_t j) { return static_cast<double>(dyr[j]) * yr[j]; }));
      float* dxr = dx + r * L;
      for (int64_t j = 0; j < L; ++j) dxr[j] += yr[j] * (dyr[j] - dot);
    }
  });
}

namespace {

// causal_mask's input as [outer, T (queries), inner, T (keys)]: inner is 1
// unless axes lie between the queries' and the keys' (GPT-BigCode's [T, H, T]).
struct CausalLayout {
  int64_t outer, T, inner;
};
CausalLayout causal_layout(const OpContext& c) {
  const Shape& s = in_shape(c, 0);
  const auto q = static_cast<size_t>(causal_query_axis(*c.node, s.size()));
  const int64_t T = s.back();
  int64_t inner = 1;
  for (size_t k = q + 1; k + 1 < s.size(); ++k) inner *= s[k];
  return {c.batch * numel(s) / (T * inner * T), T, inner};
}

}  // namespace

void causal_mask_forward(OpContext& c) {
  const CausalLayout L = causal_layout(c);
  const auto value = static_cast<float>(c.node->attrs.number("value"));
  const bool fill = c.node->attrs.flag("fill");
  const float* x = c.in[0].f();
  float* y = c.out.f();
  parallel_for(L.outer, 1, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o)
      for (int64_t i = 0; i < L.T; ++i)
        for (int64_t m = 0; m < L.inner; ++m)
          for (int64_t j = 0; j < L.T; ++j) {
            const int64_t e = ((o * L.T + i) * L.inner + m) * L.T + j;
            y[e] = j <= i ? x[e] : fill ? value : x[e] + value;
          }
  });
}

void causal_mask_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const CausalLayout L = causal_layout(c);
  const bool fill = c.node->attrs.flag("fill");
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  for (int64_t o = 0; o < L.outer; ++o)
    for (int64_t i = 0; i < L.T; ++i)
      for (int64_t m = 0; m < L.inner; ++m)
        for (int64_t j = 0; j < L.T; ++j) {
          const int64_t e = ((o * L.T + i) * L.inner + m) * L.T + j;
          if (j <= i || !fill) dx[e] += dy[e];
        }
}

void alibi_forward(OpContext& c) {
  const Shape& s = in_shape(c, 0);
  const int64_t Tk = s.back(), T = s[s.size() - 2], H = s[s.size() - 3];
  const int64_t heads_total = c.batch * numel(s) / (T * Tk);  // every (sample, leading dims, head)
  std::vector<float> slope;
  for (double v : alibi_slopes(H)) slope.push_back(static_cast<float>(v));
  const float* x = c.in[0].f();
  float* y = c.out.f();
  parallel_for(heads_total, 1, [&](int64_t begin, int64_t end) {
    for (int64_t q = begin; q < end; ++q) {
      const float m = slope[static_cast<size_t>(q % H)];
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < Tk; ++j) {
          const int64_t e = (q * T + i) * Tk + j;
          y[e] = x[e] + m * static_cast<float>(j);  // BLOOM: slopes[h] * arange, fp32
        }
    }
  });
}

void alibi_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const float* dy = c.dout.f();
  float* dx = c.din[0].f();
  const int64_t n = c.batch * numel(in_shape(c, 0));
  for (int64_t e = 0; e < n; ++e) dx[e] += dy[e];
}

namespace {
// Rotates x [outer, T, inner, d] (T: the attribute position_axis; inner: the
// axes between it and d, which share the position's angle) from `in` into
// `out` (+=, or = when `assign`), by the angle or its negative (the
// transpose: `inverse`). Pairs (i, i + d/2), or (2i, 2i + 1) when
// interleaved; pair i turns by t / theta^(2i/d) at position t.
void rotate_pairs(const OpContext& c, const float* in, float* out, bool inverse, bool assign) {
  const Shape& s = in_shape(c, 0);
  const auto rank = static_cast<int64_t>(s.size());
  const int64_t axis = rank + c.node->attrs.integer("position_axis");
  const int64_t d = s.back(), T = s[static_cast<size_t>(axis)], half = d / 2;
  int64_t inner = 1;
  for (int64_t k = axis + 1; k + 1 < rank; ++k) inner *= s[static_cast<size_t>(k)];
  const int64_t outer = c.batch * numel(s) / (T * inner * d);
  const bool interleaved = c.node->attrs.flag("interleaved");
  const int64_t step = interleaved ? 2 : 1, other = interleaved ? 1 : half;  // pair i: (i step, i step + other)
  const double theta = c.node->attrs.number("theta");
  std::vector<float> cs(static_cast<size_t>(T * half)), sn(static_cast<size_t>(T * half));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {  // as HF's rotary tables: cos and sin of t / theta^(2i/d)
      const double angle = static_cast<double>(t) * std::pow(theta, -static_cast<double>(2 * i) / static_cast<double>(d));
      cs[static_cast<size_t>(t * half + i)] = static_cast<float>(std::cos(angle));
      sn[static_cast<size_t>(t * half + i)] = static_cast<float>(std::sin(angle)) * (inverse ? -1.0f : 1.0f);
    }
  parallel_for(outer * T, 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t t = row % T;
      for (int64_t h = 0; h < inner; ++h) {
        const float* x = in + (row * inner + h) * d;
        float* y = out + (row * inner + h) * d;
        for (int64_t i = 0; i < half; ++i) {
          const float co = cs[static_cast<size_t>(t * half + i)], si = sn[static_cast<size_t>(t * half + i)];
          const int64_t u = i * step, v = u + other;
          const float a = x[u] * co - x[v] * si, b = x[v] * co + x[u] * si;
          y[u] = assign ? a : y[u] + a;
          y[v] = assign ? b : y[v] + b;
        }
      }
    }
  });
}
}  // namespace

void rope_forward(OpContext& c) { rotate_pairs(c, c.in[0].f(), c.out.f(), false, true); }

void rope_backward(OpContext& c) {
  if (c.din[0].defined()) rotate_pairs(c, c.dout.f(), c.din[0].f(), true, false);
}

}  // namespace dlplan::exec::cpu
