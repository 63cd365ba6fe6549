// calibrate() over MPI (ctest runs it at 2 and 4 ranks): the profile carries
// a ladder for each collective the strategies use, measured over these
// ranks, its sizes those calibrate sends (4^k floats, rounded up to a
// multiple of the ranks where the collective shards), its times positive and
// never falling as the size grows; the simulator prices a collective of a
// rung's size at the rung's time for this group and keeps the model for
// another; the ladders survive the profile's JSON. Without --model the
// profile carries the op curves of the small zoo's sweep, measured with these
// ranks per node, and its band is the worst of the held-back models' errors
// (each sweep model at each micro-batch once). Every rank checks
// (parity::Checks); the failures are summed over the world.
#include "dlplan/collective_costs.hpp"
#include "dlplan/comm_model.hpp"
#include "dlplan/exec/backend.hpp"
#include "dlplan/exec/calibrate.hpp"
#include "dlplan/exec/communicator.hpp"
#include "dlplan/exec/device.hpp"
#include "dlplan/op_costs.hpp"
#include "parity_checks.hpp"

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

using namespace dlplan;
using namespace dlplan::exec;

namespace {

parity::Checks g_checks;

void check(bool ok, const std::string& what) { g_checks.expect(ok, what); }

void test_profile(Communicator& comm) {
  auto backend = make_cpu_backend();
  const Calibration cal = calibrate(comm, *backend, nullptr, 8);
  const int n = comm.size();
  const auto& table = cal.cluster.collective_costs;
  check(table != nullptr, "the profile carries collective_costs");
  if (!table) return;
  check(table->ranks == n, "measured over " + std::to_string(n) + " ranks (got " + std::to_string(table->ranks) + ")");
  check(table->ladders.size() == 3, "three ladders: all-reduce, reduce-scatter, all-gather");
  for (const CollectiveLadder& l : table->ladders) {
    const std::string name = to_string(l.op);
    // The sizes calibrate sends: 4^k floats, k = 0 ... 11; reduce-scatter's
    // and all-gather's rounded up to a multiple of the ranks, once each.
    std::vector<double> sizes;
    for (double floats = 1; floats <= 4194304; floats *= 4) {
      const double bytes = l.op == Collective::AllReduce ? 4 * floats : 4 * std::ceil(floats / n) * n;
      if (sizes.empty() || bytes > sizes.back()) sizes.push_back(bytes);
    }
    check(l.rungs.size() == sizes.size(), name + ": " + std::to_string(sizes.size()) + " rungs, 4 B to 16 MiB (got " +
                                              std::to_string(l.rungs.size()) + ")");
    for (size_t i = 0; i < std::min(l.rungs.size(), sizes.size()); ++i) {
      const std::string at = name + "[" + std::to_string(i) + "]";
      const double want = sizes[i];
      check(l.rungs[i].bytes == want, at + " bytes " + std::to_string(l.rungs[i].bytes) + ", sent " + std::to_string(want));
      check(l.rungs[i].seconds > 1e-8 && l.rungs[i].seconds < 10, at + " seconds in (10 ns, 10 s)");
      if (i > 0) check(l.rungs[i].seconds >= l.rungs[i - 1].seconds, at + " no faster than the rung before");
      // The simulator's price for this group is the rung's own time.
      const CollectiveCost c = collective_cost(cal.cluster, l.op, l.rungs[i].bytes, n);
      check(c.seconds == l.rungs[i].seconds && c.algorithm == "measured", at + ": the simulator reads the rung");
    }
  }
  // A group of another size keeps the alpha-beta model of the all-reduce fit.
  if (n > 2) {
    const CollectiveCost c = collective_cost(cal.cluster, Collective::AllReduce, 1 << 20, 2);
    check(c.algorithm != "measured", "a group of 2 of " + std::to_string(n) + " ranks is priced by the model");
  }
  const Cluster back = cluster_from_json(cluster_to_json(cal.cluster), "profile.json");
  check(back.collective_costs && back.collective_costs->ladders.size() == table->ladders.size(), "the ladders round-trip");
  if (back.collective_costs)
    for (size_t k = 0; k < table->ladders.size(); ++k)
      for (size_t i = 0; i < table->ladders[k].rungs.size(); ++i)
        check(back.collective_costs->ladders[k].rungs[i].seconds == table->ladders[k].rungs[i].seconds,
              "rung " + std::to_string(i) + " of ladder " + std::to_string(k) + " round-trips");

  const auto& costs = cal.cluster.op_costs;
  check(costs != nullptr, "the profile carries op_costs (the curves)");
  if (!costs) return;
  check(costs->ops.empty(), "no op rows without --model");
  check(costs->ranks_per_node == comm.local_size(), "curves measured with these ranks per node");
  check(costs->optimizer_bytes_per_s > 0, "the optimizer's rate measured");
  auto has = [&](const std::string& kind, Phase ph) {
    return std::any_of(costs->curves.begin(), costs->curves.end(), [&](const OpCostCurve& c) {
      return c.kind == kind && c.phase == ph && c.samples >= static_cast<int>(kMinCurveSamples);
    });
  };
  for (const char* kind : {"linear", "conv2d", "layernorm", "*gemm", "*memory"})
    for (Phase ph : {Phase::forward, Phase::backward})
      check(has(kind, ph), std::string("a ") + kind + " " + to_string(ph) + " curve");
  const size_t runs = std::size(kCurveSweepModels) * std::size(kCurveSweepMicroBatches);
  check(cal.curve_checks.size() == runs, "every sweep run held back once");
  double worst = 0.01;
  for (const CurveCheck& k : cal.curve_checks) {
    check(k.measured_s > 0 && k.predicted_s > 0, k.model + ": its ops timed and predicted");
    worst = std::max(worst, std::fabs(k.error()));
  }
  check(cal.cluster.device.time_uncertainty == std::min(std::ceil(worst * 100) / 100, kMaxTimeUncertainty),
        "the band is the worst held-back error, at most kMaxTimeUncertainty");
  check(back.op_costs && back.op_costs->curves.size() == costs->curves.size(), "the curves round-trip");
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<Communicator> c;
  try {
    c = make_communicator(&argc, &argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "calibrate_profile: %s\n", e.what());
    return 2;
  }
  try {
    test_profile(*c);
  } catch (const std::exception& e) {
    c->abort(std::string("calibrate_profile: unexpected exception: ") + e.what());
  }
  double counts[2] = {static_cast<double>(g_checks.passed), static_cast<double>(g_checks.failed)};
  c->all_reduce_doubles(counts, 2);
  if (c->rank() == 0)
    std::printf("calibrate_profile at %d ranks: %.0f passed, %.0f failed (checks summed over ranks)\n", c->size(),
                counts[0], counts[1]);
  const bool ok = counts[1] == 0;
  c.reset();  // finalizes MPI
  return ok ? 0 : 1;
}
