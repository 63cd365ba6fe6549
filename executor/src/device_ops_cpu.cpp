// The CPU's DeviceOps: host loops and memcpy, the reference arithmetic the
// trainer, parameter store and optimizer used inline before (moved here
// unchanged, so CPU results are bit-identical).
#include "dlplan/exec/device_ops.hpp"

#include <cmath>
#include <cstring>

namespace dlplan::exec {
namespace {

class CpuDeviceOps final : public DeviceOps {
 public:
  std::string name() const override { return "cpu"; }
  bool host() const override { return true; }

  void copy(float* dst, const float* src, int64_t n) override {
    if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  }
  void zero(float* p, int64_t n) override {
    if (n > 0) std::memset(p, 0, static_cast<size_t>(n) * sizeof(float));
  }
  void fill(float* p, float value, int64_t n) override {
    for (int64_t e = 0; e < n; ++e) p[e] = value;
  }
  void scaled_copy(float* dst, const float* src, float scale, int64_t n) override {
    for (int64_t e = 0; e < n; ++e) dst[e] = src[e] * scale;
  }
  void scaled_add(float* dst, const float* src, float scale, int64_t n) override {
    for (int64_t e = 0; e < n; ++e) dst[e] += src[e] * scale;
  }
  void upload(void* dst, const void* host_src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(dst, host_src, static_cast<size_t>(bytes));
  }
  void download(void* host_dst, const void* src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(host_dst, src, static_cast<size_t>(bytes));
  }
  double sum_of_squares(const float* g, int64_t n, double sq) override {
    for (int64_t e = 0; e < n; ++e) sq += static_cast<double>(g[e]) * g[e];
    return sq;
  }

  void optimizer_step(const OptimizerConfig& cfg, const OptimizerUpdate& u, float* p, const float* g, float* m,
                      float* v, int64_t n) override {
    const double lr = u.lr, clip = u.clip_scale;
    const double wd = u.decay ? cfg.weight_decay : 0.0;
    const double bc1 = 1.0 - std::pow(cfg.beta1, u.t), bc2 = 1.0 - std::pow(cfg.beta2, u.t);
    for (int64_t e = 0; e < n; ++e) {
      const double grad = g[e] * clip;
      switch (cfg.kind) {
        case OptimizerKind::adamw: {
          // Decoupled weight decay (Loshchilov & Hutter, AdamW), then Adam.
          double w = p[e] * (1.0 - lr * wd);
          m[e] = static_cast<float>(cfg.beta1 * m[e] + (1 - cfg.beta1) * grad);
          v[e] = static_cast<float>(cfg.beta2 * v[e] + (1 - cfg.beta2) * grad * grad);
          w -= lr * (m[e] / bc1) / (std::sqrt(v[e] / bc2) + cfg.eps);
          p[e] = static_cast<float>(w);
          break;
        }
        case OptimizerKind::sgd:
          p[e] = static_cast<float>(p[e] - lr * (grad + wd * p[e]));
          break;
        case OptimizerKind::sgd_momentum: {
          m[e] = static_cast<float>(cfg.momentum * m[e] + grad + wd * p[e]);
          p[e] = static_cast<float>(p[e] - lr * m[e]);
          break;
        }
      }
    }
  }

  void synchronize() override {}
};

}  // namespace

std::unique_ptr<DeviceOps> make_cpu_device_ops() { return std::make_unique<CpuDeviceOps>(); }

}  // namespace dlplan::exec
