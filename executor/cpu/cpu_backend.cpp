// The CPU reference backend: fp32, OpenBLAS GEMMs. forward/backward switch on
// the node's OpKind and call one function per op direction (cpu/ops.hpp).
#include "cpu/ops.hpp"
#include "cpu/parallel.hpp"

#include "dlplan/cpu_conv.hpp"
#include "dlplan/error.hpp"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>

namespace dlplan::exec {
namespace cpu {

const Shape& in_shape(const OpContext& c, int i) {
  return c.model->tensor(c.node->inputs.at(static_cast<size_t>(i))).shape;
}
const Shape& out_shape(const OpContext& c) { return c.model->output_of(*c.node).shape; }

bool input_batched(const OpContext& c, int i) {
  return c.model->tensor(c.node->inputs.at(static_cast<size_t>(i))).batched;
}

Shape batched(int64_t b, const Shape& per_sample) {
  Shape s{b};
  s.insert(s.end(), per_sample.begin(), per_sample.end());
  return s;
}

Tensor alloc_saved(OpContext& c, const Shape& shape, DType dt, const std::string& what, bool zero) {
  auto name = c.node->name + "." + what;
  const Category cat = saved_category(c);
  return zero ? c.alloc->zeros(shape, dt, cat, std::move(name)) : c.alloc->empty(shape, dt, cat, std::move(name));
}

Tensor alloc_saved_bytes(OpContext& c, int64_t bytes, const std::string& what) {
  return c.alloc->bytes_buffer(bytes, saved_category(c), c.node->name + "." + what);
}

Tensor alloc_temp(OpContext& c, const Shape& shape, const std::string& what, bool zero) {
  auto name = c.node->name + "." + what;
  return zero ? c.alloc->zeros(shape, compute(c), Category::workspace, std::move(name))
              : c.alloc->empty(shape, compute(c), Category::workspace, std::move(name));
}

const Tensor& saved_named(const OpContext& c, const std::string& what) {
  static const Tensor none;
  size_t own = 0;
  for (const SavedTensor& s : c.decl->saved) {
    if (s.ref != SavedTensor::Ref::own) continue;
    if (s.what == what) return own < c.saved.size() ? c.saved[own] : none;
    ++own;
  }
  return none;
}

bool keeps_own(const OpContext& c, const std::string& what) {
  return std::any_of(c.decl->saved.begin(), c.decl->saved.end(),
                     [&](const SavedTensor& s) { return s.ref == SavedTensor::Ref::own && s.what == what; });
}

void op_error(const OpContext& c, const std::string& message) {
  node_error(c.model->source, *c.node, message);
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }

  void forward(OpContext& c) override {
    choose_loop_threads(c);
    run_in_fp32(c, /*backward=*/false, [this](OpContext& w) { dispatch_forward(w); });
  }
  void backward(OpContext& c) override {
    run_in_fp32(c, /*backward=*/true, [this](OpContext& w) { dispatch_backward(w); });
  }

 private:
  // A convolutional network (whose convolutions oneDNN runs) keeps OpenMP's
  // team busy: its loops join that team (cpu/parallel.hpp).
  void choose_loop_threads(const OpContext& c) {
    if (c.model == model_) return;
    model_ = c.model;
    run_loops_on_openmp(onednn_runs_convolutions(*model_));
  }
  const Model* model_ = nullptr;

