#include "dlplan/exec/tensor.hpp"

#include "dlplan/exec/bf16.hpp"

#include "dlplan/error.hpp"

#include <fmt/format.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

namespace dlplan::exec {

int64_t dtype_size(DType d) { return is_half(d) ? 2 : 4; }

void Tensor::wrong_dtype(const char* wanted) const {
  throw Error(fmt::format("internal error: {} access to the {} tensor '{}'", wanted, to_string(dtype),
                          storage ? storage->what : std::string("(empty)")));
}

void bf16_to_f32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t e = 0; e < n; ++e) dst[e] = from_bf16(src[e]);
}

void f32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t e = 0; e < n; ++e) dst[e] = to_bf16(src[e]);
}

// IEEE binary16 by bit manipulation (no compiler's _Float16: clang on x86-64
// lacks it). float = 1 + 8 + 23 bits, exponent bias 127; half = 1 + 5 + 10,
// bias 15.
uint16_t to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN stays (quiet) NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to infinity (and inf)
  if (a >= 0x38800000u) {
    // A normal half (>= 2^-14): rebias the exponent (127 - 15 = 112) and drop
    // 13 mantissa bits, rounding to nearest even (a carry moves the exponent).
    uint32_t h = a - (112u << 23);
    h += 0x0fffu + ((h >> 13) & 1u);
    return static_cast<uint16_t>(sign | (h >> 13));
  }
  if (a <= 0x33000000u) return sign;  // <= 2^-25: zero (2^-25 is the tie, and zero is even)
  // A subnormal half: k units of 2^-24, k = mantissa (with its leading 1)
  // x 2^(e - 150 + 24) = mantissa >> (126 - e), rounded to nearest even.
  const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
  uint32_t k = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1), tie = 1u << (shift - 1);
  if (rest > tie || (rest == tie && (k & 1u))) ++k;  // k = 0x400 is the smallest normal: still right
  return static_cast<uint16_t>(sign | k);
}

float from_f16(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
  if (e == 0x1f) {
    x = sign | 0x7f800000u | (m << 13);  // inf, NaN
  } else if (e != 0) {
    x = sign | ((e + 112) << 23) | (m << 13);
  } else if (m == 0) {
    x = sign;
  } else {  // subnormal: m x 2^-24, normalised
    e = 113;
    while ((m & 0x400u) == 0) {
      m <<= 1;
      --e;
    }
    x = sign | (e << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}

void half_to_f32(DType d, const uint16_t* src, float* dst, int64_t n) {
  if (d == DType::f16)
    for (int64_t e = 0; e < n; ++e) dst[e] = from_f16(src[e]);
  else
    bf16_to_f32(src, dst, n);
}

void f32_to_half(DType d, const float* src, uint16_t* dst, int64_t n) {
  if (d == DType::f16)
    for (int64_t e = 0; e < n; ++e) dst[e] = to_f16(src[e]);
  else
    f32_to_bf16(src, dst, n);
}

Storage::~Storage() {
  if (owner) owner->on_free(*this);  // gives the bytes back to the resource
  else std::free(data);
}

namespace {

// Host memory: 64-byte aligned (BLAS), requests counted as asked.
class HostMemory final : public MemoryResource {
 public:
  void* allocate(int64_t bytes, int64_t& granted) override {
    granted = bytes;
    const size_t rounded = static_cast<size_t>((std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
    return std::aligned_alloc(64, rounded);
  }
  void release(void* p, int64_t) override { std::free(p); }
  void zero(void* p, int64_t bytes) override { std::memset(p, 0, static_cast<size_t>(bytes)); }
  bool host_visible() const override { return true; }
};

// A training step frees and re-allocates the same large tensors every step.
// By default glibc serves each one over 128 KiB - 32 MiB with a fresh mmap and
// unmaps it on free, so every step page-faults its activations in again (5-15 %
// of a small GPT's step on the CPU engine). Serving them from the heap and
// never trimming it keeps the pages between steps; the process's high-water
// mark is unchanged, as it is reached in the first step.
void keep_freed_host_pages() {
#if defined(__GLIBC__)
  static const bool done = [] {
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
    return true;
  }();
  (void)done;
#endif
}

}  // namespace

std::unique_ptr<MemoryResource> make_host_memory() {
  keep_freed_host_pages();
  return std::make_unique<HostMemory>();
}

Allocator::Allocator(std::unique_ptr<MemoryResource> memory) : memory_(std::move(memory)) {}

Tensor Tensor::slice(int64_t elem_offset, Shape new_shape) const {
  Tensor t = *this;
  t.offset += elem_offset;
  t.shape = std::move(new_shape);
  return t;
}

Tensor Allocator::make(const Shape& shape, DType dtype, int64_t bytes, Category c, std::string what, bool zero) {
  auto s = std::make_shared<Storage>();
  int64_t granted = bytes;
  s->data = memory_->allocate(bytes, granted);
  if (!s->data) throw Error(fmt::format("out of memory allocating {} bytes for {}", bytes, what));
  if (zero) memory_->zero(s->data, std::max<int64_t>(bytes, 1));
  bytes = granted;
  s->bytes = bytes;
  s->category = c;
  s->what = std::move(what);
  {
    std::lock_guard<std::mutex> lock(mu_);
    s->owner = this;
    ledger_.allocate(c, bytes);
  }
  Tensor t;
  t.storage = std::move(s);
  t.shape = shape;
  t.dtype = dtype;
  return t;
}

Tensor Allocator::empty(const Shape& shape, DType dtype, Category c, std::string what) {
  return make(shape, dtype, numel(shape) * dtype_size(dtype), c, std::move(what), false);
}

Tensor Allocator::zeros(const Shape& shape, DType dtype, Category c, std::string what) {
  return make(shape, dtype, numel(shape) * dtype_size(dtype), c, std::move(what), true);
}

Tensor Allocator::bytes_buffer(int64_t bytes, Category c, std::string what) {
  return make({bytes}, DType::i32, bytes, c, std::move(what), true);
}

void Allocator::on_free(const Storage& s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ledger_.release(s.category, s.bytes);
  }
  memory_->release(s.data, s.bytes);
}

CategoryBytes Allocator::current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_.current();
}
CategoryBytes Allocator::at_peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_.at_peak();
}
CategoryBytes Allocator::max_each() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_.max_each();
}
int64_t Allocator::peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_.peak();
}
int64_t Allocator::allocated_total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_.allocated_total();
}

void Allocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  ledger_.reset_peak();
}

static int64_t status_field(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) {
      std::istringstream in(line.substr(std::strlen(key)));
      int64_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
  return 0;
}

int64_t resident_bytes() { return status_field("VmRSS:"); }
int64_t resident_peak_bytes() { return status_field("VmHWM:"); }

}  // namespace dlplan::exec
