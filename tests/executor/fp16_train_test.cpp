// fp16-mixed on the CPU engine, one process (docs/precision.md): fp16
// storage, fp32 arithmetic and master weights, dynamic loss scaling as
// torch.cuda.amp.GradScaler does it.
//  - it learns as fp32 does (the mean loss of steps 46-50 close to fp32's);
//  - a forced overflow (an initial scale of 2^40: every scaled gradient is
//    beyond fp16's 65504) skips the step -- every parameter byte and Adam's
//    count untouched -- and halves the scale, step after step, until the
//    gradients fit; then the parameters move;
//  - the scale grows by 2 after growth_interval clean steps;
//  - measured memory equals the plan's, category by category;
//  - a checkpoint carries the scale and Adam's count (fewer than the steps
//    when some were skipped), and a resumed run continues both.
// The multi-rank parity and the overflow flag across ranks are in
// mpi/fp16_parity.cpp.
#include "dlplan/error.hpp"
#include "dlplan/exec/backend.hpp"
#include "dlplan/exec/checkpoint.hpp"
#include "dlplan/exec/communicator.hpp"
#include "dlplan/exec/optimizer.hpp"
#include "dlplan/exec/trainer.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include <unistd.h>

using namespace dlplan;
using namespace dlplan::exec;

namespace {

PlanDocument fp16_plan(const std::string& model, int64_t micro_batch, double lr, Precision p = Precision::fp16_mixed,
                       double init_scale = 65536, int growth_interval = 2000, Strategy s = Strategy::ddp) {
  PlanRequest req;
  req.model = load_model(model);
  req.cluster.device = find_device("cpu");
  req.training.precision = p;
  req.training.micro_batch = micro_batch;
  req.training.optimizer.lr = lr;
  req.training.loss_scaling.init_scale = init_scale;
  req.training.loss_scaling.growth_interval = growth_interval;
  req.forced = s;
  req.syncbn = SyncBnMode::off;
  Planning plan_ = plan(req);
  return plan_from_json(plan_json(plan_, *plan_.chosen()), model + " fp16 plan");
}

struct Case {
  const char* model;
  int64_t micro_batch;
  double lr;
};

}  // namespace

TEST(Fp16Mixed, LossAfterFiftyStepsIsCloseToFp32) {
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  for (const Case& c : {Case{"tiny-mlp", 16, 1e-2}, Case{"tiny-cnn", 16, 1e-2}, Case{"tiny-vit", 16, 3e-3},
                        Case{"tiny-gpt", 32, 1e-2}}) {
    double late[2] = {0, 0}, first[2] = {0, 0};
    int skipped = 0;
    for (int fp16 = 0; fp16 < 2; ++fp16) {
      const PlanDocument plan = fp16_plan(c.model, c.micro_batch, c.lr, fp16 ? Precision::fp16_mixed : Precision::fp32);
      TrainOptions opt;
      opt.steps = 50;
      Trainer t(plan, *comm, *backend, opt);
      std::vector<double> loss;
      for (int s = 0; s < opt.steps; ++s) {
        const StepStats st = t.step();
        loss.push_back(st.loss);
        skipped += st.skipped;
      }
      first[fp16] = loss[0];
      late[fp16] = (loss[45] + loss[46] + loss[47] + loss[48] + loss[49]) / 5;
    }
    std::printf("%s: step 1 %.4f (fp16 %.4f), steps 46-50 fp32 %.5f, fp16 %.5f, %d step(s) skipped\n", c.model,
                first[0], first[1], late[0], late[1], skipped);
    EXPECT_NEAR(late[1], late[0], 0.05 * late[0] + 0.01) << c.model;
    EXPECT_LE(late[1], 0.5 * first[1]) << c.model << ": fp16 did not learn";
    EXPECT_NE(late[1], late[0]) << c.model << ": the fp16 run is the fp32 run (control)";
    EXPECT_LE(skipped, 10) << c.model;  // the default scale settles within a few halvings
  }
}

TEST(Fp16Mixed, OverflowSkipsTheStepAndHalvesTheScale) {
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  const double init = std::ldexp(1.0, 40);
  const PlanDocument plan = fp16_plan("tiny-gpt", 4, 1e-3, Precision::fp16_mixed, init);
  TrainOptions opt;
  opt.steps = 40;
  Trainer t(plan, *comm, *backend, opt);
  const std::vector<float> before = t.full_parameters();
  int skipped = 0;
  double scale = init;
  for (int s = 0; s < opt.steps; ++s) {
    const StepStats st = t.step();
    EXPECT_EQ(st.loss_scale, scale) << "step " << s + 1;
    if (!st.skipped) break;
    ++skipped;
    EXPECT_TRUE(std::isnan(st.grad_norm));
    // Nothing moved: every parameter byte, and Adam's count.
    EXPECT_EQ(t.full_parameters(), before) << "step " << s + 1;
    EXPECT_EQ(t.optimizer().steps_taken(), 0);
    scale /= 2;
    EXPECT_EQ(t.loss_scale().scale, scale);
    EXPECT_EQ(t.loss_scale().good_steps, 0);
  }
  // 2^40 times a gradient of ~1e-2 is ~1e10: about 18 halvings bring it under
  // 65504. At least the first step overflowed, and the run recovered.
  EXPECT_GE(skipped, 1);
  EXPECT_LT(skipped, opt.steps);
  EXPECT_EQ(t.optimizer().steps_taken(), 1);
  EXPECT_NE(t.full_parameters(), before);
  EXPECT_EQ(t.loss_scale().good_steps, 1);
}

