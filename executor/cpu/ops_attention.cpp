// Multi-head self-attention, math and flash forms (one op, DESIGN.md table).
//
//   q = x Wq^T + bq  [T, H hd];  k = m Wk^T + bk, v = m Wv^T + bv  [Tk, KV hd]
//   with m = x (Tk = T) but for cross attention, where m is the memory input
//   RoPE on q and k (optional);  query head h reads kv head h / (H / KV) (GQA)
//   S_h = scale q_h k_g^T + B_h  (scale 1/sqrt(hd) unless given; B the
//   optional position bias input [H, T, Tk]; causal: j > i masked);
//   P_h = softmax_rows(S_h)
//   P~_h = P_h mask / (1 - p)   (dropout on the probabilities, Philox-keyed)
//   context_h = P~_h v_g;  out = context Wo^T + bo
//
// Math form (decl saves "probs"): scores are the fwd temporary, and q, k, v
// (after RoPE), context, probs (+ probs_mask, probs_dropped with dropout) are
// saved. Flash form (decl saves "lse", and the position bias input): a streaming softmax over key blocks
// (Dao et al., FlashAttention, Alg. 1) keeps only the per-(head, token) fp32
// log-sum-exp; backward recomputes P = exp(S - lse) block by block (Alg. 2,
// with D_i = dO_i . O_i). Both forms compute the same math; the dropout mask of
// element (h, i, j) is keyed by its index (h T + i) Tk + j in either. The
// position bias's gradient is dS itself.
#include "cpu/ops.hpp"
#include "cpu/row_reduce.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string_view>
#include <vector>

namespace dlplan::exec::cpu {
namespace {

constexpr int64_t kBlock = 64;  // flash query / key block
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Dims {
  int64_t b, T, Tk, D, Dm, H, KV, hd, group;
  bool causal, rope, flash;
  int64_t rot;  // leading dims of each head that RoPE rotates
  AttentionShape shape;
  double p, theta;
  float scale;
  int64_t qw() const { return H * hd; }   // width of q and context rows
  int64_t kw() const { return KV * hd; }  // width of k and v rows
};

Dims dims_of(const OpContext& c) {
  const AttentionShape a = attention_shape(*c.model, *c.node);
  Dims d{};
  d.b = c.batch;
  d.T = a.T;
  d.Tk = a.Tk;
  d.D = a.D;
  d.Dm = a.Dm;
  d.H = a.H;
  d.KV = a.KV;
  d.hd = a.hd;
  d.group = a.group();
  d.causal = a.causal;
  d.shape = a;
  d.rope = a.rope;
  d.rot = a.rotary_dim;
  d.p = c.training ? a.dropout : 0.0;
  d.theta = a.rope_theta;
  d.scale = static_cast<float>(a.scale);
  d.flash = keeps_log_sum_exp(*c.decl);
  return d;
}

// Parameters in declaration order: q, k, v, o weights, then the biases present
// (AttentionShape::bias_param).
const float* weight(const OpContext& c, int i) { return c.params[static_cast<size_t>(i)].f(); }
const float* bias_of(const OpContext& c, const Dims& d, int i) {
  const int k = d.shape.bias_param(i);
  return k < 0 ? nullptr : c.params[static_cast<size_t>(k)].f();
}

// y [R, o] = x [R, in] W^T + bias.
void project(const float* x, const float* w, const float* bias, float* y, int64_t R, int64_t in, int64_t o) {
  if (bias)
    for (int64_t r = 0; r < R; ++r) std::memcpy(y + r * o, bias, static_cast<size_t>(o) * sizeof(float));
  gemm(false, true, R, o, in, 1.0f, x, in, w, in, bias ? 1.0f : 0.0f, y, o);
}

// dx += dy W;  dW += dy^T x;  dbias += sum_r dy. A null dx, dw or dbias is
// not wanted (frozen weights read no x).
void project_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* dbias, int64_t R,
                      int64_t in, int64_t o) {
  if (dx) gemm(false, false, R, in, o, 1.0f, dy, o, w, in, 1.0f, dx, in);
  if (dw) gemm(true, false, o, in, R, 1.0f, dy, o, x, in, 1.0f, dw, in);
  if (dbias)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < o; ++j) dbias[j] += dy[r * o + j];
}

