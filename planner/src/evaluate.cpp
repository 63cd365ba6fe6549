// One strategy's numbers from one step program: its dry run gives the memory
// (peak, breakdown, the tensors at the peak), the simulator the times (compute
// and communication on two streams, overlapped where the program allows).
#include "dlplan/planner.hpp"
#include "dlplan/simulator.hpp"

#include <algorithm>

namespace dlplan {

int64_t device_capacity(const Cluster& c) {
  if (c.device.kind == "cpu") return c.device.memory_bytes / std::max(1, c.gpus_per_node);
  return c.device.memory_bytes;
}

StrategyResult evaluate(const Model& m, const Cluster& c, const TrainingConfig& t, bool explain) {
  StrategyResult r;
  r.strategy = t.strategy;
  r.training = t;
  const StepProgram prog = build_step_program(m, c, t, explain);
  WalkOptions opt;
  opt.explain = explain;
  r.walk = walk_program(prog, opt, t.grad_accum);
  const Simulation sim = simulate_program(prog, c, t, /*timeline=*/false);

  r.compute_seconds = sim.compute_seconds;
  r.model_flops = sim.model_flops;
  r.comm.bytes = sim.comm_bytes;
  r.comm.seconds = sim.comm_seconds;
  r.comm.exposed_seconds = sim.exposed_seconds;
  r.step_seconds = sim.step_seconds;
  r.mfu = sim.mfu;
  r.cost_sources = sim.cost_sources;
  r.cost_table_unused = sim.cost_table_unused;
  r.comm_measured = sim.comm_measured;
  r.comm_modeled = sim.comm_modeled;
  for (const auto& ev : prog.comm)
    if (ev.blocking) r.syncbn_seconds += collective_cost(c, ev.op, ev.bytes, ev.group).seconds * ev.per_step;

  r.runtime_bytes = c.device.runtime_bytes;
  r.margin_bytes = static_cast<int64_t>(kFragmentationMargin * static_cast<double>(r.walk.peak));
  r.capacity_bytes = device_capacity(c);
  r.fits = r.walk.peak + r.runtime_bytes + r.margin_bytes <= r.capacity_bytes;
  if (t.offload != Offload::none) {
    HostMemory& h = r.host;
    h.per_rank = host_states(m, c.world(), t);
    h.ranks = std::max(1, std::min(c.gpus_per_node, c.world()));
    h.per_node = total(h.per_rank) * h.ranks;
    h.capacity = c.device.host_memory_bytes;
    if (c.device.kind == "cpu")  // one memory: the device pools take their share first
      h.capacity = std::max<int64_t>(0, h.capacity - h.ranks * (r.walk.peak + r.runtime_bytes + r.margin_bytes));
    h.fits = c.device.host_memory_bytes == 0 || h.per_node <= h.capacity;
    r.fits = r.fits && h.fits;
  }
  return r;
}

}  // namespace dlplan
