// Shared by the MPI parity programs (train_parity.cpp, offload_parity.cpp):
// the pass/fail tally every rank keeps, the relative L2 distance the
// parities are judged by, and a cpu plan for N ranks of one strategy.
#pragma once

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

// fp32 on the cpu device, lr 1e-3, buckets of 0.05 MiB (several even for a
// tiny model). Hybrid sharding at 4 ranks or more runs as 2 "nodes", a shard
// group each; below that its one group is ZeRO itself.
inline dlplan::PlanDocument make_plan(const std::string& model, int ranks, int64_t micro_batch, int64_t accum,
                                      dlplan::Strategy s, bool syncbn, dlplan::Offload offload = dlplan::Offload::none) {
  using namespace dlplan;
  PlanRequest req;
  req.model = load_model(model);
  req.cluster.device = find_device("cpu");
  req.cluster.nodes = 1;
  req.cluster.gpus_per_node = ranks;
  if (hybrid(s) && ranks >= 4) {
    req.cluster.nodes = 2;
    req.cluster.gpus_per_node = ranks / 2;
    req.training.shard_group = ranks / 2;
  }
  req.training.precision = Precision::fp32;
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

}  // namespace parity
