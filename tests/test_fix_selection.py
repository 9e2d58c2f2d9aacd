"""`gpulab fixes` on real failing programs: auto runs what the evidence points at first, goes on within its
time budget and says what it did not try; an interrupted matrix keeps the --json the user asked for; 04
takes the baseline from 03's ladder when that ladder ran exactly the same trials."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gpulab.fixes import matrix
from gpulab.fixes.target import Target
from gpulab.hang.investigation import ladder
from procscan import left_after, new_marker, sigterm_once_saved

FIXTURES = Path(__file__).parent / "fixtures"
LIB = str(Path(__file__).resolve().parents[1] / "lib")


def test_auto_tries_the_evidence_first_and_skips_what_cannot_answer(tmp_path):
    """A deadlock planted inside aten.mm is a library's: the host-lock fix its evidence points at runs, and fixes
    whose every answer the evidence contradicts (a DataLoader's, an SDPA backend's) are not run at all."""
    prog = tmp_path / "mm_loop.py"
    prog.write_text("import torch\nw = torch.randn(16, 16)\nx = torch.randn(4, 16)\n"
                    "for _ in range(5):\n    x = torch.relu(x @ w)\nprint(float(x.sum()))\n")
    cfg = matrix.MatrixConfig("auto", repeats=1, jobs=2, stall_s=2.0, timeout_s=120, cost_rounds=0, budget_s=1.0,
                              fault="deadlock:aten.mm,gil=released")
    m = matrix.run(Target(command=(sys.executable, str(prog))), cfg, tmp_path / "fx", progress=lambda s: None)
    ran = [s for s in m.scenarios if s.fixes]
    assert m.baseline.counts["hang"] == 1 and ran and all(s.stage == "evidence" for s in ran)
    assert m.baseline.first_failure["owner"]["kind"] == "library"
    assert "omp_single_thread" in {s.name for s in ran}          # a deadlock on a host lock
    assert all("time budget" in t["why"] for t in m.not_tried)
    assert m.recommendation is None and "nothing tried fixes it" in m.next_step and "upstream" in m.next_step
    skipped = {t["scenario"]: t["why"] for t in m.skipped}
    assert "dataloader_spawn" in skipped and "cls=host_lock" in skipped["dataloader_spawn"]
    assert "sdpa_backend_math" in skipped and "op_kind=gemm" in skipped["sdpa_backend_math"]
    assert set(skipped).isdisjoint(s.name for s in m.scenarios) and m.time_saved_s > 0


def test_auto_runs_no_fix_for_the_programs_own_deadlock_and_points_at_its_op(tmp_path):
    """The program's own custom op takes its own lock twice: no setting of a library or the platform can answer
    it, so auto runs the baseline only, lists every fix as ruled out with why, and the next step names the
    program's op and line, not an upstream report."""
    cfg = matrix.MatrixConfig("auto", repeats=1, jobs=1, stall_s=2.0, timeout_s=120, cost_rounds=0)
    prog = (sys.executable, str(FIXTURES / "custom_op_deadlock.py"), "--gil", "released")
    m = matrix.run(Target(command=prog), cfg, tmp_path, progress=lambda s: None)
    assert m.baseline.counts["hang"] == 1 and [s.name for s in m.scenarios] == ["baseline"]
    ff = m.baseline.first_failure
    assert ff["owner"]["kind"] == "program" and "custom_op_deadlock.py:27 in locked_scale" in ff["owner"]["where"]
    assert m.skipped and all("owner=program" in t["why"] or "cls=host_lock" in t["why"] for t in m.skipped)
    assert any("owner=program" in t["why"] for t in m.skipped if t["scenario"].startswith("sdpa_backend"))
    assert "omp_single_thread" in {t["scenario"] for t in m.skipped} and not m.not_tried
    assert "program's own code" in m.next_step and "locked_scale" in m.next_step and "upstream" not in m.next_step
    assert m.time_saved_s and m.time_saved_s > 0


