#!/usr/bin/env python3
"""One training step of dlplan's CPU executor against Hugging Face
transformers' own model, for the families imported from config.json: Qwen2,
Gemma, Phi, Mixtral and T5 (tests/fixtures/hf/tiny-*.json, written by
transformers 4.38.2). Mixtral trains dropless: dlplan's experts run with a
capacity factor of experts / top_k (--capacity-factor), which drops no token,
and its router, top-2 choice and renormalised gates must then give
transformers' step; its expert weights share transformers' names
(block_sparse_moe.gate, block_sparse_moe.experts.E.w1/w2/w3).

tests/tools/dump_step runs one fp32 SGD step and writes the parameters before
and after, the batch and the loss; at lr 1000, as torch_parity.py, so that
(before - after) / lr keeps ~7 digits of a gradient even where it is 1e-5 of
a weight near 1 (T5's layer norms: at lr 0.5 their recovered gradients were
off by 2.5e-3 from the rounding of the update alone). transformers builds AutoModelForCausalLM
from the same config.json, loads dlplan's parameters by name (dlplan's nodes
carry HF's module names; the attention's q, k, v, o are q_proj, k_proj,
v_proj and o_proj, or Phi's dense), and runs forward and backward on the same
batch; the loss is cross-entropy of the logits against dlplan's targets
(position by position: dlplan's data source already gives next tokens, so
HF's own shifted loss is not used). Loss within 1e-5 relative and every
parameter's gradient within 1e-4 relative L2, as torch_parity.py. A control
perturbs the embedding by 1% and must fail.

Exit status: 0 all pass, 1 a mismatch, 77 (ctest's skip) without torch or
transformers (scripts/setup installs transformers 4.38.2 into <build>/pydeps).

    PYTHONPATH=build/pydeps /usr/bin/python3 tests/tools/hf_parity.py \\
        --dump-step build/tests/tools/dump_step --source-dir . --work /tmp/hf_parity
"""
import argparse
import json
import os
import subprocess
import sys

try:
    import torch
    import torch.nn.functional as F
    import transformers
except ImportError as e:
    print(f"SKIP: {sys.executable} cannot import torch and transformers ({e}); scripts/setup installs "
          f"transformers==4.38.2 into <build>/pydeps")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_parity import read_f32, read_inputs  # noqa: E402

LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-4
FAMILIES = ["tiny-qwen2", "tiny-gemma", "tiny-phi", "tiny-mixtral", "tiny-t5-gated"]
PROJ = {"q": "q_proj", "k": "k_proj", "v": "v_proj"}


def hf_name(name, model_type):
    """dlplan's parameter name -> the transformers state_dict key."""
    if model_type == "t5":  # T5's nodes carry its module names whole (q, k, v, o; shared; lm_head)
        return name
    parts = name.split(".")
    if "self_attn" in parts:  # layers.i.self_attn.q.weight
        i = parts.index("self_attn")
        proj = parts[i + 1]
        parts[i + 1] = PROJ.get(proj, "dense" if model_type == "phi" else "o_proj")
    return name if name.startswith("lm_head") else "model." + ".".join(parts)


def hf_step(config, names, flat, inputs, perturb=None):
    seq2seq = config.model_type == "t5"
    auto = transformers.AutoModelForSeq2SeqLM if seq2seq else transformers.AutoModelForCausalLM
    model = auto.from_config(config)
    model.train()
    state = model.state_dict()
    params = dict(model.named_parameters())
    off = 0
    with torch.no_grad():
        for p in names:
            key = hf_name(p["name"], config.model_type)
            if key not in state:
                raise KeyError(f"{p['name']}: no '{key}' in transformers' {type(model).__name__}")
            t = params[key]
            t.copy_(flat[off:off + p["numel"]].view_as(t))
            off += p["numel"]
        if perturb:
            params[perturb].mul_(1.01)
    assert off == flat.numel() and off == sum(p.numel() for p in model.parameters())
    if seq2seq:  # the decoder reads dlplan's decoder_input_ids (not HF's labels shifted right)
        logits = model(input_ids=inputs["input_ids"], decoder_input_ids=inputs["decoder_input_ids"]).logits
        targets = inputs["labels"]
    else:
        logits = model(input_ids=inputs["tokens"]).logits
        targets = inputs["targets"]
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    grads = torch.cat([params[hf_name(p["name"], config.model_type)].grad.reshape(-1).double() for p in names])
    return loss.item(), grads


