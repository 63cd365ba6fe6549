// Per-op costs measured by `dlplan calibrate` (--model M): the seconds each
// distinct op of a model takes, forward and backward, with the executor's own
// kernels at the threads per rank the run will use, and the optimizer's update
// rate. A cluster profile carries them ("op_costs"); the simulator takes an
// op's time from the table when it holds the op, falls back to its kind's
// curve when the table does not hold the op, and to the roofline of the
// device's figures otherwise (docs/time.md, "Measured per-op costs").
//
// An op is keyed by its signature (step_program.hpp, ComputeEvent::signature):
// the op kind, its per-sample input shapes, its attributes, which gradients
// its backward computes and how the engine runs it (attention mode, oneDNN
// convolution). The micro-batch is kept apart: a table measured at micro-batch
// b0 serves b by linear scaling (t(b) = t(b0) b / b0), the nearest b0 first,
// and says so.
#pragma once

#include "dlplan/step_program.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dlplan {

struct OpCost {
  std::string signature;
  Phase phase = Phase::forward;
  int64_t micro_batch = 0;
  double seconds = 0;  // median over the calibration's steps and the op's occurrences
  int samples = 0;
};

// Where an op's predicted time comes from (the simulator's --explain line).
enum class CostSource { measured, scaled, curve, roofline };
constexpr size_t kCostSources = 4;
const char* to_string(CostSource s);

struct OpCostLookup {
  double seconds = 0;
  CostSource source = CostSource::roofline;
};

// The CPU engine's kernels, as a number: raised with every change to a kernel
// that changes its time (docs/time.md). A table measured with another number
// times kernels that are no longer there, and the simulator sets it aside.
// 2: a model of fewer than four convolutions keeps im2col; relu backward,
// batch norm sums, max pooling and softmax rows vectorize (docs/cpu-engine.md).
// 3: dropout's Philox uniforms sixteen lanes at a time on AVX-512.
// 4: fp32 AdamW's update on AVX2 / AVX-512 lanes; the gradients' sum of
// squares over eight lanes, and their zeroing, on the rank's threads (the
// table's time between ops).
// 5: OpenBLAS's AVX-512 / AVX2 kernels where OpenBLAS took the CPU for a
// generic SSE one (exec/blas_core.hpp: 4x the GEMM rate on an Emerald Rapids
// Xeon).
// 6: clip's backward (ReLU6, hardtanh) vectorized: a branch per element before.
// 7: the exact (erf) GELU vectorized and on the rank's threads: a std::erf
// call per element before.
constexpr int kCpuKernelRevision = 7;

// An op kind's time against its work, fitted over the ops calibration timed
// (its own sweep of the zoo, and the model's ops under --model):
//   t = overhead + flops x seconds_per_flop + bytes x seconds_per_byte
// with every coefficient >= 0. A GEMM's rate then follows
// flops / (flops + F_half) of its peak, F_half = overhead / seconds_per_flop:
// small GEMMs pay the call's fixed cost (packing, dispatch, the engine's
// slots), large ones run at 1 / seconds_per_flop. For kinds calibration did
// not see, two class curves: kind "*gemm" over every op with GEMMs (or an
// attention core) of the phase, "*memory" over every other op.
struct OpCostCurve {
  std::string kind;  // curve_kind ("linear", "attention/math"), "*gemm" or "*memory"
  Phase phase = Phase::forward;
  double overhead_s = 0;
  double seconds_per_flop = 0;
  double seconds_per_byte = 0;
  int samples = 0;           // timed ops the fit stands on
  double worst_error = 0;    // its worst relative error over them
  double seconds(double flops, double bytes) const { return overhead_s + flops * seconds_per_flop + bytes * seconds_per_byte; }
};

// The kind a curve is kept for: the op kind and how the engine runs it, read
// off its signature ("attention/flash", "conv2d/onednn",
// "conv2d/grouped/onednn", "linear"): the same op through another kernel is
// another curve.
std::string curve_kind(const std::string& signature);

// The op runs GEMMs (or an attention core): the curves' "*gemm" class.
inline bool runs_gemms(const ComputeEvent& e) { return !e.gemms.empty() || e.attention.batch > 0; }

// One timed op for a curve: its work (ComputeEvent::flops, bytes) and time.
struct CurveSample {
  double flops = 0;
  double bytes = 0;
  double seconds = 0;
};

// The least-squares fit of t = a + b flops + c bytes (a, b, c >= 0) over the
// samples, on the relative error (a 1 us op weighs as much as a 1 s one).
OpCostCurve fit_op_curve(const std::string& kind, Phase phase, const std::vector<CurveSample>& samples);

struct OpCostTable {
  std::string source;          // "dlplan calibrate --model tiny-gpt --micro-batch 8 on host: 2 ranks x 1 thread"
  int ranks_per_node = 0;      // the ranks the table was measured with (threads per rank follow from it)
  int kernel_revision = 0;     // kCpuKernelRevision when it was measured
  std::vector<OpCost> ops;
  std::vector<OpCostCurve> curves;  // empty: ops the table lacks go to the roofline
  double optimizer_bytes_per_s = 0;  // the optimizer's update, over ComputeEvent::bytes (0: not measured)
  // What a step costs besides its ops, per op: the engine's bookkeeping
  // between them (slots, the ledger's checks, issuing collectives), measured
  // as (step - ops - waits) / ops over the calibration's steps.
  double gap_per_op_s = 0;
  // Calibrate without --model: the gap's part that grows with an op's bytes
  // (ComputeEvent::bytes; its gradients zeroed, its inputs written), fitted
  // over the sweep's steps with gap_per_op_s as gap / op = a + b x bytes / op.
  // An op of the model pays gap_per_op_s + gap_per_byte_s x its bytes; the
  // optimizer's update, gap_per_op_s. 0 in a --model table (its own gap).
  double gap_per_byte_s = 0;

  // The op's time: measured at this micro-batch, else scaled from the
  // nearest measured one; recompute reads forward's when it has no row.
  std::optional<OpCostLookup> find(const std::string& signature, Phase phase, int64_t micro_batch) const;
  // An op the table lacks: its kind's curve, else its class's ("*gemm" when
  // it runs GEMMs, else "*memory"); recompute reads forward's. Curves are
  // fp32 (calibration's precision).
  std::optional<OpCostLookup> from_curve(const std::string& kind, bool gemm, Phase phase, double flops, double bytes) const;
};

nlohmann::ordered_json op_costs_to_json(const OpCostTable& t);
// Errors name `source` and the field.
OpCostTable op_costs_from_json(const nlohmann::json& j, const std::string& source);

}  // namespace dlplan
