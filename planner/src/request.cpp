// The one request builder: flags (CLI) or controls (GUI) -> PlanRequest.
// Every value is checked here, once; a bad one is a UsageError naming the
// flag, never a silent default.
#include "dlplan/request.hpp"

#include "dlplan/fine_tuning.hpp"
#include "dlplan/importers.hpp"
#include "dlplan/json_file.hpp"
#include "dlplan/limits.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/ops.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

namespace dlplan {
namespace {

constexpr int64_t kMaxGpus = int64_t{1} << 20;

template <typename T>
T checked(const std::optional<T>& v, T fallback, const char* flag, T lo, T hi, const char* what) {
  if (!v) return fallback;
  if (!(*v >= lo && *v <= hi)) {  // also refuses NaN
    if constexpr (std::is_floating_point_v<T>) throw UsageError(fmt::format("{} must be {}, got {:g}", flag, what, *v));
    else throw UsageError(fmt::format("{} must be {}, got {}", flag, what, *v));
  }
  return *v;
}

int64_t positive(const std::optional<int64_t>& v, int64_t fallback, const char* flag, int64_t hi) {
  return checked<int64_t>(v, fallback, flag, 1, hi, fmt::format("a positive integer (at most {})", hi).c_str());
}

// --gpus N --nodes K (0: not given, 1) as K nodes of N/K GPUs.
void shape_by_flags(Cluster& c, int64_t gpus_flag, int64_t nodes_flag) {
  const int64_t total = gpus_flag > 0 ? gpus_flag : 1, nodes = nodes_flag > 0 ? nodes_flag : 1;
  if (total % nodes != 0)
    throw UsageError(fmt::format("--gpus {} cannot be split evenly across --nodes {}", total, nodes));
  c.nodes = static_cast<int>(nodes);
  c.gpus_per_node = static_cast<int>(total / nodes);
}

// The cluster: a catalog GPU shaped by --gpus/--nodes, or a --cluster file
// whose topology is kept. Against a file that says K nodes x G, --gpus and
// --nodes may take a part of it (whole nodes, or part of one node) but never
// more than it has, nor another node size.
Cluster make_cluster(const RequestFlags& f, std::string* source) {
  const int64_t gpus_flag = f.gpus ? positive(f.gpus, 1, "--gpus", kMaxGpus) : 0;
  const int64_t nodes_flag = f.nodes ? positive(f.nodes, 1, "--nodes", kMaxGpus) : 0;
  Cluster c;
  if (f.cluster_file.empty()) {
    try {
      c.device = find_device(f.gpu.empty() ? kDefaultGpu : f.gpu);
    } catch (const Error& e) {
      throw UsageError(fmt::format("--gpu: {}", e.what()));
    }
    shape_by_flags(c, gpus_flag, nodes_flag);
    return c;
  }
  if (!f.gpu.empty()) throw UsageError("give either --gpu or --cluster, not both");
  c = load_cluster_file(f.cluster_file);
  *source = f.cluster_file;
  if (!cluster_file_topology(f.cluster_file)) {  // a device description: shaped by the flags
    shape_by_flags(c, gpus_flag, nodes_flag);
    return c;
  }
  const int file_nodes = c.nodes, file_per_node = c.gpus_per_node;
  const std::string shape = fmt::format("{} says {} node{} x {} GPUs", f.cluster_file, file_nodes,
                                        file_nodes == 1 ? "" : "s", file_per_node);
  int64_t total = gpus_flag > 0 ? gpus_flag : c.world();
  int64_t nodes = nodes_flag;
  if (nodes == 0) {
    if (total == c.world()) nodes = file_nodes;
    else if (total <= file_per_node) nodes = 1;  // part of one node
    else if (total % file_per_node == 0) nodes = total / file_per_node;  // whole nodes
    else
      throw UsageError(fmt::format("--gpus {} is not whole nodes of the cluster ({}); give --nodes as well, or a "
                                   "multiple of {}",
                                   total, shape, file_per_node));
  }
  if (total % nodes != 0)
    throw UsageError(fmt::format("--gpus {} cannot be split evenly across --nodes {}", total, nodes));
  const int64_t per_node = total / nodes;
  if (nodes > file_nodes || per_node > file_per_node)
    throw UsageError(fmt::format("--gpus {}{} asks for {} node{} x {} GPUs, more than the cluster has ({}); "
                                 "edit the file, or leave out --gpus and --nodes to use it as it is",
                                 total, nodes_flag > 0 ? fmt::format(" --nodes {}", nodes_flag) : "", nodes,
                                 nodes == 1 ? "" : "s", per_node, shape));
  c.nodes = static_cast<int>(nodes);
  c.gpus_per_node = static_cast<int>(per_node);
  return c;
}

// Learned position tables (pos_embedding, max_len) bound the sequence length;
// rotary positions do not, but beyond the model's context they extrapolate.
void check_seq_len(const Model& m, int64_t seq_len, int64_t context, std::vector<std::string>& notes) {
  for (const auto& n : m.nodes)
    if (n.op == OpKind::pos_embedding && n.attrs.has("max_len") && !n.attrs.has("row") && !n.attrs.has("sinusoidal") &&
        seq_len + (n.attrs.has("offset") ? n.attrs.integer("offset") : 0) > n.attrs.integer("max_len"))
      throw UsageError(fmt::format(
          "{}: --seq-len {} exceeds the learned position table of node '{}' (max_len {}{}): a model with learned "
          "positions cannot run longer sequences",
          m.source, seq_len, n.name, n.attrs.integer("max_len"),
          n.attrs.has("offset") ? fmt::format(", read from row {}", n.attrs.integer("offset")) : ""));
  if (seq_len <= context) return;
  const bool rope = std::any_of(m.nodes.begin(), m.nodes.end(),
                                [](const Node& n) { return n.op == OpKind::attention && n.attrs.flag("rope"); });
  notes.push_back(fmt::format(
      "--seq-len {} is beyond the model's context of {} tokens{}; memory and time are planned at {}", seq_len, context,
      rope ? " (rotary positions extrapolate there; quality needs long-context training or RoPE scaling)" : "",
      seq_len));
}

// A mixture of experts with a capacity below the sample's tokens drops the
// tokens over it (GShard, Switch); Mixtral trains dropless. An expert never
// gets more than T tokens (one choice per token), so capacity T drops none.
void note_dropped_tokens(Model& m) {
  const Node* first = nullptr;
  int dropping = 0;
  for (const auto& n : m.nodes)
    if (n.op == OpKind::moe_combine && moe_routing(m, n).C < moe_routing(m, n).T) {
      if (!first) first = &n;
      ++dropping;
    }
  if (!first) return;
  const MoeRouting r = moe_routing(m, *first);
  m.notes.push_back(fmt::format(
      "mixture of experts: in node '{}'{}, each of {} experts takes at most {} of a sample's {} tokens (capacity factor "
      "{}) and drops the choices over it, as GShard and Switch train; Mixtral trains dropless (--capacity-factor {} "
      "drops none, with {} rows per expert buffer)",
      first->name, dropping > 1 ? fmt::format(" and {} more", dropping - 1) : "", r.E, r.C, r.T,
      first->attrs.number("capacity_factor"), static_cast<double>(r.E) / static_cast<double>(r.k), r.T));
}

}  // namespace

std::optional<std::pair<int, int>> cluster_file_topology(const std::string& path) {
  const Cluster c = load_cluster_file(path);  // errors name the file
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || (!j.contains("nodes") && !j.contains("gpus_per_node"))) return std::nullopt;
  return std::pair{c.nodes, c.gpus_per_node};
}

