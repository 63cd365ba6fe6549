// Frozen parameters and LoRA (--freeze, --lora; docs/fine-tuning.md) on the
// CPU engine under mpiexec (2 and 4 ranks; ctest runs both):
//  - parity: every strategy on N ranks x micro-batch b, 6 steps, against one
//    rank on the global batch N x b, fp32: relative L2 <= 1e-5 (as
//    train_parity). Frozen parameters are sharded under zero3 and gathered
//    with their unit, so zero3 exercises the second gather;
//  - every frozen byte untouched: the frozen runs equal the initial ones bit
//    for bit after training, on every rank, while the trainable ones moved;
//  - memory: the measured peak and every category against the planner's
//    walk (3% or 64 KiB, as train_parity).
// The freezes cover the frozen prefix (nodes without backward), frozen
// linear, convolution and attention nodes whose inputs still need gradients
// (they keep no input; attention keeps no context), and frozen norms; LoRA
// on attention's projections and on linear nodes, whose base is frozen.
// Prints "N passed, M failed" (rank 0) and exits non-zero on any failure.
#include "dlplan/exec/device.hpp"
#include "dlplan/exec/backend.hpp"
#include "dlplan/exec/communicator.hpp"
#include "dlplan/exec/trainer.hpp"
#include "dlplan/step_program.hpp"

#include "parity_checks.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>

using namespace dlplan;
using namespace dlplan::exec;
using parity::Checks;
using parity::make_plan;
using parity::relative_l2;

namespace {

struct Case {
  const char* model;
  std::vector<std::string> freeze;
  int64_t lora_rank = 0;
  std::vector<std::string> lora_targets = {};
};

FineTuning fine_tuning(const Case& c) {
  FineTuning f;
  f.freeze = c.freeze;
  f.lora_rank = c.lora_rank;
  f.lora_targets = c.lora_targets;
  return f;
}

// Which entries of Trainer::full_parameters() are frozen: per unit its
// trainable run, then its frozen run (ParamStore::snapshot_full_params).
std::vector<bool> frozen_mask(const Model& m) {
  std::vector<bool> mask;
  const std::vector<int64_t> T = unit_trainable_counts(m), F = unit_frozen_counts(m);
  for (size_t u = 0; u < T.size(); ++u) {
    mask.insert(mask.end(), static_cast<size_t>(T[u]), false);
    mask.insert(mask.end(), static_cast<size_t>(F[u]), true);
  }
  return mask;
}

}  // namespace

int main(int argc, char** argv) {
  auto comm = make_communicator(&argc, &argv);
  auto backend = make_cpu_backend();
  const int N = comm->size();
  const bool root = comm->rank() == 0;
  const int steps = 6;
  const int64_t b = 2;
  Checks checks;
  checks.verbose = std::getenv("DLPLAN_VERBOSE") != nullptr;
  auto single = make_single_communicator();

  try {
    for (const Case& f : {Case{"tiny-gpt", {"wte", "wpe", "h.0.*"}}, Case{"tiny-gpt", {"*.attn", "h.1.mlp.c_fc"}},
                          Case{"tiny-cnn", {"blocks.0.*"}}, Case{"tiny-cnn", {"blocks.1.conv", "head"}},
                          Case{"tiny-vit", {"conv_proj", "class_token", "encoder.pos_embedding"}},
                          Case{"tiny-mlp", {"layers.1.*"}}, Case{"tiny-gpt", {}, 4, {"q", "v", "o", "*.mlp.c_fc"}},
                          Case{"tiny-vit", {}, 4, {"q", "k", "v"}}}) {
      const FineTuning ft = fine_tuning(f);
      const std::string label =
          f.lora_rank > 0 ? fmt::format("{} --lora {} --lora-targets {}", f.model, f.lora_rank, fmt::join(f.lora_targets, ","))
                          : fmt::format("{} --freeze {}", f.model, fmt::join(f.freeze, ","));
      std::vector<float> ref;
      const PlanDocument one = make_plan(f.model, 1, N * b, 1, Strategy::ddp, false, Offload::none, Precision::fp32,
                                         65536.0, ft);
      const std::vector<bool> mask = frozen_mask(one.model);
      if (root) {
        TrainOptions opt;
        opt.steps = steps;
        Trainer t(one, *single, *backend, opt);
        const std::vector<float> before = t.full_parameters();
        for (int s = 0; s < steps; ++s) t.step();
        ref = t.full_parameters();
        size_t frozen_moved = 0, trainable_moved = 0;
        for (size_t i = 0; i < ref.size() && i < mask.size(); ++i)
          (mask[i] ? frozen_moved : trainable_moved) += ref[i] != before[i];
        checks.expect(mask.size() == ref.size(), fmt::format("{}: the frozen mask covers every parameter", label));
        checks.expect(frozen_moved == 0, fmt::format("{}: one rank, {} frozen values moved", label, frozen_moved));
        checks.expect(trainable_moved > 0, fmt::format("{}: one rank, the trainable ones moved ({})", label, trainable_moved));
      }
      for (Strategy s : {Strategy::ddp, Strategy::zero1, Strategy::zero2, Strategy::zero3, Strategy::hsdp3}) {
        // BatchNorm normalizes over the global batch only with SyncBN (as train_parity).
        const bool bn = std::string(f.model) == "tiny-cnn";
        const PlanDocument plan = make_plan(f.model, N, b, 1, s, bn, Offload::none, Precision::fp32, 65536.0, ft);
        TrainOptions opt;
        opt.steps = steps;
        Trainer t(plan, *comm, *backend, opt);
        const std::vector<float> before = t.full_parameters();
        for (int k = 0; k < steps; ++k) t.step();
        const std::vector<float> got = t.full_parameters();
        parity::expect_device_memory(checks, t, plan, fmt::format("{} {} rank {}", label, to_string(s), comm->rank()));
        size_t frozen_moved = 0;
        for (size_t i = 0; i < got.size() && i < mask.size(); ++i) frozen_moved += mask[i] && got[i] != before[i];
        checks.expect(frozen_moved == 0, fmt::format("{} {} rank {}: every frozen byte untouched ({} moved)", label,
                                                     to_string(s), comm->rank(), frozen_moved));
        if (!root) continue;
        const double d = relative_l2(got, ref);
        checks.expect(d <= 1e-5, fmt::format("{} {} on {} ranks = one rank on the global batch: rel L2 {:.2e}", label,
                                             to_string(s), N, d));
      }
    }
  } catch (const std::exception& e) {
    comm->abort(fmt::format("fine_tuning_parity: {}", e.what()));
  }

  double tally[2] = {static_cast<double>(checks.passed), static_cast<double>(checks.failed)};
  comm->all_reduce_doubles(tally, 2);
  if (root) fmt::print("{} passed, {} failed\n", static_cast<int>(tally[0]), static_cast<int>(tally[1]));
  return tally[1] > 0 ? 1 : 0;
}
