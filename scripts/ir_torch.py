#!/usr/bin/env python3
"""dlplan's model IR (DESIGN.md, "Model IR") as a PyTorch module.

    import ir_torch
    ir = json.load(open("models/tiny-gpt.json"))
    model = ir_torch.build(ir)               # an nn.Module; forward returns the loss
    ir_torch.load_flat(model, "params.f32")  # every parameter, in Model::params order
    loss = model(tokens=..., targets=...)    # batch-first tensors, one per IR input

Every op of the IR's table is built with the semantics of dlplan's executor
(executor/cpu/ops_*.cpp), so the same parameters and batch give the same loss
and gradients:

  * parameters are the module's parameters in exactly Model::params order
    (planner/src/loader.cpp: nodes in execution order, each node's parameters in
    its declaration order, planner/src/ops_decl.cpp), with these shapes:
      embedding      weight [num, dim]             (out = scale weight[ids]; no
                                                    gradient to row padding_idx)
      pos_embedding  weight [max_len, D]           (out = x + weight[offset:offset+T]; with
                                                    sinusoidal, none: a fixed table)
      cls_token      weight [D]                    (prepended as token 0)
      linear         weight [out, in], bias [out]  (a tied linear has no weight:
                                                    it uses the embedding's)
      conv2d         weight [out, C/groups, kh, kw], bias [out]
      batchnorm      weight [C], bias [C]; buffers running_mean, running_var
      layernorm      weight [D] (, bias [D]); D the trailing `dims` axes
      groupnorm      weight [C], bias [C]         (affine)
      rmsnorm        weight [D]                    (out = x rstd (weight + offset))
      attention      q.weight [H hd, D], k.weight [KV hd, Dm], v.weight [KV hd, Dm]
                     (Dm = D but for cross attention: the memory's width),
                     o.weight [D, H hd], then q.bias, k.bias, v.bias (qkv_bias,
                     default bias) and o.bias (out_bias, default bias)
      relative_position_bias  weight [buckets, heads]
  * attention: scale 1/sqrt(head_dim) unless given; k and v from input 1 with
    cross; the position bias (last input) added to the scaled scores;
    query head h reads kv head h // (H/KV);
    RoPE in the rotate-half form (HF Llama: pairs (i, i + hd/2), angle
    pos * theta^(-2i/hd)), applied to q and k after the projections; dropout on
    the probabilities;
  * avgpool2d counts padding (count_include_pad) unless told not to; maxpool2d pads with -inf;
  * batchnorm normalises with the batch statistics in training mode and
    updates the running statistics with the unbiased variance (PyTorch's);
  * cross_entropy is the mean over every label position of the micro-batch,
    computed in fp32 ("fused" changes what dlplan keeps for backward, not the
    value: PyTorch's own loss here either way).

The batch dimension is implicit in the IR and first here. i32 inputs may be
given as int32 or int64 tensors. Works on PyTorch 1.13 and 2.x; uses
F.scaled_dot_product_attention where it exists (math form otherwise).

Node order follows the loader: the file's order when it is already
topological, else the order of Boost's topological_sort (reverse DFS finish
order, vertices and out-edges in insertion order), so parameter order matches
dlplan's for any IR.
"""
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["build", "load_flat", "save_flat", "flat_parameters", "flat_grads", "param_count", "param_names",
           "IRModule", "random_inputs", "with_seq_len", "tokens_per_sample", "node_order", "model_flops_per_sample",
           "OPS"]

# ---- the op table (planner/src/ops_schema.cpp) ------------------------------------

_REQUIRED = object()
_DERIVED = object()  # filled from shapes
_NULL = object()     # optional, absent means none (linear's tie)

# op -> (inputs, {attr: default})
OPS = {
    "embedding": (1, {"num": _REQUIRED, "dim": _REQUIRED, "scale": 1.0, "padding_idx": _NULL, "tie": _NULL}),
    "pos_embedding": (1, {"max_len": _DERIVED, "offset": 0, "sinusoidal": _NULL, "frequency_step": _NULL}),
    "cls_token": (1, {}),
    "linear": (1, {"out": _REQUIRED, "bias": True, "tie": _NULL, "scale": _NULL}),
    "conv2d": (1, {"out": _REQUIRED, "kernel": _REQUIRED, "stride": 1, "padding": 0, "dilation": 1, "groups": 1,
                   "bias": True}),
    "conv_transpose2d": (1, {"out": _REQUIRED, "kernel": _REQUIRED, "stride": 1, "padding": 0, "output_padding": 0,
                             "groups": 1, "bias": True}),
    "lstm": (1, {"hidden": _REQUIRED, "bias": True, "bidirectional": False}),
    "gru": (1, {"hidden": _REQUIRED, "bias": True, "bidirectional": False}),
    "rnn": (1, {"hidden": _REQUIRED, "bias": True, "bidirectional": False, "nonlinearity": "tanh"}),
    "batchnorm": (1, {"eps": 1e-5, "momentum": 0.1}),
    "layernorm": (1, {"eps": 1e-5, "bias": True, "dims": 1}),
    "groupnorm": (1, {"groups": _REQUIRED, "eps": 1e-5, "affine": True}),
    "rmsnorm": (1, {"eps": 1e-6, "offset": 0.0}),
    "gelu": (1, {"approximate": "none"}),
    "relu": (1, {}),
    "silu": (1, {}),
    "tanh": (1, {}),
    "sigmoid": (1, {}),
    "clip": (1, {"min": _REQUIRED, "max": _REQUIRED}),
    "hardsigmoid": (1, {}),
    "hardswish": (1, {}),
    "leaky_relu": (1, {"slope": 0.01}),
    "elu": (1, {"alpha": 1.0}),
    "softplus": (1, {}),
    "mish": (1, {}),
    "prelu": (1, {"shape": _REQUIRED}),
    "shift": (1, {"shape": _REQUIRED}),
    "add": (2, {}),
    "mul": (2, {}),
    "matmul": (2, {}),
    "softmax": (1, {}),
    "causal_mask": (1, {"value": _REQUIRED, "fill": False, "query_axis": _DERIVED}),
    "alibi": (1, {}),
    "rope": (1, {"theta": 10000.0, "interleaved": False, "position_axis": -2}),
    "scale": (1, {"shape": _REQUIRED, "offset": 0.0}),
    "affine": (1, {"scale": 1.0, "shift": 0.0}),
    "pow": (1, {"exponent": _REQUIRED}),
    "sqrt": (1, {}),
    "reciprocal": (1, {}),
    "erf": (1, {}),
    "acos": (1, {}),
    "reduce_mean": (1, {"keepdims": False, "axis": -1}),
    "reduce_sum": (1, {"keepdims": False, "axis": -1}),
    "reduce_l2": (1, {"keepdims": False, "axis": -1}),
    "concat": (-1, {"axis": 0}),  # -1: one or more inputs
    "transpose": (1, {"perm": _REQUIRED}),
    "reshape": (1, {"shape": _REQUIRED, "view": _NULL}),  # view: memory only
    "slice": (1, {"axis": _REQUIRED, "start": _REQUIRED, "end": _REQUIRED, "step": 1, "view": _NULL}),  # view: memory only
    "pad": (1, {"pads": _REQUIRED, "value": 0.0}),
    "attention": (-1, {"heads": _REQUIRED, "kv_heads": _DERIVED, "head_dim": _DERIVED, "causal": False,
                       "bias": True, "qkv_bias": _DERIVED, "out_bias": _DERIVED, "dropout": 0.0, "rope": False,
                       "rope_theta": 10000.0, "rotary_dim": _DERIVED, "cross": _NULL, "position_bias": _NULL,
                       "scale": _NULL}),
    "relative_position_bias": (1, {"heads": _REQUIRED, "buckets": 32, "max_distance": 128, "bidirectional": True}),
    "moe_router": (1, {"experts": _REQUIRED}),
    "moe_expert": (2, {"expert": _REQUIRED, "hidden": _REQUIRED, "top_k": 2, "capacity_factor": 1.25,
                       "capacity": _DERIVED}),
    "moe_combine": (-1, {"top_k": 2, "capacity_factor": 1.25, "capacity": _DERIVED, "normalize": True}),
    "maxpool2d": (1, {"kernel": _REQUIRED, "stride": _DERIVED, "padding": 0, "ceil_mode": _NULL, "eager": _NULL}),
    "avgpool2d": (1, {"kernel": _REQUIRED, "stride": _DERIVED, "padding": 0, "count_include_pad": _NULL,
                      "eager": _NULL}),
    "global_avgpool": (1, {"keepdims": _NULL}),
    "upsample": (1, {"scale": _REQUIRED, "mode": "nearest", "align_corners": False}),
    "flatten": (1, {"view": _NULL}),
    "tokens": (1, {}),
    "select": (1, {"index": 0}),
    "dropout": (1, {"p": _REQUIRED}),
    "drop_path": (1, {"p": _REQUIRED}),
    "cross_entropy": (2, {"fused": False}),
}


