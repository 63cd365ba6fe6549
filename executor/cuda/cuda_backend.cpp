// The CUDA backend: per-backend runtime (device, stream, cuBLAS handle),
// dispatch to cuda_ops.cpp, error checking, and the public helpers of
// dlplan/exec/cuda_backend.hpp (availability, copies, plain device memory,
// the optimizer's fused step).
//
// Host C++ only (the kernels are in the .cu files behind kernels.hpp).
#include "dlplan/exec/cuda_backend.hpp"

#include "cuda/kernels.hpp"
#include "cuda/mixed_precision.hpp"
#include "cuda/runtime.hpp"

#include "dlplan/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace dlplan::exec {
namespace cuda {

[[noreturn]] void fail(const char* what, const char* detail, const OpContext* c, const char* file, int line) {
  std::string where;
  if (c && c->node) where = " (" + node_label(*c->node) + ")";
  throw Error(fmt::format("CUDA error at {}:{}: {}: {}{}", file, line, what, detail, where));
}

void check(cudaError_t e, const char* what, const OpContext* c, const char* file, int line) {
  if (e != cudaSuccess) fail(what, cudaGetErrorString(e), c, file, line);
}

void check(cublasStatus_t e, const char* what, const OpContext* c, const char* file, int line) {
  if (e != CUBLAS_STATUS_SUCCESS) fail(what, cublasGetStatusString(e), c, file, line);
}

Runtime::Runtime(int dev) : device(dev) {
  DLPLAN_CU(nullptr, cudaSetDevice(dev));
  // A blocking stream: it orders with the legacy default stream, on which
  // cudaMemset / cudaMemcpy of the memory resources run.
  DLPLAN_CU(nullptr, cudaStreamCreate(&stream));
  DLPLAN_CU(nullptr, cublasCreate(&blas));
  DLPLAN_CU(nullptr, cublasSetStream(blas, stream));
  DLPLAN_CU(nullptr, cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH));  // fp32, no TF32
  DLPLAN_CU(nullptr, cudaMalloc(reinterpret_cast<void**>(&err), sizeof(int)));
  const char* sync = std::getenv("DLPLAN_CUDA_SYNC");
  sync_each_op = sync != nullptr && *sync != '\0' && std::strcmp(sync, "0") != 0;
}

Runtime::~Runtime() {
  // Best effort: a destructor must not throw.
  if (stream) cudaStreamSynchronize(stream);
  if (scratch) cudaFree(scratch);
  if (f32_pool) cudaMemPoolDestroy(f32_pool);
  if (err) cudaFree(err);
  if (blas) cublasDestroy(blas);
  if (stream) cudaStreamDestroy(stream);
}

void* Runtime::scratch_at_least(size_t bytes, const OpContext* c) {
  if (bytes <= scratch_bytes) return scratch;
  ++scratch_grows;
  const size_t grown = std::max<size_t>({bytes, 2 * scratch_bytes, 4096});
  if (scratch) {
    DLPLAN_CU(c, cudaStreamSynchronize(stream));  // earlier kernels may still read it
    DLPLAN_CU(c, cudaFree(scratch));
    scratch = nullptr;
    scratch_bytes = 0;
  }
  DLPLAN_CU(c, cudaMalloc(&scratch, grown));
  scratch_bytes = grown;
  return scratch;
}

namespace {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : rt_(device) {}
  std::string name() const override { return "cuda"; }
  void forward(OpContext& c) override {
    DLPLAN_CU(&c, cudaSetDevice(rt_.device));
    run_in_fp32(rt_, c, /*backward=*/false, ops_forward);  // fp32: ops_forward(rt_, c) itself
    if (rt_.sync_each_op) DLPLAN_CU(&c, cudaStreamSynchronize(rt_.stream));  // "(forward)" is in the node's name
  }
  void backward(OpContext& c) override {
    DLPLAN_CU(&c, cudaSetDevice(rt_.device));
    run_in_fp32(rt_, c, /*backward=*/true, ops_backward);
    if (rt_.sync_each_op) DLPLAN_CU(&c, cudaStreamSynchronize(rt_.stream));
  }
  void set_gemm_workspace(void* p, int64_t bytes) override {
    DLPLAN_CU(nullptr, cudaSetDevice(rt_.device));
    // After cublasSetStream (the constructor's), which resets the workspace.
    DLPLAN_CU(nullptr, cublasSetWorkspace(rt_.blas, p, static_cast<size_t>(bytes)));
  }
  void prepare(const Model& m, int64_t micro_batch, int syncbn_group) override {
    size_t most = 0;
    for (const Node& n : m.nodes) most = std::max(most, scratch_bytes_for(m, n, micro_batch, syncbn_group));
    if (most > 0) {
      DLPLAN_CU(nullptr, cudaSetDevice(rt_.device));
      rt_.scratch_at_least(most, nullptr);
    }
    rt_.scratch_grows = 0;
  }
  void* stream() const override { return rt_.stream; }
  void synchronize() const override {
    DLPLAN_CU(nullptr, cudaSetDevice(rt_.device));
    DLPLAN_CU(nullptr, cudaStreamSynchronize(rt_.stream));
  }
  int scratch_grows() const override { return rt_.scratch_grows; }

