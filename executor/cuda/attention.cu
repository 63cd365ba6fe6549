// Attention kernels (executor/cpu/ops_attention.cpp): RoPE, the math form's
// causal softmax (+ Philox dropout on the probabilities) and its backward, and
// a fused flash-style form: one block a query row streams the keys in tiles of
// kTile with an online softmax (FlashAttention Alg. 1), keeping only the fp32
// log-sum-exp; backward recomputes P = exp(S - lse) (Alg. 2, D_i = dO_i . O_i),
// one block a query row for dq and one block a key row for dk, dv (no atomics,
// deterministic). Simple rather than tensor-core fast: the GEMM-heavy math form
// goes through cuBLAS in cuda_ops.cpp.
#include "common.cuh"

namespace dlplan::exec::cuda {
namespace {

constexpr int kTile = 128;  // keys (or queries) per tile = threads per block

__device__ inline float drop_factor(const AttnDims& d, int64_t s, int64_t h, int64_t i, int64_t j) {
  const int64_t e = (h * d.T + i) * d.T + j;
  return dropout_u(d.seed, d.node, d.first_sample + s, e) < d.p ? 0.0f : d.keep_scale;
}

__global__ void rope_k(float* t, int64_t b, int64_t T, int64_t heads, int64_t hd, double theta, float sign) {
  const int64_t half = hd / 2;
  DLPLAN_GRID_LOOP(idx, b * T * heads * half) {
    const int64_t i = idx % half, rest = idx / half, h = rest % heads, row = rest / heads, pos = row % T;
    const double inv_freq = 1.0 / pow(theta, static_cast<double>(2 * i) / static_cast<double>(hd));
    const double ang = static_cast<double>(pos) * inv_freq;
    const float co = static_cast<float>(cos(ang)), si = sign * static_cast<float>(sin(ang));
    float* x = t + row * heads * hd + h * hd;
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * co - x2 * si;
    x[i + half] = x2 * co + x1 * si;
  }
}

// Block per row (s, h, i) of [b, H, T, T].
__global__ void softmax_k(AttnDims d, const float* scores, float* probs, uint8_t* mask, float* dropped, bool with_dropout) {
  __shared__ float fscratch[32];
  __shared__ double dscratch[32];
  const int64_t row = blockIdx.x, i = row % d.T, sh = row / d.T, h = sh % d.H, s = sh / d.H;
  const float* S = scores + row * d.T;
  float* P = probs + row * d.T;
  const int64_t valid = d.causal ? i + 1 : d.T;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) mx = fmaxf(mx, S[j]);
  mx = block_max(mx, fscratch);
  double sum = 0;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) {
    const float e = expf(S[j] - mx);
    P[j] = e;
    sum += e;
  }
  sum = block_sum(sum, dscratch);
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t j = threadIdx.x; j < d.T; j += blockDim.x) {
    const float p = j < valid ? P[j] * inv : 0.0f;
    P[j] = p;
    if (with_dropout) {
      const float f = d.dropout ? drop_factor(d, s, h, i, j) : 1.0f;
      mask[row * d.T + j] = f != 0.0f ? 1 : 0;
      dropped[row * d.T + j] = p * f;
    }
  }
}

__global__ void softmax_bwd_k(AttnDims d, const float* probs, const uint8_t* mask, float* dprobs) {
  __shared__ double scratch[32];
  const int64_t row = blockIdx.x;
  const float* P = probs + row * d.T;
  float* dP = dprobs + row * d.T;
  double dot = 0;
  for (int64_t j = threadIdx.x; j < d.T; j += blockDim.x) {
    float g = dP[j];
    if (mask) g = mask[row * d.T + j] ? g * d.keep_scale : 0.0f;
    dP[j] = g;
    dot += double{P[j]} * g;
  }
  const float dt = static_cast<float>(block_sum(dot, scratch));
  for (int64_t j = threadIdx.x; j < d.T; j += blockDim.x) dP[j] = P[j] * (dP[j] - dt);
}

__device__ inline float dot_hd(const float* a, const float* b, int64_t hd) {
  float acc = 0;
  for (int64_t e = 0; e < hd; ++e) acc += a[e] * b[e];
  return acc;
}

