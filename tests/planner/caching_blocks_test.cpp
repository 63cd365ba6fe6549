// A GPU allocation counts the block PyTorch's caching allocator grants
// (caching_allocator.hpp), worked out by hand from CUDACachingAllocator.cpp's
// constants: requests round to 512 B; up to 1 MiB they are carved from 2 MiB
// segments, below 10 MiB from 20 MiB segments, both split; from 10 MiB a
// request gets its own segment rounded to 2 MiB, split only when more than
// 1 MiB would be left over.
#include "dlplan/caching_allocator.hpp"
#include "dlplan/hardware.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/step_program.hpp"

#include <gtest/gtest.h>

using namespace dlplan;

namespace {
constexpr int64_t MiB = 1 << 20;
}

TEST(CachingBlocks, GrantedFromAFreshSegment) {
  EXPECT_EQ(cuda_granted_fresh(1), 512);
  EXPECT_EQ(cuda_granted_fresh(1 * MiB), 1 * MiB);
  EXPECT_EQ(cuda_granted_fresh(1 * MiB + 1), 1 * MiB + 512);  // large pool, split from 20 MiB
  EXPECT_EQ(cuda_granted_fresh(9 * MiB + 100), 9 * MiB + 512);
  EXPECT_EQ(cuda_granted_fresh(10 * MiB), 10 * MiB);          // its own 10 MiB segment
  EXPECT_EQ(cuda_granted_fresh(11 * MiB + MiB / 2), 12 * MiB);  // 0.5 MiB left: not split
  EXPECT_EQ(cuda_granted_fresh(13 * MiB + 512), 14 * MiB);    // 1 MiB - 512 left: not split
  EXPECT_EQ(cuda_granted_fresh(12 * MiB + MiB / 2), 12 * MiB + MiB / 2);  // 1.5 MiB left: split
}

// A node output of 11.5 MiB (a linear of 3,014,656 outputs at micro-batch 1,
// fp32): 12 MiB on a GPU, 12,058,624 bytes exactly on the cpu device.
TEST(CachingBlocks, TheStepProgramCountsGrantedBlocksOnAGpuOnly) {
  const int64_t out = 3014656;
  const nlohmann::json ir = {
      {"name", "wide"},
      {"inputs", {{"x", {{"shape", {1}}, {"dtype", "f32"}}}, {"y", {{"shape", nlohmann::json::array()}, {"dtype", "i32"}}}}},
      {"nodes",
       {{{"name", "fc"}, {"op", "linear"}, {"in", {"x"}}, {"out", out}},
        {{"name", "loss"}, {"op", "cross_entropy"}, {"in", {"fc", "y"}}}}}};
  const Model m = parse_model(ir, "wide");
  TrainingConfig t;
  t.precision = Precision::fp32;
  t.micro_batch = 1;
  auto fc_output = [&](const char* device) {
    Cluster c;
    c.device = find_device(device);
    const StepProgram p = build_step_program(m, c, t);
    const int fc = m.nodes[static_cast<size_t>(m.node_index("fc"))].output;
    for (const Instr& in : p.instrs)
      if (in.kind == Instr::Kind::alloc && in.role == Role::node_output && in.tensor == fc) return in.bytes;
    return int64_t{-1};
  };
  EXPECT_EQ(fc_output("h100-80g"), 12 * MiB);
  EXPECT_EQ(fc_output("cpu"), out * 4);
}
