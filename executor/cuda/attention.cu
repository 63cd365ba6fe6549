// Attention kernels (executor/cpu/ops_attention.cpp): RoPE, the math form's
// causal softmax (+ Philox dropout on the probabilities) and its backward, and
// the fused flash form after FlashAttention-2 (Dao 2023): the forward streams
// key tiles through shared memory with an online softmax (Alg. 1), keeping only
// the fp32 log-sum-exp; the backward (Alg. 2) computes D = rowsum(dO * O) once,
// then recomputes P = exp(S - lse) tile by tile in two passes — key tiles for
// dk, dv and query tiles for dq — so that no gradient needs atomics and every
// sum has a fixed order (deterministic). fp32 CUDA cores, simple rather than
// tensor-core fast: the GEMM-heavy math form goes through cuBLAS in cuda_ops.cpp.
#include "common.cuh"

namespace dlplan::exec::cuda {
namespace {

constexpr int kTile = 128;  // threads per block of the softmax kernels (a row each)

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

// ---- flash form ------------------------------------------------------------------
//
// Tiles of B query rows and B key rows (B from flash_tile: <= 32, shared memory
// <= 48 KiB), staged in shared memory with a row stride ld = hd | 1 (odd: the
// score loops read K rows at stride ld, conflict-free). Each block has
// kFlashThreads threads; a [B, hd] accumulator is spread over them, element
// e = tid + t kFlashThreads (t < kFlashMaxPer) in registers. Every sum runs in a
// fixed order (keys or queries ascending, tile by tile): no atomics, the same
// bits run to run.

constexpr int kFlashThreads = 256;
constexpr int kFlashMaxPer = 16;  // B hd <= kFlashThreads kFlashMaxPer
constexpr int64_t kFlashMaxHeadDim = 1024;
constexpr size_t kFlashSmem = 48 * 1024;

__device__ inline float dot_hd(const float* a, const float* b, int hd) {
  float acc = 0;
  for (int e = 0; e < hd; ++e) acc += a[e] * b[e];
  return acc;
}

// Rows [r0, r0 + B) of a matrix with row stride `stride` (columns [0, hd) from
// `base`) into sm (row stride ld); rows at or past T are zeros.
__device__ inline void load_tile(float* sm, int ld, const float* base, int64_t stride, int64_t r0, int B, int64_t T,
                                 int hd) {
  for (int e = threadIdx.x; e < B * hd; e += kFlashThreads) {
    const int r = e / hd, c = e - r * hd;
    sm[r * ld + c] = r0 + r < T ? base[(r0 + r) * stride + c] : 0.0f;
  }
}

// Whether query i may see key j.
__device__ inline bool visible(const AttnDims& d, int64_t i, int64_t j) {
  return i < d.T && j < d.T && (!d.causal || j <= i);
}

// Forward (FlashAttention-2, Dao 2023, Alg. 1, fp32): block per (s, h, query
// tile i0); key tiles ascending. Per tile: S = scale Q K^T (masked -inf) into
// shared memory; thread r < B updates row r's running max m, sum l (keys in
// order, sum before dropout) and leaves e = exp(S - m_new) (times the dropout
// factor, keyed as attn_softmax) in S; then acc = acc corr + S V.
__global__ void __launch_bounds__(kFlashThreads)
    flash_fwd_k(AttnDims d, int B, const float* q, const float* k, const float* v, float* ctx, float* lse) {
  extern __shared__ float smem[];
  const int hd = static_cast<int>(d.hd), ld = hd | 1, sld = B + 1, tid = threadIdx.x, nacc = B * hd;
  float* Qs = smem;
  float* Ks = Qs + B * ld;
  float* Vs = Ks + B * ld;
  float* Ss = Vs + B * ld;  // [B, B + 1]
  float* mrow = Ss + B * sld;
  float* lrow = mrow + B;
  float* crow = lrow + B;
  const int64_t tiles = (d.T + B - 1) / B;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x % tiles) * B, sh = blockIdx.x / tiles, h = sh % d.H,
                s = sh / d.H, g = h / d.group;
  load_tile(Qs, ld, q + s * d.T * d.qw() + h * d.hd, d.qw(), i0, B, d.T, hd);
  for (int r = tid; r < B; r += kFlashThreads) {
    mrow[r] = -INFINITY;
    lrow[r] = 0.0f;
  }
  float acc[kFlashMaxPer];
#pragma unroll
  for (int t = 0; t < kFlashMaxPer; ++t) acc[t] = 0.0f;
  const int64_t jend = d.causal ? (i0 + B < d.T ? i0 + B : d.T) : d.T;
  for (int64_t j0 = 0; j0 < jend; j0 += B) {
    __syncthreads();  // the previous tile's readers are done
    load_tile(Ks, ld, k + s * d.T * d.kw() + g * d.hd, d.kw(), j0, B, d.T, hd);
    load_tile(Vs, ld, v + s * d.T * d.kw() + g * d.hd, d.kw(), j0, B, d.T, hd);
    __syncthreads();
    for (int e = tid; e < B * B; e += kFlashThreads) {
      const int r = e / B, c = e - r * B;
      Ss[r * sld + c] = visible(d, i0 + r, j0 + c) ? d.scale * dot_hd(Qs + r * ld, Ks + c * ld, hd) : -INFINITY;
    }
    __syncthreads();
    for (int r = tid; r < B; r += kFlashThreads) {
      float* row = Ss + r * sld;
      float mx = -INFINITY;
      for (int c = 0; c < B; ++c) mx = fmaxf(mx, row[c]);
      const float mold = mrow[r], mnew = fmaxf(mold, mx);
      if (mnew == -INFINITY) {  // nothing visible yet for this row
        for (int c = 0; c < B; ++c) row[c] = 0.0f;
        crow[r] = 1.0f;
        continue;
      }
      const float corr = expf(mold - mnew);
      float sum = 0.0f;
      for (int c = 0; c < B; ++c) {
        const float e = expf(row[c] - mnew);  // masked: exp(-inf) = 0
        sum += e;
        row[c] = (d.dropout && visible(d, i0 + r, j0 + c)) ? e * drop_factor(d, s, h, i0 + r, j0 + c) : e;
      }
      lrow[r] = lrow[r] * corr + sum;
      mrow[r] = mnew;
      crow[r] = corr;
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < kFlashMaxPer; ++t) {
      const int e = tid + t * kFlashThreads;
      if (e < nacc) {
        const int r = e / hd, c = e - r * hd;
        const float* prow = Ss + r * sld;
        float a = acc[t] * crow[r];
        for (int jj = 0; jj < B; ++jj) a += prow[jj] * Vs[jj * ld + c];
        acc[t] = a;
      }
    }
  }
  // mrow / lrow were last written before the loop's final __syncthreads.
#pragma unroll
  for (int t = 0; t < kFlashMaxPer; ++t) {
    const int e = tid + t * kFlashThreads;
    if (e < nacc) {
      const int r = e / hd, c = e - r * hd;
      if (i0 + r < d.T) ctx[(s * d.T + i0 + r) * d.qw() + h * d.hd + c] = acc[t] * (1.0f / lrow[r]);
    }
  }
  for (int r = tid; r < B; r += kFlashThreads)
    if (i0 + r < d.T) lse[(s * d.H + h) * d.T + i0 + r] = mrow[r] + logf(lrow[r]);
}

// Backward, FlashAttention-2 (Dao 2023, Alg. 2) without atomics: D_i = dO_i . O_i
// once per query row (flash_rowdot_k); then one pass where a block owns a key
// tile (dk, dv; flash_dkv_k) and one where a block owns a query tile (dq;
// flash_dq_k), both recomputing P = exp(scale q k^T - lse) and
// dS = P (dP~ f - D) with dP~ = dO v^T and f the dropout factor.

// D[(s H + h) T + i] = sum_e dO[s, i, h, e] O[s, i, h, e] in double (as the CPU):
// a warp per row, lanes over e, then a fixed xor-shuffle tree.
__global__ void flash_rowdot_k(AttnDims d, const float* ctx, const float* dctx, float* D) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32, rows = d.b * d.H * d.T;
  if (row >= rows) return;  // whole warps (row is the warp's)
  const int lane = threadIdx.x & 31;
  const int64_t i = row % d.T, sh = row / d.T, h = sh % d.H, s = sh / d.H;
  const int64_t off = (s * d.T + i) * d.qw() + h * d.hd;
  double acc = 0;
  for (int64_t e = lane; e < d.hd; e += 32) acc += double{dctx[off + e]} * ctx[off + e];
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) D[row] = static_cast<float>(acc);
}