// Block per (s, h, i); dynamic shared memory: q[hd], acc[hd], p[kTile].
__global__ void flash_fwd_k(AttnDims d, const float* q, const float* k, const float* v, float* ctx, float* lse) {
  extern __shared__ float smem[];
  __shared__ float scratch[32];
  float* qs = smem;
  float* acc = qs + d.hd;
  float* pt = acc + d.hd;
  const int64_t i = blockIdx.x % d.T, sh = blockIdx.x / d.T, h = sh % d.H, s = sh / d.H, g = h / d.group;
  const float* Qi = q + (s * d.T + i) * d.qw() + h * d.hd;
  for (int64_t e = threadIdx.x; e < d.hd; e += blockDim.x) {
    qs[e] = Qi[e];
    acc[e] = 0.0f;
  }
  __syncthreads();
  const int64_t jend = d.causal ? i + 1 : d.T;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j0 = 0; j0 < jend; j0 += kTile) {
    const int64_t j = j0 + threadIdx.x, nk = jend - j0 < kTile ? jend - j0 : kTile;
    const bool valid = j < jend;
    const float sc = valid ? d.scale * dot_hd(qs, k + (s * d.T + j) * d.kw() + g * d.hd, d.hd) : -INFINITY;
    const float mnew = fmaxf(m, block_max(sc, scratch));
    if (mnew == -INFINITY) continue;  // block-uniform
    const float corr = expf(m - mnew);
    const float e = valid ? expf(sc - mnew) : 0.0f;
    l = l * corr + block_sum(e, scratch);
    m = mnew;
    pt[threadIdx.x] = (valid && d.dropout) ? e * drop_factor(d, s, h, i, j) : e;
    __syncthreads();
    for (int64_t c = threadIdx.x; c < d.hd; c += blockDim.x) {
      float a = acc[c] * corr;
      for (int64_t t = 0; t < nk; ++t) a += pt[t] * v[(s * d.T + j0 + t) * d.kw() + g * d.hd + c];
      acc[c] = a;
    }
    __syncthreads();
  }
  float* O = ctx + (s * d.T + i) * d.qw() + h * d.hd;
  for (int64_t c = threadIdx.x; c < d.hd; c += blockDim.x) O[c] = acc[c] / l;
  if (threadIdx.x == 0) lse[(s * d.H + h) * d.T + i] = m + logf(l);
}

// dq: block per (s, h, i); smem q[hd], do[hd], acc[hd], c[kTile].
__global__ void flash_dq_k(AttnDims d, const float* q, const float* k, const float* v, const float* ctx, const float* lse,
                           const float* dctx, float* dq) {
  extern __shared__ float smem[];
  __shared__ double scratch[32];
  float* qs = smem;
  float* dos = qs + d.hd;
  float* acc = dos + d.hd;
  float* ct = acc + d.hd;
  const int64_t i = blockIdx.x % d.T, sh = blockIdx.x / d.T, h = sh % d.H, s = sh / d.H, g = h / d.group;
  const int64_t qoff = (s * d.T + i) * d.qw() + h * d.hd;
  double part = 0;
  for (int64_t e = threadIdx.x; e < d.hd; e += blockDim.x) {
    qs[e] = q[qoff + e];
    dos[e] = dctx[qoff + e];
    acc[e] = 0.0f;
    part += double{dctx[qoff + e]} * ctx[qoff + e];
  }
  const float Di = static_cast<float>(block_sum(part, scratch));  // synchronises (smem ready)
  const float L = lse[(s * d.H + h) * d.T + i];
  const int64_t jend = d.causal ? i + 1 : d.T;
  for (int64_t j0 = 0; j0 < jend; j0 += kTile) {
    const int64_t j = j0 + threadIdx.x, nk = jend - j0 < kTile ? jend - j0 : kTile;
    float ds = 0.0f;
    if (j < jend) {
      const int64_t koff = (s * d.T + j) * d.kw() + g * d.hd;
      const float p = expf(d.scale * dot_hd(qs, k + koff, d.hd) - L);
      const float f = d.dropout ? drop_factor(d, s, h, i, j) : 1.0f;
      ds = p * (dot_hd(dos, v + koff, d.hd) * f - Di);
    }
    ct[threadIdx.x] = ds;
    __syncthreads();
    for (int64_t c = threadIdx.x; c < d.hd; c += blockDim.x) {
      float a = acc[c];
      for (int64_t t = 0; t < nk; ++t) a += ct[t] * k[(s * d.T + j0 + t) * d.kw() + g * d.hd + c];
      acc[c] = a;
    }
    __syncthreads();
  }
  for (int64_t c = threadIdx.x; c < d.hd; c += blockDim.x) dq[qoff + c] += d.scale * acc[c];
}

