"""The chain on failing programs of a user's, as the user runs it: `gpulab run -p workload=script:...` with
the smoke parameters, through papermill. Each notebook ends or says why it was skipped, the index says what
is wrong, and 04 recommends the fix that removes the failure or says honestly that nothing tried does."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FIX = Path(__file__).parent / "fixtures"


def chain(root: Path, out: Path, program: str) -> tuple[subprocess.CompletedProcess, dict, dict]:
    res = subprocess.run([sys.executable, "-m", "gpulab", "run", "--params", "params/smoke.yaml", "--out", str(out),
                          "-p", f"workload=script:{program}", "-p", "stall_s=3", "-p", "repeats=1",
                          "-p", "fix_budget_s=15", "--notebook-timeout", "300"],
                         cwd=root, capture_output=True, text=True, timeout=600)
    run = json.loads((out / "latest" / "run.json").read_text())
    metrics = {k: v["metrics"] for k, v in
               json.loads((out / "latest" / "baseline" / "metrics.json").read_text()).items()}
    return res, run, metrics


def _every_notebook_ended(run: dict, metrics: dict) -> None:
    """Every notebook ran to its end; one whose question does not apply to the program says why."""
    for nb in run["scenarios"][0]["notebooks"]:
        assert nb["status"] == "ok", nb
    for name, m in metrics.items():
        if m.get("applies") is False:
            assert m.get("reason"), name


@pytest.mark.slow
def test_the_chain_on_a_gemm_that_hangs_on_a_transposed_operand(root, tmp_path):
    res, run, m = chain(root, tmp_path, str(FIX / "fix_transposed_gemm.py"))
    assert (tmp_path / "latest" / "index.html").exists(), res.stderr[-3000:]
    _every_notebook_ended(run, m)
    sc = run["scenarios"][0]
    assert sc["verdict"] == "hang" and "aten.mm" in sc["evidence"]
    assert m["02_instrument"]["status"] == "hang"
    assert m["03_bisect_hang"]["status"] == "hang" and "contiguous_gemm_inputs" in m["03_bisect_hang"]["suggested"]
    assert m["04_fix_scenarios"]["recommendation"] == "contiguous_gemm_inputs"
    assert "contiguous_gemm_inputs fixes it" in sc["next_step"] and "apply with:" in sc["next_step"]
    assert m["04_fix_scenarios"]["scenarios"]["baseline"]["trials"] == 1    # 03's ladder, not run again
    # the recording ended in the hang before any attention call: the failure is not in attention (05), and 06
    # cannot know the program's call
    assert m["05_oracle"]["applies"] is False and "failed before any attention call" in m["05_oracle"]["reason"]
    assert m["06_benchmark"]["applies"] is False and "unknown whether the program calls attention" in m["06_benchmark"]["reason"]


@pytest.mark.slow
def test_the_chain_on_a_program_that_crashes(root, tmp_path):
    res, run, m = chain(root, tmp_path, str(FIX / "crash_segfault.py"))
    assert (tmp_path / "latest" / "index.html").exists(), res.stderr[-3000:]
    _every_notebook_ended(run, m)
    sc = run["scenarios"][0]
    assert sc["verdict"] == "crash" and "SIGSEGV" in sc["evidence"]
    assert m["02_instrument"]["status"] == "crash"
    assert m["04_fix_scenarios"]["recommendation"] is None
    assert "nothing tried fixes it" in sc["next_step"] and "bundle.zip" in sc["next_step"]
