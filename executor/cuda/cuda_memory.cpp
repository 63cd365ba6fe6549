// The caching device memory resource: requests are rounded to 512 B; blocks
// up to 1 MiB are carved from 2 MiB segments (the small pool), blocks below
// 10 MiB from 20 MiB segments and larger ones from a segment of their own,
// rounded to 2 MiB (the large pool) — REFERENCES.md, PyTorch's
// CUDACachingAllocator. Free blocks sit in per-pool sets ordered by (size,
// address); a request takes the smallest free block that fits (best fit),
// splitting off the rest when cuda_should_split() says so; a released block
// merges with its free neighbours in its segment. Segments are only returned
// to CUDA by empty_cache(), on a failed cudaMalloc (then retried once) and
// at destruction.
//
// Stream semantics: blocks are handed out with no stream bookkeeping, which
// is correct while every kernel runs on the one compute stream, and while a
// buffer a collective uses (on the communication stream) is released only
// after the compute stream waited for that collective (DESIGN.md: a
// communication buffer is freed where compute waits for it).
#include "cuda_memory.hpp"

#include "device.hpp"

#include <cuda_runtime_api.h>

#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

namespace dlplan::exec {
namespace {

struct Block {
  int64_t size = 0;
  char* ptr = nullptr;
  bool small = false;      // the pool of its segment
  bool allocated = false;
  Block* prev = nullptr;   // neighbours in the same segment
  Block* next = nullptr;
};

struct BySizeThenAddress {
  bool operator()(const Block* a, const Block* b) const {
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
  }
};
using Pool = std::set<Block*, BySizeThenAddress>;

class CachingCudaMemory final : public CudaMemory {
 public:
  CachingCudaMemory(int device, cudaStream_t stream) : device_(device), stream_(stream) {}

  ~CachingCudaMemory() override {
    std::lock_guard<std::mutex> lock(mu_);
    // Blocks still in use die with their segments (the Allocator outlived by a
    // Tensor is a caller's bug; at exit the driver may already be unloading).
    std::vector<Block*> all(small_.begin(), small_.end());
    all.insert(all.end(), large_.begin(), large_.end());
    for (auto& [p, b] : active_) all.push_back(b);
    int previous = -1;
    (void)cudaGetDevice(&previous);
    (void)cudaSetDevice(device_);
    for (Block* b : all)
      if (b->prev == nullptr) (void)cudaFree(b->ptr);  // the segment's first block holds its base
    for (Block* b : all) delete b;
    (void)cudaGetLastError();
    if (previous >= 0) (void)cudaSetDevice(previous);
  }

  void* allocate(int64_t bytes, int64_t& granted) override {
    const int64_t rounded = cuda_round_size(bytes);
    const bool small = cuda_is_small(rounded);
    std::lock_guard<std::mutex> lock(mu_);
    Pool& pool = small ? small_ : large_;
    Block key;
    key.size = rounded;
    Block* b = nullptr;
    if (auto it = pool.lower_bound(&key); it != pool.end()) {
      b = *it;
      pool.erase(it);
    } else {
      b = new_segment(cuda_segment_size(rounded), small);
      if (b == nullptr) return nullptr;
    }
    if (cuda_should_split(b->size, rounded)) {
      auto* rest = new Block;
      rest->size = b->size - rounded;
      rest->ptr = b->ptr + rounded;
      rest->small = b->small;
      rest->prev = b;
      rest->next = b->next;
      if (b->next) b->next->prev = rest;
      b->next = rest;
      b->size = rounded;
      pool_of(rest).insert(rest);
    }
    b->allocated = true;
    active_[b->ptr] = b;
    in_use_ += b->size;
    granted = b->size;
    return b->ptr;
  }

