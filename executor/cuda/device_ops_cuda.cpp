// The CUDA DeviceOps (dlplan/exec/device_ops.hpp): everything enqueued on the
// backend's compute stream, so it is ordered after the ops issued before it
// and before the ones issued after; download (and sum_of_squares, which
// returns to the host) wait for that stream. The optimizer update is
// cuda_optimizer_step (adamw.cu: optimizer.cpp's per-element arithmetic in
// double); the scaled gradient copies are scale.cu's kernels.
#include "dlplan/exec/device_ops.hpp"

#include "cuda/kernels.hpp"
#include "cuda/mixed_precision.hpp"
#include "device.hpp"

#include "dlplan/error.hpp"
#include "dlplan/exec/cuda_backend.hpp"
#include "dlplan/exec/bf16.hpp"
#include "dlplan/exec/cuda_runtime.hpp"

#include <cuda_runtime_api.h>

#include <cmath>
#include <vector>

namespace dlplan::exec {
namespace {

// The kernels' storage type of a span (fp32, bf16 or f16).
cuda::Store store(const Span& s) { return cuda::store_of(s.dtype); }

void same_shape(const Span& a, const Span& b, const char* what) {
  if (a.n != b.n || a.dtype != b.dtype)
    throw Error(std::string("internal error: DeviceOps::") + what + " over " + std::to_string(a.n) + " " +
                to_string(a.dtype) + " and " + std::to_string(b.n) + " " + to_string(b.dtype) + " elements");
}

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

  void copy(Span dst, Span src) override {
    same_shape(dst, src, "copy");
    if (dst.n <= 0) return;
    cudart::check(cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(dst.bytes()), cudaMemcpyDeviceToDevice,
                                  stream_),
                  "cudaMemcpyAsync (device to device)");
  }
  void zero(Span p) override {
    if (p.n <= 0) return;
    cudart::check(cudaMemsetAsync(p.data, 0, static_cast<size_t>(p.bytes()), stream_), "cudaMemsetAsync");
  }
  void scaled_copy(Span dst, Span src, float scale) override {
    same_shape(dst, src, "scaled_copy");
    cuda::scaled_copy(dst.data, src.data, store(dst), scale, dst.n, stream_);
    launched("scaled_copy");
  }
  void scaled_add(Span dst, Span src, float scale) override {
    same_shape(dst, src, "scaled_add");
    cuda::scaled_add(dst.data, src.data, store(dst), scale, dst.n, stream_);
    launched("scaled_add");
  }
  // bf16 and f16: converted on the host (round to nearest even, as on the
  // device), then copied.
  void upload_floats(Span dst, const float* host_src) override {
    if (!is_half(dst.dtype)) return upload(dst.data, host_src, dst.bytes());
    std::vector<uint16_t> narrow(static_cast<size_t>(dst.n));
    f32_to_half(dst.dtype, host_src, narrow.data(), dst.n);
    upload(dst.data, narrow.data(), dst.bytes());
    synchronize();  // the host buffer dies on return
  }
  void download_floats(float* host_dst, Span src) override {
    if (!is_half(src.dtype)) return download(host_dst, src.data, src.bytes());
    std::vector<uint16_t> narrow(static_cast<size_t>(src.n));
    download(narrow.data(), src.data, src.bytes());
    half_to_f32(src.dtype, narrow.data(), host_dst, src.n);
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
  double sum_of_squares(Span p, double acc) override {
    if (p.n <= 0) return acc;
    cudart::check(cudaMemsetAsync(accum_, 0, sizeof(double), stream_), "cudaMemsetAsync (norm accumulator)");
    cuda::sum_of_squares(p.data, store(p), p.n, accum_, stream_);
    launched("sum_of_squares");
    double h = 0;
    copy_to_host(&h, accum_, sizeof(double), stream_);
    return acc + h;
  }
  void widen(float* master, Span params) override {
    if (!is_half(params.dtype)) {
      cudart::check(cudaMemcpyAsync(master, params.data, static_cast<size_t>(params.bytes()), cudaMemcpyDeviceToDevice,
                                    stream_),
                    "cudaMemcpyAsync (device to device)");
      return;
    }
    cuda::half_widen(master, params.data, store(params), params.n, stream_);
    launched("half_widen");
  }
  void optimizer_step(const OptimizerConfig& cfg, const OptimizerUpdate& u, Span params, Span grads, float* master,
                      float* m, float* v) override {
    same_shape(params, grads, "optimizer_step");
    if (params.n <= 0) return;
    if (is_half(params.dtype) && master == nullptr)
      throw Error("internal error: a half-precision optimizer step needs fp32 master weights");
    int kind = 0;
    switch (cfg.kind) {
      case OptimizerKind::adamw: kind = 0; break;
      case OptimizerKind::sgd: kind = 1; break;
      case OptimizerKind::sgd_momentum: kind = 2; break;
    }
    const double t = static_cast<double>(u.t);
    const double bc1 = 1.0 - std::pow(cfg.beta1, t), bc2 = 1.0 - std::pow(cfg.beta2, t);
    float* p = master ? master : static_cast<float*>(params.data);
    cuda::optimizer_step(kind, p, grads.data, store(grads), master ? params.data : nullptr, m, v, params.n, u.lr,
                         cfg.beta1, cfg.beta2, cfg.eps, bc1, bc2, u.decay ? cfg.weight_decay : 0.0, cfg.momentum,
                         u.clip_scale, stream_);
    launched("optimizer_step");
  }
  void synchronize() override { cudart::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (compute stream)"); }

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
