// Shared by the MPI parity programs (train_parity.cpp, offload_parity.cpp):
// the pass/fail tally every rank keeps, the relative L2 distance the
// parities are judged by, and a cpu plan for N ranks of one strategy.
#pragma once

#include "dlplan/exec/trainer.hpp"
#include "dlplan/fine_tuning.hpp"
#include "dlplan/importers.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace parity {

struct Checks {
  int passed = 0, failed = 0;
  bool verbose = false;
  void expect(bool ok, const std::string& what) {
    ok ? ++passed : ++failed;
    if (!ok || verbose) fmt::print(stderr, "{}: {}\n", ok ? "ok" : "FAILED", what);
  }
};

inline double relative_l2(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 1e30;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// A zoo or fixture model by name, or an exported ONNX file at sequence 16.
inline dlplan::Model load_parity_model(const std::string& model) {
  if (model.ends_with(".onnx")) {
    dlplan::ImportOptions o;
    o.seq_len = 16;
    return dlplan::load_model(model, o);
  }
  return dlplan::load_model(model);
}

// fp32 (unless told) on the cpu device, lr 1e-3, buckets of 0.05 MiB (several
// even for a tiny model). Hybrid sharding at 4 ranks or more runs as 2
// "nodes", a shard group each; below that its one group is ZeRO itself.
inline dlplan::PlanDocument make_plan(const std::string& model, int ranks, int64_t micro_batch, int64_t accum,
                                      dlplan::Strategy s, bool syncbn, dlplan::Offload offload = dlplan::Offload::none,
                                      dlplan::Precision precision = dlplan::Precision::fp32,
                                      double init_scale = 65536.0, const dlplan::FineTuning& fine_tuning = {}) {
  using namespace dlplan;
  PlanRequest req;
  req.model = load_parity_model(model);
  apply_fine_tuning(req.model, fine_tuning);
  req.training.fine_tuning = fine_tuning;
  req.cluster.device = find_device("cpu");
  req.cluster.nodes = 1;
  req.cluster.gpus_per_node = ranks;
  if (hybrid(s) && ranks >= 4) {
    req.cluster.nodes = 2;
    req.cluster.gpus_per_node = ranks / 2;
    req.training.shard_group = ranks / 2;
  }
  req.training.precision = precision;
  req.training.loss_scaling.init_scale = init_scale;
  req.training.micro_batch = micro_batch;
  req.training.grad_accum = accum;
  req.training.optimizer.lr = 1e-3;
  req.training.bucket_mb = 0.05;
  req.training.offload = offload;
  req.forced = s;
  req.syncbn = syncbn ? SyncBnMode::on : SyncBnMode::off;
  Planning p = plan(req);
  return plan_from_json(nlohmann::json(plan_json(p, *p.chosen())), model + " plan");
}

// The device pool against the planner's walk: the peak within 3%, every
// category at that moment within 3% or 64 KiB.
inline void expect_device_memory(Checks& checks, dlplan::exec::Trainer& t, const dlplan::PlanDocument& plan,
                                 const std::string& label) {
  using namespace dlplan;
  const StepWalk w = walk_step(plan.model, plan.cluster, plan.training);
  const CategoryBytes got = t.allocator().at_peak();
  const double peak = static_cast<double>(t.allocator().peak()), want = static_cast<double>(w.peak);
  checks.expect(std::fabs(peak - want) <= 0.03 * want, fmt::format("{}: peak {} within 3% of predicted {}", label, peak, want));
  for (Category c : kAllCategories) {
    const double a = static_cast<double>(got[static_cast<size_t>(c)]), b = static_cast<double>(w.at_peak[static_cast<size_t>(c)]);
    checks.expect(std::fabs(a - b) <= std::max(0.03 * b, 65536.0),
                  fmt::format("{}: {} {} vs predicted {}", label, to_string(c), a, b));
  }
}

}  // namespace parity
