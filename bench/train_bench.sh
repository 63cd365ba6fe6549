#!/usr/bin/env bash
# Training throughput of the CPU executor on this machine: `dlplan train` on
# tiny-gpt and gpt2 (124M), 1 and 2 MPI ranks, DDP, fp32, synthetic data.
#
#   bench/train_bench.sh            (after building: cmake --build build --target dlplan)
#   DLPLAN=path/to/dlplan bench/train_bench.sh
#
# For each case it writes a plan (dlplan plan --gpu cpu --gpus N --strategy ddp
# --micro-batch B --seq-len T --out), runs it (dlplan train --steps S --report,
# under mpirun for 2 ranks, one BLAS thread per rank) and prints, from the run
# report: the median step time over the steps after the first
# (measured.step_seconds), tokens per second over all ranks
# (measured.tokens_per_second) and the peak memory of the highest rank,
# measured against the plan's prediction.
#
# Sizes: tiny-gpt at micro-batch 8 and its full 64 tokens, 10 steps; gpt2 at
# micro-batch 1 and --seq-len 256 (not its full 1024, whose steps take tens of
# seconds each on one core), 3 steps. With 2 ranks the global batch doubles
# (weak scaling); on a machine with fewer free cores than ranks the ranks share
# cores and tokens/s cannot double. The whole script takes about 2 minutes on 2
# cores.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dlplan="${DLPLAN:-$here/build/bin/dlplan}"
if [[ ! -x "$dlplan" ]]; then
  echo "train_bench: no dlplan at $dlplan (build it: cmake --build build --target dlplan)" >&2
  exit 1
fi
cores="$(nproc)"  # before OMP_NUM_THREADS, which nproc obeys
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work="$(mktemp -d /tmp/dlplan_train_bench.XXXXXX)"
trap 'rm -rf "$work"' EXIT

# model ranks micro-batch seq steps
cases=(
  "tiny-gpt 1 8 64 10"
  "tiny-gpt 2 8 64 10"
  "gpt2 1 1 256 3"
  "gpt2 2 1 256 3"
)

echo "dlplan train throughput on $(hostname): $cores cores, OPENBLAS_NUM_THREADS=1 per rank, ddp, fp32, synthetic data"
printf '%-9s %5s %11s %5s %6s %10s %12s %12s %12s %7s\n' \
  model ranks micro-batch seq steps "step ms" "tokens/s" "peak meas." "peak pred." diff
for c in "${cases[@]}"; do
  read -r model ranks mb seq steps <<<"$c"
  plan="$work/$model-$ranks.plan.json"
  report="$work/$model-$ranks.report.json"
  "$dlplan" plan --model "$model" --gpu cpu --gpus "$ranks" --strategy ddp --micro-batch "$mb" --seq-len "$seq" \
    --out "$plan" >"$work/plan.log" 2>&1 || { cat "$work/plan.log" >&2; exit 1; }
  cmd=("$dlplan" train --plan "$plan" --steps "$steps" --report "$report" --progress json)
  if ((ranks > 1)); then cmd=(mpirun -n "$ranks" --oversubscribe "${cmd[@]}"); fi
  "${cmd[@]}" >"$work/train.log" 2>&1 || { cat "$work/train.log" >&2; exit 1; }
  python3 - "$report" "$model" "$ranks" "$mb" "$seq" "$steps" <<'EOF'
import json, sys
path, model, ranks, mb, seq, steps = sys.argv[1:]
r = json.load(open(path))
m, p = r["measured"], r["predicted"]
def mib(b): return f"{b / 2**20:.1f} MiB"
meas, pred = m["memory"]["peak"], p["memory"]["peak"]
print(f"{model:<9} {ranks:>5} {mb:>11} {seq:>5} {steps:>6} {1e3 * m['step_seconds']:>10.1f} "
      f"{m['tokens_per_second']:>12.1f} {mib(meas):>12} {mib(pred):>12} {100 * (meas - pred) / pred:>+6.1f}%")
EOF
done
