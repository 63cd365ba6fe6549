// The CUDA backend's ops: shapes, saved tensors and temporaries exactly as the
// CPU reference (executor/cpu, same order, same names, through ctx.alloc),
// kernels from kernels.hpp and GEMMs through cuBLAS, all on the compute stream.
//
// cuBLAS is column-major; our matrices are row-major. A row-major (m x n)
// matrix with row stride ld is the column-major (n x m) matrix with leading
// dimension ld, i.e. its transpose, so C = op(A) op(B) (row-major) is computed
// as C^T = op(B)^T op(A)^T: cublasSgemm(opB, opA, n, m, k, B, ldb, A, lda, C, ldc).
// gemm() below takes the row-major arguments of the CPU backend's gemm().
//
// bf16-mixed and fp16-mixed (mixed_precision.cpp): the ops see fp32 working
// copies of their operands; the tensors an op allocates itself in the storage
// dtype (saved tensors and temporaries declared Elem::compute: attention's,
// convolution's columns) are filled through an Fp32Buffer and stored (rounded)
// where the CPU reference stores them, so that later arithmetic reads the
// stored values.
#include "cuda/kernels.hpp"
#include "cuda/mixed_precision.hpp"
#include "cuda/runtime.hpp"

#include "dlplan/conv_window.hpp"
#include "dlplan/error.hpp"
#include "dlplan/exec/bf16.hpp"
#include "dlplan/norm_width.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>
#include <vector>

