// `dlplan export` (issue 19): a plan as a DeepSpeed config and as a PyTorch
// FSDP/DDP setup file. docs/export.md has the mapping table; every value a
// target needs that the plan does not decide stays at the target's default
// and is listed in the output (`_comment`, or a comment block).
#include "dlplan/export.hpp"

#include "dlplan/error.hpp"
#include "dlplan/fine_tuning.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace dlplan {
namespace {

// ---- shared ---------------------------------------------------------------------

// The parameters of each IR unit (units[0], "", is the root unit: embeddings,
// tied weights, the head).
std::vector<int64_t> unit_params(const Model& m) {
  std::vector<int64_t> n(m.units.size(), 0);
  for (const auto& p : m.params) n.at(static_cast<size_t>(p.unit)) += p.numel;
  return n;
}

int64_t largest_unit_params(const Model& m) {
  const auto n = unit_params(m);
  return n.size() > 1 ? *std::max_element(n.begin() + 1, n.end()) : n.at(0);
}

// "h.0, h.1, ..., h.23" (at most 4 names shown).
std::string unit_names(const Model& m) {
  std::vector<std::string> names(m.units.begin() + 1, m.units.end());
  if (names.empty()) return "none (the model has only its root unit)";
  if (names.size() <= 4) return fmt::format("{}", fmt::join(names, ", "));
  return fmt::format("{}, {}, ..., {} ({} units)", names[0], names[1], names.back(), names.size());
}

std::string what_was_planned(const PlanDocument& p) {
  const TrainingConfig& t = p.training;
  return fmt::format("{} ({} params), {} on {} x {} ({} node(s) x {}), {}, checkpointing {}", p.model.name,
                     p.model.parameter_count(), to_string(t.strategy), p.cluster.world(), p.cluster.device.kind,
                     p.cluster.nodes, p.cluster.gpus_per_node, to_string(t.precision), to_string(t.checkpointing));
}

std::string steps_note(const ExportOptions& opt) {
  return opt.steps_given ? fmt::format("{} optimizer steps (--steps)", opt.steps)
                         : fmt::format("{} optimizer steps: a placeholder (dlplan export --steps N sets the run's)",
                                       opt.steps);
}

[[noreturn]] void unknown_strategy(Strategy s, const char* target) {
  throw Error(fmt::format("export: strategy {} has no {} equivalent (ddp, zero1, zero2 and zero3 do{})",
                          to_string(s), target,
                          std::string(target) == "DeepSpeed" ? "; hsdp3 is MiCS" : "; hsdp2 and hsdp3 are HYBRID_SHARD"));
}

// ---- DeepSpeed (https://www.deepspeed.ai/docs/config-json/) ---------------------

int zero_stage(Strategy s) {
  switch (s) {
    case Strategy::ddp: return 0;
    case Strategy::zero1: return 1;
    case Strategy::zero2: return 2;
    case Strategy::zero3: return 3;
    case Strategy::hsdp3: return 3;  // with mics_shard_size (ds_zero)
    case Strategy::hsdp2: break;     // DeepSpeed's MiCS shards parameters too: no ZeRO-2 flavour
  }
  unknown_strategy(s, "DeepSpeed");
}

// DeepSpeed's optimizer "type": a name in its DEEPSPEED_OPTIMIZERS
// (deepspeed/runtime/config.py: "adamw" is its fused AdamW) or, for any other
// name, the torch.optim class of that name ("SGD": torch.optim.SGD).
OrderedJson ds_optimizer(const OptimizerConfig& o) {
  OrderedJson params;
  params["lr"] = o.lr;
  switch (o.kind) {
    case OptimizerKind::adamw:
      params["betas"] = {o.beta1, o.beta2};
      params["eps"] = o.eps;
      params["weight_decay"] = o.weight_decay;
      return {{"type", "AdamW"}, {"params", params}};
    case OptimizerKind::sgd:
      params["weight_decay"] = o.weight_decay;
      return {{"type", "SGD"}, {"params", params}};
    case OptimizerKind::sgd_momentum:
      params["momentum"] = o.momentum;
      params["weight_decay"] = o.weight_decay;
      return {{"type", "SGD"}, {"params", params}};
  }
  throw Error("export: unknown optimizer");
}

// deepspeed.runtime.lr_schedules.WarmupCosineLR: a linear warmup from
// warmup_min_ratio x lr to lr over warmup_num_steps, then a cosine to
// cos_min_ratio x lr at total_num_steps (ratios of the optimizer's lr).
OrderedJson ds_scheduler(const OptimizerConfig& o, const ExportOptions& opt) {
  return {{"type", "WarmupCosineLR"},
          {"params",
           {{"total_num_steps", opt.steps},
            {"warmup_num_steps", o.warmup_steps},
            {"warmup_min_ratio", 0.0},
            {"warmup_type", "linear"},
            {"cos_min_ratio", o.lr > 0 ? o.min_lr / o.lr : 0.0}}}};
}

OrderedJson ds_zero(const PlanDocument& p) {
  const TrainingConfig& t = p.training;
  OrderedJson z;
  z["stage"] = zero_stage(t.strategy);
  z["overlap_comm"] = true;
  z["contiguous_gradients"] = true;
  z["reduce_bucket_size"] = bucket_elements(t);
  z["allgather_bucket_size"] = bucket_elements(t);
  if (t.strategy == Strategy::hsdp3) {
    // MiCS (Zhang et al. 2022; DeepSpeed >= 0.9): ZeRO-3 inside groups of
    // mics_shard_size ranks, replicas across them; hierarchical all-gather
    // off, as dlplan gathers inside the group with one collective.
    z["mics_shard_size"] = shard_world(t, p.cluster.world());
    z["mics_hierarchical_params_gather"] = false;
  }
  // CPU offload (ZeRO-Offload; ZeRO-Infinity's offload_param for stage 3).
  if (t.offload != Offload::none) z["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (t.offload == Offload::params) z["offload_param"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (within_group(t.strategy) == Strategy::zero3) {
    // dlplan's ZeRO-3 keeps gathered the unit computing, `prefetch` units
    // ahead of it, and the root unit: DeepSpeed's prefetch bucket holds the
    // units ahead, its live-parameter cap the whole gathered set.
    const int64_t unit = largest_unit_params(p.model), root = unit_params(p.model).at(0);
    z["stage3_prefetch_bucket_size"] = t.prefetch * unit;
    z["stage3_max_live_parameters"] = (1 + t.prefetch) * unit + root;
  }
  return z;
}

std::vector<std::string> ds_comments(const PlanDocument& p, const ExportOptions& opt) {
  const TrainingConfig& t = p.training;
  const OptimizerConfig& o = t.optimizer;
  std::vector<std::string> c;
  c.push_back(fmt::format("written by dlplan export from {}: {}", opt.plan_path, what_was_planned(p)));
  c.push_back(fmt::format("plan decided: zero_optimization.stage {} ({}); train_batch_size {} = micro-batch {} x "
                          "grad-accum {} x world {}; gradient_clipping {} (0: none)",
                          zero_stage(t.strategy), to_string(t.strategy),
                          t.micro_batch * t.grad_accum * p.cluster.world(), t.micro_batch, t.grad_accum,
                          p.cluster.world(), o.clip_norm));
  if (t.fine_tuning.active())
    c.push_back(fmt::format("fine-tuning is model code, not config: the plan has {}; freeze with "
                            "requires_grad_(False) and add LoRA with peft's LoraConfig before deepspeed.initialize",
                            describe(t.fine_tuning, p.model)));
  if (t.precision == Precision::bf16_mixed)
    c.push_back("precision bf16-mixed: bf16.enabled (bf16 params and grads, fp32 master weights and optimizer state); "
                "no fp16 block, so no loss scaling");
  else if (t.precision == Precision::fp16_mixed)
    c.push_back(fmt::format("precision fp16-mixed: fp16.enabled (fp16 params and grads, fp32 master weights and "
                            "optimizer state) with dynamic loss scaling from 2^{} (the plan's init_scale {}); DeepSpeed "
                            "grows the scale by 2 and backs off by 2 only{}",
                            std::lround(std::log2(t.loss_scaling.init_scale)), t.loss_scaling.init_scale,
                            t.loss_scaling.growth == 2 && t.loss_scaling.backoff == 0.5
                                ? ", as the plan does"
                                : fmt::format(": the plan's growth {} and backoff {} have no DeepSpeed setting",
                                              t.loss_scaling.growth, t.loss_scaling.backoff)));
  else
    c.push_back("precision fp32: neither bf16 nor fp16 (DeepSpeed trains in fp32)");
  c.push_back(fmt::format("reduce_bucket_size and allgather_bucket_size count elements, the plan's bucket_mb MiB: "
                          "{} MiB x 1048576 / {} bytes per {} gradient = {} elements",
                          t.bucket_mb, grad_bytes(t.precision), to_string(storage_dtype(t.precision)),
                          bucket_elements(t)));
  if (t.strategy == Strategy::hsdp3)
    c.push_back(fmt::format("hsdp3 is MiCS: ZeRO-3 inside groups of mics_shard_size = {} contiguous ranks, the "
                            "gradient shards all-reduced across the {} groups (DeepSpeed >= 0.9)",
                            shard_world(t, p.cluster.world()), p.cluster.world() / shard_world(t, p.cluster.world())));
  if (within_group(t.strategy) == Strategy::zero3)
    c.push_back(fmt::format("stage3_prefetch_bucket_size = prefetch {} x the largest unit's {} parameters; "
                            "stage3_max_live_parameters = (1 + prefetch) units + the root unit's {} parameters "
                            "(what dlplan counts gathered at the peak)",
                            t.prefetch, largest_unit_params(p.model), unit_params(p.model).at(0)));
  c.push_back(fmt::format("scheduler WarmupCosineLR: warmup_num_steps {} (DeepSpeed ramps over at least 2), linear "
                          "from 0, then cosine to cos_min_ratio = min_lr {} / lr {}; total_num_steps {}",
                          o.warmup_steps, o.min_lr, o.lr, steps_note(opt)));
  if (o.weight_decay > 0)
    c.push_back("weight_decay: the plan decays only the weights of linear, conv, embedding and attention layers; "
                "DeepSpeed's optimizer block decays every parameter unless the model passes parameter groups");
  if (o.kind != OptimizerKind::adamw && t.strategy != Strategy::ddp)
    c.push_back("optimizer SGD is torch.optim.SGD, not one of DeepSpeed's own: ZeRO needs "
                "zero_allow_untested_optimizer");
  if (t.checkpointing == Checkpointing::units)
    c.push_back(fmt::format("activation_checkpointing: the plan recomputes each unit ({}) in backward; DeepSpeed "
                            "only configures it: the model must call deepspeed.checkpointing.checkpoint(block, ...) "
                            "around each such block",
                            unit_names(p.model)));
  if (t.syncbn)
    c.push_back(fmt::format("SyncBN: convert the model with torch.nn.SyncBatchNorm.convert_sync_batchnorm(model, "
                            "process_group) before deepspeed.initialize, with groups of {} ranks",
                            t.syncbn_group > 0 ? t.syncbn_group : p.cluster.world()));
  if (t.offload != Offload::none)
    c.push_back(fmt::format("offload {}: offload_optimizer to the CPU (gradients, fp32 master weights and optimizer "
                            "state; the step on the CPU){}; pin_memory for the copies",
                            to_string(t.offload), t.offload == Offload::params ? ", and offload_param (the parameter shards)" : ""));
  const char* offload_left = t.offload == Offload::none ? "offload_optimizer, offload_param, "
                             : t.offload == Offload::optimizer ? "offload_param, " : "";
  c.push_back(fmt::format("left at DeepSpeed's defaults (the plan does not decide them): fp16, communication_data_type, "
              "prescale_gradients, steps_per_print, wall_clock_breakdown, zero_optimization.reduce_scatter, "
              "allgather_partitions, {}round_robin_gradients, sub_group_size, "
              "stage3_param_persistence_threshold, stage3_max_reuse_distance, "
              "stage3_gather_16bit_weights_on_model_save, activation_checkpointing.partition_activations, "
              "cpu_checkpointing, contiguous_memory_optimization", offload_left));
  return c;
}

// ---- PyTorch (FSDP, DDP, ZeroRedundancyOptimizer) -------------------------------

// A Python float literal: fmt's shortest form, with ".0" when it has no point.
std::string py(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eE") == std::string::npos && s.find("inf") == std::string::npos) s += ".0";
  return s;
}

std::string py(bool b) { return b ? "True" : "False"; }

const char* sharding_name(Strategy s) {
  switch (s) {
    case Strategy::ddp: return "DistributedDataParallel";
    case Strategy::zero1: return "DistributedDataParallel + ZeroRedundancyOptimizer";
    case Strategy::zero2: return "FSDP ShardingStrategy.SHARD_GRAD_OP";
    case Strategy::zero3: return "FSDP ShardingStrategy.FULL_SHARD";
    case Strategy::hsdp2: return "FSDP ShardingStrategy._HYBRID_SHARD_ZERO2 (PyTorch >= 2.1)";
    case Strategy::hsdp3: return "FSDP ShardingStrategy.HYBRID_SHARD (PyTorch >= 2.0)";
  }
  unknown_strategy(s, "PyTorch");
}

const char* fsdp_sharding_strategy(Strategy s) {
  switch (s) {
    case Strategy::zero2: return "SHARD_GRAD_OP";
    case Strategy::zero3: return "FULL_SHARD";
    case Strategy::hsdp2: return "_HYBRID_SHARD_ZERO2";
    case Strategy::hsdp3: return "HYBRID_SHARD";
    default: break;
  }
  unknown_strategy(s, "FSDP");
}

bool uses_fsdp(Strategy s) { return within_group(s) == Strategy::zero2 || within_group(s) == Strategy::zero3; }

// Hybrid sharding with a shard group other than one node: FSDP takes the
// (shard, replicate) process groups; every rank creates every group, as
// torch.distributed.new_group requires.
std::string py_hybrid_groups(const PlanDocument& p) {
  const TrainingConfig& t = p.training;
  if (!hybrid(t.strategy) || shard_world(t, p.cluster.world()) == p.cluster.gpus_per_node) return "";
  return fmt::format("        process_group=_hybrid_groups({}),\n", shard_world(t, p.cluster.world()));
}

const char* kPyHybridGroups = R"py(

def _hybrid_groups(shard_group):
    """(shard, replicate) process groups: contiguous groups of shard_group
    ranks, and the ranks holding the same shard across them."""
    world, rank = dist.get_world_size(), dist.get_rank()
    shard = replicate = None
    for first in range(0, world, shard_group):
        g = dist.new_group(list(range(first, first + shard_group)))
        if first <= rank < first + shard_group:
            shard = g
    for offset in range(shard_group):
        g = dist.new_group(list(range(offset, world, shard_group)))
        if rank % shard_group == offset:
            replicate = g
    return shard, replicate
)py";