// RoPE, rotate-half form (HF Llama's apply_rotary_pos_emb) on the first
// rot = rotary_dim dims of each head (all of them but for Phi's partial
// rotary, whose other dims pass through): for position t and i < rot/2,
// angle = t theta^(-2i/rot), pairs (x_i, x_{i+rot/2}):
//   forward: (x1 cos - x2 sin, x2 cos + x1 sin)
//   inverse (the transpose, for gradients): (y1 cos + y2 sin, y2 cos - y1 sin)
void rope(float* t, const Dims& d, int64_t heads, bool inverse) {
  const int64_t half = d.rot / 2, width = heads * d.hd;
  std::vector<float> cs(static_cast<size_t>(d.T * half)), sn(static_cast<size_t>(d.T * half));
  for (int64_t pos = 0; pos < d.T; ++pos)
    for (int64_t i = 0; i < half; ++i) {
      const double inv_freq = 1.0 / std::pow(d.theta, static_cast<double>(2 * i) / static_cast<double>(d.rot));
      const double ang = static_cast<double>(pos) * inv_freq;
      cs[static_cast<size_t>(pos * half + i)] = static_cast<float>(std::cos(ang));
      sn[static_cast<size_t>(pos * half + i)] = static_cast<float>(std::sin(ang));
    }
  const float sign = inverse ? -1.0f : 1.0f;
  for (int64_t s = 0; s < d.b; ++s)
    for (int64_t pos = 0; pos < d.T; ++pos)
      for (int64_t h = 0; h < heads; ++h) {
        float* x = t + (s * d.T + pos) * width + h * d.hd;
        for (int64_t i = 0; i < half; ++i) {
          const float co = cs[static_cast<size_t>(pos * half + i)], si = sign * sn[static_cast<size_t>(pos * half + i)];
          const float x1 = x[i], x2 = x[i + half];
          x[i] = x1 * co - x2 * si;
          x[i + half] = x2 * co + x1 * si;
        }
      }
}

// Dropout on probability (h, i, j) of sample s: the multiplier (0 or 1/(1-p)).
struct ProbDropout {
  const OpContext& c;
  const Dims& d;
  float pf = 0, keep_scale = 1;
  ProbDropout(const OpContext& ctx, const Dims& dm)
      : c(ctx), d(dm), pf(static_cast<float>(dm.p)), keep_scale(static_cast<float>(1.0 / (1.0 - dm.p))) {}
  bool active() const { return d.p > 0; }
  // The multipliers of probabilities (h, i, j0 .. j0 + n - 1) of sample s, into f[0..n).
  void row(int64_t s, int64_t h, int64_t i, int64_t j0, int64_t n, float* f) const {
    dropout_uniforms(c.seed, c.node_index, c.first_sample + s, (h * d.T + i) * d.Tk + j0, n, f);
    for (int64_t j = 0; j < n; ++j) f[j] = f[j] < pf ? 0.0f : keep_scale;
  }
};

// ---- math form ---------------------------------------------------------------------

