// Every knob measured on one rank (knob_grid.hpp): the pairwise covering set
// and every single-knob change from the defaults; measured memory equals the
// plan's byte for byte, at the peak and after every op. mpi/knob_grid.cpp
// runs the same configurations at 2 and 4 ranks.
#include "knob_grid.hpp"

#include <gtest/gtest.h>

#include <cmath>

using namespace dlplan;
using namespace dlplan::exec;

namespace {

void run_all(const std::vector<knobs::Config>& configs) {
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  for (const auto& k : configs) {
    const knobs::Outcome o = knobs::run_config(k, *comm, *backend);
    EXPECT_TRUE(o.equal()) << knobs::describe(k) << ": " << knobs::mismatch(o);
    EXPECT_TRUE(std::isfinite(o.loss)) << knobs::describe(k);
  }
}

}  // namespace

TEST(KnobGrid, PairwiseCoveringSetIsWhatItClaims) {
  // Independent check of the generator: every required pair of levels appears.
  const auto set = knobs::pairwise();
  const auto& L = knobs::levels();
  for (int f1 = 0; f1 < knobs::kFactors; ++f1)
    for (int f2 = f1 + 1; f2 < knobs::kFactors; ++f2)
      for (int l1 = 0; l1 < static_cast<int>(L[f1].size()); ++l1)
        for (int l2 = 0; l2 < static_cast<int>(L[f2].size()); ++l2) {
          if (!knobs::pair_feasible(f1, l1, f2, l2)) continue;
          bool found = false;
          for (const auto& c : set) found |= c[f1] == l1 && c[f2] == l2;
          EXPECT_TRUE(found) << knobs::factor_name(f1) << "=" << L[f1][l1] << " with " << knobs::factor_name(f2) << "="
                             << L[f2][l2];
        }
  for (const auto& c : set) EXPECT_TRUE(knobs::feasible(c)) << knobs::describe(c);
  EXPECT_LT(set.size(), knobs::full_grid().size() / 20) << "a covering set, not the grid";
}

TEST(KnobGrid, EverySingleKnobChangeOnOneRankMeasuresAsPlanned) { run_all(knobs::single_knob_changes()); }

TEST(KnobGrid, PairwiseCoveringSetOnOneRankMeasuresAsPlanned) { run_all(knobs::pairwise()); }

// The fused cross-entropy (an IR attribute, not a plan knob): under every
// single knob change of the transformer models, measured memory equals the
// plan's, and the loss is the unfused loss (the same math, another kept set).
TEST(KnobGrid, FusedLossMeasuresAsPlannedAndLosesTheSame) {
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  int runs = 0;
  for (auto k : knobs::single_knob_changes()) {
    if (k[knobs::kModel] == 2) continue;  // syncbn's change runs the CNN
    for (int model : {0, 3}) {            // tiny-gpt, tiny-vit
      k[knobs::kModel] = model;
      const knobs::Outcome fused = knobs::run_config(k, *comm, *backend, 2, 0, true);
      const knobs::Outcome plain = knobs::run_config(k, *comm, *backend, 2, 0, false);
      EXPECT_TRUE(fused.equal()) << knobs::describe(k) << ": " << knobs::mismatch(fused);
      EXPECT_NEAR(fused.loss, plain.loss, 1e-5 * std::fabs(plain.loss)) << knobs::describe(k);
      ++runs;
    }
  }
  EXPECT_GT(runs, 10);
}

// The GPU's rounding to 512 B blocks, on the CPU: every allocation of the
// program (model states tensor by tensor included) predicted as rounded.
// Control: the same runs planned without rounding measure more than predicted.
TEST(KnobGrid, AllocationsRoundedLikeAGpuAreAsPlanned) {
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  for (const auto& k : knobs::single_knob_changes()) {
    const knobs::Outcome o = knobs::run_config(k, *comm, *backend, 2, 512);
    EXPECT_TRUE(o.equal()) << knobs::describe(k) << ": " << knobs::mismatch(o);
  }
  const knobs::Config defaults{};
  const PlanDocument unrounded = knobs::plan_of(defaults, 1);
  TrainOptions opt;
  opt.steps = 2;
  Trainer t(unrounded, *comm, *backend, opt, std::make_unique<knobs::RoundingHostMemory>(512));
  for (int s = 0; s < opt.steps; ++s) t.step();
  EXPECT_GT(t.allocator().peak(), walk_step(unrounded.model, unrounded.cluster, unrounded.training).peak);
}

// The ops real exports brought under every single knob change: measured
// memory equals the plan's, at the peak and after every op, on the CPU engine
// that trains them. tests/fixtures/tiny-se.json has hardswish, hardsigmoid,
// clip, concat, a broadcasting mul, keepdims and ceil-mode pooling (MobileNetV3,
// DenseNet, SqueezeNet); tiny-convnext.json has ConvNeXt's transposes around
// its LayerNorms and its learned layer scale; tiny-shuffle.json ShuffleNetV2's
// channel split (slice) and channel shuffle (reshape, transpose, reshape);
// tiny-bert-tokentype.json is the IR dlplan imports from
// tests/fixtures/exports/weights/tiny-bert-opset17.onnx (sequence 16): BERT's
// token-type row (pos_embedding with `row`) beside its position table.
TEST(KnobGrid, RealExportOpsMeasureAsPlannedUnderEveryKnob) {
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  for (const std::string fixture : {"tiny-se", "tiny-convnext", "tiny-shuffle", "tiny-bert-tokentype"}) {
    const bool has_batchnorm = fixture == "tiny-se" || fixture == "tiny-shuffle";
    int runs = 0;
    for (auto k : knobs::single_knob_changes()) {
      if (k[knobs::kModel] != 0 && k[knobs::kSyncBn] == 0) continue;  // a change of model: the fixture is the model
      if (k[knobs::kSyncBn] != 0 && !has_batchnorm) continue;       // SyncBN's change needs BatchNorm
      k[knobs::kModel] = 0;
      const knobs::Outcome o = knobs::run_config(k, *comm, *backend, 2, 0, false,
                                                 DLPLAN_SOURCE_DIR "/tests/fixtures/" + fixture + ".json");
      EXPECT_TRUE(o.equal()) << fixture << " " << knobs::describe(k) << ": " << knobs::mismatch(o);
      EXPECT_TRUE(std::isfinite(o.loss)) << fixture << " " << knobs::describe(k);
      ++runs;
    }
    EXPECT_GT(runs, 10) << fixture;
  }
}
