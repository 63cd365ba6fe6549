// The CUDA DeviceOps (dlplan/exec/device_ops.hpp): everything enqueued on the
// backend's compute stream, so it is ordered after the ops issued before it
// and before the ones issued after; download (and sum_of_squares, which
// returns to the host) wait for that stream. The optimizer update is
// cuda_optimizer_step (adamw.cu: optimizer.cpp's per-element arithmetic in
// double); the scaled gradient copies are scale.cu's kernels.
#include "dlplan/exec/device_ops.hpp"

#include "device.hpp"

#include "dlplan/error.hpp"
#include "dlplan/exec/cuda_backend.hpp"
#include "dlplan/exec/cuda_runtime.hpp"

#include <cuda_runtime_api.h>

namespace dlplan::exec {
namespace cuda {
// scale.cu
void scaled_copy(float* dst, const float* src, float scale, int64_t n, cudaStream_t s);
void scaled_add(float* dst, const float* src, float scale, int64_t n, cudaStream_t s);
void fill(float* p, float value, int64_t n, cudaStream_t s);
}  // namespace cuda

namespace {

class CudaDeviceOps final : public DeviceOps {
 public:
  explicit CudaDeviceOps(const Backend& b)
      : stream_(static_cast<cudaStream_t>(cuda_compute_stream(b))), device_(cudart::current_device()) {
    cudart::check(cudaMalloc(reinterpret_cast<void**>(&accum_), sizeof(double)), "cudaMalloc (norm accumulator)");
  }
  ~CudaDeviceOps() override {
    if (accum_) (void)cudaFree(accum_);
  }
  CudaDeviceOps(const CudaDeviceOps&) = delete;
  CudaDeviceOps& operator=(const CudaDeviceOps&) = delete;

  std::string name() const override { return "cuda"; }
  bool host() const override { return false; }

  void copy(float* dst, const float* src, int64_t n) override {
    if (n <= 0) return;
    cudart::check(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
                  "cudaMemcpyAsync (device to device)");
  }
  void zero(float* p, int64_t n) override {
    if (n <= 0) return;
    cudart::check(cudaMemsetAsync(p, 0, static_cast<size_t>(n) * sizeof(float), stream_), "cudaMemsetAsync");
  }
  void fill(float* p, float value, int64_t n) override {
    cuda::fill(p, value, n, stream_);
    launched("fill");
  }
  void scaled_copy(float* dst, const float* src, float scale, int64_t n) override {
    cuda::scaled_copy(dst, src, scale, n, stream_);
    launched("scaled_copy");
  }
  void scaled_add(float* dst, const float* src, float scale, int64_t n) override {
    cuda::scaled_add(dst, src, scale, n, stream_);
    launched("scaled_add");
  }
  void upload(void* dst, const void* host_src, int64_t bytes) override {
    copy_to_device(dst, host_src, bytes, stream_);
  }
  void download(void* host_dst, const void* src, int64_t bytes) override {
    if (bytes <= 0) {
      synchronize();
      return;
    }
    copy_to_host(host_dst, src, bytes, stream_);  // waits for the stream
  }
  double sum_of_squares(const float* p, int64_t n, double acc) override {
    if (n <= 0) return acc;
    cudart::check(cudaMemsetAsync(accum_, 0, sizeof(double), stream_), "cudaMemsetAsync (norm accumulator)");
    cuda_sum_of_squares(p, n, accum_, stream_);
    double h = 0;
    copy_to_host(&h, accum_, sizeof(double), stream_);
    return acc + h;
  }
  void optimizer_step(const OptimizerConfig& cfg, const OptimizerUpdate& u, float* params, const float* grads, float* m,
                      float* v, int64_t n) override {
    if (n <= 0) return;
    CudaOptimizerStep s;
    switch (cfg.kind) {
      case OptimizerKind::adamw: s.kind = CudaOptimizer::adamw; break;
      case OptimizerKind::sgd: s.kind = CudaOptimizer::sgd; break;
      case OptimizerKind::sgd_momentum: s.kind = CudaOptimizer::sgd_momentum; break;
    }
    s.lr = u.lr;
    s.beta1 = cfg.beta1;
    s.beta2 = cfg.beta2;
    s.eps = cfg.eps;
    s.weight_decay = cfg.weight_decay;
    s.momentum = cfg.momentum;
    s.t = u.t;
    s.clip_scale = u.clip_scale;
    cuda_optimizer_step(s, u.decay, params, grads, m, v, n, stream_);
  }
  void synchronize() override { cudart::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (compute stream)"); }

  int64_t runtime_bytes(const Allocator& a) const override { return measure_runtime_bytes(a); }
  int64_t device_free_bytes() const override {
    const cudart::DeviceGuard guard(device_);
    return cuda_device_info().free_bytes;
  }
  int device_count() const override { return cuda_device_count(); }

 private:
  static void launched(const char* what) {
    cudart::check(cudaGetLastError(), what);
  }

  cudaStream_t stream_ = nullptr;
  int device_ = 0;
  double* accum_ = nullptr;
};

}  // namespace

std::unique_ptr<DeviceOps> make_cuda_device_ops(const Backend& b) { return std::make_unique<CudaDeviceOps>(b); }

}  // namespace dlplan::exec
