#!/usr/bin/env python3
"""`dlplan export` checked by what the targets accept (issue 19), without torch.

For every strategy x precision x checkpointing, and for hybrid sharding and CPU
offload, plans tiny-gpt with the dlplan binary given, exports it to fsdp and
deepspeed (where each has an equivalent), and checks:
  - the FSDP/DDP file parses (ast) and every torch name it uses (imports,
    attribute chains through its aliases) is in TORCH_2_1, a table of names
    PyTorch 2.1's documentation lists;
  - the DeepSpeed config passes deepspeed.runtime.config.DeepSpeedConfig when
    deepspeed is importable ("skipped: deepspeed not installed" otherwise).
Debian's torch 1.13 cannot import FSDP under Python 3.11: torch is never imported.
Usage: check_fsdp_export.py DLPLAN_EXE SOURCE_DIR WORK_DIR
"""
import ast
import json
import os
import subprocess
import sys

# Names in PyTorch 2.1's documentation (https://pytorch.org/docs/2.1/): modules, classes, functions, members.
TORCH_2_1 = {
    "torch", "torch.nn", "torch.nn.functional", "torch.distributed", "torch.optim", "torch.cuda",
    "torch.bfloat16", "torch.device", "torch.autocast", "torch.manual_seed", "torch.randint", "torch.arange",
    "torch.cuda.is_available", "torch.cuda.set_device", "torch.cuda.current_device",
    "torch.nn.Module", "torch.nn.ModuleList", "torch.nn.Embedding", "torch.nn.Linear", "torch.nn.LayerNorm",
    "torch.nn.GroupNorm", "torch.nn.BatchNorm1d", "torch.nn.BatchNorm2d", "torch.nn.BatchNorm3d",
    "torch.nn.SyncBatchNorm", "torch.nn.SyncBatchNorm.convert_sync_batchnorm",
    "torch.nn.TransformerEncoderLayer", "torch.nn.TransformerDecoderLayer",
    "torch.nn.functional.cross_entropy", "torch.nn.utils.clip_grad_norm_",
    "torch.nn.parallel", "torch.nn.parallel.DistributedDataParallel",
    "torch.distributed.init_process_group", "torch.distributed.destroy_process_group",
    "torch.distributed.get_rank", "torch.distributed.get_world_size", "torch.distributed.new_group",
    "torch.distributed.fsdp", "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.ShardingStrategy", "torch.distributed.fsdp.ShardingStrategy.FULL_SHARD",
    "torch.distributed.fsdp.ShardingStrategy.SHARD_GRAD_OP", "torch.distributed.fsdp.MixedPrecision",
    "torch.distributed.fsdp.ShardingStrategy.HYBRID_SHARD", "torch.distributed.fsdp.ShardingStrategy._HYBRID_SHARD_ZERO2",
    "torch.distributed.fsdp.CPUOffload",
    "torch.distributed.fsdp.BackwardPrefetch", "torch.distributed.fsdp.BackwardPrefetch.BACKWARD_PRE",
    "torch.distributed.fsdp.wrap", "torch.distributed.fsdp.wrap.transformer_auto_wrap_policy",
    "torch.distributed.fsdp.wrap.ModuleWrapPolicy",
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper",
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.apply_activation_checkpointing",
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.checkpoint_wrapper",
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.CheckpointImpl",
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.CheckpointImpl.NO_REENTRANT",
    "torch.distributed.optim", "torch.distributed.optim.ZeroRedundancyOptimizer",
    "torch.optim.AdamW", "torch.optim.SGD", "torch.optim.lr_scheduler", "torch.optim.lr_scheduler.LambdaLR",
    "torch.float16", "torch.cuda.amp", "torch.cuda.amp.GradScaler",
    # Not on the FSDP page, but a public module of PyTorch 2.1's source
    # (torch/distributed/fsdp/sharded_grad_scaler.py), the scaler FSDP's own tests use.
    "torch.distributed.fsdp.sharded_grad_scaler", "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler",
}