  void dispatch_forward(OpContext& c) {
    switch (c.node->op) {
      case OpKind::embedding: return embedding_forward(c);
      case OpKind::pos_embedding: return pos_embedding_forward(c);
      case OpKind::cls_token: return cls_token_forward(c);
      case OpKind::parameter: return parameter_forward(c);
      case OpKind::linear: return linear_forward(c);
      case OpKind::conv2d: return conv2d_forward(c);
      case OpKind::batchnorm: return batchnorm_forward(c);
      case OpKind::layernorm: return layernorm_forward(c);
      case OpKind::groupnorm: return groupnorm_forward(c);
      case OpKind::upsample: return upsample_forward(c);
      case OpKind::conv_transpose2d: return conv_transpose2d_forward(c);
      case OpKind::lstm: return lstm_forward(c);
      case OpKind::gru: return gru_forward(c);
      case OpKind::rnn: return rnn_forward(c);
      case OpKind::rmsnorm: return rmsnorm_forward(c);
      case OpKind::gelu: return gelu_forward(c);
      case OpKind::relu: return relu_forward(c);
      case OpKind::silu: return silu_forward(c);
      case OpKind::tanh: return tanh_forward(c);
      case OpKind::sigmoid: return sigmoid_forward(c);
      case OpKind::clip: return clip_forward(c);
      case OpKind::hardsigmoid: return hardsigmoid_forward(c);
      case OpKind::leaky_relu: return leaky_relu_forward(c);
      case OpKind::elu: return elu_forward(c);
      case OpKind::softplus: return softplus_forward(c);
      case OpKind::mish: return mish_forward(c);
      case OpKind::prelu: return prelu_forward(c);
      case OpKind::shift: return shift_forward(c);
      case OpKind::hardswish: return hardswish_forward(c);
      case OpKind::concat: return concat_forward(c);
      case OpKind::add: return add_forward(c);
      case OpKind::mul: return mul_forward(c);
      case OpKind::scale: return scale_forward(c);
      case OpKind::affine: return affine_forward(c);
      case OpKind::pow: return pow_forward(c);
      case OpKind::sqrt: return sqrt_forward(c);
      case OpKind::erf: return erf_forward(c);
      case OpKind::acos: return acos_forward(c);
      case OpKind::reciprocal: return reciprocal_forward(c);
      case OpKind::reduce_mean: return reduce_mean_forward(c);
      case OpKind::reduce_sum: return reduce_sum_forward(c);
      case OpKind::reduce_l2: return reduce_l2_forward(c);
      case OpKind::matmul: return matmul_forward(c);
      case OpKind::softmax: return softmax_forward(c);
      case OpKind::causal_mask: return causal_mask_forward(c);
      case OpKind::alibi: return alibi_forward(c);
      case OpKind::window_position_bias: return window_position_bias_forward(c);
      case OpKind::window_mask: return window_mask_forward(c);
      case OpKind::rope: return rope_forward(c);
      case OpKind::transpose: return transpose_forward(c);
      case OpKind::slice: return slice_forward(c);
      case OpKind::pad: return pad_forward(c);
      case OpKind::attention: return attention_forward(c);
      case OpKind::relative_position_bias: return relative_position_bias_forward(c);
      case OpKind::moe_router: return moe_router_forward(c);
      case OpKind::moe_expert: return moe_expert_forward(c);
      case OpKind::moe_combine: return moe_combine_forward(c);
      case OpKind::maxpool2d: return maxpool2d_forward(c);
      case OpKind::avgpool2d: return avgpool2d_forward(c);
      case OpKind::global_avgpool: return global_avgpool_forward(c);
      case OpKind::flatten:
      case OpKind::reshape: return flatten_forward(c);
      case OpKind::tokens: return tokens_forward(c);
      case OpKind::select: return select_forward(c);
      case OpKind::dropout: return dropout_forward(c);
      case OpKind::drop_path: return drop_path_forward(c);
      case OpKind::cross_entropy: return cross_entropy_forward(c);
      case OpKind::opaque: break;  // the Trainer refuses such a plan first (engine_cannot_train)
    }
    op_error(c, "op has no CPU forward");
  }

