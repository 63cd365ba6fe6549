#!/usr/bin/env python3
"""One training step of dlplan's CPU executor against PyTorch, for models of
the IR built by scripts/ir_torch.py.

For each model: tests/tools/dump_step runs one fp32 SGD step (no clipping, no
weight decay) and writes the parameters before and after, the batch and the
loss; PyTorch loads the same parameters, runs forward and backward on the same
batch, and must give the same loss (relative 1e-5) and the same gradient per
parameter (relative L2 < 1e-4; dlplan's gradient is (before - after) / lr).
BatchNorm running statistics after the step are compared too. A control
perturbs one parameter by 1% and must fail the same comparison.

Exit status: 0 all pass, 1 a mismatch or an error, 77 (ctest's skip) when this
Python has no torch.

    /usr/bin/python3 tests/tools/torch_parity.py --dump-step build/tests/tools/dump_step \
        [--source-dir .] [--work /tmp/parity] [--model tiny-gpt ...]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

try:
    import torch
except ImportError as e:  # ctest's SKIP_RETURN_CODE
    print(f"SKIP: {sys.executable} cannot import torch ({e}); install PyTorch for it "
          f"(Debian: apt-get install python3-torch)")
    sys.exit(77)

LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-4
ZERO_FLOOR = 1e-6  # of the model's gradient norm: below it in both, a parameter's gradient is zero

# model file (relative to the source tree), micro-batch, extra dump_step flags
CASES = {
    "tiny-mlp": ("models/tiny-mlp.json", 8, []),
    "tiny-cnn": ("models/tiny-cnn.json", 8, []),
    "tiny-vit": ("models/tiny-vit.json", 4, []),
    "tiny-gpt": ("models/tiny-gpt.json", 4, []),
    "tiny-gpt-flash": ("models/tiny-gpt.json", 4, ["--attention", "flash"]),
    "tiny-llama": ("tests/fixtures/tiny-llama.json", 4, []),
    "tiny-ops": ("tests/fixtures/tiny-ops.json", 6, []),
    # The pieces of torchvision's MobileNetV3, DenseNet and SqueezeNet:
    # hardswish, ReLU6 (clip), a squeeze-and-excitation block (keepdims
    # pooling, 1x1 convs, hardsigmoid, broadcasting mul), ceil_mode max
    # pooling and a three-way concat.
    "tiny-se": ("tests/fixtures/tiny-se.json", 4, []),
    # ConvNeXt's block: transposes to channels-last and back around its
    # LayerNorm, and the learned layer scale.
    "tiny-convnext": ("tests/fixtures/tiny-convnext.json", 4, []),
    # ShuffleNetV2's block: the channel split (slice) and shuffle (reshape,
    # transpose, reshape).
    "tiny-shuffle": ("tests/fixtures/tiny-shuffle.json", 4, []),
    # Hugging Face configs (tests/fixtures/make_hf_fixtures.py): Qwen2's q, k, v
    # biases, Gemma's scaled embedding, 1 + w RMSNorm and GeGLU, Phi's parallel
    # blocks and partial rotary.
    "tiny-qwen2": ("tests/fixtures/hf/tiny-qwen2.json", 2, []),
    "tiny-gemma": ("tests/fixtures/hf/tiny-gemma.json", 2, []),
    "tiny-phi": ("tests/fixtures/hf/tiny-phi.json", 2, []),
    "tiny-phi-flash": ("tests/fixtures/hf/tiny-phi.json", 2, ["--attention", "flash"]),
    # Mixtral's mixture of experts with capacity drops: at the default factor
    # 1.25 (20 places per expert for 64 choices over 4 experts) and at 0.5 (8
    # places: half the choices dropped). Dropless, hf_parity.py compares it
    # with transformers' own MixtralForCausalLM.
    "tiny-mixtral": ("tests/fixtures/hf/tiny-mixtral.json", 2, []),
    "tiny-mixtral-drops": ("tests/fixtures/hf/tiny-mixtral.json", 2, ["--capacity-factor", "0.5"]),
    # T5's pieces: an encoder and a decoder sharing one embedding table, the
    # relative position bias each stack computes once and adds in every
    # block, cross attention from the decoder to the encoder's output, scale 1.
    "tiny-t5": ("models/tiny-t5.json", 2, []),
    "tiny-t5-flash": ("models/tiny-t5.json", 2, ["--attention", "flash"]),
    # tiny-gpt with h.1 applying h.0's parameters (`shares`, ALBERT's shared
    # layers): each shared gradient is the sum of both depths'.
    "tiny-shared": ("tests/fixtures/tiny-shared.json", 4, []),
    # Conv1d over [C, L] (conv2d of a [C, L] input): padded, strided, grouped
    # and dilated (2), and 1x1, with BatchNorm1d, MaxPool1d, AvgPool1d and
    # AdaptiveAvgPool1d(1);
    # four convolutions, so that the CPU engine runs them through oneDNN as
    # 2-D ones of height 1.
    "tiny-conv1d": ("tests/fixtures/tiny-conv1d.json", 4, []),
    # nn.GroupNorm (two groups; a channel a group; one group without the
    # affine parameters), nearest upsampling by 2 and by [1, 3], and
    # nn.LayerNorm([C, H, W]) (dims 3: a weight and a bias of that shape)
    "tiny-groupnorm-upsample": ("tests/fixtures/tiny-groupnorm-upsample.json", 4, []),
    # Bilinear upsampling (F.interpolate(mode="bilinear")) by 2 and by [3, 2]
    # with align_corners=True, then nearest by [1, 2]; and linear upsampling
    # of a [C, L] (mode="linear") by 3 and by 2 with align_corners=True.
    "tiny-upsample-linear": ("tests/fixtures/tiny-upsample-linear.json", 4, []),
    "tiny-upsample-linear-1d": ("tests/fixtures/tiny-upsample-linear-1d.json", 4, []),
    # nn.ConvTranspose2d: strided with padding and output_padding, then a
    # rectangular grouped one without bias; and ConvTranspose1d over [C, L].
    "tiny-conv-transpose": ("tests/fixtures/tiny-conv-transpose.json", 4, []),
    "tiny-conv-transpose-1d": ("tests/fixtures/tiny-conv-transpose-1d.json", 4, []),
    # nn.LSTM: two layers (the first bidirectional, the second without
    # biases) over an embedding, the last step classified; PyTorch's side
    # runs torch.lstm itself.
    "tiny-lstm": ("tests/fixtures/tiny-lstm.json", 4, []),
    # nn.GRU the same way (torch.gru on PyTorch's side).
    "tiny-gru": ("tests/fixtures/tiny-gru.json", 4, []),
    # nn.RNN: a bidirectional tanh layer, then a relu one without biases
    # (torch.rnn_tanh and torch.rnn_relu on PyTorch's side).
    "tiny-rnn": ("tests/fixtures/tiny-rnn.json", 4, []),
}
DEFAULT = ["tiny-mlp", "tiny-cnn", "tiny-vit", "tiny-gpt", "tiny-gpt-flash", "tiny-llama", "tiny-ops", "tiny-se", "tiny-convnext", "tiny-shuffle",
           "tiny-qwen2",
           "tiny-gemma", "tiny-phi", "tiny-phi-flash", "tiny-mixtral", "tiny-mixtral-drops",
           "tiny-t5", "tiny-t5-flash", "tiny-shared", "tiny-conv1d", "tiny-groupnorm-upsample",
           "tiny-upsample-linear", "tiny-upsample-linear-1d", "tiny-conv-transpose", "tiny-conv-transpose-1d",
           "tiny-lstm", "tiny-gru", "tiny-rnn"]


def read_f32(path):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    return torch.frombuffer(data, dtype=torch.float32).clone() if data else torch.empty(0)


def read_inputs(d):
    specs = json.load(open(os.path.join(d, "inputs.json")))
    out = {}
    for s in specs:
        with open(os.path.join(d, s["file"]), "rb") as f:
            data = bytearray(f.read())
        dtype = torch.int32 if s["dtype"] == "i32" else torch.float32
        t = torch.frombuffer(data, dtype=dtype).clone().view(*s["shape"])
        out[s["name"]] = t.long() if dtype == torch.int32 else t
    return out


DEVICE = "cpu"


def torch_step(ir_torch, ir, d, perturb=None):
    """Loss, flat gradient (float64) and running stats of PyTorch on the dump's batch."""
    model = ir_torch.build(ir, device=DEVICE)
    ir_torch.load_flat(model, os.path.join(d, "params_before.f32"))
    if perturb is not None:
        with torch.no_grad():
            list(model.parameters())[perturb].mul_(1.01)
    model.train()
    model.zero_grad()
    loss = model(**{k: v.to(DEVICE) for k, v in read_inputs(d).items()})
    loss.backward()
    grads = ir_torch.flat_grads(model).double()
    bufs = [b.detach().reshape(-1).cpu() for b in model.buffers()]
    bufs = torch.cat(bufs).double() if bufs else torch.empty(0, dtype=torch.float64)
    return model, float(loss), grads, bufs


