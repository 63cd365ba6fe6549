// Threads inside a rank (executor/cpu/parallel.cpp) change no bit: the same
// training with one thread and with two gives the same loss at every step and
// the same checkpoint, byte for byte (parameters and optimizer state). DLPLAN_CPU_GRAIN=1 splits every parallel loop,
// however small these models are. tiny-cnn exercises convolution (im2col,
// col2im), batch norm, ReLU, pooling and the optimizer; tiny-gpt dropout,
// GELU, layer norm and residual adds; tiny-vit exact GELU; the tiny Qwen2
// config SiLU. A control: another seed changes the losses, so equal lines are
// not equal by construction.
//
// Convolutions run through dlplan's own im2col lowering here
// (DLPLAN_CPU_CONV=im2col), not oneDNN: oneDNN's weight-gradient kernels may
// split the batch sum by thread count, and on an AVX-512 machine tiny-cnn's
// checkpoints then differ in their last bits after three steps
// (docs/cpu-engine.md, "Bits and threads"). That is oneDNN's choice; this test
// holds dlplan's threading (parallel.cpp) to every bit.
#include "cli_job.hpp"

#include <filesystem>

namespace {

using namespace dlplan::testing::cli_job;

const std::string kIm2col = "DLPLAN_CPU_CONV=im2col";

struct TrainRun {
  std::vector<std::string> losses;
  std::string shard;  // the checkpoint after the last step
  bool operator==(const TrainRun&) const = default;
};

TrainRun train(const std::string& plan, const std::string& threads, const std::string& seed = "1") {
  const std::string dir = temp_path("threads-ckpt-" + threads + "-" + seed);
  std::filesystem::remove_all(dir);
  const Job j = spawn(dlplan_args({"train", "--plan", plan, "--steps", "3", "--seed", seed, "--progress", "json",
                                   "--checkpoint-dir", dir}),
                      {"DLPLAN_CPU_THREADS=" + threads, "DLPLAN_CPU_GRAIN=1", "OPENBLAS_NUM_THREADS=1", kIm2col});
  EXPECT_TRUE(j.finished && j.exit_code == 0) << j.all();
  TrainRun r;
  for (const auto& line : lines(j.out)) r.losses.push_back(Json::parse(line).at("loss").dump());
  EXPECT_EQ(r.losses.size(), 3u) << j.out;
  r.shard = slurp(dir + "/step-00000003/shard-00000.bin");
  EXPECT_FALSE(r.shard.empty()) << "no checkpoint shard in " << dir;
  std::filesystem::remove_all(dir);
  return r;
}

struct Model {
  const char* name;
  std::string path;  // a zoo name or a file
};

void PrintTo(const Model& m, std::ostream* os) { *os << m.name; }

class CpuThreads : public ::testing::TestWithParam<Model> {};

TEST_P(CpuThreads, TwoThreadsGiveOneThreadsBits) {
  const Model& m = GetParam();
  const std::string plan = make_plan(m.path, 1, 4, std::string(m.name) + "-threads.json", {}, {kIm2col});
  const TrainRun one = train(plan, "1"), two = train(plan, "2");
  EXPECT_EQ(one.losses, two.losses);
  EXPECT_TRUE(one.shard == two.shard) << "the checkpoints differ";
  EXPECT_FALSE(one == train(plan, "1", "2"));  // the control
  std::remove(plan.c_str());
}

INSTANTIATE_TEST_SUITE_P(Models, CpuThreads,
                         ::testing::Values(Model{"tiny_cnn", "tiny-cnn"}, Model{"tiny_gpt", "tiny-gpt"},
                                           Model{"tiny_vit", "tiny-vit"},
                                           Model{"tiny_qwen2", DLPLAN_SOURCE_DIR "/tests/fixtures/hf/tiny-qwen2.json"}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
