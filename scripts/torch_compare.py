#!/usr/bin/env python3
"""PyTorch eager on any model of dlplan's IR, as a baseline for dlplan's own
runs (scripts/gpu-check): builds the model with scripts/ir_torch.py (the same
parameters, in the same order and shapes, as dlplan's), trains N steps with
AdamW on random data, and prints ONE JSON line on stdout (progress goes to
stderr):

  {"model", "micro_batch", "seq_len", "precision", "checkpointing", "device",
   "steps", "params", "peak_bytes", "step_seconds", "tokens_per_second" (token
   models) / "samples_per_second", "model_flops_per_sample", "flops_source",
   "peak_flops", "mfu", "loss_first", "loss_last", "torch"}

  torch_compare.py --model models/gpt2.json --micro-batch 8 --precision bf16-mixed \\
      --steps 10 --device cuda --peak-flops 989e12
  torch_compare.py --plan plan.json --peak-flops 989e12      (model, batch, precision,
                                                               checkpointing from the plan)
  torch_compare.py --model models/tiny-gpt.json --device cpu --ranks 2 --threads 1
                                                              (CPU DDP over gloo: 2 processes,
                                                               1 thread each; tokens/s of all)

peak_bytes: torch.cuda.max_memory_allocated() over the steps after the first
(the peak statistics are reset after step 1, as dlplan's executor restarts its
measurement; with --steps 1, step 1's); null on the CPU. step_seconds: the
median of the steps after the first, each synchronised. MFU: model FLOPs per
sample x micro-batch / step_seconds / --peak-flops (the device's dense peak
for the precision); model FLOPs come from --flops-per-sample, else from --plan
(predicted mfu x step_seconds x the plan's device peak, per sample), else from
ir_torch.model_flops_per_sample (the planner's own count of forward + backward,
recomputation excluded; tests/tools/torch_parity.py holds the two equal). mfu
is left out when no peak is known (--peak-flops, or a plan's device).

The optimizer follows dlplan's defaults: AdamW lr 3e-4, betas (0.9, 0.95), eps
1e-8, weight decay 0.1 on the weights dlplan decays (GEMM, conv and embedding
weights), global-norm clipping at 1.0; fused AdamW where this torch has it (on
CUDA). bf16-mixed: fp32 parameters, bf16 autocast (PyTorch AMP). --checkpointing
units: torch.utils.checkpoint over each IR unit (consecutive nodes sharing a
`unit`). Runs on PyTorch 1.13 and 2.x, CUDA or CPU (--device cpu).
"""
import argparse
import inspect
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ir_torch  # noqa: E402


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def plan_figures(plan, precision):
    """(model FLOPs per sample, device peak FLOP/s for `precision`) from a dlplan plan document."""
    dev = plan.get("cluster", {}).get("device", {})
    pred = plan.get("predicted", {})

    def peak_for(p):
        return dev.get("bf16_flops" if p == "bf16-mixed" else "fp32_flops") or None

    flops = None
    plan_peak = peak_for(plan.get("precision", "fp32"))
    if pred.get("mfu") and pred.get("step_seconds") and plan_peak:
        per_step = pred["mfu"] * pred["step_seconds"] * plan_peak  # the simulator's model_flops
        samples = plan.get("micro_batch", 1) * plan.get("grad_accum", 1)
        flops = per_step / samples
    return flops, peak_for(precision)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="an IR JSON file (models/*.json); default: the plan's IR")
    ap.add_argument("--plan", help="a dlplan plan (dlplan plan --out): FLOPs, and defaults for the rest")
    ap.add_argument("--micro-batch", type=int)
    ap.add_argument("--seq-len", type=int, help="length of the token inputs ([T] i32)")
    ap.add_argument("--precision", choices=["fp32", "bf16-mixed"])
    ap.add_argument("--checkpointing", choices=["none", "units"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--device", default=None, help="cuda (default when available), cuda:N or cpu")
    ap.add_argument("--flops-per-sample", type=float, help="model FLOPs (forward + backward) of one sample")
    ap.add_argument("--peak-flops", type=float, help="the device's dense peak FLOP/s for the precision")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip-norm", type=float, default=1.0, help="global-norm clipping; 0 disables")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-sdpa", action="store_true", help="math attention even where SDPA exists")
    ap.add_argument("--ranks", type=int, default=1,
                    help="CPU data parallelism: this many processes under DistributedDataParallel over gloo")
    ap.add_argument("--threads", type=int, help="torch threads per process (default: torch's own)")
    args = ap.parse_args()
    if args.ranks < 1:
        ap.error("--ranks must be positive")
    if args.ranks > 1:
        if args.device not in (None, "cpu"):
            ap.error("--ranks runs CPU processes (gloo); give --device cpu")
        import socket
        import torch.multiprocessing as mp
        with socket.socket() as s:  # a free port for the rendezvous
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        mp.spawn(run, args=(args, _Usage(ap.prog)), nprocs=args.ranks, join=True)
        return 0
    return run(0, args, ap)


class _Usage:
    """ArgumentParser.error for the spawned ranks (a parser does not pickle)."""

    def __init__(self, prog):
        self.prog = prog

    def error(self, msg):
        print(f"{self.prog}: error: {msg}", file=sys.stderr)
        sys.exit(2)


def run(rank, args, ap):
    """One process: rank 0 of 1, or one of --ranks under DDP (rank 0 prints)."""
    world = args.ranks
    if args.threads:
        torch.set_num_threads(args.threads)
    if world > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=world)

    plan = json.load(open(args.plan)) if args.plan else None
    if args.model:
        ir = json.load(open(args.model))
    elif plan is not None:
        ir = plan["model"]["ir"]
    else:
        ap.error("give --model or --plan")
    B = args.micro_batch or (plan or {}).get("micro_batch") or 8
    precision = args.precision or (plan or {}).get("precision") or "fp32"
    ckpt = args.checkpointing or (plan or {}).get("checkpointing") or "none"
    if args.seq_len:
        ir = ir_torch.with_seq_len(ir, args.seq_len)
    if args.steps < 1 or B < 1:
        ap.error("--steps and --micro-batch must be positive")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        ap.error("--device cuda, but this torch sees no GPU")

    torch.manual_seed(args.seed)
    model = ir_torch.build(ir, checkpointing=ckpt, use_sdpa=not args.no_sdpa, device=device)
    model.train()
    net = model  # what forward runs: the model, or DDP around it
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model)
        torch.manual_seed(args.seed + rank)  # each rank its own batches
    params = ir_torch.param_count(model)
    T = model.tokens_per_sample()

    # FLOPs per sample: the caller's, the plan's (for the same inputs), or ir_torch's count.
    counted = ir_torch.model_flops_per_sample(model)
    flops, source = counted, "ir_torch (the planner's op declarations)"
    peak = args.peak_flops
    if plan is not None:
        plan_flops, plan_peak = plan_figures(plan, precision)
        same_inputs = plan.get("model", {}).get("ir", {}).get("inputs") == ir.get("inputs")
        if plan_flops and same_inputs:
            flops, source = plan_flops, "plan"
        elif plan_flops:
            log("torch_compare: the plan's model inputs differ from this run's (--seq-len?); counting FLOPs here")
        peak = peak or plan_peak
    if args.flops_per_sample:
        flops, source = args.flops_per_sample, "--flops-per-sample"

    decay, no_decay = [], []
    for p, d in zip(model.parameters(), model.decay_flags()):
        (decay if d else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt_kw = dict(lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    sig = inspect.signature(torch.optim.AdamW).parameters
    fused = cuda and "fused" in sig
    if fused:
        opt_kw["fused"] = True
    elif "foreach" in sig:
        opt_kw["foreach"] = True if cuda else None
    try:
        opt = torch.optim.AdamW(groups, **opt_kw)
    except (RuntimeError, TypeError, ValueError) as e:  # a fused AdamW this build cannot run
        log(f"torch_compare: AdamW({opt_kw}) refused ({e}); plain AdamW")
        opt_kw.pop("fused", None)
        fused = False
        opt = torch.optim.AdamW(groups, **opt_kw)

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def autocast():
        if precision == "bf16-mixed":
            return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        return _Null()

    times, losses = [], []
    peak_bytes = None
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    for step in range(args.steps):
        batch = ir_torch.random_inputs(model, B, device=device)
        sync()
        t0 = time.perf_counter()
        with autocast():
            loss = net(**batch)
        loss.backward()
        if args.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
        if rank == 0:
            log(f"step {step + 1}: loss {losses[-1]:.4f}, {times[-1] * 1e3:.1f} ms")
        if step == 0 and cuda and args.steps > 1:
            torch.cuda.reset_peak_memory_stats(device)  # dlplan measures after the first step too
    if cuda:
        peak_bytes = int(torch.cuda.max_memory_allocated(device))
    steady = times[1:] if len(times) > 1 else times
    step_s = statistics.median(steady)

    if world > 1:  # the slowest rank's step, as a step ends for all
        import torch.distributed as dist
        t = torch.tensor([step_s], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        step_s = float(t)
        dist.destroy_process_group()
        if rank != 0:
            return 0
    out = {"model": ir.get("name", "model"), "micro_batch": B, "ranks": world,
           "threads_per_rank": torch.get_num_threads()}
    if T:
        out["seq_len"] = T
    out.update({"precision": precision, "checkpointing": ckpt, "device": str(device),
                "steps": args.steps, "params": params, "peak_bytes": peak_bytes, "step_seconds": step_s})
    if T:
        out["tokens_per_second"] = world * B * T / step_s
    out["samples_per_second"] = world * B / step_s
    out["model_flops_per_sample"] = flops
    out["flops_source"] = source
    if peak:
        out["peak_flops"] = peak
        out["mfu"] = flops * B / step_s / peak  # per rank
    out.update({"loss_first": losses[0], "loss_last": losses[-1], "optimizer": "adamw" + (" (fused)" if fused else ""),
                "attention": "sdpa" if model.use_sdpa else "math", "torch": torch.__version__})
    if cuda:
        out["gpu"] = torch.cuda.get_device_name(device)
    print(json.dumps(out), flush=True)
    return 0


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


if __name__ == "__main__":
    sys.exit(main())