def compare(model, ir_torch, loss_t, g_t, bufs_t, loss_d, g_d, bufs_d):
    """(ok, loss rel diff, [(name, rel L2 or None for a zero gradient, |g|)], buffer rel diff).

    A parameter whose gradient is zero in exact arithmetic (a key bias, which
    softmax ignores; a bias followed by BatchNorm, which subtracts it again)
    holds only rounding noise in both frameworks: when both gradients are
    below ZERO_FLOOR of the whole model's gradient norm, it counts as zero in
    both (reported as such) instead of a relative error of noise over noise."""
    loss_rel = abs(loss_t - loss_d) / max(abs(loss_d), 1e-30)
    floor = ZERO_FLOOR * float(g_d.norm())
    rows = []
    off = 0
    ok = loss_rel <= LOSS_RTOL
    for name, p in model.named_dlplan_parameters():
        k = p.numel()
        gd, gt = g_d[off:off + k], g_t[off:off + k]
        off += k
        nd, nt = float(gd.norm()), float(gt.norm())
        if nd <= floor and nt <= floor:
            rows.append((name, None, nd))
            continue
        rel = float((gt - gd).norm()) / nd if nd > 0 else math.inf
        rows.append((name, rel, nd))
        ok = ok and rel < GRAD_RTOL
    buf_rel = 0.0
    if bufs_d.numel():
        buf_rel = float((bufs_t - bufs_d).norm() / max(float(bufs_d.norm()), 1e-30))
        ok = ok and buf_rel < GRAD_RTOL
    return ok, loss_rel, rows, buf_rel


