// One strategy's numbers: the memory walk, then times from the walk's events.
//   compute: a roofline per op, max(FLOPs / (peak x GEMM efficiency),
//            bytes / (HBM bandwidth x kMemoryEfficiency)), summed.
//   comm:    each collective's cost from comm_model, times how often it runs.
// Until the step simulator overlaps the two streams, exposed = busy and the
// step is compute + communication (the planner issue's stated rule).
#include "dlplan/comm_model.hpp"
#include "dlplan/error.hpp"
#include "dlplan/planner.hpp"

#include <fmt/format.h>

namespace dlplan {
namespace {

// Achievable share of HBM bandwidth for streaming kernels; one H200 measured
// a device-to-device copy at ~4.3 of 4.8 TB/s (REFERENCES.md), about 0.9.
constexpr double kMemoryEfficiency = 0.85;

double peak_flops(const DeviceSpec& d, Precision p) { return p == Precision::bf16_mixed ? d.bf16_flops : d.fp32_flops; }

double op_seconds(const ComputeEvent& e, const DeviceSpec& d, Precision p) {
  double math = e.flops / (peak_flops(d, p) * d.gemm_efficiency);
  double memory = e.bytes / (d.hbm_bytes_per_s * kMemoryEfficiency);
  return std::max(math, memory);
}

}  // namespace

int64_t device_capacity(const Cluster& c) {
  if (c.device.kind == "cpu") return c.device.memory_bytes / std::max(1, c.gpus_per_node);
  return c.device.memory_bytes;
}

StrategyResult evaluate(const Model& m, const Cluster& c, const TrainingConfig& t, bool explain) {
  StrategyResult r;
  r.strategy = t.strategy;
  r.training = t;
  WalkOptions opt;
  opt.explain = explain;
  r.walk = walk_step(m, c, t, opt);

  const double A = static_cast<double>(t.grad_accum);
  double per_micro = 0, optimizer = 0, flops = 0;
  for (const auto& e : r.walk.compute) {
    double s = op_seconds(e, c.device, t.precision);
    if (e.phase == Phase::optimizer) {
      optimizer += s;
      continue;
    }
    per_micro += s;
    if (e.phase != Phase::recompute) flops += e.flops;
  }
  r.compute_seconds = A * per_micro + optimizer;
  r.model_flops = A * flops;

  for (const auto& ev : r.walk.comm) {
    CollectiveCost cost = collective_cost(c, ev.op, ev.bytes, ev.group);
    r.comm.bytes += cost.bytes_sent * ev.per_step;
    r.comm.seconds += cost.seconds * ev.per_step;
    if (ev.blocking) r.syncbn_seconds += cost.seconds * ev.per_step;
  }
  r.comm.exposed_seconds = r.comm.seconds;
  r.step_seconds = r.compute_seconds + r.comm.exposed_seconds;
  r.mfu = r.step_seconds > 0 ? r.model_flops / r.step_seconds / peak_flops(c.device, t.precision) : 0;

  r.runtime_bytes = c.device.runtime_bytes;
  r.margin_bytes = static_cast<int64_t>(kFragmentationMargin * static_cast<double>(r.walk.peak));
  r.capacity_bytes = device_capacity(c);
  r.fits = r.walk.peak + r.runtime_bytes + r.margin_bytes <= r.capacity_bytes;
  return r;
}

}  // namespace dlplan