TEST(Fp16Mixed, ScaleGrowsAfterTheIntervalOfCleanSteps) {
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  const PlanDocument plan = fp16_plan("tiny-mlp", 8, 1e-3, Precision::fp16_mixed, /*init_scale=*/1.0, /*growth_interval=*/2);
  TrainOptions opt;
  opt.steps = 5;
  Trainer t(plan, *comm, *backend, opt);
  std::vector<double> scales;
  for (int s = 0; s < opt.steps; ++s) {
    const StepStats st = t.step();
    EXPECT_FALSE(st.skipped);
    scales.push_back(st.loss_scale);
  }
  EXPECT_EQ(scales, (std::vector<double>{1, 1, 2, 2, 4}));
}

TEST(Fp16Mixed, MeasuredMemoryEqualsThePlans) {
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  for (const char* model : {"tiny-mlp", "tiny-cnn", "tiny-vit", "tiny-gpt"}) {
    const PlanDocument plan = fp16_plan(model, 4, 1e-3);
    TrainOptions opt;
    opt.steps = 3;
    Trainer t(plan, *comm, *backend, opt);
    for (int s = 0; s < opt.steps; ++s) t.step();
    const StepWalk w = walk_step(plan.model, plan.cluster, plan.training);
    EXPECT_EQ(t.allocator().peak(), w.peak) << model;
    for (Category c : kAllCategories)
      EXPECT_EQ(t.allocator().at_peak()[static_cast<size_t>(c)], w.at_peak[static_cast<size_t>(c)]) << model << " " << to_string(c);
    EXPECT_EQ(t.ledger_check().worst_bytes, 0) << model << " " << t.ledger_check().where;
    // Control: stored in 2 bytes. The fp32 plan of the same model keeps more.
    EXPECT_LT(w.peak, walk_step(plan.model, plan.cluster, fp16_plan(model, 4, 1e-3, Precision::fp32).training).peak);
  }
}

TEST(Fp16Mixed, CheckpointCarriesTheScaleAndAdamsCount) {
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / ("dlplan-fp16-ckpt-" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  // 2^30: the first steps overflow, so Adam's count falls behind the steps.
  const PlanDocument plan = fp16_plan("tiny-mlp", 8, 1e-3, Precision::fp16_mixed, std::ldexp(1.0, 30), 3);
  CheckpointRun run;
  run.total_steps = 30;
  TrainOptions opt;
  opt.steps = run.total_steps;
  LossScaleState saved;
  int adam = 0;
  std::vector<double> continued;
  {
    Trainer a(plan, *comm, *backend, opt);
    for (int s = 0; s < 20; ++s) a.step();
    save_checkpoint(dir, a, *comm, run);
    saved = a.loss_scale();
    adam = a.optimizer().steps_taken();
    for (int s = 20; s < 23; ++s) continued.push_back(a.step().loss_scale);
  }
  EXPECT_LT(adam, 20);  // some steps were skipped
  Trainer b(plan, *comm, *backend, opt);
  ASSERT_EQ(load_checkpoint(dir, b, *comm, run), 20);
  EXPECT_EQ(b.loss_scale().scale, saved.scale);
  EXPECT_EQ(b.loss_scale().good_steps, saved.good_steps);
  EXPECT_EQ(b.optimizer().steps_taken(), adam);
  std::vector<double> resumed;
  for (int s = 20; s < 23; ++s) resumed.push_back(b.step().loss_scale);
  EXPECT_EQ(resumed, continued);
  fs::remove_all(dir);
}

TEST(Fp16Mixed, OneRankOffloadStreamsEachUnitsGradientToTheHost) {
  // ZeRO-Offload on one GPU: zero2 + --offload optimizer keeps no gradient on
  // the device; each unit's goes down when backward completes it. Same
  // arithmetic as the plain run (fp32 here, so exactly comparable).
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  PlanRequest req;
  req.model = load_model("tiny-gpt");
  req.cluster.device = find_device("cpu");
  req.training.precision = Precision::fp32;
  req.training.micro_batch = 4;
  req.training.optimizer.lr = 1e-3;
  req.syncbn = SyncBnMode::off;
  req.forced = Strategy::ddp;
  Planning p0 = plan(req);
  const PlanDocument plain = plan_from_json(plan_json(p0, *p0.chosen()), "plain");
  req.forced = Strategy::zero2;
  req.training.offload = Offload::optimizer;
  Planning p1 = plan(req);
  const PlanDocument off = plan_from_json(plan_json(p1, *p1.chosen()), "offload");
  TrainOptions opt;
  opt.steps = 4;
  Trainer a(plain, *comm, *backend, opt), b(off, *comm, *backend, opt);
  for (int s = 0; s < opt.steps; ++s) {
    a.step();
    b.step();
  }
  const std::vector<float> x = a.full_parameters(), y = b.full_parameters();
  ASSERT_EQ(x.size(), y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
    den += static_cast<double>(x[i]) * x[i];
  }
  EXPECT_LE(std::sqrt(num / den), 1e-6);
  const StepWalk w = walk_step(off.model, off.cluster, off.training);
  EXPECT_EQ(b.allocator().at_peak()[static_cast<size_t>(Category::grads)], 0);
  EXPECT_EQ(b.allocator().peak(), w.peak);
  EXPECT_EQ(b.ledger_check().worst_bytes, 0) << b.ledger_check().where;
  EXPECT_GT(b.host_allocator().current()[static_cast<size_t>(Category::grads)], 0);
}