// Replaces every @KEY@ of `text` (the Python templates below use no other @).
std::string subst(std::string text, const std::vector<std::pair<std::string, std::string>>& values) {
  for (const auto& [key, value] : values)
    for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + value.size()))
      text.replace(at, key.size(), value);
  return text;
}

std::string fsdp_header(const PlanDocument& p, const ExportOptions& opt) {
  const TrainingConfig& t = p.training;
  const std::string module = opt.script_name.substr(0, opt.script_name.rfind(".py"));
  std::string s = "#!/usr/bin/env python3\n";
  s += fmt::format("# Written by `dlplan export --to fsdp` from {}:\n#   {}\n#\n", opt.plan_path, what_was_planned(p));
  s += fmt::format("# Start it (PyTorch >= 2.1) with:\n#   {}\n", torchrun_command(p, opt.script_name));
  if (p.cluster.nodes > 1) s += "# on every node, NODE_RANK 0 .. nnodes-1, MASTER_ADDR the host name of node 0.\n";
  s += "# torchrun starts nproc_per_node processes per node and sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR\n"
       "# and MASTER_PORT in each; init_process_group reads them.\n#\n";
  s += fmt::format("# Use it from your training script:\n#   from {} import wrap, make_optimizer, make_scheduler, "
                   "train_step\n",
                   module);
  s += "# Run as a script, main() trains a tiny placeholder transformer (torch.nn.TransformerEncoderLayer) on\n"
       "# synthetic tokens: ddp and zero1 also run on CPU (gloo); FSDP (zero2, zero3) needs CUDA GPUs and NCCL.\n#\n";
  s += "# What the plan decided, and where this file applies it:\n";
  s += fmt::format("#   strategy {:<10} -> {}\n", to_string(t.strategy), sharding_name(t.strategy));
  if (uses_fsdp(t.strategy)) {
    s += fmt::format("#   units              -> auto-wrap: one FSDP unit per module of block_types (IR units: {})\n",
                     unit_names(p.model));
    s += fmt::format("#   prefetch {:<9} -> forward_prefetch={} (FSDP prefetches at most one unit ahead), "
                     "backward_prefetch=BACKWARD_PRE, limit_all_gathers=True\n",
                     t.prefetch, py(t.prefetch > 0));
  } else {
    s += fmt::format("#   bucket_mb {:<8} -> DistributedDataParallel(bucket_cap_mb={})\n", t.bucket_mb, py(t.bucket_mb));
  }
  if (t.precision == Precision::bf16_mixed)
    s += uses_fsdp(t.strategy)
             ? "#   bf16-mixed         -> MixedPrecision(param_dtype, reduce_dtype, buffer_dtype = torch.bfloat16)\n"
             : "#   bf16-mixed         -> torch.autocast(dtype=torch.bfloat16) around the forward (DDP keeps fp32\n"
               "#                         parameters: more memory than the plan's bf16 copies)\n";
  else if (t.precision == Precision::fp16_mixed)
    s += uses_fsdp(t.strategy)
             ? "#   fp16-mixed         -> MixedPrecision(param_dtype, reduce_dtype, buffer_dtype = torch.float16),\n"
               "#                         ShardedGradScaler (loss scaling, the overflow flag all-reduced)\n"
             : "#   fp16-mixed         -> torch.autocast(dtype=torch.float16) around the forward and GradScaler (DDP\n"
               "#                         keeps fp32 parameters: more memory than the plan's fp16 copies)\n";
  else
    s += "#   fp32               -> no mixed precision\n";
  if (t.checkpointing == Checkpointing::units)
    s += fmt::format("#   checkpointing units -> apply_activation_checkpointing on every module of block_types (IR "
                     "units: {})\n",
                     unit_names(p.model));
  if (t.syncbn)
    s += fmt::format("#   SyncBN             -> torch.nn.SyncBatchNorm.convert_sync_batchnorm, groups of {} ranks\n",
                     t.syncbn_group > 0 ? t.syncbn_group : p.cluster.world());
  s += fmt::format("#   optimizer          -> {}, clip_norm {} (0: none), micro-batch {} x grad-accum {} (no_sync on\n"
                   "#                         all but the last micro-batch)\n",
                   to_string(t.optimizer.kind), t.optimizer.clip_norm, t.micro_batch, t.grad_accum);
  s += fmt::format("#   schedule           -> LambdaLR: linear warmup {} steps, cosine to min_lr {} at STEPS = {}\n",
                   t.optimizer.warmup_steps, t.optimizer.min_lr, steps_note(opt));
  s += "#\n# Left at PyTorch's defaults (the plan does not decide them):\n";
  if (uses_fsdp(t.strategy))
    s += fmt::format("#   FSDP: {}sync_module_states (False), param_init_fn, ignored_modules,\n"
                     "#   forward/backward prefetch depth beyond one unit, state_dict_type; the data loader, checkpoints.\n",
                     t.offload == Offload::params ? "" : "cpu_offload (None), ");
  else
    s += "#   DDP: find_unused_parameters, gradient_as_bucket_view, static_graph, broadcast_buffers;\n";
  if (t.strategy == Strategy::zero1)
    s += "#   ZeroRedundancyOptimizer: parameters_as_bucket_view, overlap_with_ddp;\n";
  if (!uses_fsdp(t.strategy)) s += "#   the data loader, checkpoints.\n";
  s += "#   The optimizer's foreach / fused / amsgrad options.\n";
  return s;
}

