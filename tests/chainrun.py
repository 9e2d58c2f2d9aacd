"""A whole chain on a user's program, as the user runs it (tests/test_chain_failing.py, test_chain_crash.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def chain(root: Path, out: Path, program: str) -> tuple[subprocess.CompletedProcess, dict, dict]:
    res = subprocess.run([sys.executable, "-m", "gpulab", "run", "--params", "params/smoke.yaml", "--out", str(out),
                          "-p", f"workload=script:{program}", "-p", "stall_s=3", "-p", "repeats=1",
                          "-p", "fix_budget_s=15", "--notebook-timeout", "300"],
                         cwd=root, capture_output=True, text=True, timeout=600)
    run = json.loads((out / "latest" / "run.json").read_text())
    metrics = {k: v["metrics"] for k, v in
               json.loads((out / "latest" / "baseline" / "metrics.json").read_text()).items()}
    return res, run, metrics


def every_notebook_ended(run: dict, metrics: dict) -> None:
    """Every notebook ran to its end; one whose question does not apply to the program says why."""
    for nb in run["scenarios"][0]["notebooks"]:
        assert nb["status"] == "ok", nb
    for name, m in metrics.items():
        if m.get("applies") is False:
            assert m.get("reason"), name
