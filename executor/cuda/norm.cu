// LayerNorm, RMSNorm and BatchNorm (with SyncBatchNorm's combine step)
// kernels; statistics in double and kept in fp32, as executor/cpu/ops_norm.cpp.
// Row statistics: one block a row. Parameter gradients: a block per 32 columns,
// rows summed in a fixed order (no atomics). BatchNorm: one block a channel.
#include "common.cuh"

namespace dlplan::exec::cuda {
namespace {

__global__ void ln_fwd_k(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, int64_t D,
                         float eps) {
  __shared__ double scratch[32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * D;
  double m = 0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) m += xr[j];
  m = block_sum(m, scratch) / static_cast<double>(D);
  double v = 0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) v += (xr[j] - m) * (xr[j] - m);
  v = block_sum(v, scratch) / static_cast<double>(D);
  const float mu = static_cast<float>(m), rs = static_cast<float>(1.0 / sqrt(v + eps));
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) y[r * D + j] = (xr[j] - mu) * rs * w[j] + (b ? b[j] : 0.0f);
  if (threadIdx.x == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

__global__ void ln_dx_k(const float* x, const float* w, const float* dy, const float* mean, const float* rstd, float* dx,
                        int64_t D) {
  __shared__ double scratch[32];
  const int64_t r = blockIdx.x;
  const float mu = mean[r], rs = rstd[r];
  double mg = 0, mgx = 0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float xh = (x[r * D + j] - mu) * rs, g = dy[r * D + j] * w[j];
    mg += g;
    mgx += g * xh;
  }
  mg = block_sum(mg, scratch);
  mgx = block_sum(mgx, scratch);
  const float a = static_cast<float>(mg / static_cast<double>(D)), bb = static_cast<float>(mgx / static_cast<double>(D));
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float xh = (x[r * D + j] - mu) * rs;
    dx[r * D + j] += rs * (dy[r * D + j] * w[j] - a - xh * bb);
  }
}

// dw[j] += sum_r dy x_hat, db[j] += sum_r dy; rms: dw[j] += sum_r dy x rstd.
// Fixed order (common.cuh, column lanes): lane y sums its slice of rows, then
// lane 0 adds the slices in order onto dw[j] / db[j] — no atomics.
__global__ void norm_param_k(const float* x, const float* dy, const float* mean, const float* rstd, float* dw, float* db,
                             int64_t R, int64_t D) {
  __shared__ float sm[kColLanes][kColTile];
  const int64_t j = blockIdx.x * int64_t{kColTile} + threadIdx.x;
  int64_t r0, r1;
  lane_rows(R, &r0, &r1);
  float aw = 0, ab = 0;
  if (j < D)
#pragma unroll 4  // loads in flight; the order of the adds is unchanged
    for (int64_t r = r0; r < r1; ++r) {
      const float d = dy[r * D + j];
      const float xh = mean ? (x[r * D + j] - mean[r]) * rstd[r] : x[r * D + j] * rstd[r];
      aw += d * xh;
      ab += d;
    }
  const bool lead = threadIdx.y == 0 && j < D;
  aw = lanes_total(lead ? dw[j] : 0.0f, aw, sm);
  if (db) ab = lanes_total(lead ? db[j] : 0.0f, ab, sm);  // db is uniform over the block
  if (lead) {
    dw[j] = aw;
    if (db) db[j] = ab;
  }
}

void norm_param_grads(const float* x, const float* dy, const float* mean, const float* rstd, float* dw, float* db,
                      int64_t R, int64_t D, cudaStream_t s) {
  if (R <= 0 || D <= 0) return;
  norm_param_k<<<column_lanes_grid(D), column_lanes_block(), 0, s>>>(x, dy, mean, rstd, dw, db, R, D);
}

__global__ void rms_fwd_k(const float* x, const float* w, float* y, float* rstd, int64_t D, double eps) {
  __shared__ double scratch[32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * D;
  double ss = 0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) ss += double{xr[j]} * xr[j];
  ss = block_sum(ss, scratch);
  const float rs = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(D) + eps));
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) y[r * D + j] = xr[j] * rs * w[j];
  if (threadIdx.x == 0) rstd[r] = rs;
}

__global__ void rms_dx_k(const float* x, const float* w, const float* dy, const float* rstd, float* dx, int64_t D) {
  __shared__ double scratch[32];
  const int64_t r = blockIdx.x;
  const float rs = rstd[r];
  double mgx = 0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) mgx += double{dy[r * D + j]} * w[j] * x[r * D + j];
  mgx = block_sum(mgx, scratch);
  const float k = static_cast<float>(mgx / static_cast<double>(D)) * rs * rs * rs;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) dx[r * D + j] += rs * dy[r * D + j] * w[j] - x[r * D + j] * k;
}

// ---- batchnorm ----