std::string fsdp_imports(const TrainingConfig& t) {
  std::string s = R"py(
import argparse
import contextlib
import functools
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
)py";
  if (uses_fsdp(t.strategy)) {
    s += "from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy\n";
    if (t.offload == Offload::params) s += "from torch.distributed.fsdp import CPUOffload\n";
    s += "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n";
    if (mixed(t.precision)) s += "from torch.distributed.fsdp import MixedPrecision\n";
    if (loss_scaled(t.precision)) s += "from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler\n";
    s += "from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy\n";
  } else {
    s += "from torch.nn.parallel import DistributedDataParallel as DDP\n";
  }
  if (loss_scaled(t.precision) && !uses_fsdp(t.strategy)) s += "from torch.cuda.amp import GradScaler\n";
  if (t.strategy == Strategy::zero1) s += "from torch.distributed.optim import ZeroRedundancyOptimizer\n";
  if (t.checkpointing == Checkpointing::units)
    s += "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (\n"
         "    CheckpointImpl,\n    apply_activation_checkpointing,\n    checkpoint_wrapper,\n)\n";
  return s;
}

std::string fsdp_constants(const PlanDocument& p, const ExportOptions& opt) {
  const TrainingConfig& t = p.training;
  const OptimizerConfig& o = t.optimizer;
  std::string s = "\n# ---- the plan's values ----------------------------------------------------------\n";
  s += fmt::format("STRATEGY = \"{}\"\n", to_string(t.strategy));
  s += fmt::format("WORLD_SIZE = {}  # {} node(s) x {} GPUs\n", p.cluster.world(), p.cluster.nodes,
                   p.cluster.gpus_per_node);
  s += fmt::format("MICRO_BATCH = {}  # samples per GPU per micro-batch\n", t.micro_batch);
  s += fmt::format("GRAD_ACCUM = {}  # micro-batches per optimizer step\n", t.grad_accum);
  s += fmt::format("LR = {}\n", py(o.lr));
  if (o.kind == OptimizerKind::adamw) {
    s += fmt::format("BETAS = ({}, {})\n", py(o.beta1), py(o.beta2));
    s += fmt::format("EPS = {}\n", py(o.eps));
  } else {
    s += fmt::format("MOMENTUM = {}\n", py(o.kind == OptimizerKind::sgd_momentum ? o.momentum : 0.0));
  }
  s += fmt::format("WEIGHT_DECAY = {}  # weights of linear, conv, embedding and attention layers only\n",
                   py(o.weight_decay));
  s += fmt::format("CLIP_NORM = {}  # global gradient norm; 0: no clipping\n", py(o.clip_norm));
  s += fmt::format("WARMUP_STEPS = {}\n", o.warmup_steps);
  s += fmt::format("MIN_LR = {}\n", py(o.min_lr));
  s += fmt::format("STEPS = {}  # the schedule's total: {}\n", opt.steps, steps_note(opt));
  if (loss_scaled(t.precision)) {
    const LossScaling& ls = t.loss_scaling;
    s += fmt::format("# fp16-mixed: dynamic loss scaling (the plan's loss_scale; GradScaler's defaults)\n"
                     "SCALER = {}(init_scale={}, growth_factor={}, backoff_factor={}, growth_interval={})\n",
                     uses_fsdp(t.strategy) ? "ShardedGradScaler" : "GradScaler", py(ls.init_scale), py(ls.growth),
                     py(ls.backoff), ls.growth_interval);
  }
  if (uses_fsdp(t.strategy))
    s += fmt::format("FORWARD_PREFETCH = {}  # the plan prefetches {} unit(s) ahead\n", py(t.prefetch > 0),
                     t.prefetch);
  else
    s += fmt::format("BUCKET_CAP_MB = {}\n", py(t.bucket_mb));
  if (t.syncbn)
    s += fmt::format("SYNCBN_GROUP = {}  # ranks per SyncBatchNorm group\n",
                     t.syncbn_group > 0 ? t.syncbn_group : p.cluster.world());
  return s;
}

