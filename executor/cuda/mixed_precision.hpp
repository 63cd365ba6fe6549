// bf16-mixed and fp16-mixed on the CUDA backend (docs/precision.md), as the
// CPU engine does them (executor/cpu/mixed_precision.cpp): float tensors are
// stored in a 16-bit type (bf16, or IEEE fp16 as __half), the arithmetic
// (kernels and cuBLAS GEMMs) is fp32. Internal to executor/cuda; host C++.
#pragma once

#include "cuda/kernels.hpp"
#include "cuda/runtime.hpp"

namespace dlplan::exec::cuda {

// The kernels' storage type (kernels.hpp) of a float tensor's dtype: bf16 and
// f16 as themselves, anything else as fp32.
inline Store store_of(DType d) {
  switch (d) {
    case DType::bf16: return Store::bf16;
    case DType::f16: return Store::f16;
    default: return Store::f32;
  }
}

// An fp32 device tensor outside any Allocator: from the runtime's
// stream-ordered pool, given back (cudaFreeAsync on the compute stream) when
// its last view dies, so kernels enqueued before that still see it.
Tensor scratch_f32(Runtime& rt, const Shape& shape, const OpContext* c);

// Runs a forward (backward) op on fp32 working copies of c's 16-bit (bf16 or
// f16) inputs, parameters, output, saved tensors and output gradient, and
// rounds what it wrote (the output; the input and parameter gradients it
// accumulated into, one copy per storage, loaded first) back into them. The copies live outside
// the accounting. The saved tensors the forward returns in c.saved are the
// ones the op allocated itself (in their stored dtype). With c.act_dtype f32
// this is op(rt, c), nothing more.
void run_in_fp32(Runtime& rt, OpContext& c, bool backward, void (*op)(Runtime&, OpContext&));

// The fp32 values of a tensor an op fills itself (its own saved tensor or a
// temporary, allocated through c.alloc in the storage dtype): data() for the
// kernels, the tensor itself when it is fp32 (nullptr when undefined); for a
// bf16 or f16 tensor an fp32 copy (loaded from it when `load`). store()
// rounds the copy into the tensor and leaves in the copy what the tensor now
// holds, so that later arithmetic reads the stored values; a no-op for fp32.
class Fp32Buffer {
 public:
  Fp32Buffer(Runtime& rt, const OpContext& c, const Tensor& t, bool load = false);
  float* data() const;
  void store();

 private:
  Runtime* rt_;
  const OpContext* c_;
  Tensor target_, twin_;
};

}  // namespace dlplan::exec::cuda