void parse_micro_batch(const std::string& text, RequestFlags& f) {
  if (text == "max") {
    f.micro_batch_max = true;
    f.micro_batch.reset();
    return;
  }
  f.micro_batch_max = false;
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    throw UsageError(fmt::format("--micro-batch must be a positive integer or 'max', got '{}'", text));
  f.micro_batch = v;
}

bool imports_model(const std::string& model) {
  const auto ext = std::filesystem::path(model).extension().string();
  return ext == ".onnx" || ext == ".ONNX" ||
         (ext == ".json" && std::filesystem::exists(model) && is_hf_config(read_json_file(model, "model file")));
}

FusionMode parse_fusion(const std::string& fusion, const std::string& model) {
  if (fusion.empty()) return FusionMode::engine;
  const auto mode = fusion_from_string(fusion);
  if (!mode) throw UsageError(fmt::format("--fusion must be engine or eager, got '{}'", fusion));
  if (!imports_model(model))
    throw UsageError(fmt::format("--fusion applies to the files dlplan imports (ONNX, a Hugging Face config.json); "
                                 "'{}' is not one", model));
  return *mode;
}

PlanRequest build_request(const RequestFlags& f, const ModelLoader& load) {
  PlanRequest r;
  r.cluster = make_cluster(f, &r.cluster_source);
  const int64_t N = r.cluster.world();

  // ---- model and sequence length ----
  const int64_t micro = f.micro_batch_max ? 1 : positive(f.micro_batch, 1, "--micro-batch", kMaxMicroBatch);
  const int64_t seq_len = f.seq_len ? positive(f.seq_len, 0, "--seq-len", int64_t{1} << 24) : 0;
  if (f.model.empty()) throw UsageError("--model is required (a zoo name, see `dlplan models`, or a file)");
  // ONNX symbolic dims (batch, sequence) take --micro-batch and --seq-len.
  ImportOptions import{micro, seq_len};
  import.fusion = parse_fusion(f.fusion, f.model);
  r.model = load ? load(f.model, import) : load_model(f.model, import);
  r.model_context = tokens_per_sample(r.model);
  if (seq_len > 0) {
    if (r.model_context == 0)
      throw UsageError(fmt::format("{}: the model has no token inputs ([T] i32), so --seq-len does not apply",
                                   r.model.source));
    std::vector<std::string> notes;
    check_seq_len(r.model, seq_len, r.model_context, notes);
    r.model = with_seq_len(r.model, seq_len);
    r.model.notes.insert(r.model.notes.end(), notes.begin(), notes.end());
  }
  if (f.decoder_seq_len)
    r.model = with_decoder_seq_len(r.model, positive(f.decoder_seq_len, 0, "--decoder-seq-len", int64_t{1} << 24));
  if (f.capacity_factor) {
    if (!(*f.capacity_factor > 0) || !std::isfinite(*f.capacity_factor))
      throw UsageError(fmt::format("--capacity-factor must be positive, got {}", *f.capacity_factor));
    if (std::none_of(r.model.nodes.begin(), r.model.nodes.end(), [](const Node& n) { return n.op == OpKind::moe_combine; }))
      throw UsageError(fmt::format(
          "{}: the model has no mixture of experts (moe_combine node), so --capacity-factor does not apply",
          r.model.source));
    r.model = with_capacity_factor(r.model, *f.capacity_factor);
  }
  if (f.expert_units) {
    if (std::none_of(r.model.nodes.begin(), r.model.nodes.end(), [](const Node& n) { return n.op == OpKind::moe_expert; }))
      throw UsageError(fmt::format(
          "{}: the model has no mixture of experts (moe_expert nodes), so --expert-units does not apply", r.model.source));
    r.model = with_expert_units(r.model);
    const auto experts = std::count_if(r.model.nodes.begin(), r.model.nodes.end(),
                                       [](const Node& n) { return n.op == OpKind::moe_expert; });
    r.model.notes.push_back(fmt::format(
        "each of the {} experts is a unit of its own (--expert-units): under zero3 / hsdp3 it is gathered just before "
        "it runs, inside its layer's unit, and its gradient reduce-scattered on its own",
        experts));
  }
  note_dropped_tokens(r.model);

  // ---- training knobs ----
  auto& t = r.training;
  const DeviceSpec& d = r.cluster.device;
  if (f.precision.empty()) {
    // A GPU trains in mixed precision: bf16 where it has it, else fp16 with
    // loss scaling (V100, T4); the CPU engine in fp32.
    if (d.kind == "cpu") t.precision = Precision::fp32;
    else if (d.has_bf16()) t.precision = Precision::bf16_mixed;
    else if (d.has_fp16()) t.precision = Precision::fp16_mixed;
    else t.precision = Precision::fp32;
  } else {
    try {
      t.precision = parse_precision(f.precision);
    } catch (const Error& e) {
      throw UsageError(fmt::format("--precision: {}", e.what()));
    }
  }
  auto parse = [](const char* flag, auto parser, const std::string& text) {
    try {
      return parser(text);
    } catch (const UsageError&) {
      throw;
    } catch (const Error& e) {
      throw UsageError(fmt::format("{}: {}", flag, e.what()));
    }
  };
  t.checkpointing = parse("--checkpointing", parse_checkpointing, f.checkpointing);
  t.attention = parse("--attention", parse_attention, f.attention);
  if (!f.strategy.empty()) r.forced = parse("--strategy", parse_strategy, f.strategy);
  t.offload = parse("--offload", parse_offload, f.offload);
  if (r.forced) {  // without --strategy, only the strategies offload goes with are compared
    TrainingConfig forced = t;
    forced.strategy = *r.forced;
    if (const std::string why = offload_conflict(forced); !why.empty()) throw UsageError(why);
  }
  r.syncbn = parse_syncbn_mode(f.syncbn);

  // ---- batch ----
  t.micro_batch = micro;
  r.max_micro_batch = f.micro_batch_max;
  if (f.global_batch) {
    const int64_t g = positive(f.global_batch, 0, "--global-batch", kMaxGlobalBatch);
    if (f.micro_batch_max) {
      if (f.grad_accum) throw UsageError("--micro-batch max with --global-batch solves for --grad-accum: give only one");
      if (g % N != 0) throw UsageError(fmt::format("--global-batch {} is not a multiple of the {} GPUs", g, N));
      r.global_batch = g;
      t.grad_accum = 1;
    } else {
      if (g % (micro * N) != 0)
        throw UsageError(fmt::format("--global-batch {} is not a multiple of micro-batch {} x {} GPUs = {}", g, micro,
                                     N, micro * N));
      t.grad_accum = g / (micro * N);
      if (f.grad_accum && *f.grad_accum != t.grad_accum)
        throw UsageError(fmt::format("--global-batch {} needs --grad-accum {}, not {}", g, t.grad_accum, *f.grad_accum));
    }
  } else {
    t.grad_accum = positive(f.grad_accum, 1, "--grad-accum", kMaxGradAccum);
  }

  // ---- optimizer: what the plan file's "optimizer" block holds ----
  auto& o = t.optimizer;
  o.kind = parse("--optimizer", parse_optimizer, f.optimizer);
  const bool adam = o.kind == OptimizerKind::adamw;
  o.lr = checked<double>(f.lr, kDefaultLr, "--lr", 1e-12, 10.0, "positive (at most 10)");
  o.min_lr = checked<double>(f.min_lr, 0.0, "--min-lr", 0.0, o.lr, fmt::format("between 0 and --lr ({:g})", o.lr).c_str());
  o.warmup_steps = static_cast<int>(checked<int64_t>(f.warmup_steps, 0, "--warmup-steps", 0, 1 << 30, "0 or more"));
  o.clip_norm = checked<double>(f.clip_norm, o.clip_norm, "--clip-norm", 0.0, 1e12, "0 (off) or more");
  o.weight_decay = checked<double>(f.weight_decay, adam ? o.weight_decay : 0.0, "--weight-decay", 0.0, 10.0,
                                   "between 0 and 10");
  o.eps = checked<double>(f.eps, o.eps, "--eps", 1e-30, 1.0, "positive (at most 1)");
  if (f.betas && !adam) throw UsageError(fmt::format("--betas applies to adamw, not {}", to_string(o.kind)));
  if (f.betas) {
    o.beta1 = checked<double>(f.betas->first, 0, "--betas (beta1)", 0.0, 0.999999, "in [0, 1)");
    o.beta2 = checked<double>(f.betas->second, 0, "--betas (beta2)", 0.0, 0.999999999, "in [0, 1)");
  }
  if (f.eps && !adam) throw UsageError(fmt::format("--eps applies to adamw, not {}", to_string(o.kind)));
  if (f.momentum && o.kind != OptimizerKind::sgd_momentum)
    throw UsageError(fmt::format("--momentum applies to sgd-momentum, not {}", to_string(o.kind)));
  o.momentum = checked<double>(f.momentum, o.momentum, "--momentum", 0.0, 0.999999, "in [0, 1)");

  // ---- communication knobs ----
  t.bucket_mb = checked<double>(f.bucket_mb, t.bucket_mb, "--bucket-mb", 1.0 / 1024, kMaxBucketMb, fmt::format("positive (at most {:g})", kMaxBucketMb).c_str());
  t.prefetch = static_cast<int>(checked<int64_t>(f.prefetch, t.prefetch, "--prefetch", 0, kMaxPrefetch, fmt::format("between 0 and {}", kMaxPrefetch).c_str()));
  if (f.syncbn_group) t.syncbn_group = static_cast<int>(positive(f.syncbn_group, 0, "--syncbn-group", kMaxGpus));
  // Hybrid sharding's group: one node unless given (DESIGN.md, "Strategies").
  if (f.shard_group && r.forced && !hybrid(*r.forced))
    throw UsageError(fmt::format("--shard-group applies to hsdp2 and hsdp3, not {}", to_string(*r.forced)));
  t.shard_group = static_cast<int>(f.shard_group ? positive(f.shard_group, 0, "--shard-group", kMaxGpus)
                                                 : r.cluster.gpus_per_node);
  if (N % t.shard_group != 0)
    throw UsageError(fmt::format("--shard-group {} does not divide the {} GPUs", t.shard_group, N));
  if (r.forced && hybrid(*r.forced) && t.shard_group < 2)
    throw UsageError(fmt::format("{} shards inside groups of 2 or more ranks; the shard group is {} ({}: set "
                                 "--shard-group)",
                                 to_string(*r.forced), t.shard_group,
                                 f.shard_group ? "--shard-group" : "one node of 1 GPU"));
  // Parameter offload moves shards; one rank (or a group of one) has none.
  if (t.offload == Offload::params && shard_world(t, N) < 2)
    throw UsageError(fmt::format("--offload params moves parameter shards, and {} shards nothing: use --offload "
                                 "optimizer, or 2 or more GPUs",
                                 N == 1 ? "one GPU" : "a shard group of one GPU"));
  // ---- fine-tuning: adapters added, frozen parameters marked ----
  t.fine_tuning.freeze = split_list(f.freeze);
  t.fine_tuning.lora_targets = split_list(f.lora_targets);
  if (f.lora) t.fine_tuning.lora_rank = positive(f.lora, 0, "--lora", int64_t{1} << 20);
  if (f.lora_alpha) {
    if (!(*f.lora_alpha > 0) || !std::isfinite(*f.lora_alpha))
      throw UsageError(fmt::format("--lora-alpha must be a positive number, got {}", *f.lora_alpha));
    t.fine_tuning.lora_alpha = *f.lora_alpha;
  }
  apply_fine_tuning(r.model, t.fine_tuning);
  r.explain = f.explain;
  validate(r);
  try {  // the limits every reader enforces (limits.hpp), here as usage errors
    check_training_limits(r.model, r.cluster, r.training, "");
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  return r;
}

}  // namespace dlplan