  void dispatch_backward(OpContext& c) {
    switch (c.node->op) {
      case OpKind::embedding: return embedding_backward(c);
      case OpKind::pos_embedding: return pos_embedding_backward(c);
      case OpKind::cls_token: return cls_token_backward(c);
      case OpKind::parameter: return parameter_backward(c);
      case OpKind::linear: return linear_backward(c);
      case OpKind::conv2d: return conv2d_backward(c);
      case OpKind::batchnorm: return batchnorm_backward(c);
      case OpKind::layernorm: return layernorm_backward(c);
      case OpKind::groupnorm: return groupnorm_backward(c);
      case OpKind::upsample: return upsample_backward(c);
      case OpKind::conv_transpose2d: return conv_transpose2d_backward(c);
      case OpKind::lstm: return lstm_backward(c);
      case OpKind::gru: return gru_backward(c);
      case OpKind::rnn: return rnn_backward(c);
      case OpKind::rmsnorm: return rmsnorm_backward(c);
      case OpKind::gelu: return gelu_backward(c);
      case OpKind::relu: return relu_backward(c);
      case OpKind::silu: return silu_backward(c);
      case OpKind::tanh: return tanh_backward(c);
      case OpKind::sigmoid: return sigmoid_backward(c);
      case OpKind::clip: return clip_backward(c);
      case OpKind::hardsigmoid: return hardsigmoid_backward(c);
      case OpKind::leaky_relu: return leaky_relu_backward(c);
      case OpKind::elu: return elu_backward(c);
      case OpKind::softplus: return softplus_backward(c);
      case OpKind::mish: return mish_backward(c);
      case OpKind::prelu: return prelu_backward(c);
      case OpKind::shift: return shift_backward(c);
      case OpKind::hardswish: return hardswish_backward(c);
      case OpKind::concat: return concat_backward(c);
      case OpKind::add: return add_backward(c);
      case OpKind::mul: return mul_backward(c);
      case OpKind::scale: return scale_backward(c);
      case OpKind::affine: return affine_backward(c);
      case OpKind::pow: return pow_backward(c);
      case OpKind::sqrt: return sqrt_backward(c);
      case OpKind::erf: return erf_backward(c);
      case OpKind::acos: return acos_backward(c);
      case OpKind::reciprocal: return reciprocal_backward(c);
      case OpKind::reduce_mean: return reduce_mean_backward(c);
      case OpKind::reduce_sum: return reduce_sum_backward(c);
      case OpKind::reduce_l2: return reduce_l2_backward(c);
      case OpKind::matmul: return matmul_backward(c);
      case OpKind::softmax: return softmax_backward(c);
      case OpKind::causal_mask: return causal_mask_backward(c);
      case OpKind::alibi: return alibi_backward(c);
      case OpKind::window_position_bias: return window_position_bias_backward(c);
      case OpKind::window_mask: return window_mask_backward(c);
      case OpKind::rope: return rope_backward(c);
      case OpKind::transpose: return transpose_backward(c);
      case OpKind::slice: return slice_backward(c);
      case OpKind::pad: return pad_backward(c);
      case OpKind::attention: return attention_backward(c);
      case OpKind::relative_position_bias: return relative_position_bias_backward(c);
      case OpKind::moe_router: return moe_router_backward(c);
      case OpKind::moe_expert: return moe_expert_backward(c);
      case OpKind::moe_combine: return moe_combine_backward(c);
      case OpKind::maxpool2d: return maxpool2d_backward(c);
      case OpKind::avgpool2d: return avgpool2d_backward(c);
      case OpKind::global_avgpool: return global_avgpool_backward(c);
      case OpKind::flatten:
      case OpKind::reshape: return flatten_backward(c);
      case OpKind::tokens: return tokens_backward(c);
      case OpKind::select: return select_backward(c);
      case OpKind::dropout: return dropout_backward(c);
      case OpKind::drop_path: return drop_path_backward(c);
      case OpKind::cross_entropy: return cross_entropy_backward(c);
      case OpKind::opaque: break;  // the Trainer refuses such a plan first (engine_cannot_train)
    }
    op_error(c, "op has no CPU backward");
  }
};

}  // namespace
}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<cpu::CpuBackend>(); }

}  // namespace dlplan::exec