namespace dlplan::exec::cuda {
namespace {

// ---- helpers (as executor/cpu/cpu_backend.cpp) -----------------------------------

const Shape& in_shape(const OpContext& c, int i) { return c.model->tensor(c.node->inputs.at(static_cast<size_t>(i))).shape; }
const Shape& out_shape(const OpContext& c) { return c.model->output_of(*c.node).shape; }
Shape batched(int64_t b, const Shape& per) {
  Shape s{b};
  s.insert(s.end(), per.begin(), per.end());
  return s;
}
Tensor alloc_saved(OpContext& c, const Shape& shape, DType dt, const std::string& what) {
  return c.alloc->empty(shape, dt, saved_category(c), c.node->name + "." + what);
}
Tensor alloc_saved_bytes(OpContext& c, int64_t bytes, const std::string& what) {
  return c.alloc->bytes_buffer(bytes, saved_category(c), c.node->name + "." + what);
}
// In the storage dtype (bf16 or f16 under the mixed precisions), as the CPU's alloc_temp.
Tensor alloc_temp(OpContext& c, const Shape& shape, const std::string& what, bool zero = false) {
  auto name = c.node->name + "." + what;
  return zero ? c.alloc->zeros(shape, c.act_dtype, Category::workspace, std::move(name))
              : c.alloc->empty(shape, c.act_dtype, Category::workspace, std::move(name));
}
[[noreturn]] void op_error(const OpContext& c, const std::string& message) {
  node_error(c.model->source, *c.node, message);
}
float* din_or_null(const OpContext& c, size_t i) { return c.din.size() > i && c.din[i].defined() ? c.din[i].f() : nullptr; }

#define CU(call) DLPLAN_CU(&c, call)
#define LAUNCHED() DLPLAN_LAUNCHED(&c)

int as_int(const OpContext& c, int64_t v) {
  if (v > INT_MAX) op_error(c, fmt::format("GEMM dimension {} exceeds cuBLAS's int range", v));
  return static_cast<int>(v);
}

// C (m x n) = alpha op(A) op(B) + beta C, row-major (see the file comment).
void gemm(Runtime& rt, const OpContext& c, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (m == 0 || n == 0) return;
  DLPLAN_CU(&c, cublasSgemm(rt.blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, as_int(c, n),
                            as_int(c, m), as_int(c, k), &alpha, b, as_int(c, ldb), a, as_int(c, lda), &beta, C,
                            as_int(c, ldc)));
}

// `count` GEMMs, the i-th on A + i sa, B + i sb, C + i sc (strides in elements; 0 = shared).
void gemm_batched(Runtime& rt, const OpContext& c, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, int64_t sa, const float* b, int64_t ldb, int64_t sb, float beta, float* C,
                  int64_t ldc, int64_t sc, int64_t count) {
  if (m == 0 || n == 0 || count == 0) return;
  if (count == 1) return gemm(rt, c, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, C, ldc);
  DLPLAN_CU(&c, cublasSgemmStridedBatched(rt.blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                          as_int(c, n), as_int(c, m), as_int(c, k), &alpha, b, as_int(c, ldb), sb, a,
                                          as_int(c, lda), sa, &beta, C, as_int(c, ldc), sc, as_int(c, count)));
}

// y [R, o] = x [R, in] W^T (+ bias);  backward: dx += dy W, dW += dy^T x, db += sum_r dy.
void project(Runtime& rt, const OpContext& c, const float* x, const float* w, const float* bias, float* y, int64_t R,
             int64_t in, int64_t o) {
  if (bias) {
    fill_rows(y, bias, R, o, rt.stream);
    LAUNCHED();
  }
  gemm(rt, c, false, true, R, o, in, 1.0f, x, in, w, in, bias ? 1.0f : 0.0f, y, o);
}
void project_backward(Runtime& rt, const OpContext& c, const float* x, const float* w, const float* dy, float* dx,
                      float* dw, float* db, int64_t R, int64_t in, int64_t o) {
  if (dx) gemm(rt, c, false, false, R, in, o, 1.0f, dy, o, w, in, 1.0f, dx, in);
  gemm(rt, c, true, false, o, in, R, 1.0f, dy, o, x, in, 1.0f, dw, in);
  if (db) {
    column_sum_add(dy, db, R, o, rt.stream);
    LAUNCHED();
  }
}

// Reads the device error flag (synchronising the stream): the kernels lower it,
// read as unsigned, from all ones (the memset 0xFF) to the lowest bad row.
// Returns 0 = fine, else 1 + that row.
int64_t take_error_row(Runtime& rt, const OpContext& c) {
  unsigned h = 0;
  CU(cudaMemcpyAsync(&h, rt.err, sizeof(unsigned), cudaMemcpyDeviceToHost, rt.stream));
  CU(cudaStreamSynchronize(rt.stream));
  return h == UINT_MAX ? 0 : int64_t{h} + 1;
}
int32_t read_i32(Runtime& rt, const OpContext& c, const int32_t* p) {
  int32_t h = 0;
  CU(cudaMemcpyAsync(&h, p, sizeof(int32_t), cudaMemcpyDeviceToHost, rt.stream));
  CU(cudaStreamSynchronize(rt.stream));
  return h;
}

int64_t total(const OpContext& c) { return c.batch * numel(in_shape(c, 0)); }

// ---- dense and shape ops -------------------------------------------------------

void embedding_fwd(Runtime& rt, OpContext& c) {
  const int64_t num = c.node->attrs.integer("num"), dim = c.node->attrs.integer("dim");
  const int64_t n = total(c);
  CU(cudaMemsetAsync(rt.err, 0xFF, sizeof(int), rt.stream));
  embedding_forward(c.in[0].i(), c.params[0].f(), c.out.f(), n, dim, num, rt.err, rt.stream);
  LAUNCHED();
  if (const int64_t row = take_error_row(rt, c))
    op_error(c, fmt::format("token id {} is outside [0, {})", read_i32(rt, c, c.in[0].i() + row - 1), num));
}
void embedding_bwd(Runtime& rt, OpContext& c) {
  const int64_t rows = total(c), num = c.node->attrs.integer("num");
  const size_t bytes = embedding_backward_scratch(rows, num);  // sort keys, positions, CUB's storage
  void* scratch = bytes > 0 ? rt.scratch_at_least(bytes, &c) : nullptr;
  // padding_idx (nn.Embedding's): that row of the gradient is left as it
  // was, so it is put back after the scatter-add (a host copy of one row).
  const int64_t dim = c.node->attrs.integer("dim");
  float* pad_row = c.node->attrs.has("padding_idx") ? c.dparams[0].f() + c.node->attrs.integer("padding_idx") * dim : nullptr;
  std::vector<float> kept(pad_row ? static_cast<size_t>(dim) : 0);
  if (pad_row)
    CU(cudaMemcpyAsync(kept.data(), pad_row, kept.size() * sizeof(float), cudaMemcpyDeviceToHost, rt.stream));
  CU(embedding_backward(c.in[0].i(), c.dout.f(), c.dparams[0].f(), rows, dim, num, scratch, bytes, rt.stream));
  LAUNCHED();
  if (pad_row) {
    CU(cudaMemcpyAsync(pad_row, kept.data(), kept.size() * sizeof(float), cudaMemcpyHostToDevice, rt.stream));
    CU(cudaStreamSynchronize(rt.stream));  // `kept` is pageable host memory that ends with this scope
  }
}

// Rows offset.. of the table (OPT's start at 2): the same kernels from that row.
int64_t pos_offset(const OpContext& c) {
  return c.node->attrs.has("offset") ? c.node->attrs.integer("offset") * in_shape(c, 0).back() : 0;
}
void pos_embedding_fwd(Runtime& rt, OpContext& c) {
  pos_embedding_forward(c.in[0].f(), c.params[0].f() + pos_offset(c), c.out.f(), c.batch, numel(in_shape(c, 0)),
                        rt.stream);
  LAUNCHED();
}
void pos_embedding_bwd(Runtime& rt, OpContext& c) {
  const int64_t td = numel(in_shape(c, 0));
  batch_sum_add(c.dout.f(), c.dparams[0].f() + pos_offset(c), c.batch, td, rt.stream);
  LAUNCHED();
  if (float* dx = din_or_null(c, 0)) {
    accumulate(c.dout.f(), nullptr, dx, c.batch * td, rt.stream);
    LAUNCHED();
  }
}

void cls_token_fwd(Runtime& rt, OpContext& c) {
  cls_token_forward(c.in[0].f(), c.params[0].f(), c.out.f(), c.batch, in_shape(c, 0)[0], in_shape(c, 0)[1], rt.stream);
  LAUNCHED();
}
void cls_token_bwd(Runtime& rt, OpContext& c) {
  cls_token_backward(c.dout.f(), c.dparams[0].f(), din_or_null(c, 0), c.batch, in_shape(c, 0)[0], in_shape(c, 0)[1],
                     rt.stream);
  LAUNCHED();
}

void linear_fwd(Runtime& rt, OpContext& c) {
  const int64_t in = in_shape(c, 0).back(), o = out_shape(c).back();
  const int64_t R = c.batch * numel(in_shape(c, 0)) / in;
  const bool bias = c.node->attrs.flag("bias");
  project(rt, c, c.in[0].f(), c.params[0].f(), bias ? c.params[1].f() : nullptr, c.out.f(), R, in, o);
}
void linear_bwd(Runtime& rt, OpContext& c) {
  const int64_t in = in_shape(c, 0).back(), o = out_shape(c).back();
  const int64_t R = c.batch * numel(in_shape(c, 0)) / in;
  const bool bias = c.node->attrs.flag("bias");
  project_backward(rt, c, c.in[0].f(), c.params[0].f(), c.dout.f(), din_or_null(c, 0), c.dparams[0].f(),
                   bias ? c.dparams[1].f() : nullptr, R, in, o);
}

void select_fwd(Runtime& rt, OpContext& c) {
  select_forward(c.in[0].f(), c.out.f(), c.batch, in_shape(c, 0)[0], in_shape(c, 0)[1], c.node->attrs.integer("index"),
                 rt.stream);
  LAUNCHED();
}
void select_bwd(Runtime& rt, OpContext& c) {
  float* dx = din_or_null(c, 0);
  if (!dx) return;
  select_backward(c.dout.f(), dx, c.batch, in_shape(c, 0)[0], in_shape(c, 0)[1], c.node->attrs.integer("index"),
                  rt.stream);
  LAUNCHED();
}

void tokens_fwd(Runtime& rt, OpContext& c) {
  const Shape& x = in_shape(c, 0);
  tokens_forward(c.in[0].f(), c.out.f(), c.batch, x[0], x[1] * x[2], rt.stream);
  LAUNCHED();
}
void tokens_bwd(Runtime& rt, OpContext& c) {
  float* dx = din_or_null(c, 0);
  if (!dx) return;
  const Shape& x = in_shape(c, 0);
  tokens_backward(c.dout.f(), dx, c.batch, x[0], x[1] * x[2], rt.stream);
  LAUNCHED();
}

void copy_fwd(Runtime& rt, OpContext& c) {  // flatten, and dropout p = 0
  CU(cudaMemcpyAsync(c.out.f(), c.in[0].f(), static_cast<size_t>(total(c)) * sizeof(float), cudaMemcpyDeviceToDevice,
                     rt.stream));
}
void accumulate_bwd(Runtime& rt, OpContext& c) {
  float* dx = din_or_null(c, 0);
  if (!dx) return;
  accumulate(c.dout.f(), nullptr, dx, total(c), rt.stream);
  LAUNCHED();
}

// ---- conv and pooling ----------------------------------------------------------

struct ConvGeom {
  Geom g;
  int64_t O, groups;
  int64_t Cg() const { return g.C / groups; }
  int64_t Og() const { return O / groups; }
  int64_t K() const { return Cg() * g.kh * g.kw; }
  int64_t P() const { return g.OH * g.OW; }
  int64_t rows() const { return g.C * g.kh * g.kw; }
  bool direct() const { return g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0; }
};

ConvGeom geometry(const OpContext& c) {
  const Shape& x = in_shape(c, 0);
  const Shape& y = out_shape(c);
  const auto k = c.node->attrs.pair("kernel"), s = c.node->attrs.pair("stride"), p = c.node->attrs.pair("padding");
  ConvGeom cg{};
  cg.g = Geom{x[0], x[1], x[2], y.size() > 1 ? y[1] : 1, y.size() > 2 ? y[2] : 1, k[0], k[1], s[0], s[1], p[0], p[1]};
  cg.O = y[0];
  cg.groups = c.node->op == OpKind::conv2d ? c.node->attrs.integer("groups") : 1;
  // trainer.cpp's gpu_engine_lacks refuses a dilated convolution's plan first.
  if (c.node->op == OpKind::conv2d && dilated(c.node->attrs))
    throw Error(fmt::format("node '{}': the CUDA engine has no dilated convolution", c.node->name));
  return cg;
}

void conv2d_fwd(Runtime& rt, OpContext& c) {
  const ConvGeom g = geometry(c);
  const bool bias = c.node->attrs.flag("bias");
  const int64_t in_sz = g.g.C * g.g.H * g.g.W, out_sz = g.O * g.P();
  Tensor cols;
  if (!g.direct()) cols = alloc_temp(c, {g.rows(), g.P()}, "im2col");  // one sample's, reused (stream order)
  Fp32Buffer colbuf(rt, c, cols);
  if (bias) {
    fill_channels(c.out.f(), c.params[1].f(), c.batch, g.O, g.P(), rt.stream);
    LAUNCHED();
  }
  const float* w = c.params[0].f();
  for (int64_t s = 0; s < c.batch; ++s) {
    const float* x = c.in[0].f() + s * in_sz;
    const float* col = x;
    if (!g.direct()) {
      im2col(g.g, x, colbuf.data(), rt.stream);
      LAUNCHED();
      colbuf.store();  // the columns as stored (16-bit under the mixed precisions), read back by the GEMM
      col = colbuf.data();
    }
    gemm_batched(rt, c, false, false, g.Og(), g.P(), g.K(), 1.0f, w, g.K(), g.Og() * g.K(), col, g.P(), g.K() * g.P(),
                 bias ? 1.0f : 0.0f, c.out.f() + s * out_sz, g.P(), g.Og() * g.P(), g.groups);
  }
}

void conv2d_bwd(Runtime& rt, OpContext& c) {
  const ConvGeom g = geometry(c);
  const int64_t in_sz = g.g.C * g.g.H * g.g.W, out_sz = g.O * g.P();
  float* dxall = din_or_null(c, 0);
  Tensor cols;
  if (!g.direct()) cols = alloc_temp(c, {g.rows(), g.P()}, "im2col");
  Fp32Buffer colbuf(rt, c, cols);
  const float* w = c.params[0].f();
  float* dw = c.dparams[0].f();
  for (int64_t s = 0; s < c.batch; ++s) {
    const float* x = c.in[0].f() + s * in_sz;
    const float* dy = c.dout.f() + s * out_sz;
    float* cs = g.direct() ? nullptr : colbuf.data();
    const float* col = x;
    if (cs) {
      im2col(g.g, x, cs, rt.stream);
      LAUNCHED();
      colbuf.store();
      col = cs;
    }
    // dW_g += dy_g col_g^T
    gemm_batched(rt, c, false, true, g.Og(), g.K(), g.P(), 1.0f, dy, g.P(), g.Og() * g.P(), col, g.P(), g.K() * g.P(),
                 1.0f, dw, g.K(), g.Og() * g.K(), g.groups);
    if (!dxall) continue;
    float* dx = dxall + s * in_sz;
    float* dcol = cs ? cs : dx;  // direct: accumulate into dx itself
    gemm_batched(rt, c, true, false, g.K(), g.P(), g.Og(), 1.0f, w, g.K(), g.Og() * g.K(), dy, g.P(), g.Og() * g.P(),
                 cs ? 0.0f : 1.0f, dcol, g.P(), g.K() * g.P(), g.groups);
    if (cs) {
      colbuf.store();  // dcol as stored
      col2im_add(g.g, cs, dx, rt.stream);
      LAUNCHED();
    }
  }
  if (c.node->attrs.flag("bias")) {
    channel_sum_add(c.dout.f(), c.dparams[1].f(), c.batch, g.O, g.P(), rt.stream);
    LAUNCHED();
  }
}

void maxpool2d_fwd(Runtime& rt, OpContext& c) {
  const ConvGeom g = geometry(c);
  Tensor argmax = alloc_saved(c, batched(c.batch, out_shape(c)), DType::i32, "argmax");
  maxpool_forward(g.g, c.in[0].f(), c.out.f(), argmax.i(), c.batch * g.g.C, rt.stream);
  LAUNCHED();
  c.saved.push_back(std::move(argmax));
}
void maxpool2d_bwd(Runtime& rt, OpContext& c) {
  float* dx = din_or_null(c, 0);
  if (!dx) return;
  const ConvGeom g = geometry(c);
  maxpool_backward(g.g, c.dout.f(), c.saved[0].i(), dx, c.batch * g.g.C, rt.stream);
  LAUNCHED();
}
void avgpool2d_fwd(Runtime& rt, OpContext& c) {
  const ConvGeom g = geometry(c);
  avgpool_forward(g.g, c.in[0].f(), c.out.f(), c.batch * g.g.C, rt.stream);
  LAUNCHED();
}
void avgpool2d_bwd(Runtime& rt, OpContext& c) {
  float* dx = din_or_null(c, 0);
  if (!dx) return;
  const ConvGeom g = geometry(c);
  avgpool_backward(g.g, c.dout.f(), dx, c.batch * g.g.C, rt.stream);
  LAUNCHED();
}
void global_avgpool_fwd(Runtime& rt, OpContext& c) {
  const Shape& x = in_shape(c, 0);
  global_avgpool_forward(c.in[0].f(), c.out.f(), c.batch * x[0], x[1] * x[2], rt.stream);
  LAUNCHED();
}
void global_avgpool_bwd(Runtime& rt, OpContext& c) {
  float* dx = din_or_null(c, 0);
  if (!dx) return;
  const Shape& x = in_shape(c, 0);
  global_avgpool_backward(c.dout.f(), dx, c.batch * x[0], x[1] * x[2], rt.stream);
  LAUNCHED();
}

// ---- norms ---------------------------------------------------------------------

bool synced(const OpContext& c) { return c.syncbn && c.syncbn->group_size > 1; }

void batchnorm_fwd(Runtime& rt, OpContext& c) {
  const Shape& xs = in_shape(c, 0);
  const int64_t C = xs[0], S = numel(xs) / C, b = c.batch;
  const double eps = c.node->attrs.number("eps"), momentum = c.node->attrs.number("momentum");
  Tensor mean_t = alloc_saved(c, {C}, DType::f32, "mean");
  Tensor invstd_t = alloc_saved(c, {C}, DType::f32, "invstd");
  float* rm = c.buffers[0].f();
  float* rv = c.buffers[1].f();
  if (c.training) {
    const int64_t G = synced(c) ? c.syncbn->group_size : 1, slot = 2 * C + 1;
    auto* base = static_cast<char*>(
        rt.scratch_at_least(static_cast<size_t>(2 * C) * sizeof(double) + static_cast<size_t>(G * slot) * sizeof(float), &c));
    auto* m = reinterpret_cast<double*>(base);
    double* v = m + C;
    auto* buf = reinterpret_cast<float*>(v + C);
    bn_local_stats(c.in[0].f(), m, v, b, C, S, rt.stream);
    LAUNCHED();
    const double n = static_cast<double>(b * S);
    if (synced(c)) {
      bn_fill_gather(m, v, n, buf, C, G, rt.stream);
      LAUNCHED();
      CU(cudaStreamSynchronize(rt.stream));
      c.syncbn->all_gather(buf, slot);  // device pointer (cuda_backend.hpp)
      bn_combine(buf, m, v, C, G, rt.stream);
      LAUNCHED();
    }
    bn_finish(m, v, synced(c) ? buf : nullptr, G, n, mean_t.f(), invstd_t.f(), rm, rv, C, eps, momentum, c.recompute,
              rt.stream);
    LAUNCHED();
  } else {
    bn_eval_stats(rm, rv, mean_t.f(), invstd_t.f(), C, eps, rt.stream);
    LAUNCHED();
  }
  bn_apply(c.in[0].f(), mean_t.f(), invstd_t.f(), c.params[0].f(), c.params[1].f(), c.out.f(), b, C, S, rt.stream);
  LAUNCHED();
  c.saved.push_back(std::move(mean_t));
  c.saved.push_back(std::move(invstd_t));
}

void batchnorm_bwd(Runtime& rt, OpContext& c) {
  const Shape& xs = in_shape(c, 0);
  const int64_t C = xs[0], S = numel(xs) / C, b = c.batch;
  float* dx = din_or_null(c, 0);
  const bool sync = synced(c) && c.training && dx;
  auto* base = static_cast<char*>(
      rt.scratch_at_least(static_cast<size_t>(2 * C) * sizeof(double) + static_cast<size_t>(2 * C) * sizeof(float), &c));
  auto* sums = reinterpret_cast<double*>(base);
  auto* fsums = reinterpret_cast<float*>(sums + 2 * C);
  bn_backward_sums(c.in[0].f(), c.dout.f(), c.saved[0].f(), c.saved[1].f(), sums, c.dparams[0].f(), c.dparams[1].f(),
                   sync ? fsums : nullptr, b, C, S, rt.stream);
  LAUNCHED();
  if (!dx) return;
  double count = static_cast<double>(b * S);
  if (sync) {
    CU(cudaStreamSynchronize(rt.stream));
    c.syncbn->all_reduce_sum(fsums, 2 * C);  // device pointer (cuda_backend.hpp)
    count *= static_cast<double>(c.syncbn->group_size);
  }
  bn_backward_dx(c.in[0].f(), c.dout.f(), c.saved[0].f(), c.saved[1].f(), c.params[0].f(), sums, sync ? fsums : nullptr,
                 count, c.training, dx, b, C, S, rt.stream);
  LAUNCHED();
}

void layernorm_fwd(Runtime& rt, OpContext& c) {
  const int64_t D = layernorm_width(in_shape(c, 0), c.node->attrs), R = c.batch * numel(in_shape(c, 0)) / D;
  const bool bias = c.node->attrs.flag("bias");
  Tensor mean_t = alloc_saved(c, {R}, DType::f32, "mean");
  Tensor rstd_t = alloc_saved(c, {R}, DType::f32, "rstd");
  layernorm_forward(c.in[0].f(), c.params[0].f(), bias ? c.params[1].f() : nullptr, c.out.f(), mean_t.f(), rstd_t.f(), R,
                    D, static_cast<float>(c.node->attrs.number("eps")), rt.stream);
  LAUNCHED();
  c.saved.push_back(std::move(mean_t));
  c.saved.push_back(std::move(rstd_t));
}
void layernorm_bwd(Runtime& rt, OpContext& c) {
  const int64_t D = layernorm_width(in_shape(c, 0), c.node->attrs), R = c.batch * numel(in_shape(c, 0)) / D;
  const bool bias = c.node->attrs.flag("bias");
  layernorm_backward(c.in[0].f(), c.params[0].f(), c.dout.f(), c.saved[0].f(), c.saved[1].f(), din_or_null(c, 0),
                     c.dparams[0].f(), bias ? c.dparams[1].f() : nullptr, R, D, rt.stream);
  LAUNCHED();
}

void rmsnorm_fwd(Runtime& rt, OpContext& c) {
  const int64_t D = in_shape(c, 0).back(), R = c.batch * numel(in_shape(c, 0)) / D;
  Tensor rstd_t = alloc_saved(c, {R}, DType::f32, "rstd");
  rmsnorm_forward(c.in[0].f(), c.params[0].f(), c.out.f(), rstd_t.f(), R, D, c.node->attrs.number("eps"), rt.stream);
  LAUNCHED();
  c.saved.push_back(std::move(rstd_t));
}
void rmsnorm_bwd(Runtime& rt, OpContext& c) {
  const int64_t D = in_shape(c, 0).back(), R = c.batch * numel(in_shape(c, 0)) / D;
  rmsnorm_backward(c.in[0].f(), c.params[0].f(), c.dout.f(), c.saved[0].f(), din_or_null(c, 0), c.dparams[0].f(), R, D,
                   rt.stream);
  LAUNCHED();
}

// ---- elementwise ---------------------------------------------------------------

Unary unary_of(const OpContext& c) {
  switch (c.node->op) {
    case OpKind::gelu: return c.node->attrs.text("approximate") == "tanh" ? Unary::gelu_tanh : Unary::gelu;
    case OpKind::relu: return Unary::relu;
    case OpKind::silu: return Unary::silu;
    case OpKind::tanh: return Unary::tanh;
    default: return Unary::sigmoid;
  }
}
void unary_fwd(Runtime& rt, OpContext& c) {
  unary_forward(unary_of(c), c.in[0].f(), c.out.f(), total(c), rt.stream);
  LAUNCHED();
}
// gelu / silu read the input, relu / tanh / sigmoid the (saved) output.
void unary_bwd(Runtime& rt, OpContext& c) {
  float* dx = din_or_null(c, 0);
  if (!dx) return;
  const Unary f = unary_of(c);
  const bool from_input = f == Unary::gelu || f == Unary::gelu_tanh || f == Unary::silu;
  unary_backward(f, from_input ? c.in[0].f() : nullptr, from_input ? nullptr : c.out.f(), c.dout.f(), dx, total(c),
                 rt.stream);
  LAUNCHED();
}

void add_fwd(Runtime& rt, OpContext& c) {
  add_forward(c.in[0].f(), c.in[1].f(), c.out.f(), total(c), rt.stream);
  LAUNCHED();
}
// Same-shape operands only: trainer.cpp's gpu_engine_lacks refuses a broadcasting mul first.
void mul_fwd(Runtime& rt, OpContext& c) {
  mul_forward(c.in[0].f(), c.in[1].f(), c.out.f(), total(c), rt.stream);
  LAUNCHED();
}
void binary_bwd(Runtime& rt, OpContext& c, bool mul) {
  for (size_t k = 0; k < 2; ++k) {
    float* dx = din_or_null(c, k);
    if (!dx) continue;
    accumulate(c.dout.f(), mul ? c.in[1 - k].f() : nullptr, dx, total(c), rt.stream);
    LAUNCHED();
  }
}

void dropout_fwd(Runtime& rt, OpContext& c) {
  const double p = c.node->attrs.number("p");
  const int64_t per = numel(in_shape(c, 0)), n = c.batch * per;
  if (p <= 0.0) return copy_fwd(rt, c);
  Tensor mask = alloc_saved_bytes(c, n, "mask");
  if (!c.training) {
    CU(cudaMemsetAsync(mask.u8(), 1, static_cast<size_t>(n), rt.stream));
    copy_fwd(rt, c);
  } else {
    dropout_forward(c.in[0].f(), c.out.f(), mask.u8(), c.batch, per, c.seed, c.node_index, c.first_sample,
                    static_cast<float>(p), static_cast<float>(1.0 / (1.0 - p)), rt.stream);
    LAUNCHED();
  }
  c.saved.push_back(std::move(mask));
}
void dropout_bwd(Runtime& rt, OpContext& c) {
  float* dx = din_or_null(c, 0);
  if (!dx) return;
  const double p = c.node->attrs.number("p");
  if (p <= 0.0) return accumulate_bwd(rt, c);
  const float scale = c.training ? static_cast<float>(1.0 / (1.0 - p)) : 1.0f;
  masked_accumulate(c.dout.f(), c.saved[0].u8(), scale, dx, total(c), rt.stream);
  LAUNCHED();
}

// ---- attention -----------------------------------------------------------------

struct Attn {
  AttnDims d;
  int64_t D;
  bool rope, flash;
  double theta, p_attr;
  AttentionShape shape;
};

Attn attn_of(const OpContext& c) {
  const AttentionShape a = attention_shape(*c.model, *c.node);
  Attn at{};
  AttnDims& d = at.d;
  d.b = c.batch;
  d.T = a.T;
  at.D = a.D;
  d.H = a.H;
  d.KV = a.KV;
  d.hd = a.hd;
  d.group = a.group();
  d.causal = a.causal;
  at.shape = a;
  at.rope = a.rope;
  at.theta = a.rope_theta;
  at.p_attr = a.dropout;
  const double p = c.training ? at.p_attr : 0.0;
  d.dropout = p > 0;
  d.p = static_cast<float>(p);
  d.keep_scale = p > 0 ? static_cast<float>(1.0 / (1.0 - p)) : 1.0f;
  d.seed = c.seed;
  d.node = c.node_index;
  d.first_sample = c.first_sample;
  d.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.hd)));
  at.flash = keeps_log_sum_exp(*c.decl);
  return at;
}

