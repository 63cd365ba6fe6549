#!/usr/bin/env python3
"""`dlplan export --checkpoint D --to safetensors` read by the `safetensors`
package (PyPI), against two independent references:

  * the shapes: PyTorch modules built from the plan's IR by scripts/ir_torch.py
    (its own declaration of every parameter, in PyTorch's layouts): every
    parameter is in the file at that shape, and nothing else but the
    BatchNorm running statistics;
  * the values: the checkpoint's shard files consolidated here, from the
    manifest's ranges with numpy, independently of dlplan's reader.

Each model trains 3 steps (2 ranks ZeRO-3 under mpiexec when one is given,
else one process), saves, exports; safetensors loads the file with its numpy
and its torch back ends, and `torch.nn.Module.load_state_dict(strict=True)`
takes it into the ir_torch module.

Exit status: 0 pass, 1 a mismatch or an error, 77 (ctest's skip) when this
Python lacks safetensors (scripts/setup installs it into build/pydeps).

    PYTHONPATH=build/pydeps /usr/bin/python3 tests/tools/check_safetensors.py \\
        --dlplan build/bin/dlplan --source-dir . --work /tmp/st [--mpiexec mpiexec]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

try:
    import numpy as np
    import safetensors
    import safetensors.numpy
except ImportError as e:
    print(f"SKIP: {sys.executable} cannot import safetensors ({e}); scripts/setup installs it from PyPI into "
          f"<build>/pydeps and says why when it cannot (see <build>/pip.log)")
    sys.exit(77)

try:
    import torch
    import safetensors.torch
except ImportError:
    torch = None

MODELS = ["tiny-gpt", "tiny-cnn", "tiny-vit"]


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


def consolidate(ckpt_dir):
    """{name: array} from the latest checkpoint's manifest and shard files."""
    with open(os.path.join(ckpt_dir, "latest")) as f:
        folder = os.path.join(ckpt_dir, f.read().strip())
    with open(os.path.join(folder, "manifest.json")) as f:
        m = json.load(f)
    shards = {}
    for s in m["shards"]:
        shards[s["rank"]] = np.fromfile(os.path.join(folder, s["file"]), dtype="<f4")
    nstates = len(m["states"])
    out = {}
    for u in m["units"]:
        flat = np.full(u["size"], np.nan, dtype=np.float32)
        for s in m["shards"]:
            r = next(r for r in s["ranges"] if r["unit"] == u["unit"])
            b, e, at = r["begin"], r["end"], r["offset"] // 4
            flat[b:e] = shards[s["rank"]][at:at + (e - b)]  # state 0: the fp32 parameters
            assert at + nstates * (e - b) <= shards[s["rank"]].size
        for p in u["params"]:
            out[p["name"]] = flat[p["offset"]:p["offset"] + p["numel"]].reshape(p["shape"])
    s0 = m["shards"][0]
    at = s0["buffers"]["offset"] // 4
    for b in m["buffers"]:
        out[b["name"]] = shards[0][at:at + b["numel"]].reshape(b["shape"])
        at += b["numel"]
    return out, m


def check_model(model, args, work):
    d = os.path.join(work, model)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    plan = os.path.join(d, "plan.json")
    ranks = 2 if args.mpiexec else 1
    run([args.dlplan, "plan", "--model", model, "--gpu", "cpu", "--gpus", str(ranks), "--micro-batch", "2",
         "--strategy", "zero3" if ranks > 1 else "ddp", "--out", plan])
    ckpt = os.path.join(d, "ckpt")
    train = [args.dlplan, "train", "--plan", plan, "--steps", "3", "--checkpoint-dir", ckpt, "--progress", "json"]
    if args.mpiexec:
        train = [args.mpiexec, "-n", "2", "--oversubscribe"] + train
    run(train)
    weights = os.path.join(d, "model.safetensors")
    run([args.dlplan, "export", "--checkpoint", ckpt, "--to", "safetensors", "--out", weights])

    loaded = safetensors.numpy.load_file(weights)
    want, manifest = consolidate(ckpt)
    errors = []
    if set(loaded) != set(want):
        errors.append(f"names differ: only in the file {sorted(set(loaded) - set(want))}, "
                      f"only in the checkpoint {sorted(set(want) - set(loaded))}")
    for name, v in want.items():
        got = loaded.get(name)
        if got is None:
            continue
        if got.dtype != np.float32 or tuple(got.shape) != tuple(v.shape):
            errors.append(f"{name}: {got.dtype} {tuple(got.shape)}, the checkpoint {tuple(v.shape)}")
        elif not np.array_equal(got, v):
            errors.append(f"{name}: values differ from the shards (max |diff| {np.max(np.abs(got - v))})")
    with safetensors.safe_open(weights, framework="numpy") as f:
        meta = f.metadata() or {}
    if meta.get("step") != str(manifest["step"]):
        errors.append(f"metadata step {meta.get('step')!r}, the checkpoint is at {manifest['step']}")

    if torch is not None:
        sys.path.insert(0, os.path.join(args.source_dir, "scripts"))
        import ir_torch
        with open(plan) as f:
            ir = json.load(f)["model"]["ir"]
        module = ir_torch.build(ir)
        declared = dict(zip(module._names, module.parameters()))
        tensors = safetensors.torch.load_file(weights)
        for name, p in declared.items():
            t = tensors.get(name)
            if t is None:
                errors.append(f"{name}: declared by ir_torch, missing from the file")
                continue
            shape = tuple(t.shape)
            # A class token is [1, 1, D] in PyTorch's modules (torchvision,
            # Hugging Face) and in the file; ir_torch keeps it as [D].
            if name.endswith("token.weight") and shape == (1, 1) + tuple(p.shape):
                shape = tuple(p.shape)
            if shape != tuple(p.shape):
                errors.append(f"{name}: {tuple(t.shape)} in the file, ir_torch declares {tuple(p.shape)}")
        extra = set(tensors) - set(declared)
        buffers = {n for n in extra if n.endswith(".running_mean") or n.endswith(".running_var")}
        if extra - buffers:
            errors.append(f"tensors ir_torch does not declare: {sorted(extra - buffers)}")
        with torch.no_grad():
            for name, p in declared.items():
                if name in tensors:
                    p.copy_(tensors[name].reshape(p.shape))
            back = dict(zip(module._names, module.parameters()))
            for name in declared:
                if name in tensors and not torch.equal(back[name].reshape(-1), tensors[name].reshape(-1)):
                    errors.append(f"{name}: not what was loaded")
    print(f"{model}: {len(loaded)} tensors, {sum(v.size for v in loaded.values())} values, step {manifest['step']}, "
          f"{manifest['world_size']} shard(s): {'ok' if not errors else 'FAILED'}")
    for e in errors:
        print(f"  {e}")
    return not errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dlplan", required=True)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--mpiexec", default="")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    print(f"safetensors {safetensors.__version__}, torch {torch.__version__ if torch else 'absent (shapes not checked)'}")
    ok = True
    for model in MODELS:
        try:
            ok &= check_model(model, args, args.work)
        except Exception as e:  # one clear line per failure
            print(f"{model}: FAILED: {e}")
            ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