// Row stats of a query tile: lse and D for rows [i0, i0 + B) of head (s, h); 0 past T.
__device__ inline void load_row_stats(float* Ls, float* Ds, const AttnDims& d, const float* lse, const float* D,
                                      int64_t s, int64_t h, int64_t i0, int B) {
  for (int r = threadIdx.x; r < B; r += kFlashThreads) {
    const bool in = i0 + r < d.T;
    Ls[r] = in ? lse[(s * d.H + h) * d.T + i0 + r] : 0.0f;
    Ds[r] = in ? D[(s * d.H + h) * d.T + i0 + r] : 0.0f;
  }
}

// dk, dv: block per (s, g, key tile j0); query heads h of group g ascending, query
// tiles ascending (causal: from the tile holding query j0). Per tile:
// Ps = P f, dSs = dS (rows queries, columns keys); then
// dv[j] += sum_r Ps[r, j] dO[r], dk[j] += sum_r dSs[r, j] q[r] (r ascending), and
// at the end dk += scale acc.
__global__ void __launch_bounds__(kFlashThreads)
    flash_dkv_k(AttnDims d, int B, const float* q, const float* k, const float* v, const float* lse, const float* D,
                const float* dctx, float* dk, float* dv) {
  extern __shared__ float smem[];
  const int hd = static_cast<int>(d.hd), ld = hd | 1, sld = B + 1, tid = threadIdx.x, nacc = B * hd;
  float* Ks = smem;
  float* Vs = Ks + B * ld;
  float* Qs = Vs + B * ld;
  float* dOs = Qs + B * ld;
  float* Ps = dOs + B * ld;  // [B, B + 1]
  float* dSs = Ps + B * sld;
  float* Ls = dSs + B * sld;
  float* Ds = Ls + B;
  const int64_t tiles = (d.T + B - 1) / B;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x % tiles) * B, sg = blockIdx.x / tiles, g = sg % d.KV,
                s = sg / d.KV;
  load_tile(Ks, ld, k + s * d.T * d.kw() + g * d.hd, d.kw(), j0, B, d.T, hd);
  load_tile(Vs, ld, v + s * d.T * d.kw() + g * d.hd, d.kw(), j0, B, d.T, hd);
  float dka[kFlashMaxPer], dva[kFlashMaxPer];
