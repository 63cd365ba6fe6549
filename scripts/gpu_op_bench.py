#!/usr/bin/env python3
"""Per-op-class GPU timings for the time model (run by scripts/gpu-check on a
GPU machine; PyTorch 2.x). What the standard stack achieves on this GPU:

  gemm       bf16 and fp32 (no TF32) matrix products over a grid of (M, N, K),
             TFLOP/s = 2MNK / time
  attention  F.scaled_dot_product_attention (flash / efficient backends) in
             bf16, forward and forward+backward, causal and not, by T and head dim
  memory     bandwidth-bound ops (add, gelu, layer_norm, softmax, cross-entropy,
             copy) in bf16 and fp32: GB/s of bytes read + written
  adamw      torch.optim.AdamW(fused=True) step time per parameter (fp32 states)
  launch     an empty-ish kernel's wall time, back to back (per-op overhead)

Writes one JSON document (--out) and prints one summary line last.
Timing: CUDA events around `iters` repetitions after `warmup`, median of 3.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def timed(fn, iters=20, warmup=3, reps=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) / 1e3 / iters)
    return statistics.median(samples)


def gemm(results, budget_end):
    rows = []
    shapes = []
    for m in (128, 512, 2048, 8192, 16384):
        for n, k in ((768, 768), (768, 3072), (3072, 768), (1024, 4096), (4096, 4096), (8192, 8192),
                     (50304, 768), (4096, 11008), (11008, 4096)):
            shapes.append((m, n, k))
    for dtype in (torch.bfloat16, torch.float32):
        for m, n, k in shapes:
            if time.time() > budget_end:
                break
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            b = torch.randn(k, n, device="cuda", dtype=dtype)
            flops = 2.0 * m * n * k
            iters = max(3, min(50, int(2e12 / flops * (1 if dtype == torch.bfloat16 else 0.1)) + 1))
            t = timed(lambda: a @ b, iters=iters)
            rows.append({"dtype": str(dtype).split(".")[-1], "m": m, "n": n, "k": k, "seconds": t,
                         "tflops": flops / t / 1e12})
            del a, b
    results["gemm"] = rows


def attention(results, budget_end):
    rows = []
    for hd in (64, 128):
        for T in (512, 1024, 2048, 4096, 8192, 16384):
            for causal in (True, False):
                if time.time() > budget_end:
                    break
                heads = 2048 // hd  # a 2048-wide model
                b = max(1, 16384 // T)
                q, k, v = (torch.randn(b, heads, T, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                           for _ in range(3))
                fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                t_f = timed(fwd, iters=10)
                o = fwd()
                g = torch.randn_like(o)

                def fwd_bwd():
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    out.backward(g)

                t_fb = timed(fwd_bwd, iters=5)
                # FLOPs as FlashAttention's benchmark counts them: 4 b h T^2 hd forward
                # (halved when causal), backward 2.5x forward.
                f = 4.0 * b * heads * T * T * hd * (0.5 if causal else 1.0)
                rows.append({"b": b, "heads": heads, "T": T, "hd": hd, "causal": causal, "fwd_seconds": t_f,
                             "fwd_bwd_seconds": t_fb, "fwd_tflops": f / t_f / 1e12,
                             "bwd_tflops": 2.5 * f / max(t_fb - t_f, 1e-9) / 1e12})
                del q, k, v, o, g
    results["attention"] = rows


def memory_bound(results, budget_end):
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        es = torch.tensor([], dtype=dtype).element_size()
        for n in (1 << 20, 1 << 24, 1 << 27):
            if time.time() > budget_end:
                break
            x = torch.randn(n, device="cuda", dtype=dtype)
            y = torch.randn(n, device="cuda", dtype=dtype)
            x2 = x.view(-1, 1024)
            w = torch.ones(1024, device="cuda", dtype=dtype)
            ops = {
                "copy": (lambda: y.copy_(x), 2),
                "add": (lambda: x + y, 3),
                "gelu": (lambda: F.gelu(x), 2),
                "layer_norm": (lambda: F.layer_norm(x2, (1024,), w, w), 2),
                "softmax": (lambda: torch.softmax(x2, -1), 2),
            }
            for name, (fn, passes) in ops.items():
                t = timed(fn, iters=10)
                rows.append({"op": name, "dtype": str(dtype).split(".")[-1], "elements": n, "seconds": t,
                             "gbps": passes * n * es / t / 1e9})
            del x, y, x2
    # Cross-entropy over a GPT-2 vocabulary (logits read, probabilities written back in backward).
    for rows_n in (2048, 8192):
        logits = torch.randn(rows_n, 50257, device="cuda", dtype=torch.float32, requires_grad=True)
        tgt = torch.randint(0, 50257, (rows_n,), device="cuda")

        def ce():
            F.cross_entropy(logits, tgt).backward()

        t = timed(ce, iters=5)
        rows.append({"op": "cross_entropy_fwd_bwd", "dtype": "float32", "elements": rows_n * 50257, "seconds": t,
                     "gbps": 3 * rows_n * 50257 * 4 / t / 1e9})
    results["memory"] = rows


def adamw(results):
    rows = []
    for n in (1 << 20, 1 << 24, 1 << 27):
        p = torch.nn.Parameter(torch.randn(n, device="cuda"))
        p.grad = torch.randn(n, device="cuda")
        try:
            opt = torch.optim.AdamW([p], lr=1e-4, fused=True)
            kind = "fused"
        except (TypeError, RuntimeError):
            opt = torch.optim.AdamW([p], lr=1e-4, foreach=True)
            kind = "foreach"
        t = timed(opt.step, iters=10)
        rows.append({"kind": kind, "params": n, "seconds": t, "ns_per_param": t / n * 1e9,
                     "gbps": 16 * n / t / 1e9})  # p, g, m, v read; p, m, v written (4 B each): 7 x 4 = 28 B; 16 = states only
        del p, opt
    results["adamw"] = rows


def launch(results):
    x = torch.zeros(1, device="cuda")
    t = timed(lambda: x.add_(1), iters=200)
    results["launch"] = {"seconds_per_small_op": t}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=60, help="seconds for the whole benchmark")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    t0 = time.time()
    p = torch.cuda.get_device_properties(0)
    results = {"device": p.name, "sms": p.multi_processor_count, "memory_bytes": p.total_memory,
               "torch": torch.__version__, "cuda": torch.version.cuda}
    end = t0 + a.budget
    gemm(results, t0 + 0.35 * a.budget)
    attention(results, t0 + 0.65 * a.budget)
    memory_bound(results, t0 + 0.85 * a.budget)
    adamw(results)
    launch(results)
    results["seconds"] = time.time() - t0
    json.dump(results, open(a.out, "w"), indent=1)
    best_bf16 = max((r["tflops"] for r in results["gemm"] if r["dtype"] == "bfloat16"), default=0)
    best_fp32 = max((r["tflops"] for r in results["gemm"] if r["dtype"] == "float32"), default=0)
    best_attn = max((r["fwd_tflops"] for r in results.get("attention", [])), default=0)
    copy_bw = max((r["gbps"] for r in results["memory"] if r["op"] == "copy"), default=0)
    print(f"gemm bf16 max {best_bf16:.0f} TFLOP/s, fp32 max {best_fp32:.0f}; sdpa fwd max {best_attn:.0f} TFLOP/s; "
          f"copy {copy_bw:.0f} GB/s; launch {1e6 * results['launch']['seconds_per_small_op']:.1f} us; "
          f"{results['seconds']:.0f} s" + ("" if time.time() < end + 30 else " (over budget)"))


if __name__ == "__main__":
    main()
