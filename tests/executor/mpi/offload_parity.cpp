// CPU offload on the CPU engine, under mpiexec (2 and 4 ranks; ctest runs both).
//  - parity: each (strategy, --offload) trains, 6 steps, to the same
//    parameters as the same plan without offload (rel L2 <= 1e-6: the host
//    does the same fp32 arithmetic) and as one rank on the global batch
//    (<= 1e-5), with and without accumulation (A = 3). hsdp2 and hsdp3 run
//    at N = 4 as 2 "nodes" x 2 (their shard group), the cross-group
//    all-reduce then on the host's fp32 shards.
//  - memory, measured apart: the device pool's peak and every category at
//    it against the planner's walk (3% or 64 KiB, as train_parity), and the
//    host pool's bytes per category equal to host_states() exactly (the
//    trainer allocates host_state_tensors one by one).
//  - control: offload moved bytes: the device's optimizer category is 0
//    and the host's is not.
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
using parity::relative_l2;

namespace {

std::vector<float> train(const PlanDocument& plan, Communicator& comm, Backend& backend, int steps,
                         Checks* checks = nullptr) {
  TrainOptions opt;
  opt.steps = steps;
  Trainer t(plan, comm, backend, opt);
  for (int s = 0; s < steps; ++s) t.step();
  if (checks) {
    const std::string label = fmt::format("{} {} offload {} x{} rank {}", plan.model.name, to_string(plan.training.strategy),
                                          to_string(plan.training.offload), plan.training.grad_accum, comm.rank());
    parity::expect_device_memory(*checks, t, plan, label + " device");
    const CategoryBytes host = t.host_allocator().max_each();
    const CategoryBytes host_want = host_states(plan.model, comm.size(), plan.training);
    for (Category c : kAllCategories)
      checks->expect(host[static_cast<size_t>(c)] == host_want[static_cast<size_t>(c)],
                     fmt::format("{}: host {} {} = predicted {}", label, to_string(c), host[static_cast<size_t>(c)],
                                 host_want[static_cast<size_t>(c)]));
    const auto opt_bytes = static_cast<size_t>(Category::optimizer);
    checks->expect(t.allocator().max_each()[opt_bytes] == 0 && host[opt_bytes] > 0,
                   fmt::format("{}: the optimizer state is on the host only (device {}, host {})", label,
                               t.allocator().max_each()[opt_bytes], host[opt_bytes]));
  }
  return t.full_parameters();
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
  const std::vector<std::pair<Strategy, Offload>> cases = {
      {Strategy::zero1, Offload::optimizer}, {Strategy::zero2, Offload::optimizer}, {Strategy::zero3, Offload::optimizer},
      {Strategy::zero3, Offload::params},    {Strategy::hsdp2, Offload::optimizer}, {Strategy::hsdp3, Offload::params}};

  try {
    for (const std::string model : {"tiny-gpt", "tiny-cnn", "tiny-mlp"})
      for (const int64_t A : {int64_t{1}, int64_t{3}}) {
        std::vector<float> ref;
        if (root) ref = train(parity::make_plan(model, 1, N * b, A, Strategy::ddp, false), *single, *backend, steps);
        for (const auto& [s, off] : cases) {
          const std::vector<float> plain = train(parity::make_plan(model, N, b, A, s, model == "tiny-cnn"), *comm, *backend, steps);
          const std::vector<float> got = train(parity::make_plan(model, N, b, A, s, model == "tiny-cnn", off), *comm, *backend, steps, &checks);
          if (!root) continue;
          const double d = relative_l2(got, plain), d1 = relative_l2(got, ref);
          checks.expect(d <= 1e-6, fmt::format("{} {} --offload {} x{} on {} ranks = without offload: rel L2 {:.2e}",
                                               model, to_string(s), to_string(off), A, N, d));
          checks.expect(d1 <= 1e-5, fmt::format("{} {} --offload {} x{} on {} ranks = one rank on the global batch: "
                                                "rel L2 {:.2e}",
                                                model, to_string(s), to_string(off), A, N, d1));
        }
      }
    // One rank: any ZeRO stage with offload is the whole model on the host.
    if (root) {
      const std::vector<float> plain = train(parity::make_plan("tiny-gpt", 1, b, 1, Strategy::ddp, false), *single, *backend, steps);
      const std::vector<float> got =
          train(parity::make_plan("tiny-gpt", 1, b, 1, Strategy::zero2, false, Offload::optimizer), *single, *backend, steps, &checks);
      const double d = relative_l2(got, plain);
      checks.expect(d <= 1e-6, fmt::format("tiny-gpt zero2 --offload optimizer on one rank = ddp: rel L2 {:.2e}", d));
    }
  } catch (const std::exception& e) {
    comm->abort(fmt::format("offload_parity: {}", e.what()));
  }

  double counts[2] = {static_cast<double>(checks.passed), static_cast<double>(checks.failed)};
  comm->all_reduce_doubles(counts, 2);
  if (root) fmt::print("{} passed, {} failed\n", static_cast<int>(counts[0]), static_cast<int>(counts[1]));
  return counts[1] == 0 ? 0 : 1;
}