def _pair(v):
    return (int(v[0]), int(v[1])) if isinstance(v, (list, tuple)) else (int(v), int(v))


def _window_1d(a, key):
    """A 1-D convolution's kernel, stride or padding (the width's): an
    integer, or the second of a pair whose first is the height's 1 (or 0)."""
    v = a[key]
    return int(v[1]) if isinstance(v, (list, tuple)) else int(v)


def alibi_slopes(heads):
    """ALiBi's slopes (Press et al. 2022; BLOOM's closest-power-of-two rule),
    as planner/src/ir.cpp's alibi_slopes."""
    cp = 1
    while cp * 2 <= heads:
        cp *= 2
    base = 2.0 ** (-8.0 / cp)
    slopes = [base ** k for k in range(1, cp + 1)]
    extra = 2.0 ** (-4.0 / cp)
    slopes += [extra ** (2 * k + 1) for k in range(min(cp, heads - cp))]
    return slopes


def _sinusoidal_table(a, offset, T, D):
    """pos_embedding's fixed table (sinusoidal): pair i's angle at position p
    is p exp(-i frequency_step); "halves" is fairseq's / XGLM's [sin | cos],
    "interleaved" Vaswani et al.'s sin, cos alternating. Computed as XGLM's
    get_embedding does, in float64 here."""
    half = D // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float64) * -float(a["frequency_step"]))
    angles = torch.arange(offset, offset + T, dtype=torch.float64)[:, None] * freq[None, :]
    if a["sinusoidal"] == "halves":
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    return torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).reshape(T, D)