  void release(void* p, int64_t) override {
    if (p == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = active_.find(p);
    if (it == active_.end()) throw Error("CUDA caching allocator: release of a pointer it did not allocate");
    Block* b = it->second;
    active_.erase(it);
    b->allocated = false;
    in_use_ -= b->size;
    if (Block* prev = b->prev; prev != nullptr && !prev->allocated) {
      pool_of(prev).erase(prev);
      prev->size += b->size;
      prev->next = b->next;
      if (b->next) b->next->prev = prev;
      delete b;
      b = prev;
    }
    if (Block* next = b->next; next != nullptr && !next->allocated) {
      pool_of(next).erase(next);
      b->size += next->size;
      b->next = next->next;
      if (next->next) next->next->prev = b;
      delete next;
    }
    pool_of(b).insert(b);
  }

  void zero(void* p, int64_t bytes) override {
    if (bytes <= 0) return;
    cudart::DeviceGuard guard(device_);
    // Enqueued on the compute stream, so every consumer (a kernel on that
    // stream, or a collective ordered after it by an event) comes after it;
    // the host does not wait.
    cudart::check(cudaMemsetAsync(p, 0, static_cast<size_t>(bytes), stream_), "cudaMemsetAsync");
  }

  bool host_visible() const override { return false; }

  int64_t reserved_bytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return segment_bytes_ - in_use_;
  }

  CudaMemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    CudaMemoryStats s;
    s.segment_bytes = segment_bytes_;
    s.in_use_bytes = in_use_;
    s.cached_bytes = segment_bytes_ - in_use_;
    s.segments = segments_;
    s.cuda_mallocs = mallocs_;
    s.cuda_frees = frees_;
    return s;
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    free_cached_segments();
  }

  int device() const override { return device_; }

  // Device memory in use (cudaMemGetInfo: total - free) minus this
  // allocator's segments (in use + cached): the context, cuBLAS, NCCL.
  int64_t runtime_bytes() const override {
    const cudart::DeviceGuard guard(device_);
    size_t free_b = 0, total_b = 0;
    cudart::check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    return static_cast<int64_t>(total_b) - static_cast<int64_t>(free_b) - stats().segment_bytes;
  }

 private:
  Pool& pool_of(const Block* b) { return b->small ? small_ : large_; }

  // A fresh segment as one free block (not in any pool); null when CUDA has
  // no memory left even after the cache is emptied.
  Block* new_segment(int64_t size, bool small) {
    cudart::DeviceGuard guard(device_);
    void* p = nullptr;
    cudaError_t rc = cudaMalloc(&p, static_cast<size_t>(size));
    if (rc == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      free_cached_segments();
      rc = cudaMalloc(&p, static_cast<size_t>(size));
    }
    // Out of memory, or a size no device has (CUDA answers an absurd request
    // with cudaErrorInvalidValue on some drivers): null, and the Allocator
    // reports it naming the tensor. Any other error is a device fault.
    if (rc == cudaErrorMemoryAllocation || rc == cudaErrorInvalidValue) {
      (void)cudaGetLastError();
      return nullptr;
    }
    cudart::check(rc, "cudaMalloc");
    ++mallocs_;
    ++segments_;
    segment_bytes_ += size;
    auto* b = new Block;
    b->size = size;
    b->ptr = static_cast<char*>(p);
    b->small = small;
    return b;
  }

  // cudaFree of every segment that is one free block.
  void free_cached_segments() {
    cudart::DeviceGuard guard(device_);
    for (Pool* pool : {&small_, &large_}) {
      std::vector<Block*> whole;
      for (Block* b : *pool)
        if (b->prev == nullptr && b->next == nullptr) whole.push_back(b);
      for (Block* b : whole) {
        pool->erase(b);
        cudart::check(cudaFree(b->ptr), "cudaFree");
        ++frees_;
        --segments_;
        segment_bytes_ -= b->size;
        delete b;
      }
    }
  }

  const int device_;
  const cudaStream_t stream_;
  mutable std::mutex mu_;
  Pool small_, large_;
  std::unordered_map<void*, Block*> active_;
  int64_t segment_bytes_ = 0, in_use_ = 0, segments_ = 0, mallocs_ = 0, frees_ = 0;
};

}  // namespace

std::unique_ptr<CudaMemory> make_cuda_memory(int device, void* stream) {
  std::string why;
  const int n = cuda_device_count(&why);
  if (device < 0 || device >= n)
    throw Error("CUDA caching allocator: no device " + std::to_string(device) + " (" +
                (n == 0 ? why : std::to_string(n) + " visible") + ")");
  return std::make_unique<CachingCudaMemory>(device, static_cast<cudaStream_t>(stream));
}

}  // namespace dlplan::exec