#pragma unroll
  for (int t = 0; t < kFlashMaxPer; ++t) dka[t] = dva[t] = 0.0f;
  for (int64_t h = g * d.group; h < (g + 1) * d.group; ++h) {
    const float* Qh = q + s * d.T * d.qw() + h * d.hd;
    const float* dOh = dctx + s * d.T * d.qw() + h * d.hd;
    for (int64_t i0 = d.causal ? j0 : 0; i0 < d.T; i0 += B) {
      __syncthreads();  // the previous tile's readers are done
      load_tile(Qs, ld, Qh, d.qw(), i0, B, d.T, hd);
      load_tile(dOs, ld, dOh, d.qw(), i0, B, d.T, hd);
      load_row_stats(Ls, Ds, d, lse, D, s, h, i0, B);
      __syncthreads();
      for (int e = tid; e < B * B; e += kFlashThreads) {
        const int r = e / B, c = e - r * B;
        const int64_t i = i0 + r, j = j0 + c;
        float pf = 0.0f, ds = 0.0f;
        if (visible(d, i, j)) {
          const float p = expf(d.scale * dot_hd(Qs + r * ld, Ks + c * ld, hd) - Ls[r]);
          const float f = d.dropout ? drop_factor(d, s, h, i, j) : 1.0f;
          pf = p * f;
          ds = p * (dot_hd(dOs + r * ld, Vs + c * ld, hd) * f - Ds[r]);
        }
        Ps[r * sld + c] = pf;
        dSs[r * sld + c] = ds;
      }
      __syncthreads();
#pragma unroll
      for (int t = 0; t < kFlashMaxPer; ++t) {
        const int e = tid + t * kFlashThreads;
        if (e < nacc) {
          const int jj = e / hd, c = e - jj * hd;
          float av = dva[t], ak = dka[t];
          for (int r = 0; r < B; ++r) {
            av += Ps[r * sld + jj] * dOs[r * ld + c];
            ak += dSs[r * sld + jj] * Qs[r * ld + c];
          }
          dva[t] = av;
          dka[t] = ak;
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kFlashMaxPer; ++t) {
    const int e = tid + t * kFlashThreads;
    if (e < nacc) {
      const int jj = e / hd, c = e - jj * hd;
      if (j0 + jj < d.T) {
        const int64_t o = (s * d.T + j0 + jj) * d.kw() + g * d.hd + c;
        dv[o] += dva[t];
        dk[o] += d.scale * dka[t];
      }
    }
  }
}

// dq: block per (s, h, query tile i0); key tiles ascending (causal: up to the
// diagonal tile). Per tile dSs as in flash_dkv_k, then
// dq[i] += sum_j dSs[i, j] k[j] (j ascending); at the end dq += scale acc.
__global__ void __launch_bounds__(kFlashThreads)
    flash_dq_k(AttnDims d, int B, const float* q, const float* k, const float* v, const float* lse, const float* D,
               const float* dctx, float* dq) {
  extern __shared__ float smem[];
  const int hd = static_cast<int>(d.hd), ld = hd | 1, sld = B + 1, tid = threadIdx.x, nacc = B * hd;
  float* Qs = smem;
  float* dOs = Qs + B * ld;
  float* Ks = dOs + B * ld;
  float* Vs = Ks + B * ld;
  float* dSs = Vs + B * ld;  // [B, B + 1]
  float* Ls = dSs + B * sld;
  float* Ds = Ls + B;
  const int64_t tiles = (d.T + B - 1) / B;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x % tiles) * B, sh = blockIdx.x / tiles, h = sh % d.H,
                s = sh / d.H, g = h / d.group;
  load_tile(Qs, ld, q + s * d.T * d.qw() + h * d.hd, d.qw(), i0, B, d.T, hd);
  load_tile(dOs, ld, dctx + s * d.T * d.qw() + h * d.hd, d.qw(), i0, B, d.T, hd);
  load_row_stats(Ls, Ds, d, lse, D, s, h, i0, B);
  float dqa[kFlashMaxPer];
#pragma unroll
  for (int t = 0; t < kFlashMaxPer; ++t) dqa[t] = 0.0f;
  const int64_t jend = d.causal ? (i0 + B < d.T ? i0 + B : d.T) : d.T;
  for (int64_t j0 = 0; j0 < jend; j0 += B) {
    __syncthreads();  // the previous tile's readers are done
    load_tile(Ks, ld, k + s * d.T * d.kw() + g * d.hd, d.kw(), j0, B, d.T, hd);
    load_tile(Vs, ld, v + s * d.T * d.kw() + g * d.hd, d.kw(), j0, B, d.T, hd);
    __syncthreads();
    for (int e = tid; e < B * B; e += kFlashThreads) {
      const int r = e / B, c = e - r * B;
      const int64_t i = i0 + r, j = j0 + c;
      float ds = 0.0f;
      if (visible(d, i, j)) {
        const float p = expf(d.scale * dot_hd(Qs + r * ld, Ks + c * ld, hd) - Ls[r]);
        const float f = d.dropout ? drop_factor(d, s, h, i, j) : 1.0f;
        ds = p * (dot_hd(dOs + r * ld, Vs + c * ld, hd) * f - Ds[r]);
      }
      dSs[r * sld + c] = ds;
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < kFlashMaxPer; ++t) {
      const int e = tid + t * kFlashThreads;
      if (e < nacc) {
        const int r = e / hd, c = e - r * hd;
        float a = dqa[t];
        for (int jj = 0; jj < B; ++jj) a += dSs[r * sld + jj] * Ks[jj * ld + c];
        dqa[t] = a;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kFlashMaxPer; ++t) {
    const int e = tid + t * kFlashThreads;
    if (e < nacc) {
      const int r = e / hd, c = e - r * hd;
      if (i0 + r < d.T) dq[(s * d.T + i0 + r) * d.qw() + h * d.hd + c] += d.scale * dqa[t];
    }
  }
}

// Shared floats of a flash kernel with tile B: `mats` [B, ld] tiles, `squares`
// [B, B + 1] tiles and `vecs` [B] vectors.
size_t flash_smem(int B, int64_t hd, int mats, int squares, int vecs) {
  const size_t b = static_cast<size_t>(B), ld = static_cast<size_t>(hd | 1);
  return (mats * b * ld + squares * b * (b + 1) + vecs * b) * sizeof(float);
}

// The largest tile B <= 32 (a power of two) that fits 48 KiB of shared memory
// and the register accumulators; 0 if hd is too large.
int flash_tile(int64_t hd, int mats, int squares, int vecs) {
  if (hd < 1 || hd > kFlashMaxHeadDim) return 0;
  for (int B = 32; B >= 1; B /= 2)
    if (B * hd <= int64_t{kFlashThreads} * kFlashMaxPer && flash_smem(B, hd, mats, squares, vecs) <= kFlashSmem)
      return B;
  return 0;
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

cudaError_t flash_forward(const AttnDims& d, const float* q, const float* k, const float* v, float* ctx, float* lse,
                          cudaStream_t s) {
  const int64_t tiles_of = d.b * d.H;
  if (tiles_of <= 0 || d.T <= 0) return cudaSuccess;
  const int B = flash_tile(d.hd, 3, 1, 3);
  if (B == 0) return cudaErrorInvalidValue;
  const int64_t blocks = tiles_of * ((d.T + B - 1) / B);
  flash_fwd_k<<<static_cast<unsigned>(blocks), kFlashThreads, flash_smem(B, d.hd, 3, 1, 3), s>>>(d, B, q, k, v, ctx,
                                                                                                   lse);
  return cudaSuccess;
}

cudaError_t flash_backward(const AttnDims& d, const float* q, const float* k, const float* v, const float* ctx,
                           const float* lse, const float* dctx, float* dq, float* dk, float* dv, float* D,
                           cudaStream_t s) {
  const int64_t rows = d.b * d.H * d.T;
  if (rows <= 0) return cudaSuccess;
  const int Bkv = flash_tile(d.hd, 4, 2, 2), Bq = flash_tile(d.hd, 4, 1, 2);
  if (Bkv == 0 || Bq == 0) return cudaErrorInvalidValue;
  const int64_t warps_per_block = kThreads / 32;
  flash_rowdot_k<<<static_cast<unsigned>((rows + warps_per_block - 1) / warps_per_block), kThreads, 0, s>>>(d, ctx,
                                                                                                           dctx, D);
  const int64_t kv_blocks = d.b * d.KV * ((d.T + Bkv - 1) / Bkv), q_blocks = d.b * d.H * ((d.T + Bq - 1) / Bq);
  flash_dkv_k<<<static_cast<unsigned>(kv_blocks), kFlashThreads, flash_smem(Bkv, d.hd, 4, 2, 2), s>>>(d, Bkv, q, k, v,
                                                                                                       lse, D, dctx, dk,
                                                                                                       dv);
  flash_dq_k<<<static_cast<unsigned>(q_blocks), kFlashThreads, flash_smem(Bq, d.hd, 4, 1, 2), s>>>(d, Bq, q, k, v, lse,
                                                                                                   D, dctx, dq);
  return cudaSuccess;
}

}  // namespace dlplan::exec::cuda
