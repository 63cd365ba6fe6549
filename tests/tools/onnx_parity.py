#!/usr/bin/env python3
"""One training step of `dlplan train --init model.onnx` against PyTorch on
the same weights (issue 12): the files of
tests/fixtures/exports/weights, written by torch.onnx.export with their
weights (a CNN with batch norm, a concat and squeeze-and-excitation; GPT-2,
BERT, ALBERT and the other families of weighted_models.py in small configs,
dropout 0).

For each file, tests/tools/dump_step imports it, plans one fp32 SGD step on
one CPU rank, sets every parameter from the file's initializers (--init, the
code `dlplan train --init` runs) and writes the parameters before and after,
the batch and the loss. PyTorch builds the model (weighted_models.py), loads
the file's initializers by name, and runs the same step on dlplan's batch:

  - each dlplan parameter is found among PyTorch's by its values: equal, or
    transposed, or a block of rows of the transposed weight (GPT-2's fused
    c_attn holds q, k and v). The weights are random, so the match is unique;
    this checks the importer's mapping independently of it;
  - the loss within 1e-5 relative;
  - every updated parameter within 1e-5 relative (L2, per parameter), at a
    fine-tuning learning rate (0.01);
  - every gradient within 1e-4 relative L2, from a second step at lr 1000
    (the update then dominates the parameter: (before - after) / lr keeps
    about seven digits), as torch_parity.py;
  - BatchNorm running statistics after the step (both start from 0 and 1:
    --init loads parameters, not buffers);
  - a control: 1% on one parameter in PyTorch must fail the same checks.

A file exported with constant folding on (tiny-lstm-folded: the exporter
wrote nn.LSTM's weights reordered to ONNX's gates into initializers of its
own naming) cannot be loaded by name; PyTorch then builds the model from the
file's own seed, and matching by value still checks that the importer put
every gate back in PyTorch's order.

Exit status: 0 all pass, 1 a mismatch or an error, 77 (ctest's skip) when this
Python has no torch, onnx or transformers (the language models need
transformers; scripts/setup installs it into <build>/pydeps).

    PYTHONPATH=build/pydeps /usr/bin/python3 tests/tools/onnx_parity.py \\
        --dump-step build/bin/dump_step --source-dir . --work /tmp/onnx_parity
"""
import argparse
import json
import os
import subprocess
import sys

try:
    import torch
    import torch.nn.functional as F
    import onnx
    from onnx import numpy_helper
    import transformers  # noqa: F401  (GPT-2 and BERT)
except ImportError as e:
    print(f"SKIP: {sys.executable} cannot import torch, onnx and transformers ({e}); Debian: apt-get install "
          f"python3-torch python3-onnx; scripts/setup installs transformers into <build>/pydeps")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_parity import read_f32, read_inputs  # noqa: E402

LOSS_RTOL = 1e-5
PARAM_RTOL = 1e-5
GRAD_RTOL = 1e-4
ZERO_FLOOR = 1e-6  # of the model's gradient norm (see torch_parity.compare)
LR_STEP = 0.01     # the step whose updated parameters are compared
LR_GRAD = 1000.0   # the step whose gradients are compared
BATCH = 2


