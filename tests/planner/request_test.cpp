// The one request builder (request.hpp) that the CLI and the GUI share: its
// defaults, the rules it applies (the device's precision, the cluster file's
// topology) and its refusals, each a UsageError naming the flag.
#include "dlplan/request.hpp"

#include "dlplan/loader.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

using namespace dlplan;

namespace {

RequestFlags flags(const char* model) {
  RequestFlags f;
  f.model = model;
  return f;
}

TEST(Request, DefaultsAreTheDocumentedOnes) {
  const PlanRequest r = build_request(flags("gpt2"));
  EXPECT_EQ(r.cluster.device.kind, kDefaultGpu);
  EXPECT_EQ(r.cluster.world(), 1);
  EXPECT_EQ(r.training.micro_batch, 1);
  EXPECT_EQ(r.training.grad_accum, 1);
  EXPECT_EQ(r.training.precision, Precision::bf16_mixed);
  EXPECT_EQ(r.training.optimizer.kind, OptimizerKind::adamw);
  EXPECT_DOUBLE_EQ(r.training.optimizer.lr, kDefaultLr);
  EXPECT_DOUBLE_EQ(r.training.optimizer.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(r.training.bucket_mb, 25.0);
  EXPECT_EQ(r.training.prefetch, 1);
  EXPECT_EQ(r.model_context, 1024);
  EXPECT_EQ(tokens_per_sample(r.model), 1024);
}

TEST(Request, PrecisionFollowsTheDevice) {
  RequestFlags f = flags("tiny-gpt");
  f.gpu = "cpu";
  EXPECT_EQ(build_request(f).training.precision, Precision::fp32);
  f.gpu = "v100-32g";  // no bf16: fp16 with loss scaling
  EXPECT_EQ(build_request(f).training.precision, Precision::fp16_mixed);
  f.precision = "bf16-mixed";  // asked for: refused, not changed
  EXPECT_THROW(build_request(f), UsageError);
  f.precision = "fp32";
  EXPECT_EQ(build_request(f).training.precision, Precision::fp32);
  f.precision = "bf16-mixed";
  f.gpu = "a100-80g";
  EXPECT_EQ(build_request(f).training.precision, Precision::bf16_mixed);
}

TEST(Request, SgdHasNoWeightDecayUnlessAsked) {
  RequestFlags f = flags("tiny-gpt");
  f.optimizer = "sgd";
  EXPECT_DOUBLE_EQ(build_request(f).training.optimizer.weight_decay, 0.0);
  f.weight_decay = 0.01;
  EXPECT_DOUBLE_EQ(build_request(f).training.optimizer.weight_decay, 0.01);
}

TEST(Request, GlobalBatchSetsAccumulation) {
  RequestFlags f = flags("tiny-gpt");
  f.gpus = 4;
  f.micro_batch = 2;
  f.global_batch = 32;
  EXPECT_EQ(build_request(f).training.grad_accum, 4);
  f.grad_accum = 3;  // contradicts it
  EXPECT_THROW(build_request(f), UsageError);
}

TEST(Request, ClusterFileTopology) {
  const std::string path = ::testing::TempDir() + "request_2x4.json";
  std::ofstream(path) << R"({"gpu": "a100-80g", "nodes": 2, "gpus_per_node": 4})";
  RequestFlags f = flags("tiny-gpt");
  f.cluster_file = path;
  PlanRequest r = build_request(f);
  EXPECT_EQ(r.cluster.nodes, 2);
  EXPECT_EQ(r.cluster.gpus_per_node, 4);
  EXPECT_EQ(r.cluster_source, path);
  ASSERT_TRUE(cluster_file_topology(path).has_value());
  EXPECT_EQ(*cluster_file_topology(path), (std::pair<int, int>{2, 4}));
  f.gpus = 16;
  EXPECT_THROW(build_request(f), UsageError);
  // A file that describes only the device takes --gpus as given.
  std::ofstream(path, std::ios::trunc) << R"({"gpu": "a100-80g"})";
  EXPECT_FALSE(cluster_file_topology(path).has_value());
  f.gpus = 16;
  f.nodes = 2;
  r = build_request(f);
  EXPECT_EQ(r.cluster.world(), 16);
  std::remove(path.c_str());
}

TEST(Request, MicroBatchTakesMax) {
  RequestFlags f = flags("tiny-gpt");
  parse_micro_batch("max", f);
  EXPECT_TRUE(f.micro_batch_max);
  EXPECT_TRUE(build_request(f).max_micro_batch);
  parse_micro_batch("12", f);
  EXPECT_FALSE(f.micro_batch_max);
  EXPECT_EQ(*f.micro_batch, 12);
  EXPECT_THROW(parse_micro_batch("12x", f), UsageError);
  EXPECT_THROW(parse_micro_batch("", f), UsageError);
}

TEST(Request, RefusalsNameTheFlag) {
  auto refused = [](RequestFlags f, const std::string& flag) {
    try {
      build_request(f);
      ADD_FAILURE() << "accepted; expected a refusal naming " << flag;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
    }
  };
  RequestFlags f = flags("tiny-gpt");
  f.lr = -1;
  refused(f, "--lr");
  f = flags("tiny-gpt");
  f.gpus = 0;
  refused(f, "--gpus");
  f = flags("gpt2");
  f.seq_len = 4096;
  refused(f, "--seq-len");
  f = flags("tiny-gpt");
  f.betas = std::pair{0.9, 1.0};
  refused(f, "--betas");
  f = flags("tiny-gpt");
  f.strategy = "zero4";
  refused(f, "--strategy");
}

}  // namespace