__global__ void bn_stats_k(const float* x, double* mean, double* var, int64_t b, int64_t C, int64_t S) {
  __shared__ double scratch[32];
  const int64_t ch = blockIdx.x;
  const double n = static_cast<double>(b * S);
  double acc = 0;
  for (int64_t s = 0; s < b; ++s)
    for (int64_t i = threadIdx.x; i < S; i += blockDim.x) acc += x[(s * C + ch) * S + i];
  const double mu = block_sum(acc, scratch) / n;
  acc = 0;
  for (int64_t s = 0; s < b; ++s)
    for (int64_t i = threadIdx.x; i < S; i += blockDim.x) {
      const double d = x[(s * C + ch) * S + i] - mu;
      acc += d * d;
    }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) {
    mean[ch] = mu;
    var[ch] = acc / n;
  }
}

__global__ void bn_fill_k(const double* mean, const double* var, double count, float* buf, int64_t C, int64_t G) {
  const int64_t slot = 2 * C + 1;
  DLPLAN_GRID_LOOP(i, G * slot) {
    const int64_t e = i % slot;
    buf[i] = e < C ? static_cast<float>(mean[e]) : e < 2 * C ? static_cast<float>(var[e - C]) : static_cast<float>(count);
  }
}

__global__ void bn_combine_k(const float* buf, double* mean, double* var, int64_t C, int64_t G) {
  const int64_t slot = 2 * C + 1;
  DLPLAN_GRID_LOOP(ch, C) {
    double count = 0, mu = 0, v = 0;
    for (int64_t r = 0; r < G; ++r) count += buf[r * slot + 2 * C];
    for (int64_t r = 0; r < G; ++r) mu += buf[r * slot + 2 * C] * double{buf[r * slot + ch]};
    mu /= count;
    for (int64_t r = 0; r < G; ++r) {
      const float* p = buf + r * slot;
      const double dm = p[ch] - mu;
      v += p[2 * C] * (p[C + ch] + dm * dm);
    }
    mean[ch] = mu;
    var[ch] = v / count;
  }
}

__global__ void bn_finish_k(const double* mean, const double* var, const float* buf, int64_t G, double count,
                            float* mo, float* io, float* rm, float* rv, int64_t C, double eps, double momentum,
                            bool skip) {
  DLPLAN_GRID_LOOP(ch, C) {
    double n = count;
    if (buf) {
      n = 0;
      for (int64_t r = 0; r < G; ++r) n += buf[r * (2 * C + 1) + 2 * C];
    }
    const double unbias = n > 1 ? n / (n - 1) : 1.0;
    mo[ch] = static_cast<float>(mean[ch]);
    io[ch] = static_cast<float>(1.0 / sqrt(var[ch] + eps));
    if (!skip) {
      rm[ch] = static_cast<float>((1 - momentum) * rm[ch] + momentum * mean[ch]);
      rv[ch] = static_cast<float>((1 - momentum) * rv[ch] + momentum * var[ch] * unbias);
    }
  }
}

__global__ void bn_eval_k(const float* rm, const float* rv, float* mo, float* io, int64_t C, double eps) {
  DLPLAN_GRID_LOOP(ch, C) {
    mo[ch] = rm[ch];
    io[ch] = static_cast<float>(1.0 / sqrt(double{rv[ch]} + eps));
  }
}

__global__ void bn_apply_k(const float* x, const float* mean, const float* invstd, const float* gamma, const float* beta,
                           float* y, int64_t b, int64_t C, int64_t S) {
  DLPLAN_GRID_LOOP(i, b * C * S) {
    const int64_t ch = (i / S) % C;
    const float scale = invstd[ch] * gamma[ch], shift = beta[ch] - mean[ch] * scale;
    y[i] = x[i] * scale + shift;
  }
}

__global__ void bn_sums_k(const float* x, const float* dy, const float* mean, const float* invstd, double* sums,
                          float* dgamma, float* dbeta, float* sync_buf, int64_t b, int64_t C, int64_t S) {
  __shared__ double scratch[32];
  const int64_t ch = blockIdx.x;
  double a = 0, bx = 0;
  for (int64_t s = 0; s < b; ++s)
    for (int64_t i = threadIdx.x; i < S; i += blockDim.x) {
      const int64_t o = (s * C + ch) * S + i;
      a += dy[o];
      bx += dy[o] * (x[o] - mean[ch]) * invstd[ch];
    }
  a = block_sum(a, scratch);
  bx = block_sum(bx, scratch);
  if (threadIdx.x == 0) {
    sums[ch] = a;
    sums[C + ch] = bx;
    dgamma[ch] += static_cast<float>(bx);
    dbeta[ch] += static_cast<float>(a);
    if (sync_buf) {
      sync_buf[ch] = static_cast<float>(a);
      sync_buf[C + ch] = static_cast<float>(bx);
    }
  }
}

