// `dlplan plan` (also `dlplan --model M --gpus N`): flags -> PlanRequest ->
// planner -> table / JSON / CSV, and optionally the plan file.
#include "commands.hpp"
#include "dlplan/error.hpp"
#include "dlplan/importers.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"
#include "dlplan/simulator.hpp"
#include "report.hpp"

#include <sstream>

#include <fmt/format.h>

#include <algorithm>
#include <memory>

namespace dlplan::cli {
namespace {

struct PlanFlags {
  std::string model, gpu = "h100-80g", cluster_file, precision, optimizer = "adamw", checkpointing = "none";
  std::string strategy, syncbn = "auto", attention = "math", format = "table", out, timeline;
  int gpus = 0, nodes = 0, syncbn_group = 0, prefetch = 1;
  int64_t micro_batch = 1, global_batch = 0, grad_accum = 0, seq_len = 0;
  double bucket_mb = 25.0, lr = 3e-4;
  bool explain = false;
};

Cluster make_cluster(const PlanFlags& f, const CLI::App& app) {
  Cluster c;
  if (!f.cluster_file.empty()) {
    if (app.count("--gpu")) throw Error("give either --gpu or --cluster, not both");
    c = load_cluster_file(f.cluster_file);
  } else {
    try {
      c.device = find_device(f.gpu);
    } catch (const Error& e) {
      throw Error(fmt::format("--gpu: {}", e.what()));
    }
  }
  if (f.gpus < 0 || f.nodes < 0) throw Error("--gpus and --nodes must be positive");
  int nodes = f.nodes > 0 ? f.nodes : (f.gpus > 0 || f.cluster_file.empty() ? 1 : c.nodes);
  int total = f.gpus > 0 ? f.gpus : (f.cluster_file.empty() ? 1 : c.world());
  if (total % nodes != 0) throw Error(fmt::format("--gpus {} cannot be split evenly across --nodes {}", total, nodes));
  c.nodes = nodes;
  c.gpus_per_node = total / nodes;
  return c;
}

PlanRequest make_request(const PlanFlags& f, const CLI::App& app) {
  PlanRequest r;
  r.cluster = make_cluster(f, app);
  // ONNX symbolic dims (batch, sequence) take --micro-batch and --seq-len.
  r.model = load_model(f.model, ImportOptions{std::max<int64_t>(f.micro_batch, 1), std::max<int64_t>(f.seq_len, 0)});
  if (f.seq_len > 0 || app.count("--seq-len")) r.model = with_seq_len(r.model, f.seq_len);
  auto& t = r.training;
  t.precision = f.precision.empty() ? (r.cluster.device.kind == "cpu" ? Precision::fp32 : Precision::bf16_mixed)
                                    : parse_precision(f.precision);
  t.optimizer.kind = parse_optimizer(f.optimizer);
  t.optimizer.lr = f.lr;
  if (t.optimizer.kind != OptimizerKind::adamw) t.optimizer.weight_decay = 0.0;
  t.checkpointing = parse_checkpointing(f.checkpointing);
  t.attention = parse_attention(f.attention);
  t.micro_batch = f.micro_batch;
  if (t.micro_batch <= 0) throw Error(fmt::format("--micro-batch must be positive, got {}", t.micro_batch));
  const int64_t N = r.cluster.world();
  if (f.global_batch > 0) {
    if (f.global_batch % (t.micro_batch * N) != 0)
      throw Error(fmt::format("--global-batch {} is not a multiple of micro-batch {} x {} GPUs = {}", f.global_batch,
                              t.micro_batch, N, t.micro_batch * N));
    t.grad_accum = f.global_batch / (t.micro_batch * N);
    if (f.grad_accum > 0 && f.grad_accum != t.grad_accum)
      throw Error(fmt::format("--global-batch {} needs --grad-accum {}, not {}", f.global_batch, t.grad_accum, f.grad_accum));
  } else if (app.count("--global-batch")) {
    throw Error(fmt::format("--global-batch must be positive, got {}", f.global_batch));
  } else {
    t.grad_accum = app.count("--grad-accum") ? f.grad_accum : 1;
  }
  t.bucket_mb = f.bucket_mb;
  t.prefetch = f.prefetch;
  t.syncbn_group = f.syncbn_group;
  if (app.count("--syncbn-group") && f.syncbn_group <= 0)
    throw Error(fmt::format("--syncbn-group must be positive, got {}", f.syncbn_group));
  if (!f.strategy.empty()) r.forced = parse_strategy(f.strategy);
  r.syncbn = parse_syncbn_mode(f.syncbn);
  r.explain = f.explain;
  return r;
}

}  // namespace

Runner add_plan_command(CLI::App& app) {
  auto f = std::make_shared<PlanFlags>();
  app.add_option("--model", f->model, "A zoo name (dlplan models) or an IR JSON file")->required();
  app.add_option("--gpus", f->gpus, "Data-parallel ranks in all (default 1)");
  app.add_option("--nodes", f->nodes, "Nodes the GPUs are split across (default 1)");
  app.add_option("--gpu", f->gpu, "GPU kind from the catalog (dlplan gpus)")->capture_default_str();
  app.add_option("--cluster", f->cluster_file, "A cluster description JSON (instead of --gpu)");
  app.add_option("--micro-batch", f->micro_batch, "Samples per GPU per micro-batch")->capture_default_str();
  app.add_option("--global-batch", f->global_batch, "Samples per step in all (sets --grad-accum)");
  app.add_option("--grad-accum", f->grad_accum, "Micro-batches accumulated per step (default 1)");
  app.add_option("--precision", f->precision, "fp32 or bf16-mixed (default bf16-mixed; fp32 on cpu)");
  app.add_option("--optimizer", f->optimizer, "adamw, sgd or sgd-momentum")->capture_default_str();
  app.add_option("--checkpointing", f->checkpointing, "Activation checkpointing: none or units")->capture_default_str();
  app.add_option("--strategy", f->strategy, "Force one strategy: ddp, zero1, zero2, zero3");
  app.add_option("--syncbn", f->syncbn, "SyncBatchNorm: auto, on or off")->capture_default_str();
  app.add_option("--syncbn-group", f->syncbn_group, "Ranks per SyncBN group (default: the advice's, or all)");
  app.add_option("--seq-len", f->seq_len, "Length of the token inputs (within the position table)");
  app.add_option("--attention", f->attention, "Attention: math (keeps probabilities) or flash")->capture_default_str();
  app.add_option("--bucket-mb", f->bucket_mb, "DDP / ZeRO-1 gradient bucket size, MiB")->capture_default_str();
  app.add_option("--prefetch", f->prefetch, "ZeRO-3 units gathered ahead")->capture_default_str();
  app.add_option("--lr", f->lr, "Peak learning rate written into the plan")->capture_default_str();
  app.add_option("--format", f->format, "table, json or csv")->capture_default_str()->check(CLI::IsMember({"table", "json", "csv"}));
  app.add_option("--out", f->out, "Write the recommended (or --strategy) plan to this file, for `dlplan train`");
  app.add_flag("--explain", f->explain, "List the tensors that make up the peak, largest first");
  app.add_option("--timeline", f->timeline, "Write the recommended plan's simulated step as a Chrome trace (Perfetto)");
  return [f, &app]() {
    PlanRequest req = make_request(*f, app);
    Planning p = plan(req);
    if (f->format == "json") fmt::print("{}\n", planning_json(p).dump(2));
    else if (f->format == "csv") print_csv(p);
    else print_table(p);
    if (f->explain) print_explain(p);
    if (!f->timeline.empty()) {
      const StrategyResult* r = p.chosen();
      if (!r) throw Error(fmt::format("{}: not written: no strategy fits", f->timeline));
      std::ostringstream trace;
      write_chrome_trace(simulate_step(req.model, req.cluster, r->training),
                         fmt::format("{} {} on {} x {}", req.model.name, to_string(r->strategy), req.cluster.world(),
                                     req.cluster.device.kind),
                         trace);
      write_file_atomically(f->timeline, trace.str());
    }
    if (!f->out.empty()) {
      const StrategyResult* r = p.chosen();
      if (!r) throw Error(fmt::format("{}: not written: no strategy fits (see the reasons above)", f->out));
      write_file_atomically(f->out, plan_json(p, *r).dump(1) + "\n");
      fmt::print(stderr, "wrote {} ({}{})\n", f->out, to_string(r->strategy), r->fits ? "" : ", does NOT fit");
    }
    return 0;
  };
}

}  // namespace dlplan::cli