// dk, dv: block per (s, g, j) over the group's query heads; smem k[hd], v[hd], dk[hd], dv[hd], a[kTile], b[kTile].
__global__ void flash_dkv_k(AttnDims d, const float* q, const float* k, const float* v, const float* ctx,
                            const float* lse, const float* dctx, float* dk, float* dv) {
  extern __shared__ float smem[];
  float* ks = smem;
  float* vs = ks + d.hd;
  float* dka = vs + d.hd;
  float* dva = dka + d.hd;
  float* at = dva + d.hd;
  float* bt = at + kTile;
  const int64_t j = blockIdx.x % d.T, sg = blockIdx.x / d.T, g = sg % d.KV, s = sg / d.KV;
  const int64_t koff = (s * d.T + j) * d.kw() + g * d.hd;
  for (int64_t e = threadIdx.x; e < d.hd; e += blockDim.x) {
    ks[e] = k[koff + e];
    vs[e] = v[koff + e];
    dka[e] = 0.0f;
    dva[e] = 0.0f;
  }
  __syncthreads();
  for (int64_t h = g * d.group; h < (g + 1) * d.group; ++h) {
    const float* L = lse + (s * d.H + h) * d.T;
    for (int64_t i0 = d.causal ? j : 0; i0 < d.T; i0 += kTile) {
      const int64_t i = i0 + threadIdx.x, nq = d.T - i0 < kTile ? d.T - i0 : kTile;
      float a = 0.0f, b = 0.0f;
      if (i < d.T) {
        const int64_t qoff = (s * d.T + i) * d.qw() + h * d.hd;
        const float p = expf(d.scale * dot_hd(q + qoff, ks, d.hd) - L[i]);
        const float f = d.dropout ? drop_factor(d, s, h, i, j) : 1.0f;
        double di = 0;
        for (int64_t e = 0; e < d.hd; ++e) di += double{dctx[qoff + e]} * ctx[qoff + e];
        a = p * f;
        b = p * (dot_hd(dctx + qoff, vs, d.hd) * f - static_cast<float>(di));
      }
      at[threadIdx.x] = a;
      bt[threadIdx.x] = b;
      __syncthreads();
      for (int64_t c = threadIdx.x; c < d.hd; c += blockDim.x) {
        float av = dva[c], ak = dka[c];
        for (int64_t t = 0; t < nq; ++t) {
          const int64_t qo = (s * d.T + i0 + t) * d.qw() + h * d.hd + c;
          av += at[t] * dctx[qo];
          ak += bt[t] * q[qo];
        }
        dva[c] = av;
        dka[c] = ak;
      }
      __syncthreads();
    }
  }
  for (int64_t c = threadIdx.x; c < d.hd; c += blockDim.x) {
    dv[koff + c] += dva[c];
    dk[koff + c] += d.scale * dka[c];
  }
}

}  // namespace

void rope(float* t, int64_t b, int64_t T, int64_t heads, int64_t hd, double theta, bool inverse, cudaStream_t s) {
  const int64_t n = b * T * heads * (hd / 2);
  if (n > 0) rope_k<<<blocks_for(n), kThreads, 0, s>>>(t, b, T, heads, hd, theta, inverse ? -1.0f : 1.0f);
}

void attn_softmax(const AttnDims& d, const float* scores, float* probs, uint8_t* mask, float* dropped,
                  bool with_dropout, cudaStream_t s) {
  const int64_t rows = d.b * d.H * d.T;
  if (rows > 0) softmax_k<<<static_cast<unsigned>(rows), kTile, 0, s>>>(d, scores, probs, mask, dropped, with_dropout);
}

void attn_softmax_backward(const AttnDims& d, const float* probs, const uint8_t* mask, float* dprobs, cudaStream_t s) {
  const int64_t rows = d.b * d.H * d.T;
  if (rows > 0) softmax_bwd_k<<<static_cast<unsigned>(rows), kTile, 0, s>>>(d, probs, mask, dprobs);
}

void flash_forward(const AttnDims& d, const float* q, const float* k, const float* v, float* ctx, float* lse,
                   cudaStream_t s) {
  const int64_t rows = d.b * d.H * d.T;
  const size_t smem = static_cast<size_t>(2 * d.hd + kTile) * sizeof(float);
  if (rows > 0) flash_fwd_k<<<static_cast<unsigned>(rows), kTile, smem, s>>>(d, q, k, v, ctx, lse);
}

void flash_backward(const AttnDims& d, const float* q, const float* k, const float* v, const float* ctx,
                    const float* lse, const float* dctx, float* dq, float* dk, float* dv, cudaStream_t s) {
  const int64_t qrows = d.b * d.H * d.T, krows = d.b * d.KV * d.T;
  if (qrows <= 0) return;
  flash_dq_k<<<static_cast<unsigned>(qrows), kTile, static_cast<size_t>(3 * d.hd + kTile) * sizeof(float), s>>>(
      d, q, k, v, ctx, lse, dctx, dq);
  flash_dkv_k<<<static_cast<unsigned>(krows), kTile, static_cast<size_t>(4 * d.hd + 2 * kTile) * sizeof(float), s>>>(
      d, q, k, v, ctx, lse, dctx, dk, dv);
}

}  // namespace dlplan::exec::cuda
