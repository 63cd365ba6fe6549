#!/usr/bin/env bash
# Validation of the step simulator against measured steps (the simulator
# issue's benchmark; timing, not a test):
#   1. `mpirun -np 2 dlplan calibrate --device cpu --model M` measures this
#      machine (GEMM rate at the model's shapes, copy bandwidth, per-op
#      overhead, all-reduce latency and bandwidth) into a cluster profile;
#   2. for tiny-gpt and tiny-cnn under every strategy, `dlplan plan --cluster
#      profile --gpus 2` predicts the step and `dlplan train` measures it
#      (median over the steps after the first, 2 ranks, one BLAS thread each);
#   3. a table of predicted against measured step time. The goal is within 20%.
#
#   bench/sim_validation.sh        (after building: cmake --build build --target dlplan)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dlplan="${DLPLAN:-$here/build/bin/dlplan}"
[[ -x "$dlplan" ]] || { echo "sim_validation: no dlplan at $dlplan" >&2; exit 1; }
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work="$(mktemp -d /tmp/dlplan_sim_validation.XXXXXX)"
trap 'rm -rf "$work"' EXIT
steps=30

printf '%-9s %-6s %11s %11s %8s %10s %10s\n' model strategy "predicted" "measured" "error" "pred comm" "meas wait"
for model in tiny-gpt tiny-cnn; do
  mb=8
  mpirun -np 2 --oversubscribe "$dlplan" calibrate --device cpu --model "$model" --micro-batch "$mb" \
    --out "$work/$model.cluster.json" > "$work/$model.calibrate.txt"
  for s in ddp zero1 zero2 zero3; do
    "$dlplan" plan --model "$model" --cluster "$work/$model.cluster.json" --gpus 2 --micro-batch "$mb" \
      --strategy "$s" --syncbn off --format json --out "$work/$model.$s.plan.json" > "$work/$model.$s.planning.json" 2>/dev/null
    mpirun -np 2 --oversubscribe "$dlplan" train --plan "$work/$model.$s.plan.json" --steps "$steps" \
      --report "$work/$model.$s.report.json" --progress json > /dev/null
    python3 - "$work/$model.$s.report.json" "$model" "$s" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
p, m = r["predicted"], r["measured"]
err = (p["step_seconds"] - m["step_seconds"]) / m["step_seconds"]
print(f'{sys.argv[2]:<9} {sys.argv[3]:<6} {p["step_seconds"]*1e3:9.2f}ms {m["step_seconds"]*1e3:9.2f}ms {err*100:+7.1f}% '
      f'{p["comm"]["exposed_seconds"]*1e3:8.2f}ms {m["comm"]["exposed_seconds"]*1e3:8.2f}ms')
PY
  done
done
echo "calibration profiles: $(grep -h '^fit' "$work"/*.calibrate.txt | head -1)"
