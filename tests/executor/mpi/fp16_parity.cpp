// fp16-mixed on the CPU engine under mpiexec (2 and 4 ranks; ctest runs both).
//  - parity: every strategy on N ranks x micro-batch b, 8 steps, against one
//    rank on the global batch N x b, both in fp16-mixed with a scale that
//    does not overflow (2^10): relative L2 <= 2e-3. fp16 keeps 11 significant
//    bits; the ranks' partial gradients are summed in fp16 in another order
//    than one rank's, so the runs agree to fp16's rounding, not bit for bit.
//    Controls: one rank with another seed is far beyond that tolerance, and
//    the N-rank fp16 run is not the fp32 one (it really stored in fp16).
//  - memory: the measured peak and every category against the planner's
//    walk (3% or 64 KiB, as train_parity).
//  - overflow across ranks: with an initial scale of 2^40 every rank's
//    gradients overflow; under ZeRO-2/3 each rank checks only its own shard,
//    so only the flag summed over all ranks can make every rank skip alike.
//    Every rank skips the first step (no parameter byte moves), every rank
//    halves its scale, and all ranks agree on the scale and on the skipped
//    steps until the gradients fit, after which they train as one.
// Prints "N passed, M failed" (rank 0) and exits non-zero on any failure.
#include "dlplan/exec/device.hpp"
#include "dlplan/exec/backend.hpp"
#include "dlplan/exec/communicator.hpp"
#include "dlplan/exec/trainer.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"

#include "parity_checks.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>

using namespace dlplan;
using namespace dlplan::exec;
using parity::Checks;
using parity::make_plan;
using parity::relative_l2;

namespace {

constexpr double kNoOverflow = 1024.0;  // 2^10

std::vector<float> train(const PlanDocument& plan, Communicator& comm, Backend& backend, int steps,
                         Checks* memory_checks = nullptr, int* skipped = nullptr, uint64_t seed = 1) {
  TrainOptions opt;
  opt.steps = steps;
  opt.seed = seed;
  Trainer t(plan, comm, backend, opt);
  for (int s = 0; s < steps; ++s) {
    const StepStats st = t.step();
    if (skipped) *skipped += st.skipped;
  }
  if (memory_checks)
    parity::expect_device_memory(*memory_checks, t, plan,
                                 fmt::format("fp16 {} {} rank {}", plan.model.name, to_string(plan.training.strategy),
                                             comm.rank()));
  return t.full_parameters();
}

// Every rank's value of x summed: all agree iff the sum is N times rank 0's.
bool all_agree(Communicator& comm, double x) {
  double v[2] = {x, x * x};
  comm.all_reduce_doubles(v, 2);
  const double n = comm.size(), mean = v[0] / n;
  return std::fabs(v[1] / n - mean * mean) <= 1e-12 * std::max(1.0, mean * mean);
}

}  // namespace

int main(int argc, char** argv) {
  auto comm = make_communicator(&argc, &argv);
  auto backend = make_cpu_backend();
  const int N = comm->size();
  const bool root = comm->rank() == 0;
  const int steps = 8;
  const int64_t b = 2;
  Checks checks;
  checks.verbose = std::getenv("DLPLAN_VERBOSE") != nullptr;
  auto single = make_single_communicator();
  const Precision fp16 = Precision::fp16_mixed;

  try {
    for (const std::string model : {"tiny-mlp", "tiny-cnn", "tiny-vit", "tiny-gpt"}) {
      const bool bn = model == "tiny-cnn";
      std::vector<float> ref, other_seed;
      const PlanDocument one = make_plan(model, 1, N * b, 1, Strategy::ddp, false, Offload::none, fp16, kNoOverflow);
      if (root) {
        ref = train(one, *single, *backend, steps);
        other_seed = train(one, *single, *backend, steps, nullptr, nullptr, 2);
        const double d = relative_l2(other_seed, ref);
        checks.expect(d > 10 * 2e-3, fmt::format("{}: another seed is far from the reference ({:.2e})", model, d));
      }
      for (Strategy s : {Strategy::ddp, Strategy::zero1, Strategy::zero2, Strategy::zero3}) {
        int skipped = 0;
        const std::vector<float> got = train(make_plan(model, N, b, 1, s, bn, Offload::none, fp16, kNoOverflow), *comm,
                                             *backend, steps, &checks, &skipped);
        const std::vector<float> got32 = train(make_plan(model, N, b, 1, s, bn), *comm, *backend, steps);
        checks.expect(skipped == 0, fmt::format("{} {} fp16: no step skipped at scale 2^10 ({})", model, to_string(s), skipped));
        if (!root) continue;
        const double d = relative_l2(got, ref), stored = relative_l2(got, got32);
        checks.expect(d <= 2e-3, fmt::format("{} {} fp16 on {} ranks = one rank on the global batch: rel L2 {:.2e}",
                                             model, to_string(s), N, d));
        checks.expect(stored > 0, fmt::format("{} {}: the fp16 run differs from the fp32 one ({:.2e})", model,
                                              to_string(s), stored));
      }
    }

    // Overflow: every rank skips together, and the scales agree.
    for (Strategy s : {Strategy::ddp, Strategy::zero2, Strategy::zero3}) {
      const PlanDocument plan = make_plan("tiny-gpt", N, b, 1, s, false, Offload::none, fp16, std::ldexp(1.0, 40));
      TrainOptions opt;
      opt.steps = 40;
      Trainer t(plan, *comm, *backend, opt);
      const std::vector<float> before = t.full_parameters();
      const StepStats first = t.step();
      checks.expect(first.skipped, fmt::format("{} rank {}: the first step at 2^40 is skipped", to_string(s), comm->rank()));
      checks.expect(t.full_parameters() == before,
                    fmt::format("{} rank {}: no parameter byte moved in the skipped step", to_string(s), comm->rank()));
      checks.expect(t.loss_scale().scale == std::ldexp(1.0, 39),
                    fmt::format("{} rank {}: the scale halved to 2^39 ({})", to_string(s), comm->rank(), t.loss_scale().scale));
      int skipped = 1, taken = 0;
      bool agree = true;
      for (int k = 1; k < opt.steps && taken < 3; ++k) {
        const StepStats st = t.step();
        skipped += st.skipped;
        taken += !st.skipped;
        agree = agree && all_agree(*comm, st.skipped ? 1.0 : 0.0) && all_agree(*comm, st.loss_scale);
      }
      checks.expect(agree, fmt::format("{} rank {}: every rank skipped the same steps at the same scales", to_string(s),
                                       comm->rank()));
      checks.expect(taken == 3, fmt::format("{} rank {}: training resumed after {} skipped steps", to_string(s),
                                            comm->rank(), skipped));
      checks.expect(t.optimizer().steps_taken() == taken,
                    fmt::format("{} rank {}: Adam counted only the steps taken", to_string(s), comm->rank()));
    }
  } catch (const std::exception& e) {
    comm->abort(fmt::format("fp16_parity: {}", e.what()));
  }

  double tally[2] = {static_cast<double>(checks.passed), static_cast<double>(checks.failed)};
  comm->all_reduce_doubles(tally, 2);
  if (root) fmt::print("{} passed, {} failed\n", static_cast<int>(tally[0]), static_cast<int>(tally[1]));
  return tally[1] > 0 ? 1 : 0;
}