const char* kPyCommon = R"py(

def default_block_types():
    """The module classes wrapped one per unit: the plan's IR units (@UNITS@)
    are one transformer block each. The default guesses torch.nn's own layers;
    pass your model's block classes (GPT2Block, LlamaDecoderLayer, ...)."""
    return (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)


def _device():
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")
)py";

const char* kPySyncBn = R"py(

def _syncbn_process_group():
    """The plan's SyncBatchNorm groups: SYNCBN_GROUP consecutive ranks each.
    Every rank must create every group (torch.distributed.new_group)."""
    world = dist.get_world_size()
    if SYNCBN_GROUP >= world:
        return None  # the default group: all ranks
    groups = [dist.new_group(list(range(first, first + SYNCBN_GROUP))) for first in range(0, world, SYNCBN_GROUP)]
    return groups[dist.get_rank() // SYNCBN_GROUP]
)py";

const char* kPyWrapFsdp = R"py(

def wrap(model, block_types=None):
    """Applies the plan's strategy (@SHARDING@) to `model`, on this rank's GPU.
    Create the optimizer after wrapping (make_optimizer)."""
    block_types = tuple(block_types or default_block_types())
@SYNCBN@    model = FSDP(
        model,
        sharding_strategy=ShardingStrategy.@STRATEGY@,
@PROCESS_GROUP@@OFFLOAD@        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=set(block_types)),
@MIXED@        backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
        forward_prefetch=FORWARD_PREFETCH,
        limit_all_gathers=True,
        use_orig_params=True,
        device_id=_device(),
    )