// bias: the position bias [b, H, T, Tk], or null.
void math_forward(OpContext& c, const Dims& d, const float* q, const float* k, const float* v, const float* bias,
                  float* ctx) {
  const int64_t TT = d.T * d.Tk;
  Tensor scores = alloc_temp(c, {d.b, d.H, d.T, d.Tk}, "scores");
  Tensor probs = alloc_saved(c, {d.b, d.H, d.T, d.Tk}, compute(c), "probs");
  const bool with_dropout = c.node->attrs.number("dropout") > 0;  // declared tensors, even in eval
  Tensor mask, dropped;
  if (with_dropout) {
    mask = alloc_saved_bytes(c, d.b * d.H * TT, "probs_mask");
    dropped = alloc_saved(c, {d.b, d.H, d.T, d.Tk}, compute(c), "probs_dropped");
  }
  // Each block is rounded to the storage dtype once final (bf16-mixed), so
  // the next step reads what is stored.
  Fp32Buffer sbuf(scores), pbuf(probs), dbuf(dropped);
  const ProbDropout drop(c, d);
  std::vector<float> factors(static_cast<size_t>(d.Tk));  // one row's dropout multipliers
  for (int64_t s = 0; s < d.b; ++s)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t g = h / d.group, sh = s * d.H + h;
      float* S = sbuf.data() + sh * TT;
      float* P = pbuf.data() + sh * TT;
      gemm(false, true, d.T, d.Tk, d.hd, d.scale, q + s * d.T * d.qw() + h * d.hd, d.qw(),
           k + s * d.Tk * d.kw() + g * d.hd, d.kw(), 0.0f, S, d.Tk);
      if (bias)
        for (int64_t e = 0; e < TT; ++e) S[e] += bias[sh * TT + e];
      sbuf.round(S, TT);
      for (int64_t i = 0; i < d.T; ++i) {
        float* srow = S + i * d.Tk;
        float* prow = P + i * d.Tk;
        const int64_t valid = d.causal ? i + 1 : d.Tk;
        for (int64_t j = valid; j < d.Tk; ++j) srow[j] = kNegInf;
        const double sum = exp_shifted_sum(srow, row_max(srow, valid), prow, valid);
        const float inv = static_cast<float>(1.0 / sum);
        for (int64_t j = 0; j < valid; ++j) prow[j] *= inv;
        for (int64_t j = valid; j < d.Tk; ++j) prow[j] = 0.0f;
      }
      pbuf.round(P, TT);
      const float* Pv = P;  // the probabilities that multiply v
      if (with_dropout) {
        uint8_t* m = mask.u8() + sh * TT;
        float* Pd = dbuf.data() + sh * TT;
        for (int64_t i = 0; i < d.T; ++i) {
          float* f = factors.data();
          if (drop.active())
            drop.row(s, h, i, 0, d.Tk, f);
          else
            std::fill(factors.begin(), factors.end(), 1.0f);
          for (int64_t j = 0; j < d.Tk; ++j) {
            m[i * d.Tk + j] = f[j] != 0.0f ? 1 : 0;
            Pd[i * d.Tk + j] = P[i * d.Tk + j] * f[j];
          }
        }
        dbuf.round(Pd, TT);
        Pv = Pd;
      }
      gemm(false, false, d.T, d.hd, d.Tk, 1.0f, Pv, d.Tk, v + s * d.Tk * d.kw() + g * d.hd, d.kw(), 0.0f,
           ctx + s * d.T * d.qw() + h * d.hd, d.qw());
    }
  sbuf.store();
  pbuf.store();
  if (with_dropout) dbuf.store();
  c.saved.push_back(std::move(probs));
  if (with_dropout) {
    c.saved.push_back(std::move(mask));
    c.saved.push_back(std::move(dropped));
  }
}