const float* weight(const OpContext& c, int i) { return c.params[static_cast<size_t>(i)].f(); }
// The biases present (AttentionShape::bias_param: Qwen2 has q, k, v only).
const float* bias_of(const OpContext& c, const Attn& a, int i) {
  const int k = a.shape.bias_param(i);
  return k < 0 ? nullptr : c.params[static_cast<size_t>(k)].f();
}

// Head h = g group + j reads kv head g. For one sample s and one j, the KV heads
// g form a strided batch: q / context columns at (g group + j) hd (stride group
// hd), k / v columns at g hd (stride hd), [T, T] blocks at (s H + g group + j) TT
// (stride group TT). So b x group batched GEMMs cover every (s, h).
void math_forward(Runtime& rt, OpContext& c, const Attn& a, const float* q, const float* k, const float* v, float* ctx) {
  const AttnDims& d = a.d;
  const int64_t TT = d.T * d.T;
  Tensor scores = alloc_temp(c, {d.b, d.H, d.T, d.T}, "scores");
  Tensor probs = alloc_saved(c, {d.b, d.H, d.T, d.T}, c.act_dtype, "probs");
  const bool with_dropout = a.p_attr > 0;  // declared tensors, even in eval
  Tensor mask, dropped;
  if (with_dropout) {
    mask = alloc_saved_bytes(c, d.b * d.H * TT, "probs_mask");
    dropped = alloc_saved(c, {d.b, d.H, d.T, d.T}, c.act_dtype, "probs_dropped");
  }
  // bf16/fp16-mixed: each stage is stored (rounded) once computed, and the next
  // reads the stored values, as the CPU reference does; fp32: the tensors themselves.
  Fp32Buffer sbuf(rt, c, scores), pbuf(rt, c, probs), dbuf(rt, c, dropped);
  for (int64_t s = 0; s < d.b; ++s)
    for (int64_t j = 0; j < d.group; ++j)
      gemm_batched(rt, c, false, true, d.T, d.T, d.hd, d.scale, q + s * d.T * d.qw() + j * d.hd, d.qw(), d.group * d.hd,
                   k + s * d.T * d.kw(), d.kw(), d.hd, 0.0f, sbuf.data() + (s * d.H + j) * TT, d.T, d.group * TT, d.KV);
  sbuf.store();
  attn_softmax(d, sbuf.data(), pbuf.data(), with_dropout ? mask.u8() : nullptr, with_dropout ? dbuf.data() : nullptr,
               with_dropout, rt.stream);
  LAUNCHED();
  if (is_half(c.act_dtype)) {
    pbuf.store();
    if (with_dropout) {  // the dropped probabilities from the stored ones (CPU: round(round(P) f))
      CU(cudaMemsetAsync(dbuf.data(), 0, static_cast<size_t>(d.b * d.H * TT) * sizeof(float), rt.stream));
      masked_accumulate(pbuf.data(), mask.u8(), d.keep_scale, dbuf.data(), d.b * d.H * TT, rt.stream);
      LAUNCHED();
      dbuf.store();
    }
  }
  const float* Pv = with_dropout ? dbuf.data() : pbuf.data();
  for (int64_t s = 0; s < d.b; ++s)
    for (int64_t j = 0; j < d.group; ++j)
      gemm_batched(rt, c, false, false, d.T, d.hd, d.T, 1.0f, Pv + (s * d.H + j) * TT, d.T, d.group * TT,
                   v + s * d.T * d.kw(), d.kw(), d.hd, 0.0f, ctx + s * d.T * d.qw() + j * d.hd, d.qw(), d.group * d.hd,
                   d.KV);
  c.saved.push_back(std::move(probs));
  if (with_dropout) {
    c.saved.push_back(std::move(mask));
    c.saved.push_back(std::move(dropped));
  }
}

