// Tensors and the allocator with per-category accounting (DESIGN.md, "Memory
// categories"). Every allocation names one category; the allocator keeps the
// current bytes per category, the breakdown at the moment their sum peaks, and
// per-category maxima. A Tensor is a shared view into one allocation: when the
// last view goes, the bytes go back and the accounting follows.
#pragma once

#include "dlplan/ir.hpp"
#include "dlplan/ledger.hpp"
#include "dlplan/step_walk.hpp"

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace dlplan::exec {

class Allocator;

// One allocation. Freed (and un-counted) when the last Tensor referring to it dies.
struct Storage {
  void* data = nullptr;
  int64_t bytes = 0;     // what is counted: the resource's granted size
  Category category = Category::workspace;
  std::string what;
  Allocator* owner = nullptr;
  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();
};

int64_t dtype_size(DType d);

// `n` elements of `dtype` at `data` (host or device memory, as the allocator's
// resource put them): what DeviceOps and the collectives take, so that one
// call serves fp32 and bf16 buffers alike.
struct Span {
  void* data = nullptr;
  int64_t n = 0;
  DType dtype = DType::f32;
  int64_t bytes() const { return n * dtype_size(dtype); }
  Span sub(int64_t offset, int64_t count) const {
    return {static_cast<char*>(data) + offset * dtype_size(dtype), count, dtype};
  }
};
inline Span span_of(float* p, int64_t n) { return {p, n, DType::f32}; }

struct Tensor {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;         // with the batch dimension first where there is one
  DType dtype = DType::f32;

  bool defined() const { return storage != nullptr; }
  int64_t numel() const { return dlplan::numel(shape); }
  int64_t bytes() const { return numel() * dtype_size(dtype); }
  // Typed access; f(), bf() and h() check the dtype (an fp32 loop over a bf16
  // tensor would read garbage), i() and u8() are the raw ids and masks.
  float* f() const {
    if (dtype != DType::f32) wrong_dtype("f32");
    return static_cast<float*>(storage->data) + offset;
  }
  uint16_t* bf() const {
    if (dtype != DType::bf16) wrong_dtype("bf16");
    return static_cast<uint16_t*>(storage->data) + offset;
  }
  // The 16-bit words of a bf16 or f16 tensor (convert with bf16.hpp's *_half).
  uint16_t* h() const {
    if (dtype != DType::bf16 && dtype != DType::f16) wrong_dtype("bf16 or f16");
    return static_cast<uint16_t*>(storage->data) + offset;
  }
  int32_t* i() const { return static_cast<int32_t*>(storage->data) + offset; }
  uint8_t* u8() const { return static_cast<uint8_t*>(storage->data) + offset; }
  void* data() const { return static_cast<char*>(storage->data) + offset * dtype_size(dtype); }
  Span span() const { return {data(), numel(), dtype}; }
  // A view of `count` elements starting `offset` elements in, with a new shape.
  Tensor slice(int64_t elem_offset, Shape new_shape) const;

 private:
  [[noreturn]] void wrong_dtype(const char* wanted) const;
};

// Where an allocator's bytes come from: host memory (the default) or a
// device's (the CUDA caching allocator). `granted` is what the resource really
// reserves for a request (its block size), which is what gets counted.
class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  virtual void* allocate(int64_t bytes, int64_t& granted) = 0;
  virtual void release(void* p, int64_t granted) = 0;
  virtual void zero(void* p, int64_t bytes) = 0;
  virtual bool host_visible() const = 0;   // may the CPU dereference the pointers?
  virtual int64_t reserved_bytes() const { return 0; }  // cached but not in use (shown apart)
  // DESIGN.md's `runtime` bytes: device memory in use outside this resource
  // (CUDA context, library handles, NCCL buffers); 0 on the host.
  virtual int64_t runtime_bytes() const { return 0; }
};

std::unique_ptr<MemoryResource> make_host_memory();

class Allocator {
 public:
  explicit Allocator(std::unique_ptr<MemoryResource> memory = make_host_memory());
  MemoryResource& memory() { return *memory_; }
  const MemoryResource& memory() const { return *memory_; }

  // Uninitialised / zeroed storage of `shape` x dtype, counted in `c`. A
  // uint8 tensor (dropout masks) is DType::i32-free: use bytes() variants.
  Tensor empty(const Shape& shape, DType dtype, Category c, std::string what);
  Tensor zeros(const Shape& shape, DType dtype, Category c, std::string what);
  Tensor bytes_buffer(int64_t bytes, Category c, std::string what);  // raw (masks: 1 byte an element)

  CategoryBytes current() const;
  CategoryBytes at_peak() const;   // categories when their sum peaked
  CategoryBytes max_each() const;  // per-category maxima (label them as such)
  int64_t peak() const;
  int64_t allocated_total() const;  // every byte ever allocated (for tests)
  // Starts a new peak measurement from what is allocated now (DESIGN.md: the
  // set-up's and the first step's transients are not part of the peak).
  void reset_peak();

 private:
  friend struct Storage;
  void on_free(const Storage& s);
  Tensor make(const Shape& shape, DType dtype, int64_t bytes, Category c, std::string what, bool zero);

  std::unique_ptr<MemoryResource> memory_;
  mutable std::mutex mu_;
  MemoryLedger ledger_;  // the same counting as the planner's walk (ledger.hpp), over granted bytes
};

// Process resident memory (VmRSS) and its high-water mark (VmHWM), bytes.
int64_t resident_bytes();
int64_t resident_peak_bytes();

}  // namespace dlplan::exec
