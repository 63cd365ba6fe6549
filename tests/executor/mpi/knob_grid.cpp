// Every knob measured on N ranks (ctest: 2 and 4; knob_grid.hpp): the
// pairwise covering set and every single-knob change from the defaults, each
// a few steps of a tiny model on the CPU engine; on every rank the measured
// memory equals the plan's byte for byte, at the peak and after every op.
// Rank 0 prints "N passed, M failed"; every rank exits non-zero on a failure.
// Then every single-knob change again on tests/fixtures/tiny-shared.json,
// whose second block applies the first's parameters (`shares`): one set of
// parameters in the root unit that both blocks' backwards add into, sharded
// and gathered once.
// And on tiny-mixtral with each expert a unit of its own (--expert-units):
// under ZeRO-3 each expert gathered inside its layer's unit, its gradient
// reduce-scattered on its own.
// And on tests/fixtures/tiny-conv1d.json: 1-D convolutions (four, so oneDNN
// runs them in fp32; one grouped and dilated), BatchNorm1d (with the SyncBN
// knob too) and 1-D pooling.
#include "../knob_grid.hpp"

#include <fmt/format.h>

#include <cmath>

using namespace dlplan;
using namespace dlplan::exec;

int main(int argc, char** argv) {
  auto comm = make_communicator(&argc, &argv);
  auto backend = make_cpu_backend();
  std::vector<knobs::Config> configs = knobs::single_knob_changes();
  const auto pairs = knobs::pairwise();
  configs.insert(configs.end(), pairs.begin(), pairs.end());
  std::vector<std::string> models(configs.size());  // "": the grid's own model knob
  std::vector<bool> expert_units(configs.size(), false);
  struct ModelFile {
    const char* path;
    bool expert_units, batchnorm;  // batchnorm: the SyncBN knob applies
  };
  for (const ModelFile& f : {ModelFile{"/tests/fixtures/tiny-shared.json", false, false},
                             ModelFile{"/tests/fixtures/hf/tiny-mixtral.json", true, false},
                             ModelFile{"/tests/fixtures/tiny-conv1d.json", false, true}})
    for (const auto& k : knobs::single_knob_changes())
      if (k[knobs::kModel] == 0 && (k[knobs::kSyncBn] == 0 || f.batchnorm)) {  // the model is the file
        configs.push_back(k);
        models.push_back(std::string(DLPLAN_SOURCE_DIR) + f.path);
        expert_units.push_back(f.expert_units);
      }
  double failed = 0, passed = 0;
  for (size_t c = 0; c < configs.size(); ++c) {
    const auto& k = configs[c];
    knobs::Outcome o;
    bool ok = false;
    try {
      o = knobs::run_config(k, *comm, *backend, 3, 0, false, models[c], {}, expert_units[c]);
      ok = o.equal() && std::isfinite(o.loss);
    } catch (const std::exception& e) {
      fmt::print(stderr, "rank {}: {}{} {}: {}\n", comm->rank(), models[c], expert_units[c] ? " (expert units)" : "",
                 knobs::describe(k), e.what());
    }
    if (!ok && o.peak_predicted > 0)
      fmt::print(stderr, "FAILED rank {}: {}{} {}: {}\n", comm->rank(), models[c],
                 expert_units[c] ? " (expert units)" : "", knobs::describe(k), knobs::mismatch(o));
    (ok ? passed : failed) += 1;
  }
  double totals[2] = {passed, failed};
  comm->all_reduce_doubles(totals, 2);
  if (comm->rank() == 0)
    fmt::print("knob grid on {} ranks: {} configurations x {} ranks: {:.0f} passed, {:.0f} failed\n", comm->size(),
               configs.size(), comm->size(), totals[0], totals[1]);
  return totals[1] > 0 ? 1 : 0;
}