@CHECKPOINT@    return model
)py";

const char* kPyWrapDdp = R"py(

def wrap(model, block_types=None):
    """Applies the plan's strategy (@SHARDING@) to `model`, on this rank's
    device. Create the optimizer after wrapping (make_optimizer)."""
    block_types = tuple(block_types or default_block_types())
    device = _device()
    model = model.to(device)
@SYNCBN@@CHECKPOINT@    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=BUCKET_CAP_MB)
)py";

const char* kPyCheckpoint = R"py(    # Recompute each block in backward (torch.utils.checkpoint, non-reentrant).
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda module: isinstance(module, block_types),
    )
)py";

const char* kPyOptimizer = R"py(

_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def _param_groups(model):
    """Weight decay as dlplan applies it: on weights, not on biases or norms."""
    norm_params = {id(p) for m in model.modules() if isinstance(m, _NORMS) for p in m.parameters(recurse=False)}
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (decay if name.endswith("weight") and id(p) not in norm_params else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def make_optimizer(model):
    """The plan's optimizer over the wrapped model's parameters."""
@OPTIMIZER@


def make_scheduler(optimizer, steps=STEPS):
    """Linear warmup to LR over WARMUP_STEPS, then a cosine to MIN_LR at
    `steps` (as dlplan's engine: step s of warmup has LR * (s + 1) / WARMUP_STEPS)."""

    def factor(step):
        if WARMUP_STEPS > 0 and step < WARMUP_STEPS:
            return (step + 1) / WARMUP_STEPS
        progress = min(1.0, (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS))
        return (MIN_LR + 0.5 * (LR - MIN_LR) * (1.0 + math.cos(math.pi * progress))) / LR

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def train_step(model, optimizer, scheduler, micro_batches, loss_fn):
    """One optimizer step over GRAD_ACCUM micro-batches [(inputs, targets)] of
    MICRO_BATCH samples each. Gradients are synchronized on the last one only
    (no_sync before it)@NOSYNC_NOTE@. Returns the step's mean loss."""
    total = 0.0
    for i, (inputs, targets) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else model.no_sync():
@FORWARD@            @BACKWARD@
        total += loss.item()
@UNSCALE@    if CLIP_NORM > 0:
@CLIP@
@STEP@
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    return total
)py";

