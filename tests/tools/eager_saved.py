#!/usr/bin/env python3
"""What PyTorch's eager autograd keeps for the ops `--fusion eager` plans one
by one (docs/onnx.md), against the rule planner/src/ops_decl.cpp declares for
each: "input", "output" or "nothing" (a 0-dim constant at most).

Each op runs once on a [4, 8] float32 tensor ([1, 2, 7, 7] for pooling) that
requires grad, under a saved_tensors_hooks pack hook; the storages it packs
are compared with the input's and the output's, and any other one is named by
its dtype and size ("int64 [out]": int64, as many elements as the output).
Exit 77 (skip) without torch.

    /usr/bin/python3 tests/tools/eager_saved.py
"""
import sys

try:
    import torch
except ImportError as e:
    print(f"SKIP: {sys.executable} cannot import torch ({e}); Debian: apt-get install python3-torch")
    sys.exit(77)

# IR op: (what PyTorch runs for it, the rule ops_decl.cpp declares)
CASES = {
    "affine (x * c)": (lambda x: x * 0.5, "nothing"),
    "affine (x + c)": (lambda x: x + 1.0, "nothing"),
    "affine (x / c)": (lambda x: x / 3.0, "nothing"),
    "affine (c - x)": (lambda x: 1.0 - x, "nothing"),
    # shift: a learned bias added outside a projection (x * weight + bias)
    "shift (x + b, b learned)": (lambda x: x + torch.ones(8, requires_grad=True), "nothing"),
    "pow (x^3)": (lambda x: torch.pow(x, 3.0), "input"),
    "pow (x^2)": (lambda x: x.pow(2), "input"),
    "sqrt": (lambda x: torch.sqrt(x), "output"),
    "reciprocal": (lambda x: torch.reciprocal(x), "output"),
    "erf": (lambda x: torch.erf(x), "input"),
    "acos": (lambda x: torch.acos(x), "input"),
    # drop_path: Hugging Face's stochastic depth (x.div(keep) * floor(keep +
    # rand([b, 1]))) keeps its random tensor, one float a sample (4 here)
    "drop_path": (lambda x: x.div(0.9) * (0.9 + torch.rand(x.shape[0], 1)).floor_(), "float32 [4]"),
    # pad: F.pad(x, (0, 1), value=0) keeps nothing (constant_pad_nd_backward)
    "pad": (lambda x: torch.nn.functional.pad(x, (0, 1)), "nothing"),
    "reduce_mean (keepdims)": (lambda x: x.mean(-1, keepdim=True), "input"),
    "reduce_mean": (lambda x: x.mean(-1), "input"),
    # reduce_sum keeps nothing (sum_backward needs only the sizes)
    "reduce_sum": (lambda x: x.sum(-1), "nothing"),
    "reduce_sum (keepdims, axis 0)": (lambda x: x.sum(0, keepdim=True), "nothing"),
    # reduce_l2: torch.norm / F.normalize's norm keeps its input and the norm
    "reduce_l2": (lambda x: torch.linalg.vector_norm(x, 2, dim=-1), "input+output"),
    "reduce_l2 (torch.norm, keepdim)": (lambda x: torch.norm(x, p=2, dim=-1, keepdim=True), "input+output"),
    "tanh": (lambda x: torch.tanh(x), "output"),
    # avgpool2d {eager: true}; the engines' own rule keeps nothing
    "avgpool2d (eager)": (lambda x: torch.nn.functional.avg_pool2d(x, 3, 1, 1, count_include_pad=False), "input",
                          (1, 2, 7, 7)),
    # maxpool2d {eager: true}; the engines' own rule keeps int32 indices only
    "maxpool2d (eager)": (lambda x: torch.nn.functional.max_pool2d(x, 3, 2, ceil_mode=True),
                          "input+int64 [out]", (1, 2, 7, 7)),
}


def storage_ptr(t):
    return t.untyped_storage().data_ptr() if hasattr(t, "untyped_storage") else t.storage().data_ptr()


def kept(fn, shape=(4, 8)):
    x = (torch.rand(*shape) + 0.5).requires_grad_()
    packed = []

    def pack(t):
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fn(x)
    found = set()
    for t in packed:
        if t.dim() == 0:
            continue  # a wrapped Python number
        ptr = storage_ptr(t)
        if ptr == storage_ptr(x):
            found.add("input")
        elif ptr == storage_ptr(y):
            found.add("output")
        elif t.numel() == y.numel():
            found.add(f"{str(t.dtype).replace('torch.', '')} [out]")
        else:
            found.add(f"{str(t.dtype).replace('torch.', '')} [{t.numel()}]")
    return "+".join(sorted(found)) or "nothing"


def main():
    ok = True
    print(f"PyTorch {torch.__version__}")
    for name, (fn, rule, *shape) in CASES.items():
        got = kept(fn, *shape)
        ok = ok and got == rule
        print(f"{name:24s} PyTorch keeps {got:18s} dlplan declares {rule:18s} {'ok' if got == rule else 'MISMATCH'}")
    print("all match" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