// dP~ = dctx v^T;  dv += P~^T dctx;  dP = dP~ mask / (1 - p);
// dS = P (dP - rowsum(P dP)) (softmax's Jacobian);  dq += scale dS k;  dk += scale dS^T q;
// dbias += dS (dbias null: not wanted).
void math_backward(OpContext& c, const Dims& d, const float* dctx, float* dq, float* dk, float* dv, float* dbias) {
  const int64_t TT = d.T * d.Tk;
  const float* q = saved_named(c, "q").f();
  const float* k = saved_named(c, "k").f();
  const float* v = saved_named(c, "v").f();
  const float* probs = saved_named(c, "probs").f();
  const bool with_dropout = keeps_own(c, "probs_mask");
  Tensor dprobs = alloc_temp(c, {d.b, d.H, d.T, d.Tk}, "dprobs");
  Fp32Buffer dpbuf(dprobs);
  const float keep_scale = d.p > 0 ? static_cast<float>(1.0 / (1.0 - d.p)) : 1.0f;
  for (int64_t s = 0; s < d.b; ++s)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t g = h / d.group, sh = s * d.H + h;
      const float* P = probs + sh * TT;
      const float* Pv = with_dropout ? saved_named(c, "probs_dropped").f() + sh * TT : P;
      float* dP = dpbuf.data() + sh * TT;
      const float* dctx_h = dctx + s * d.T * d.qw() + h * d.hd;
      gemm(false, true, d.T, d.Tk, d.hd, 1.0f, dctx_h, d.qw(), v + s * d.Tk * d.kw() + g * d.hd, d.kw(), 0.0f, dP, d.Tk);
      gemm(true, false, d.Tk, d.hd, d.T, 1.0f, Pv, d.Tk, dctx_h, d.qw(), 1.0f, dv + s * d.Tk * d.kw() + g * d.hd, d.kw());
      if (with_dropout) {
        const uint8_t* m = saved_named(c, "probs_mask").u8() + sh * TT;
        for (int64_t e = 0; e < TT; ++e) dP[e] = m[e] ? dP[e] * keep_scale : 0.0f;
      }
      for (int64_t i = 0; i < d.T; ++i) {
        const float* prow = P + i * d.Tk;
        float* drow = dP + i * d.Tk;
        const double dot = lane_sum(d.Tk, [=](int64_t j) { return double{prow[j]} * drow[j]; });
        for (int64_t j = 0; j < d.Tk; ++j) drow[j] = prow[j] * (drow[j] - static_cast<float>(dot));
      }
      dpbuf.round(dP, TT);
      if (dbias)
        for (int64_t e = 0; e < TT; ++e) dbias[sh * TT + e] += dP[e];
      gemm(false, false, d.T, d.hd, d.Tk, d.scale, dP, d.Tk, k + s * d.Tk * d.kw() + g * d.hd, d.kw(), 1.0f,
           dq + s * d.T * d.qw() + h * d.hd, d.qw());
      gemm(true, false, d.Tk, d.hd, d.T, d.scale, dP, d.Tk, q + s * d.T * d.qw() + h * d.hd, d.qw(), 1.0f,
           dk + s * d.Tk * d.kw() + g * d.hd, d.kw());
    }
  dpbuf.store();
}

// ---- flash form --------------------------------------------------------------------

// S [nq, nk] += the position bias's block at queries i0.., keys j0.. (rows of Tk).
void add_bias_block(float* S, const float* bias, int64_t Tk, int64_t i0, int64_t j0, int64_t nq, int64_t nk) {
  for (int64_t r = 0; r < nq; ++r)
    for (int64_t j = 0; j < nk; ++j) S[r * nk + j] += bias[(i0 + r) * Tk + j0 + j];
}

