// The strategy table and CSV. The header shows every setting that shapes the
// numbers, defaults included; the memory unit is chosen per table (GiB, MiB
// or KiB by the largest peak) so that a tiny model does not read 0.00.
#include "report.hpp"

#include "dlplan/fine_tuning.hpp"
#include "dlplan/format.hpp"
#include "dlplan/loader.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace dlplan::cli {
namespace {

struct Unit {
  const char* name;
  double bytes;
};

// The largest unit in which the biggest value reads at least 1.
Unit unit_for(double largest, const std::array<Unit, 3>& units) {
  for (const auto& u : units)
    if (largest >= u.bytes) return u;
  return units.back();
}

constexpr std::array<Unit, 3> kMemoryUnits = {{{"GiB", 1024.0 * 1024 * 1024}, {"MiB", 1024.0 * 1024}, {"KiB", 1024.0}}};
constexpr std::array<Unit, 3> kTrafficUnits = {{{"GB/step", 1e9}, {"MB/step", 1e6}, {"kB/step", 1e3}}};

std::string number(double v) { return fmt::format("{:g}", v); }

// An encoder-decoder's decoder tokens (--decoder-seq-len), or "".
std::string decoder_text(const Model& m) {
  for (int id : m.inputs)
    if (m.tensor(id).name == kDecoderInputIds) return fmt::format(", decoder {}", m.tensor(id).shape.at(0));
  return "";
}

std::string seq_len_text(const PlanRequest& r) {
  const int64_t t = tokens_per_sample(r.model);
  if (t == 0) return "";
  if (t == r.model_context) return fmt::format(", seq-len {} (the model's context){}", t, decoder_text(r.model));
  return fmt::format(", seq-len {} (the model's context: {}){}", t, r.model_context, decoder_text(r.model));
}

void print_header(const Planning& p) {
  const auto& r = p.request;
  const auto& t = r.training;
  const auto& o = t.optimizer;
  fmt::print("model    {} ({} parameters){}\n", r.model.name, format_count(r.model.parameter_count()), seq_len_text(r));
  fmt::print("cluster  {} x {} ({} node{} x {}{}), {} per GPU; fits = peak + runtime + {:.0f}% margin\n",
             r.cluster.world(), r.cluster.device.kind, r.cluster.nodes, r.cluster.nodes == 1 ? "" : "s",
             r.cluster.gpus_per_node, r.cluster_source.empty() ? "" : ", from " + r.cluster_source,
             format_bytes(static_cast<double>(device_capacity(r.cluster))), kFragmentationMargin * 100);
  for (const auto& note : r.model.notes) fmt::print("note     {}\n", note);
  if (r.model.unaccounted_bytes > 0)
    fmt::print("note     {} per sample of activations from unmapped ops is NOT in the numbers below\n",
               format_bytes(static_cast<double>(r.model.unaccounted_bytes)));
  if (r.max_micro_batch)
    fmt::print("training micro-batch max (per strategy, below){} x {} GPUs; {}, checkpointing {}, attention {}\n",
               r.global_batch > 0 ? fmt::format(" for global batch {}", r.global_batch)
                                  : fmt::format(" x grad-accum {}", t.grad_accum),
               r.cluster.world(), to_string(t.precision), to_string(t.checkpointing), to_string(t.attention));
  else
    fmt::print("training micro-batch {} x grad-accum {} x {} GPUs = global batch {}; {}, checkpointing {}, attention {}\n",
               t.micro_batch, t.grad_accum, r.cluster.world(), t.micro_batch * t.grad_accum * r.cluster.world(),
               to_string(t.precision), to_string(t.checkpointing), to_string(t.attention));
  std::string opt = fmt::format("{} lr {}", to_string(o.kind), number(o.lr));
  if (o.warmup_steps > 0) opt += fmt::format(" after {} warm-up steps", o.warmup_steps);
  opt += fmt::format(", cosine to min-lr {}", number(o.min_lr));
  if (o.kind == OptimizerKind::adamw) opt += fmt::format(", betas {},{}, eps {}", number(o.beta1), number(o.beta2), number(o.eps));
  if (o.kind == OptimizerKind::sgd_momentum) opt += fmt::format(", momentum {}", number(o.momentum));
  opt += fmt::format(", weight-decay {}, clip-norm {}", number(o.weight_decay), o.clip_norm > 0 ? number(o.clip_norm) : "off");
  fmt::print("         {}\n", opt);
  if (loss_scaled(t.precision))
    fmt::print("         fp16 loss scaling as GradScaler: scale from {} (x{} after {} clean steps, x{} and the step "
               "skipped on overflow); one flag all-reduced per step\n",
               number(t.loss_scaling.init_scale), number(t.loss_scaling.growth), t.loss_scaling.growth_interval,
               number(t.loss_scaling.backoff));
  if (t.fine_tuning.active())
    fmt::print("         fine-tuning: {}; frozen parameters have no gradients and no optimizer state\n",
               describe(t.fine_tuning, r.model));
  fmt::print("         bucket {} MiB (ddp, zero1), prefetch {} unit{} (zero3){}\n\n", number(t.bucket_mb), t.prefetch,
             t.prefetch == 1 ? "" : "s",
             t.offload == Offload::none ? ""
                                        : fmt::format("; CPU offload of the {}", t.offload == Offload::params
                                                                                     ? "parameters, gradients and optimizer"
                                                                                     : "gradients and optimizer"));
}

// CPU offload: what each node's host memory holds for its ranks (DESIGN.md,
// "Strategies"), against the cluster's host_memory_bytes.
void print_host_memory(const Planning& p) {
  fmt::print("Host memory per node under --offload {} (all its ranks; the device columns above hold none of it):\n",
             to_string(p.request.training.offload));
  fmt::print("{:<9}{:>12}{:>12}{:>12}{:>12}{:>14}  {}\n", "strategy", "params", "grads", "optimizer", "total", "of", "fits");
  for (const auto& r : p.results) {
    const HostMemory& h = r.host;
    auto b = [&](Category c) { return format_bytes(static_cast<double>(h.per_rank[static_cast<size_t>(c)] * h.ranks)); };
    fmt::print("{:<9}{:>12}{:>12}{:>12}{:>12}{:>14}  {}\n", to_string(r.strategy), b(Category::params), b(Category::grads),
               b(Category::optimizer), format_bytes(static_cast<double>(h.per_node)),
               h.capacity > 0 || p.request.cluster.device.host_memory_bytes > 0 ? format_bytes(static_cast<double>(h.capacity))
                                                                                : "not given",
               h.fits ? "yes" : "NO");
  }
  fmt::print("\n");
}

}  // namespace

