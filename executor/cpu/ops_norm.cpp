// Normalisations: batchnorm (with SyncBatchNorm through ctx.syncbn), layernorm,
// groupnorm, rmsnorm. Statistics are accumulated in double and kept in fp32.
#include "cpu/ops.hpp"
#include "cpu/parallel.hpp"
#include "cpu/row_reduce.hpp"
#include "dlplan/norm_width.hpp"

#include <cmath>
#include <vector>

namespace dlplan::exec::cpu {

// ---- batchnorm -----------------------------------------------------------------
// x: [b, C, S...] (S = the per-sample spatial size, 1 for [C]); weight gamma,
// bias beta: [C]; buffers running_mean, running_var: [C] (PyTorch's: momentum
// update, unbiased variance). Saves the batch mean and invstd [C] (fp32, per
// micro-batch). Eval mode normalises with the running statistics and still
// saves them (as mean/invstd) so that a backward through eval is defined.
//
// SyncBatchNorm (ctx.syncbn with group_size > 1) as PyTorch's: forward
// all-gathers each rank's (mean, biased var, count) — 2C + 1 floats — and
// combines them (Chan et al.'s parallel variance); backward all-reduces
// (sum dy, sum dy x_hat), 2C floats, over the group. The backend fills *every*
// slot of the gather buffer with its own values, so the hook need not say
// which slot is this rank's: the all-gather overwrites the others. Every rank
// of a group is assumed to hold the same micro-batch (DESIGN.md), so the
// global count in backward is group_size x the local count.

namespace {
bool synced(const OpContext& c) { return c.syncbn && c.syncbn->group_size > 1; }
}  // namespace

void batchnorm_forward(OpContext& c) {
  const Shape& xs = in_shape(c, 0);
  const int64_t C = xs[0], S = numel(xs) / C, b = c.batch;
  const int64_t channel_grain = grain_elements() / (b * S) + 1;
  const double eps = c.node->attrs.number("eps"), momentum = c.node->attrs.number("momentum");
  Tensor mean_t = alloc_saved(c, {C}, DType::f32, "mean");
  Tensor invstd_t = alloc_saved(c, {C}, DType::f32, "invstd");
  float* mean = mean_t.f();
  float* invstd = invstd_t.f();
  const float* x = c.in[0].f();
  float* rm = c.buffers[0].f();
  float* rv = c.buffers[1].f();

  if (c.training) {
    // Local statistics (two passes for a stable variance).
    std::vector<double> m(static_cast<size_t>(C), 0.0), v(static_cast<size_t>(C), 0.0);
    const double n = static_cast<double>(b * S);
    // Channels in parallel; each channel's sums in sample order.
    parallel_for(C, channel_grain, [&](int64_t ch_begin, int64_t ch_end) {
      for (int64_t ch = ch_begin; ch < ch_end; ++ch) {
        double& mv = m[static_cast<size_t>(ch)];
        for (int64_t s = 0; s < b; ++s) {
          const float* xp = x + (s * C + ch) * S;
          mv += lane_sum(S, [xp](int64_t i) { return double{xp[i]}; });
        }
        mv /= n;
        double& vv = v[static_cast<size_t>(ch)];
        const double mu = mv;
        for (int64_t s = 0; s < b; ++s) {
          const float* xp = x + (s * C + ch) * S;
          vv += lane_sum(S, [xp, mu](int64_t i) { return (xp[i] - mu) * (xp[i] - mu); });
        }
        vv /= n;
      }
    });
    double count = n;
    if (synced(c)) {
      // Gather (mean[C], var[C], count) from every rank of the group.
      const int64_t slot = 2 * C + 1, G = c.syncbn->group_size;
      std::vector<float> buf(static_cast<size_t>(G * slot));
      for (int64_t r = 0; r < G; ++r) {
        float* p = buf.data() + r * slot;
        for (int64_t ch = 0; ch < C; ++ch) {
          p[ch] = static_cast<float>(m[static_cast<size_t>(ch)]);
          p[C + ch] = static_cast<float>(v[static_cast<size_t>(ch)]);
        }
        p[2 * C] = static_cast<float>(n);
      }
      c.syncbn->all_gather(buf.data(), slot);
      // mean = sum n_r m_r / N;  var = sum n_r (v_r + (m_r - mean)^2) / N.
      count = 0;
      for (int64_t r = 0; r < G; ++r) count += buf[static_cast<size_t>(r * slot + 2 * C)];
      for (int64_t ch = 0; ch < C; ++ch) {
        double mu = 0, var = 0;
        for (int64_t r = 0; r < G; ++r) mu += buf[static_cast<size_t>(r * slot + 2 * C)] * double{buf[static_cast<size_t>(r * slot + ch)]};
        mu /= count;
        for (int64_t r = 0; r < G; ++r) {
          const float* p = buf.data() + r * slot;
          const double dm = p[ch] - mu;
          var += p[2 * C] * (p[C + ch] + dm * dm);
        }
        m[static_cast<size_t>(ch)] = mu;
        v[static_cast<size_t>(ch)] = var / count;
      }
    }
    const double unbias = count > 1 ? count / (count - 1) : 1.0;
    for (int64_t ch = 0; ch < C; ++ch) {
      const size_t i = static_cast<size_t>(ch);
      mean[ch] = static_cast<float>(m[i]);
      invstd[ch] = static_cast<float>(1.0 / std::sqrt(v[i] + eps));
      if (c.recompute) continue;  // a checkpointed unit's second forward updates nothing
      rm[ch] = static_cast<float>((1 - momentum) * rm[ch] + momentum * m[i]);
      rv[ch] = static_cast<float>((1 - momentum) * rv[ch] + momentum * v[i] * unbias);
    }
  } else {
    for (int64_t ch = 0; ch < C; ++ch) {
      mean[ch] = rm[ch];
      invstd[ch] = static_cast<float>(1.0 / std::sqrt(double{rv[ch]} + eps));
    }
  }

  // y = (x - mean) invstd gamma + beta.
  const float* gamma = c.params[0].f();
  const float* beta = c.params[1].f();
  float* y = c.out.f();
  parallel_for(C, channel_grain, [&](int64_t ch_begin, int64_t ch_end) {
    for (int64_t ch = ch_begin; ch < ch_end; ++ch) {
      const float scale = invstd[ch] * gamma[ch], shift = beta[ch] - mean[ch] * scale;
      for (int64_t s = 0; s < b; ++s) {
        const int64_t off = (s * C + ch) * S;
        for (int64_t i = 0; i < S; ++i) y[off + i] = x[off + i] * scale + shift;
      }
    }
  });
  c.saved.push_back(std::move(mean_t));
  c.saved.push_back(std::move(invstd_t));
}

// Training: x_hat = (x - mean) invstd, N the (global) count,
//   dx = gamma invstd (dy - sum(dy)/N - x_hat sum(dy x_hat)/N)
// (Ioffe & Szegedy 2015, Sec. 3). dgamma += sum dy x_hat, dbeta += sum dy over
// this rank's batch only (the data-parallel strategy reduces parameter grads).
// Eval: the statistics are constants, dx = gamma invstd dy.
void batchnorm_backward(OpContext& c) {
  const Shape& xs = in_shape(c, 0);
  const int64_t C = xs[0], S = numel(xs) / C, b = c.batch;
  const float* x = c.in[0].f();
  const float* dy = c.dout.f();
  const float* mean = c.saved[0].f();
  const float* invstd = c.saved[1].f();
  const float* gamma = c.params[0].f();
  const int64_t channel_grain = grain_elements() / (b * S) + 1;
  std::vector<double> sdy(static_cast<size_t>(C), 0.0), sdyx(static_cast<size_t>(C), 0.0);
  parallel_for(C, channel_grain, [&](int64_t ch_begin, int64_t ch_end) {
    for (int64_t ch = ch_begin; ch < ch_end; ++ch)  // each channel's sums in sample order
      for (int64_t s = 0; s < b; ++s) {
        const float* dyp = dy + (s * C + ch) * S;
        const float* xp = x + (s * C + ch) * S;
        const float mu = mean[ch], is = invstd[ch];
        sdy[static_cast<size_t>(ch)] += lane_sum(S, [dyp](int64_t i) { return double{dyp[i]}; });
        sdyx[static_cast<size_t>(ch)] += lane_sum(S, [=](int64_t i) { return double{dyp[i] * (xp[i] - mu) * is}; });
      }
  });
  for (int64_t ch = 0; ch < C; ++ch) {
    if (c.dparams[0].defined()) c.dparams[0].f()[ch] += static_cast<float>(sdyx[static_cast<size_t>(ch)]);
    if (c.dparams[1].defined()) c.dparams[1].f()[ch] += static_cast<float>(sdy[static_cast<size_t>(ch)]);
  }
  if (!c.din[0].defined()) return;
  float* dx = c.din[0].f();
  if (!c.training) {
    for (int64_t s = 0; s < b; ++s)
      for (int64_t ch = 0; ch < C; ++ch) {
        const int64_t off = (s * C + ch) * S;
        const float k = gamma[ch] * invstd[ch];
        for (int64_t i = 0; i < S; ++i) dx[off + i] += k * dy[off + i];
      }
    return;
  }
  double count = static_cast<double>(b * S);
  if (synced(c)) {
    std::vector<float> buf(static_cast<size_t>(2 * C));
    for (int64_t ch = 0; ch < C; ++ch) {
      buf[static_cast<size_t>(ch)] = static_cast<float>(sdy[static_cast<size_t>(ch)]);
      buf[static_cast<size_t>(C + ch)] = static_cast<float>(sdyx[static_cast<size_t>(ch)]);
    }
    c.syncbn->all_reduce_sum(buf.data(), 2 * C);
    for (int64_t ch = 0; ch < C; ++ch) {
      sdy[static_cast<size_t>(ch)] = buf[static_cast<size_t>(ch)];
      sdyx[static_cast<size_t>(ch)] = buf[static_cast<size_t>(C + ch)];
    }
    count *= static_cast<double>(c.syncbn->group_size);
  }
  parallel_for(C, channel_grain, [&](int64_t ch_begin, int64_t ch_end) {
    for (int64_t ch = ch_begin; ch < ch_end; ++ch) {
      const float k = gamma[ch] * invstd[ch], mu = mean[ch], is = invstd[ch];  // not reloaded past dx's stores
      const float mdy = static_cast<float>(sdy[static_cast<size_t>(ch)] / count);
      const float mdyx = static_cast<float>(sdyx[static_cast<size_t>(ch)] / count);
      for (int64_t s = 0; s < b; ++s) {
        const int64_t off = (s * C + ch) * S;
        for (int64_t i = 0; i < S; ++i) {
          const float xh = (x[off + i] - mu) * is;
          dx[off + i] += k * (dy[off + i] - mdy - xh * mdyx);
        }
      }
    }
  });
}

// ---- layernorm -----------------------------------------------------------------
// x: [R, D] (R = b x leading dims; D the trailing `dims` axes, the last by
// default, norm_width.hpp); weight, bias: those axes' shape, flat [D]. Saves mean, rstd [R] fp32.
// y = (x - mean) rstd w + bias.

void layernorm_forward(OpContext& c) {
  const int64_t D = layernorm_width(in_shape(c, 0), c.node->attrs), R = c.batch * numel(in_shape(c, 0)) / D;
  const float eps = static_cast<float>(c.node->attrs.number("eps"));
  const bool bias = c.node->attrs.flag("bias");
  Tensor mean_t = alloc_saved(c, {R}, DType::f32, "mean");
  Tensor rstd_t = alloc_saved(c, {R}, DType::f32, "rstd");
  const float* w = c.params[0].f();
  parallel_for(R, grain_elements() / D + 1, [&](int64_t r_begin, int64_t r_end) {
  for (int64_t r = r_begin; r < r_end; ++r) {
    const float* x = c.in[0].f() + r * D;
    float* y = c.out.f() + r * D;
    double m = 0, v = 0;
    for (int64_t j = 0; j < D; ++j) m += x[j];
    m /= static_cast<double>(D);
    for (int64_t j = 0; j < D; ++j) v += (x[j] - m) * (x[j] - m);
    v /= static_cast<double>(D);
    const float mean = static_cast<float>(m), rstd = static_cast<float>(1.0 / std::sqrt(v + eps));
    for (int64_t j = 0; j < D; ++j) y[j] = (x[j] - mean) * rstd * w[j] + (bias ? c.params[1].f()[j] : 0.0f);
    mean_t.f()[r] = mean;
    rstd_t.f()[r] = rstd;
  }
  });
  c.saved.push_back(std::move(mean_t));
  c.saved.push_back(std::move(rstd_t));
}

// With x_hat = (x - mean) rstd and g = dy w:
//   dx = rstd (g - mean_j(g) - x_hat mean_j(g x_hat))
//   dw += sum_r dy x_hat;  dbias += sum_r dy.
void layernorm_backward(OpContext& c) {
  const int64_t D = layernorm_width(in_shape(c, 0), c.node->attrs), R = c.batch * numel(in_shape(c, 0)) / D;
  const bool bias = c.node->attrs.flag("bias");
  const float* w = c.params[0].f();
  float* dw = grad_or_null(c.dparams[0]);
  float* db = bias ? grad_or_null(c.dparams[1]) : nullptr;
  std::vector<float> xh(static_cast<size_t>(D));
  for (int64_t r = 0; r < R; ++r) {
    const float* x = c.in[0].f() + r * D;
    const float* dy = c.dout.f() + r * D;
    const float mean = c.saved[0].f()[r], rstd = c.saved[1].f()[r];
    double mg = 0, mgx = 0;
    for (int64_t j = 0; j < D; ++j) {
      const size_t jj = static_cast<size_t>(j);
      xh[jj] = (x[j] - mean) * rstd;
      const float g = dy[j] * w[j];
      mg += g;
      mgx += g * xh[jj];
      if (dw) dw[j] += dy[j] * xh[jj];
      if (db) db[j] += dy[j];
    }
    if (!c.din[0].defined()) continue;
    const float a = static_cast<float>(mg / static_cast<double>(D)), bb = static_cast<float>(mgx / static_cast<double>(D));
    float* dx = c.din[0].f() + r * D;
    for (int64_t j = 0; j < D; ++j) dx[j] += rstd * (dy[j] * w[j] - a - xh[static_cast<size_t>(j)] * bb);
  }
}

// ---- groupnorm -----------------------------------------------------------------
// x: [b, C, S...] (S the per-sample spatial size); G groups of C/G channels.
// Row r = (sample, group) holds D = (C/G) S contiguous values. weight, bias:
// [C] when affine. Saves mean, rstd [b, G] fp32 (PyTorch's native_group_norm).
// y = (x - mean_r) rstd_r w_c + bias_c (Wu & He 2018, eq. 1 and 2).

namespace {
// Row r = (sample, group): D = (C/G) S values, channels first..first + C/G - 1.
struct GroupRows {
  int64_t G, S, R, D, per_group;  // per_group = C/G channels
  int64_t first_channel(int64_t r) const { return (r % G) * per_group; }
};
GroupRows group_rows(const OpContext& c) {
  const Shape& xs = in_shape(c, 0);
  const int64_t C = xs[0], G = c.node->attrs.integer("groups"), S = numel(xs) / C;
  return {G, S, c.batch * G, (C / G) * S, C / G};
}
}  // namespace

void groupnorm_forward(OpContext& c) {
  const GroupRows g = group_rows(c);
  const double eps = c.node->attrs.number("eps");
  const bool affine = c.node->attrs.flag("affine");
  Tensor mean_t = alloc_saved(c, {g.R}, DType::f32, "mean");
  Tensor rstd_t = alloc_saved(c, {g.R}, DType::f32, "rstd");
  parallel_for(g.R, grain_elements() / g.D + 1, [&](int64_t r_begin, int64_t r_end) {
    for (int64_t r = r_begin; r < r_end; ++r) {
      const float* x = c.in[0].f() + r * g.D;
      float* y = c.out.f() + r * g.D;
      const double m = lane_sum(g.D, [x](int64_t i) { return double{x[i]}; }) / static_cast<double>(g.D);
      const double v =
          lane_sum(g.D, [x, m](int64_t i) { return (x[i] - m) * (x[i] - m); }) / static_cast<double>(g.D);
      const float mean = static_cast<float>(m), rstd = static_cast<float>(1.0 / std::sqrt(v + eps));
      // y = x_hat w_c + bias_c, as x scale + shift a channel at a time
      for (int64_t k = 0; k < g.per_group; ++k) {
        const int64_t ch = g.first_channel(r) + k;
        const float w = affine ? c.params[0].f()[ch] : 1.0f, b = affine ? c.params[1].f()[ch] : 0.0f;
        const float scale = rstd * w, shift = b - mean * scale;
        for (int64_t i = k * g.S; i < (k + 1) * g.S; ++i) y[i] = x[i] * scale + shift;
      }
      mean_t.f()[r] = mean;
      rstd_t.f()[r] = rstd;
    }
  });
  c.saved.push_back(std::move(mean_t));
  c.saved.push_back(std::move(rstd_t));
}

// As layernorm's over a row, with the weight per channel: g = dy w_c,
//   dx = rstd (g - mean_j(g) - x_hat mean_j(g x_hat));
//   dw_c += sum dy x_hat, dbias_c += sum dy over the channel's positions and samples.
void groupnorm_backward(OpContext& c) {
  const GroupRows g = group_rows(c);
  const bool affine = c.node->attrs.flag("affine");
  const auto weight = [&](int64_t ch) { return affine ? c.params[0].f()[ch] : 1.0f; };
  // dx row by row in parallel; the parameters' gradients, which rows of every
  // sample add to, afterwards in sample order.
  if (c.din[0].defined()) parallel_for(g.R, grain_elements() / g.D + 1, [&](int64_t r_begin, int64_t r_end) {
    for (int64_t r = r_begin; r < r_end; ++r) {
      const float* x = c.in[0].f() + r * g.D;
      const float* dy = c.dout.f() + r * g.D;
      float* dx = c.din[0].f() + r * g.D;
      const float mean = c.saved[0].f()[r], rstd = c.saved[1].f()[r];
      double mg = 0, mgx = 0;
      for (int64_t k = 0; k < g.per_group; ++k) {
        const float w = weight(g.first_channel(r) + k);
        for (int64_t i = k * g.S; i < (k + 1) * g.S; ++i) {
          mg += dy[i] * w;
          mgx += double{dy[i] * w} * ((x[i] - mean) * rstd);
        }
      }
      const auto a = static_cast<float>(mg / static_cast<double>(g.D));
      const auto bb = static_cast<float>(mgx / static_cast<double>(g.D));
      for (int64_t k = 0; k < g.per_group; ++k) {
        const float w = weight(g.first_channel(r) + k);
        for (int64_t i = k * g.S; i < (k + 1) * g.S; ++i) dx[i] += rstd * (dy[i] * w - a - (x[i] - mean) * rstd * bb);
      }
    }
  });
  float* dw = affine ? grad_or_null(c.dparams[0]) : nullptr;
  float* db = affine ? grad_or_null(c.dparams[1]) : nullptr;
  if (!dw && !db) return;
  for (int64_t r = 0; r < g.R; ++r) {
    const float mean = c.saved[0].f()[r], rstd = c.saved[1].f()[r];
    for (int64_t k = 0; k < g.per_group; ++k) {
      const float* xp = c.in[0].f() + r * g.D + k * g.S;
      const float* dyp = c.dout.f() + r * g.D + k * g.S;
      const int64_t ch = g.first_channel(r) + k;
      if (dw) dw[ch] += static_cast<float>(lane_sum(g.S, [=](int64_t i) { return double{dyp[i]} * ((xp[i] - mean) * rstd); }));
      if (db) db[ch] += static_cast<float>(lane_sum(g.S, [dyp](int64_t i) { return double{dyp[i]}; }));
    }
  }
}

// ---- rmsnorm -------------------------------------------------------------------
// x: [R, D]; weight: [D]. rstd = 1 / sqrt(mean_j x^2 + eps); y = x rstd (w + offset)
// (Zhang & Sennrich 2019; HF LlamaRMSNorm; offset 1 is HF GemmaRMSNorm's
// "1 + weight"). Saves rstd [R] fp32.

void rmsnorm_forward(OpContext& c) {
  const int64_t D = in_shape(c, 0).back(), R = c.batch * numel(in_shape(c, 0)) / D;
  const double eps = c.node->attrs.number("eps");
  Tensor rstd_t = alloc_saved(c, {R}, DType::f32, "rstd");
  const float* w = c.params[0].f();
  const auto off = static_cast<float>(c.node->attrs.number("offset"));
  for (int64_t r = 0; r < R; ++r) {
    const float* x = c.in[0].f() + r * D;
    float* y = c.out.f() + r * D;
    double ss = 0;
    for (int64_t j = 0; j < D; ++j) ss += double{x[j]} * x[j];
    const float rstd = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(D) + eps));
    for (int64_t j = 0; j < D; ++j) y[j] = x[j] * rstd * (w[j] + off);
    rstd_t.f()[r] = rstd;
  }
  c.saved.push_back(std::move(rstd_t));
}

