#include "report.hpp"

#include "dlplan/format.hpp"

#include <fmt/format.h>

namespace dlplan::cli {
namespace {

double gib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024 * 1024); }

void print_header(const Planning& p) {
  const auto& r = p.request;
  const auto& t = r.training;
  fmt::print("model    {} ({} parameters)\n", r.model.name, format_count(r.model.parameter_count()));
  fmt::print("cluster  {} x {} ({} node{} x {}), {} per GPU\n", r.cluster.world(), r.cluster.device.kind,
             r.cluster.nodes, r.cluster.nodes == 1 ? "" : "s", r.cluster.gpus_per_node,
             format_bytes(static_cast<double>(device_capacity(r.cluster))));
  for (const auto& note : r.model.notes) fmt::print("note     {}\n", note);
  if (r.model.unaccounted_bytes > 0)
    fmt::print("note     {} per sample of activations from unmapped ops is NOT in the numbers below\n",
               format_bytes(static_cast<double>(r.model.unaccounted_bytes)));
  fmt::print("training micro-batch {} x grad-accum {} x {} GPUs = global batch {}; {}, {}, checkpointing {}, attention {}\n\n",
             t.micro_batch, t.grad_accum, r.cluster.world(), t.micro_batch * t.grad_accum * r.cluster.world(),
             to_string(t.precision), to_string(t.optimizer.kind), to_string(t.checkpointing), to_string(t.attention));
}

}  // namespace

void print_table(const Planning& p) {
  print_header(p);
  fmt::print("{:<9}{:>8}{:>8}{:>8}{:>8}{:>9}{:>8}{:>8}{:>8}{:>9}  {:<5}{:>9}{:>10}{:>11}{:>10}{:>7}\n", "", "params",
             "grads", "optim", "activ", "gathered", "comm", "wkspace", "peak", "+runtime", "fits", "comm", "comm",
             "compute", "step", "MFU");
  fmt::print("{:<9}{:>8}{:>8}{:>8}{:>8}{:>9}{:>8}{:>8}{:>8}{:>9}  {:<5}{:>9}{:>10}{:>11}{:>10}{:>7}\n", "strategy", "GiB",
             "GiB", "GiB", "GiB", "GiB", "GiB", "GiB", "GiB", "GiB", "", "GB/step", "ms", "ms", "ms", "%");
  for (const auto& r : p.results) {
    const auto& m = r.walk.at_peak;
    fmt::print("{:<9}{:>8.2f}{:>8.2f}{:>8.2f}{:>8.2f}{:>9.2f}{:>8.2f}{:>8.2f}{:>8.2f}{:>9.2f}  {:<5}{:>9.2f}{:>10.1f}{:>11.1f}{:>10.1f}{:>7.1f}\n",
               to_string(r.strategy), gib(m[0]), gib(m[1]), gib(m[2]), gib(m[3]), gib(m[4]), gib(m[5]), gib(m[6]),
               gib(r.walk.peak), gib(r.runtime_bytes), r.fits ? "yes" : "NO", r.comm.bytes / 1e9, r.comm.seconds * 1e3,
               r.compute_seconds * 1e3, r.step_seconds * 1e3, r.mfu * 100);
  }
  fmt::print("\nMemory per GPU at the step's peak. Fits: peak + runtime + {:.0f}% fragmentation margin <= {}.\n",
             kFragmentationMargin * 100, format_bytes(static_cast<double>(device_capacity(p.request.cluster))));
  fmt::print("Times from the step simulator: communication overlaps compute where the strategy allows;\n"
             "step = compute + the communication compute waits for (dlplan sim, --timeline for the chart).\n\n");
  if (p.recommendation.strategy)
    fmt::print("Recommendation: {}{}\n", to_string(*p.recommendation.strategy), p.recommendation.syncbn ? " with SyncBN" : "");
  else
    fmt::print("Recommendation: none fits\n");
  for (const auto& reason : p.recommendation.reasons) fmt::print("  - {}\n", reason);
  fmt::print("\nSyncBatchNorm: {}\n", p.syncbn.reason);
  if (p.syncbn.applicable)
    fmt::print("  Cost: {} BN layers x (all-gather of 2C+1 + all-reduce of 2C floats) over {} GPU{}: {} per step{}\n",
               p.syncbn.bn_layers, p.syncbn.group_size, p.syncbn.group_size == 1 ? "" : "s", format_seconds(p.syncbn.seconds),
               p.syncbn.share > 0 ? fmt::format(" ({:.1f}% of the step)", p.syncbn.share * 100) : "");
}

void print_csv(const Planning& p) {
  fmt::print("strategy,params_bytes,grads_bytes,optimizer_bytes,activations_bytes,gathered_bytes,comm_bytes,"
             "workspace_bytes,peak_bytes,runtime_bytes,fits,comm_bytes_per_step,comm_seconds,compute_seconds,"
             "step_seconds,mfu,recommended\n");
  for (const auto& r : p.results) {
    const auto& m = r.walk.at_peak;
    bool rec = p.recommendation.strategy && *p.recommendation.strategy == r.strategy;
    fmt::print("{},{},{},{},{},{},{},{},{},{},{},{:.0f},{:.6g},{:.6g},{:.6g},{:.4f},{}\n", to_string(r.strategy), m[0], m[1],
               m[2], m[3], m[4], m[5], m[6], r.walk.peak, r.runtime_bytes, r.fits, r.comm.bytes, r.comm.seconds,
               r.compute_seconds, r.step_seconds, r.mfu, rec);
  }
}

void print_explain(const Planning& p) {
  const StrategyResult* r = p.chosen();
  if (!r) r = &p.results.back();
  const auto& w = r->walk;
  std::string at = "the step";
  if (w.peak_event >= 0 && w.peak_event < static_cast<int>(w.compute.size()))
    at = fmt::format("{} of '{}'", to_string(w.compute[static_cast<size_t>(w.peak_event)].phase),
                     w.compute[static_cast<size_t>(w.peak_event)].name);
  fmt::print("\nPeak of {}: {} during {}. Tensors alive then, largest first:\n", to_string(r->strategy),
             format_bytes(static_cast<double>(w.peak)), at);
  fmt::print("  {:>11}  {:<12} {:<44} {}\n", "bytes", "category", "tensor", "held by");
  size_t shown = 0;
  int64_t rest = 0;
  for (const auto& t : w.peak_tensors) {
    if (shown < 25) {
      fmt::print("  {:>11}  {:<12} {:<44} {}\n", format_bytes(static_cast<double>(t.bytes)), to_string(t.category), t.what, t.holder);
      ++shown;
    } else {
      rest += t.bytes;
    }
  }
  if (w.peak_tensors.size() > shown)
    fmt::print("  ... and {} smaller tensors, {} in all\n", w.peak_tensors.size() - shown, format_bytes(static_cast<double>(rest)));
}

}  // namespace dlplan::cli
