"""The whole chain's wall time, per notebook, against the goal of a script's answer in about a minute: 45 s plus 3x the script's own time.

    python benchmarks/bench_chain_time.py --out DIR [--device cpu|cuda|auto] [--cases healthy,failing,builtin]
                                          [--stall S] [--params FILE]

Cases: `healthy` (tests/fixtures/healthy_train.py, ten steps of a small MLP), `failing` (a seed-scenario
fixture that fails on any machine: tests/fixtures/custom_op_deadlock.py, a custom op that deadlocks in native
code on its third call), `builtin` (the default built-in chain, params/base.yaml; its goal is the issue's
"under 60 s on the H100"). The script's own time is one run of it under `gpulab watch --no-record` with the
chain's stall window (for a hang: start-up plus the window that judges it, the least any tool can take),
timed before its chain. Each case prints one JSON line (chain_s, script_s, goal_s, met, per notebook: status
and seconds), and the file DIR/chain_time.json holds them all; a short table comes last. Every child runs
through gpulab.proc and the chain is the `gpulab run` command as a user types it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from gpulab import proc  # noqa: E402
from gpulab.chain import notebook  # noqa: E402
from gpulab.trace import liveness  # noqa: E402

CASES = {
    "healthy": ["tests/fixtures/healthy_train.py"],
    "failing": ["tests/fixtures/custom_op_deadlock.py"],
    "builtin": None,
}
FIXED_S, PER_SCRIPT = 45.0, 3.0   # the goal: 45 s plus 3x the script's own run time
BUILTIN_GOAL_S = 60.0             # the default chain on the H100


def script_time(script: list[str], out: Path, stall_s: float) -> dict:
    """One run of the script as it is (no recorder), watched with the chain's stall window."""
    folder = out / "watch"
    t0 = time.monotonic()
    res = proc.run([sys.executable, "-m", "gpulab", "watch", "--no-record", "--quiet", "--stall", str(stall_s),
                    "--out", str(folder), "--", sys.executable, *script], timeout_s=600, cwd=ROOT,
                   stdout=out / "watch.out.txt", stderr=out / "watch.err.txt")
    wall = time.monotonic() - t0
    v = json.loads((folder / "verdict.json").read_text()) if (folder / "verdict.json").is_file() else {}
    return {"status": v.get("status"), "script_s": round(float(v.get("elapsed_s") or wall), 2),
            "watch_wall_s": round(wall, 2), "exit": res.returncode}


def chain_time(case: str, script: list[str] | None, out: Path, device: str, stall_s: float,
               params: list[str]) -> dict:
    """`gpulab run` on the case, timed from the command's start to its exit; per notebook from run.json."""
    cmd = [sys.executable, "-m", "gpulab", "run", "--out", str(out / "runs"), "-p", f"device={device}",
           "-p", f"stall_s={stall_s}"]
    for f in params:
        cmd += ["--params", f]
    if script is not None:
        cmd += ["-p", "workload=script:" + " ".join(script)]
    t0 = time.monotonic()
    res = proc.run(cmd, timeout_s=3600, cwd=ROOT, stdout=out / "chain.out.txt", stderr=out / "chain.err.txt")
    wall = time.monotonic() - t0
    runs = sorted((out / "runs").glob("2*/run.json"))
    run = json.loads(runs[-1].read_text()) if runs else {}
    sc = (run.get("scenarios") or [{}])[0]
    sc_dir = runs[-1].parent / sc["name"] if runs and sc.get("name") else None
    nbs = {nb["name"]: {"status": nb.get("status"), "s": round(nb["duration_s"], 1) if nb.get("duration_s") else None,
                        "cells_s": round(nb["cells_s"], 1) if nb.get("cells_s") else None,
                        "cells": [[round(t, 2), line] for t, line in
                                  notebook.cell_seconds(sc_dir / f"{nb['name']}.ipynb")] if sc_dir else []}
           for nb in sc.get("notebooks") or ()}
    return {"chain_s": round(wall, 1), "exit": res.returncode, "verdict": sc.get("verdict"), "notebooks": nbs,
            "run_dir": str(runs[-1].parent) if runs else None}


def ran(got: dict) -> bool:
    """Whether the chain ran to the end: a chain that stopped at once (no run folder, a notebook failed) is fast
    and says nothing of the goal."""
    return got["exit"] == 0 and bool(got["notebooks"]) and all(
        nb["status"] in ("ok", "not_applicable") for nb in got["notebooks"].values())


def load() -> str:
    """What else this machine is doing (others' work distorts every figure here): load average and cores."""
    try:
        one, five, _ = os.getloadavg()
        return f"load {one:.1f}/{five:.1f} (1/5 min) on {os.cpu_count()} cores"
    except OSError:
        return "load unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    ap.add_argument("--cases", default="healthy,failing,builtin")
    ap.add_argument("--stall", type=float, default=liveness.STALL_S, help="the chain's stall_s (default: gpulab's window)")
    ap.add_argument("--params", action="append", default=[], help="more parameter files for every chain")
    a = ap.parse_args()
    cases = [c for c in a.cases.split(",") if c]
    bad = [c for c in cases if c not in CASES]
    if bad:
        ap.error(f"--cases {','.join(bad)} is not valid; choose from {', '.join(CASES)}")
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with proc.session("bench_chain_time"):
        for case in cases:
            out = a.out / case
            out.mkdir(parents=True, exist_ok=True)
            before = load()
            own = script_time(CASES[case], out, a.stall) if CASES[case] else {"script_s": None}
            got = chain_time(case, CASES[case], out, a.device, a.stall, a.params)
            goal = BUILTIN_GOAL_S if CASES[case] is None else round(FIXED_S + PER_SCRIPT * own["script_s"], 1)
            row = {"case": case, "device": a.device, "script": " ".join(CASES[case] or ["builtin"]), **own, **got,
                   "goal_s": goal, "met": ran(got) and got["chain_s"] <= goal, "load_before": before,
                   "load_after": load()}
            rows.append(row)
            print(json.dumps(row), flush=True)
            (a.out / "chain_time.json").write_text(json.dumps(rows, indent=2))
    names = sorted({n for r in rows for n in r["notebooks"]})
    print(f"{'case':<9}{'script s':>9}{'chain s':>9}{'goal s':>8}  met  " + " ".join(f"{n[:2]:>6}" for n in names))
    for r in rows:
        per = " ".join(f"{(r['notebooks'].get(n) or {}).get('s') or 0:>6.1f}" for n in names)
        print(f"{r['case']:<9}{r['script_s'] if r['script_s'] is not None else '-':>9}{r['chain_s']:>9.1f}"
              f"{r['goal_s']:>8.1f}  {'yes' if r['met'] else 'NO ' if ran(r) else 'n/a':<4} {per}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
