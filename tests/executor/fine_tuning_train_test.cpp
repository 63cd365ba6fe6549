// Frozen parameters (--freeze, docs/fine-tuning.md) on the CPU engine, one
// process: the loss falls with part of the model frozen, no frozen byte
// moves, and the measured memory equals the plan's exactly (one rank: no
// collective timing), category by category -- the check that what the
// planner drops for frozen nodes (no backward, no kept input or context) is
// what the engine really skips. mpi/freeze_parity.cpp has the multi-rank
// parity. LoRA: only the adapters move, and the same accounting holds.
#include "dlplan/error.hpp"
#include "dlplan/exec/backend.hpp"
#include "dlplan/exec/checkpoint.hpp"
#include "dlplan/exec/communicator.hpp"
#include "dlplan/exec/trainer.hpp"
#include "dlplan/fine_tuning.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"
#include "dlplan/step_program.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>

#include <unistd.h>

using namespace dlplan;
using namespace dlplan::exec;

namespace {

PlanDocument fine_tuning_plan(const std::string& model, const FineTuning& f, int64_t micro_batch, double lr,
                              Strategy s = Strategy::ddp, Precision precision = Precision::fp32,
                              Checkpointing checkpointing = Checkpointing::none) {
  PlanRequest req;
  req.model = load_model(model);
  apply_fine_tuning(req.model, f);
  req.cluster.device = find_device("cpu");
  req.training.precision = precision;
  req.training.checkpointing = checkpointing;
  req.training.micro_batch = micro_batch;
  req.training.optimizer.lr = lr;
  req.training.fine_tuning = f;
  req.forced = s;
  req.syncbn = SyncBnMode::off;
  Planning p = plan(req);
  return plan_from_json(plan_json(p, *p.chosen()), model + " fine-tuning plan");
}

FineTuning frozen(std::vector<std::string> globs) {
  FineTuning f;
  f.freeze = std::move(globs);
  return f;
}

struct Case {
  const char* model;
  std::vector<std::string> freeze;
  int64_t micro_batch;
  double lr;
};

// Values that moved in training, trainable and frozen: full_parameters()
// lists per unit the trainable run, then the frozen run.
struct Moved {
  size_t trainable = 0, frozen = 0, total = 0;
};
Moved moved(const Model& m, const std::vector<float>& before, const std::vector<float>& after) {
  const std::vector<int64_t> T = unit_trainable_counts(m), F = unit_frozen_counts(m);
  Moved out;
  for (size_t u = 0; u < T.size(); ++u) {
    for (int64_t e = 0; e < T[u]; ++e, ++out.total) out.trainable += after.at(out.total) != before.at(out.total);
    for (int64_t e = 0; e < F[u]; ++e, ++out.total) out.frozen += after.at(out.total) != before.at(out.total);
  }
  return out;
}

// One rank: the measured peak and every category at it equal the plan's walk.
void expect_measured_equals_predicted(Trainer& t, const PlanDocument& plan, const std::string& label) {
  const StepWalk w = walk_step(plan.model, plan.cluster, plan.training);
  EXPECT_EQ(t.allocator().peak(), w.peak) << label;
  for (Category cat : kAllCategories)
    EXPECT_EQ(t.allocator().at_peak()[static_cast<size_t>(cat)], w.at_peak[static_cast<size_t>(cat)])
        << label << " " << to_string(cat);
}

}  // namespace

