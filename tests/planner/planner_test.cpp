// SyncBN advice, the recommendation rule, and the planning / plan documents.
#include "dlplan/comm_model.hpp"
#include "dlplan/error.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"

#include <gtest/gtest.h>

using namespace dlplan;

namespace {

Cluster gpus(int n, int nodes = 1, const char* kind = "h100-80g") {
  Cluster c;
  c.device = find_device(kind);
  c.nodes = nodes;
  c.gpus_per_node = n / nodes;
  return c;
}

PlanRequest request(const char* model, int n, int64_t micro_batch, int nodes = 1) {
  PlanRequest r;
  r.model = load_model(model);
  r.cluster = gpus(n, nodes);
  r.training.micro_batch = micro_batch;
  return r;
}

// ---- SyncBN ---------------------------------------------------------------

TEST(SyncBn, NotApplicableWithoutBatchNorm) {
  Planning p = plan(request("tiny-gpt", 8, 1));
  EXPECT_FALSE(p.syncbn.applicable);
  EXPECT_FALSE(p.syncbn.recommended);
  EXPECT_FALSE(p.recommendation.syncbn);
  EXPECT_NE(p.syncbn.reason.find("no batchnorm"), std::string::npos);
}

TEST(SyncBn, RecommendedBelowTheThresholdWithTheSmallestSufficientGroup) {
  // 2 images per GPU: 16 needs groups of 8 (Wu & He 2018's regime).
  Planning p = plan(request("resnet50", 16, 2, 2));
  EXPECT_TRUE(p.syncbn.applicable);
  EXPECT_TRUE(p.syncbn.recommended);
  EXPECT_EQ(p.syncbn.group_size, 8);
  EXPECT_TRUE(p.recommendation.syncbn);
  EXPECT_NE(p.syncbn.reason.find("Wu & He"), std::string::npos);
  // 4 per GPU: groups of 4.
  EXPECT_EQ(plan(request("resnet50", 16, 4, 2)).syncbn.group_size, 4);
  // 3 per GPU on 8: 6 * 3 = 18 but 6 does not divide 8, so 8.
  EXPECT_EQ(plan(request("resnet50", 8, 3)).syncbn.group_size, 8);
}

TEST(SyncBn, NotRecommendedAtOrAboveTheThreshold) {
  Planning p = plan(request("resnet50", 8, 32));
  EXPECT_TRUE(p.syncbn.applicable);
  EXPECT_FALSE(p.syncbn.recommended);
  EXPECT_FALSE(p.recommendation.syncbn);
  // Control: one below the threshold flips it.
  EXPECT_TRUE(plan(request("resnet50", 8, 15)).syncbn.recommended);
}

TEST(SyncBn, CostIsTwoLatencyBoundCollectivesPerBnLayer) {
  Planning p = plan(request("resnet50", 8, 2));
  ASSERT_TRUE(p.syncbn.recommended);
  const Model& m = p.request.model;
  // Hand sum over the 53 BN layers of ResNet-50 (REFERENCES.md): all-gather of
  // 8 x (2C+1) floats and all-reduce of 2C floats.
  double expected = 0;
  int layers = 0;
  for (const auto& n : m.nodes)
    if (n.op == OpKind::batchnorm) {
      double c = static_cast<double>(m.tensor(n.inputs[0]).shape[0]);
      expected += collective_cost(p.request.cluster, Collective::AllGather, 8 * (2 * c + 1) * 4, 8).seconds +
                  collective_cost(p.request.cluster, Collective::AllReduce, 2 * c * 4, 8).seconds;
      ++layers;
    }
  EXPECT_EQ(layers, 53);
  EXPECT_EQ(p.syncbn.bn_layers, 53);
  EXPECT_DOUBLE_EQ(p.syncbn.seconds, expected);
  // The plans carry the same cost as blocking communication.
  EXPECT_NEAR(p.chosen()->syncbn_seconds, expected, 1e-12);
  EXPECT_GT(p.syncbn.share, 0.0);
  EXPECT_LT(p.syncbn.share, 1.0);
  // Control: with SyncBN off the plans carry none.
  PlanRequest off = request("resnet50", 8, 2);
  off.syncbn = SyncBnMode::off;
  Planning q = plan(off);
  for (size_t s = 0; s < q.results.size(); ++s) {  // strategy by strategy
    EXPECT_EQ(q.results[s].syncbn_seconds, 0.0);
    EXPECT_LT(q.results[s].comm.bytes, p.results[s].comm.bytes);
  }
}

// ---- recommendation -------------------------------------------------------

TEST(Recommendation, SmallModelOnBigGpusIsPlainDdpOrWithinFivePercent) {
  Planning p = plan(request("resnet50", 8, 64));
  ASSERT_TRUE(p.recommendation.strategy.has_value());
  const auto* best = p.chosen();
  double fastest = 1e30;
  for (const auto& r : p.results)
    if (r.fits) fastest = std::min(fastest, r.step_seconds);
  EXPECT_LE(best->step_seconds, 1.05 * fastest);
  for (const auto& r : p.results)  // nothing simpler qualifies
    if (r.strategy < best->strategy) {
      EXPECT_TRUE(!r.fits || r.step_seconds > 1.05 * fastest);
    }
  EXPECT_FALSE(p.recommendation.reasons.empty());
}

TEST(Recommendation, BigModelNeedsZero3AndSaysWhyDdpDoesNot) {
  // Llama-2-7B on 8 x 80 GB: DDP needs 16 x 6.7 B = 108 GB of model states.
  Planning p = plan(request("llama2-7b", 8, 1));
  EXPECT_FALSE(p.results[0].fits);
  ASSERT_TRUE(p.recommendation.strategy.has_value());
  EXPECT_NE(*p.recommendation.strategy, Strategy::ddp);
  bool says_ddp = false;
  for (const auto& r : p.recommendation.reasons) says_ddp |= r.find("ddp does not fit") != std::string::npos;
  EXPECT_TRUE(says_ddp);
}

TEST(Recommendation, NothingFitsNamesTheSmallestChange) {
  // Llama-2-7B on one 24 GB card: nothing fits; more GPUs would.
  PlanRequest r = request("llama2-7b", 1, 1);
  r.cluster = gpus(1, 1, "rtx4090");
  Planning p = plan(r);
  EXPECT_FALSE(p.recommendation.strategy.has_value());
  ASSERT_GE(p.recommendation.reasons.size(), 2u);
  EXPECT_NE(p.recommendation.reasons[0].find("No strategy fits"), std::string::npos);
  EXPECT_NE(p.recommendation.reasons[1].find("GPUs ("), std::string::npos);
  EXPECT_NE(p.recommendation.reasons[1].find("checkpointing"), std::string::npos);
}

TEST(Recommendation, CheckpointingIsSuggestedWhenActivationsAreTheProblem) {
  // GPT-2 at micro-batch 64 x 1024 tokens: activations, not states, overflow.
  // Checkpointing is among the changes that fit; the cheapest is flash
  // attention, which drops the T x T probabilities (most of the overflow)
  // and is also faster than the unfused form (docs/gpu-time-model.md).
  PlanRequest r = request("gpt2", 8, 64);
  Planning p = plan(r);
  EXPECT_FALSE(p.recommendation.strategy.has_value());
  ASSERT_GE(p.recommendation.reasons.size(), 2u);
  EXPECT_NE(p.recommendation.reasons[1].find("flash attention"), std::string::npos);
  bool checkpointing = false;
  for (const auto& reason : p.recommendation.reasons) checkpointing |= reason.find("--checkpointing units") != std::string::npos;
  EXPECT_TRUE(checkpointing);
}

TEST(Recommendation, ForcedStrategyIsKeptEvenIfSlower) {
  PlanRequest r = request("tiny-mlp", 4, 8);
  r.forced = Strategy::zero3;
  Planning p = plan(r);
  EXPECT_EQ(*p.recommendation.strategy, Strategy::zero3);
}

TEST(Validation, PrecisionMustSuitTheDevice) {
  PlanRequest r = request("tiny-mlp", 2, 8);
  r.cluster = gpus(2, 1, "v100-32g");
  EXPECT_THROW(plan(r), Error);
  r.training.precision = Precision::fp32;
  EXPECT_NO_THROW(plan(r));
  r.cluster = gpus(2, 1, "cpu");  // the CPU engine runs bf16-mixed (docs/precision.md)
  r.training.precision = Precision::bf16_mixed;
  EXPECT_NO_THROW(plan(r));
}

TEST(Capacity, CpuMemoryIsSharedByTheRanksOfANode) {
  Cluster c = gpus(4, 1, "cpu");
  EXPECT_EQ(device_capacity(c), c.device.memory_bytes / 4);
  EXPECT_EQ(device_capacity(gpus(4)), find_device("h100-80g").memory_bytes);
  EXPECT_EQ(find_device("cpu").runtime_bytes, 0);
}

// ---- documents ------------------------------------------------------------

TEST(Documents, PlanningJsonHasTheStableFields) {
  Planning p = plan(request("tiny-cnn", 4, 4));
  auto j = planning_json(p);
  EXPECT_EQ(j["schema_version"], 1);
  EXPECT_EQ(j["kind"], "planning");
  EXPECT_EQ(j["model"]["params"], p.request.model.parameter_count());
  ASSERT_EQ(j["strategies"].size(), 4u);
  for (const auto& s : j["strategies"]) {
    int64_t sum = 0;
    for (const char* k : {"params", "grads", "optimizer", "activations", "gathered", "comm", "workspace"}) {
      ASSERT_TRUE(s["memory"][k].is_number_integer()) << k;
      sum += s["memory"][k].get<int64_t>();
    }
    EXPECT_EQ(sum, s["memory"]["peak"].get<int64_t>());  // peak excludes runtime
    EXPECT_TRUE(s["memory"]["runtime"].is_number_integer());
    // The simulator overlaps the streams: exposed <= busy, step = compute + exposed.
    EXPECT_LE(s["comm"]["exposed_seconds"].get<double>(), s["comm"]["seconds"].get<double>() + 1e-15);
    EXPECT_NEAR(s["step_seconds"].get<double>(),
                s["compute_seconds"].get<double>() + s["comm"]["exposed_seconds"].get<double>(), 1e-12);
    EXPECT_GT(s["mfu"].get<double>(), 0.0);
    EXPECT_LT(s["mfu"].get<double>(), 1.0);
  }
  EXPECT_TRUE(j["recommendation"]["syncbn"].is_boolean());
  EXPECT_TRUE(j["syncbn"]["applicable"].get<bool>());
}

TEST(Documents, PlanIsSelfContainedAndReloads) {
  PlanRequest r = request("tiny-gpt", 2, 4);
  r.model = with_seq_len(r.model, 32);
  Planning p = plan(r);
  auto j = plan_json(p, *p.chosen());
  EXPECT_EQ(j["kind"], "plan");
  // The IR as planned, with the sequence length applied, loads back equal.
  Model back = parse_model(nlohmann::json(j["model"]["ir"]), "plan.json");
  EXPECT_EQ(back.parameter_count(), r.model.parameter_count());
  EXPECT_EQ(tokens_per_sample(back), 32);
  Cluster c = cluster_from_json(nlohmann::json(j["cluster"]), "plan.json");
  EXPECT_EQ(c.world(), 2);
  EXPECT_EQ(c.device.memory_bytes, r.cluster.device.memory_bytes);
  EXPECT_EQ(j["predicted"]["memory"]["peak"], p.chosen()->walk.peak);
}

TEST(Mfu, NeverExceedsOneAndUsesTheDensePeak) {
  // GPT-2 at micro-batch 8: the model's FLOPs are about 6 N tokens + attention.
  PlanRequest r = request("gpt2", 8, 8);
  r.training.checkpointing = Checkpointing::units;
  Planning p = plan(r);
  for (const auto& s : p.results) {
    EXPECT_GT(s.mfu, 0.05);
    EXPECT_LT(s.mfu, 0.9);
  }
  // Model FLOPs per device: 6 x 124M x 8 x 1024 tokens, plus attention's
  // 12 L h s per token (PaLM appendix B); our count adds the tied head's
  // GEMM (the 6N rule counts embedding parameters as if multiplied) and norms.
  const double tokens = 8.0 * 1024, params = 124'439'808;
  const double palm = 6 * params * tokens + 12.0 * 12 * 768 * 1024 * tokens;
  EXPECT_NEAR(p.results[0].model_flops / palm, 1.0, 0.05);
}

}  // namespace
