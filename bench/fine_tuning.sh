#!/usr/bin/env bash
# Frozen parameters and LoRA (docs/fine-tuning.md), measured against
# predicted on this machine's CPU engine: each plan (`dlplan plan --gpu cpu
# --gpus R --strategy S --freeze ... | --lora ...`) is trained for 3 steps
# under `mpirun -np R`, and one row gives rank 0's gradients, optimizer
# state, activations and peak, measured / predicted (from `dlplan train`'s
# report at the peak).
#
#   bench/fine_tuning.sh        (after building: cmake --build build --target dlplan)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dlplan="${DLPLAN:-$here/build/bin/dlplan}"
[[ -x "$dlplan" ]] || { echo "fine_tuning: no dlplan at $dlplan" >&2; exit 1; }
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work="$(mktemp -d /tmp/dlplan_fine_tuning.XXXXXX)"
trap 'rm -rf "$work"' EXIT

echo "| model | fine-tuning | strategy | ranks | grads m / p | optimizer m / p | activations m / p | peak m / p |"
echo "|---|---|---|---|---|---|---|---|"
for model in tiny-gpt tiny-vit; do
  freeze="wte,wpe,h.0.*"
  [[ $model == tiny-vit ]] && freeze="conv_proj,class_token,encoder.pos_embedding"
  for ft in "--freeze $freeze" "--lora 4 --lora-targets q,v,o"; do
    for strategy in ddp zero2 zero3; do
      for ranks in 2 4; do
        # shellcheck disable=SC2086  # $ft is two or four flags
        "$dlplan" --model "$model" --gpus "$ranks" --gpu cpu $ft --strategy "$strategy" --micro-batch 4 \
          --out "$work/plan.json" > /dev/null 2> "$work/plan.err"
        report="$(mpirun -np "$ranks" --oversubscribe "$dlplan" train --plan "$work/plan.json" --steps 3 2>&1)"
        cell() { awk -v c="$1" '$1 == c { print $2 " " $3 " / " $4 " " $5 }' <<< "$report"; }
        echo "| $model | $ft | $strategy | $ranks | $(cell grads) | $(cell optimizer) | $(cell activations) | $(cell peak) |"
      done
    done
  done
done
