// Qwen2, Gemma, Phi, Mixtral and T5, imported from Hugging Face configs written by
// transformers (tests/fixtures/make_hf_fixtures.py), trained on the CPU
// engine: they learn, and under every single knob change a plan carries the
// memory measured equals the plan's byte for byte (knob_grid.hpp). Their
// step equals transformers' in tests/tools/hf_parity.py (Mixtral's dropless).
#include "knob_grid.hpp"

#include "dlplan/error.hpp"
#include "dlplan/importers.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/step_walk.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

using namespace dlplan;
using namespace dlplan::exec;

namespace {

std::string hf(const std::string& name) { return std::string(DLPLAN_SOURCE_DIR) + "/tests/fixtures/hf/" + name + ".json"; }

PlanDocument fp32_plan(const std::string& model, int64_t micro_batch, double lr,
                       FusionMode fusion = FusionMode::engine) {
  PlanRequest req;
  ImportOptions import;
  import.fusion = fusion;
  req.model = load_model(model, import);
  req.cluster.device = find_device("cpu");
  req.training.precision = Precision::fp32;
  req.training.micro_batch = micro_batch;
  req.training.optimizer.lr = lr;
  req.forced = Strategy::ddp;
  Planning p = plan(req);
  return plan_from_json(nlohmann::json(plan_json(p, *p.chosen())), model);
}

class HfFamily : public ::testing::TestWithParam<const char*> {};

// The synthetic task (data.hpp) is learnable: the mean loss of the last five
// steps is at most 60 % of step 1's. 40 steps at lr 3e-3; T5 100 steps at
// 0.03: its tied head reads the decoder's output times d_model^-1/2, logits 8
// times smaller, and it learns slower (40 steps at 3e-3 take it from 5.55 to
// 5.32 only; 100 at 0.03 to about 2.8).
TEST_P(HfFamily, Learns) {
  const bool t5 = std::string(GetParam()).find("t5") != std::string::npos;
  PlanDocument plan = fp32_plan(hf(GetParam()), 8, t5 ? 0.03 : 3e-3);
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  TrainOptions opt;
  opt.steps = t5 ? 100 : 40;
  Trainer t(plan, *comm, *backend, opt);
  std::vector<double> loss;
  for (int s = 0; s < opt.steps; ++s) loss.push_back(t.step().loss);
  double late = 0;
  for (int s = opt.steps - 5; s < opt.steps; ++s) late += loss[static_cast<size_t>(s)] / 5;
  EXPECT_LE(late, 0.6 * loss[0]) << GetParam() << ": step 1 " << loss[0] << ", last five steps " << late;
}

// Every single knob change a plan carries, measured against the plan.
void every_knob_measures_as_planned(const std::string& model, FusionMode fusion) {
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  ImportOptions import;
  import.fusion = fusion;
  int runs = 0;
  for (const auto& k : knobs::single_knob_changes()) {
    if (k[knobs::kModel] != 0 || k[knobs::kSyncBn] != 0) continue;  // the model is this family's; it has no BatchNorm
    const knobs::Outcome o = knobs::run_config(k, *comm, *backend, 2, 0, false, model, import);
    EXPECT_TRUE(o.equal()) << model << " " << to_string(fusion) << " " << knobs::describe(k) << ": " << knobs::mismatch(o);
    EXPECT_TRUE(std::isfinite(o.loss)) << knobs::describe(k);
    ++runs;
  }
  EXPECT_GE(runs, 15);
}

TEST_P(HfFamily, EverySingleKnobChangeMeasuresAsPlanned) { every_knob_measures_as_planned(hf(GetParam()), FusionMode::engine); }

INSTANTIATE_TEST_SUITE_P(Transformers, HfFamily,
                         ::testing::Values("tiny-qwen2", "tiny-gemma", "tiny-phi", "tiny-mixtral", "tiny-t5-gated"),
                         [](const auto& info) {
                           std::string s = std::string(info.param).substr(5);  // "t5-gated": gtest names take no '-'
                           for (auto& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

// --fusion eager: RMSNorm, T5LayerNorm and gelu_new op by op (pow, affine,
// reduce_mean, mul, scale, tanh). Each family trains on them, its loss going
// down as under the fused ops, and the engine allocates what the plan walks,
// at the peak and in every category. (tools.hf_parity_eager: the step equals
// transformers'.)
class HfFamilyEager : public ::testing::TestWithParam<const char*> {};

TEST_P(HfFamilyEager, TrainsAndMeasuresAsPlanned) {
  const bool t5 = std::string(GetParam()).find("t5") != std::string::npos;
  const PlanDocument plan = fp32_plan(hf(GetParam()), 4, t5 ? 0.03 : 3e-3, FusionMode::eager);
  int pows = 0;
  for (const Node& n : plan.model.nodes) pows += n.op == OpKind::pow;
  EXPECT_GT(pows, 0) << GetParam() << ": nothing was planned op by op";
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  TrainOptions opt;
  opt.steps = 10;
  Trainer t(plan, *comm, *backend, opt);
  std::vector<double> loss;
  for (int s = 0; s < opt.steps; ++s) loss.push_back(t.step().loss);
  EXPECT_LT(loss.back(), loss.front()) << GetParam();
  const StepWalk w = walk_step(plan.model, plan.cluster, plan.training);
  EXPECT_EQ(t.allocator().peak(), w.peak) << GetParam();
  for (Category cat : kAllCategories)
    EXPECT_EQ(t.allocator().at_peak()[static_cast<size_t>(cat)], w.at_peak[static_cast<size_t>(cat)])
        << GetParam() << " " << to_string(cat);
}

// The written-out ops under every knob: precision (bf16 and fp16 storage),
// checkpointing's recompute, the ZeRO strategies, accumulation, offload.
TEST_P(HfFamilyEager, EverySingleKnobChangeMeasuresAsPlanned) {
  every_knob_measures_as_planned(hf(GetParam()), FusionMode::eager);
}

INSTANTIATE_TEST_SUITE_P(Transformers, HfFamilyEager,
                         ::testing::Values("tiny-qwen2", "tiny-gemma", "tiny-phi", "tiny-mixtral", "tiny-t5-gated"),
                         [](const auto& info) {
                           std::string s = std::string(info.param).substr(5);
                           for (auto& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

// --expert-units: each Mixtral expert a ZeRO-3 unit of its own, gathered
// just before it runs inside its layer's unit (FSDP wrapping each
// MixtralBlockSparseTop2MLP). Against the same plan with the layer's units,
// on one rank: the engine allocates what the plan walks, in every category,
// with and without checkpointing (an expert then recomputes on its own
// inside its layer's recompute), and the arithmetic is the same (equal
// losses). On two ranks the plan gathers each expert on its own (one more
// all-gather per expert and layer in forward and in backward) and holds
// fewer gathered parameters at once. (Measured on 2 and 4 ranks under every
// single knob change: tests/executor/mpi/knob_grid.cpp.)
TEST(HfFamilyMoe, ExpertUnitsMeasureAsPlannedUnderZero3) {
  const Model layers = with_seq_len(load_model(hf("tiny-mixtral")), 16);
  const Model experts = with_expert_units(layers);
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  for (Checkpointing ckpt : {Checkpointing::none, Checkpointing::units}) {
    auto run = [&](const Model& m, StepWalk& on_two_ranks) {
      PlanRequest req;
      req.model = m;
      req.cluster.device = find_device("cpu");
      req.training.precision = Precision::fp32;
      req.training.micro_batch = 2;
      req.training.checkpointing = ckpt;
      req.forced = Strategy::zero3;
      Planning p = plan(req);
      const PlanDocument doc = plan_from_json(nlohmann::json(plan_json(p, *p.chosen())), "tiny-mixtral");
      TrainOptions opt;
      opt.steps = 3;
      Trainer t(doc, *comm, *backend, opt);
      double loss = 0;
      for (int s = 0; s < opt.steps; ++s) loss = t.step().loss;
      const StepWalk walk = walk_step(doc.model, doc.cluster, doc.training);
      EXPECT_EQ(t.allocator().peak(), walk.peak) << to_string(ckpt);
      for (Category cat : kAllCategories)
        EXPECT_EQ(t.allocator().at_peak()[static_cast<size_t>(cat)], walk.at_peak[static_cast<size_t>(cat)])
            << to_string(ckpt) << " " << to_string(cat);
      Cluster two = doc.cluster;
      two.nodes = 1;
      two.gpus_per_node = 2;
      on_two_ranks = walk_step(doc.model, two, doc.training);
      return loss;
    };
    StepWalk by_layer, by_expert;
    const double a = run(layers, by_layer), b = run(experts, by_expert);
    EXPECT_NEAR(a, b, 1e-6 * std::fabs(a)) << to_string(ckpt);
    auto gathers = [](const StepWalk& w) {
      int n = 0;
      for (const CommEvent& c : w.comm) n += c.purpose == CommPurpose::unit_gather;
      return n;
    };
    EXPECT_GT(gathers(by_layer), 0);
    EXPECT_EQ(gathers(by_expert), gathers(by_layer) + 2 * 2 * 4) << to_string(ckpt);  // 2 layers x 4 experts x 2 passes
    const auto gathered = static_cast<size_t>(Category::gathered);
    EXPECT_LT(by_expert.max_each[gathered], by_layer.max_each[gathered]) << to_string(ckpt);
  }
}

// The CUDA kernels have no partial rotary, scaled embedding or offset RMSNorm
// yet: the Trainer refuses such a plan on the GPU engine, naming the node.
TEST(HfFamilyRefusal, WhatTheGpuEngineLacksIsNamed) {
  auto phi = gpu_engine_lacks(load_model(hf("tiny-phi")));
  ASSERT_TRUE(phi.has_value());
  EXPECT_NE(phi->find("'layers.0.self_attn' rotates 8 of 16 head dims"), std::string::npos) << *phi;
  auto gemma = gpu_engine_lacks(load_model(hf("tiny-gemma")));
  ASSERT_TRUE(gemma.has_value());
  EXPECT_NE(gemma->find("'embed_tokens' scales its embedding"), std::string::npos) << *gemma;
  auto mixtral = gpu_engine_lacks(load_model(hf("tiny-mixtral")));
  ASSERT_TRUE(mixtral.has_value());
  EXPECT_NE(mixtral->find("'layers.0.block_sparse_moe.gate' is part of a mixture of experts"), std::string::npos)
      << *mixtral;
  // Qwen2's q, k, v-only biases are in the CUDA kernels (AttentionShape::bias_param).
  auto t5 = gpu_engine_lacks(load_model(hf("tiny-t5-gated")));
  ASSERT_TRUE(t5.has_value());
  EXPECT_NE(t5->find("'encoder.block.0.layer.0.SelfAttention.relative_attention_bias' is a relative position bias"),
            std::string::npos)
      << *t5;
  EXPECT_FALSE(gpu_engine_lacks(load_model(hf("tiny-qwen2"))).has_value());
  EXPECT_FALSE(gpu_engine_lacks(load_model("tiny-gpt")).has_value());
}

}  // namespace
