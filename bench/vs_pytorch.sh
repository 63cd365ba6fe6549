#!/usr/bin/env bash
# dlplan's CPU engine beside PyTorch eager on the same models, in one run
# (issue "The CPU engine ahead of PyTorch"): `dlplan train` and
# scripts/torch_compare.py (the IR built as a PyTorch module by
# scripts/ir_torch.py: the same parameters, AdamW with dlplan's defaults,
# clipping at 1.0, fp32, synthetic / random batches), each model at one rank
# with every core, and at 2 ranks with one core each (dlplan: mpirun;
# PyTorch: DistributedDataParallel over gloo). Prints tokens/s (samples/s for
# image models) of all ranks, the ratio dlplan / PyTorch, and each side's
# GFLOP/s from the planner's model FLOPs (forward + backward). Attention is the
# math form on both sides (PyTorch 1.13 has no scaled_dot_product_attention).
#
#   bench/vs_pytorch.sh                       (after building dlplan; /usr/bin/python3 with torch)
#   DLPLAN=path/to/dlplan PYTHON=python bench/vs_pytorch.sh [MODEL...]
#
# MODEL: tiny-gpt, gpt-4l, gpt2, tiny-vit, tiny-cnn, resnet18, mobilenet_v2
# (torchvision's, the export in tests/fixtures/exports) (default: all).
# Each case runs twice, the engines taking turns, and each side's faster
# round is printed. The whole table takes about 6 minutes on 2 cores.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dlplan="${DLPLAN:-$here/build/bin/dlplan}"
python="${PYTHON:-/usr/bin/python3}"
[[ -x "$dlplan" ]] || { echo "vs_pytorch: no dlplan at $dlplan (cmake --build build --target dlplan)" >&2; exit 1; }
"$python" -c "import torch" 2>/dev/null || { echo "vs_pytorch: $python has no torch (Debian: apt-get install python3-torch)" >&2; exit 1; }
cores="$(nproc)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work="$(mktemp -d /tmp/dlplan_vs_pytorch.XXXXXX)"
trap 'rm -rf "$work"' EXIT

# The issue's 4-layer GPT: hidden 256, 4 heads, vocab 4096, T = 256 (4.27 M parameters).
"$dlplan" model gpt --name gpt-4l --layers 4 --hidden 256 --heads 4 --vocab 4096 --context 256 \
  --out "$work/gpt-4l.json" >/dev/null 2>&1

# name  model file  micro-batch  seq-len (0: the model's)  steps
cases=(
  "tiny-gpt $here/models/tiny-gpt.json 8 0 10"
  "gpt-4l $work/gpt-4l.json 8 0 5"
  "gpt2 $here/models/gpt2.json 8 128 3"
  "tiny-vit $here/models/tiny-vit.json 8 0 10"
  "tiny-cnn $here/models/tiny-cnn.json 8 0 10"
  "resnet18 $here/models/resnet18.json 8 0 5"
  "mobilenet_v2 $here/tests/fixtures/exports/mobilenet_v2-opset17.onnx 8 0 5"
)
wanted=("$@")

echo "dlplan vs PyTorch eager on $(hostname): $cores cores; fp32, AdamW, math attention; $("$python" -c 'import torch; print("torch", torch.__version__)')"
printf '%-12s %4s %5s %-9s %14s %14s %7s %12s %12s\n' model mb T "ranks" "dlplan /s" "pytorch /s" ratio "dlplan GF/s" "torch GF/s"
for c in "${cases[@]}"; do
  read -r name file mb seq steps <<<"$c"
  if ((${#wanted[@]})) && [[ ! " ${wanted[*]} " =~ " $name " ]]; then continue; fi
  for layout in "1 $cores" "2 1"; do
    read -r ranks threads <<<"$layout"
    plan="$work/$name-$ranks.plan.json" report="$work/$name-$ranks.report.json"
    seq_flag=()
    ((seq > 0)) && seq_flag=(--seq-len "$seq")
    "$dlplan" plan --model "$file" --gpu cpu --gpus "$ranks" --strategy ddp --precision fp32 --micro-batch "$mb" \
      "${seq_flag[@]}" --out "$plan" >"$work/plan.log" 2>&1 || { cat "$work/plan.log" >&2; exit 1; }
    # Two rounds, the engines taking turns; each side keeps its faster round
    # (on a shared machine noise only ever adds time, and taking turns gives
    # both sides the same chance of a quiet round).
    for round in 1 2; do
      cmd=("$dlplan" train --plan "$plan" --steps "$steps" --report "$report.$round")
      ((ranks > 1)) && cmd=(mpirun -n "$ranks" --oversubscribe -x OPENBLAS_NUM_THREADS "${cmd[@]}")
      OPENBLAS_NUM_THREADS="$threads" OMP_NUM_THREADS="$threads" "${cmd[@]}" >"$work/train.log" 2>&1 ||
        { cat "$work/train.log" >&2; exit 1; }
      # Debian's PyTorch links the same OpenBLAS: it runs the kernel set
      # dlplan ran (dlplan sets OPENBLAS_CORETYPE where OpenBLAS took the
      # CPU for a generic one; docs/cpu-engine.md, "OpenBLAS's kernels").
      core="$(sed -n 's/^GEMMs on OpenBLAS \([A-Za-z0-9_]*\) kernels.*/\1/p' "$work/train.log" | head -n 1)"
      torch_env=(OMP_NUM_THREADS="$threads")
      [[ -n "$core" && -z "${OPENBLAS_CORETYPE:-}" ]] && torch_env+=(OPENBLAS_CORETYPE="$core")
      echo "$core" >"$work/blas_core"
      # An ONNX export reaches PyTorch as the IR dlplan imported (the plan's).
      torch_model=(--model "$file")
      [[ "$file" == *.onnx ]] && torch_model=(--plan "$plan")
      env "${torch_env[@]}" "$python" "$here/scripts/torch_compare.py" "${torch_model[@]}" --device cpu \
        --micro-batch "$mb" "${seq_flag[@]}" --steps "$steps" --ranks "$ranks" --threads "$threads" \
        >"$work/torch.json.$round" 2>"$work/torch.log" || { cat "$work/torch.log" >&2; exit 1; }
    done
    "$python" - "$report" "$work/torch.json" "$name" "$mb" "$ranks" "$threads" <<'PY'
import json, sys
report, torch_json, name, mb, ranks, threads = sys.argv[1:]
rounds = [(json.load(open(f"{report}.{k}")), json.loads(open(f"{torch_json}.{k}").read().strip().splitlines()[-1]))
          for k in (1, 2)]
r = min((d for d, _ in rounds), key=lambda d: d["measured"]["step_seconds"])
t = max((t for _, t in rounds), key=lambda t: t["samples_per_second"])
m = r["measured"]
T = t.get("seq_len")
samples_d = int(ranks) * int(mb) / m["step_seconds"]
rate_d = samples_d * T if T else samples_d
rate_t = t["tokens_per_second"] if T else t["samples_per_second"]
flops = t["model_flops_per_sample"]
unit = "tok" if T else "smp"
print(f"{name:<12} {mb:>4} {T or '-':>5} {ranks + 'x' + threads + ' thr':<9} {rate_d:>10.0f} {unit} {rate_t:>10.0f} {unit} "
      f"{rate_d / rate_t:>6.2f}x {samples_d * flops / 1e9:>12.1f} {t['samples_per_second'] * flops / 1e9:>12.1f}")
PY
  done
done
if [[ -s "$work/blas_core" ]]; then echo "GEMMs on both sides: OpenBLAS $(cat "$work/blas_core") kernels"; fi
