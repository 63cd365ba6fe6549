#!/usr/bin/env python3
"""One line of scripts/gpu-check's table from a run report (DESIGN.md's
`report` document), a pair of reports (parity), or torch_compare.py's JSON.
Standard library only: it runs wherever gpu-check runs.

  gpu_report_row.py REPORT                 measured beside predicted
  gpu_report_row.py --parity CPU GPU       per-step losses, GPU against CPU
  gpu_report_row.py --torch TORCH_JSON     PyTorch's figures
"""
import json
import sys

MIB = 1048576.0


def measured_row(path):
    r = json.load(open(path))
    m, p = r["measured"], r.get("predicted", {})
    rate = m.get("tokens_per_second") or m.get("samples_per_second") or 0
    unit = "tokens/s" if "tokens_per_second" in m else "samples/s"
    mp, pp = m["memory"]["peak"], p.get("memory", {}).get("peak", 0)
    ms, ps = m["step_seconds"], p.get("step_seconds", 0)
    diff = (mp - pp) / pp * 100 if pp else float("nan")
    return (f"{unit} {rate:,.0f}, MFU {100 * m.get('mfu', 0):.1f}% (predicted {100 * p.get('mfu', 0):.1f}%), "
            f"step {1e3 * ms:.1f} ms (predicted {1e3 * ps:.1f}), peak {mp / MIB:.1f} MiB "
            f"(predicted {pp / MIB:.1f}, {diff:+.2f}%), loss {r['loss'][0]:.3f} -> {r['loss'][-1]:.3f}")


def parity_row(cpu_path, gpu_path, tol=1e-4):
    cpu = json.load(open(cpu_path))["loss"]
    gpu = json.load(open(gpu_path))["loss"]
    if not cpu or len(cpu) != len(gpu):
        return f"MISMATCH: {len(cpu)} CPU steps, {len(gpu)} GPU steps"
    worst = max(abs(g - c) / max(abs(c), 1e-12) for c, g in zip(cpu, gpu))
    verdict = "ok" if worst <= tol else "MISMATCH"
    return (f"{verdict}: loss max rel diff {worst:.1e} over {len(gpu)} steps "
            f"(last: cpu {cpu[-1]:.5f}, gpu {gpu[-1]:.5f}; tolerance {tol:g})")


def torch_row(path):
    lines = [line for line in open(path) if line.strip().startswith("{")]
    t = json.loads(lines[-1])
    rate = t.get("tokens_per_second") or t.get("samples_per_second") or 0
    unit = "tokens/s" if "tokens_per_second" in t else "samples/s"
    return (f"{unit} {rate:,.0f}, MFU {100 * t.get('mfu', 0):.1f}%, step {1e3 * t['step_seconds']:.1f} ms, "
            f"peak {t['peak_bytes'] / MIB:.1f} MiB")


def main(argv):
    try:
        if argv[:1] == ["--parity"]:
            print(parity_row(argv[1], argv[2]))
        elif argv[:1] == ["--torch"]:
            print(torch_row(argv[1]))
        else:
            print(measured_row(argv[0]))
    except (OSError, ValueError, KeyError, IndexError) as e:
        print(f"unreadable result: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
