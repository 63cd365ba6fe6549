// The compute backend seam (ggml-style): an op's forward and backward get an
// OpContext; a backend runs them. The CPU backend (executor/cpu) is the
// reference; the CUDA backend implements the same interface.
//
// Layout: tensors carry the batch dimension first ([b, ...per-sample shape]).
// Parameters are PyTorch-shaped: linear weight [out, in], conv weight
// [out, C/groups, kh, kw], attention q/k/v/o weights [out, in].
//
// Ownership of memory (DESIGN.md categories), so that what an op allocates is
// exactly its declaration (ops.hpp):
//  - the trainer allocates `out` before forward, and `din` before backward;
//  - forward allocates the op's own saved tensors (SavedTensor::Ref::own, in
//    declaration order) into `saved`, category activations (workspace when
//    !keep_saved), and its forward
//    temporaries (workspace), freeing the temporaries before returning;
//  - backward allocates and frees its backward temporaries (workspace);
//    `din` and `dparams` are accumulated into (+=), never overwritten.
#pragma once

#include "dlplan/exec/tensor.hpp"
#include "dlplan/ops.hpp"

#include <functional>
#include <string>
#include <vector>

namespace dlplan::exec {

// SyncBatchNorm's collectives for one BN layer, over its sync group.
struct SyncBnHooks {
  int group_size = 1;
  // In place: buf holds group_size slots of n floats; this rank's slot filled.
  std::function<void(float* buf, int64_t n)> all_gather;
  std::function<void(float* buf, int64_t n)> all_reduce_sum;
};

struct OpContext {
  const Model* model = nullptr;
  const Node* node = nullptr;
  int node_index = -1;
  const OpDecl* decl = nullptr;
  Allocator* alloc = nullptr;

  int64_t batch = 1;           // micro-batch b on this rank
  int64_t first_sample = 0;    // global index of this rank's first sample (dropout keying)
  uint64_t seed = 0;
  bool training = true;
  bool recompute = false;      // a checkpointed unit's second forward: BN must not update running stats again
  // False in the first (no-grad) forward of a checkpointed unit: the op's own
  // saved tensors are then temporaries (workspace), dropped when it returns,
  // as under torch.utils.checkpoint; they are made again by the recompute.
  bool keep_saved = true;
  // The storage dtype of the op's float tensors (inputs, output, gradients,
  // and its own saved tensors and temporaries declared Elem::compute): f32, or
  // bf16 under bf16-mixed. The arithmetic is fp32 either way.
  DType act_dtype = DType::f32;

  std::vector<Tensor> in;      // inputs, [b, ...]
  Tensor out;                  // [b, ...] (scalar loss: shape {})
  std::vector<Tensor> params;  // ParamDecl order; a tied linear gets the embedding's weight first
  std::vector<Tensor> buffers; // BatchNorm running_mean, running_var
  std::vector<Tensor> saved;   // own saved tensors, declaration order (forward fills)

  Tensor dout;                 // backward: gradient of out
  std::vector<Tensor> din;     // backward: gradient per input (undefined: not needed)
  std::vector<Tensor> dparams; // backward: gradient per param, accumulated into
  double grad_scale = 1.0;     // cross_entropy backward: d(loss)/d(this op's mean), e.g. 1/grad_accum
  const SyncBnHooks* syncbn = nullptr;
};

// Where an op's own saved tensors are counted (see OpContext::keep_saved).
inline Category saved_category(const OpContext& c) { return c.keep_saved ? Category::activations : Category::workspace; }

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual void forward(OpContext& ctx) = 0;
  virtual void backward(OpContext& ctx) = 0;
  // The GEMM library's workspace, allocated by the trainer as the plan counts
  // it (a persistent `workspace` tensor); the backend hands it to its GEMM
  // library (cuBLAS: cublasSetWorkspace). The CPU's BLAS takes none.
  virtual void set_gemm_workspace(void* /*device_ptr*/, int64_t /*bytes*/) {}
  // Called once before training: the backend sizes its own scratch (per-op
  // reductions kept outside the accounting, as the CPU keeps them on its
  // stack) for the largest op of the model at this micro-batch, so that it
  // never grows (CUDA: cudaFree, a device-wide synchronisation) mid-step.
  virtual void prepare(const Model& /*m*/, int64_t /*micro_batch*/, int /*syncbn_group*/) {}
  // Where the backend enqueues its work (CUDA: its compute stream, a
  // cudaStream_t); nullptr for a backend that finishes each op before it
  // returns (the CPU). Communicators and DeviceOps order themselves after it.
  virtual void* stream() const { return nullptr; }
  // The host waits for everything enqueued so far; throws on a device error.
  virtual void synchronize() const {}
  // How often the backend's scratch had to grow since prepare() sized it
  // (CUDA: each growth is a cudaFree, a device-wide synchronisation).
  virtual int scratch_grows() const { return 0; }
};

std::unique_ptr<Backend> make_cpu_backend();

// Philox4x32-10 (Salmon et al., SC'11): 4 x 32-bit outputs for a 128-bit
// counter and 64-bit key. Dropout's u for an element: first output / 2^32
// with key = seed, counter = (element index low 32 bits, global sample index,
// node index, element index high 32 bits).
void philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);
// The first output word of philox4x32_10 for the counters (c0 + i, c1, c2, c3),
// i = 0 .. n-1 (c0 + i wraps at 2^32, no carry), into out[0..n): eight at once
// with AVX2, the same words as one call each.
void philox_first_words(const uint32_t key[2], uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, int64_t n,
                        uint32_t* out);
float dropout_uniform(uint64_t seed, int node_index, int64_t sample, int64_t element);
// dropout_uniform for elements first .. first + n - 1 of one sample, into u[0..n):
// the same bits, eight at a time where the CPU has AVX2.
void dropout_uniforms(uint64_t seed, int node_index, int64_t sample, int64_t first, int64_t n, float* u);

}  // namespace dlplan::exec
