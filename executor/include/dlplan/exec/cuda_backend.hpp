// The CUDA backend (executor/cuda): every op of DESIGN.md's table in fp32 on
// one GPU, the same math as the CPU reference (executor/cpu), the same saved
// tensors and temporaries (allocated through ctx.alloc, so the accounting is
// the declaration's), accumulating into din / dparams.
//
// What a caller must know (the trainer, the tests):
//  - Every Tensor an op reads or writes holds a DEVICE pointer: ctx.alloc must
//    be an Allocator over device memory (executor/cuda/cuda_memory's caching
//    resource, or make_cuda_plain_memory() below). Inputs (the batch) are
//    uploaded by the caller (copy_to_device), the loss read back with
//    copy_to_host. Parameters, gradients, buffers and optimizer state live on
//    the device; the optimizer's update is cuda_optimizer_step below.
//  - All work is enqueued, in order, on the backend's compute stream
//    (Backend::stream()): an op returns before its kernels finish. The
//    backend synchronises that stream only where it must read a device value
//    on the host: embedding / cross_entropy index validation (a bad id or
//    target is a dlplan::Error naming the node) and around SyncBN hooks. A
//    caller that hands a tensor to another stream (NCCL) must order it after
//    the compute stream (an event, or Backend::synchronize). Temporaries are
//    released while their kernels may still run: a device memory resource
//    must be stream-ordered on the compute stream (the caching allocator
//    reuses a block only in stream order, or after a synchronisation).
//  - SyncBN hooks (OpContext::syncbn) are called with DEVICE pointers into a
//    backend-owned buffer; the compute stream has been synchronised before the
//    call, and the hook must return with the collective's result in place
//    (e.g. ncclAllGather / ncclAllReduce then a stream synchronise).
//  - cuBLAS runs in its default (pedantic fp32, no TF32) math mode; one handle
//    per backend, bound to the compute stream.
//
// This header keeps CUDA's headers out: streams are passed as void*
// (cudaStream_t), device pointers as plain pointers.
#pragma once

#include "dlplan/exec/backend.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace dlplan::exec {

// True when a CUDA device and driver are usable; otherwise false with the
// reason (cudaGetDeviceCount's error, or "no CUDA device") in *why.
bool cuda_available(std::string* why = nullptr);

// The backend on `device` (cudaSetDevice), with its own stream and cuBLAS
// handle. Throws dlplan::Error when the device cannot be used.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);

// The backend's compute stream (Backend::stream(), a cudaStream_t); throws
// if `b` has none (it is not the CUDA backend). Backend::synchronize() waits
// for it; Backend::scratch_grows() counts the scratch's growths.
void* cuda_compute_stream(const Backend& b);

// Device memory without caching (cudaMalloc / cudaFree, zero by cudaMemset),
// for tests and tools; the trainer uses the caching resource (cuda_memory).
std::unique_ptr<MemoryResource> make_cuda_plain_memory(int device = 0);

// Host <-> device copies on `stream` (nullptr: the legacy default stream).
// copy_to_host waits for the stream, so the host data is ready on return.
void copy_to_device(void* device_dst, const void* host_src, int64_t bytes, void* stream = nullptr);
void copy_to_host(void* host_dst, const void* device_src, int64_t bytes, void* stream = nullptr);

// ---- optimizer (device pointers, enqueued on `stream`) ---------------------------
// One fused update over a flat shard of n elements, per element in double as
// executor/src/optimizer.cpp: grad = g clip_scale;
//  adamw:        w = p (1 - lr wd); m = b1 m + (1-b1) grad; v = b2 v + (1-b2) grad^2;
//                p = w - lr (m / bc1) / (sqrt(v / bc2) + eps)
//  sgd:          p -= lr (grad + wd p)
//  sgd_momentum: m = momentum m + grad + wd p; p -= lr m
// with wd = weight_decay when `decay` (the segment's flag), else 0, and
// bc1 = 1 - beta1^t, bc2 = 1 - beta2^t for the step count t (from 1).
enum class CudaOptimizer { adamw = 0, sgd = 1, sgd_momentum = 2 };
struct CudaOptimizerStep {
  CudaOptimizer kind = CudaOptimizer::adamw;
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0, momentum = 0;
  int64_t t = 1;            // step count, from 1 (bias corrections)
  double clip_scale = 1.0;  // min(1, clip_norm / (norm + 1e-6)), computed by the caller
};
// m: adamw and sgd_momentum (else may be null); v: adamw only.
void cuda_optimizer_step(const CudaOptimizerStep& s, bool decay, float* param, const float* grad, float* m, float* v,
                         int64_t n, void* stream);
// *device_accum (a device double) += sum of x^2 over n elements (enqueued).
void cuda_sum_of_squares(const float* x, int64_t n, double* device_accum, void* stream);
// The same, returned to the host (waits for the stream).
double cuda_sum_of_squares(const float* x, int64_t n, void* stream);

// Dropout's uniforms computed on the device (the Philox kernel the ops use),
// copied to host `out` — for the bit-identity test against dropout_uniform.
void cuda_dropout_uniforms(uint64_t seed, int node_index, int64_t sample, int64_t n, float* out);

}  // namespace dlplan::exec