// Streaming softmax: per query block, running max m, running sum l, and the
// unnormalised accumulator acc; each key block rescales them by exp(m_old - m_new).
void flash_forward(OpContext& c, const Dims& d, const float* q, const float* k, const float* v, const float* bias,
                   float* ctx) {
  Tensor lse_t = alloc_saved(c, {d.b, d.H, d.T}, DType::f32, "lse");
  const ProbDropout drop(c, d);
  std::vector<float> S(static_cast<size_t>(kBlock * kBlock)), acc(static_cast<size_t>(kBlock * d.hd));
  std::vector<float> m(static_cast<size_t>(kBlock)), l(static_cast<size_t>(kBlock));
  std::vector<float> factors(static_cast<size_t>(kBlock));  // one block row's dropout multipliers
  for (int64_t s = 0; s < d.b; ++s)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t g = h / d.group;
      const float* Qh = q + s * d.T * d.qw() + h * d.hd;
      const float* Kg = k + s * d.Tk * d.kw() + g * d.hd;
      const float* Vg = v + s * d.Tk * d.kw() + g * d.hd;
      const float* Bh = bias ? bias + (s * d.H + h) * d.T * d.Tk : nullptr;
      float* O = ctx + s * d.T * d.qw() + h * d.hd;
      float* lse = lse_t.f() + (s * d.H + h) * d.T;
      for (int64_t i0 = 0; i0 < d.T; i0 += kBlock) {
        const int64_t nq = std::min(kBlock, d.T - i0);
        std::fill(m.begin(), m.end(), kNegInf);
        std::fill(l.begin(), l.end(), 0.0f);
        std::fill(acc.begin(), acc.end(), 0.0f);
        const int64_t jend = d.causal ? i0 + nq : d.Tk;
        for (int64_t j0 = 0; j0 < jend; j0 += kBlock) {
          const int64_t nk = std::min(kBlock, jend - j0);
          gemm(false, true, nq, nk, d.hd, d.scale, Qh + i0 * d.qw(), d.qw(), Kg + j0 * d.kw(), d.kw(), 0.0f, S.data(), nk);
          if (Bh) add_bias_block(S.data(), Bh, d.Tk, i0, j0, nq, nk);
          for (int64_t r = 0; r < nq; ++r) {
            const int64_t i = i0 + r;
            float* row = S.data() + r * nk;
            const int64_t valid = d.causal ? std::clamp<int64_t>(i + 1 - j0, 0, nk) : nk;
            const float mnew = std::max(m[static_cast<size_t>(r)], row_max(row, valid));
            if (mnew == kNegInf) {  // nothing visible yet for this row
              std::fill(row, row + nk, 0.0f);
              continue;
            }
            const float corr = std::exp(m[static_cast<size_t>(r)] - mnew);
            const auto sum = static_cast<float>(exp_shifted_sum(row, mnew, row, valid));
            std::fill(row + valid, row + nk, 0.0f);
            l[static_cast<size_t>(r)] = l[static_cast<size_t>(r)] * corr + sum;
            m[static_cast<size_t>(r)] = mnew;
            for (int64_t e = 0; e < d.hd; ++e) acc[static_cast<size_t>(r * d.hd + e)] *= corr;
            if (drop.active()) {
              drop.row(s, h, i, j0, valid, factors.data());
              for (int64_t j = 0; j < valid; ++j) row[j] *= factors[static_cast<size_t>(j)];
            }
          }
          gemm(false, false, nq, d.hd, nk, 1.0f, S.data(), nk, Vg + j0 * d.kw(), d.kw(), 1.0f, acc.data(), d.hd);
        }
        for (int64_t r = 0; r < nq; ++r) {
          const float inv = 1.0f / l[static_cast<size_t>(r)];
          for (int64_t e = 0; e < d.hd; ++e) O[(i0 + r) * d.qw() + e] = acc[static_cast<size_t>(r * d.hd + e)] * inv;
          lse[i0 + r] = m[static_cast<size_t>(r)] + std::log(l[static_cast<size_t>(r)]);
        }
      }
    }
  c.saved.push_back(std::move(lse_t));
}

