// The CUDA backend's kernel launchers (internal to executor/cuda).
//
// The .cu files hold only kernels and these plain launchers (raw device
// pointers, sizes, a stream); they include no dlplan header, so nvcc never
// parses the model IR, fmt or nlohmann-json (compile time, and one C++ dialect
// for the host code). The op logic (shapes, saved tensors, temporaries, cuBLAS)
// lives in host C++ (cuda_ops.cpp) and calls these. Every launcher enqueues on
// `s` and returns at once; the caller checks cudaGetLastError().
//
// Layouts are the CPU reference's (executor/cpu): row-major, batch first.
//
// Determinism: no kernel reduces floats with atomics. Every sum runs in an
// order fixed by the shapes alone, so the same inputs give bit-identical
// outputs run to run (each kernel notes its order).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#define DLPLAN_HOST_DEVICE __host__ __device__
#else
#define DLPLAN_HOST_DEVICE
#endif

namespace dlplan::exec::cuda {

// ---- elementwise.cu --------------------------------------------------------------
enum class Unary { gelu, gelu_tanh, relu, silu, tanh, sigmoid };
// y = f(x).
void unary_forward(Unary f, const float* x, float* y, int64_t n, cudaStream_t s);
// dx += dy f'(.) — from the input x (gelu, silu) or the output y (relu, tanh, sigmoid).
void unary_backward(Unary f, const float* x, const float* y, const float* dy, float* dx, int64_t n, cudaStream_t s);
void add_forward(const float* a, const float* b, float* y, int64_t n, cudaStream_t s);
void mul_forward(const float* a, const float* b, float* y, int64_t n, cudaStream_t s);
// dx += dy (other == nullptr) or dx += dy * other.
void accumulate(const float* dy, const float* other, float* dx, int64_t n, cudaStream_t s);
// Dropout (training): mask / y per element, Philox-keyed as executor/cpu/philox.cpp.
void dropout_forward(const float* x, float* y, uint8_t* mask, int64_t batch, int64_t per, uint64_t seed, int node,
                     int64_t first_sample, float p, float scale, cudaStream_t s);
// dx += dy * (mask ? scale : 0).
void masked_accumulate(const float* dy, const uint8_t* mask, float scale, float* dx, int64_t n, cudaStream_t s);
// y[r, j] = bias[j] for r < rows (the bias broadcast a GEMM then accumulates onto).
void fill_rows(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t s);
// out[j] += sum_r a[r * cols + j] (fixed order: common.cuh's column lanes).
void column_sum_add(const float* a, float* out, int64_t rows, int64_t cols, cudaStream_t s);
// The device twin of dropout_uniform (philox.cpp), for the known-answer test.
void philox_uniforms(uint64_t seed, int node, int64_t sample, int64_t n, float* out, cudaStream_t s);

// ---- embedding.cu ----------------------------------------------------------------
// Bad ids: *err (a device int read as unsigned; the caller memsets it to 0xFF,
// all ones = fine) becomes the lowest bad row, the row the CPU reports.
void embedding_forward(const int32_t* ids, const float* w, float* y, int64_t rows, int64_t dim, int64_t num, int* err,
                       cudaStream_t s);
// dw[id] += dy rows in position order (a stable radix sort of the ids, then one
// block per run of equal ids): the CPU's sum bit for bit. Ids must lie in
// [0, num) (the forward checked). `scratch` holds at least
// embedding_backward_scratch(rows, num) bytes (the sort's keys, positions and
// CUB's temporary storage); a sort error is returned, launches are not checked.
size_t embedding_backward_scratch(int64_t rows, int64_t num);
cudaError_t embedding_backward(const int32_t* ids, const float* dy, float* dw, int64_t rows, int64_t dim, int64_t num,
                               void* scratch, size_t scratch_bytes, cudaStream_t s);
// y[s, i] = x[s, i] + w[i] over `per` elements a sample; backward dw += sum_s dy.
void pos_embedding_forward(const float* x, const float* w, float* y, int64_t batch, int64_t per, cudaStream_t s);
void batch_sum_add(const float* dy, float* dw, int64_t batch, int64_t per, cudaStream_t s);
void cls_token_forward(const float* x, const float* w, float* y, int64_t batch, int64_t T, int64_t D, cudaStream_t s);
void cls_token_backward(const float* dy, float* dw, float* dx, int64_t batch, int64_t T, int64_t D, cudaStream_t s);
void select_forward(const float* x, float* y, int64_t batch, int64_t T, int64_t D, int64_t index, cudaStream_t s);
void select_backward(const float* dy, float* dx, int64_t batch, int64_t T, int64_t D, int64_t index, cudaStream_t s);
// [b, C, P] <-> [b, P, C].
void tokens_forward(const float* x, float* y, int64_t batch, int64_t C, int64_t P, cudaStream_t s);
void tokens_backward(const float* dy, float* dx, int64_t batch, int64_t C, int64_t P, cudaStream_t s);

// ---- pool.cu / conv.cu ----------------------------------------------------------
struct Geom {
  int64_t C, H, W, OH, OW, kh, kw, sh, sw, ph, pw;
};
void maxpool_forward(const Geom& g, const float* x, float* y, int32_t* argmax, int64_t planes, cudaStream_t s);
void maxpool_backward(const Geom& g, const float* dy, const int32_t* argmax, float* dx, int64_t planes, cudaStream_t s);
void avgpool_forward(const Geom& g, const float* x, float* y, int64_t planes, cudaStream_t s);
void avgpool_backward(const Geom& g, const float* dy, float* dx, int64_t planes, cudaStream_t s);
void global_avgpool_forward(const float* x, float* y, int64_t planes, int64_t hw, cudaStream_t s);
void global_avgpool_backward(const float* dy, float* dx, int64_t planes, int64_t hw, cudaStream_t s);
// One sample: col [C kh kw, OH OW] from x [C, H, W]; dx [C, H, W] += col2im(dcol).
void im2col(const Geom& g, const float* x, float* col, cudaStream_t s);
void col2im_add(const Geom& g, const float* dcol, float* dx, cudaStream_t s);
// y[s, o, p] = bias[o] over [batch, O, P].
void fill_channels(float* y, const float* bias, int64_t batch, int64_t O, int64_t P, cudaStream_t s);
// db[o] += sum_{s, p} dy[s, o, p].
void channel_sum_add(const float* dy, float* db, int64_t batch, int64_t O, int64_t P, cudaStream_t s);

// ---- norm.cu ---------------------------------------------------------------------
void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, int64_t R,
                       int64_t D, float eps, cudaStream_t s);