def dump(args, name, lr, d):
    path = os.path.join(args.source_dir, "tests/fixtures/exports/weights", f"{name}-opset17.onnx")
    cmd = [args.dump_step, path, d, "--micro-batch", str(BATCH), "--lr", repr(lr), "--init", path,
           "--fusion", args.fusion]
    if args.models[name][1] in ("tokens", "seq2seq"):
        cmd += ["--seq-len", str(args.wm.SEQ)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    if r.returncode != 0:
        raise RuntimeError(f"dump_step failed (rc {r.returncode}):\n{r.stdout}")
    before = read_f32(os.path.join(d, "params_before.f32"))
    after = read_f32(os.path.join(d, "params_after.f32"))
    decl = json.load(open(os.path.join(d, "params.json")))
    out, off = [], 0
    for p in decl:
        k = p["numel"]
        out.append((p["name"], before[off:off + k].double(), after[off:off + k].double()))
        off += k
    bufs = os.path.join(d, "buffers_after.f32")
    return (out, float(open(os.path.join(d, "loss.txt")).read()), read_inputs(d),
            read_f32(bufs).double() if os.path.exists(bufs) else None)


def load_onnx_weights(model, path):
    """PyTorch's parameters and buffers from the file's initializers, by name
    (constant folding was off, so they keep their state_dict names; a tied
    weight appears once)."""
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    state = model.state_dict()
    loaded = set()
    with torch.no_grad():
        for k, v in state.items():
            if k in inits:
                v.copy_(torch.from_numpy(inits[k].copy()).reshape(v.shape))
                loaded.add(v.data_ptr())
    # A tied weight (lm_head = the token embedding; BERT's decoder bias) is
    # one tensor in PyTorch, and one initializer in the file.
    # A buffer the graph does not read is not in the file (I-BERT's integer
    # weights and scaling factors, unused in float mode): only parameters
    # must all be there.
    params = {n for n, _ in model.named_parameters()}
    missing = [k for k, v in state.items()
               if k in params and k not in inits and v.data_ptr() not in loaded]
    if missing:
        raise RuntimeError(f"{path}: no initializer for {missing}")
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.reset_running_stats()


def views(t):
    """The layouts a dlplan parameter may give PyTorch's tensor t: (label,
    row width, fn) with fn mapping a tensor of t's shape to a flat tensor of
    rows of that width (PyTorch's own layout, or a 2-D weight transposed)."""
    yield "", (t.shape[-1] if t.dim() == 2 else 1), lambda x: x.reshape(-1)
    if t.dim() == 2:
        yield "^T", t.shape[0], lambda x: x.t().reshape(-1)


def trained(model):
    """The parameters a step trains: a frozen one (RoFormer's position table,
    requires_grad False) gets no gradient, and dlplan reads it as constants."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def match(dl_params, model):
    """dlplan parameter -> (PyTorch name, label, fn): found by values, as all
    of a PyTorch tensor or a block of its rows (fused q, k, v)."""
    torch_params = [(n, p.detach().double()) for n, p in trained(model)]
    found = {}
    for name, before, _ in dl_params:
        hits = []
        k = before.numel()
        for tn, tp in torch_params:
            for label, width, fn in views(tp):
                flat = fn(tp)
                if flat.numel() == k:
                    if torch.equal(flat, before):
                        hits.append((tn, label, fn))
                    continue
                if flat.numel() < k or k % width:
                    continue
                for s in range(0, flat.numel() - k + 1, width):
                    if torch.equal(flat[s:s + k], before):
                        hits.append((tn, f"{label}[{s // width}:{(s + k) // width}]",
                                     lambda x, fn=fn, s=s, k=k: fn(x)[s:s + k]))
                        break
        # A vector's views (w [D, 1] and its transpose) flatten alike: one tensor, one match.
        tensors = dict(torch_params)
        if len(hits) > 1 and len({h[0] for h in hits}) == 1 and \
                all(torch.equal(h[2](tensors[h[0]]), hits[0][2](tensors[h[0]])) for h in hits):
            hits = hits[:1]
        if len(hits) != 1:
            raise RuntimeError(f"dlplan parameter '{name}' matches {len(hits)} PyTorch parameters by value "
                               f"({[h[0] + h[1] for h in hits]}): the importer read it from the wrong initializer")
        found[name] = hits[0]
    return found


def torch_step(model, inputs, kind, lr, perturb=None, pad=None):
    """Loss, gradients and the parameters after one SGD step, on dlplan's
    batch (which must not hold `pad`, the padding id of a model whose import
    assumes no token is padding)."""
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    bufs0 = {n: b.detach().clone() for n, b in model.named_buffers()}
    if perturb is not None:
        with torch.no_grad():
            dict(model.named_parameters())[perturb].mul_(1.01)
    model.train()
    model.zero_grad()
    xs = [inputs["input_ids"], inputs["decoder_input_ids"]] if kind == "seq2seq" else \
        [inputs["input_ids"] if kind == "tokens" else inputs["input"]]
    if pad is not None and any(bool((x == pad).any()) for x in xs):
        raise RuntimeError(f"dlplan's batch holds the padding id {pad}, which the import assumes no token is; "
                           f"give the model another padding id")
    logits = model(*xs)
    target = inputs["targets"] if kind in ("tokens", "seq2seq") else inputs["label"]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    loss.backward()
    grads = {n: p.grad.detach().double().clone() for n, p in trained(model)}
    after = {n: p.detach().double() - lr * grads[n] for n, p in trained(model)}
    # The buffers the model had before the step (Gemma's rotary inv_freq is
    # made by its first forward: not state, and not in dlplan's buffers).
    bufs = [b.detach().reshape(-1).double().clone() for n, b in model.named_buffers()
            if not n.endswith("num_batches_tracked") and n in bufs0]
    with torch.no_grad():  # leave the model as it was
        for n, p in model.named_parameters():
            p.copy_(saved[n])
        for n, b in model.named_buffers():
            if n in bufs0:
                b.copy_(bufs0[n])
    return float(loss), grads, after, (torch.cat(bufs) if bufs else None)


def rel(a, b):
    return float((a - b).norm()) / max(float(b.norm()), 1e-30)


def check(name, mapping, dl_step, dl_grad, t_step, t_grad):
    """(ok, summary) of one model: loss, updated parameters, gradients, buffers."""
    params_s, loss_s, _, bufs_s = dl_step
    params_g, _, _, _ = dl_grad
    loss_t, _, after_t, bufs_t = t_step
    _, grads_t, _, _ = t_grad
    loss_rel = abs(loss_t - loss_s) / max(abs(loss_s), 1e-30)
    worst_p = max(((rel(mapping[n][2](after_t[mapping[n][0]]), after), n) for n, _, after in params_s))
    g_d = {n: (b - a) / LR_GRAD for n, b, a in params_g}
    norm = sum(float(g.norm()) ** 2 for g in g_d.values()) ** 0.5
    worst_g, zeros = (0.0, ""), []
    for n, g in g_d.items():
        gt = mapping[n][2](grads_t[mapping[n][0]])
        if float(g.norm()) <= ZERO_FLOOR * norm and float(gt.norm()) <= ZERO_FLOOR * norm:
            zeros.append(n)
            continue
        worst_g = max(worst_g, (rel(gt, g), n))
    buf_rel = rel(bufs_t, bufs_s) if bufs_s is not None else 0.0
    ok = loss_rel <= LOSS_RTOL and worst_p[0] <= PARAM_RTOL and worst_g[0] < GRAD_RTOL and buf_rel < GRAD_RTOL
    text = (f"loss dlplan {loss_s:.7f} torch {loss_t:.7f} (rel {loss_rel:.1e}); worst updated parameter rel "
            f"{worst_p[0]:.1e} ({worst_p[1]}); worst gradient rel L2 {worst_g[0]:.1e} ({worst_g[1]})"
            + (f"; BN running stats rel {buf_rel:.1e}" if bufs_s is not None else "")
            + (f"; zero gradient in both: {', '.join(zeros)}" if zeros else ""))
    return ok, text


def run(args, name):
    kind = args.models[name][1]
    work = os.path.join(args.work, name)
    dl_step = dump(args, name, LR_STEP, os.path.join(work, "step"))
    dl_grad = dump(args, name, LR_GRAD, os.path.join(work, "grad"))
    if args.wm.folded(name):  # the file's initializers have no PyTorch names: its own seed's values
        model = args.wm.build(name, seed=0)
    else:
        model = args.wm.build(name, seed=1)  # other values than the file's: every one must come from the file
        load_onnx_weights(model, os.path.join(args.source_dir, "tests/fixtures/exports/weights",
                                              f"{name}-opset17.onnx"))
    mapping = match(dl_step[0], model)
    inputs = dl_step[2]
    pad = args.wm.padding_id(name)
    ok, text = check(name, mapping, dl_step, dl_grad, torch_step(model, inputs, kind, LR_STEP, pad=pad),
                     torch_step(model, inputs, kind, LR_GRAD, pad=pad))
    victim = max(model.named_parameters(), key=lambda np_: np_[1].numel())[0]
    ok_c, text_c = check(name, mapping, dl_step, dl_grad, torch_step(model, inputs, kind, LR_STEP, victim, pad),
                         torch_step(model, inputs, kind, LR_GRAD, victim, pad))
    fused = sorted({f"{mapping[n][0]}{mapping[n][1]}" for n, _, _ in dl_step[0] if "[" in mapping[n][1]})
    print(f"{name} (--fusion {args.fusion}): {len(mapping)} parameters matched by value"
          + (f" (row blocks: {', '.join(fused)})" if fused else "") + f"; {text} -> {'ok' if ok else 'MISMATCH'}")
    print(f"    control (x1.01 on {victim}): {text_c} -> {'fails as it must' if not ok_c else 'PASSED (blind)'}")
    return ok and not ok_c


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dump-step", required=True)
    ap.add_argument("--source-dir", default=".")
    ap.add_argument("--work", default="/tmp/onnx_parity")
    ap.add_argument("--model", action="append", help="only these (file stems)")
    ap.add_argument("--fusion", default="engine", choices=["engine", "eager"],
                    help="dlplan's import: eager plans gelu_new op by op (affine, pow, tanh, mul)")
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(args.source_dir, "tests/fixtures/exports/weights"))
    import weighted_models as wm
    args.wm, args.models = wm, wm.MODELS
    torch.set_num_threads(1)
    ok = True
    for name in args.model or list(wm.MODELS):
        try:
            ok = run(args, name) and ok
        except Exception as e:  # one clear line, then the others still run
            print(f"{name}: {e}")
            ok = False
    print("all match" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
