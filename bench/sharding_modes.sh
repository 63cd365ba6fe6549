#!/usr/bin/env bash
# Hybrid sharding and CPU offload, measured against predicted (a benchmark:
# timing, not a test). On this machine's CPU engine:
#   1. `mpirun -np R dlplan calibrate --device cpu --model M` measures the
#      machine (GEMMs, copies, all-reduce, and the host optimizer step that
#      offload's time is charged at) into a cluster profile;
#   2. each mode is planned on that profile (`dlplan plan --cluster ...
#      --strategy S [--offload O] [--nodes 2]`) and trained (`dlplan train`,
#      median step after the first, one BLAS thread per rank);
#   3. one row per mode: step time predicted / measured, the device peak
#      predicted / measured, and the host bytes (offload) predicted / measured.
# hsdp runs on 4 ranks as 2 "nodes" x 2 (its shard group); the rest on 2.
# With more ranks than cores the times include oversubscription.
#
#   bench/sharding_modes.sh [MODEL]     (after building: cmake --build build --target dlplan)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dlplan="${DLPLAN:-$here/build/bin/dlplan}"
[[ -x "$dlplan" ]] || { echo "sharding_modes: no dlplan at $dlplan" >&2; exit 1; }
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work="$(mktemp -d /tmp/dlplan_sharding_modes.XXXXXX)"
trap 'rm -rf "$work"' EXIT
model="${1:-tiny-gpt}"
mb=8
steps=10

for ranks in 2 4; do
  mpirun -np "$ranks" --oversubscribe "$dlplan" calibrate --device cpu --model "$model" --micro-batch "$mb" \
    --out "$work/cluster$ranks.json" > "$work/calibrate$ranks.txt"
done
# hsdp's profile: the 4 ranks as 2 nodes x 2 (its shard group: one node).
python3 - "$work/cluster4.json" "$work/cluster2x2.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["nodes"], c["gpus_per_node"] = 2, 2
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY

printf '%-26s %5s %10s %10s %7s %11s %11s %11s %11s\n' mode ranks "pred step" "meas step" error \
  "pred peak" "meas peak" "pred host" "meas host"
run() {  # cluster ranks strategy offload
  local cluster=$1 ranks=$2 s=$3 o=$4
  local tag="$s.$o.$ranks"
  if ! "$dlplan" plan --model "$model" --cluster "$work/$cluster.json" --micro-batch "$mb" --strategy "$s" \
       --offload "$o" --syncbn off --out "$work/$tag.plan.json" > /dev/null 2> "$work/$tag.plan.err"; then
    cat "$work/$tag.plan.err" >&2
    exit 1
  fi
  mpirun -np "$ranks" --oversubscribe "$dlplan" train --plan "$work/$tag.plan.json" --steps "$steps" \
    --report "$work/$tag.report.json" --progress json > /dev/null
  python3 - "$work/$tag.report.json" "$s${o/none/}" "$ranks" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
p, m = r["predicted"], r["measured"]
mode = sys.argv[2].replace("optimizer", " --offload optimizer").replace("params", " --offload params")
err = (p["step_seconds"] - m["step_seconds"]) / m["step_seconds"]
mib = lambda b: f"{b / 2**20:8.2f}MiB"
host = lambda d: sum(d.get("host", {}).values())
print(f'{mode:<26} {sys.argv[3]:>5} {p["step_seconds"]*1e3:8.2f}ms {m["step_seconds"]*1e3:8.2f}ms {err*100:+6.1f}% '
      f'{mib(p["memory"]["peak"])} {mib(m["memory"]["peak"])} {mib(host(p))} {mib(host(m))}')
PY
}
for s in zero1 zero2 zero3; do run cluster2 2 "$s" none; run cluster2 2 "$s" optimizer; done
run cluster2 2 zero3 params
run cluster4 4 zero2 none
run cluster4 4 zero3 none
for o in none optimizer; do run cluster2x2 4 hsdp2 "$o"; done
for o in none params; do run cluster2x2 4 hsdp3 "$o"; done
for r in 2 4; do
  echo "calibrated on $r ranks: $(grep -o 'host optimizer [0-9.]* GB/s per node' "$work/cluster$r.json" | head -1)"
done