void math_backward(Runtime& rt, OpContext& c, const Attn& a, const float* dctx, float* dq, float* dk, float* dv) {
  const AttnDims& d = a.d;
  const int64_t TT = d.T * d.T;
  const float* q = c.saved[0].f();
  const float* k = c.saved[1].f();
  const float* v = c.saved[2].f();
  const float* probs = c.saved[4].f();
  const bool with_dropout = c.saved.size() > 5;
  const float* Pv = with_dropout ? c.saved[6].f() : probs;
  Tensor dprobs = alloc_temp(c, {d.b, d.H, d.T, d.T}, "dprobs");
  Fp32Buffer dpbuf(rt, c, dprobs);
  float* dP = dpbuf.data();
  for (int64_t s = 0; s < d.b; ++s)
    for (int64_t j = 0; j < d.group; ++j) {
      const float* dctx_j = dctx + s * d.T * d.qw() + j * d.hd;
      // dP~ = dctx v^T;  dv += P~^T dctx
      gemm_batched(rt, c, false, true, d.T, d.T, d.hd, 1.0f, dctx_j, d.qw(), d.group * d.hd, v + s * d.T * d.kw(), d.kw(),
                   d.hd, 0.0f, dP + (s * d.H + j) * TT, d.T, d.group * TT, d.KV);
      gemm_batched(rt, c, true, false, d.T, d.hd, d.T, 1.0f, Pv + (s * d.H + j) * TT, d.T, d.group * TT, dctx_j, d.qw(),
                   d.group * d.hd, 1.0f, dv + s * d.T * d.kw(), d.kw(), d.hd, d.KV);
    }
  AttnDims bd = d;
  if (!with_dropout) bd.keep_scale = 1.0f;
  attn_softmax_backward(bd, probs, with_dropout ? c.saved[5].u8() : nullptr, dP, rt.stream);
  LAUNCHED();
  dpbuf.store();  // dS as stored (16-bit under the mixed precisions)
  for (int64_t s = 0; s < d.b; ++s)
    for (int64_t j = 0; j < d.group; ++j) {
      const float* dS = dP + (s * d.H + j) * TT;
      // dq += scale dS k;  dk += scale dS^T q
      gemm_batched(rt, c, false, false, d.T, d.hd, d.T, d.scale, dS, d.T, d.group * TT, k + s * d.T * d.kw(), d.kw(),
                   d.hd, 1.0f, dq + s * d.T * d.qw() + j * d.hd, d.qw(), d.group * d.hd, d.KV);
      gemm_batched(rt, c, true, false, d.T, d.hd, d.T, d.scale, dS, d.T, d.group * TT, q + s * d.T * d.qw() + j * d.hd,
                   d.qw(), d.group * d.hd, 1.0f, dk + s * d.T * d.kw(), d.kw(), d.hd, d.KV);
    }
}

