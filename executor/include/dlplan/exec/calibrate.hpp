// Calibration: measure the machine the ranks run on, through the executor's
// own backend and communicator, and describe it as a cluster profile that
// `dlplan plan --cluster` accepts:
//   - GEMM throughput: the backend's linear op at the model's shapes (or a
//     default set), all ranks at once so shared cores are accounted for;
//   - memory bandwidth: a large copy; per-op overhead: a tiny op, many times;
//   - the optimizer step on the host (CPU offload's), every rank at once;
//   - collectives: all-reduce, reduce-scatter and all-gather from 4 B to
//     16 MiB, kept as the profile's collective_costs (what the simulator
//     reads for these ranks), and the all-reduce fitted to latency +
//     2(n-1)/n * S / bandwidth (nccl-tests' busbw convention; fit_all_reduce)
//     for other group sizes;
//   - contention: GEMMs timed alone and beside an all-reduce of this rank's
//     communication thread (contention_slowdown): the profile's comm_slowdown;
//   - with a model, every op of it timed in a few training steps
//     (measure_op_costs): the profile's op_costs table; then steps the table
//     never saw, under each strategy, against the profile's predictions
//     (check_held_back): the profile's time_uncertainty;
//   - without one, the small zoo's ops timed the same way at three
//     micro-batches and fitted into per-kind curves (fit_op_curves), for
//     models calibrate never saw; each sweep model held back in turn gives
//     the band (CurveCheck).
// Backend-neutral: the CUDA backend plugs into the same measurements.
#pragma once

#include "dlplan/exec/backend.hpp"
#include "dlplan/exec/communicator.hpp"
#include "dlplan/hardware.hpp"
#include "dlplan/op_costs.hpp"
#include "dlplan/step_program.hpp"

#include <string>
#include <vector>