const char* kPyMain = R"py(

class TinyTransformer(nn.Module):
    """main()'s placeholder: token and position embeddings, nn.TransformerEncoderLayer
    blocks (not causal), a final norm and a head. Not the planned model."""

    def __init__(self, vocab=256, dim=64, heads=4, layers=2, seq_len=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def main(model=None, steps=20, vocab=256, seq_len=64):
    """Trains `model` (a TinyTransformer when none is given) on synthetic
    tokens for `steps` optimizer steps; the schedule still spans STEPS."""
@NEEDS_CUDA@    if "RANK" not in os.environ:
        print("start it with torchrun: @TORCHRUN@", file=sys.stderr)
        return 2
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    if cuda:
        torch.cuda.set_device(_device())
    if dist.get_rank() == 0 and dist.get_world_size() != WORLD_SIZE:
        print(f"note: planned for {WORLD_SIZE} processes, running {dist.get_world_size()}", file=sys.stderr)
    torch.manual_seed(0)
    if model is None:
        model = TinyTransformer(vocab=vocab, seq_len=seq_len)
    model = wrap(model)
    optimizer = make_optimizer(model)
    scheduler = make_scheduler(optimizer)
    device = _device()

    def loss_fn(logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    for step in range(steps):
        micro_batches = []
        for _ in range(GRAD_ACCUM):
            tokens = torch.randint(0, vocab, (MICRO_BATCH, seq_len + 1), device=device)
            micro_batches.append((tokens[:, :-1], tokens[:, 1:]))
        loss = train_step(model, optimizer, scheduler, micro_batches, loss_fn)
        if dist.get_rank() == 0:
            print(f"step {step + 1}/{steps} loss {loss:.4f} lr {scheduler.get_last_lr()[0]:.3g}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="The plan's setup on a tiny placeholder transformer.")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps to run (default 20)")
    sys.exit(main(steps=parser.parse_args().steps))
)py";

std::string py_optimizer(const TrainingConfig& t) {
  const bool adamw = t.optimizer.kind == OptimizerKind::adamw;
  const std::string cls = adamw ? "torch.optim.AdamW" : "torch.optim.SGD";
  const std::string args = adamw ? "lr=LR, betas=BETAS, eps=EPS" : "lr=LR, momentum=MOMENTUM";
  if (t.strategy == Strategy::zero1)
    return fmt::format("    # ZeRO-1: each rank keeps the optimizer state of its shard of the parameters.\n"
                       "    return ZeroRedundancyOptimizer(_param_groups(model), optimizer_class={}, {})",
                       cls, args);
  return fmt::format("    return {}(_param_groups(model), {})", cls, args);
}

std::string py_forward(const TrainingConfig& t) {
  const std::string loss = "loss = loss_fn(model(inputs), targets) / len(micro_batches)\n";
  if (mixed(t.precision) && !uses_fsdp(t.strategy))
    return fmt::format("            with torch.autocast(device_type=inputs.device.type, dtype={}):\n"
                       "                {}",
                       t.precision == Precision::fp16_mixed ? "torch.float16" : "torch.bfloat16", loss);
  return "            " + loss;
}

}  // namespace

int64_t bucket_elements(const TrainingConfig& t) {
  return static_cast<int64_t>(t.bucket_mb * 1024 * 1024 / grad_bytes(t.precision));
}

std::string torchrun_command(const PlanDocument& p, const std::string& script) {
  const int g = p.cluster.gpus_per_node, k = p.cluster.nodes;
  if (k == 1) return fmt::format("torchrun --nproc_per_node {} --nnodes 1 --standalone {}", g, script);
  return fmt::format("torchrun --nproc_per_node {} --nnodes {} --node_rank $NODE_RANK --master_addr $MASTER_ADDR "
                     "--master_port 29500 {}",
                     g, k, script);
}

OrderedJson deepspeed_config(const PlanDocument& p, const ExportOptions& opt) {
  const TrainingConfig& t = p.training;
  OrderedJson j;
  j["_comment"] = ds_comments(p, opt);
  j["train_batch_size"] = t.micro_batch * t.grad_accum * p.cluster.world();
  j["train_micro_batch_size_per_gpu"] = t.micro_batch;
  j["gradient_accumulation_steps"] = t.grad_accum;
  j["gradient_clipping"] = t.optimizer.clip_norm;
  if (t.precision == Precision::bf16_mixed) j["bf16"] = {{"enabled", true}};
  if (t.precision == Precision::fp16_mixed) {
    // DeepSpeed's dynamic loss scaler: loss_scale 0 selects it; the initial
    // scale is 2^initial_scale_power, the window is GradScaler's growth
    // interval, hysteresis 1 backs off at the first overflow (as GradScaler).
    const LossScaling& ls = t.loss_scaling;
    j["fp16"] = {{"enabled", true},
                 {"loss_scale", 0},
                 {"initial_scale_power", static_cast<int>(std::lround(std::log2(ls.init_scale)))},
                 {"loss_scale_window", ls.growth_interval},
                 {"hysteresis", 1},
                 {"min_loss_scale", 1}};
  }
  j["zero_optimization"] = ds_zero(p);
  if (t.optimizer.kind != OptimizerKind::adamw && t.strategy != Strategy::ddp) j["zero_allow_untested_optimizer"] = true;
  j["optimizer"] = ds_optimizer(t.optimizer);
  j["scheduler"] = ds_scheduler(t.optimizer, opt);
  if (t.checkpointing == Checkpointing::units)
    j["activation_checkpointing"] = {{"partition_activations", false},
                                     {"cpu_checkpointing", false},
                                     {"contiguous_memory_optimization", false}};
  return j;
}

std::string fsdp_script(const PlanDocument& p, const ExportOptions& opt) {
  const TrainingConfig& t = p.training;
  if (t.offload == Offload::optimizer)
    throw Error("export: PyTorch FSDP has no optimizer-only CPU offload (its CPUOffload moves the parameters and "
                "gradients too): export --to deepspeed (offload_optimizer), or plan with --offload params");
  if (t.fine_tuning.active())
    throw Error(fmt::format("export: the plan fine-tunes ({}), and the FSDP script trains every parameter of the "
                            "model; export --to deepspeed and freeze (requires_grad_(False)) or add LoRA (peft) in "
                            "your model code",
                            describe(t.fine_tuning, p.model)));
  const bool fsdp = uses_fsdp(t.strategy);
  const bool scaled = loss_scaled(t.precision);
  const std::string half = t.precision == Precision::fp16_mixed ? "torch.float16" : "torch.bfloat16";
  const std::string syncbn =
      t.syncbn ? "    model = nn.SyncBatchNorm.convert_sync_batchnorm(model, _syncbn_process_group())\n" : "";
  const std::string checkpoint = t.checkpointing == Checkpointing::units ? kPyCheckpoint : "";
  std::string s = fsdp_header(p, opt);
  s += fmt::format("\"\"\"The setup dlplan planned for {}: {}.\"\"\"\n", p.model.name, sharding_name(t.strategy));
  s += fsdp_imports(t);
  s += fsdp_constants(p, opt);
  s += subst(kPyCommon, {{"@UNITS@", unit_names(p.model)}});
  if (t.syncbn) s += kPySyncBn;
  if (!py_hybrid_groups(p).empty()) s += kPyHybridGroups;
  s += subst(fsdp ? kPyWrapFsdp : kPyWrapDdp,
             {{"@SHARDING@", sharding_name(t.strategy)},
              {"@STRATEGY@", fsdp ? fsdp_sharding_strategy(t.strategy) : ""},
              {"@PROCESS_GROUP@", py_hybrid_groups(p)},
              {"@OFFLOAD@", t.offload == Offload::params ? "        cpu_offload=CPUOffload(offload_params=True),\n" : ""},
              {"@SYNCBN@", syncbn},
              {"@MIXED@", mixed(t.precision) ? fmt::format("        mixed_precision=MixedPrecision(\n"
                                                           "            param_dtype={0}, reduce_dtype={0}, "
                                                           "buffer_dtype={0}\n        ),\n",
                                                           half)
                                             : ""},
              {"@CHECKPOINT@", checkpoint}});
  s += subst(kPyOptimizer,
             {{"@OPTIMIZER@", py_optimizer(t)},
              {"@NOSYNC_NOTE@", fsdp ? "; under FSDP, no_sync keeps unsharded gradients until then: more memory "
                                       "than the plan counts when GRAD_ACCUM > 1"
                                     : ""},
              {"@FORWARD@", py_forward(t)},
              {"@BACKWARD@", scaled ? "SCALER.scale(loss).backward()" : "loss.backward()"},
              {"@UNSCALE@", scaled ? "    SCALER.unscale_(optimizer)  # the clip and the overflow check see true gradients\n" : ""},
              {"@STEP@", scaled ? "    SCALER.step(optimizer)  # skipped when a gradient overflowed\n    SCALER.update()"
                                : "    optimizer.step()"},
              {"@CLIP@", fsdp ? "        model.clip_grad_norm_(CLIP_NORM)  # FSDP: the norm over every rank's shard"
                              : "        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)"}});
  s += subst(kPyMain,
             {{"@NEEDS_CUDA@",
               fsdp ? fmt::format("    if not torch.cuda.is_available():\n"
                                  "        print(\"{}: FSDP ({}) needs CUDA GPUs and NCCL; this machine has no CUDA "
                                  "device (the ddp and zero1 exports also run on CPU with gloo)\", file=sys.stderr)\n"
                                  "        return 1\n",
                                  opt.script_name, to_string(t.strategy))
                    : std::string()},
              {"@TORCHRUN@", torchrun_command(p, opt.script_name)}});
  return s;
}

}  // namespace dlplan