void attention_fwd(Runtime& rt, OpContext& c) {
  const Attn a = attn_of(c);
  const AttnDims& d = a.d;
  const int64_t R = d.b * d.T;
  const float* x = c.in[0].f();
  Tensor q = alloc_saved(c, {d.b, d.T, d.qw()}, c.act_dtype, "q");
  Tensor k = alloc_saved(c, {d.b, d.T, d.kw()}, c.act_dtype, "k");
  Tensor v = alloc_saved(c, {d.b, d.T, d.kw()}, c.act_dtype, "v");
  Tensor ctx = alloc_saved(c, {d.b, d.T, d.qw()}, c.act_dtype, "context");
  Fp32Buffer qb(rt, c, q), kb(rt, c, k), vb(rt, c, v), cb(rt, c, ctx);  // each stored once computed
  project(rt, c, x, weight(c, 0), bias_of(c, a, 0), qb.data(), R, a.D, d.qw());
  project(rt, c, x, weight(c, 1), bias_of(c, a, 1), kb.data(), R, a.D, d.kw());
  project(rt, c, x, weight(c, 2), bias_of(c, a, 2), vb.data(), R, a.D, d.kw());
  if (a.rope) {
    rope(qb.data(), d.b, d.T, d.H, d.hd, a.theta, false, rt.stream);
    LAUNCHED();
    rope(kb.data(), d.b, d.T, d.KV, d.hd, a.theta, false, rt.stream);
    LAUNCHED();
  }
  qb.store();
  kb.store();
  vb.store();
  // Saved in declaration order, in their stored dtype: q, k, v, context, then lse or probs (+mask, dropped).
  c.saved.push_back(q);
  c.saved.push_back(k);
  c.saved.push_back(v);
  c.saved.push_back(ctx);
  if (a.flash) {
    Tensor lse = alloc_saved(c, {d.b, d.H, d.T}, DType::f32, "lse");
    CU(flash_forward(d, qb.data(), kb.data(), vb.data(), cb.data(), lse.f(), rt.stream));
    LAUNCHED();
    c.saved.push_back(std::move(lse));
  } else {
    math_forward(rt, c, a, qb.data(), kb.data(), vb.data(), cb.data());
  }
  cb.store();
  project(rt, c, cb.data(), weight(c, 3), bias_of(c, a, 3), c.out.f(), R, d.qw(), a.D);
}

