#!/usr/bin/env bash
# Validation of the op curves (docs/time.md, "Curves: ops calibrate did not
# time"): README's calibration, without --model, predicts models it never
# timed. For each rank count:
#   1. `mpirun -np R dlplan calibrate --device cpu` (no --model) measures this
#      machine and fits the curves, made anew at every run;
#   2. for the zoo's small models, gpt2 at --seq-len 128 and six files
#      torch.onnx.export wrote (tests/fixtures/exports: Swin, ConvNeXt,
#      MobileNetV2, ResNet-18, ViT-B/16, a tiny Swin), `dlplan plan` predicts
#      the DDP step from the catalog's `cpu` row and from the profile, and
#      `dlplan train` measures it (the median step after the first);
#   3. a table of both predictions against the measured step, with the median
#      and worst |error| of each, and how many rows fall in the band the
#      profile states (time_uncertainty: its sweep models held back in turn).
# Timing, not a test. About 6 minutes a rank count on two cores.
#
#   bench/curve_validation.sh [RANKS ...]   (default: 1 2; after building dlplan)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dlplan="${DLPLAN:-$here/build/bin/dlplan}"
[[ -x "$dlplan" ]] || { echo "curve_validation: no dlplan at $dlplan" >&2; exit 1; }
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work="$(mktemp -d /tmp/dlplan_curve_validation.XXXXXX)"
trap 'rm -rf "$work"' EXIT
exports="$here/tests/fixtures/exports"
ranks_list=("$@")
[[ ${#ranks_list[@]} -gt 0 ]] || ranks_list=(1 2)
# model | micro-batch | steps | extra planning flags
rows=(
  "tiny-mlp|8|200|"
  "tiny-cnn|8|200|"
  "tiny-vit|8|200|"
  "tiny-gpt|8|100|"
  "gpt2|2|4|--seq-len 128"
  "$exports/weights/tiny-swin-opset17.onnx|2|100|"
  "$exports/resnet18-opset17.onnx|2|6|"
  "$exports/mobilenet_v2-opset17.onnx|2|6|"
  "$exports/convnext_tiny-opset17.onnx|2|4|"
  "$exports/swin_t-opset17.onnx|2|4|"
  "$exports/vit_b_16-opset17.onnx|2|4|"
)
printf '%-24s %5s %11s %11s %11s %9s %9s %6s\n' model ranks catalog curves measured "cat err" "curve err" band
for ranks in "${ranks_list[@]}"; do
  profile="$work/host.$ranks.json"
  mpirun -np "$ranks" --oversubscribe "$dlplan" calibrate --device cpu --out "$profile" > "$work/calibrate.$ranks.txt"
  for row in "${rows[@]}"; do
    IFS='|' read -r model mb steps extra <<<"$row"
    name="$(basename "$model" .onnx)"
    base="$work/$name.$ranks"
    # shellcheck disable=SC2086
    "$dlplan" plan --model "$model" --gpu cpu --gpus "$ranks" --micro-batch "$mb" $extra --strategy ddp --syncbn off \
      --format json > "$base.catalog.json" 2>/dev/null
    # shellcheck disable=SC2086
    "$dlplan" plan --model "$model" --cluster "$profile" --gpus "$ranks" --micro-batch "$mb" $extra --strategy ddp \
      --syncbn off --format json --out "$base.plan.json" > "$base.curves.json" 2>/dev/null
    mpirun -np "$ranks" --oversubscribe "$dlplan" train --plan "$base.plan.json" --steps "$steps" --log-every "$steps" \
      --report "$base.report.json" --progress json > /dev/null
    python3 - "$base" "$name" "$ranks" "$work/errors.txt" <<'PY'
import json, sys
base, name, ranks, errors = sys.argv[1:]
def step(path):
    return next(s for s in json.load(open(path))["strategies"] if s["strategy"] == "ddp")["step_seconds"]
curves_doc = json.load(open(f"{base}.curves.json"))
band = curves_doc["recommendation"]["time_uncertainty"]["relative"]
c, p = step(f"{base}.catalog.json"), step(f"{base}.curves.json")
m = json.load(open(f"{base}.report.json"))["measured"]["step_seconds"]
ec, ep = c / m - 1, p / m - 1
print(f"{name:<24} {ranks:>5} {c*1e3:9.2f}ms {p*1e3:9.2f}ms {m*1e3:9.2f}ms {ec*100:+8.1f}% {ep*100:+8.1f}% {band*100:5.0f}%")
open(errors, "a").write(f"{abs(ec)} {abs(ep)} {band}\n")
PY
  done
done
python3 - "$work/errors.txt" <<'PY'
import statistics, sys
rows = [tuple(map(float, line.split())) for line in open(sys.argv[1])]
for label, k in (("catalog cpu row", 0), ("calibrated curves", 1)):
    e = [r[k] for r in rows]
    print(f"{label:<18} |error| over {len(e)} rows: median {statistics.median(e)*100:.1f} %, worst {max(e)*100:.1f} %")
print(f"curves within the profile's stated band: {sum(r[1] <= r[2] for r in rows)} of {len(rows)} rows")
PY
