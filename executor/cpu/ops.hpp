// The CPU reference backend's ops (fp32), one function per op direction.
// Internal to executor/cpu; the rest of the executor reaches them through
// make_cpu_backend() (backend.hpp).
//
// Conventions shared by every op (backend.hpp says the same from outside):
//  - tensors are batch-first: ctx.in[i] is [b, ...per-sample shape]; the
//    shapes the ops rely on come from the model (ctx.model, ctx.node), so a
//    parameter may be a flat [numel] tensor;
//  - forward writes ctx.out (allocated by the caller) and pushes the op's own
//    saved tensors (SavedTensor::Ref::own, declaration order) into ctx.saved;
//    its temporaries are exactly the declaration's fwd_temps (x batch), freed
//    before returning;
//  - backward reads ctx.dout and accumulates (+=) into the defined entries of
//    ctx.din and every ctx.dparams entry; it allocates exactly the
//    declaration's bwd_temps.
#pragma once

#include "dlplan/error.hpp"
#include "dlplan/exec/backend.hpp"

#include <functional>
#include <string>
#include <vector>

namespace dlplan::exec::cpu {

// ---- helpers (cpu_backend.cpp) ----------------------------------------------
const Shape& in_shape(const OpContext& c, int i);   // per-sample shape of input i
const Shape& out_shape(const OpContext& c);         // per-sample shape of the output
Shape batched(int64_t b, const Shape& per_sample);  // [b, ...per_sample]
// Whether input i carries the batch axis: false for a tensor computed once
// per step (TensorInfo::batched), held as [1, ...] and broadcast over the
// micro-batch by the op that reads it beside per-sample inputs.
bool input_batched(const OpContext& c, int i);
// A saved tensor of the op (category activations) and a temporary (workspace),
// named "<node>.<what>". Temporaries and the saved tensors declared
// Elem::compute are in the storage dtype, compute(c) (bf16 under bf16-mixed).
inline DType compute(const OpContext& c) { return c.act_dtype; }
Tensor alloc_saved(OpContext& c, const Shape& shape, DType dt, const std::string& what, bool zero = false);
Tensor alloc_saved_bytes(OpContext& c, int64_t bytes, const std::string& what);
Tensor alloc_temp(OpContext& c, const Shape& shape, const std::string& what, bool zero = false);
// A gradient to accumulate into, or null where none is wanted: a frozen
// parameter's (docs/fine-tuning.md), an input's that needs none.
inline float* grad_or_null(const Tensor& t) { return t.defined() ? t.f() : nullptr; }
// Node c's own saved tensor named `what` (its declaration's order), or an
// undefined tensor when the plan does not keep it.
const Tensor& saved_named(const OpContext& c, const std::string& what);
bool keeps_own(const OpContext& c, const std::string& what);

// ---- mixed_precision.cpp: bf16 storage, fp32 arithmetic ------------------------
// Runs a forward (backward) op on fp32 views of c's bf16 inputs, parameters,
// output, saved tensors and output gradient, and rounds what it wrote (the
// output, the accumulated gradients) back into them. fp32 tensors pass as
// they are, so an fp32 run is the plain op.
void run_in_fp32(OpContext& c, bool backward, const std::function<void(OpContext&)>& op);

// The fp32 values of a tensor an op fills itself (its own saved tensor or a
// temporary): data() for the arithmetic, the tensor itself when it is fp32;
// store() rounds them into a bf16 tensor and leaves data() holding what the
// tensor now holds, so that later arithmetic sees the stored values.
class Fp32Buffer {
 public:
  explicit Fp32Buffer(const Tensor& t, bool load = false);
  float* data();
  void store();
  // Rounds n values at p (inside data()) to what the tensor will store, for
  // arithmetic that must see a block's stored values before store().
  void round(float* p, int64_t n) const;

