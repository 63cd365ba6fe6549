// The size classes of PyTorch's CUDA caching allocator (c10/cuda/
// CUDACachingAllocator.cpp: kMinBlockSize, kSmallSize, kSmallBuffer,
// kMinLargeAlloc, kLargeBuffer, kRoundLarge, and its should_split rule), which
// dlplan's own caching allocator (executor/cuda/cuda_memory.cpp) follows and
// the planner predicts with: a GPU allocation counts the block it is granted,
// not the bytes asked for. Pure arithmetic; no CUDA here.
#pragma once

#include <cstdint>

namespace dlplan {

inline constexpr int64_t kCudaMinBlock = 512;              // every request rounds to 512 B
inline constexpr int64_t kCudaSmallSize = 1 << 20;          // blocks <= 1 MiB: the small pool
inline constexpr int64_t kCudaSmallSegment = 2 << 20;       // ... carved from 2 MiB segments
inline constexpr int64_t kCudaMinLargeAlloc = 10 << 20;     // blocks < 10 MiB ...
inline constexpr int64_t kCudaLargeSegment = 20 << 20;      // ... from 20 MiB segments
inline constexpr int64_t kCudaRoundLarge = 2 << 20;         // larger: one segment, rounded to 2 MiB

// The block size a request of `bytes` is rounded to (0 counts as 1 byte).
constexpr int64_t cuda_round_size(int64_t bytes) {
  const int64_t b = bytes < 1 ? 1 : bytes;
  return (b + kCudaMinBlock - 1) / kCudaMinBlock * kCudaMinBlock;
}
// True when a (rounded) block belongs to the small pool.
constexpr bool cuda_is_small(int64_t rounded) { return rounded <= kCudaSmallSize; }
// The size of the segment cudaMalloc'd when no cached block fits `rounded`.
constexpr int64_t cuda_segment_size(int64_t rounded) {
  if (rounded <= kCudaSmallSize) return kCudaSmallSegment;
  if (rounded < kCudaMinLargeAlloc) return kCudaLargeSegment;
  return (rounded + kCudaRoundLarge - 1) / kCudaRoundLarge * kCudaRoundLarge;
}
// Whether a free block of `block` bytes is split to serve `rounded` bytes (the
// rest goes back to the pool): in the small pool when at least 512 B remain,
// in the large pool when more than 1 MiB remains. Unsplit, the whole block is
// granted (and counted).
constexpr bool cuda_should_split(int64_t block, int64_t rounded) {
  const int64_t rest = block - rounded;
  return cuda_is_small(rounded) ? rest >= kCudaMinBlock : rest > kCudaSmallSize;
}
// What a request is granted when it is served from a fresh segment.
constexpr int64_t cuda_granted_fresh(int64_t bytes) {
  const int64_t r = cuda_round_size(bytes);
  const int64_t seg = cuda_segment_size(r);
  return cuda_should_split(seg, r) ? r : seg;
}


}  // namespace dlplan