TEST(Freeze, LearnsMovesNoFrozenByteAndMeasuredEqualsPredicted) {
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  for (const Case& c : {Case{"tiny-gpt", {"wte", "wpe", "h.0.*"}, 32, 1e-2}, Case{"tiny-gpt", {"*.attn"}, 32, 1e-2},
                        Case{"tiny-cnn", {"blocks.0.*"}, 16, 1e-2}, Case{"tiny-vit", {"conv_proj"}, 16, 3e-3},
                        Case{"tiny-mlp", {"layers.0.*"}, 16, 1e-2},
                        // a frozen transposed convolution: dx without dW, its input not kept
                        Case{DLPLAN_SOURCE_DIR "/tests/fixtures/tiny-conv-transpose.json", {"up1"}, 16, 3e-2},
                        // a frozen LSTM layer: its gradient still runs back through every
                        // step to the embedding, but it keeps no input and makes no dW
                        Case{DLPLAN_SOURCE_DIR "/tests/fixtures/tiny-lstm.json", {"rnn2"}, 16, 3e-2},
                        // and a frozen bidirectional GRU layer, whose input is the embedding's
                        Case{DLPLAN_SOURCE_DIR "/tests/fixtures/tiny-gru.json", {"rnn1"}, 16, 3e-2},
                        Case{DLPLAN_SOURCE_DIR "/tests/fixtures/tiny-rnn.json", {"rnn1"}, 16, 3e-2}}) {
    const std::string label = std::string(c.model) + " --freeze " + c.freeze.front();
    const PlanDocument plan = fine_tuning_plan(c.model, frozen(c.freeze), c.micro_batch, c.lr);
    ASSERT_LT(plan.model.trainable_parameter_count(), plan.model.parameter_count()) << label;
    TrainOptions opt;
    opt.steps = 30;
    Trainer t(plan, *comm, *backend, opt);
    const std::vector<float> before = t.full_parameters();
    double first = 0, last = 0;
    for (int s = 0; s < opt.steps; ++s) {
      const StepStats st = t.step();
      if (s < 3) first += st.loss / 3;
      if (s >= opt.steps - 3) last += st.loss / 3;
    }
    // (Freezing GPT's wte also freezes its tied head: that case learns slowest.)
    EXPECT_LT(last, 0.95 * first) << label << ": the loss falls with part of the model frozen";
    const std::vector<float> after = t.full_parameters();
    const Moved mv = moved(plan.model, before, after);
    ASSERT_EQ(mv.total, after.size()) << label;
    EXPECT_EQ(mv.frozen, 0u) << label;
    EXPECT_GT(mv.trainable, 0u) << label;
    expect_measured_equals_predicted(t, plan, label);
  }
}

TEST(Freeze, FreezingThePrefixLowersTheMeasuredPeak) {
  // Against full training: freezing the embeddings and the first layer drops
  // what they kept for backward, measured.
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  int64_t peaks[2] = {0, 0};
  for (int f = 0; f < 2; ++f) {
    const PlanDocument plan = fine_tuning_plan("tiny-gpt", f ? frozen({"wte", "wpe", "h.0.*"}) : FineTuning{}, 32, 1e-2);
    TrainOptions opt;
    opt.steps = 2;
    Trainer t(plan, *comm, *backend, opt);
    t.step();
    t.step();
    peaks[f] = t.allocator().at_peak()[static_cast<size_t>(Category::activations)];
  }
  EXPECT_LT(peaks[1], peaks[0]);
}

TEST(Lora, OnlyAdaptersMoveTheLossFallsAndMeasuredEqualsPredicted) {
  // LoRA on tiny-gpt's attention (q, v; then every projection and the MLP's
  // linear nodes) and on tiny-mlp's linear nodes: the base is frozen, B
  // starts at zero (so step 0's loss is the base model's), the adapters learn.
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  struct LoraCase {
    const char* model;
    std::vector<std::string> targets;
    int64_t rank;
    double alpha;
  };
  for (const LoraCase& c : {LoraCase{"tiny-gpt", {"q", "v"}, 4, 8}, LoraCase{"tiny-gpt", {"q", "k", "v", "o", "*.mlp.*"}, 8, 0},
                            LoraCase{"tiny-mlp", {"layers.*"}, 4, 4}}) {
    FineTuning f;
    f.lora_rank = c.rank;
    f.lora_targets = c.targets;
    f.lora_alpha = c.alpha;
    const std::string label = std::string(c.model) + " --lora " + std::to_string(c.rank) + " on " + c.targets.back();
    const PlanDocument plan = fine_tuning_plan(c.model, f, 16, 3e-2);
    TrainOptions opt;
    opt.steps = 40;
    Trainer t(plan, *comm, *backend, opt);
    const std::vector<float> before = t.full_parameters();
    // The adapters add nothing at the start: the same loss as the base model.
    const PlanDocument base = fine_tuning_plan(c.model, FineTuning{}, 16, 1e-2);
    Trainer base_t(base, *comm, *backend, TrainOptions{});
    // Control: the same run with a learning rate of 1e-9 sees the same
    // batches; the adapters' learning is the difference at the end.
    const PlanDocument held_plan = fine_tuning_plan(c.model, f, 16, 1e-9);  // the trainer keeps a reference
    Trainer still(held_plan, *comm, *backend, opt);
    double last = 0, control = 0, base_first = base_t.step().loss;
    for (int s = 0; s < opt.steps; ++s) {
      const StepStats st = t.step();
      const double held = still.step().loss;
      if (s == 0) {
        EXPECT_NEAR(st.loss, base_first, 1e-5 * std::fabs(base_first)) << label;
      }
      if (s >= opt.steps - 5) last += st.loss / 5, control += held / 5;
    }
    EXPECT_LT(last, 0.985 * control) << label << ": the adapters learn (against the same batches untrained)";
    const std::vector<float> after = t.full_parameters();
    const Moved mv = moved(plan.model, before, after);
    ASSERT_EQ(mv.total, after.size()) << label;
    EXPECT_EQ(mv.frozen, 0u) << label << ": every base byte untouched";
    EXPECT_GT(mv.trainable, static_cast<size_t>(plan.model.trainable_parameter_count() / 2)) << label;
    expect_measured_equals_predicted(t, plan, label);
  }
}