// Recompute P = exp(scale q k^T + B - lse) per block; D_i = dO_i . O_i;
// dv += P~^T dO;  dP = (dO v^T) mask / (1 - p);  dS = P (dP - D_i);
// dq += scale dS k;  dk += scale dS^T q;  dB += dS.
void flash_backward(OpContext& c, const Dims& d, const float* dctx, const float* bias, float* dq, float* dk, float* dv,
                    float* dbias) {
  const float* q = saved_named(c, "q").f();
  const float* k = saved_named(c, "k").f();
  const float* v = saved_named(c, "v").f();
  const float* ctx = saved_named(c, "context").f();
  const float* lse_all = saved_named(c, "lse").f();
  const ProbDropout drop(c, d);
  const size_t blk = static_cast<size_t>(kBlock * kBlock);
  std::vector<float> P(blk), Pd(blk), dP(blk), Dvec(static_cast<size_t>(d.T));
  std::vector<float> factors(static_cast<size_t>(kBlock));  // one block row's dropout multipliers
  for (int64_t s = 0; s < d.b; ++s)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t g = h / d.group;
      const int64_t qoff = s * d.T * d.qw() + h * d.hd, koff = s * d.Tk * d.kw() + g * d.hd;
      const int64_t boff = (s * d.H + h) * d.T * d.Tk;
      const float* lse = lse_all + (s * d.H + h) * d.T;
      for (int64_t i = 0; i < d.T; ++i) {
        double acc = 0;
        for (int64_t e = 0; e < d.hd; ++e) acc += double{dctx[qoff + i * d.qw() + e]} * ctx[qoff + i * d.qw() + e];
        Dvec[static_cast<size_t>(i)] = static_cast<float>(acc);
      }
      for (int64_t i0 = 0; i0 < d.T; i0 += kBlock) {
        const int64_t nq = std::min(kBlock, d.T - i0);
        const int64_t jend = d.causal ? i0 + nq : d.Tk;
        for (int64_t j0 = 0; j0 < jend; j0 += kBlock) {
          const int64_t nk = std::min(kBlock, jend - j0);
          gemm(false, true, nq, nk, d.hd, d.scale, q + qoff + i0 * d.qw(), d.qw(), k + koff + j0 * d.kw(), d.kw(), 0.0f,
               P.data(), nk);
          if (bias) add_bias_block(P.data(), bias + boff, d.Tk, i0, j0, nq, nk);
          gemm(false, true, nq, nk, d.hd, 1.0f, dctx + qoff + i0 * d.qw(), d.qw(), v + koff + j0 * d.kw(), d.kw(), 0.0f,
               dP.data(), nk);
          for (int64_t r = 0; r < nq; ++r) {
            const int64_t i = i0 + r;
            const int64_t valid = d.causal ? std::clamp<int64_t>(i + 1 - j0, 0, nk) : nk;
            std::fill(factors.begin(), factors.end(), 1.0f);
            if (drop.active()) drop.row(s, h, i, j0, valid, factors.data());
            float* prow = P.data() + r * nk;
            exp_shifted(prow, lse[i], prow, valid);
            std::fill(prow + valid, prow + nk, 0.0f);
            for (int64_t j = 0; j < nk; ++j) {
              const size_t e = static_cast<size_t>(r * nk + j);
              const float p = P[e];
              const float f = factors[static_cast<size_t>(j)];
              Pd[e] = p * f;
              dP[e] = p * (dP[e] * f - Dvec[static_cast<size_t>(i)]);  // dS
            }
            if (dbias)
              for (int64_t j = 0; j < nk; ++j) dbias[boff + i * d.Tk + j0 + j] += dP[static_cast<size_t>(r * nk + j)];
          }
          gemm(true, false, nk, d.hd, nq, 1.0f, Pd.data(), nk, dctx + qoff + i0 * d.qw(), d.qw(), 1.0f,
               dv + koff + j0 * d.kw(), d.kw());
          gemm(false, false, nq, d.hd, nk, d.scale, dP.data(), nk, k + koff + j0 * d.kw(), d.kw(), 1.0f,
               dq + qoff + i0 * d.qw(), d.qw());
          gemm(true, false, nk, d.hd, nq, d.scale, dP.data(), nk, q + qoff + i0 * d.qw(), d.qw(), 1.0f,
               dk + koff + j0 * d.kw(), d.kw());
        }
      }
    }
}

}  // namespace

// LoRA adapters on the projections (ops_lora.cpp): in q, k, v, o order, each
// with its A and B after the node's own parameters, its input width and the
// projection it adds to.
struct Adapter {
  LoraAdapter a;
  int param = 0;  // index of A in c.params (B follows)
  int proj = 0;   // 0 q, 1 k, 2 v, 3 o
};
std::vector<Adapter> adapters_of(const OpContext& c, const Dims& d) {
  std::vector<Adapter> out;
  int next = d.shape.own_params();
  for (const LoraAdapter& a : lora_adapters(*c.model, *c.node)) {
    out.push_back({a, next, static_cast<int>(std::string_view("qkvo").find(a.prefix[0]))});
    next += 2;
  }
  return out;
}