 private:
  Tensor target_;
  std::vector<float> twin_;
};
[[noreturn]] void op_error(const OpContext& c, const std::string& message);

// C += alpha * op(A) * op(B), row-major, thin wrapper over cblas_sgemm.
// (m x k) * (k x n); lda/ldb/ldc are row strides in elements.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// ---- ops_lora.cpp: LoRA adapters beside a projection ----------------------------
// x [R, in], A [r, in], B [out, r], s = alpha / r; xa [R, r] receives x A^T and
// y [R, out] gains s xa B^T. Backward: any of dA, dB, dx may be null (not
// wanted); dxa is [R, r] scratch.
void lora_forward(const float* x, const float* A, const float* B, float s, float* xa, float* y, int64_t R, int64_t in,
                  int64_t out, int64_t r);
void lora_backward(const float* x, const float* A, const float* B, float s, const float* xa, const float* dy,
                   float* dxa, float* dA, float* dB, float* dx, int64_t R, int64_t in, int64_t out, int64_t r);

// ---- ops_dense.cpp -------------------------------------------------------------
void embedding_forward(OpContext& c);
void embedding_backward(OpContext& c);
void pos_embedding_forward(OpContext& c);
void pos_embedding_backward(OpContext& c);
void cls_token_forward(OpContext& c);
void cls_token_backward(OpContext& c);
void parameter_forward(OpContext& c);
void parameter_backward(OpContext& c);
void linear_forward(OpContext& c);
void linear_backward(OpContext& c);
void select_forward(OpContext& c);
void select_backward(OpContext& c);
void tokens_forward(OpContext& c);
void tokens_backward(OpContext& c);
void flatten_forward(OpContext& c);
void flatten_backward(OpContext& c);

// ---- ops_conv.cpp --------------------------------------------------------------
void conv2d_forward(OpContext& c);
void conv2d_backward(OpContext& c);
// The oneDNN lowering (ops_conv_onednn.cpp), where the declaration asks for it
// (OpDecl::onednn_conv); conv2d's bias gradient, shared by both lowerings.
void conv2d_forward_onednn(OpContext& c);
void conv2d_backward_onednn(OpContext& c);
void conv2d_bias_grad(OpContext& c, int64_t O, int64_t P);
void maxpool2d_forward(OpContext& c);
void maxpool2d_backward(OpContext& c);
void avgpool2d_forward(OpContext& c);
void avgpool2d_backward(OpContext& c);
void global_avgpool_forward(OpContext& c);
void global_avgpool_backward(OpContext& c);

// ---- ops_moe.cpp: mixture of experts ------------------------------------------
void moe_router_forward(OpContext& c);
void moe_router_backward(OpContext& c);
void moe_expert_forward(OpContext& c);
void moe_expert_backward(OpContext& c);
void moe_combine_forward(OpContext& c);
void moe_combine_backward(OpContext& c);

// ---- ops_norm.cpp --------------------------------------------------------------
void batchnorm_forward(OpContext& c);
void batchnorm_backward(OpContext& c);
void layernorm_forward(OpContext& c);
void layernorm_backward(OpContext& c);
void groupnorm_forward(OpContext& c);
void groupnorm_backward(OpContext& c);
void upsample_forward(OpContext& c);
void upsample_backward(OpContext& c);
void conv_transpose2d_forward(OpContext& c);
void conv_transpose2d_backward(OpContext& c);
void rmsnorm_forward(OpContext& c);
void rmsnorm_backward(OpContext& c);

// ---- ops_rnn.cpp ---------------------------------------------------------------
void lstm_forward(OpContext& c);
void lstm_backward(OpContext& c);
void gru_forward(OpContext& c);
void gru_backward(OpContext& c);
void rnn_forward(OpContext& c);
void rnn_backward(OpContext& c);

// ---- ops_elementwise.cpp -------------------------------------------------------
void gelu_forward(OpContext& c);
void gelu_backward(OpContext& c);
void relu_forward(OpContext& c);
void relu_backward(OpContext& c);
void silu_forward(OpContext& c);
void silu_backward(OpContext& c);
void tanh_forward(OpContext& c);
void tanh_backward(OpContext& c);
void sigmoid_forward(OpContext& c);
void sigmoid_backward(OpContext& c);
void clip_forward(OpContext& c);
void clip_backward(OpContext& c);
void leaky_relu_forward(OpContext& c);
void leaky_relu_backward(OpContext& c);
void elu_forward(OpContext& c);
void elu_backward(OpContext& c);
void softplus_forward(OpContext& c);
void softplus_backward(OpContext& c);
void mish_forward(OpContext& c);
void mish_backward(OpContext& c);
void prelu_forward(OpContext& c);
void prelu_backward(OpContext& c);
void shift_forward(OpContext& c);
void shift_backward(OpContext& c);
void hardsigmoid_forward(OpContext& c);
void hardsigmoid_backward(OpContext& c);
void hardswish_forward(OpContext& c);
void hardswish_backward(OpContext& c);
void concat_forward(OpContext& c);
void concat_backward(OpContext& c);
void add_forward(OpContext& c);
void add_backward(OpContext& c);
void mul_forward(OpContext& c);
void mul_backward(OpContext& c);
void scale_forward(OpContext& c);
void scale_backward(OpContext& c);
void dropout_forward(OpContext& c);
void dropout_backward(OpContext& c);
void drop_path_forward(OpContext& c);
void drop_path_backward(OpContext& c);

// ---- ops_math.cpp: written-out elementwise math (--fusion eager) ---------------
void affine_forward(OpContext& c);
void affine_backward(OpContext& c);
void pow_forward(OpContext& c);
void pow_backward(OpContext& c);
void sqrt_forward(OpContext& c);
void sqrt_backward(OpContext& c);
void erf_forward(OpContext& c);
void erf_backward(OpContext& c);
void acos_forward(OpContext& c);
void acos_backward(OpContext& c);
void reciprocal_forward(OpContext& c);
void reciprocal_backward(OpContext& c);
void reduce_mean_forward(OpContext& c);
void reduce_mean_backward(OpContext& c);
void reduce_sum_forward(OpContext& c);
void reduce_sum_backward(OpContext& c);
void reduce_l2_forward(OpContext& c);
void reduce_l2_backward(OpContext& c);

// ---- ops_matmul.cpp: two activations' product, softmax (outside attention) ------
void matmul_forward(OpContext& c);
void matmul_backward(OpContext& c);
void softmax_forward(OpContext& c);
void softmax_backward(OpContext& c);
void causal_mask_forward(OpContext& c);
void causal_mask_backward(OpContext& c);
void alibi_forward(OpContext& c);
void alibi_backward(OpContext& c);
void window_position_bias_forward(OpContext& c);
void window_position_bias_backward(OpContext& c);
void window_mask_forward(OpContext& c);
void window_mask_backward(OpContext& c);
void rope_forward(OpContext& c);
void rope_backward(OpContext& c);

// ---- ops_shape.cpp -------------------------------------------------------------
void transpose_forward(OpContext& c);
void transpose_backward(OpContext& c);
void slice_forward(OpContext& c);
void slice_backward(OpContext& c);
void pad_forward(OpContext& c);
void pad_backward(OpContext& c);

// ---- ops_attention.cpp ---------------------------------------------------------
void attention_forward(OpContext& c);
void attention_backward(OpContext& c);

// ---- ops_position_bias.cpp -----------------------------------------------------
void relative_position_bias_forward(OpContext& c);
void relative_position_bias_backward(OpContext& c);

// ---- ops_loss.cpp --------------------------------------------------------------
void cross_entropy_forward(OpContext& c);
void cross_entropy_backward(OpContext& c);

}  // namespace dlplan::exec::cpu
