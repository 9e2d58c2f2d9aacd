"""Time to recommendation: `gpulab run -p workload=script:PROG` on failing programs, as a user runs it, until
the index holds the verdict and 04's recommendation (or its honest "nothing tried fixes it"); then the rest
of the chain. Per program: the wall time at which 04 finished (polled from run.json, which the runner
rewrites after every notebook), each notebook's time, the verdict and the next step the index shows.

    python benchmarks/bench_time_to_recommendation.py --out DIR [--programs cpu|gpu|all] [--stall 5]

Programs (tests/fixtures): cpu_deadlock (a custom op that deadlocks in native code), transposed_gemm (a
CPU GEMM kernel that deadlocks only on a transposed operand), and on a GPU: gpu_lazy_loading (a kernel pair
that deadlocks under lazy module loading), gpu_spin_held_back (a kernel that never ends, launched by a
custom op; nothing in the registry fixes it) and gpu_transposed_gemm (a CUDA GEMM that never completes on a
transposed operand). Writes DIR/results.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
PROGRAMS = {
    "cpu_deadlock": ("cpu", f"{FIX / 'custom_op_deadlock.py'} --gil released"),
    "transposed_gemm": ("cpu", str(FIX / "fix_transposed_gemm.py")),
    "gpu_lazy_loading": ("gpu", str(FIX / "gpu_lazy_loading_deadlock.py")),
    "gpu_spin_held_back": ("gpu", f"{FIX / 'gpu_threshold_spin.py'} --n 80"),
    "gpu_transposed_gemm": ("gpu", str(FIX / "gpu_transposed_gemm.py")),
}


def run_one(name: str, program: str, out: Path, stall: float, params: list[str], limit_s: float) -> dict:
    outdir = out / name
    cmd = [sys.executable, "-m", "gpulab", "run", "--out", str(outdir), *params,
           "-p", f"workload=script:{program}", "-p", f"stall_s={stall}"]
    t0 = time.monotonic()
    log = open(out / f"{name}.log", "w")
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    t_rec = None
    while p.poll() is None:
        runs = sorted(outdir.glob("2*/run.json"))
        if runs and t_rec is None:
            try:
                nbs = json.loads(runs[-1].read_text())["scenarios"][0]["notebooks"]
                if any(n["name"].startswith("04") and n.get("status") not in (None, "running", "not_run") for n in nbs):
                    t_rec = time.monotonic() - t0
            except (ValueError, KeyError, IndexError):
                pass
        if time.monotonic() - t0 > limit_s:
            p.terminate()
            p.wait(60)
            break
        time.sleep(0.5)
    total = time.monotonic() - t0
    log.close()
    fix: dict = {}
    runs = sorted(outdir.glob("2*/run.json"))
    data = json.loads(runs[-1].read_text()) if runs else {}
    sc = (data.get("scenarios") or [{}])[0]
    metrics = {}
    for path in sorted(runs[-1].parent.glob("*/metrics.json")) if runs else ():
        metrics = json.loads(path.read_text())   # one scenario: its folder's metrics (kept when the run is cut)
    fix = (metrics.get("04_fix_scenarios") or {}).get("metrics") or {}
    return {"program": name, "time_to_recommendation_s": round(t_rec, 1) if t_rec else None,
            "total_s": round(total, 1), "exit": p.returncode, "verdict": sc.get("verdict"),
            "evidence": sc.get("evidence"), "next_step": sc.get("next_step"),
            "notebooks": {n["name"][:2]: {"status": n["status"], "s": round(n["duration_s"] or 0, 1),
                                          "note": (n.get("error") or "")[:160]} for n in sc.get("notebooks") or ()},
            "recommendation": fix.get("recommendation"), "apply": fix.get("recommendation_apply"),
            "tried": fix.get("tried"), "verdict_03": (metrics.get("03_bisect_hang") or {}).get("headline"),
            "headline_04": (metrics.get("04_fix_scenarios") or {}).get("headline")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--programs", default="cpu", choices=("cpu", "gpu", "all"))
    ap.add_argument("--stall", type=float, default=5.0)
    ap.add_argument("--limit", type=float, default=900.0, help="seconds before a chain is stopped")
    ap.add_argument("--only", default=None, help="comma list of program names")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    results = []
    for name, (kind, program) in PROGRAMS.items():
        if a.only and name not in a.only.split(","):
            continue
        if a.programs != "all" and kind != a.programs:
            continue
        params = ["--params", "params/smoke.yaml"] if kind == "cpu" else ["-p", "device=cuda"]
        results.append(run_one(name, program, a.out, a.stall, params, a.limit))
        (a.out / "results.json").write_text(json.dumps(results, indent=1))
        r = results[-1]
        print(f"{name}: recommendation at {r['time_to_recommendation_s']} s, chain {r['total_s']} s, "
              f"verdict {r['verdict']}; next: {r['next_step']}", flush=True)
        print("   " + ", ".join(f"{k} {v['status']} {v['s']} s" for k, v in r["notebooks"].items()), flush=True)
        print(f"   03: {r['verdict_03']}\n   04: {r['headline_04']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