def _numel(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def node_order(ir):
    """Indices of ir["nodes"] in dlplan's execution order (loader.cpp's topological_order)."""
    nodes = ir["nodes"]
    index = {n["name"]: i for i, n in enumerate(nodes)}
    out_edges = [[] for _ in nodes]
    file_order_ok = True
    for i, n in enumerate(nodes):
        for src in n["in"]:
            j = index.get(src)
            if j is None:
                continue  # a model input
            out_edges[j].append(i)
            if j > i:
                file_order_ok = False
    if file_order_ok:
        return list(range(len(nodes)))
    # boost::topological_sort: DFS over vertices 0..n-1, out-edges in insertion
    # order; vertices are appended as they finish; the order is the reverse.
    color = [0] * len(nodes)  # 0 white, 1 gray, 2 black
    finished = []
    for root in range(len(nodes)):
        if color[root]:
            continue
        color[root] = 1
        stack = [(root, 0)]
        while stack:
            u, k = stack[-1]
            if k < len(out_edges[u]):
                stack[-1] = (u, k + 1)
                v = out_edges[u][k]
                if color[v] == 0:
                    color[v] = 1
                    stack.append((v, 0))
                elif color[v] == 1:
                    raise ValueError(f"cycle through node '{nodes[v]['name']}'")
            else:
                color[u] = 2
                finished.append(u)
                stack.pop()
    return finished[::-1]


def _fill_attrs(node):
    op = node.get("op")
    if op not in OPS:
        raise ValueError(f"node '{node.get('name')}': unknown op '{op}' (known: {', '.join(OPS)})")
    n_in, spec = OPS[op]
    if n_in == -1 and not node["in"]:
        raise ValueError(f"node '{node['name']}' ({op}): takes one or more inputs, got none")
    if n_in != -1 and len(node["in"]) != n_in:
        raise ValueError(f"node '{node['name']}' ({op}): takes {n_in} inputs, got {len(node['in'])}")
    for key in node:
        if key not in ("name", "op", "in", "unit", "shares") and key not in spec:
            raise ValueError(f"node '{node['name']}' ({op}): unknown attribute '{key}'")
    a = {}
    for key, default in spec.items():
        if key in node and node[key] is not None:
            a[key] = node[key]
        elif default is _REQUIRED:
            raise ValueError(f"node '{node['name']}' ({op}): missing required attribute '{key}'")
        elif default is _NULL or default is _DERIVED:
            a[key] = None
        else:
            a[key] = default
    return a


class _Node:
    __slots__ = ("name", "op", "inputs", "unit", "shares", "a", "in_shapes", "shape", "dtype", "mod", "params")


def _plan(ir):
    """Nodes in execution order with attributes filled and shapes inferred (ops_schema.cpp)."""
    shapes, dtypes = {}, {}
    inputs = []
    for name, spec in ir["inputs"].items():
        shapes[name] = tuple(int(d) for d in spec["shape"])
        dtypes[name] = spec["dtype"]
        inputs.append(name)
    raw = ir["nodes"]
    plan = []
    by_name = {}
    for idx in node_order(ir):
        r = raw[idx]
        n = _Node()
        n.name, n.op, n.inputs = r["name"], r["op"], list(r["in"])
        n.unit = r.get("unit", "")
        n.shares = r.get("shares")  # an earlier node whose parameters this one applies (ALBERT)
        n.a = _fill_attrs(r)
        for src in n.inputs:
            if src not in shapes:
                raise ValueError(f"node '{n.name}': input '{src}' is neither a model input nor a node")
        n.in_shapes = [shapes[s] for s in n.inputs]
        x = n.in_shapes[0]
        a, op = n.a, n.op
        if op == "embedding":
            out = x + (int(a["dim"]),)
        elif op == "pos_embedding":
            if a["sinusoidal"] is not None:  # a fixed table as long as the positions read
                a["max_len"] = int(a["offset"]) + x[0]
            if a["max_len"] is None:
                a["max_len"] = x[0]
            out = x
        elif op == "cls_token":
            out = (x[0] + 1, x[1])
        elif op == "linear":
            out = x[:-1] + (int(a["out"]),)
        elif op == "conv2d" and len(x) == 2:  # 1-D over [C, L]: the width's window
            k, s, p = _window_1d(a, "kernel"), _window_1d(a, "stride"), _window_1d(a, "padding")
            d = _window_1d(a, "dilation")
            out = (int(a["out"]), (x[1] + 2 * p - d * (k - 1) - 1) // s + 1)
        elif op == "conv2d":  # nn.Conv2d's output: (in + 2 p - d (k - 1) - 1) // s + 1
            k, s, p, d = _pair(a["kernel"]), _pair(a["stride"]), _pair(a["padding"]), _pair(a["dilation"])
            out = (int(a["out"]), (x[1] + 2 * p[0] - d[0] * (k[0] - 1) - 1) // s[0] + 1,
                   (x[2] + 2 * p[1] - d[1] * (k[1] - 1) - 1) // s[1] + 1)
        elif op in ("lstm", "gru", "rnn"):
            out = (x[0], int(a["hidden"]) * (2 if a["bidirectional"] else 1))
        elif op == "conv_transpose2d" and len(x) == 2:  # (in - 1) s - 2 p + k + output_padding, the width's
            k, s, p, o = (_window_1d(a, key) for key in ("kernel", "stride", "padding", "output_padding"))
            out = (int(a["out"]), (x[1] - 1) * s - 2 * p + k + o)
        elif op == "conv_transpose2d":
            k, s, p, o = (_pair(a[key]) for key in ("kernel", "stride", "padding", "output_padding"))
            out = (int(a["out"]),) + tuple((x[1 + d] - 1) * s[d] - 2 * p[d] + k[d] + o[d] for d in range(2))
        elif op == "attention":
            if a["kv_heads"] is None:
                a["kv_heads"] = a["heads"]
            if a["head_dim"] is None:
                if x[1] % a["heads"]:
                    raise ValueError(f"node '{n.name}': width {x[1]} is not divisible by heads {a['heads']}")
                a["head_dim"] = x[1] // a["heads"]
            out = x
        elif op == "relative_position_bias":
            out = (int(a["heads"]), x[0], x[0])
        elif op == "moe_router":
            out = (x[0], int(a["experts"]))
        elif op in ("moe_expert", "moe_combine"):
            T, E = n.in_shapes[1] if op == "moe_expert" else n.in_shapes[0]
            if a["capacity"] is None:  # GShard's capacity, at most every token
                a["capacity"] = min(T, math.ceil(float(a["capacity_factor"]) * T * int(a["top_k"]) / E))
            out = (int(a["capacity"]), x[1]) if op == "moe_expert" else (T, n.in_shapes[1][1])
        elif op in ("maxpool2d", "avgpool2d") and len(x) == 2:  # 1-D over [C, L]: the width's window
            if a["stride"] is None:
                a["stride"] = a["kernel"]
            k, s, p = _window_1d(a, "kernel"), _window_1d(a, "stride"), _window_1d(a, "padding")
            if a.get("ceil_mode"):
                o = -(-(x[1] + 2 * p - k) // s) + 1
                out = (x[0], o - 1 if (o - 1) * s >= x[1] + p else o)
            else:
                out = (x[0], (x[1] + 2 * p - k) // s + 1)
        elif op in ("maxpool2d", "avgpool2d"):
            if a["stride"] is None:
                a["stride"] = a["kernel"]
            k, s, p = _pair(a["kernel"]), _pair(a["stride"]), _pair(a["padding"])
            out = (x[0], (x[1] + 2 * p[0] - k[0]) // s[0] + 1, (x[2] + 2 * p[1] - k[1]) // s[1] + 1)
            if a.get("ceil_mode"):  # ATen's pooling_output_shape
                def ceil_out(i, d):
                    o = -(-(i + 2 * p[d] - k[d]) // s[d]) + 1
                    return o - 1 if (o - 1) * s[d] >= i + p[d] else o
                out = (x[0], ceil_out(x[1], 0), ceil_out(x[2], 1))
        elif op == "upsample":  # whole factors; over [C, L] an integer is the length's
            s = (1, _window_1d(a, "scale")) if len(x) == 2 else _pair(a["scale"])
            out = (x[0], x[1] * s[1]) if len(x) == 2 else (x[0], x[1] * s[0], x[2] * s[1])
        elif op == "global_avgpool":
            out = (x[0],) + (1,) * (len(x) - 1) if a.get("keepdims") else (x[0],)
        elif op == "concat":
            ax = int(a["axis"])
            out = tuple(sum(s[ax] for s in n.in_shapes) if d == ax else x[d] for d in range(len(x)))
        elif op == "mul":  # NumPy broadcasting of the per-sample shapes
            out = tuple(torch.broadcast_shapes(x, n.in_shapes[1]))
        elif op == "matmul":  # [..., M, K] x [..., K, N], the leading dims broadcast
            y = n.in_shapes[1]
            if len(x) < 2 or len(y) < 2 or x[-1] != y[-2]:
                raise ValueError(f"node '{n.name}': {x} and {y} do not multiply")
            out = tuple(torch.broadcast_shapes(x[:-2], y[:-2])) + (x[-2], y[-1])
        elif op == "transpose":
            perm = [int(p) for p in a["perm"]]
            if sorted(perm) != list(range(len(x))):
                raise ValueError(f"node '{n.name}': perm {perm} is not a permutation of {len(x)} axes")
            out = tuple(x[p] for p in perm)
        elif op == "slice":
            ax, s0, s1, st = int(a["axis"]), int(a["start"]), int(a["end"]), int(a["step"])
            if not (0 <= ax < len(x) and 0 <= s0 < s1 <= x[ax] and st >= 1):
                raise ValueError(f"node '{n.name}': slice [{s0}, {s1}) step {st} of axis {ax} is outside {x}")
            out = tuple(-(-(s1 - s0) // st) if d == ax else x[d] for d in range(len(x)))
        elif op == "pad":  # pads: before each per-sample axis, then after each
            pads = [int(v) for v in a["pads"]]
            if len(pads) != 2 * len(x) or min(pads, default=0) < 0:
                raise ValueError(f"node '{n.name}': pads {pads} do not pad {x}")
            out = tuple(x[d] + pads[d] + pads[len(x) + d] for d in range(len(x)))
        elif op == "reshape":
            out = tuple(int(d) for d in a["shape"])
            if _numel(out) != _numel(x):
                raise ValueError(f"node '{n.name}': cannot reshape {x} to {out}")
        elif op in ("scale", "prelu", "shift"):
            if tuple(torch.broadcast_shapes(x, tuple(int(d) for d in a["shape"]))) != x:
                raise ValueError(f"node '{n.name}': shape {a['shape']} does not broadcast to {x}")
            out = x
        elif op in ("reduce_mean", "reduce_sum", "reduce_l2"):  # over one per-sample axis (the last by default)
            ax = int(a["axis"]) % len(x)
            out = x[:ax] + ((1,) if a["keepdims"] else ()) + x[ax + 1:]
        elif op == "flatten":
            out = (_numel(x),)
        elif op == "tokens":
            out = (x[1] * x[2], x[0])
        elif op == "select":
            out = (x[1],)
        elif op == "cross_entropy":
            out = ()
        else:  # elementwise, norms, add, mul, dropout
            out = x
        n.shape = out
        n.dtype = "f32"
        shapes[n.name], dtypes[n.name] = out, "f32"
        by_name[n.name] = n
        plan.append(n)
    # Tied parameters belong to the root unit (loader.cpp).
    for n in plan:
        if n.op in ("linear", "embedding") and n.a["tie"] is not None:
            t = by_name.get(n.a["tie"])
            if t is None or t.op != "embedding":
                raise ValueError(f"node '{n.name}': tie names '{n.a['tie']}', which is not an embedding node")
            t.unit = ""
        if n.shares is not None:
            t = by_name.get(n.shares)
            if t is None or t.op != n.op or t.shares is not None or t is n:
                raise ValueError(f"node '{n.name}': shares names '{n.shares}', which is not an earlier {n.op} "
                                 "with parameters of its own")
            t.unit = ""
    losses = [n for n in plan if n.op == "cross_entropy"]
    if len(losses) != 1:
        raise ValueError(f"a model needs exactly one cross_entropy node, found {len(losses)}")
    return inputs, shapes, dtypes, plan


# ---- the module --------------------------------------------------------------------


def _param(*shape, device=None):
    return nn.Parameter(torch.empty(*shape, device=device))


class _NodeParams(nn.Module):
    """One node's parameters (and buffers), registered in declaration order."""


_HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


class IRModule(nn.Module):
    """The IR as a module. forward(*inputs in IR order, or name=tensor) -> the loss."""

    def __init__(self, ir, checkpointing="none", use_sdpa=None, device=None):
        super().__init__()
        self._device = device
        self.ir_name = ir.get("name", "model")
        self.input_names, self.shapes, self.dtypes, self._nodes = _plan(ir)
        self.input_specs = {k: (self.shapes[k], self.dtypes[k]) for k in self.input_names}
        if checkpointing not in ("none", "units"):
            raise ValueError(f"checkpointing must be 'none' or 'units', got {checkpointing!r}")
        self.checkpointing = checkpointing
        self.use_sdpa = _HAS_SDPA if use_sdpa is None else (use_sdpa and _HAS_SDPA)
        self.nodes = nn.ModuleDict()
        self._names = []  # dlplan's parameter names, in order
        self._decay = []  # weight decay flag per parameter (ParamInfo::weight_decay)
        used = set()
        built = {}  # name -> node, for `shares` (owners come first)
        for n in self._nodes:
            built[n.name] = n
            key = n.name.replace(".", "_")
            while key in used or not key or hasattr(self.nodes, key):  # "update", "keys": ModuleDict's own
                key += "_"
            used.add(key)
            m = _NodeParams()
            plist = self._declare(n, m)  # [(suffix, weight_decay)]
            n.mod = key
            if n.shares is not None:  # the owner's module: its parameters, not new ones (loader.cpp)
                owner = built[n.shares]
                n.mod, n.params = owner.mod, owner.params
                continue
            n.params = [s for s, _ in plist]
            if plist or list(m.buffers()):
                self.nodes[key] = m
            for suffix, decay in plist:
                self._names.append(f"{n.name}.{suffix}")
                self._decay.append(decay)
        self._by_name = {n.name: n for n in self._nodes}
        self._segments = self._make_segments()
        self._rope_cache = {}
        self.reset_parameters()

    # Parameters in ops_decl.cpp's order and the executor's layouts.
    def _declare(self, n, m):
        a, x, op = n.a, n.in_shapes[0], n.op
        out = []

        def P(*shape):
            return _param(*shape, device=self._device)

        def add(suffix, t, decay):
            m.register_parameter(suffix.replace(".", "_"), t)
            out.append((suffix, decay))

        if op == "embedding":
            if a["tie"] is None:  # tied: the other embedding's table
                add("weight", P(int(a["num"]), int(a["dim"])), True)
        elif op == "pos_embedding":
            if int(a["offset"]) + x[0] > int(a["max_len"]):
                raise ValueError(f"node '{n.name}': sequence length {x[0]} from row {a['offset']} exceeds max_len "
                                 f"{a['max_len']}")
            if a["sinusoidal"] is None:
                add("weight", P(int(a["max_len"]), x[1]), True)
        elif op == "cls_token":
            add("weight", P(x[1]), False)
        elif op == "linear":
            if a["tie"] is None:
                add("weight", P(int(a["out"]), x[-1]), True)
            if a["bias"]:
                add("bias", P(int(a["out"])), False)
        elif op == "conv2d":
            g = int(a["groups"])
            if len(x) == 2:  # Conv1d's weight [out, C/groups, k]
                add("weight", P(int(a["out"]), x[0] // g, _window_1d(a, "kernel")), True)
            else:
                k = _pair(a["kernel"])
                add("weight", P(int(a["out"]), x[0] // g, k[0], k[1]), True)
            if a["bias"]:
                add("bias", P(int(a["out"])), False)
        elif op == "conv_transpose2d":  # torch's layout [C, out/groups, kh, kw] (1-D: [C, out/groups, k])
            g = int(a["groups"])
            k = (_window_1d(a, "kernel"),) if len(x) == 2 else _pair(a["kernel"])
            add("weight", P(x[0], int(a["out"]) // g, *k), True)
            if a["bias"]:
                add("bias", P(int(a["out"])), False)
        elif op in ("lstm", "gru", "rnn"):  # nn.LSTM's weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0 (nn.GRU's, nn.RNN's alike)
            G = {"lstm": 4, "gru": 3, "rnn": 1}[op] * int(a["hidden"])
            for d in ("", "_reverse") if a["bidirectional"] else ("",):
                add("weight_ih" + d, P(G, x[1]), True)
                add("weight_hh" + d, P(G, int(a["hidden"])), True)
                if a["bias"]:
                    add("bias_ih" + d, P(G), False)
                    add("bias_hh" + d, P(G), False)
        elif op == "batchnorm":
            add("weight", P(x[0]), False)
            add("bias", P(x[0]), False)
            m.register_buffer("running_mean", torch.zeros(x[0], device=self._device))
            m.register_buffer("running_var", torch.ones(x[0], device=self._device))
        elif op == "layernorm":  # over the trailing `dims` axes
            add("weight", P(*x[len(x) - int(a["dims"]):]), False)
            if a["bias"]:
                add("bias", P(*x[len(x) - int(a["dims"]):]), False)
        elif op == "rmsnorm":
            add("weight", P(x[-1]), False)
        elif op == "groupnorm":
            if a["affine"]:
                add("weight", P(x[0]), False)
                add("bias", P(x[0]), False)
        elif op in ("scale", "prelu"):
            add("weight", P(*[int(d) for d in a["shape"]]), False)
        elif op == "shift":
            add("bias", P(*[int(d) for d in a["shape"]]), False)
        elif op == "attention":
            D, H, KV, hd = x[1], int(a["heads"]), int(a["kv_heads"]), int(a["head_dim"])
            if H % KV:
                raise ValueError(f"node '{n.name}': kv_heads {KV} must divide heads {H}")
            for key in ("qkv_bias", "out_bias"):
                if a[key] is None:
                    a[key] = a["bias"]
            if a["rotary_dim"] is None:
                a["rotary_dim"] = hd
            if a["rope"] and a["rotary_dim"] % 2:
                raise ValueError(f"node '{n.name}': rope needs an even rotary_dim")
            Dm = n.in_shapes[1][1] if a["cross"] else D  # k and v read the memory under cross attention
            add("q.weight", P(H * hd, D), True)
            add("k.weight", P(KV * hd, Dm), True)
            add("v.weight", P(KV * hd, Dm), True)
            add("o.weight", P(D, H * hd), True)
            if a["qkv_bias"]:
                add("q.bias", P(H * hd), False)
                add("k.bias", P(KV * hd), False)
                add("v.bias", P(KV * hd), False)
            if a["out_bias"]:
                add("o.bias", P(D), False)
        elif op == "relative_position_bias":
            add("weight", P(int(a["buckets"]), int(a["heads"])), False)
        elif op == "moe_router":
            add("weight", P(int(a["experts"]), x[1]), True)
        elif op == "moe_expert":
            D, Fh = x[1], int(a["hidden"])
            add("w1.weight", P(Fh, D), True)
            add("w2.weight", P(D, Fh), True)
            add("w3.weight", P(Fh, D), True)
        return out

    def reset_parameters(self):
        """A PyTorch-style initialisation (not dlplan's): normal(0, 0.02) weights
        of GEMMs and embeddings, zero biases, unit norm scales."""
        with torch.no_grad():
            for name, p in zip(self._names, self.parameters()):
                if name.endswith("bias"):
                    p.zero_()
                elif p.dim() == 1 and not name.endswith("cls_token.weight"):
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02)

    # -- introspection --
    def param_names(self):
        return list(self._names)

    def named_dlplan_parameters(self):
        return list(zip(self._names, self.parameters()))

    def decay_flags(self):
        return list(self._decay)

    def tokens_per_sample(self):
        return tokens_per_sample_of(self.input_specs)

    # -- segments: consecutive nodes of one unit (checkpointing) --
    def _make_segments(self):
        segs = []
        for n in self._nodes:
            if segs and segs[-1][0] == n.unit:
                segs[-1][1].append(n)
            else:
                segs.append((n.unit, [n]))
        # What each segment reads from outside, and what later nodes read from it.
        out = []
        later_reads = set()
        read_after = []
        for unit, nodes in reversed(segs):
            read_after.append(set(later_reads))
            for n in nodes:
                later_reads.update(n.inputs)
        read_after.reverse()
        loss = next(n.name for n in self._nodes if n.op == "cross_entropy")
        for (unit, nodes), after in zip(segs, read_after):
            produced = {n.name for n in nodes}
            ins = []
            for n in nodes:
                for s in n.inputs:
                    if s not in produced and s not in ins:
                        ins.append(s)
            outs = [n.name for n in nodes if n.name in after or n.name == loss]
            out.append((unit, nodes, ins, outs))
        return out

    # -- forward --
    def forward(self, *args, **kwargs):
        vals = {}
        for name, v in zip(self.input_names, args):
            vals[name] = v
        vals.update(kwargs)
        for name in self.input_names:
            if name not in vals:
                raise ValueError(f"model input '{name}' is missing")
        loss = None
        for unit, nodes, ins, outs in self._segments:
            if self.checkpointing == "units" and unit and self.training and torch.is_grad_enabled():
                res = _checkpoint(self._run_segment_fn(nodes, ins, outs), *[vals[s] for s in ins])
                vals.update(zip(outs, res))
            else:
                self._run_nodes(nodes, vals)
        for n in self._nodes:
            if n.op == "cross_entropy":
                loss = vals[n.name]
        return loss

    def _run_segment_fn(self, nodes, ins, outs):
        def fn(*tensors):
            v = dict(zip(ins, tensors))
            self._run_nodes(nodes, v)
            return tuple(v[o] for o in outs)
        return fn

    def _run_nodes(self, nodes, vals):
        for n in nodes:
            vals[n.name] = self._run(n, [vals[s] for s in n.inputs])

    def _p(self, n, suffix):
        return getattr(self.nodes[n.mod], suffix.replace(".", "_"))

    def _run(self, n, xs):
        a, op, x = n.a, n.op, xs[0]
        if op == "embedding":
            table = self._p(self._by_name[a["tie"]] if a["tie"] is not None else n, "weight")
            y = F.embedding(x.long(), table, padding_idx=a["padding_idx"])
            return y * float(a["scale"]) if float(a["scale"]) != 1.0 else y
        if op == "pos_embedding":
            T, offset = x.shape[1], int(a["offset"])
            if a["sinusoidal"] is not None:
                return x + _sinusoidal_table(a, offset, T, x.shape[2]).to(x.dtype)
            return x + self._p(n, "weight")[offset:offset + T]
        if op == "cls_token":
            w = self._p(n, "weight")
            return torch.cat([w.to(x.dtype).expand(x.shape[0], 1, x.shape[2]), x], dim=1)
        if op == "linear":
            if a["tie"] is not None:
                t = self._by_name[a["tie"]]
                w = self._p(t, "weight")
            else:
                w = self._p(n, "weight")
            if a["scale"] is not None:  # the input's factor (T5's tied head)
                x = x * float(a["scale"])
            return F.linear(x, w, self._p(n, "bias") if a["bias"] else None)
        if op == "conv2d" and x.dim() == 3:  # 1-D: [B, C, L]
            return F.conv1d(x, self._p(n, "weight"), self._p(n, "bias") if a["bias"] else None,
                            stride=_window_1d(a, "stride"), padding=_window_1d(a, "padding"),
                            dilation=_window_1d(a, "dilation"), groups=int(a["groups"]))
        if op == "conv2d":
            return F.conv2d(x, self._p(n, "weight"), self._p(n, "bias") if a["bias"] else None,
                            stride=_pair(a["stride"]), padding=_pair(a["padding"]), dilation=_pair(a["dilation"]),
                            groups=int(a["groups"]))
        if op in ("lstm", "gru", "rnn"):  # PyTorch's own aten::lstm / gru / rnn_tanh / rnn_relu, batch_first, one layer, zero states
            H, bi = int(a["hidden"]), bool(a["bidirectional"])
            names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh") if a["bias"] else ("weight_ih", "weight_hh")
            ps = [self._p(n, k + d) for d in (("", "_reverse") if bi else ("",)) for k in names]
            h0 = x.new_zeros(2 if bi else 1, x.shape[0], H)
            if op == "gru":
                return torch.gru(x, h0, ps, bool(a["bias"]), 1, 0.0, self.training, bi, True)[0]
            if op == "rnn":
                cell = torch.rnn_relu if a["nonlinearity"] == "relu" else torch.rnn_tanh
                return cell(x, h0, ps, bool(a["bias"]), 1, 0.0, self.training, bi, True)[0]
            return torch.lstm(x, (h0, h0), ps, bool(a["bias"]), 1, 0.0, self.training, bi, True)[0]
        if op == "conv_transpose2d" and x.dim() == 3:
            return F.conv_transpose1d(x, self._p(n, "weight"), self._p(n, "bias") if a["bias"] else None,
                                      stride=_window_1d(a, "stride"), padding=_window_1d(a, "padding"),
                                      output_padding=_window_1d(a, "output_padding"), groups=int(a["groups"]))
        if op == "conv_transpose2d":
            return F.conv_transpose2d(x, self._p(n, "weight"), self._p(n, "bias") if a["bias"] else None,
                                      stride=_pair(a["stride"]), padding=_pair(a["padding"]),
                                      output_padding=_pair(a["output_padding"]), groups=int(a["groups"]))
        if op == "batchnorm":
            m = self.nodes[n.mod]
            return F.batch_norm(x, m.running_mean, m.running_var, m.weight, m.bias, self.training,
                                float(a["momentum"]), float(a["eps"]))
        if op == "layernorm":
            return F.layer_norm(x, tuple(x.shape[x.dim() - int(a["dims"]):]), self._p(n, "weight"),
                                self._p(n, "bias") if a["bias"] else None, float(a["eps"]))
        if op == "groupnorm":
            affine = a["affine"]
            return F.group_norm(x, int(a["groups"]), self._p(n, "weight") if affine else None,
                                self._p(n, "bias") if affine else None, float(a["eps"]))
        if op == "rmsnorm":
            xf = x.float()
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + float(a["eps"]))
            w = self._p(n, "weight")
            return (w + float(a["offset"]) if float(a["offset"]) else w) * y.to(x.dtype)
        if op == "gelu":
            return F.gelu(x, approximate=a["approximate"])
        if op == "relu":
            return F.relu(x)
        if op == "silu":
            return F.silu(x)
        if op == "tanh":
            return torch.tanh(x)
        if op == "sigmoid":
            return torch.sigmoid(x)
        if op == "clip":
            return F.hardtanh(x, float(a["min"]), float(a["max"]))
        if op == "hardsigmoid":
            return F.hardsigmoid(x)
        if op == "hardswish":
            return F.hardswish(x)
        if op == "leaky_relu":
            return F.leaky_relu(x, float(a["slope"]))
        if op == "elu":
            return F.elu(x, float(a["alpha"]))
        if op == "softplus":
            return F.softplus(x)
        if op == "mish":
            return F.mish(x)
        if op == "add":
            return x + xs[1]
        if op == "mul":
            return x * xs[1]
        if op == "matmul":
            return torch.matmul(x, xs[1])
        if op == "softmax":
            return torch.softmax(x, dim=-1)
        if op == "rope":  # RoPE outside attention: rotate-half (GPT-NeoX's, Falcon's) or interleaved (GPT-J's)
            pa, d = int(a.get("position_axis", -2)), x.shape[-1]
            T = x.shape[pa]
            inv_freq = 1.0 / (float(a["theta"]) ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
            ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
            if a.get("interleaved", False):  # pairs (2i, 2i + 1): rotate_every_two, tables repeat_interleave'd
                cos, sin = ang.cos().repeat_interleave(2, -1), ang.sin().repeat_interleave(2, -1)
                rot = torch.stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)
            else:
                cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
                rot = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
            shape = [T] + [1] * (-pa - 2) + [d]  # the tables broadcast over the axes between T and d
            cos, sin = cos.reshape(shape).to(x.dtype), sin.reshape(shape).to(x.dtype)
            return x * cos + rot * sin
        if op == "alibi":  # head h adds slope_h * j at key j (BLOOM's alibi tensor)
            H, Tk = x.shape[-3], x.shape[-1]
            slopes = torch.tensor(alibi_slopes(H), dtype=torch.float32, device=x.device)
            bias = slopes[:, None, None] * torch.arange(Tk, dtype=torch.float32, device=x.device)
            return x + bias.to(x.dtype)
        if op == "causal_mask":  # key j > query i: x + value (OPT), or value (fill)
            T = x.shape[-1]
            above = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            if a["query_axis"] is not None:  # queries on per-sample axis q (x has the batch first): [T, 1.., T]
                between = x.dim() - 1 - (int(a["query_axis"]) + 1) - 1
                above = above.reshape([T] + [1] * between + [T])
            if a["fill"]:
                return torch.where(above, torch.tensor(float(a["value"]), dtype=x.dtype, device=x.device), x)
            return x + torch.zeros(above.shape, dtype=x.dtype, device=x.device).masked_fill(above, float(a["value"]))
        if op == "scale":
            w = self._p(n, "weight")
            return x * (w + float(a["offset"]) if float(a["offset"]) else w)
        if op == "shift":
            return x + self._p(n, "bias")
        if op == "prelu":  # the slope broadcast as scale's gamma (F.prelu's own broadcasting is by channel)
            return torch.where(x > 0, x, self._p(n, "weight") * x)
        if op == "affine":
            return x * float(a["scale"]) + float(a["shift"])
        if op == "pow":
            return torch.pow(x, float(a["exponent"]))
        if op == "sqrt":
            return torch.sqrt(x)
        if op == "reciprocal":
            return torch.reciprocal(x)
        if op == "erf":
            return torch.erf(x)
        if op == "acos":
            return torch.acos(x)
        if op in ("reduce_mean", "reduce_sum"):
            ax = int(a["axis"])  # per sample; the module's tensors lead with the batch
            ax = ax if ax < 0 else ax + 1
            keep = bool(a["keepdims"])
            if op == "reduce_l2":
                return torch.linalg.vector_norm(x, 2, dim=ax, keepdim=keep)
            return x.mean(ax, keepdim=keep) if op == "reduce_mean" else x.sum(ax, keepdim=keep)
        if op == "slice":  # x[..., start:end:step] along the axis (after the batch's)
            at = [slice(None)] * x.dim()
            at[int(a["axis"]) + 1] = slice(int(a["start"]), int(a["end"]), int(a["step"]))
            return x[tuple(at)]
        if op == "pad":  # F.pad lists the last axis first: (its before, its after, the one before's ...)
            pads, r = [int(v) for v in a["pads"]], x.dim() - 1
            torch_pads = [p for d in reversed(range(r)) for p in (pads[d], pads[r + d])]
            return F.pad(x, torch_pads, "constant", float(a["value"]))
        if op == "reshape":
            return x.reshape(x.shape[0], *[int(d) for d in a["shape"]])
        if op == "transpose":
            return x.permute(0, *[int(p) + 1 for p in a["perm"]]).contiguous()
        if op == "concat":
            return torch.cat(list(xs), dim=int(a["axis"]) + 1)
        if op == "attention":
            return self._attention(n, xs)
        if op == "relative_position_bias":
            return self._relative_position_bias(n, x)
        if op == "moe_router":
            return F.softmax(x @ self._p(n, "weight").t(), dim=-1, dtype=torch.float32).to(x.dtype)
        if op == "moe_expert":
            return self._moe_expert(n, x, xs[1])
        if op == "moe_combine":
            return self._moe_combine(n, xs[0], xs[1:])
        if op in ("maxpool2d", "avgpool2d") and x.dim() == 3:  # 1-D: [B, C, L]
            k, st, p = _window_1d(a, "kernel"), _window_1d(a, "stride"), _window_1d(a, "padding")
            if op == "maxpool2d":
                return F.max_pool1d(x, k, st, p, ceil_mode=bool(a.get("ceil_mode")))
            return F.avg_pool1d(x, k, st, p, ceil_mode=False, count_include_pad=a.get("count_include_pad") is not False)
        if op == "maxpool2d":
            return F.max_pool2d(x, _pair(a["kernel"]), _pair(a["stride"]), _pair(a["padding"]),
                                ceil_mode=bool(a.get("ceil_mode")))
        if op == "avgpool2d":
            return F.avg_pool2d(x, _pair(a["kernel"]), _pair(a["stride"]), _pair(a["padding"]),
                                ceil_mode=False, count_include_pad=a.get("count_include_pad") is not False)
        if op == "upsample":
            s = _window_1d(a, "scale") if x.dim() == 3 else tuple(_pair(a["scale"]))
            if a["mode"] == "linear":  # upsample_linear1d over [C, L], upsample_bilinear2d over [C, H, W]
                return F.interpolate(x, scale_factor=s, mode="linear" if x.dim() == 3 else "bilinear",
                                     align_corners=bool(a["align_corners"]))
            return F.interpolate(x, scale_factor=s, mode="nearest")
        if op == "global_avgpool":
            return x.mean(dim=tuple(range(2, x.dim())), keepdim=bool(a.get("keepdims")))
        if op == "flatten":
            return x.reshape(x.shape[0], -1)
        if op == "tokens":
            return x.flatten(2).transpose(1, 2)
        if op == "select":
            return x[:, int(a["index"])]
        if op == "dropout":
            return F.dropout(x, float(a["p"]), self.training)
        if op == "drop_path":  # Hugging Face's drop_path: whole samples kept with probability 1 - p
            p = float(a["p"])
            if not self.training or p == 0.0:
                return x
            keep = 1.0 - p
            shape = (x.shape[0],) + (1,) * (x.dim() - 1)
            return x.div(keep) * (keep + torch.rand(shape, dtype=x.dtype, device=x.device)).floor_()
        if op == "cross_entropy":
            K = x.shape[-1]
            return F.cross_entropy(x.float().reshape(-1, K), xs[1].reshape(-1).long())
        raise ValueError(f"op {op} not supported")

    def _rope(self, T, hd, theta, device, dtype):
        key = (T, hd, theta, str(device), dtype)
        cs = self._rope_cache.get(key)
        if cs is None:
            half = hd // 2
            i = torch.arange(half, dtype=torch.float64)
            inv_freq = 1.0 / torch.pow(torch.tensor(float(theta), dtype=torch.float64), 2.0 * i / hd)
            ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
            cs = (ang.cos().to(torch.float32).to(device=device, dtype=dtype),
                  ang.sin().to(torch.float32).to(device=device, dtype=dtype))
            self._rope_cache[key] = cs
        return cs

    def _apply_rope(self, t, cos, sin):
        # t: [B, heads, T, hd]; the first rot = 2 cos.shape[-1] dims rotate, pairs
        # (i, i + rot/2): (x1 cos - x2 sin, x2 cos + x1 sin); the rest pass (Phi).
        half = cos.shape[-1]
        x1, x2, rest = t[..., :half], t[..., half:2 * half], t[..., 2 * half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)

    @staticmethod
    def _moe_routing(a, probs):
        """Top-k routing with a capacity per expert (ops_schema.cpp's
        moe_expert and moe_combine), as GShard assigns places: every token's
        first choice in token order, then its second, ...; a choice past its
        expert's capacity is dropped. Returns the chosen experts [B, T, k]
        (best first), their places [B, T, k] and which are kept."""
        B, T, E = probs.shape
        k, C = int(a["top_k"]), int(a["capacity"])
        top_p, top_e = probs.detach().topk(k, dim=-1)  # the choice passes no gradient
        chosen = F.one_hot(top_e.transpose(1, 2).reshape(B, k * T), E)  # [B, k T, E]
        place = ((chosen.cumsum(dim=1) - 1) * chosen).sum(dim=-1).reshape(B, k, T).transpose(1, 2)  # [B, T, k]
        return top_e, place, place < C

    def _moe_expert(self, n, x, probs):
        """Expert e, Mixtral's SwiGLU MLP w2(silu(w1 x) * w3 x), on the tokens
        routed to it, in place order; empty places stay zero."""
        a = n.a
        e, C = int(a["expert"]), int(a["capacity"])
        top_e, place, kept = self._moe_routing(a, probs)
        w1, w2, w3 = (self._p(n, f"{w}.weight") for w in ("w1", "w2", "w3"))
        out = torch.zeros(x.shape[0], C, x.shape[2], dtype=x.dtype, device=x.device)
        for b in range(x.shape[0]):
            tok, rank = torch.nonzero((top_e[b] == e) & kept[b], as_tuple=True)
            if tok.numel() == 0:
                continue
            h = x[b, tok]
            out[b, place[b, tok, rank]] = (F.silu(h @ w1.t()) * (h @ w3.t())) @ w2.t()
        return out

    def _moe_combine(self, n, probs, places):
        """Each token's expert outputs times its gates (the chosen
        probabilities, renormalised when normalize)."""
        a = n.a
        top_e, place, kept = self._moe_routing(a, probs)
        top_p = probs.gather(-1, top_e)  # differentiable in the probabilities
        gates = top_p / top_p.sum(dim=-1, keepdim=True) if a["normalize"] else top_p
        B, T, _ = top_e.shape
        y = torch.zeros(B, T, places[0].shape[-1], dtype=places[0].dtype, device=places[0].device)
        for e, out in enumerate(places):
            b, t, j = torch.nonzero((top_e == e) & kept, as_tuple=True)
            if b.numel():
                y = y.index_put((b, t), out[b, place[b, t, j]] * gates[b, t, j, None].to(y.dtype), accumulate=True)
        return y

    def _relative_position_bias(self, n, ids):
        """T5's bias [B, H, T, T]: the table read at each offset's bucket,
        bucketed as HF's T5Attention._relative_position_bucket does."""
        a = n.a
        B, T = ids.shape[0], ids.shape[1]
        buckets, max_distance = int(a["buckets"]), int(a["max_distance"])
        pos = torch.arange(T, dtype=torch.long, device=ids.device)
        rel = pos[None, :] - pos[:, None]  # key - query
        bucket = torch.zeros_like(rel)
        if a["bidirectional"]:
            buckets //= 2
            bucket += (rel > 0).to(torch.long) * buckets
            rel = rel.abs()
        else:
            rel = -torch.min(rel, torch.zeros_like(rel))
        exact = buckets // 2
        large = exact + (torch.log(rel.float() / exact) / math.log(max_distance / exact)
                         * (buckets - exact)).to(torch.long)
        large = torch.min(large, torch.full_like(large, buckets - 1))
        bucket += torch.where(rel < exact, rel, large)
        table = self._p(n, "weight")  # [buckets, H]
        return table[bucket].permute(2, 0, 1).unsqueeze(0).expand(B, -1, -1, -1)

    def _attention(self, n, xs):
        a = n.a
        x = xs[0]
        mem = xs[1] if a["cross"] else x  # k and v read the memory under cross attention
        pbias = xs[-1] if a["position_bias"] else None  # [B, H, T, Tk], added to the scaled scores
        B, T, D = x.shape
        Tk = mem.shape[1]
        H, KV, hd = int(a["heads"]), int(a["kv_heads"]), int(a["head_dim"])
        scale = float(a["scale"]) if a["scale"] is not None else 1.0 / math.sqrt(hd)
        bias, out_bias = bool(a["qkv_bias"]), bool(a["out_bias"])
        p = float(a["dropout"]) if self.training else 0.0
        P = lambda s: self._p(n, s)  # noqa: E731
        q = F.linear(x, P("q.weight"), P("q.bias") if bias else None).view(B, T, H, hd).transpose(1, 2)
        k = F.linear(mem, P("k.weight"), P("k.bias") if bias else None).view(B, Tk, KV, hd).transpose(1, 2)
        v = F.linear(mem, P("v.weight"), P("v.bias") if bias else None).view(B, Tk, KV, hd).transpose(1, 2)
        if a["rope"]:
            cos, sin = self._rope(T, int(a["rotary_dim"]), float(a["rope_theta"]), x.device, q.dtype)
            q = self._apply_rope(q, cos, sin)
            k = self._apply_rope(k, cos, sin)
        if KV != H:  # query head h reads kv head h // (H / KV)
            k = k.repeat_interleave(H // KV, dim=1)
            v = v.repeat_interleave(H // KV, dim=1)
        causal = bool(a["causal"])
        if self.use_sdpa and pbias is None and a["scale"] is None:
            ctx = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal)
        else:
            s = torch.matmul(q, k.transpose(-2, -1)) * scale
            if pbias is not None:
                s = s + pbias
            if causal:
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
                s = s.masked_fill(mask, float("-inf"))
            probs = torch.softmax(s, dim=-1)
            if p > 0:
                probs = F.dropout(probs, p, True)
            ctx = torch.matmul(probs, v)
        ctx = ctx.transpose(1, 2).reshape(B, T, H * hd)
        return F.linear(ctx, P("o.weight"), P("o.bias") if out_bias else None)


def _checkpoint(fn, *args):
    from torch.utils.checkpoint import checkpoint
    try:
        return checkpoint(fn, *args, use_reentrant=False)
    except TypeError:  # a PyTorch without use_reentrant
        return checkpoint(fn, *args)


# ---- helpers -----------------------------------------------------------------------


def build(ir, checkpointing="none", use_sdpa=None, device=None):
    """The IR (a dict as json.load gives it) as an IRModule, its parameters
    created on `device` (default: the CPU; "meta" to count without memory)."""
    return IRModule(ir, checkpointing=checkpointing, use_sdpa=use_sdpa, device=device)


def param_count(module):
    return sum(p.numel() for p in module.parameters())


def param_names(module):
    return module.param_names()


def flat_parameters(module):
    return torch.cat([p.detach().reshape(-1).float().cpu() for p in module.parameters()])


def flat_grads(module):
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).float().cpu()
                      for p in module.parameters()])


def _read_f32(path):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if len(data) % 4:
        raise ValueError(f"{path}: {len(data)} bytes is not a multiple of 4")
    if not data:
        return torch.empty(0)
    if sys.byteorder != "little":  # swap each float's 4 bytes
        data[0::4], data[1::4], data[2::4], data[3::4] = data[3::4], data[2::4], data[1::4], data[0::4]
    return torch.frombuffer(data, dtype=torch.float32).clone()


def load_flat(module, path_or_tensor):
    """Copies a flat float32 (little-endian) vector of every parameter,
    concatenated in Model::params order, into the module's parameters."""
    flat = path_or_tensor if torch.is_tensor(path_or_tensor) else _read_f32(path_or_tensor)
    total = param_count(module)
    if flat.numel() != total:
        raise ValueError(f"{path_or_tensor if not torch.is_tensor(path_or_tensor) else 'tensor'}: "
                         f"{flat.numel()} floats, the model has {total} parameters")
    off = 0
    with torch.no_grad():
        for p in module.parameters():
            k = p.numel()
            p.copy_(flat[off:off + k].view_as(p).to(device=p.device, dtype=p.dtype))
            off += k
    return module


def save_flat(module, path):
    flat = flat_parameters(module)
    with open(path, "wb") as f:
        f.write(flat.numpy().astype("<f4").tobytes())


def tokens_per_sample_of(input_specs):
    """As loader.cpp's tokens_per_sample: the length of the first [T] i32 input."""
    for name, (shape, dtype) in input_specs.items():
        if dtype == "i32" and len(shape) == 1:
            return shape[0]
    return 0


def tokens_per_sample(ir):
    return tokens_per_sample_of({k: (tuple(v["shape"]), v["dtype"]) for k, v in ir["inputs"].items()})


def with_seq_len(ir, seq_len):
    """The IR with every [T] i32 input of length seq_len (loader.cpp's with_seq_len)."""
    import copy
    if tokens_per_sample(ir) == 0:
        raise ValueError(f"{ir.get('name')}: the model has no token inputs ([T] i32), so --seq-len does not apply")
    out = copy.deepcopy(ir)
    for spec in out["inputs"].values():
        if spec["dtype"] == "i32" and len(spec["shape"]) == 1:
            spec["shape"][0] = int(seq_len)
    return out


def _node_flops(n):
    """(forward, backward) FLOPs per sample of one node: planner/src/ops_decl.cpp's
    declaration (multiply-adds count 2; attention counts the full T x T scores)."""
    a, op = n.a, n.op
    x = n.in_shapes[0]
    out = float(_numel(n.shape))
    rows = float(_numel(x[:-1])) if x else 1.0
    if op == "embedding":
        return 0.0, out
    if op == "pos_embedding":
        return out, out
    if op == "linear":
        f = 2.0 * rows * x[-1] * int(a["out"])
        return f, 2 * f
    if op == "conv2d":
        window = _window_1d(a, "kernel") if len(x) == 2 else _pair(a["kernel"])[0] * _pair(a["kernel"])[1]
        f = 2.0 * out * (x[0] // int(a["groups"])) * window
        return f, 2 * f
    if op in ("lstm", "gru", "rnn"):  # as ops_decl.cpp: the two GEMMs, and the gates' arithmetic, each direction
        T, H, dirs = x[0], int(a["hidden"]), 2 if a["bidirectional"] else 1
        G = {"lstm": 4, "gru": 3, "rnn": 1}[op] * H
        f = 2.0 * T * G * (x[1] + H) + 12.0 * T * H
        return dirs * f, dirs * (2.0 * (2.0 * T * G * (x[1] + H)) + 16.0 * T * H)
    if op == "conv_transpose2d":  # 2 (out/groups) k per input element
        window = _window_1d(a, "kernel") if len(x) == 2 else _pair(a["kernel"])[0] * _pair(a["kernel"])[1]
        f = 2.0 * _numel(x) * (int(a["out"]) // int(a["groups"])) * window
        return f, 2 * f
    if op in ("batchnorm", "layernorm", "groupnorm"):
        return 8.0 * out, 12.0 * out
    if op == "rmsnorm":
        return 6.0 * out, 10.0 * out
    if op in ("gelu", "silu"):
        return 8.0 * out, 12.0 * out
    if op in ("relu", "tanh", "sigmoid"):
        return 4.0 * out, 2.0 * out
    if op == "clip":
        return 2.0 * out, 2.0 * out
    if op in ("hardsigmoid", "hardswish"):
        return 4.0 * out, 4.0 * out
    if op == "leaky_relu":
        return 2.0 * out, 2.0 * out
    if op in ("elu", "softplus", "mish"):
        return 4.0 * out, 4.0 * out
    if op == "add":
        return out, 0.0
    if op == "mul":
        return out, 2.0 * out
    if op == "matmul":
        f = 2.0 * out * x[-1]
        return f, 2 * f
    if op == "softmax":
        return 5.0 * out, 4.0 * out
    if op in ("causal_mask", "alibi"):
        return out, 0.0
    if op == "rope":
        return 3.0 * out, 3.0 * out
    if op == "scale":
        return out, 2.0 * out
    if op == "prelu":
        return 2.0 * out, 4.0 * out
    if op == "shift":
        return out, out
    if op == "affine":
        return out, out
    if op == "pow":
        return 2.0 * out, 3.0 * out
    if op in ("sqrt", "reciprocal"):
        return out, 2.0 * out
    if op in ("erf", "acos"):
        return out, 3.0 * out
    if op in ("reduce_mean", "reduce_sum"):
        return float(_numel(x)), float(_numel(x))
    if op == "reduce_l2":
        return 2.0 * _numel(x), 3.0 * _numel(x)
    if op in ("concat", "transpose", "slice"):
        return out, out
    if op == "pad":
        return out, float(_numel(x))
    if op == "attention":
        T, D = x
        Tk, Dm = n.in_shapes[1] if a["cross"] else x
        H, KV, hd = int(a["heads"]), int(a["kv_heads"]), int(a["head_dim"])
        proj = 2.0 * T * D * H * hd + 2.0 * Tk * Dm * 2 * KV * hd + 2.0 * T * H * hd * D
        f = proj + 2 * (2.0 * H * T * Tk * hd)
        return f, 2 * f
    if op == "relative_position_bias":
        return 0.0, out
    if op == "moe_router":
        f = 2.0 * x[0] * x[1] * int(a["experts"])
        return f, 2 * f
    if op == "moe_expert":  # the SwiGLU MLP on the T k / E rows an expert gets on average
        T, E = n.in_shapes[1]
        f = T * int(a["top_k"]) / E * (6.0 * x[1] * int(a["hidden"]) + int(a["hidden"]))
        return f, 2 * f
    if op == "moe_combine":
        f = float(n.in_shapes[0][0] * int(a["top_k"]) * n.in_shapes[1][1])
        return f, 2 * f
    if op in ("maxpool2d", "avgpool2d"):
        window = _window_1d(a, "kernel") if len(x) == 2 else _pair(a["kernel"])[0] * _pair(a["kernel"])[1]
        return out * window, (out if op == "maxpool2d" else out * window)
    if op == "global_avgpool":
        return float(_numel(x)), float(_numel(x))
    if op == "upsample":  # linear blends 2 elements along a length (3 flops), 4 over [H, W] (9)
        if n.a["mode"] == "linear":
            per = 3.0 if len(x) == 2 else 9.0
            return per * out, per * out
        return 0.0, float(out)
    if op == "dropout":
        return 2.0 * out, out
    if op == "drop_path":
        return float(out), float(out)
    if op == "cross_entropy":
        if n.a.get("fused"):
            return 4.0 * _numel(x), 3.0 * _numel(x)
        return 5.0 * _numel(x), 2.0 * _numel(x)
    return 0.0, 0.0  # cls_token, flatten, tokens, select


def model_flops_per_sample(module):
    """Forward + backward FLOPs of one sample, as dlplan's planner counts them
    (its simulator's model_flops, recomputation excluded, divided by the micro-batch)."""
    return sum(sum(_node_flops(n)) for n in module._nodes)


def random_inputs(module, batch, device="cpu", generator=None):
    """A random batch for the module's inputs: ids below the vocabulary of the
    embedding that reads them, labels / targets below the loss's classes, f32
    inputs normal(0, 1). Returns {name: tensor} (i32 inputs as int64), made on
    `device` (or on the generator's device and then moved)."""
    classes = 2
    vocab = {}
    targets = set()
    for n in module._nodes:
        if n.op == "cross_entropy":
            classes = n.in_shapes[0][-1]
            targets.add(n.inputs[1])
        if n.op == "embedding" and n.inputs[0] in module.input_specs:
            vocab[n.inputs[0]] = int(n.a["num"])
    where = generator.device if generator is not None else device
    out = {}
    for name, (shape, dtype) in module.input_specs.items():
        full = (batch,) + tuple(shape)
        if dtype == "f32":
            t = torch.randn(full, generator=generator, device=where)
        else:
            hi = vocab.get(name) or (classes if name in targets else max([classes] + list(vocab.values())))
            t = torch.randint(0, hi, full, generator=generator, device=where)
        out[name] = t.to(device)
    return out