// x: [b, T, D] (memory [b, Tk, Dm], bias [b, H, T, Tk]) -> out: [b, T, D].
void attention_forward(OpContext& c) {
  const Dims d = dims_of(c);
  const int64_t R = d.b * d.T, Rk = d.b * d.Tk;
  const float* x = c.in[0].f();
  const float* mem = d.shape.cross ? c.in[1].f() : x;  // what k and v are projected from
  const float* bias = d.shape.bias_input >= 0 ? c.in[static_cast<size_t>(d.shape.bias_input)].f() : nullptr;
  Tensor q = alloc_saved(c, {d.b, d.T, d.qw()}, compute(c), "q");
  Tensor k = alloc_saved(c, {d.b, d.Tk, d.kw()}, compute(c), "k");
  Tensor v = alloc_saved(c, {d.b, d.Tk, d.kw()}, compute(c), "v");
  // Not kept when only dW_o would read it (W_o frozen, math form): a temporary.
  const bool keep_context = keeps_own(c, "context");
  Tensor ctx = keep_context ? alloc_saved(c, {d.b, d.T, d.qw()}, compute(c), "context")
                            : alloc_temp(c, {d.b, d.T, d.qw()}, "context");
  Fp32Buffer qb(q), kb(k), vb(v), cb(ctx);  // each stored (bf16 under bf16-mixed) once computed
  project(x, weight(c, 0), bias_of(c, d, 0), qb.data(), R, d.D, d.qw());
  project(mem, weight(c, 1), bias_of(c, d, 1), kb.data(), Rk, d.Dm, d.kw());
  project(mem, weight(c, 2), bias_of(c, d, 2), vb.data(), Rk, d.Dm, d.kw());
  // LoRA on q, k, v: added to the projection before RoPE; each keeps x A^T,
  // saved after the core's tensors (the declaration's order).
  const std::vector<Adapter> lora = adapters_of(c, d);
  std::vector<Tensor> lora_xa;
  std::vector<Fp32Buffer> lora_xb;
  lora_xb.reserve(lora.size());
  float* proj_out[3] = {qb.data(), kb.data(), vb.data()};
  for (const Adapter& ad : lora) {
    const bool on_memory = ad.proj == 1 || ad.proj == 2;
    lora_xa.push_back(alloc_saved(c, {on_memory ? Rk : R, ad.a.rank}, compute(c), ad.a.prefix + "lora_xa"));
    lora_xb.emplace_back(lora_xa.back());
    if (ad.proj < 3)
      lora_forward(on_memory ? mem : x, weight(c, ad.param), weight(c, ad.param + 1), static_cast<float>(ad.a.scale),
                   lora_xb.back().data(), proj_out[ad.proj], on_memory ? Rk : R, ad.a.in, ad.a.out, ad.a.rank);
  }
  if (d.rope) {
    rope(qb.data(), d, d.H, false);
    rope(kb.data(), d, d.KV, false);
  }
  qb.store();
  kb.store();
  vb.store();
  // Saved in declaration order: q, k, v, context, then lse or probs (+mask, dropped).
  c.saved.push_back(q);
  c.saved.push_back(k);
  c.saved.push_back(v);
  if (keep_context) c.saved.push_back(ctx);
  if (d.flash)
    flash_forward(c, d, qb.data(), kb.data(), vb.data(), bias, cb.data());
  else
    math_forward(c, d, qb.data(), kb.data(), vb.data(), bias, cb.data());
  cb.store();
  project(cb.data(), weight(c, 3), bias_of(c, d, 3), c.out.f(), R, d.qw(), d.D);
  for (size_t j = 0; j < lora.size(); ++j) {
    const Adapter& ad = lora[j];
    if (ad.proj == 3)  // LoRA on o reads the context
      lora_forward(cb.data(), weight(c, ad.param), weight(c, ad.param + 1), static_cast<float>(ad.a.scale),
                   lora_xb[j].data(), c.out.f(), R, ad.a.in, ad.a.out, ad.a.rank);
    lora_xb[j].store();
    c.saved.push_back(lora_xa[j]);
  }
}

