// What the trainer, the parameter store and the optimizer do to tensor memory
// outside the ops: copies, zeroing, scaled copies of gradients, host <->
// tensor transfers, the gradient norm and the optimizer's update. The CPU
// implementation is host loops (the reference arithmetic); the CUDA one
// enqueues the same per-element arithmetic on the backend's compute stream,
// so every call is ordered after the ops issued before it.
//
// Pointers are where the allocator's memory resource puts tensors: host
// memory for the CPU, device memory for CUDA. upload/download move bytes
// between a host buffer and such a pointer; download returns with the host
// data ready (it waits for the work issued so far).
#pragma once

#include "dlplan/exec/tensor.hpp"
#include "dlplan/training.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace dlplan::exec {

class Backend;

// One optimizer update over a run of a unit's flat buffer with one decay setting.
struct OptimizerUpdate {
  double lr = 0;
  double clip_scale = 1.0;  // min(1, clip_norm / (norm + 1e-6)), or 1
  int64_t t = 1;            // step count from 1: bias corrections 1 - beta^t
  bool decay = false;       // the segment's weight-decay flag (wd = weight_decay when set, else 0)
};

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda"
  virtual bool host() const = 0;         // may the CPU dereference tensor pointers?

  virtual void copy(float* dst, const float* src, int64_t n) = 0;  // n floats, non-overlapping
  virtual void zero(float* p, int64_t n) = 0;
  virtual void fill(float* p, float value, int64_t n) = 0;
  virtual void scaled_copy(float* dst, const float* src, float scale, int64_t n) = 0;  // dst = src * scale (fp32)
  virtual void scaled_add(float* dst, const float* src, float scale, int64_t n) = 0;   // dst += src * scale (fp32, no FMA)
  virtual void upload(void* dst, const void* host_src, int64_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, int64_t bytes) = 0;  // host data ready on return
  // acc + sum of p[e]^2 in double. The CPU accumulates sequentially onto acc
  // (so a running sum over several calls is the single loop's sum).
  virtual double sum_of_squares(const float* p, int64_t n, double acc = 0) = 0;
  // executor/src/optimizer.cpp's per-element update over n elements. m: adamw
  // and sgd_momentum (else null); v: adamw (else null).
  virtual void optimizer_step(const OptimizerConfig& cfg, const OptimizerUpdate& u, float* params, const float* grads,
                              float* m, float* v, int64_t n) = 0;
  virtual void synchronize() = 0;  // the host waits for everything issued

  // DESIGN.md's `runtime` bytes for an allocator over this device's memory (CPU: 0).
  virtual int64_t runtime_bytes(const Allocator&) const { return 0; }
  // Free device memory and the devices visible (CPU: -1 and 0: use the host's).
  virtual int64_t device_free_bytes() const { return -1; }
  virtual int device_count() const { return 0; }
};

std::unique_ptr<DeviceOps> make_cpu_device_ops();

// On the CUDA backend's device and compute stream (cuda_compute_stream(b)).
// Defined only when dlplan is built with CUDA (DLPLAN_HAVE_CUDA); throws
// dlplan::Error when `b` is not the CUDA backend.
std::unique_ptr<DeviceOps> make_cuda_device_ops(const Backend& b);

}  // namespace dlplan::exec
