// `dlplan plan` (also `dlplan --model M --gpus N`): flags -> RequestFlags ->
// build_request (the planner's one request builder, shared with the GUI) ->
// plan -> table / JSON / CSV, and optionally the plan file and the trace.
// stdout holds only the requested format: with --format csv the --explain
// text goes to stderr, with --format json it is the document's "explain".
#include "commands.hpp"
#include "dlplan/error.hpp"
#include "dlplan/explain.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/request.hpp"
#include "dlplan/simulator.hpp"
#include "report.hpp"

#include <fmt/format.h>

#include <memory>
#include <sstream>

namespace dlplan::cli {
namespace {

// What CLI11 parses into; the flags a user gave become RequestFlags.
struct PlanFlags {
  RequestFlags request;
  std::string micro_batch = "1", format = "table", out, timeline;
  int64_t gpus = 0, nodes = 0, global_batch = 0, grad_accum = 0, seq_len = 0, decoder_seq_len = 0, syncbn_group = 0, prefetch = 0,
          warmup_steps = 0, shard_group = 0;
  double capacity_factor = 0, bucket_mb = 0, lr = 0, min_lr = 0, clip_norm = 0, weight_decay = 0, eps = 0, momentum = 0;
  std::vector<double> betas;
};

// Optional numbers: set when the flag was given.
template <typename T>
void given(const CLI::App& app, const char* flag, const T& value, std::optional<T>& into) {
  if (app.count(flag) > 0) into = value;
}

RequestFlags request_flags(PlanFlags& f, const CLI::App& app) {
  RequestFlags r = f.request;
  given(app, "--gpus", f.gpus, r.gpus);
  given(app, "--nodes", f.nodes, r.nodes);
  given(app, "--global-batch", f.global_batch, r.global_batch);
  given(app, "--grad-accum", f.grad_accum, r.grad_accum);
  given(app, "--seq-len", f.seq_len, r.seq_len);
  given(app, "--decoder-seq-len", f.decoder_seq_len, r.decoder_seq_len);
  given(app, "--capacity-factor", f.capacity_factor, r.capacity_factor);
  given(app, "--syncbn-group", f.syncbn_group, r.syncbn_group);
  given(app, "--prefetch", f.prefetch, r.prefetch);
  given(app, "--shard-group", f.shard_group, r.shard_group);
  given(app, "--warmup-steps", f.warmup_steps, r.warmup_steps);
  given(app, "--bucket-mb", f.bucket_mb, r.bucket_mb);
  given(app, "--lr", f.lr, r.lr);
  given(app, "--min-lr", f.min_lr, r.min_lr);
  given(app, "--clip-norm", f.clip_norm, r.clip_norm);
  given(app, "--weight-decay", f.weight_decay, r.weight_decay);
  given(app, "--eps", f.eps, r.eps);
  given(app, "--momentum", f.momentum, r.momentum);
  if (app.count("--betas") > 0) {
    if (f.betas.size() != 2) throw UsageError(fmt::format("--betas takes two numbers, BETA1,BETA2 (got {})", f.betas.size()));
    r.betas = std::pair{f.betas[0], f.betas[1]};
  }
  parse_micro_batch(f.micro_batch, r);
  return r;
}

}  // namespace

Runner add_plan_command(CLI::App& app) {
  auto f = std::make_shared<PlanFlags>();
  RequestFlags& r = f->request;
  app.add_option("--model", r.model, "A zoo name (dlplan models), or a file: IR JSON, ONNX, Hugging Face config.json")->required();
  app.add_option("--gpus", f->gpus, "Data-parallel ranks in all (default 1, or the --cluster file's)");
  app.add_option("--nodes", f->nodes, "Nodes the GPUs are split across (default 1, or the --cluster file's)");
  app.add_option("--gpu", r.gpu, "GPU kind from the catalog (dlplan gpus; default h100-80g)");
  app.add_option("--cluster", r.cluster_file, "A cluster description JSON (instead of --gpu); its topology is kept");
  app.add_option("--micro-batch", f->micro_batch, "Samples per GPU per micro-batch, or max: the largest that fits, per strategy")
      ->capture_default_str();
  app.add_option("--global-batch", f->global_batch, "Samples per step in all (sets --grad-accum; with --micro-batch max, both)");
  app.add_option("--grad-accum", f->grad_accum, "Micro-batches accumulated per step (default 1)");
  app.add_option("--seq-len", f->seq_len, "Tokens per sample (default: the model's context)");
  app.add_option("--decoder-seq-len", f->decoder_seq_len,
                 "Encoder-decoder models (T5): the decoder's tokens per sample (default: --seq-len, else the model's)");
  app.add_option("--fusion", r.fusion,
                 "ONNX files and Hugging Face configs: engine (default) fuses every pattern dlplan's engine has one op "
                 "for; eager plans math written out in Python (gelu_new, RMSNorm) op by op, keeping what PyTorch's "
                 "eager autograd keeps (max pools their input and int64 indices, a kept slice its whole storage)");
  app.add_option("--capacity-factor", f->capacity_factor,
                 "Mixture of experts: each expert takes capacity-factor x tokens x top_k / experts tokens of a sample "
                 "and drops the rest (default: the model's, 1.25; experts / top_k drops none)");
  app.add_flag("--expert-units", r.expert_units,
               "Mixture of experts: each expert its own ZeRO-3 / checkpointing unit inside its layer's, gathered "
               "just before it runs (FSDP wrapping each MixtralBlockSparseTop2MLP); default: the layer's unit");
  app.add_option("--precision", r.precision, "fp32, bf16-mixed or fp16-mixed (loss-scaled, as GradScaler); default: bf16-mixed where the device has bf16, else fp16-mixed, fp32 on the cpu device");
  app.add_option("--optimizer", r.optimizer, "adamw, sgd or sgd-momentum")->capture_default_str();
  app.add_option("--lr", f->lr, "Peak learning rate (default 3e-4)");
  app.add_option("--min-lr", f->min_lr, "Learning rate at the end of the cosine schedule (default 0)");
  app.add_option("--warmup-steps", f->warmup_steps, "Linear warm-up steps before the cosine schedule (default 0)");
  app.add_option("--clip-norm", f->clip_norm, "Global gradient-norm clipping; 0 turns it off (default 1)");
  app.add_option("--weight-decay", f->weight_decay, "Decoupled weight decay (default 0.1 for adamw, 0 for sgd)");
  app.add_option("--betas", f->betas, "AdamW's BETA1,BETA2 (default 0.9,0.95)")->delimiter(',')->expected(1, 2);
  app.add_option("--eps", f->eps, "AdamW's epsilon (default 1e-8)");
  app.add_option("--momentum", f->momentum, "SGD momentum with sgd-momentum (default 0.9)");
  app.add_option("--checkpointing", r.checkpointing, "Activation checkpointing: none or units")->capture_default_str();
  app.add_option("--attention", r.attention, "Attention: math (keeps probabilities) or flash")->capture_default_str();
  app.add_option("--strategy", r.strategy, "Force one strategy: ddp, zero1, zero2, zero3, hsdp2, hsdp3");
  app.add_option("--shard-group", f->shard_group,
                 "hsdp2 / hsdp3: ranks per shard group, contiguous (default: one node)");
  app.add_option("--offload", r.offload,
                 "CPU offload: none, optimizer (ZeRO-Offload: gradients, optimizer state and step on the host) or "
                 "params (zero3, hsdp3: the parameter shards too)")
      ->capture_default_str();
  app.add_option("--freeze", r.freeze,
                 "Freeze parameters: comma-separated globs over node or unit names ('wte,wpe,h.0.*'); they get no "
                 "gradients and no optimizer state");
  app.add_option("--lora", r.lora, "LoRA adapters of this rank beside the targeted weights; the base model is frozen");
  app.add_option("--lora-targets", r.lora_targets,
                 "With --lora: globs over linear nodes, and q, k, v, o for attention's projections (default q,v)");
  app.add_option("--lora-alpha", r.lora_alpha, "With --lora: the adapters' scale is alpha / r (default alpha = r)");
  app.add_option("--syncbn", r.syncbn, "SyncBatchNorm: auto, on or off")->capture_default_str();
  app.add_option("--syncbn-group", f->syncbn_group, "Ranks per SyncBN group (default: the advice's, or all)");
  app.add_option("--bucket-mb", f->bucket_mb, "DDP / ZeRO-1 gradient bucket size, MiB (default 25)");
  app.add_option("--prefetch", f->prefetch, "ZeRO-3 units gathered ahead (default 1)");
  app.add_option("--format", f->format, "table, json or csv")->capture_default_str()->check(CLI::IsMember({"table", "json", "csv"}));
  app.add_option("--out", f->out, "Write the recommended (or --strategy) plan to this file, for `dlplan train`");
  app.add_flag("--explain", r.explain, "The tensors that make up the peak, and the model states against the ZeRO and DeepSpeed formulas");
  app.add_option("--timeline", f->timeline, "Write the recommended plan's simulated step as a Chrome trace (Perfetto)");
  return [f, &app]() {
    const PlanRequest req = build_request(request_flags(*f, app));
    const Planning p = plan(req);
    if (f->format == "json") {
      fmt::print("{}\n", planning_document(p, req.explain).dump(2));
    } else if (f->format == "csv") {
      print_csv(p);
      if (req.explain)
        for (const auto& line : explain_lines(p)) fmt::print(stderr, "{}\n", line);
    } else {
      print_table(p);
      if (req.explain) {
        fmt::print("\n");
        for (const auto& line : explain_lines(p)) fmt::print("{}\n", line);
      }
    }
    if (!f->timeline.empty()) {
      const StrategyResult* r = p.chosen();
      if (!r) throw Error(fmt::format("{}: not written: no strategy fits", f->timeline));
      std::ostringstream trace;
      write_chrome_trace(simulate_step(req.model, req.cluster, r->training),
                         fmt::format("{} {} on {} x {}", req.model.name, to_string(r->strategy), req.cluster.world(),
                                     req.cluster.device.kind),
                         trace);
      write_file_atomically(f->timeline, trace.str());
      fmt::print(stderr, "wrote {}\n", f->timeline);
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