void attention_bwd(Runtime& rt, OpContext& c) {
  const Attn a = attn_of(c);
  const AttnDims& d = a.d;
  const int64_t R = d.b * d.T;
  const float* x = c.in[0].f();
  auto dparam = [&](int i) { return c.dparams[static_cast<size_t>(i)].f(); };
  auto dbias = [&](int i) {
    const int k = a.shape.bias_param(i);
    return k < 0 ? nullptr : dparam(k);
  };
  Tensor dctx = alloc_temp(c, {d.b, d.T, d.qw()}, "dcontext", true);
  Fp32Buffer dcb(rt, c, dctx, /*load=*/true);
  project_backward(rt, c, c.saved[3].f(), weight(c, 3), c.dout.f(), dcb.data(), dparam(3), dbias(3), R, d.qw(), a.D);
  dcb.store();
  Tensor dq = alloc_temp(c, {d.b, d.T, d.qw()}, "dq", true);
  Tensor dk = alloc_temp(c, {d.b, d.T, d.kw()}, "dk", true);
  Tensor dv = alloc_temp(c, {d.b, d.T, d.kw()}, "dv", true);
  Fp32Buffer dqb(rt, c, dq, true), dkb(rt, c, dk, true), dvb(rt, c, dv, true);
  if (a.flash) {
    auto* D = static_cast<float*>(rt.scratch_at_least(static_cast<size_t>(d.b * d.H * d.T) * sizeof(float), &c));
    CU(flash_backward(d, c.saved[0].f(), c.saved[1].f(), c.saved[2].f(), c.saved[3].f(), c.saved[4].f(), dcb.data(),
                      dqb.data(), dkb.data(), dvb.data(), D, rt.stream));
    LAUNCHED();
  } else {
    math_backward(rt, c, a, dcb.data(), dqb.data(), dkb.data(), dvb.data());
  }
  if (a.rope) {
    rope(dqb.data(), d.b, d.T, d.H, d.hd, a.theta, true, rt.stream);
    LAUNCHED();
    rope(dkb.data(), d.b, d.T, d.KV, d.hd, a.theta, true, rt.stream);
    LAUNCHED();
  }
  dqb.store();
  dkb.store();
  dvb.store();
  float* dx = din_or_null(c, 0);
  project_backward(rt, c, x, weight(c, 0), dqb.data(), dx, dparam(0), dbias(0), R, a.D, d.qw());
  project_backward(rt, c, x, weight(c, 1), dkb.data(), dx, dparam(1), dbias(1), R, a.D, d.kw());
  project_backward(rt, c, x, weight(c, 2), dvb.data(), dx, dparam(2), dbias(2), R, a.D, d.kw());
}