// dx (may be null) += ...; dw += sum dy x_hat; db (may be null) += sum dy.
void layernorm_backward(const float* x, const float* w, const float* dy, const float* mean, const float* rstd, float* dx,
                        float* dw, float* db, int64_t R, int64_t D, cudaStream_t s);
void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t R, int64_t D, double eps,
                     cudaStream_t s);
void rmsnorm_backward(const float* x, const float* w, const float* dy, const float* rstd, float* dx, float* dw,
                      int64_t R, int64_t D, cudaStream_t s);
// BatchNorm over x [b, C, S]. Local statistics in double: mean[C], var[C] (biased).
void bn_local_stats(const float* x, double* mean, double* var, int64_t b, int64_t C, int64_t S, cudaStream_t s);
// Writes (mean, var, count) of this rank as float into every one of G slots of 2C+1.
void bn_fill_gather(const double* mean, const double* var, double count, float* buf, int64_t C, int64_t G,
                    cudaStream_t s);
// Combines G gathered slots (Chan et al.) into mean/var (double, in place over the local ones).
void bn_combine(const float* buf, double* mean, double* var, int64_t C, int64_t G, cudaStream_t s);
// mean_out/invstd_out (fp32 saved) and, unless `skip_running`, the running statistics.
// count <= 0: take the count from slot sums of buf (synced); otherwise `count`.
void bn_finish(const double* mean, const double* var, const float* buf, int64_t G, double count, float* mean_out,
               float* invstd_out, float* rm, float* rv, int64_t C, double eps, double momentum, bool skip_running,
               cudaStream_t s);
void bn_eval_stats(const float* rm, const float* rv, float* mean_out, float* invstd_out, int64_t C, double eps,
                   cudaStream_t s);
void bn_apply(const float* x, const float* mean, const float* invstd, const float* gamma, const float* beta, float* y,
              int64_t b, int64_t C, int64_t S, cudaStream_t s);
// sums[0..C) = sum dy, sums[C..2C) = sum dy x_hat (double); dgamma += float(sdyx), dbeta += float(sdy);
// if sync_buf, also writes the float sums there (2C) for the all-reduce.
void bn_backward_sums(const float* x, const float* dy, const float* mean, const float* invstd, double* sums,
                      float* dgamma, float* dbeta, float* sync_buf, int64_t b, int64_t C, int64_t S, cudaStream_t s);
// dx += gamma invstd (dy - sdy/count - x_hat sdyx/count), sums from `sums` (double) or `fsums` (float, synced);
// eval (training == false): dx += gamma invstd dy.
void bn_backward_dx(const float* x, const float* dy, const float* mean, const float* invstd, const float* gamma,
                    const double* sums, const float* fsums, double count, bool training, float* dx, int64_t b,
                    int64_t C, int64_t S, cudaStream_t s);

// ---- loss.cu ---------------------------------------------------------------------
// Writes probs [R, K], or (fused: probs null) lse [R] = log sum_j exp(z_j);
// row_loss [R] double scratch; out[0] = mean; bad targets: *err (as
// embedding_forward's) becomes the lowest bad row.
void cross_entropy_forward(const float* logits, const int32_t* targets, float* probs, float* lse, double* row_loss,
                           float* out, int64_t R, int64_t K, int* err, cudaStream_t s);
