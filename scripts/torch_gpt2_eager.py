#!/usr/bin/env python3
"""PyTorch eager baseline for scripts/gpu-check: builds the model of an IR JSON
file (models/gpt2.json: embedding, learned positions, pre-LN blocks, tied head)
in plain torch.nn with the IR's semantics (DESIGN.md's op table), trains it with
bf16 autocast and fused AdamW on random tokens, and prints tokens/s and MFU.

MFU = 6 * params * tokens/s + attention's 12 * layers * T * D per token (the
usual Kaplan / PaLM estimate), divided by the dense bf16 peak (H200: 989e12).
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class IRModel(nn.Module):
    def __init__(self, ir):
        super().__init__()
        self.nodes = ir["nodes"]
        self.inputs = ir["inputs"]
        self.mods = nn.ModuleDict()
        dims = {}  # width of each node's output
        for n in self.nodes:
            op, name, a = n["op"], n["name"].replace(".", "_"), n["in"]
            d = dims.get(a[0])
            if op == "embedding":
                self.mods[name] = nn.Embedding(n["num"], n["dim"])
                d = n["dim"]
            elif op == "pos_embedding":
                T = n.get("max_len", self.inputs["tokens"]["shape"][0])
                self.mods[name] = nn.Embedding(T, d)
            elif op == "layernorm":
                self.mods[name] = nn.LayerNorm(d, eps=n.get("eps", 1e-5), bias=n.get("bias", True))
            elif op == "attention":
                heads = n["heads"]
                hd = n.get("head_dim", d // heads)
                kv = n.get("kv_heads", heads)
                assert kv == heads and not n.get("rope", False), "baseline: MHA without RoPE only"
                bias = n.get("bias", True)
                self.mods[name] = nn.ModuleDict({
                    "qkv": nn.Linear(d, 3 * heads * hd, bias=bias),
                    "proj": nn.Linear(heads * hd, d, bias=bias)})
            elif op == "linear":
                if n.get("tie"):
                    self.mods[name] = nn.Identity()  # uses the tied embedding's weight
                else:
                    self.mods[name] = nn.Linear(d, n["out"], bias=n.get("bias", True))
                d = n["out"]
            dims[n["name"]] = d

    def forward(self, tokens, targets):
        vals = {"tokens": tokens, "targets": targets}
        T = tokens.shape[1]
        for n in self.nodes:
            op, m = n["op"], self.mods[n["name"].replace(".", "_")] if n["name"].replace(".", "_") in self.mods else None
            x = vals[n["in"][0]]
            if op == "embedding":
                y = m(x)
            elif op == "pos_embedding":
                y = x + m.weight[:T]
            elif op == "dropout":
                y = F.dropout(x, n["p"], self.training)
            elif op == "layernorm":
                y = m(x)
            elif op == "attention":
                B, _, D = x.shape
                h = n["heads"]
                q, k, v = m["qkv"](x).view(B, T, 3, h, -1).permute(2, 0, 3, 1, 4)
                o = F.scaled_dot_product_attention(q, k, v, is_causal=n.get("causal", False),
                                                   dropout_p=n.get("dropout", 0.0) if self.training else 0.0)
                y = m["proj"](o.transpose(1, 2).reshape(B, T, -1))
            elif op == "linear":
                if n.get("tie"):
                    w = self.mods[n["tie"].replace(".", "_")].weight
                    y = F.linear(x, w)
                else:
                    y = m(x)
            elif op == "gelu":
                y = F.gelu(x, approximate=n.get("approximate", "none"))
            elif op == "add":
                y = x + vals[n["in"][1]]
            elif op == "cross_entropy":
                t = vals[n["in"][1]]
                y = F.cross_entropy(x.float().view(-1, x.shape[-1]), t.view(-1).long())
            else:
                raise ValueError(f"baseline: op {op} not supported")
            vals[n["name"]] = y
        return y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/gpt2.json")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--peak", type=float, default=989e12, help="dense bf16 FLOP/s (H200 SXM)")
    args = ap.parse_args()
    ir = json.load(open(args.model))
    T = ir["inputs"]["tokens"]["shape"][0]
    dev = "cuda"
    torch.manual_seed(0)
    model = IRModel(ir).to(dev)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
    vocab = next(n["num"] for n in ir["nodes"] if n["op"] == "embedding")
    layers = sum(1 for n in ir["nodes"] if n["op"] == "attention")
    D = next(n["dim"] for n in ir["nodes"] if n["op"] == "embedding")
    B = args.micro_batch
    times = []
    for step in range(args.steps):
        tok = torch.randint(0, vocab, (B, T), device=dev, dtype=torch.int32)
        tgt = torch.randint(0, vocab, (B, T), device=dev, dtype=torch.int32)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(tok, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        print(f"step {step + 1}: loss {loss.item():.4f}, {times[-1] * 1e3:.1f} ms", flush=True)
    steady = sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else times[0]
    tps = B * T / steady
    flops_per_token = 6 * params + 12 * layers * T * D
    mfu = flops_per_token * tps / args.peak
    print(f"params: {params:,}; micro-batch {B} x {T}; median step {steady * 1e3:.1f} ms; "
          f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    print(f"tokens/s: {tps:.0f}  MFU: {100 * mfu:.1f}%")


if __name__ == "__main__":
    main()
