// Tensors and the allocator with per-category accounting (DESIGN.md, "Memory
// categories"). Every allocation names one category; the allocator keeps the
// current bytes per category, the breakdown at the moment their sum peaks, and
// per-category maxima. A Tensor is a shared view into one allocation: when the
// last view goes, the bytes go back and the accounting follows.
#pragma once

#include "dlplan/ir.hpp"
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

struct Tensor {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;         // with the batch dimension first where there is one
  DType dtype = DType::f32;

  bool defined() const { return storage != nullptr; }
  int64_t numel() const { return dlplan::numel(shape); }
  int64_t bytes() const { return numel() * dtype_size(dtype); }
  float* f() const { return static_cast<float*>(storage->data) + offset; }
  int32_t* i() const { return static_cast<int32_t*>(storage->data) + offset; }
  uint8_t* u8() const { return static_cast<uint8_t*>(storage->data) + offset; }
  // A view of `count` elements starting `offset` elements in, with a new shape.
  Tensor slice(int64_t elem_offset, Shape new_shape) const;
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
};

std::unique_ptr<MemoryResource> make_host_memory();

class Allocator {
 public:
  explicit Allocator(std::unique_ptr<MemoryResource> memory = make_host_memory());
  MemoryResource& memory() { return *memory_; }

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
  CategoryBytes cur_{}, at_peak_{}, max_each_{};
  int64_t peak_ = 0, total_ = 0;
};

// Process resident memory (VmRSS) and its high-water mark (VmHWM), bytes.
int64_t resident_bytes();
int64_t resident_peak_bytes();

}  // namespace dlplan::exec