def test_an_interrupted_matrix_keeps_the_json_it_was_asked_for(tmp_path):
    target = tmp_path / "user.json"
    name, mark = new_marker()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": LIB, name: mark, "TMPDIR": str(tmp_path)}
    p = subprocess.Popen([sys.executable, "-m", "gpulab", "fixes", "--json", str(target), "--out", str(tmp_path / "o"),
                          "--scenario", "baseline,omp_single_thread,contiguous_gemm_inputs", "--repeats", "3",
                          "--jobs", "1", "--stall", "2", "--", sys.executable,
                          str(FIXTURES / "custom_op_deadlock.py"), "--gil", "released"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    saved = sigterm_once_saved(p, target, lambda d: d["scenarios"][0]["trials"])
    assert saved["interrupted"] is True and saved["scenarios"][0]["name"] == "baseline"
    assert saved["scenarios"][0]["trials"] >= 1
    assert left_after(name, mark) == []


def test_the_baseline_comes_from_03s_ladder_when_it_ran_the_same_trials(tmp_path):
    prog = tmp_path / "ok.py"
    prog.write_text("print('fine')\n")
    cfg = matrix.MatrixConfig("baseline", repeats=1, jobs=1, stall_s=5.0, timeout_s=60, cost_rounds=0)
    target = Target(command=(sys.executable, str(prog)))
    lad = ladder.run(target.rungs({}), repeats=1, jobs=1, stall_s=5.0, timeout_s=60, out_dir=tmp_path / "ladder",
                     mode=cfg.mode, progress=lambda s: None)
    assert lad.passed
    m = matrix.run(target, cfg, tmp_path / "fixes", progress=lambda s: None, reuse_ladder=tmp_path / "ladder")
    assert m.baseline.reused == "03's ladder" and m.baseline.trials == 1
    assert not (tmp_path / "fixes" / "baseline").exists()              # no workload child ran for it
    other = matrix.MatrixConfig("baseline", repeats=2, jobs=1, stall_s=5.0, timeout_s=60, cost_rounds=0)
    m3 = matrix.run(target, other, tmp_path / "fixes3", progress=lambda s: None, reuse_ladder=tmp_path / "ladder")
    assert not m3.baseline.reused and m3.baseline.trials == 2         # other repeats: run again


def test_04_tries_fixes_on_03s_smallest_failing_configuration_then_confirms_on_the_configured_one(tmp_path):
    from gpulab import workloads
    # what 03 leaves behind: a failing forward rung and its bisection's smallest failing configuration
    (tmp_path / "ladder").mkdir()
    (tmp_path / "ladder" / "ladder.json").write_text(json.dumps({"rungs": [
        {"name": "sdpa", "trials": 1, "counts": {"pass": 1}}, {"name": "forward", "trials": 1, "counts": {"pass": 0}}]}))
    (tmp_path / "bisect").mkdir()
    (tmp_path / "bisect" / "bisect.json").write_text(json.dumps({"minimal": {"layers": 1, "heads": 1}}))
    cfg = workloads.WorkloadConfig(rung="forward", batch=1, heads=2, head_dim=16, text_tokens=8, image_tokens=24,
                                   layers=2, device="cpu")
    planted = "deadlock:aten._scaled_dot_product_flash_attention_for_cpu,gil=released"
    mcfg = matrix.MatrixConfig("baseline,decomposed_attention,omp_single_thread", repeats=1, jobs=2, stall_s=3.0,
                               timeout_s=120, cost_rounds=0, fault=planted)
    assert matrix.minimal_config(cfg, tmp_path).layers == 1
    m = matrix.run_workload(cfg, mcfg, tmp_path, progress=lambda s: None)
    assert m.minimal["removed"] == ["decomposed_attention"] and "layers=1" in m.minimal["config"]
    assert m.minimal["scenarios"]["omp_single_thread"] == "no_effect"
    assert [s.name for s in m.scenarios] == ["baseline", "decomposed_attention"]   # only the winner is confirmed
    assert m.recommendation == "decomposed_attention" and "2 layers" in m.workload
    assert "smallest failing configuration" in m.scenarios[1].why
    saved = json.loads((tmp_path / "fixes" / "fixes.json").read_text())
    assert saved["minimal"]["removed"] == ["decomposed_attention"]
