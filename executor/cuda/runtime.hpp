// The CUDA backend's per-backend state and error checking (internal to
// executor/cuda; host C++, compiled by the host compiler).
#pragma once

#include "dlplan/exec/backend.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>

namespace dlplan::exec::cuda {

// One per backend: the device, the compute stream, the cuBLAS handle bound to
// it, a device int for index validation, and a small scratch arena for the
// per-op reductions the CPU keeps on its stack (row losses, BatchNorm sums,
// SyncBN staging). The scratch is not an Allocator tensor on purpose: the CPU
// reference keeps these in std::vectors, outside the accounting, so the
// measured categories stay the op declarations'. It is a few KiB per layer
// (2C doubles, R doubles for the loss), grown on demand, and counts as runtime.
struct Runtime {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  int* err = nullptr;  // device
  void* scratch = nullptr;
  size_t scratch_bytes = 0;

  explicit Runtime(int dev);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  void* scratch_at_least(size_t bytes, const OpContext* c);
  int scratch_grows = 0;  // reallocations of the scratch (0 after prepare() sized it)
  // bf16-mixed and fp16-mixed (mixed_precision.cpp): the fp32 working copies
  // of an op's 16-bit tensors come from this stream-ordered pool
  // (cudaMallocFromPoolAsync), made on the first such op and never for an fp32
  // run. Outside the Allocator, as the scratch above: the categories count
  // what is stored, in 16 bits; what the pool keeps cached shows as runtime
  // memory.
  cudaMemPool_t f32_pool = nullptr;
  // DLPLAN_CUDA_SYNC=1: synchronise and check after every op, so that a
  // kernel fault is reported at the op that caused it (debugging).
  bool sync_each_op = false;
};

// The scratch bytes an op needs at this micro-batch (cuda_ops.cpp, beside
// the ops that use it); CudaBackend::prepare reserves the model's largest.
size_t scratch_bytes_for(const Model& m, const Node& n, int64_t batch, int syncbn_group);

// A failed CUDA / cuBLAS call as a dlplan::Error: "<file>:<line>: <call>:
// <error> (node '<name>' (<op>))" — node part only when c is non-null.
[[noreturn]] void fail(const char* what, const char* detail, const OpContext* c, const char* file, int line);
void check(cudaError_t e, const char* what, const OpContext* c, const char* file, int line);
void check(cublasStatus_t e, const char* what, const OpContext* c, const char* file, int line);

#define DLPLAN_CU(ctxptr, call) ::dlplan::exec::cuda::check((call), #call, (ctxptr), __FILE__, __LINE__)
// After a launcher (kernels.hpp): the launch's error, if any.
#define DLPLAN_LAUNCHED(ctxptr) \
  ::dlplan::exec::cuda::check(cudaGetLastError(), "kernel launch", (ctxptr), __FILE__, __LINE__)

void ops_forward(Runtime& rt, OpContext& c);
void ops_backward(Runtime& rt, OpContext& c);

}  // namespace dlplan::exec::cuda