// With g = dy (w + offset):  dx = rstd g - x rstd^3 mean_j(g x);  dw += sum_r dy x rstd.
void rmsnorm_backward(OpContext& c) {
  const int64_t D = in_shape(c, 0).back(), R = c.batch * numel(in_shape(c, 0)) / D;
  const float* w = c.params[0].f();
  const auto off = static_cast<float>(c.node->attrs.number("offset"));
  float* dw = grad_or_null(c.dparams[0]);
  for (int64_t r = 0; r < R; ++r) {
    const float* x = c.in[0].f() + r * D;
    const float* dy = c.dout.f() + r * D;
    const float rstd = c.saved[0].f()[r];
    double mgx = 0;
    for (int64_t j = 0; j < D; ++j) {
      mgx += double{dy[j]} * (w[j] + off) * x[j];
      if (dw) dw[j] += dy[j] * x[j] * rstd;
    }
    if (!c.din[0].defined()) continue;
    const float k = static_cast<float>(mgx / static_cast<double>(D)) * rstd * rstd * rstd;
    float* dx = c.din[0].f() + r * D;
    for (int64_t j = 0; j < D; ++j) dx[j] += rstd * dy[j] * (w[j] + off) - x[j] * k;
  }
}

}  // namespace dlplan::exec::cpu
