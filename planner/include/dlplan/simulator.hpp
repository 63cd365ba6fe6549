// The step simulator: one training step as two streams — compute (forward,
// backward, recomputation, optimizer) and communication (the collectives of
// the step program, issued where the executor issues them) — with the
// dependencies between them: a collective starts once it is issued and the
// stream is free; compute waits where the program waits (a gather before a
// unit, a bucket's staging before a third, everything before the optimizer,
// SyncBN inside its layer). One pass over the step program yields the
// timeline and the memory curve, whose peak is the memory model's peak.
#pragma once

#include "dlplan/step_program.hpp"
#include "dlplan/step_walk.hpp"

#include <iosfwd>
#include <array>
#include <string>
#include <vector>

namespace dlplan {

struct Span {
  std::string name;
  double start = 0, end = 0;   // seconds from the step's start
  Phase phase = Phase::forward; // compute spans
  Collective op = Collective::AllReduce;  // communication spans
  double bytes = 0;            // communication spans: the buffer size S (padding included)
  double bytes_sent = 0;       // communication spans: what one rank sends
  int micro_batch = 0;
};

struct MemorySample {
  double time = 0;
  CategoryBytes bytes{};
};

struct Simulation {
  std::vector<Span> compute;   // in stream order
  std::vector<Span> comm;      // in stream order
  std::vector<MemorySample> memory;  // after every allocation and free (the curve)
  double step_seconds = 0;     // end of the last span
  double compute_seconds = 0;  // compute stream busy
  double comm_seconds = 0;     // communication stream busy
  double exposed_seconds = 0;  // compute stream idle, waiting for communication
  double comm_bytes = 0;       // sent per rank per step
  double model_flops = 0;      // forward + backward per device per step, recomputation excluded
  double mfu = 0;
  int64_t peak_bytes = 0;      // the memory model's peak (the same walk)
  // Where the ops' times came from (op_costs.hpp): compute events by source,
  // indexed by CostSource; and why a cluster's cost table was not used.
  std::array<int, 4> cost_sources{};  // kCostSources (op_costs.hpp)
  std::string cost_table_unused;
  // Collectives of the step priced from the cluster's measured ladders
  // (collective_costs.hpp) and by the alpha-beta model.
  int comm_measured = 0, comm_modeled = 0;
};

// The device's dense peak for the precision's GEMMs: fp32, bf16 or fp16
// tensor cores (FLOP/s).
double peak_flops(const DeviceSpec& d, Precision p);

// Seconds of one compute event on the device (gpu_time.cpp,
// docs/gpu-time-model.md): the per-op-class GPU model where the device gives
// its kernel figures (DeviceSpec::has_kernel_model), else the roofline.
double compute_event_seconds(const ComputeEvent& e, const DeviceSpec& d, Precision p);
// The model's curves, one kernel each (no launch overhead): a GEMM, and the
// attention core (flash or math, as `a` says) in a forward or backward phase.
double gemm_seconds(const GemmShape& g, const DeviceSpec& d, Precision p);
double attention_core_seconds(const AttentionCore& a, Phase ph, const DeviceSpec& d, Precision p);

Simulation simulate_step(const Model& m, const Cluster& c, const TrainingConfig& t);
// `timeline` false: only the totals (no spans, no memory curve), for searches.
Simulation simulate_program(const StepProgram& prog, const Cluster& c, const TrainingConfig& t, bool timeline = true);

// Chrome trace-event JSON (Perfetto, chrome://tracing): two threads, compute
// and communication, times in microseconds; counters for memory per category.
void write_chrome_trace(const Simulation& s, const std::string& title, std::ostream& out);

// A text Gantt chart of both streams, `width` columns wide, and the memory curve.
std::string text_gantt(const Simulation& s, int width = 100);

}  // namespace dlplan
