// Per-op costs (calibrate.hpp, measure_op_costs): the model trained for a few
// steps under DDP on every rank at once, each compute instruction timed.
#include "dlplan/exec/calibrate.hpp"

#include "calibrate_stats.hpp"

#include "dlplan/error.hpp"
#include "dlplan/exec/trainer.hpp"
#include "dlplan/op_costs.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <tuple>

namespace dlplan::exec {
namespace {

using detail::median;

PlanDocument calibration_plan(const Model& model, int ranks, int64_t micro_batch) {
  PlanRequest req;
  req.model = model;
  req.cluster.device = find_device("cpu");
  req.cluster.gpus_per_node = ranks;
  req.training.precision = Precision::fp32;
  req.training.micro_batch = micro_batch;
  req.forced = Strategy::ddp;
  req.syncbn = SyncBnMode::off;
  const Planning p = plan(req);
  const StrategyResult* r = p.chosen();
  if (!r || !r->fits)
    throw Error(fmt::format("calibrate --model {}: micro-batch {} does not fit this host under ddp with {} rank(s); "
                            "give a smaller --micro-batch",
                            model.name, micro_batch, ranks));
  return plan_from_json(nlohmann::json(plan_json(p, *r)), model.name + " (calibration)");
}

}  // namespace

OpCostTable measure_op_costs(Communicator& comm, Backend& backend, const Model& model, int64_t micro_batch, int min_steps,
                             double min_seconds, double* rank_jitter, StepTiming* timing) {
  const PlanDocument plan = calibration_plan(model, comm.size(), micro_batch);
  TrainOptions opt;
  opt.steps = kMaxCalibrationSteps + 1;  // the count is known after the first timed step
  opt.time_ops = true;
  Trainer trainer(plan, comm, backend, opt);
  trainer.step();  // the first step sets up (and its transients are not the step's)
  const StepProgram& prog = trainer.program();
  std::vector<std::vector<double>> per_event(prog.compute.size());
  std::vector<double> gaps, skews, computes, step_seconds;
  const int N = comm.size();
  int steps = min_steps;
  for (int s = 0; s < steps; ++s) {
    const StepStats st = trainer.step();
    if (s == 0) steps = detail::steps_lasting(comm, st.seconds, min_steps, min_seconds);
    const std::vector<double>& t = trainer.op_seconds();
    for (size_t e = 0; e < t.size(); ++e) per_event[e].push_back(t[e]);
    const double compute = std::accumulate(t.begin(), t.end(), 0.0);
    gaps.push_back(st.seconds - compute - st.wait_seconds);
    step_seconds.push_back(st.seconds);
    // The ranks' skew at this step's synchronization: the slowest rank's
    // compute past the mean of all ranks'.
    std::vector<double> ranks(static_cast<size_t>(N));
    comm.all_gather_bytes(&compute, ranks.data(), sizeof(double));
    const double mean = std::accumulate(ranks.begin(), ranks.end(), 0.0) / N;
    skews.push_back(*std::max_element(ranks.begin(), ranks.end()) - mean);
    computes.push_back(mean);
  }
  // The simulator's skew model (simulator.cpp, rank_skew_seconds): the
  // slowest of N ranks arrives jitter x sqrt(2 ln N) x sqrt(compute) late.
  if (rank_jitter) {
    *rank_jitter = 0;
    if (N > 1 && median(computes) > 0)
      *rank_jitter = median(skews) / (std::sqrt(2.0 * std::log(static_cast<double>(N))) * std::sqrt(median(computes)));
  }

  // The slowest rank's figures: a synchronous step waits for it.
  std::vector<double> medians(prog.compute.size());
  for (size_t e = 0; e < medians.size(); ++e) medians[e] = median(per_event[e]);
  std::vector<double> all(medians.size() * static_cast<size_t>(comm.size()));
  comm.all_gather_bytes(medians.data(), all.data(), medians.size() * sizeof(double));
  for (size_t e = 0; e < medians.size(); ++e)
    for (int r = 0; r < comm.size(); ++r) medians[e] = std::max(medians[e], all[static_cast<size_t>(r) * medians.size() + e]);

  OpCostTable table;
  table.ranks_per_node = comm.local_size();
  table.kernel_revision = kCpuKernelRevision;
  // Ops with one signature (a transformer's repeated layers) share a row: the
  // mean of their medians, so that the table's total is the measured one.
  // (Keyed by the samples too: an op computed once per step is timed at 1.)
  std::map<std::tuple<std::string, Phase, int64_t>, std::pair<double, int>> rows;
  double optimizer_seconds = 0, optimizer_bytes = 0;
  for (size_t e = 0; e < prog.compute.size(); ++e) {
    const ComputeEvent& ev = prog.compute[e];
    if (ev.node < 0) {
      optimizer_seconds += medians[e];
      optimizer_bytes += ev.bytes;
      continue;
    }
    auto& row = rows[{ev.signature, ev.phase, ev.samples}];
    row.first += medians[e];
    row.second += 1;
  }
  if (timing) {
    for (size_t e = 0; e < prog.compute.size(); ++e) {
      const ComputeEvent& ev = prog.compute[e];
      if (ev.node < 0) {
        timing->optimizer_bytes += ev.bytes;
        timing->optimizer_s += medians[e];
        continue;
      }
      timing->ops.push_back({curve_kind(ev.signature), ev.phase, {ev.flops, ev.bytes, medians[e]}, runs_gemms(ev)});
      timing->op_bytes += ev.bytes;
    }
    timing->events = static_cast<int>(prog.compute.size());
    timing->step_s = detail::slowest(comm, median(step_seconds));
    timing->program = prog;
    timing->training = plan.training;
  }
  for (const auto& [key, row] : rows)
    table.ops.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), row.first / row.second, row.second * steps});
  if (optimizer_seconds > 0) table.optimizer_bytes_per_s = optimizer_bytes / optimizer_seconds;
  double gap = std::max(0.0, median(gaps));
  comm.all_reduce_doubles(&gap, 1);
  table.gap_per_op_s = gap / comm.size() / static_cast<double>(std::max<size_t>(1, prog.compute.size()));
  table.source = fmt::format("dlplan calibrate --model {} --micro-batch {}: {} ops timed over {} steps, {} rank(s) per node",
                             model.name, micro_batch, table.ops.size(), steps, table.ranks_per_node);
  return table;
}

std::vector<OpCostCurve> fit_op_curves(const std::vector<OpSample>& samples) {
  std::map<std::pair<std::string, Phase>, std::vector<CurveSample>> by_kind;
  for (const OpSample& s : samples) {
    by_kind[{s.kind, s.phase}].push_back(s.work);
    by_kind[{s.gemm ? "*gemm" : "*memory", s.phase}].push_back(s.work);
  }
  std::vector<OpCostCurve> curves;
  for (const auto& [key, work] : by_kind)
    if (work.size() >= kMinCurveSamples) curves.push_back(fit_op_curve(key.first, key.second, work));
  return curves;
}

}  // namespace dlplan::exec
