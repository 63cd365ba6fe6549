// The CUDA runtime pieces (dlplan/exec/cuda_runtime.hpp): the caching
// allocator's size classes against REFERENCES.md (PyTorch's
// CUDACachingAllocator: 512 B rounding; <= 1 MiB in 2 MiB segments; < 10 MiB
// in 20 MiB segments; larger rounded to 2 MiB) — always, they are host logic —
// and, on a machine with a GPU, the allocator itself (reuse, reserved vs in
// use, the Allocator counting granted sizes), the `runtime` measurement and
// the GPU communicators on one rank. Without a GPU (or a CUDA build) the
// device tests skip, naming the reason.
#include "dlplan/error.hpp"
#include "dlplan/exec/cuda_runtime.hpp"
#include "dlplan/exec/tensor.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

using namespace dlplan;
using namespace dlplan::exec;

namespace {

constexpr int64_t KiB = 1024, MiB = 1024 * 1024;

// Sets an environment variable for a scope, restoring it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_.c_str(), old_->c_str(), 1);
    else unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace

// ---- host logic: always -----------------------------------------------------------

TEST(CudaSizeClasses, RequestsRoundTo512Bytes) {
  EXPECT_EQ(cuda_round_size(0), 512);
  EXPECT_EQ(cuda_round_size(1), 512);
  EXPECT_EQ(cuda_round_size(512), 512);
  EXPECT_EQ(cuda_round_size(513), 1024);
  EXPECT_EQ(cuda_round_size(1000), 1024);
  EXPECT_EQ(cuda_round_size(10 * MiB + 1), 10 * MiB + 512);
  // Control: a request is not counted as asked.
  EXPECT_NE(cuda_round_size(1000), 1000);
}

TEST(CudaSizeClasses, SegmentsFollowPyTorch) {
  // Up to 1 MiB: the small pool, packed in 2 MiB segments.
  EXPECT_TRUE(cuda_is_small(1 * MiB));
  EXPECT_FALSE(cuda_is_small(1 * MiB + 512));
  EXPECT_EQ(cuda_segment_size(512), 2 * MiB);
  EXPECT_EQ(cuda_segment_size(1 * MiB), 2 * MiB);
  // Above 1 MiB and below 10 MiB: 20 MiB segments.
  EXPECT_EQ(cuda_segment_size(1 * MiB + 512), 20 * MiB);
  EXPECT_EQ(cuda_segment_size(10 * MiB - 512), 20 * MiB);
  // From 10 MiB: a segment of its own, rounded up to 2 MiB.
  EXPECT_EQ(cuda_segment_size(10 * MiB), 10 * MiB);
  EXPECT_EQ(cuda_segment_size(10 * MiB + 512), 12 * MiB);
  EXPECT_EQ(cuda_segment_size(21 * MiB), 22 * MiB);
  EXPECT_EQ(cuda_segment_size(22 * MiB), 22 * MiB);
}

TEST(CudaSizeClasses, SplitRules) {
  // Small pool: split when at least 512 B remain.
  EXPECT_TRUE(cuda_should_split(2 * MiB, 1 * KiB));
  EXPECT_TRUE(cuda_should_split(1536, 1024));
  EXPECT_FALSE(cuda_should_split(1024, 1024));
  // Large pool: split only when more than 1 MiB remains.
  EXPECT_TRUE(cuda_should_split(20 * MiB, 5 * MiB));
  EXPECT_FALSE(cuda_should_split(12 * MiB, 11 * MiB));        // exactly 1 MiB left
  EXPECT_TRUE(cuda_should_split(12 * MiB, 11 * MiB - 512));   // 1 MiB + 512 B left
  // What a fresh segment grants: the rounded size, or the whole segment when
  // the rest is too small to keep.
  EXPECT_EQ(cuda_granted_fresh(1000), 1024);
  EXPECT_EQ(cuda_granted_fresh(5 * MiB), 5 * MiB);
  EXPECT_EQ(cuda_granted_fresh(10 * MiB + 1), 10 * MiB + 512);  // 12 MiB segment, 2 MiB - 512 B kept
  EXPECT_EQ(cuda_granted_fresh(11 * MiB + 1), 12 * MiB);        // under 1 MiB left: granted whole
  EXPECT_EQ(cuda_granted_fresh(13 * MiB + 1), 14 * MiB);
  EXPECT_EQ(cuda_granted_fresh(40 * MiB), 40 * MiB);
}

TEST(CudaRuntimeConfig, CommTimeoutIsOneSettingForMpiAndNccl) {
  EXPECT_DOUBLE_EQ(comm_timeout_seconds(), kDefaultCommTimeoutSeconds);
  set_comm_timeout_seconds(2.5);
  EXPECT_DOUBLE_EQ(comm_timeout_seconds(), 2.5);
  for (double bad : {0.0, -3.0}) EXPECT_THROW(set_comm_timeout_seconds(bad), Error) << bad;
  set_comm_timeout_seconds(kDefaultCommTimeoutSeconds);
}

TEST(CudaRuntimeConfig, CommKindAndLocalRank) {
  EXPECT_EQ(parse_gpu_comm_kind("nccl"), GpuCommKind::nccl);
  EXPECT_EQ(parse_gpu_comm_kind("mpi"), GpuCommKind::mpi);
  EXPECT_THROW(parse_gpu_comm_kind("gloo"), Error);
  ScopedEnv a("OMPI_COMM_WORLD_LOCAL_RANK", nullptr), b("SLURM_LOCALID", nullptr), c("MPI_LOCALRANKID", nullptr),
      d("PMI_LOCAL_RANK", nullptr);
  EXPECT_EQ(local_rank_from_env(), -1);
  {
    ScopedEnv s("SLURM_LOCALID", "3");
    EXPECT_EQ(local_rank_from_env(), 3);
    ScopedEnv o("OMPI_COMM_WORLD_LOCAL_RANK", "1");  // OpenMPI's wins
    EXPECT_EQ(local_rank_from_env(), 1);
  }
}

// ---- on a GPU -------------------------------------------------------------------------

#if defined(DLPLAN_HAVE_CUDA)

namespace {
// The skip reason, or "" with a device made current.
std::string no_gpu() {
  std::string why;
  if (cuda_device_count(&why) == 0) return why;
  select_cuda_device(0);
  return {};
}
}  // namespace

#define SKIP_WITHOUT_GPU()                                        \
  do {                                                            \
    if (const std::string why = no_gpu(); !why.empty()) GTEST_SKIP() << "no GPU: " << why; \
  } while (0)

TEST(CudaMemory, SmallRequestsArePackedInOneSegment) {
  SKIP_WITHOUT_GPU();
  auto mem = make_cuda_memory(0);
  int64_t g1 = 0, g2 = 0;
  void* a = mem->allocate(1000, g1);
  void* b = mem->allocate(3000, g2);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(g1, 1024);
  EXPECT_EQ(g2, 3072);
  EXPECT_EQ(static_cast<char*>(b), static_cast<char*>(a) + 1024);  // carved from the same segment
  auto s = mem->stats();
  EXPECT_EQ(s.segments, 1);
  EXPECT_EQ(s.cuda_mallocs, 1);
  EXPECT_EQ(s.segment_bytes, 2 * MiB);
  EXPECT_EQ(s.in_use_bytes, 1024 + 3072);
  EXPECT_EQ(mem->reserved_bytes(), 2 * MiB - 4096);
  EXPECT_FALSE(mem->host_visible());
  mem->release(a, g1);
  mem->release(b, g2);
}

TEST(CudaMemory, FreedBlocksAreReusedAndMerged) {
  SKIP_WITHOUT_GPU();
  auto mem = make_cuda_memory(0);
  int64_t g = 0, g2 = 0, g3 = 0;
  void* a = mem->allocate(700, g);
  void* b = mem->allocate(5000, g2);
  mem->release(a, g);
  void* c = mem->allocate(1024, g3);  // the freed 1 KiB block, best fit
  EXPECT_EQ(c, a);
  EXPECT_EQ(mem->stats().cuda_mallocs, 1);
  mem->release(c, g3);
  mem->release(b, g2);
  // Everything merged back: the whole segment is one free block again.
  auto s = mem->stats();
  EXPECT_EQ(s.in_use_bytes, 0);
  EXPECT_EQ(s.cached_bytes, 2 * MiB);
  EXPECT_EQ(mem->reserved_bytes(), 2 * MiB);
  void* whole = mem->allocate(1 * MiB, g);
  EXPECT_EQ(whole, a);  // the merged block, from its start
  EXPECT_EQ(mem->stats().cuda_mallocs, 1);
  mem->release(whole, g);
  mem->empty_cache();
  s = mem->stats();
  EXPECT_EQ(s.segments, 0);
  EXPECT_EQ(s.segment_bytes, 0);
  EXPECT_EQ(s.cuda_frees, 1);
}

TEST(CudaMemory, LargeClasses) {
  SKIP_WITHOUT_GPU();
  auto mem = make_cuda_memory(0);
  int64_t g1 = 0, g2 = 0, g3 = 0;
  void* a = mem->allocate(5 * MiB, g1);  // a 20 MiB segment
  EXPECT_EQ(g1, 5 * MiB);
  EXPECT_EQ(mem->stats().segment_bytes, 20 * MiB);
  void* b = mem->allocate(3 * MiB + 100, g2);  // the same segment's rest
  EXPECT_EQ(g2, 3 * MiB + 512);
  EXPECT_EQ(mem->stats().segments, 1);
  // Larger than the 12 MiB - 512 B left: its own 14 MiB segment, granted
  // whole (less than 1 MiB would remain).
  void* c = mem->allocate(13 * MiB + 1, g3);
  EXPECT_EQ(g3, cuda_granted_fresh(13 * MiB + 1));
  EXPECT_EQ(g3, 14 * MiB);
  auto s = mem->stats();
  EXPECT_EQ(s.segments, 2);
  EXPECT_EQ(s.segment_bytes, 34 * MiB);
  EXPECT_EQ(s.in_use_bytes, g1 + g2 + g3);
  EXPECT_EQ(mem->reserved_bytes(), 34 * MiB - (g1 + g2 + g3));
  // A small request never comes from the large pool.
  int64_t g4 = 0;
  void* d = mem->allocate(100, g4);
  EXPECT_EQ(mem->stats().segments, 3);
  for (auto [p, g] : {std::pair{a, g1}, {b, g2}, {c, g3}, {d, g4}}) mem->release(p, g);
  EXPECT_EQ(mem->stats().in_use_bytes, 0);
}

TEST(CudaMemory, OutOfMemoryIsNullThenAnError) {
  SKIP_WITHOUT_GPU();
  auto mem = make_cuda_memory(0);
  int64_t g = 0;
  // 1 PiB: CUDA answers cudaErrorMemoryAllocation or cudaErrorInvalidValue
  // depending on the driver; the resource returns null for both.
  EXPECT_EQ(mem->allocate(int64_t{1} << 50, g), nullptr);
  Allocator alloc(make_cuda_memory(0));
  EXPECT_THROW(alloc.empty({int64_t{1} << 48}, DType::f32, Category::activations, "huge"), Error);
  // Still usable after the failure.
  void* p = mem->allocate(1000, g);
  EXPECT_NE(p, nullptr);
  mem->release(p, g);
}

TEST(CudaMemory, AllocatorCountsGrantedSizes) {
  SKIP_WITHOUT_GPU();
  Allocator alloc(make_cuda_memory(0));
  {
    Tensor w = alloc.empty({250}, DType::f32, Category::params, "w");          // 1000 B
    Tensor z = alloc.zeros({1000}, DType::f32, Category::grads, "g");          // 4000 B
    Tensor big = alloc.empty({3 * 1024 * 1024}, DType::f32, Category::optimizer, "m");  // 12 MiB
    auto cur = alloc.current();
    EXPECT_EQ(cur[static_cast<size_t>(Category::params)], 1024);
    EXPECT_EQ(cur[static_cast<size_t>(Category::grads)], 4096);
    EXPECT_EQ(cur[static_cast<size_t>(Category::optimizer)], 12 * MiB);
    EXPECT_EQ(alloc.peak(), 1024 + 4096 + 12 * MiB);
    std::vector<float> host(1000, 7.0f);
    cuda_copy(host.data(), z.f(), 4000);
    int nonzero = 0;
    for (float v : host) nonzero += v != 0.0f;
    EXPECT_EQ(nonzero, 0) << "zeros() left non-zero values";
  }
  EXPECT_EQ(total(alloc.current()), 0);
  EXPECT_GT(alloc.memory().reserved_bytes(), 0);  // cached, shown apart
}

TEST(CudaDevice, SelectionWrapsAndRuntimeIsMeasured) {
  SKIP_WITHOUT_GPU();
  const int n = cuda_device_count();
  EXPECT_EQ(select_cuda_device(n), 0);  // local rank n wraps to device 0
  Allocator alloc(make_cuda_memory(0));
  Tensor t = alloc.empty({1 << 20}, DType::f32, Category::params, "p");
  const int64_t runtime = measure_runtime_bytes(alloc);
  const auto info = cuda_device_info();
  std::printf("[ info ] %s: %.1f GiB, runtime %.1f MiB (context and libraries)\n", info.name.c_str(),
              static_cast<double>(info.total_bytes) / (1 << 30), static_cast<double>(runtime) / MiB);
  EXPECT_GE(runtime, 0);
  EXPECT_LT(runtime, info.total_bytes);
  // The allocator's own segment is not runtime: holding 64 MiB more changes it little.
  Tensor u = alloc.empty({16 << 20}, DType::f32, Category::params, "q");
  EXPECT_LT(std::llabs(measure_runtime_bytes(alloc) - runtime), 8 * MiB);
}

namespace {
// One-rank collectives: results equal the input; the calls run end to end.
void one_rank_collectives(GpuCommunicator& c) {
  auto mem = make_cuda_memory(c.device());
  const int64_t n = 4096;
  int64_t granted = 0;
  auto* d = static_cast<float*>(mem->allocate(n * 4, granted));
  std::vector<float> h(n), back(n);
  for (int64_t i = 0; i < n; ++i) h[static_cast<size_t>(i)] = static_cast<float>(i % 97);
  cuda_copy(d, h.data(), n * 4);
  c.all_reduce(d, n)->wait();
  wait_host(c.reduce_scatter(d, n));
  c.all_gather_many({{d, n / 2}, {d + n / 2, n / 2}})->wait();
  wait_host(c.broadcast(d, n, 0));
  const int g = c.make_groups(1);
  EXPECT_EQ(c.group_size(g), 1);
  wait_host(c.all_reduce(d, n, g));
  c.synchronize();
  cuda_copy(back.data(), d, n * 4);
  EXPECT_EQ(back, h);
  EXPECT_THROW(c.reduce_scatter(d, n, 7), Error);  // no such group
  mem->release(d, granted);
}
}  // namespace

TEST(GpuCommunicator, StagedOnOneRank) {
  SKIP_WITHOUT_GPU();
  auto c = make_gpu_communicator(GpuCommKind::mpi, make_single_communicator());
  EXPECT_EQ(c->size(), 1);
  one_rank_collectives(*c);
}

TEST(GpuCommunicator, NcclOnOneRank) {
  SKIP_WITHOUT_GPU();
#if defined(DLPLAN_HAVE_NCCL)
  auto c = make_gpu_communicator(GpuCommKind::nccl, make_single_communicator());
  EXPECT_EQ(c->name(), "nccl");
  one_rank_collectives(*c);
  EXPECT_GT(c->busy_seconds(), 0.0);
#else
  EXPECT_THROW(make_gpu_communicator(GpuCommKind::nccl, make_single_communicator()), Error);
#endif
}

#else

TEST(CudaMemory, NeedsACudaBuild) { GTEST_SKIP() << "built without CUDA (DLPLAN_HAVE_CUDA unset)"; }

#endif  // DLPLAN_HAVE_CUDA
