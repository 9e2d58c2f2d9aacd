"""The chain on a user's program, as the user runs it (tests/test_chain_failing.py, test_chain_crash.py,
test_evidence_first.py, test_nan_cause_chain.py).

A test runs the notebooks that can speak to its program only (`only`, as `gpulab run --only`): 01 never reads
the workload (the platform is its question; the whole chain on a script, 01 included, is
test_user_project.py's) and feeds the verdict only its `slow` rule (04 the platform's risks: none on a CPU);
06 feeds only `slow`, and 05 only `wrong_numbers` (a vendor kernel failing the oracle), both below hang and
crash in the verdict's priority (gpulab.chain.verdict)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FIX = Path(__file__).parent / "fixtures"


def ended_chain(root: Path, out: Path, fixture: str, only: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """`gpulab run` on tests/fixtures/<fixture> with the smoke parameters -> (its scenario in run.json, each
    notebook's metrics), after checking that the index was written and every notebook it ran (`only`: these
    notebooks, as `--only`; empty: all) ran to its end."""
    res, run, metrics = chain(root, out, str(FIX / fixture), only)
    assert (out / "latest" / "index.html").exists(), res.stderr[-3000:]
    every_notebook_ended(run, metrics)
    return run["scenarios"][0], metrics


def chain(root: Path, out: Path, program: str, only: tuple[str, ...] = ()
          ) -> tuple[subprocess.CompletedProcess, dict, dict]:
    res = subprocess.run([sys.executable, "-m", "gpulab", "run", "--params", "params/smoke.yaml", "--out", str(out),
                          "-p", f"workload=script:{program}", "-p", "stall_s=3", "-p", "repeats=1",
                          "-p", "fix_budget_s=15", "--notebook-timeout", "300",
                          *(["--only", ",".join(only)] if only else [])],
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