void attention_backward(OpContext& c) {
  const Dims d = dims_of(c);
  const int64_t R = d.b * d.T, Rk = d.b * d.Tk;
  const float* x = c.in[0].defined() ? c.in[0].f() : nullptr;  // not kept when the projections are frozen
  const float* mem = !d.shape.cross ? x : c.in[1].defined() ? c.in[1].f() : nullptr;
  const size_t bi = static_cast<size_t>(d.shape.bias_input);
  const float* bias = d.shape.bias_input >= 0 && c.in[bi].defined() ? c.in[bi].f() : nullptr;  // flash keeps it
  float* dbias = d.shape.bias_input >= 0 && c.din[bi].defined() ? c.din[bi].f() : nullptr;
  const float* dy = c.dout.f();
  auto dparam = [&](int i) { return grad_or_null(c.dparams[static_cast<size_t>(i)]); };  // null: frozen
  auto proj_bias_grad = [&](int i) { const int k = d.shape.bias_param(i); return k < 0 ? nullptr : dparam(k); };

  // Output projection: dcontext = dy Wo; dWo += dy^T context; dbo += sum dy.
  // LoRA: one d(x A^T) scratch per adapter, as declared (bwd_temps).
  const std::vector<Adapter> lora = adapters_of(c, d);
  std::vector<Tensor> dxa;
  std::vector<Fp32Buffer> dxab;
  dxab.reserve(lora.size());
  for (const Adapter& ad : lora) {
    dxa.push_back(alloc_temp(c, {d.b * ad.a.rows, ad.a.rank}, ad.a.prefix + "lora_dxa"));  // R, or Rk for k and v
    dxab.emplace_back(dxa.back());
  }
  auto lora_back = [&](size_t j, const float* in, const float* dproj, float* din, int64_t rows) {
    const Adapter& ad = lora[j];
    lora_backward(in, weight(c, ad.param), weight(c, ad.param + 1), static_cast<float>(ad.a.scale),
                  saved_named(c, ad.a.prefix + "lora_xa").f(), dproj, dxab[j].data(), dparam(ad.param),
                  dparam(ad.param + 1), din, rows, ad.a.in, ad.a.out, ad.a.rank);
  };

  Tensor dctx = alloc_temp(c, {d.b, d.T, d.qw()}, "dcontext", true);
  Fp32Buffer dcb(dctx, /*load=*/true);
  const Tensor& context = saved_named(c, "context");  // undefined when W_o is frozen (then not read)
  project_backward(context.defined() ? context.f() : nullptr, weight(c, 3), dy, dcb.data(), dparam(3), proj_bias_grad(3), R,
                   d.qw(), d.D);
  for (size_t j = 0; j < lora.size(); ++j)
    if (lora[j].proj == 3) lora_back(j, context.f(), dy, dcb.data(), R);
  dcb.store();

  Tensor dq = alloc_temp(c, {d.b, d.T, d.qw()}, "dq", true);
  Tensor dk = alloc_temp(c, {d.b, d.Tk, d.kw()}, "dk", true);
  Tensor dv = alloc_temp(c, {d.b, d.Tk, d.kw()}, "dv", true);
  Fp32Buffer dqb(dq, true), dkb(dk, true), dvb(dv, true);
  if (d.flash)
    flash_backward(c, d, dcb.data(), bias, dqb.data(), dkb.data(), dvb.data(), dbias);
  else
    math_backward(c, d, dcb.data(), dqb.data(), dkb.data(), dvb.data(), dbias);
  if (d.rope) {  // gradients through the rotation: its transpose
    rope(dqb.data(), d, d.H, true);
    rope(dkb.data(), d, d.KV, true);
  }
  dqb.store();
  dkb.store();
  dvb.store();
  float* dx = c.din[0].defined() ? c.din[0].f() : nullptr;
  float* dmem = !d.shape.cross ? dx : c.din[1].defined() ? c.din[1].f() : nullptr;
  project_backward(x, weight(c, 0), dqb.data(), dx, dparam(0), proj_bias_grad(0), R, d.D, d.qw());
  project_backward(mem, weight(c, 1), dkb.data(), dmem, dparam(1), proj_bias_grad(1), Rk, d.Dm, d.kw());
  project_backward(mem, weight(c, 2), dvb.data(), dmem, dparam(2), proj_bias_grad(2), Rk, d.Dm, d.kw());
  const float* dproj[3] = {dqb.data(), dkb.data(), dvb.data()};
  for (size_t j = 0; j < lora.size(); ++j)
    if (lora[j].proj == 0) lora_back(j, x, dproj[0], dx, R);
    else if (lora[j].proj < 3) lora_back(j, mem, dproj[lora[j].proj], dmem, Rk);
}

}  // namespace dlplan::exec::cpu