TEST(Lora, CheckpointCarriesTheAdaptersAndAResumedRunIsBitExact) {
  // A LoRA run under fp16-mixed (so the loss scale rides along): saved after
  // 4 steps, resumed in a fresh trainer, 3 more steps equal the uninterrupted
  // run bit for bit. The checkpoint holds the adapters (and their Adam
  // state), not the frozen base, which the resumed run rebuilds from the seed.
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / ("dlplan-lora-ckpt-" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  FineTuning f;
  f.lora_rank = 4;
  f.lora_targets = {"q", "v", "*.mlp.c_fc"};
  PlanRequest req;
  req.model = load_model("tiny-gpt");
  apply_fine_tuning(req.model, f);
  req.cluster.device = find_device("cpu");
  req.training.precision = Precision::fp16_mixed;
  req.training.micro_batch = 4;
  req.training.optimizer.lr = 1e-2;
  req.training.fine_tuning = f;
  req.forced = Strategy::ddp;
  Planning p = plan(req);
  const PlanDocument doc = plan_from_json(plan_json(p, *p.chosen()), "lora fp16 plan");
  CheckpointRun run;
  run.total_steps = 7;
  TrainOptions opt;
  opt.steps = run.total_steps;
  std::vector<float> straight;
  double scale = 0;
  {
    Trainer a(doc, *comm, *backend, opt);
    for (int s = 0; s < 4; ++s) a.step();
    save_checkpoint(dir, a, *comm, run);
    scale = a.loss_scale().scale;
    for (int s = 4; s < 7; ++s) a.step();
    straight = a.full_parameters();
  }
  int step = -1;
  std::set<std::string> saved;
  for (const NamedTensor& t : read_checkpoint_tensors(dir, &step)) saved.insert(t.name);
  EXPECT_EQ(step, 4);
  std::set<std::string> adapters;
  for (const ParamInfo& pi : doc.model.params)
    if (pi.adapter) adapters.insert(pi.name);
  EXPECT_EQ(saved, adapters) << "the checkpoint holds exactly the adapters";

  Trainer b(doc, *comm, *backend, opt);
  ASSERT_EQ(load_checkpoint(dir, b, *comm, run), 4);
  EXPECT_EQ(b.loss_scale().scale, scale);
  for (int s = 4; s < 7; ++s) b.step();
  EXPECT_EQ(b.full_parameters(), straight);

  // The base came from the seed: resuming "from --init" weights is refused.
  CheckpointRun other = run;
  other.init = "base.safetensors";
  Trainer c(doc, *comm, *backend, opt);
  try {
    load_checkpoint(dir, c, *comm, other);
    ADD_FAILURE() << "resumed with another frozen base";
  } catch (const CheckpointError& e) {
    EXPECT_NE(e.detail().find("came from the seed"), std::string::npos) << e.what() << ": " << e.detail();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("came from the seed"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(FineTuning, MeasuredEqualsPredictedUnderMixedPrecisionAndCheckpointing) {
  // The other knobs a fine-tuning plan carries: bf16-/fp16-mixed storage and
  // activation checkpointing, whose recompute meets nodes without backward
  // (a frozen prefix inside a checkpointed unit) and LoRA's kept x A^T.
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  FineTuning lora;
  lora.lora_rank = 4;
  lora.lora_targets = {"q", "v", "o", "*.mlp.c_fc"};
  FineTuning prefix = frozen({"wte", "wpe", "h.0.*", "h.1.attn"});
  for (const FineTuning* f : {&lora, &prefix})
    for (Precision p : {Precision::bf16_mixed, Precision::fp16_mixed})
      for (Checkpointing c : {Checkpointing::none, Checkpointing::units}) {
        const std::string label = std::string(f->lora_rank > 0 ? "lora" : "freeze") + " " + to_string(p) + " " +
                                  to_string(c);
        const PlanDocument plan = fine_tuning_plan("tiny-gpt", *f, 8, 1e-3, Strategy::ddp, p, c);
        TrainOptions opt;
        opt.steps = 3;
        Trainer t(plan, *comm, *backend, opt);
        const std::vector<float> before = t.full_parameters();
        for (int s = 0; s < opt.steps; ++s) t.step();
        EXPECT_EQ(moved(plan.model, before, t.full_parameters()).frozen, 0u) << label;
        expect_measured_equals_predicted(t, plan, label);
      }
}
