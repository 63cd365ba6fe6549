// The trainer in one process: learning on every tiny model, data keyed by
// global sample index, the file loaders, the optimizer against hand
// arithmetic, memory against the planner on one rank, and its refusals.
#include "dlplan/error.hpp"
#include "dlplan/exec/backend.hpp"
#include "dlplan/exec/communicator.hpp"
#include "dlplan/exec/data.hpp"
#include "dlplan/exec/optimizer.hpp"
#include "dlplan/exec/trainer.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

using namespace dlplan;
using namespace dlplan::exec;

namespace {

PlanDocument make_plan(const std::string& model, int64_t micro_batch, double lr, Strategy s = Strategy::ddp, int ranks = 1) {
  PlanRequest req;
  req.model = load_model(model);
  req.cluster.device = find_device("cpu");
  req.cluster.gpus_per_node = ranks;
  req.training.precision = Precision::fp32;
  req.training.micro_batch = micro_batch;
  req.training.optimizer.lr = lr;
  req.forced = s;
  req.syncbn = SyncBnMode::off;
  Planning p = plan(req);
  return plan_from_json(nlohmann::json(plan_json(p, *p.chosen())), model + ".plan");
}

struct LearningCase {
  const char* model;
  int64_t micro_batch;
  double lr;
};

class Learning : public ::testing::TestWithParam<LearningCase> {};

// The mean loss of steps 46-50 of the synthetic task is at most half of step 1's.
TEST_P(Learning, LossHalvesWithinFiftySteps) {
  const auto c = GetParam();
  PlanDocument plan = make_plan(c.model, c.micro_batch, c.lr);
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  TrainOptions opt;
  opt.steps = 50;
  Trainer t(plan, *comm, *backend, opt);
  std::vector<double> loss;
  for (int s = 0; s < opt.steps; ++s) loss.push_back(t.step().loss);
  const double late = (loss[45] + loss[46] + loss[47] + loss[48] + loss[49]) / 5;
  EXPECT_LE(late, 0.5 * loss[0]) << c.model << ": step 1 " << loss[0] << ", steps 46-50 " << late;
  EXPECT_TRUE(std::isfinite(late));
}

INSTANTIATE_TEST_SUITE_P(TinyModels, Learning,
                         ::testing::Values(LearningCase{"tiny-mlp", 16, 1e-2}, LearningCase{"tiny-cnn", 16, 1e-2},
                                           LearningCase{"tiny-vit", 16, 3e-3}, LearningCase{"tiny-gpt", 32, 1e-2}),
                         [](const auto& info) {
                           std::string s = info.param.model;
                           return s.substr(5);
                         });

// ---- memory on one rank --------------------------------------------------------

TEST(MemoryOneRank, MeasuredEqualsPredictedForEveryModel) {
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  for (const char* model : {"tiny-mlp", "tiny-cnn", "tiny-vit", "tiny-gpt"}) {
    PlanDocument plan = make_plan(model, 4, 1e-3);
    TrainOptions opt;
    opt.steps = 3;
    Trainer t(plan, *comm, *backend, opt);
    for (int s = 0; s < opt.steps; ++s) t.step();
    StepWalk w = walk_step(plan.model, plan.cluster, plan.training);
    const double got = static_cast<double>(t.allocator().peak()), want = static_cast<double>(w.peak);
    EXPECT_NEAR(got, want, 0.03 * want) << model;
    for (Category c : kAllCategories) {
      const double a = static_cast<double>(t.allocator().at_peak()[static_cast<size_t>(c)]);
      const double b = static_cast<double>(w.at_peak[static_cast<size_t>(c)]);
      EXPECT_NEAR(a, b, std::max(0.03 * b, 65536.0)) << model << " " << to_string(c);
    }
  }
}

// ---- refusals -----------------------------------------------------------------

TEST(TrainerRefuses, APlanForMoreRanksThanLaunched) {
  PlanDocument plan = make_plan("tiny-mlp", 4, 1e-3, Strategy::ddp, 4);
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  try {
    Trainer t(plan, *comm, *backend, {});
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("tiny-mlp.plan"), std::string::npos) << msg;
    EXPECT_NE(msg.find("4 ranks"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1 was launched"), std::string::npos) << msg;
  }
}

TEST(TrainerRefuses, APlanThatDoesNotFitThisHost) {
  PlanDocument plan = make_plan("tiny-mlp", 4, 1e-3);
  plan.predicted.memory.peak = int64_t{1} << 50;  // a pebibyte per rank
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  try {
    Trainer t(plan, *comm, *backend, {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("per rank but this host offers"), std::string::npos) << e.what();
  }
}

TEST(TrainerRefuses, AGpuPlan) {
  PlanRequest req;
  req.model = load_model("tiny-mlp");
  req.cluster.device = find_device("h100-80g");
  Planning p = plan(req);
  PlanDocument plan = plan_from_json(nlohmann::json(plan_json(p, *p.chosen())), "gpu.plan");
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  EXPECT_THROW(Trainer(plan, *comm, *backend, {}), Error);
}

// ---- data ---------------------------------------------------------------------

TEST(Data, SyntheticSamplesDependOnTheGlobalIndexOnly) {
  Model m = load_model("tiny-gpt");
  auto src = make_data_source("synthetic", m, 7);
  Allocator a;
  for (int input = 0; input < static_cast<int>(m.inputs.size()); ++input) {
    const TensorInfo& t = m.tensor(m.inputs[static_cast<size_t>(input)]);
    Shape eight{8}, four{4};
    eight.insert(eight.end(), t.shape.begin(), t.shape.end());
    four.insert(four.end(), t.shape.begin(), t.shape.end());
    Tensor whole = a.empty(eight, t.dtype, Category::workspace, "a");
    Tensor half = a.empty(four, t.dtype, Category::workspace, "b");
    src->fill(input, whole, 0, 8);
    src->fill(input, half, 4, 4);
    const int64_t per = numel(t.shape);
    for (int64_t e = 0; e < 4 * per; ++e) EXPECT_EQ(whole.i()[4 * per + e], half.i()[e]);
    // Control: another seed gives another batch.
    auto other = make_data_source("synthetic", m, 8);
    Tensor third = a.empty(four, t.dtype, Category::workspace, "c");
    other->fill(input, third, 4, 4);
    int64_t same = 0;
    for (int64_t e = 0; e < 4 * per; ++e) same += third.i()[e] == half.i()[e];
    EXPECT_LT(same, 4 * per);
  }
}

TEST(Data, TokenFilesUint16AndInt32) {
  Model m = load_model("tiny-gpt");  // tokens, targets: [64] i32, vocab 256
  std::vector<uint16_t> u16(1000);
  for (size_t i = 0; i < u16.size(); ++i) u16[i] = static_cast<uint16_t>((i * 7) % 256);
  const std::string p16 = ::testing::TempDir() + "tokens.u16", p32 = ::testing::TempDir() + "tokens.i32";
  std::ofstream(p16, std::ios::binary).write(reinterpret_cast<const char*>(u16.data()), static_cast<std::streamsize>(u16.size() * 2));
  std::vector<int32_t> i32(u16.begin(), u16.end());
  std::ofstream(p32, std::ios::binary).write(reinterpret_cast<const char*>(i32.data()), static_cast<std::streamsize>(i32.size() * 4));
  Allocator a;
  for (const auto& path : {p16, p32}) {
    auto src = make_data_source(path, m, 1);
    Tensor tokens = a.empty({2, 64}, DType::i32, Category::workspace, "t");
    Tensor targets = a.empty({2, 64}, DType::i32, Category::workspace, "y");
    auto input = [&](const char* name) {
      for (size_t k = 0; k < m.inputs.size(); ++k)
        if (m.tensor(m.inputs[k]).name == name) return static_cast<int>(k);
      return -1;
    };
    src->fill(input("tokens"), tokens, 3, 2);
    src->fill(input("targets"), targets, 3, 2);
    for (int s = 0; s < 2; ++s)
      for (int e = 0; e < 64; ++e) {
        const size_t at = static_cast<size_t>(((3 + s) * 64) % (1000 - 64 - 1) + e);
        EXPECT_EQ(tokens.i()[s * 64 + e], u16[at]) << path;
        EXPECT_EQ(targets.i()[s * 64 + e], u16[at + 1]) << path;  // shifted by one
      }
  }
  // A token outside the vocabulary is refused, naming the file.
  i32[10] = 999;
  std::ofstream(p32, std::ios::binary).write(reinterpret_cast<const char*>(i32.data()), static_cast<std::streamsize>(i32.size() * 4));
  try {
    make_data_source(p32, m, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p32), std::string::npos);
  }
}

TEST(Data, ImageFilesRoundTripAndBadFilesAreNamed) {
  Model m = load_model("tiny-cnn");  // image [3, 16, 16], 10 classes
  const int per = 3 * 16 * 16;
  std::vector<int> labels = {3, 7, 1};
  std::vector<float> pixels(static_cast<size_t>(per) * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<float>(i % 97) / 97.0f;
  const std::string path = ::testing::TempDir() + "images.dlpi";
  write_image_file(path, 3, 16, 16, 10, labels, pixels);
  auto src = make_data_source(path, m, 1);
  Allocator a;
  Tensor img = a.empty({4, 3, 16, 16}, DType::f32, Category::workspace, "x");
  Tensor lab = a.empty({4}, DType::i32, Category::workspace, "y");
  const bool image_first = m.tensor(m.inputs[0]).dtype == DType::f32;
  src->fill(image_first ? 0 : 1, img, 1, 4);
  src->fill(image_first ? 1 : 0, lab, 1, 4);
  for (int s = 0; s < 4; ++s) {
    const int rec = (1 + s) % 3;
    EXPECT_EQ(lab.i()[s], labels[static_cast<size_t>(rec)]);
    EXPECT_EQ(img.f()[s * per + 5], pixels[static_cast<size_t>(rec * per + 5)]);
  }
  // Truncated file.
  {
    std::ifstream in(path, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(path, std::ios::binary) << all.substr(0, all.size() - 100);
  }
  try {
    make_data_source(path, m, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
  // Wrong image size for the model.
  write_image_file(path, 3, 8, 8, 10, {1}, std::vector<float>(3 * 64));
  EXPECT_THROW(make_data_source(path, m, 1), Error);
  EXPECT_THROW(make_data_source(::testing::TempDir() + "missing.u16", m, 1), Error);
}

// ---- optimizer -------------------------------------------------------------------

TEST(Schedule, WarmupThenCosineToMinLr) {
  OptimizerConfig o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(learning_rate(o, 0, 20), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(o, 3, 20), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(o, 4, 20), 1.0);                                   // cosine starts at lr
  EXPECT_NEAR(learning_rate(o, 12, 20), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.5)), 1e-12);  // halfway
  EXPECT_NEAR(learning_rate(o, 20, 20), 0.1, 1e-12);                                // ends at min_lr
}

TEST(AdamW, OneStepMatchesHandArithmeticAndDecaysOnlyWeights) {
  // tiny-mlp's first linear: weight decayed, bias not. With every gradient
  // set to g, Adam's first bias-corrected step is exactly lr * g/|g| (+eps).
  PlanDocument plan = make_plan("tiny-mlp", 1, 0.1);
  auto comm = make_single_communicator();
  Allocator a;
  ParamStore store(plan.model, plan.training, 1, 0, a, 1);
  OptimizerConfig o = plan.training.optimizer;
  o.clip_norm = 0;
  o.warmup_steps = 0;
  o.weight_decay = 0.5;
  o.min_lr = o.lr;  // constant lr
  Optimizer opt(o, store, a);
  auto [wu, w_at] = store.locate(0);  // the first linear's weight
  auto [bu, b_at] = store.locate(1);  // ... and its bias
  ASSERT_EQ(plan.model.params[1].name.substr(plan.model.params[1].name.size() - 4), "bias");
  const float before_w = store.params(wu).f()[w_at];
  const float before_b = store.params(bu).f()[b_at];
  for (int u = 0; u < store.units(); ++u)
    for (int64_t e = 0; e < store.grads(u).numel(); ++e) store.grads(u).f()[e] = 0.25f;
  opt.step(0, 10, *comm);
  const double step = o.lr * 1.0 / (1.0 + o.eps / 0.25);
  EXPECT_NEAR(store.params(wu).f()[w_at], before_w * (1 - o.lr * 0.5) - step, 1e-6);
  EXPECT_NEAR(store.params(bu).f()[b_at], before_b - step, 1e-6);  // no decay on biases
}

TEST(Clipping, ScalesTheGlobalNorm) {
  PlanDocument plan = make_plan("tiny-mlp", 1, 1.0);
  auto comm = make_single_communicator();
  Allocator a;
  ParamStore store(plan.model, plan.training, 1, 0, a, 1);
  OptimizerConfig o;
  o.kind = OptimizerKind::sgd;
  o.lr = 1.0;
  o.min_lr = 1.0;
  o.weight_decay = 0;
  o.clip_norm = 1.0;
  Optimizer opt(o, store, a);
  int64_t n = 0;
  for (int u = 0; u < store.units(); ++u) {
    for (int64_t e = 0; e < store.grads(u).numel(); ++e) store.grads(u).f()[e] = 3.0f;
    n += store.grads(u).numel();
  }
  const float before = store.params(0).f()[0];
  const double norm = opt.step(0, 1, *comm).grad_norm;
  EXPECT_NEAR(norm, 3.0 * std::sqrt(static_cast<double>(n)), 1e-3 * norm);
  // SGD moves by lr * g * (clip / norm): every element by 3 / norm.
  EXPECT_NEAR(before - store.params(0).f()[0], 3.0 / norm, 1e-6);
}

}  // namespace

// ---- bf16-mixed ----------------------------------------------------------------

// bf16-mixed (bf16 parameters, activations and gradients, fp32 master weights
// and moments) learns as fp32 does: the mean loss of steps 46-50 within 5% of
// the fp32 run's (plus 0.01 nats, for a task learned to ~0 in both), both well
// below step 1. Measured: cnn +0.3%, vit +1.3%, gpt -1.4%, mlp ~0 in both
// (docs/precision.md).
TEST(Bf16Mixed, LossAfterFiftyStepsIsCloseToFp32) {
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  for (const LearningCase& c : {LearningCase{"tiny-mlp", 16, 1e-2}, LearningCase{"tiny-cnn", 16, 1e-2},
                                LearningCase{"tiny-vit", 16, 3e-3}, LearningCase{"tiny-gpt", 32, 1e-2}}) {
    double late[2] = {0, 0}, first[2] = {0, 0};
    for (int bf16 = 0; bf16 < 2; ++bf16) {
      PlanRequest req;
      req.model = load_model(c.model);
      req.cluster.device = find_device("cpu");
      req.training.precision = bf16 ? Precision::bf16_mixed : Precision::fp32;
      req.training.micro_batch = c.micro_batch;
      req.training.optimizer.lr = c.lr;
      req.forced = Strategy::ddp;
      req.syncbn = SyncBnMode::off;
      Planning p = plan(req);
      const PlanDocument plan = plan_from_json(plan_json(p, *p.chosen()), c.model);
      TrainOptions opt;
      opt.steps = 50;
      Trainer t(plan, *comm, *backend, opt);
      std::vector<double> loss;
      for (int s = 0; s < opt.steps; ++s) loss.push_back(t.step().loss);
      first[bf16] = loss[0];
      late[bf16] = (loss[45] + loss[46] + loss[47] + loss[48] + loss[49]) / 5;
    }
    std::printf("%s: step 1 %.4f (bf16 %.4f), steps 46-50 fp32 %.5f, bf16 %.5f\n", c.model, first[0], first[1], late[0],
                late[1]);
    EXPECT_NEAR(late[1], late[0], 0.05 * late[0] + 0.01) << c.model;
    EXPECT_LE(late[1], 0.5 * first[1]) << c.model << ": bf16 did not learn";
    EXPECT_NE(late[1], late[0]) << c.model << ": the bf16 run is the fp32 run (control)";
  }
}