 private:
  Runtime rt_;
};

// cudaMalloc / cudaFree, no caching; counted as requested.
class PlainMemory final : public MemoryResource {
 public:
  explicit PlainMemory(int device) : device_(device) {}
  void* allocate(int64_t bytes, int64_t& granted) override {
    DLPLAN_CU(nullptr, cudaSetDevice(device_));
    void* p = nullptr;
    if (cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1))) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free allocation error
      return nullptr;      // the Allocator reports out of memory, naming the tensor
    }
    granted = bytes;
    return p;
  }
  void release(void* p, int64_t) override { cudaFree(p); }
  void zero(void* p, int64_t bytes) override { DLPLAN_CU(nullptr, cudaMemset(p, 0, static_cast<size_t>(bytes))); }
  bool host_visible() const override { return false; }

 private:
  int device_;
};

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace
}  // namespace cuda

bool cuda_available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = fmt::format("no usable CUDA device: {} ({})", cudaGetErrorString(e), cudaGetErrorName(e));
    cudaGetLastError();
    return false;
  }
  if (n == 0) {
    if (why) *why = "no CUDA device";
    return false;
  }
  return true;
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  std::string why;
  if (!cuda_available(&why)) throw Error("the CUDA backend cannot start: " + why);
  return std::make_unique<cuda::CudaBackend>(device);
}

void* cuda_compute_stream(const Backend& b) {
  if (b.stream() == nullptr) throw Error(fmt::format("backend '{}' has no stream: it is not the CUDA backend", b.name()));
  return b.stream();
}

std::unique_ptr<MemoryResource> make_cuda_plain_memory(int device) {
  return std::make_unique<cuda::PlainMemory>(device);
}

void copy_to_device(void* device_dst, const void* host_src, int64_t bytes, void* stream) {
  if (bytes <= 0) return;
  DLPLAN_CU(nullptr, cudaMemcpyAsync(device_dst, host_src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice,
                                     cuda::as_stream(stream)));
}

void copy_to_host(void* host_dst, const void* device_src, int64_t bytes, void* stream) {
  if (bytes <= 0) return;
  DLPLAN_CU(nullptr, cudaMemcpyAsync(host_dst, device_src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost,
                                     cuda::as_stream(stream)));
  DLPLAN_CU(nullptr, cudaStreamSynchronize(cuda::as_stream(stream)));
}

void cuda_optimizer_step(const CudaOptimizerStep& s, bool decay, float* param, const float* grad, float* m, float* v,
                         int64_t n, void* stream) {
  const double t = static_cast<double>(s.t);
  const double bc1 = 1.0 - std::pow(s.beta1, t), bc2 = 1.0 - std::pow(s.beta2, t);
  cuda::optimizer_step(static_cast<int>(s.kind), param, grad, cuda::Store::f32, nullptr, m, v, n, s.lr, s.beta1,
                       s.beta2, s.eps, bc1, bc2, decay ? s.weight_decay : 0.0, s.momentum, s.clip_scale,
                       cuda::as_stream(stream));
  DLPLAN_LAUNCHED(nullptr);
}

void cuda_sum_of_squares(const float* x, int64_t n, double* device_accum, void* stream) {
  cuda::sum_of_squares(x, cuda::Store::f32, n, device_accum, cuda::as_stream(stream));
  DLPLAN_LAUNCHED(nullptr);
}

double cuda_sum_of_squares(const float* x, int64_t n, void* stream) {
  double* d = nullptr;
  DLPLAN_CU(nullptr, cudaMalloc(reinterpret_cast<void**>(&d), sizeof(double)));
  double h = 0;
  try {
    DLPLAN_CU(nullptr, cudaMemsetAsync(d, 0, sizeof(double), cuda::as_stream(stream)));
    cuda_sum_of_squares(x, n, d, stream);
    copy_to_host(&h, d, sizeof(double), stream);
  } catch (...) {
    cudaFree(d);
    throw;
  }
  cudaFree(d);
  return h;
}

void cuda_dropout_uniforms(uint64_t seed, int node_index, int64_t sample, int64_t n, float* out) {
  if (n <= 0) return;
  float* d = nullptr;
  DLPLAN_CU(nullptr, cudaMalloc(reinterpret_cast<void**>(&d), static_cast<size_t>(n) * sizeof(float)));
  try {
    cuda::philox_uniforms(seed, node_index, sample, n, d, nullptr);
    DLPLAN_LAUNCHED(nullptr);
    copy_to_host(out, d, n * static_cast<int64_t>(sizeof(float)), nullptr);
  } catch (...) {
    cudaFree(d);
    throw;
  }
  cudaFree(d);
}

}  // namespace dlplan::exec