def torch_names(tree):
    """Every torch name the module uses: its imports, and each outermost attribute chain whose root is a
    name bound to torch (import torch / import torch.x as y / from torch.x import y as z)."""
    alias, used = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "torch":
                    used.add(a.name)
                    alias[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            used.add(node.module)
            for a in node.names:
                used.add(node.module + "." + a.name)
                alias[a.asname or a.name] = node.module + "." + a.name
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            parts, v = [], node
            while isinstance(v, ast.Attribute):
                parts.append(v.attr)
                v = v.value
            if isinstance(v, ast.Name) and v.id in alias:
                full = alias[v.id] + "." + ".".join(reversed(parts))
                used.add(full)
    return used


def main():
    exe, source, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    try:
        import deepspeed.runtime.config as ds_config  # noqa: F401
    except Exception as e:  # not installed, or not importable beside this torch
        ds_config = None
        print(f"skipped: deepspeed not installed ({type(e).__name__}): DeepSpeed configs not parsed by DeepSpeed")
    failures, files, ds_files = [], 0, 0
    # (tag, plan flags, exports): every strategy x precision x checkpointing on one node of 8, then
    # hybrid sharding on 2 nodes and CPU offload (each target only where it has an equivalent).
    cases = []
    for strategy in ("ddp", "zero1", "zero2", "zero3"):
        for precision in ("fp32", "bf16-mixed", "fp16-mixed"):
            for ckpt in ("none", "units"):
                cases.append((f"{strategy}_{precision}_{ckpt}",
                              ["--gpus", "8", "--strategy", strategy, "--precision", precision, "--checkpointing", ckpt],
                              ("fsdp", "deepspeed")))
    two_nodes = ["--gpus", "16", "--nodes", "2"]
    cases += [("hsdp2", two_nodes + ["--strategy", "hsdp2"], ("fsdp",)),
              ("hsdp3_params", two_nodes + ["--strategy", "hsdp3", "--offload", "params"], ("fsdp", "deepspeed")),
              ("zero3_params", ["--gpus", "8", "--strategy", "zero3", "--offload", "params"], ("fsdp", "deepspeed")),
              ("zero2_optimizer", ["--gpus", "8", "--strategy", "zero2", "--offload", "optimizer"], ("deepspeed",))]
    for tag, flags, targets in cases:
        plan = os.path.join(work, f"plan_{tag}.json")
        subprocess.run([exe, "plan", "--model", "tiny-gpt", "--gpu", "h100-80g", *flags, "--out", plan],
                       cwd=source, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if "fsdp" in targets:
            script = os.path.join(work, f"train_{tag}.py")
            subprocess.run([exe, "export", "--plan", plan, "--to", "fsdp", "--out", script], check=True,
                           stderr=subprocess.DEVNULL)
            tree = ast.parse(open(script).read(), script)
            unknown = sorted(n for n in torch_names(tree) if n not in TORCH_2_1)
            if unknown:
                failures.append(f"{script}: not in PyTorch 2.1's documented names: {unknown}")
            files += 1
        if "deepspeed" not in targets:
            continue
        ds = json.loads(subprocess.run([exe, "export", "--plan", plan, "--to", "deepspeed"], check=True,
                                       capture_output=True, text=True).stdout)
        ds_files += 1
        if ds_config is not None:
            # DeepSpeedConfig (0.14) takes the world size from torch.distributed (1 when not
            # initialized): give it the plan's explicitly.
            world = ds["train_batch_size"] // (ds["train_micro_batch_size_per_gpu"]
                                               * ds["gradient_accumulation_steps"])
            ds_config.dist.get_rank = lambda *a, **k: 0
            ds_config.dist.get_world_size = lambda *a, _w=world, **k: _w
            try:
                ds_config.DeepSpeedConfig(ds)
            except Exception as e:
                failures.append(f"{tag}: DeepSpeedConfig refused the config: {e}")
    if ds_config is not None:
        import deepspeed
        print(f"{ds_files} DeepSpeed configs read by DeepSpeedConfig (deepspeed {deepspeed.__version__})")
    for f in failures:
        print("FAIL", f)
    print(f"{files} FSDP files checked against {len(TORCH_2_1)} PyTorch 2.1 names; {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