// dz += k (probs - onehot), k = grad_scale * dout[0] / R (dout on the device);
// fused (probs null): probs = exp(logits - lse) recomputed.
void cross_entropy_backward(const float* probs, const float* logits, const float* lse, const int32_t* targets,
                            const float* dout, double grad_scale, float* dz, int64_t R, int64_t K, cudaStream_t s);

// ---- attention.cu ----------------------------------------------------------------
struct AttnDims {
  int64_t b, T, H, KV, hd, group;
  bool causal;
  float scale;
  // dropout on the probabilities (p > 0 in training)
  bool dropout;
  float p, keep_scale;
  uint64_t seed;
  int node;
  int64_t first_sample;
  DLPLAN_HOST_DEVICE int64_t qw() const { return H * hd; }
  DLPLAN_HOST_DEVICE int64_t kw() const { return KV * hd; }
};
// In place on t [b, T, heads hd]; inverse = the transpose (for gradients).
void rope(float* t, int64_t b, int64_t T, int64_t heads, int64_t hd, double theta, bool inverse, cudaStream_t s);
// Math form: scores [b, H, T, T] (scaled, from the GEMM) -> probs (causal-masked softmax),
// and with `with_dropout` the mask (1 byte) and dropped probabilities.
void attn_softmax(const AttnDims& d, const float* scores, float* probs, uint8_t* mask, float* dropped,
                  bool with_dropout, cudaStream_t s);
// dprobs (in: dP~ = dctx v^T) -> dS = P (dP - rowsum(P dP)), dP = dP~ mask keep_scale when mask.
void attn_softmax_backward(const AttnDims& d, const float* probs, const uint8_t* mask, float* dprobs, cudaStream_t s);
// Flash form (FlashAttention-2, Dao 2023): ctx [b, T, H hd], lse [b, H, T];
// tiles in shared memory, online softmax (Alg. 1). hd <= 1024, else
// cudaErrorInvalidValue (nothing launched); launches are not checked.
cudaError_t flash_forward(const AttnDims& d, const float* q, const float* k, const float* v, float* ctx, float* lse,
                          cudaStream_t s);
// Recomputing backward (Alg. 2): dq += ..., dk += ..., dv += ...; D is scratch of
// b H T floats (rowsum(dO * O)). No atomics: one pass per key tile (dk, dv), one
// per query tile (dq), sums in a fixed order. Errors as flash_forward.
cudaError_t flash_backward(const AttnDims& d, const float* q, const float* k, const float* v, const float* ctx,
                           const float* lse, const float* dctx, float* dq, float* dk, float* dv, float* D,
                           cudaStream_t s);

// ---- storage types ------------------------------------------------------------------
// What a float buffer holds in memory: fp32, or a 16-bit float (bf16 under
// bf16-mixed, IEEE fp16 under fp16-mixed). Kernels load it into fp32, compute
// in fp32 (double in the optimizer) and round once when they store it: to
// nearest even (__float2bfloat16_rn / __float2half_rn; NaN stays NaN, fp16
// beyond 65504 becomes +-inf), as dlplan/exec/bf16.hpp does on the host.
enum class Store { f32, bf16, f16 };

// ---- adamw.cu --------------------------------------------------------------------
// p: the fp32 weights updated (parameters, or the master copy of 16-bit ones);
// g: the gradients, stored as `store`; half_params: the 16-bit parameters
// (stored as `store`, which is then bf16 or f16) rewritten from p (rounded),
// or null.
void optimizer_step(int kind, float* p, const void* g, Store store, void* half_params, float* m, float* v,
                    int64_t n, double lr, double beta1, double beta2, double eps, double bc1, double bc2, double wd,
                    double momentum, double clip, cudaStream_t s);
// *out += sum x^2 (double, device; x stored as `store`).
void sum_of_squares(const void* x, Store store, int64_t n, double* out, cudaStream_t s);

// ---- scale.cu ----------------------------------------------------------------------
// dst = src * scale; dst += src * scale (both buffers stored as `store`).
void scaled_copy(void* dst, const void* src, Store store, float scale, int64_t n, cudaStream_t s);
void scaled_add(void* dst, const void* src, Store store, float scale, int64_t n, cudaStream_t s);
// 16-bit <-> fp32 over whole buffers (the mixed precisions, mixed_precision.cpp);
// `half` is Store::bf16 or Store::f16 (Store::f32: a plain copy). Widening is
// exact; narrowing rounds to nearest even.
void half_widen(float* dst, const void* src, Store half, int64_t n, cudaStream_t s);
void half_narrow(void* dst, const float* src, Store half, int64_t n, cudaStream_t s);
// dst (16-bit) = round(twin), and twin = the value stored (one pass).
void half_round_store(void* dst, float* twin, Store half, int64_t n, cudaStream_t s);

}  // namespace dlplan::exec::cuda