def compare(names, loss_t, g_t, loss_d, g_d):
    loss_rel = abs(loss_t - loss_d) / abs(loss_t)
    worst, off = (None, 0.0), 0
    for p in names:
        a, b = g_d[off:off + p["numel"]], g_t[off:off + p["numel"]]
        rel = (a - b).norm().item() / max(b.norm().item(), 1e-30)
        if rel > worst[1]:
            worst = (p["name"], rel)
        off += p["numel"]
    return loss_rel <= LOSS_RTOL and worst[1] <= GRAD_RTOL, loss_rel, worst


def run(name, args):
    d = os.path.join(args.work, name)
    os.makedirs(d, exist_ok=True)
    cfg_path = os.path.join(args.source_dir, "tests", "fixtures", "hf", name + ".json")
    config = transformers.AutoConfig.from_pretrained(cfg_path)
    dropless = []
    if config.model_type == "mixtral":
        dropless = ["--capacity-factor", str(config.num_local_experts / config.num_experts_per_tok)]
    r = subprocess.run([args.dump_step, cfg_path, d, "--micro-batch", "2", "--lr", "1000", "--fusion", args.fusion]
                       + dropless, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True)
    if r.returncode != 0:
        print(f"{name}: dump_step failed (rc {r.returncode}):\n{r.stdout}")
        return False
    lr = json.load(open(os.path.join(d, "step.json")))["lr"]
    before = read_f32(os.path.join(d, "params_before.f32"))
    g_d = (before.double() - read_f32(os.path.join(d, "params_after.f32")).double()) / lr
    loss_d = float(open(os.path.join(d, "loss.txt")).read())
    names = json.load(open(os.path.join(d, "params.json")))
    inputs = read_inputs(d)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    loss_t, g_t = hf_step(config, names, before, inputs)
    ok, loss_rel, worst = compare(names, loss_t, g_t, loss_d, g_d)
    table = "shared.weight" if config.model_type == "t5" else "model.embed_tokens.weight"
    loss_p, g_p = hf_step(config, names, before, inputs, perturb=table)
    ok_p, loss_rel_p, worst_p = compare(names, loss_p, g_p, loss_d, g_d)
    print(f"{name} ({type(config).__name__}, transformers {transformers.__version__}, --fusion {args.fusion}): "
          f"{len(names)} parameters, "
          f"loss dlplan {loss_d:.7f} transformers {loss_t:.7f} (rel {loss_rel:.1e}), worst gradient rel L2 "
          f"{worst[1]:.1e} ({worst[0]}) -> {'ok' if ok else 'MISMATCH'}; control (embedding x1.01): loss rel "
          f"{loss_rel_p:.1e}, worst {worst_p[1]:.1e} -> {'fails as it must' if not ok_p else 'PASSED (blind)'}")
    return ok and not ok_p


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump-step", required=True)
    ap.add_argument("--source-dir", default=".")
    ap.add_argument("--work", default="/tmp/hf_parity")
    ap.add_argument("--model", action="append", choices=FAMILIES)
    ap.add_argument("--fusion", default="engine", choices=["engine", "eager"],
                    help="dlplan's import: eager builds RMSNorm and gelu_new op by op, as transformers' Python")
    args = ap.parse_args()
    torch.set_num_threads(1)
    results = [run(m, args) for m in args.model or FAMILIES]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