def worst_of(rows):
    """The row of the largest relative error (zero-gradient rows count as 0)."""
    n, rel, g = max(rows, key=lambda r: -1.0 if r[1] is None else r[1])
    return n, (0.0 if rel is None else rel), g


def run_case(name, args, ir_torch):
    rel_path, batch, flags = CASES[name]
    model_path = os.path.join(args.source_dir, rel_path)
    d = os.path.join(args.work, name)
    os.makedirs(d, exist_ok=True)
    t0 = time.time()
    if args.dump_step:
        cmd = [args.dump_step, model_path, d, "--micro-batch", str(batch), "--lr", repr(args.lr)] + flags
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        if r.returncode != 0:
            print(f"{name}: dump_step failed (rc {r.returncode}):\n{r.stdout}")
            return False, None
    lr = json.load(open(os.path.join(d, "step.json")))["lr"]
    ir = json.load(open(os.path.join(d, "model.json")))  # the IR as planned: an imported config's too
    before = read_f32(os.path.join(d, "params_before.f32")).double()
    after = read_f32(os.path.join(d, "params_after.f32")).double()
    g_d = (before - after) / lr
    loss_d = float(open(os.path.join(d, "loss.txt")).read())
    bufs_path = os.path.join(d, "buffers_after.f32")
    bufs_d = read_f32(bufs_path).double() if os.path.exists(bufs_path) else torch.empty(0, dtype=torch.float64)

    # The parameter list itself: names, order and sizes as Model::params.
    decl = json.load(open(os.path.join(d, "params.json")))
    model, loss_t, g_t, bufs_t = torch_step(ir_torch, ir, d)
    mine = [(n, p.numel()) for n, p in model.named_dlplan_parameters()]
    theirs = [(p["name"], p["numel"]) for p in decl]
    if mine != theirs:
        print(f"{name}: parameter lists differ\n  torch:  {mine}\n  dlplan: {theirs}")
        return False, None
    ok, loss_rel, rows, buf_rel = compare(model, ir_torch, loss_t, g_t, bufs_t, loss_d, g_d, bufs_d)
    worst = worst_of(rows)
    # ir_torch's FLOP count (torch_compare.py's MFU without a plan) against the planner's.
    flops_d = json.load(open(os.path.join(d, "step.json")))["model_flops_per_sample"]
    flops_t = ir_torch.model_flops_per_sample(model)
    flops_ok = abs(flops_t - flops_d) <= 1e-9 * max(abs(flops_d), 1.0)
    if not flops_ok:
        print(f"{name}: model FLOPs per sample differ: ir_torch {flops_t:.6g}, planner {flops_d:.6g}")
    ok = ok and flops_ok

    # Control: 1% on one parameter (the largest: a weight every path uses) must fail.
    sizes = [p.numel() for p in model.parameters()]
    victim = max(range(len(sizes)), key=lambda i: sizes[i])
    _, loss_p, g_p, bufs_p = torch_step(ir_torch, ir, d, perturb=victim)
    ok_p, loss_rel_p, rows_p, _ = compare(model, ir_torch, loss_p, g_p, bufs_p, loss_d, g_d, bufs_d)
    worst_p = worst_of(rows_p)
    control_ok = not ok_p

    zeros = [r[0] for r in rows if r[1] is None]
    print(f"{name}: {len(rows)} parameters, loss dlplan {loss_d:.7f} torch {loss_t:.7f} (rel {loss_rel:.1e}), "
          f"worst gradient rel L2 {worst[1]:.1e} ({worst[0]})"
          + (f", BN running stats rel {buf_rel:.1e}" if bufs_d.numel() else "")
          + (f", zero gradient in both: {', '.join(zeros)}" if zeros else "")
          + f" -> {'ok' if ok else 'MISMATCH'}; control (x1.01 on {rows[victim][0]}): "
          f"loss rel {loss_rel_p:.1e}, worst grad rel {worst_p[1]:.1e} -> "
          f"{'fails as it must' if control_ok else 'PASSED (the check is blind)'} [{time.time() - t0:.1f} s]")
    if not ok or args.verbose:
        for n, rel, nd in rows:
            if rel is None:
                print(f"    {n:50s} zero in both (|g| {nd:.1e} <= {ZERO_FLOOR:g} of the model's)")
                continue
            flag = "" if rel < GRAD_RTOL else "   <-- over " + str(GRAD_RTOL)
            print(f"    {n:50s} rel L2 {rel:.2e}  |g| {nd:.3e}{flag}")
    return ok and control_ok, (name, loss_rel, worst[1], worst[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump-step", help="the dump_step executable")
    ap.add_argument("--replay", action="store_true",
                    help="compare the dumps already in --work (made by dump_step elsewhere) without running it")
    ap.add_argument("--device", default="cpu", help="where PyTorch computes (cuda: TF32 off)")
    ap.add_argument("--source-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    ap.add_argument("--work", default=None, help="folder for the dumps (default: a temporary one)")
    ap.add_argument("--lr", type=float, default=1000.0,
                    help="SGD step; large so that (before - after) / lr keeps the gradient's digits")
    ap.add_argument("--model", action="append", choices=sorted(CASES), help="a case (repeatable; default: all)")
    ap.add_argument("--verbose", action="store_true", help="print every parameter's error")
    args = ap.parse_args()
    args.source_dir = os.path.abspath(args.source_dir)
    if not args.dump_step and not args.replay:
        ap.error("give --dump-step, or --replay with --work")
    if args.replay and not args.work:
        ap.error("--replay needs --work")
    if args.replay:
        args.dump_step = None
    global DEVICE
    DEVICE = args.device
    if DEVICE.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    sys.path.insert(0, os.path.join(args.source_dir, "scripts"))
    import ir_torch

    torch.manual_seed(0)
    tmp = None
    if args.work is None:
        tmp = tempfile.TemporaryDirectory(prefix="dlplan-parity-")
        args.work = tmp.name
    os.makedirs(args.work, exist_ok=True)
    print(f"torch {torch.__version__} ({'sdpa' if hasattr(torch.nn.functional, 'scaled_dot_product_attention') else 'math attention'}), "
          f"tolerances: loss rel {LOSS_RTOL}, gradient rel L2 {GRAD_RTOL}")
    results, all_ok = [], True
    for name in args.model or DEFAULT:
        try:
            ok, row = run_case(name, args, ir_torch)
        except Exception as e:  # report and go on with the others
            import traceback
            traceback.print_exc()
            print(f"{name}: error: {e}")
            ok, row = False, None
        all_ok = all_ok and ok
        if row:
            results.append(row)
    print("\n| model | loss rel diff | worst gradient rel L2 | parameter |")
    print("|---|---|---|---|")
    for name, lr_, g, p in results:
        print(f"| {name} | {lr_:.1e} | {g:.1e} | {p} |")
    n = len(args.model or DEFAULT)
    print(f"\n{'all ' + str(n) + ' models match' if all_ok else 'MISMATCH: see above'}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
