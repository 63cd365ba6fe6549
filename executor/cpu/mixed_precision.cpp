// bf16-mixed and fp16-mixed on the CPU, as CPU autocast does it (DESIGN.md):
// the float tensors an op reads and writes are stored in bf16 (f16), its
// arithmetic is fp32. Below, "bf16" stands for either 16-bit type.
//
// run_in_fp32 gives the op fp32 views: each bf16 input, parameter, output,
// saved tensor and output gradient is widened (exactly) into an fp32 copy,
// and the output and the gradients the op accumulates into are rounded back
// once it returns. The copies live outside the accounting, as a GPU's bf16
// kernels keep the widened values in registers: the categories count what is
// stored, in bf16, exactly as the plan does. The op's own saved tensors and
// temporaries are allocated in the storage dtype by the op itself (Elem::compute
// ones in bf16), through Fp32Buffer.
#include "cpu/ops.hpp"

#include "dlplan/exec/bf16.hpp"

#include <cstdlib>
#include <map>

namespace dlplan::exec::cpu {
namespace {

// An fp32 tensor outside any allocator (freed with std::free).
Tensor scratch_f32(const Shape& shape) {
  Tensor t;
  t.storage = std::make_shared<Storage>();
  t.shape = shape;
  t.dtype = DType::f32;
  const size_t bytes = static_cast<size_t>((std::max<int64_t>(t.numel() * 4, 1) + 63) / 64 * 64);
  t.storage->data = std::aligned_alloc(64, bytes);
  if (t.storage->data == nullptr) throw Error("out of host memory widening a bf16 tensor");
  t.storage->bytes = static_cast<int64_t>(bytes);
  t.storage->what = "fp32 view";
  return t;
}

// The fp32 twins of one op call's bf16 tensors.
class Views {
 public:
  // The tensor to read: itself unless bf16, then its widened copy.
  Tensor read(const Tensor& t) {
    if (!t.defined() || !is_half(t.dtype)) return t;
    Tensor w = scratch_f32(t.shape);
    half_to_f32(t.dtype, t.h(), w.f(), t.numel());
    return w;
  }
  // A tensor the op writes (load = false) or accumulates into (load = true):
  // one fp32 twin per storage, so that two gradients of the same tensor (x + x)
  // accumulate into one; rounded back by store().
  Tensor write(const Tensor& t, bool load) {
    if (!t.defined() || !is_half(t.dtype)) return t;
    auto it = written_.find(t.h());
    if (it != written_.end()) return it->second.twin;
    Tensor w = scratch_f32(t.shape);
    if (load) half_to_f32(t.dtype, t.h(), w.f(), t.numel());
    written_.emplace(t.h(), Written{t, w});
    return w;
  }
  void store() {
    for (auto& [p, w] : written_) f32_to_half(w.target.dtype, w.twin.f(), w.target.h(), w.target.numel());
  }

 private:
  struct Written {
    Tensor target, twin;
  };
  std::map<const uint16_t*, Written> written_;
};

}  // namespace

Fp32Buffer::Fp32Buffer(const Tensor& t, bool load) : target_(t) {
  if (!is_half(t.dtype)) return;
  twin_.resize(static_cast<size_t>(t.numel()));
  if (load) half_to_f32(t.dtype, t.h(), twin_.data(), t.numel());
}

float* Fp32Buffer::data() { return is_half(target_.dtype) ? twin_.data() : target_.f(); }

void Fp32Buffer::store() {
  if (!is_half(target_.dtype)) return;
  f32_to_half(target_.dtype, twin_.data(), target_.h(), target_.numel());
  half_to_f32(target_.dtype, target_.h(), twin_.data(), target_.numel());  // from here on the op sees the stored values
}

void Fp32Buffer::round(float* p, int64_t n) const {
  if (!is_half(target_.dtype)) return;
  const DType d = target_.dtype;
  for (int64_t e = 0; e < n; ++e) p[e] = from_half(d, to_half(d, p[e]));
}

void run_in_fp32(OpContext& c, bool backward, const std::function<void(OpContext&)>& op) {
  if (!is_half(c.act_dtype)) return op(c);
  Views v;
  OpContext w = c;
  for (Tensor& t : w.in) t = v.read(t);
  for (Tensor& t : w.params) t = v.read(t);
  if (!backward) {
    w.out = v.write(c.out, /*load=*/false);
    op(w);
    v.store();
    c.saved = std::move(w.saved);
    return;
  }
  w.out = v.read(c.out);  // relu, tanh, sigmoid read their output
  for (Tensor& t : w.saved) t = v.read(t);
  w.dout = v.read(c.dout);
  for (Tensor& t : w.din) t = v.write(t, /*load=*/true);
  for (Tensor& t : w.dparams) t = v.write(t, /*load=*/true);
  op(w);
  v.store();
}

}  // namespace dlplan::exec::cpu
