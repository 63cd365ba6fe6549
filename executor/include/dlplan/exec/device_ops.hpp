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

// Buffers are Spans (tensor.hpp): fp32 or bf16 (bf16-mixed keeps parameters
// and gradients in bf16). Arithmetic is in fp32 (or double where said);
// results stored to bf16 round to nearest even.
class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda"
  virtual bool host() const = 0;         // may the CPU dereference tensor pointers?

  virtual void copy(Span dst, Span src) = 0;  // same dtype and length, non-overlapping
  virtual void zero(Span p) = 0;
  virtual void scaled_copy(Span dst, Span src, float scale) = 0;  // dst = src * scale
  virtual void scaled_add(Span dst, Span src, float scale) = 0;   // dst += src * scale (no FMA)
  // Host float32 values into a float tensor of any dtype (rounded to bf16), and back.
  virtual void upload_floats(Span dst, const float* host_src) = 0;
  virtual void download_floats(float* host_dst, Span src) = 0;  // host data ready on return
  virtual void upload(void* dst, const void* host_src, int64_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, int64_t bytes) = 0;  // host data ready on return
  // acc + sum of p[e]^2 in double. The CPU accumulates sequentially onto acc
  // (so a running sum over several calls is the single loop's sum).
  virtual double sum_of_squares(Span p, double acc = 0) = 0;
  // executor/src/optimizer.cpp's per-element update over params.n elements.
  // master: the fp32 master weights when params are bf16 (updated, then
  // rounded into params), else null (params are fp32 and updated in place).
  // m: adamw and sgd_momentum (else null); v: adamw (else null).
  virtual void optimizer_step(const OptimizerConfig& cfg, const OptimizerUpdate& u, Span params, Span grads,
                              float* master, float* m, float* v) = 0;
  // master[e] = params[e] as float (the fp32 master copy of bf16 parameters).
  virtual void widen(float* master, Span params) = 0;
  virtual void synchronize() = 0;  // the host waits for everything issued

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