// ---- loss ----------------------------------------------------------------------

void cross_entropy_fwd(Runtime& rt, OpContext& c) {
  const int64_t K = in_shape(c, 0).back(), R = c.batch * numel(in_shape(c, 0)) / K;
  const bool fused = c.node->attrs.flag("fused");  // keeps lse [R] and reads the logits again in backward
  Tensor kept = fused ? alloc_saved(c, {R}, DType::f32, "lse") : alloc_saved(c, {R, K}, DType::f32, "probs");
  auto* row_loss = static_cast<double*>(rt.scratch_at_least(static_cast<size_t>(R) * sizeof(double), &c));
  CU(cudaMemsetAsync(rt.err, 0xFF, sizeof(int), rt.stream));
  cross_entropy_forward(c.in[0].f(), c.in[1].i(), fused ? nullptr : kept.f(), fused ? kept.f() : nullptr, row_loss,
                        c.out.f(), R, K, rt.err, rt.stream);
  LAUNCHED();
  if (const int64_t row = take_error_row(rt, c))
    op_error(c, fmt::format("target {} is outside [0, {})", read_i32(rt, c, c.in[1].i() + row - 1), K));
  c.saved.push_back(std::move(kept));
}
void cross_entropy_bwd(Runtime& rt, OpContext& c) {
  float* dz = din_or_null(c, 0);
  if (!dz) return;
  const int64_t K = in_shape(c, 0).back(), R = c.batch * numel(in_shape(c, 0)) / K;
  const bool fused = c.node->attrs.flag("fused");
  cross_entropy_backward(fused ? nullptr : c.saved[0].f(), fused ? c.in[0].f() : nullptr, fused ? c.saved[0].f() : nullptr,
                         c.in[1].i(), c.dout.f(), c.grad_scale, dz, R, K, rt.stream);
  LAUNCHED();
}

}  // namespace

size_t scratch_bytes_for(const Model& m, const Node& n, int64_t batch, int syncbn_group) {
  const Shape& x = m.tensor(n.inputs.at(0)).shape;
  switch (n.op) {
    case OpKind::batchnorm: {  // batchnorm_fwd / batchnorm_bwd: 2C doubles + G slots of 2C+1 floats (or 2C)
      const auto C = static_cast<size_t>(x.at(0)), G = static_cast<size_t>(std::max(syncbn_group, 1));
      return 2 * C * sizeof(double) + std::max(G * (2 * C + 1), 2 * C) * sizeof(float);
    }
    case OpKind::cross_entropy:  // cross_entropy_fwd: one double per row
      return static_cast<size_t>(batch * numel(x) / x.back()) * sizeof(double);
    case OpKind::embedding:  // embedding_bwd: the stable sort of ids (embedding.cu)
      return embedding_backward_scratch(batch * numel(x), n.attrs.integer("num"));
    case OpKind::attention: {  // flash backward: D = rowsum(dO * O), one float per (sample, head, query)
      const AttentionShape a = attention_shape(m, n);
      return static_cast<size_t>(batch * a.H * a.T) * sizeof(float);
    }
    default:
      return 0;
  }
}

