// bf16-mixed and fp16-mixed on the CUDA backend, as
// executor/cpu/mixed_precision.cpp does them on the CPU: the float tensors an
// op reads and writes are stored in a 16-bit type (bf16, or IEEE fp16), its
// arithmetic is fp32 (the existing fp32 kernels and cuBLAS SGEMMs).
//
// run_in_fp32 gives the op fp32 working copies: each 16-bit input, parameter,
// output, saved tensor and output gradient is widened (exactly) into an fp32
// device buffer, and the output and the gradients the op accumulates into are
// rounded back (to nearest even) once it has enqueued its work. The copies
// come from a stream-ordered pool of the runtime, outside the Allocator (as
// the CPU's come from the heap): the categories count what is stored, in
// 16 bits, exactly as the plan does. The op's own saved tensors and temporaries
// are allocated in the storage dtype by the op itself, through Fp32Buffer.
//
// Everything here is enqueued on the compute stream; a copy is given back with
// cudaFreeAsync on that stream, after the kernels that read it.
#include "cuda/mixed_precision.hpp"

#include "cuda/kernels.hpp"

#include "dlplan/exec/bf16.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>

namespace dlplan::exec::cuda {
namespace {

cudaMemPool_t f32_pool(Runtime& rt, const OpContext* c) {
  if (rt.f32_pool == nullptr) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = rt.device;
    DLPLAN_CU(c, cudaMemPoolCreate(&rt.f32_pool, &props));
    // Keep what was freed (a scratch arena that grows to the largest op's
    // copies) rather than handing it back to the driver at every synchronisation.
    uint64_t keep = UINT64_MAX;
    DLPLAN_CU(c, cudaMemPoolSetAttribute(rt.f32_pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }
  return rt.f32_pool;
}

void widen_into(Runtime& rt, const OpContext& c, const Tensor& h, const Tensor& f32) {
  half_widen(f32.f(), h.data(), store_of(h.dtype), h.numel(), rt.stream);
  DLPLAN_LAUNCHED(&c);
}

// The fp32 copies of one op call's 16-bit tensors.
class Views {
 public:
  Views(Runtime& rt, const OpContext& c) : rt_(rt), c_(c) {}

  // The tensor to read: itself unless 16-bit, then its widened copy.
  Tensor read(const Tensor& t) {
    if (!t.defined() || !is_half(t.dtype)) return t;
    Tensor w = scratch_f32(rt_, t.shape, &c_);
    widen_into(rt_, c_, t, w);
    return w;
  }
  // A tensor the op writes (load = false) or accumulates into (load = true):
  // one copy per storage, so that two gradients of the same tensor (x + x)
  // accumulate into one; rounded back by store().
  Tensor write(const Tensor& t, bool load) {
    if (!t.defined() || !is_half(t.dtype)) return t;
    auto it = written_.find(t.data());
    if (it != written_.end()) return it->second.twin;
    Tensor w = scratch_f32(rt_, t.shape, &c_);
    if (load) widen_into(rt_, c_, t, w);
    written_.emplace(t.data(), Written{t, w});
    return w;
  }
  void store() {
    for (auto& [p, w] : written_) {
      half_narrow(w.target.data(), w.twin.f(), store_of(w.target.dtype), w.target.numel(), rt_.stream);
      DLPLAN_LAUNCHED(&c_);
    }
  }

 private:
  struct Written {
    Tensor target, twin;
  };
  Runtime& rt_;
  const OpContext& c_;
  std::map<const void*, Written> written_;
};

}  // namespace

Tensor scratch_f32(Runtime& rt, const Shape& shape, const OpContext* c) {
  Tensor t;
  t.shape = shape;
  t.dtype = DType::f32;
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(t.numel(), 1)) * sizeof(float);
  void* p = nullptr;
  DLPLAN_CU(c, cudaMallocFromPoolAsync(&p, bytes, f32_pool(rt, c), rt.stream));
  cudaStream_t stream = rt.stream;
  t.storage = std::shared_ptr<Storage>(new Storage, [stream](Storage* s) {
    if (s->data) (void)cudaFreeAsync(s->data, stream);  // best effort: a deleter must not throw
    s->data = nullptr;  // ~Storage frees nothing more (no owner: it would std::free)
    delete s;
  });
  t.storage->data = p;
  t.storage->bytes = static_cast<int64_t>(bytes);
  t.storage->what = "fp32 working copy";
  return t;
}

void run_in_fp32(Runtime& rt, OpContext& c, bool backward, void (*op)(Runtime&, OpContext&)) {
  if (!is_half(c.act_dtype)) return op(rt, c);
  Views v(rt, c);
  OpContext w = c;
  for (Tensor& t : w.in) t = v.read(t);
  for (Tensor& t : w.params) t = v.read(t);
  if (!backward) {
    w.out = v.write(c.out, /*load=*/false);
    op(rt, w);
    v.store();
    // The op's own saved tensors, as it allocated them (16-bit where declared
    // Elem::compute): never the working copies, which die with `v`.
    c.saved = std::move(w.saved);
    return;
  }
  w.out = v.read(c.out);  // relu, tanh, sigmoid read their output
  for (Tensor& t : w.saved) t = v.read(t);
  w.dout = v.read(c.dout);
  for (Tensor& t : w.din) t = v.write(t, /*load=*/true);
  for (Tensor& t : w.dparams) t = v.write(t, /*load=*/true);
  op(rt, w);
  v.store();
}

Fp32Buffer::Fp32Buffer(Runtime& rt, const OpContext& c, const Tensor& t, bool load) : rt_(&rt), c_(&c), target_(t) {
  if (!t.defined() || !is_half(t.dtype)) return;
  twin_ = scratch_f32(rt, t.shape, &c);
  if (load) widen_into(rt, c, t, twin_);
}

float* Fp32Buffer::data() const {
  if (!target_.defined()) return nullptr;
  return twin_.defined() ? twin_.f() : target_.f();
}

void Fp32Buffer::store() {
  if (!twin_.defined()) return;
  half_round_store(target_.data(), twin_.f(), store_of(target_.dtype), target_.numel(), rt_->stream);
  DLPLAN_LAUNCHED(c_);
}

}  // namespace dlplan::exec::cuda
