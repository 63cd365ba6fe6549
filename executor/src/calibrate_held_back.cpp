// Calibration's held-back check (calibrate.hpp, check_held_back): the
// profile just measured predicts steps it has not seen, and the band the
// planner's tie rule uses is how far those predictions land from the steps.
#include "dlplan/exec/calibrate.hpp"

#include "calibrate_stats.hpp"

#include "dlplan/error.hpp"
#include "dlplan/exec/trainer.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"

#include <fmt/format.h>

#include <cmath>

namespace dlplan::exec {

double HeldBackRun::error() const { return measured_s > 0 ? predicted_s / measured_s - 1 : 0; }

std::vector<HeldBackRun> check_held_back(Communicator& comm, Backend& backend, const Model& model, int64_t micro_batch,
                                         const Cluster& profile, int min_steps, double min_seconds) {
  // One rank: the strategies shard over nothing and run the same step.
  const std::vector<Strategy> strategies =
      comm.size() > 1 ? std::vector<Strategy>{Strategy::ddp, Strategy::zero1, Strategy::zero2, Strategy::zero3}
                      : std::vector<Strategy>{Strategy::ddp};
  std::vector<HeldBackRun> out;
  for (Strategy s : strategies) {
    PlanRequest req;
    req.model = model;
    req.cluster = profile;
    req.training.precision = Precision::fp32;
    req.training.micro_batch = micro_batch;
    req.forced = s;
    req.syncbn = SyncBnMode::off;
    const Planning p = plan(req);
    const StrategyResult* r = p.chosen();
    if (!r || !r->fits) continue;  // ddp fitted (measure_op_costs), so only a sharded plan's runtime could not
    const PlanDocument doc = plan_from_json(nlohmann::json(plan_json(p, *r)), model.name + " (held-back check)");
    TrainOptions opt;
    opt.steps = kMaxCalibrationSteps + 1;  // the count is known after the first timed step
    Trainer trainer(doc, comm, backend, opt);
    trainer.step();  // sets up, as in the op table's measurement
    std::vector<double> seconds;
    for (int k = 0, steps = min_steps; k < steps; ++k) {
      seconds.push_back(trainer.step().seconds);
      if (k == 0) steps = detail::steps_lasting(comm, seconds[0], min_steps, min_seconds);
    }
    out.push_back({s, r->step_seconds, detail::slowest(comm, detail::median(seconds)), static_cast<int>(seconds.size())});
  }
  return out;
}

}  // namespace dlplan::exec