__global__ void bn_dx_k(const float* x, const float* dy, const float* mean, const float* invstd, const float* gamma,
                        const double* sums, const float* fsums, double count, bool training, float* dx, int64_t b,
                        int64_t C, int64_t S) {
  DLPLAN_GRID_LOOP(i, b * C * S) {
    const int64_t ch = (i / S) % C;
    const float k = gamma[ch] * invstd[ch];
    if (!training) {
      dx[i] += k * dy[i];
      continue;
    }
    const double sdy = fsums ? double{fsums[ch]} : sums[ch], sdyx = fsums ? double{fsums[C + ch]} : sums[C + ch];
    const float mdy = static_cast<float>(sdy / count), mdyx = static_cast<float>(sdyx / count);
    const float xh = (x[i] - mean[ch]) * invstd[ch];
    dx[i] += k * (dy[i] - mdy - xh * mdyx);
  }
}

}  // namespace

void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, int64_t R,
                       int64_t D, float eps, cudaStream_t s) {
  if (R > 0) ln_fwd_k<<<static_cast<unsigned>(R), kThreads, 0, s>>>(x, w, b, y, mean, rstd, D, eps);
}
void layernorm_backward(const float* x, const float* w, const float* dy, const float* mean, const float* rstd, float* dx,
                        float* dw, float* db, int64_t R, int64_t D, cudaStream_t s) {
  norm_param_grads(x, dy, mean, rstd, dw, db, R, D, s);
  if (dx && R > 0) ln_dx_k<<<static_cast<unsigned>(R), kThreads, 0, s>>>(x, w, dy, mean, rstd, dx, D);
}
void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t R, int64_t D, double eps,
                     cudaStream_t s) {
  if (R > 0) rms_fwd_k<<<static_cast<unsigned>(R), kThreads, 0, s>>>(x, w, y, rstd, D, eps);
}
void rmsnorm_backward(const float* x, const float* w, const float* dy, const float* rstd, float* dx, float* dw,
                      int64_t R, int64_t D, cudaStream_t s) {
  norm_param_grads(x, dy, nullptr, rstd, dw, nullptr, R, D, s);
  if (dx && R > 0) rms_dx_k<<<static_cast<unsigned>(R), kThreads, 0, s>>>(x, w, dy, rstd, dx, D);
}
void bn_local_stats(const float* x, double* mean, double* var, int64_t b, int64_t C, int64_t S, cudaStream_t s) {
  if (C > 0) bn_stats_k<<<static_cast<unsigned>(C), kThreads, 0, s>>>(x, mean, var, b, C, S);
}
void bn_fill_gather(const double* mean, const double* var, double count, float* buf, int64_t C, int64_t G,
                    cudaStream_t s) {
  bn_fill_k<<<blocks_for(G * (2 * C + 1)), kThreads, 0, s>>>(mean, var, count, buf, C, G);
}
void bn_combine(const float* buf, double* mean, double* var, int64_t C, int64_t G, cudaStream_t s) {
  if (C > 0) bn_combine_k<<<blocks_for(C), kThreads, 0, s>>>(buf, mean, var, C, G);
}
void bn_finish(const double* mean, const double* var, const float* buf, int64_t G, double count, float* mean_out,
               float* invstd_out, float* rm, float* rv, int64_t C, double eps, double momentum, bool skip_running,
               cudaStream_t s) {
  if (C > 0)
    bn_finish_k<<<blocks_for(C), kThreads, 0, s>>>(mean, var, buf, G, count, mean_out, invstd_out, rm, rv, C, eps,
                                                   momentum, skip_running);
}
void bn_eval_stats(const float* rm, const float* rv, float* mean_out, float* invstd_out, int64_t C, double eps,
                   cudaStream_t s) {
  if (C > 0) bn_eval_k<<<blocks_for(C), kThreads, 0, s>>>(rm, rv, mean_out, invstd_out, C, eps);
}
void bn_apply(const float* x, const float* mean, const float* invstd, const float* gamma, const float* beta, float* y,
              int64_t b, int64_t C, int64_t S, cudaStream_t s) {
  if (b * C * S > 0) bn_apply_k<<<blocks_for(b * C * S), kThreads, 0, s>>>(x, mean, invstd, gamma, beta, y, b, C, S);
}
void bn_backward_sums(const float* x, const float* dy, const float* mean, const float* invstd, double* sums,
                      float* dgamma, float* dbeta, float* sync_buf, int64_t b, int64_t C, int64_t S, cudaStream_t s) {
  if (C > 0)
    bn_sums_k<<<static_cast<unsigned>(C), kThreads, 0, s>>>(x, dy, mean, invstd, sums, dgamma, dbeta, sync_buf, b, C, S);
}
void bn_backward_dx(const float* x, const float* dy, const float* mean, const float* invstd, const float* gamma,
                    const double* sums, const float* fsums, double count, bool training, float* dx, int64_t b,
                    int64_t C, int64_t S, cudaStream_t s) {
  if (b * C * S > 0)
    bn_dx_k<<<blocks_for(b * C * S), kThreads, 0, s>>>(x, dy, mean, invstd, gamma, sums, fsums, count, training, dx, b,
                                                       C, S);
}

}  // namespace dlplan::exec::cuda
