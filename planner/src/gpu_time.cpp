// Compute time of one op on a device: the per-op-class GPU time model
// (docs/gpu-time-model.md), or the plain roofline for a device that gives no
// kernel figures (the cpu row, a hand-written cluster file).
//
//   GEMM       2mnk / (peak x gemm_efficiency x waves x k/(k + k_half)),
//              at least its operands' bytes at the memory rate. `waves` is the
//              share of the SMs the m x n tiles keep busy (wave quantization);
//              a GEMM with fewer tiles than SMs splits K (split-K) down to
//              gemm_split_k_min per split. Fitted to OpenXLA's measured H100
//              table (tests/planner/data/gemm_h100_xla.csv).
//   attention  FlashAttention's core at the published kernel throughput:
//              peak x flash_{fwd,bwd}_efficiency x T/(T + T_half) x
//              d/(d + d_half), T_half larger under a causal mask; causal work
//              is half the FLOPs, backward 2.5x the forward's (the FA papers'
//              convention). The math (unfused) core is two batched GEMMs
//              and its softmax's passes over the T x T scores, forward, and
//              four GEMMs and the softmax gradient backward.
//   other ops  their bytes at hbm_bytes_per_s x memory_efficiency, or their
//              FLOPs at the fp32 vector rate if that is slower.
//   optimizer  the fused update's bytes at the memory rate.
//   every op   op_overhead_s per kernel it launches.
#include "dlplan/simulator.hpp"

#include <algorithm>
#include <cmath>

namespace dlplan {
namespace {

// The roofline's memory share when a device gives none (legacy cluster files).
constexpr double kDefaultMemoryEfficiency = 0.85;

double memory_rate(const DeviceSpec& d) {
  return d.hbm_bytes_per_s * (d.memory_efficiency > 0 ? d.memory_efficiency : kDefaultMemoryEfficiency);
}
double elem_bytes(Precision p) { return mixed(p) ? 2.0 : 4.0; }
// What a training step sustains of the kernel curves (clocks under sustained
// power, the framework's gaps between kernels); fitted to published runs.
double sustained(const DeviceSpec& d) { return d.sustained_share > 0 ? d.sustained_share : 1.0; }

// FLOPs of the attention core's forward (QK^T and PV), causal work halved.
double core_forward_flops(const AttentionCore& a) {
  return 4.0 * a.batch * a.seq * a.key_len() * a.head_dim * (a.causal ? 0.5 : 1.0);
}

}  // namespace

double peak_flops(const DeviceSpec& d, Precision p) {
  switch (p) {
    case Precision::fp32: return d.fp32_flops;
    case Precision::bf16_mixed: return d.bf16_flops;
    case Precision::fp16_mixed: return d.fp16_flops;
  }
  return d.fp32_flops;
}

double gemm_seconds(const GemmShape& g, const DeviceSpec& d, Precision p) {
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0) return 0;
  const double flops = 2.0 * g.m * g.n * g.k * g.batch;
  const double bytes = elem_bytes(p) * g.batch * (g.m * g.k + g.k * g.n + g.m * g.n);
  const double peak = peak_flops(d, p);
  if (!d.has_kernel_model()) return std::max(flops / (peak * d.gemm_efficiency), bytes / memory_rate(d));
  const double tile = static_cast<double>(d.gemm_tile), sms = static_cast<double>(d.sm_count);
  const double tiles = std::ceil(g.m / tile) * std::ceil(g.n / tile) * g.batch;
  double split = 1;
  if (tiles < sms && d.gemm_split_k_min > 0)
    split = std::max(1.0, std::min(std::floor(sms / tiles), std::floor(g.k / d.gemm_split_k_min)));
  const double k = g.k / split, work = tiles * split;
  const double waves = std::ceil(work / sms);
  const double busy = work / (waves * sms);
  const double rate = peak * d.gemm_efficiency * busy * k / (k + d.gemm_k_half) * sustained(d);
  return std::max(flops / rate, bytes / memory_rate(d));
}

double attention_core_seconds(const AttentionCore& a, Phase ph, const DeviceSpec& d, Precision p) {
  if (a.batch <= 0 || a.seq <= 0) return 0;
  const bool backward = ph == Phase::backward;
  const double T = a.seq, hd = a.head_dim, B = a.batch;
  if (a.flash && d.flash_fwd_efficiency > 0 && d.flash_bwd_efficiency > 0) {
    const double flops = core_forward_flops(a) * (backward ? 2.5 : 1.0);
    const double half = (backward ? d.flash_bwd_seq_half : d.flash_fwd_seq_half) + (a.causal ? d.flash_causal_seq_half : 0);
    const double eff = (backward ? d.flash_bwd_efficiency : d.flash_fwd_efficiency) * T / (T + half) * hd / (hd + d.flash_head_dim_half);
    return flops / (peak_flops(d, p) * eff * sustained(d));
  }
  // Two batched GEMMs forward (S = QK^T, O = PV), four backward (dP, dV, dS
  // -> dQ, dK). The fused kernel without published figures keeps only its
  // GEMMs (causal halves them); the math form also passes over the T x T
  // scores: scale + mask + softmax forward (read and write each), the softmax
  // gradient backward (P, dP in, dS out), dropout's mask and copy besides.
  const double Tk = a.key_len();
  const GemmShape scores{T, Tk, hd, B}, context{T, hd, Tk, B};
  double t = backward ? 2 * gemm_seconds(scores, d, p) + 2 * gemm_seconds(context, d, p)
                      : gemm_seconds(scores, d, p) + gemm_seconds(context, d, p);
  if (a.flash) return t * (a.causal ? 0.5 : 1.0);
  const double e = elem_bytes(p), elems = B * T * Tk;
  double bytes = backward ? 3 * e : 4 * e;
  if (a.dropout) bytes += backward ? 2 * e + 1 : 2 * e + 1;
  return t + elems * bytes / memory_rate(d);
}

double compute_event_seconds(const ComputeEvent& e, const DeviceSpec& d, Precision p) {
  const double peak = peak_flops(d, p);
  const bool kernels = d.has_kernel_model() && e.phase != Phase::optimizer && (!e.gemms.empty() || e.attention.batch > 0);
  if (!kernels) {
    // Memory-bound ops, the optimizer, and every op on a device without
    // kernel figures: the roofline. With kernel figures, FLOPs that are not
    // GEMMs run at the vector (fp32) rate.
    const double rate = d.has_kernel_model() ? d.fp32_flops : peak * d.gemm_efficiency;
    return d.op_overhead_s + std::max(e.flops / rate, e.bytes / memory_rate(d));
  }
  const bool backward = e.phase == Phase::backward;
  double t = 0;
  int launches = 0;
  for (const GemmShape& g : e.gemms) {
    if (backward) {
      if (g.input_grad) t += gemm_seconds({g.m, g.k, g.n, g.batch}, d, p), ++launches;   // dX = dY W^T
      if (g.weight_grad) t += gemm_seconds({g.k, g.n, g.m, g.batch}, d, p), ++launches;  // dW = X^T dY
    } else {
      t += gemm_seconds(g, d, p);
      launches += 1;
    }
  }
  if (e.attention.batch > 0) {
    t += attention_core_seconds(e.attention, e.phase, d, p);
    launches += 1;
  }
  return t + d.op_overhead_s * std::max(1, launches);
}

}  // namespace dlplan