void ops_forward(Runtime& rt, OpContext& c) {
  switch (c.node->op) {
    case OpKind::embedding: return embedding_fwd(rt, c);
    case OpKind::pos_embedding: return pos_embedding_fwd(rt, c);
    case OpKind::cls_token: return cls_token_fwd(rt, c);
    case OpKind::linear: return linear_fwd(rt, c);
    case OpKind::conv2d: return conv2d_fwd(rt, c);
    case OpKind::batchnorm: return batchnorm_fwd(rt, c);
    case OpKind::layernorm: return layernorm_fwd(rt, c);
    case OpKind::rmsnorm: return rmsnorm_fwd(rt, c);
    case OpKind::gelu:
    case OpKind::relu:
    case OpKind::silu:
    case OpKind::tanh:
    case OpKind::sigmoid: return unary_fwd(rt, c);
    case OpKind::clip:  // trainer.cpp's gpu_engine_lacks refuses such a plan first
    case OpKind::hardsigmoid:
    case OpKind::hardswish:
    case OpKind::leaky_relu:
    case OpKind::elu:
    case OpKind::softplus:
    case OpKind::mish:
    case OpKind::prelu:
    case OpKind::shift:
    case OpKind::groupnorm:
    case OpKind::upsample:
    case OpKind::conv_transpose2d:
    case OpKind::lstm:
    case OpKind::gru:
    case OpKind::rnn:
    case OpKind::scale:
    case OpKind::transpose:
    case OpKind::slice:
    case OpKind::affine:
    case OpKind::pow:
    case OpKind::sqrt:
    case OpKind::reciprocal:
    case OpKind::erf:
    case OpKind::acos:
    case OpKind::parameter:
    case OpKind::drop_path:
    case OpKind::pad:
    case OpKind::reduce_mean:
    case OpKind::reduce_sum:
    case OpKind::reduce_l2:
    case OpKind::matmul:
    case OpKind::softmax:
    case OpKind::causal_mask:
    case OpKind::alibi:
    case OpKind::rope:
    case OpKind::concat: break;
    case OpKind::add: return add_fwd(rt, c);
    case OpKind::mul: return mul_fwd(rt, c);
    case OpKind::attention: return attention_fwd(rt, c);
    case OpKind::moe_router:  // trainer.cpp's gpu_engine_lacks refuses such a plan first
    case OpKind::moe_expert:
    case OpKind::moe_combine:
    case OpKind::relative_position_bias:
    case OpKind::window_position_bias:
    case OpKind::window_mask: break;
    case OpKind::maxpool2d: return maxpool2d_fwd(rt, c);
    case OpKind::avgpool2d: return avgpool2d_fwd(rt, c);
    case OpKind::global_avgpool: return global_avgpool_fwd(rt, c);
    case OpKind::flatten:
    case OpKind::reshape: return copy_fwd(rt, c);
    case OpKind::tokens: return tokens_fwd(rt, c);
    case OpKind::select: return select_fwd(rt, c);
    case OpKind::dropout: return dropout_fwd(rt, c);
    case OpKind::cross_entropy: return cross_entropy_fwd(rt, c);
    case OpKind::opaque: break;  // the Trainer refuses such a plan first
  }
  op_error(c, "op has no CUDA forward");
}

void ops_backward(Runtime& rt, OpContext& c) {
  switch (c.node->op) {
    case OpKind::embedding: return embedding_bwd(rt, c);
    case OpKind::pos_embedding: return pos_embedding_bwd(rt, c);
    case OpKind::cls_token: return cls_token_bwd(rt, c);
    case OpKind::linear: return linear_bwd(rt, c);
    case OpKind::conv2d: return conv2d_bwd(rt, c);
    case OpKind::batchnorm: return batchnorm_bwd(rt, c);
    case OpKind::layernorm: return layernorm_bwd(rt, c);
    case OpKind::rmsnorm: return rmsnorm_bwd(rt, c);
    case OpKind::gelu:
    case OpKind::relu:
    case OpKind::silu:
    case OpKind::tanh:
    case OpKind::sigmoid: return unary_bwd(rt, c);
    case OpKind::clip:
    case OpKind::hardsigmoid:
    case OpKind::hardswish:
    case OpKind::leaky_relu:
    case OpKind::elu:
    case OpKind::softplus:
    case OpKind::mish:
    case OpKind::prelu:
    case OpKind::shift:
    case OpKind::groupnorm:
    case OpKind::upsample:
    case OpKind::conv_transpose2d:
    case OpKind::lstm:
    case OpKind::gru:
    case OpKind::rnn:
    case OpKind::scale:
    case OpKind::transpose:
    case OpKind::slice:
    case OpKind::affine:
    case OpKind::pow:
    case OpKind::sqrt:
    case OpKind::reciprocal:
    case OpKind::erf:
    case OpKind::acos:
    case OpKind::parameter:
    case OpKind::drop_path:
    case OpKind::pad:
    case OpKind::reduce_mean:
    case OpKind::reduce_sum:
    case OpKind::reduce_l2:
    case OpKind::matmul:
    case OpKind::softmax:
    case OpKind::causal_mask:
    case OpKind::alibi:
    case OpKind::rope:
    case OpKind::concat: break;
    case OpKind::add: return binary_bwd(rt, c, false);
    case OpKind::mul: return binary_bwd(rt, c, true);
    case OpKind::attention: return attention_bwd(rt, c);
    case OpKind::moe_router:
    case OpKind::moe_expert:
    case OpKind::moe_combine:
    case OpKind::relative_position_bias:
    case OpKind::window_position_bias:
    case OpKind::window_mask: break;
    case OpKind::maxpool2d: return maxpool2d_bwd(rt, c);
    case OpKind::avgpool2d: return avgpool2d_bwd(rt, c);
    case OpKind::global_avgpool: return global_avgpool_bwd(rt, c);
    case OpKind::flatten:
    case OpKind::reshape: return accumulate_bwd(rt, c);
    case OpKind::tokens: return tokens_bwd(rt, c);
    case OpKind::select: return select_bwd(rt, c);
    case OpKind::dropout: return dropout_bwd(rt, c);
    case OpKind::cross_entropy: return cross_entropy_bwd(rt, c);
    case OpKind::opaque: break;  // the Trainer refuses such a plan first
  }
  op_error(c, "op has no CUDA backward");
}

}  // namespace dlplan::exec::cuda