namespace dlplan::exec {

struct GemmSample {
  int64_t m = 0, n = 0, k = 0;
  double seconds = 0, flops_per_s = 0;
};

struct CollectiveSample {
  double bytes = 0, seconds = 0;
};

// One strategy's held-back steps beside the profile's prediction.
struct HeldBackRun {
  Strategy strategy = Strategy::ddp;
  double predicted_s = 0, measured_s = 0;  // the step; measured: median over the steps, slowest rank
  int steps = 0;                           // how many steps were timed
  double error() const;                    // predicted / measured - 1
};

// Each sweep model held back in turn: what was fitted without it predicts
// its step, and the worst of these errors is the band of a profile
// calibrated without --model (time_uncertainty).
struct CurveCheck {
  std::string model;
  int64_t micro_batch = 0;
  // The step as the simulator predicts it (simulate_program on the program
  // that ran) from the profile with the curves, gaps and optimizer rate of
  // the other models' runs, against the measured median step.
  double predicted_s = 0, measured_s = 0;
  double error() const { return measured_s > 0 ? predicted_s / measured_s - 1 : 0; }
};

struct Calibration {
  Cluster cluster;                 // the profile (device measured, nodes 1 x ranks)
  std::vector<GemmSample> gemms;
  std::vector<CollectiveSample> all_reduce, reduce_scatter, all_gather;  // the profile's collective_costs
  double copy_bytes_per_s = 0;
  double op_overhead_s = 0;
  double host_optimizer_bytes_per_s = 0;  // CPU offload's optimizer step, all ranks of the node at once
  double latency_s = 0, bus_bytes_per_s = 0;  // the all-reduce fit
  // Contention (more than one rank): the same GEMMs alone, beside a collective
  // of `collective_s` alone, and the slowdown that makes the simulator's
  // overlap rule give the second from the first.
  double gemms_alone_s = 0, gemms_beside_s = 0, collective_s = 0, collective_beside_s = 0;
  double comm_slowdown = 0, comm_stall = 0;
  std::vector<HeldBackRun> held_back;          // with a model: check_held_back
  std::vector<CurveCheck> curve_checks;        // without a model: the curves on each sweep model held back
  int attempts = 0;                            // op tables measured (a second when the first checked badly)
};

// calibrate --model measures the op table again when its held-back check is
// off by more than this: the machine's speed moved between the two (it did
// by 100 % on a shared 2-core VM, docs/time.md), and a profile that says so of
// itself is worth one more try.
inline constexpr double kCalibrationRetryAbove = 0.25;

// How long calibrate --model times the op table and each held-back strategy
// at least (5 and 3 steps at least, kMaxCalibrationSteps at most). A step of
// a few milliseconds or less is timed over many steps, so that its median
// does not rest on a handful of steps that one preemption moves (tiny-mlp's
// 0.2 ms step over 5 steps gave a table whose check was 49 % off), and over
// seconds, not a fixed count: a shared VM's speed moves by 15-20 % in spells
// of 0.2-1 s (one process, the same buffers: tiny-mlp's step 0.077 ms, then
// 0.092 ms for a second, then 0.077 ms again; docs/time.md). The old cap,
// 1,000 steps, timed that step over 80 ms, inside one spell: a table made in
// a slow one predicted every later run 16 % too slow. Two seconds span
// several spells, and each op's median over them is the usual speed.
inline constexpr double kOpTableSeconds = 2.0;
inline constexpr double kHeldBackSeconds = 0.5;
inline constexpr int kMaxCalibrationSteps = 40000;  // a 0.05 ms step for kOpTableSeconds

// The all-reduce fit t = latency + x / bandwidth, x = 2(n-1)/n S, by least
// squares on the relative residual (weights 1/t^2). The sizes grow 4x a step
// from 4 B to 16 MiB: an unweighted fit is ruled by the largest sizes, where a
// few percent of noise is hundreds of microseconds, and its intercept (the
// latency, a few microseconds) comes out anywhere, often below zero — what
// made calibrate print "latency 0.0 us" over 6.5 us measurements. Relative
// weights give each size the same say. Latency and 1 / bandwidth are at
// least 0 (the op curves' non-negative fit, fit_op_curve); a ladder with no
// slope has bandwidth 1e12 B/s (latency-bound throughout).
struct AllReduceFit {
  double latency_s = 0, bus_bytes_per_s = 0;
};
AllReduceFit fit_all_reduce(const std::vector<CollectiveSample>& samples, int ranks);

// Contention, as the simulator models it (simulator.cpp): compute runs
// 1 + slowdown times slower while a collective is in flight beside it
// (DeviceSpec::comm_slowdown), and a collective runs at 1 - stall of its own
// speed while compute runs beside it (comm_stall), at full speed once the
// compute waits. From GEMMs of `alone` seconds that took `beside` seconds
// started together with a collective of `collective` seconds alone, which
// was done `both` seconds after they started:
//   stall: the collective's work left when the compute ended, L = both -
//     beside, ran at full speed, so it got C - L done in `beside`:
//     stall = 1 - (C - L) / beside (0 when nothing was left);
//   slowdown: with the collective in flight through all of the compute (work
//     left), beside = alone (1 + s); else the overlap is the collective's C
//     and beside = C + alone - C / (1 + s), s = (beside - alone) / (C -
//     (beside - alone)). At most kMaxCommSlowdown, the field's bound: the
//     compute stood still while the collective ran.
inline constexpr double kMaxCommSlowdown = 10;
struct Contention {
  double slowdown = 0, stall = 0;
};
Contention contention_from(double alone, double beside, double collective, double both);

// Per-op costs (op_costs.hpp): `model` trained at least `min_steps` steps,
// and as many as last `min_seconds` (after one to set up; at most kMaxCalibrationSteps),
// under DDP over `comm` at `micro_batch`, fp32, every compute
// instruction timed; each (signature, phase) row is the mean over the ops that
// share it of their median over the steps, the slowest rank's. Collective.
// `rank_jitter` (when given) receives the ranks' measured drift in the
// simulator's skew model (DeviceSpec::rank_jitter; 0 on one rank).
// Throws dlplan::Error when the model does not fit this host at that size.
// `timing` (when given) receives every timed op of the step, one each (not
// one per signature): its kind, phase, work and time, for the curves; and
// what the rest of the step took.
struct OpSample {
  std::string kind;  // curve_kind of its signature
  Phase phase = Phase::forward;
  CurveSample work;
  bool gemm = false;  // runs_gemms: its class curve is "*gemm", else "*memory"
};
struct StepTiming {
  std::vector<OpSample> ops;
  double optimizer_bytes = 0, optimizer_s = 0;  // the optimizer's event (ComputeEvent::bytes) and its median time
  int events = 0;                               // compute events, the optimizer's included (each pays the gap)
  double op_bytes = 0;                          // ComputeEvent::bytes over the ops, the optimizer's not
  double step_s = 0;                            // the median step, the slowest rank's
  StepProgram program;                          // what ran, for the simulator to predict it (sweep_curves' check)
  TrainingConfig training;
};
OpCostTable measure_op_costs(Communicator& comm, Backend& backend, const Model& model, int64_t micro_batch,
                             int min_steps = 5, double min_seconds = 0, double* rank_jitter = nullptr,
                             StepTiming* timing = nullptr);

// The curves (op_costs.hpp, OpCostCurve) over timed ops: one per (kind,
// phase) of at least kMinCurveSamples ops, and per phase the class curves
// "*gemm" (every op with GEMMs) and "*memory" (every other op), as many as
// have that many ops.
inline constexpr size_t kMinCurveSamples = 3;
std::vector<OpCostCurve> fit_op_curves(const std::vector<OpSample>& samples);

// Calibrate without --model times the ops of these models at these
// micro-batches, kCurveSeconds each, and fits the curves a model it has not
// seen is timed by: every op kind of the small zoo, over a 16x span of sizes.
// "sweep-cnn" (3x32x32, four 3x3 convolutions 16 to 64 wide, MobileNetV2's
// depthwise kxk (k = 3, 5, 7; the first with stride 2), ReLU6 and pointwise
// 1x1 before each but the first) and "sweep-cnn-wide" (the same at 3x56x56,
// 32 to 128 wide) are there for the convolutions of real CNNs: with four or
// more, the engine runs them through oneDNN (docs/cpu-engine.md), tiny-cnn's
// two through im2col; depthwise ones (MobileNet, ConvNeXt) run at a fraction
// of a dense one's rate, their backward at stride 2 slower still, and 1x1
// ones are bound by memory more than a 3x3 is. Two of them, so that each,
// held back, is predicted from the other's kinds.
inline constexpr const char* kCurveSweepModels[] = {"tiny-mlp", "tiny-cnn", "tiny-vit", "tiny-gpt", "sweep-cnn",
                                                     "sweep-cnn-wide"};
inline constexpr int64_t kCurveSweepMicroBatches[] = {1, 4, 16};
inline constexpr double kCurveSeconds = 0.2;

// The held-back check: `model` trained at least `min_steps` steps and as
// many as last `min_seconds` (after one to set up; at most kMaxCalibrationSteps)
// under each strategy the planner compares on these ranks (ddp alone on one
// rank), at `micro_batch`, fp32 — steps the op table did not see — beside
// what `profile` predicts for the same plan. Collective.
std::vector<HeldBackRun> check_held_back(Communicator& comm, Backend& backend, const Model& model, int64_t micro_batch,
                                         const Cluster& profile, int min_steps = 3, double min_seconds = 0);

// The band a profile states from its held-back errors (relative, signed):
// the worst |error|, at least 1 % (a few steps cannot vouch for better),
// rounded up to the percent, at most kMaxTimeUncertainty (a busy machine's
// collectives can put a check 10x off; the profile must still read back).
double time_band(const std::vector<double>& errors);

// `model` (may be null) supplies the GEMM shapes: each linear's [rows, in] x
// [in, out] at `micro_batch`. Collective over `comm`: every rank calls it.
Calibration calibrate(Communicator& comm, Backend& backend, const Model* model, int64_t micro_batch);

}  // namespace dlplan::exec
