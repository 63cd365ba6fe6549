// The CPU's DeviceOps: host loops and memcpy, the reference arithmetic the
// trainer, parameter store and optimizer use. fp32 buffers keep the exact
// arithmetic they always had; bf16 and f16 buffers are read as float, computed on in
// fp32 (double in the optimizer) and rounded once when stored.
#include "dlplan/exec/device_ops.hpp"

#include "cpu/optimizer_kernels.hpp"
#include "cpu/parallel.hpp"
#include "cpu/row_reduce.hpp"

#include "dlplan/error.hpp"
#include "dlplan/exec/bf16.hpp"

#include <cmath>
#include <cstring>

namespace dlplan::exec {
namespace {

float* as_f32(Span s) { return static_cast<float*>(s.data); }
uint16_t* as_half(Span s) { return static_cast<uint16_t*>(s.data); }

void same_shape(Span a, Span b, const char* what) {
  if (a.n != b.n || a.dtype != b.dtype)
    throw Error(std::string("internal error: DeviceOps::") + what + " over " + std::to_string(a.n) + " " +
                to_string(a.dtype) + " and " + std::to_string(b.n) + " " + to_string(b.dtype) + " elements");
}

// Element e of a float span, as float.
float load(Span s, int64_t e) { return is_half(s.dtype) ? from_half(s.dtype, as_half(s)[e]) : as_f32(s)[e]; }
void store(Span s, int64_t e, float v) {
  if (is_half(s.dtype)) as_half(s)[e] = to_half(s.dtype, v);
  else as_f32(s)[e] = v;
}

class CpuDeviceOps final : public DeviceOps {
 public:
  std::string name() const override { return "cpu"; }
  bool host() const override { return true; }

  void copy(Span dst, Span src) override {
    same_shape(dst, src, "copy");
    if (dst.n > 0) std::memcpy(dst.data, src.data, static_cast<size_t>(dst.bytes()));
  }
  void zero(Span p) override { cpu::parallel_zero(p.data, p.bytes()); }
  void scaled_copy(Span dst, Span src, float scale) override {
    same_shape(dst, src, "scaled_copy");
    if (dst.dtype == DType::f32) {
      float* d = as_f32(dst);
      const float* s = as_f32(src);
      for (int64_t e = 0; e < dst.n; ++e) d[e] = s[e] * scale;
      return;
    }
    for (int64_t e = 0; e < dst.n; ++e) store(dst, e, load(src, e) * scale);
  }
  void scaled_add(Span dst, Span src, float scale) override {
    same_shape(dst, src, "scaled_add");
    if (dst.dtype == DType::f32) {
      float* d = as_f32(dst);
      const float* s = as_f32(src);
      for (int64_t e = 0; e < dst.n; ++e) d[e] += s[e] * scale;
      return;
    }
    for (int64_t e = 0; e < dst.n; ++e) store(dst, e, load(dst, e) + load(src, e) * scale);
  }
  void upload_floats(Span dst, const float* host_src) override {
    if (is_half(dst.dtype)) f32_to_half(dst.dtype, host_src, as_half(dst), dst.n);
    else if (dst.n > 0) std::memcpy(dst.data, host_src, static_cast<size_t>(dst.bytes()));
  }
  void download_floats(float* host_dst, Span src) override {
    if (is_half(src.dtype)) half_to_f32(src.dtype, as_half(src), host_dst, src.n);
    else if (src.n > 0) std::memcpy(host_dst, src.data, static_cast<size_t>(src.bytes()));
  }
  void upload(void* dst, const void* host_src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(dst, host_src, static_cast<size_t>(bytes));
  }
  void download(void* host_dst, const void* src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(host_dst, src, static_cast<size_t>(bytes));
  }
  double sum_of_squares(Span g, double sq) override {
    if (g.dtype == DType::f32) return sq + cpu::sum_of_squares_f32(as_f32(g), g.n);
    // 16-bit gradients: the same eight lanes, on one thread.
    return sq + cpu::lane_sum(g.n, [&](int64_t e) {
             const double x = load(g, e);
             return x * x;
           });
  }
  void widen(float* master, Span params) override { download_floats(master, params); }

  void optimizer_step(const OptimizerConfig& cfg, const OptimizerUpdate& u, Span params, Span grads, float* master,
                      float* m, float* v) override {
    same_shape(params, grads, "optimizer_step");
    if (is_half(params.dtype) && master == nullptr)
      throw Error("internal error: a half-precision optimizer step needs fp32 master weights");
    // The weights updated: the fp32 master copy, or the fp32 parameters themselves.
    float* p = master ? master : as_f32(params);
    const double lr = u.lr, clip = u.clip_scale;
    const double wd = u.decay ? cfg.weight_decay : 0.0;
    const double bc1 = 1.0 - std::pow(cfg.beta1, u.t), bc2 = 1.0 - std::pow(cfg.beta2, u.t);
    // Elements are independent: threads take contiguous ranges (cpu/parallel.hpp).
    if (cfg.kind == OptimizerKind::adamw && !master && grads.dtype == DType::f32) {
      // fp32 AdamW, the common case: the loop below without its per-element
      // switches, on SIMD lanes (cpu/optimizer_kernels.hpp); the same
      // operations in the same order, so the same bits.
      const cpu::AdamWScalars s{lr, clip, 1.0 - lr * wd, cfg.beta1, cfg.beta2, cfg.eps, bc1, bc2};
      const float* g = as_f32(grads);
      cpu::parallel_for(params.n, cpu::grain_elements() / 4,
                        [&](int64_t begin, int64_t end) { cpu::adamw_f32(s, p, g, m, v, begin, end); });
      return;
    }
    cpu::parallel_for(params.n, cpu::grain_elements() / 4, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) {
      const double grad = static_cast<double>(load(grads, e)) * clip;
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
      if (master) store(params, e, p[e]);  // the model's copy: the master rounded once
    }
    });
  }

  void synchronize() override {}
};

}  // namespace

std::unique_ptr<DeviceOps> make_cpu_device_ops() { return std::make_unique<CpuDeviceOps>(); }

}  // namespace dlplan::exec