void print_table(const Planning& p) {
  print_header(p);
  int64_t largest = 1;
  double traffic = 0;
  for (const auto& r : p.results) {
    largest = std::max(largest, r.walk.peak);
    traffic = std::max(traffic, r.comm.bytes);
  }
  const Unit mem = unit_for(static_cast<double>(largest), kMemoryUnits);
  const Unit net = unit_for(traffic, kTrafficUnits);
  const bool batch = p.request.max_micro_batch;
  // "comm-buf" is the memory of communication buffers; "traffic" what a GPU
  // sends per step; "comm" the communication stream's busy time.
  const std::string b1 = batch ? fmt::format("{:>7}{:>6}", "micro", "accum") : "";
  const std::string b2 = batch ? fmt::format("{:>7}{:>6}", "batch", "") : "";
  fmt::print("{:<9}{}{:>8}{:>8}{:>8}{:>8}{:>9}{:>9}{:>8}{:>8}{:>9}  {:<5}{:>9}{:>9}{:>10}{:>9}{:>7}\n", "", b1, "params",
             "grads", "optim", "activ", "gathered", "comm-buf", "wkspace", "peak", "+runtime", "fits", "traffic",
             "comm", "compute", "step", "MFU");
  fmt::print("{:<9}{}{:>8}{:>8}{:>8}{:>8}{:>9}{:>9}{:>8}{:>8}{:>9}  {:<5}{:>9}{:>9}{:>10}{:>9}{:>7}\n", "strategy", b2,
             mem.name, mem.name, mem.name, mem.name, mem.name, mem.name, mem.name, mem.name, mem.name, "", net.name,
             "ms", "ms", "ms", "%");
  auto m_ = [&](int64_t b) { return static_cast<double>(b) / mem.bytes; };
  for (const auto& r : p.results) {
    const auto& m = r.walk.at_peak;
    const std::string bb =
        batch ? fmt::format("{:>7}{:>6}", r.training.micro_batch, r.training.grad_accum) : "";
    fmt::print("{:<9}{}{:>8.2f}{:>8.2f}{:>8.2f}{:>8.2f}{:>9.2f}{:>9.2f}{:>8.2f}{:>8.2f}{:>9.2f}  {:<5}{:>9.2f}{:>9.1f}{:>10.1f}{:>9.1f}{:>7.1f}\n",
               to_string(r.strategy), bb, m_(m[0]), m_(m[1]), m_(m[2]), m_(m[3]), m_(m[4]), m_(m[5]), m_(m[6]),
               m_(r.walk.peak), m_(r.runtime_bytes), r.fits ? "yes" : "NO", r.comm.bytes / net.bytes,
               r.comm.seconds * 1e3, r.compute_seconds * 1e3, r.step_seconds * 1e3, r.mfu * 100);
  }
  fmt::print("\nMemory per GPU at the step's peak (comm-buf: communication buffers). Fits: peak + runtime + {:.0f}% "
             "fragmentation margin <= {}.\n",
             kFragmentationMargin * 100, format_bytes(static_cast<double>(device_capacity(p.request.cluster))));
  fmt::print("Traffic: bytes one GPU sends per step. Times from the step simulator: communication overlaps compute\n"
             "where the strategy allows; step = compute + the communication compute waits for (dlplan sim, --timeline).\n\n");
  if (p.request.training.offload != Offload::none) print_host_memory(p);
  for (const auto& line : recommendation_lines(p)) fmt::print("{}\n", line);
}

void print_csv(const Planning& p) {
  fmt::print("strategy,params_bytes,grads_bytes,optimizer_bytes,activations_bytes,gathered_bytes,comm_bytes,"
             "workspace_bytes,peak_bytes,runtime_bytes,fits,comm_bytes_per_step,comm_seconds,compute_seconds,"
             "step_seconds,mfu,recommended,micro_batch,grad_accum\n");
  for (const auto& r : p.results) {
    const auto& m = r.walk.at_peak;
    bool rec = p.recommendation.strategy && *p.recommendation.strategy == r.strategy;
    fmt::print("{},{},{},{},{},{},{},{},{},{},{},{:.0f},{:.6g},{:.6g},{:.6g},{:.4f},{},{},{}\n", to_string(r.strategy), m[0],
               m[1], m[2], m[3], m[4], m[5], m[6], r.walk.peak, r.runtime_bytes, r.fits, r.comm.bytes, r.comm.seconds,
               r.compute_seconds, r.step_seconds, r.mfu, rec, r.training.micro_batch, r.training.grad_accum);
  }
}

}  // namespace dlplan::cli
