"""Notebook 02 end to end through papermill, on a program that deadlocks, one that exits with an error, and
the built-in workload: it stays bounded on a failing program (one recording, stopped at the stall), says what
it left out and why, and reports a healthy run as it always did."""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import papermill
import pytest
import yaml

from conftest import ROOT
from gpulab import report as gpulab_report, trace

NB = ROOT / "notebooks" / "02_instrument.ipynb"
FIX = ROOT / "tests" / "fixtures"


def _run_02(tmp_path: Path, **params) -> tuple[dict, list[str], float]:
    """(02's metrics.json entry, every Markdown and HTML output as text, seconds) of one papermill run."""
    declared = papermill.inspect_notebook(str(NB))
    smoke = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    values = {k: v for k, v in smoke.items() if k in declared} | {"out_dir": str(tmp_path / "out")} | params
    t0 = time.monotonic()
    papermill.execute_notebook(str(NB), str(tmp_path / "02.ipynb"), parameters=values, kernel_name="python3",
                               cwd=str(ROOT), progress_bar=False, execution_timeout=300)
    seconds = time.monotonic() - t0
    nb = json.loads((tmp_path / "02.ipynb").read_text())
    texts = ["".join(o["data"].get("text/markdown") or o["data"].get("text/html") or "")
             for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", []) if "data" in o]
    entry = json.loads((tmp_path / "out" / "metrics.json").read_text())["02_instrument"]
    return entry, texts, seconds


def test_02_on_a_deadlock_stops_at_the_stall_and_says_why(tmp_path):
    entry, texts, seconds = _run_02(tmp_path, workload=f"script:{FIX / 'custom_op_deadlock.py'} --gil released",
                                    stall_s=3.0)
    m = entry["metrics"]
    assert seconds < 50, seconds      # one recording, stopped 3 s after the deadlock; nothing re-run
    assert (m["status"], m["exit_code"], m["in_flight_op"]) == ("hang", None, "gpulab_fixtures.locked_scale.default")
    assert m["ops_recorded"] >= 5 and m["overhead_us_per_op"] is None and m["nonfinite_checked"] is False
    assert entry["headline"].startswith("the workload did not finish: hang after ")
    assert "locked_scale" in entry["headline"] and "not measured" in entry["headline"]
    assert sorted(p.name for p in (tmp_path / "out").glob("*.log")) == ["ops.log"]   # no stats or overhead run
    note = next(t for t in texts if "made no progress for 3 s" in t)
    assert "**Not measured:**" in note and "hang again" in note
    last = next(t for t in texts if "call site" in t and "<td>open</td>" in t)   # the last-ops table
    assert "custom_op_deadlock.py:" in last and "locked_scale" in last


def test_02_on_an_error_exit_finishes_and_checks_nans_once_more(tmp_path):
    entry, texts, seconds = _run_02(tmp_path, workload=f"script:{FIX / 'error_exit.py'}", stall_s=3.0)
    m = entry["metrics"]
    assert (m["status"], m["exit_code"], m["last_op"]) == ("error", 1, "aten.mm.default")
    assert m["overhead_us_per_op"] is None and m["nonfinite_checked"] is True and m["first_nonfinite_op"] is None
    assert entry["headline"].startswith("the workload did not finish: error (exit 1) after ")
    marks = trace.read(tmp_path / "out" / "ops.log").raise_marks   # False only on a build where no raise is seen
    assert ("aten.mm.default (raised)" if marks else "aten.mm.default (whether it raised is not known") \
        in entry["headline"], (marks, entry["headline"])
    assert (tmp_path / "out" / "stats.log").exists() and not (tmp_path / "out" / "overhead.csv").exists()
    assert any("recording cost and GPU times not measured" in t for t in texts)   # the finding, shown
    assert any("<td>raised</td>" in t for t in texts) is bool(marks)   # the last-ops table: marked where it can be


def test_02_on_the_builtin_workload_records_checks_nans_and_leaves_the_recorders_cost_to_06(tmp_path):
    entry, texts, _ = _run_02(tmp_path, stall_s=30.0)
    m = entry["metrics"]
    assert (m["status"], m["exit_code"], m["in_flight_op"]) == ("ok", 0, None) and m["ops_recorded"] > 50
    assert m["overhead_us_per_op"] is None and m["nonfinite_checked"] and m["recording_mode"] == "auto"
    # 02 runs beside notebooks that time nothing: it times nothing itself, and says where the cost is timed
    assert re.match(r"\d+ ops recorded \(forward rung on cpu\); the recorder's cost is timed in 06, where nothing "
                    r"runs beside it; no op produced NaN/Inf$", entry["headline"])
    assert not any("call site" in t and "<th>state</th>" in t for t in texts)   # no last-ops table
    assert any("The workload finished after" in t for t in texts)
    assert not (tmp_path / "out" / "overhead.csv").exists() and (tmp_path / "out" / "stats.log").exists()
    assert not list((tmp_path / "out").glob("*.beat"))
    # 06's table of it: the mode 03 and 04 record with (auto) among the modes timed, interleaved in one child
    from gpulab.trace import analysis, followups
    from gpulab.workloads import WorkloadConfig

    smoke = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    cfg = WorkloadConfig.from_params(smoke, device="cpu")
    ov, note = followups.recorder_cost(cfg, tmp_path / "out", mode="auto", repeats=1, stall_s=30.0)
    assert note == "" and {"none", "passthrough", "auto"} <= set(ov["variant"])
    cost = analysis.cost_metrics(ov, "auto")
    assert set(cost["recorder_us_per_op"]) >= {"auto", "passthrough"} and cost["recorder_cost"]
    # not when 02's run did not finish: a rerun would only fail again, and its wall time measures nothing
    (tmp_path / "failed").mkdir()
    gpulab_report.record(tmp_path / "failed", "02_instrument", "hang", status="hang")
    ov, note = followups.recorder_cost(cfg, tmp_path / "failed", mode="auto", repeats=1, stall_s=30.0)
    assert ov is None and note.startswith("**Recording cost not measured:** 02's run of the workload did not finish")
    assert not list((tmp_path / "failed").glob("overhead*"))


def test_a_timing_run_that_fails_leaves_the_cost_unmeasured_with_the_reason(tmp_path):
    """The first run finished, a later timing run of the same program did not: no exception, a sentence."""
    script = tmp_path / "second_time_fails.py"
    script.write_text("import pathlib, sys, torch\nmark = pathlib.Path(__file__).with_suffix('.ran')\n"
                      "torch.ones(2).sum()\nsys.exit(3 if mark.exists() else mark.touch())\n")
    first = trace.record([sys.executable, str(script)], out_dir=tmp_path, timeout_s=120, stall_s=10.0, name="ops")
    assert first.ok, first.stderr_tail
    ov, note = trace.measure_overhead(first, [sys.executable, str(script)], repeats=1, out_dir=tmp_path,
                                      timeout_s=120, stall_s=10.0)
    assert ov is None and note.startswith("**Recording cost not measured:** a timing run ended as error")
    assert "stderr.txt</code>" in note and str(tmp_path) not in note


def test_a_gpu_hang_names_the_gpu_work_that_never_completed_not_the_sync():
    """The sync line lies: the host waits in .item() behind a matmul whose GPU work never completed. 02's
    headline, metrics and last-ops table name the matmul; the sync shows as the open op it is."""
    from gpulab.trace import analysis
    from gpulab.trace.ring import OpRecord, Snapshot
    from gpulab.trace.run import Recording

    recs = (OpRecord(0, "aten.mm.default", [], "t.py:3", "main", 1.0, 1.1, False, None),
            OpRecord(1, "aten.add.Tensor", [], "t.py:4", "main", 1.2, 1.3, False, None),
            OpRecord(2, "aten._local_scalar_dense.default", [], "t.py:5", "main", 1.4, None, None, None))
    snap = Snapshot(recs, 3, 2, 0, "auto", 1, "cuda", 64, 0)
    rec = Recording(snap, None, 9, False, 40.0, "/o/ops.log", ("python", "t.py"), "", "hang", 30.0)
    head, m = analysis.finding(rec, None, "forward", "cuda", "ops.log")
    assert head == ("the workload did not finish: hang after 3 ops, in op aten.mm.default (its GPU work never "
                    "completed); recording cost and GPU times not measured; NaN/Inf not checked")
    assert (m["status"], m["in_flight_op"], m["last_op"]) == ("hang", "aten.mm.default",
                                                              "aten._local_scalar_dense.default")
    assert m["overhead_us_per_op"] is None and m["nonfinite_checked"] is False
    states = analysis.last_ops_table(rec)["state"].tolist()
    assert states == ["GPU pending", "GPU pending", "open"]
    note = analysis.recording_note(rec, "/o")
    assert "made no progress for 30 s" in note and "<code>aten.mm.default</code>" in note
    assert note.count("**Not measured:**") == 1 and "hang again" in note
    assert analysis.last_ops_table(Recording(snap, 0, None, False, 1.0, "/o/ops.log", (), "")) is None   # ok: none


def test_followups_answer_each_run_from_the_first_recording(tmp_path):
    """02's GPU-profile and stats runs start together; each decides from the first recording whether to run."""
    from types import SimpleNamespace

    from gpulab.trace import followups
    from gpulab.workloads import WorkloadConfig

    hung = SimpleNamespace(ok=False, finished=False, status="hang")
    later = followups.start(hung, WorkloadConfig(device="cpu"), tmp_path, timeout_s=30, stall_s=2.0)
    later.wait()
    gpu, gpu_note = later.gpu_times()
    stats, stats_note = later.stats()
    assert gpu is None and "runs on the CPU" in gpu_note
    assert stats is None and stats_note.startswith("**NaN/Inf not checked:**") and "hang again" in stats_note
    assert not list(tmp_path.iterdir())   # nothing ran


def test_beside_the_builtin_workloads_first_run_the_runs_it_makes_useless_are_stopped(tmp_path):
    """For the built-in workload the stats run starts beside the first recording: a first run that hangs stops
    it (it would only hang again) and leaves nothing of it; a first recording that raises stops it too."""
    from gpulab.hang.investigation import firstrun
    from gpulab.trace import followups
    from gpulab.workloads import WorkloadConfig

    long = WorkloadConfig.from_params({"rung": "steps", "steps": 100000, "layers": 1, "batch": 1, "heads": 1,
                                       "head_dim": 8, "text_tokens": 4, "image_tokens": 4}, device="cpu")
    hangs = WorkloadConfig.from_params({"workload": f"script:{FIX / 'custom_op_deadlock.py'}"}, device="cpu")
    t0 = time.monotonic()
    rec, later = followups.with_first(
        lambda: firstrun.record(hangs, tmp_path, mode="auto", timeout_s=120, stall_s=2.0), long, tmp_path,
        timeout_s=300, stall_s=30.0)
    stats, note = later.stats()
    later.wait()
    assert rec.status == "hang" and stats is None and "hang again" in note
    assert time.monotonic() - t0 < 40                     # stopped, not run for its 100000 steps
    assert not list(tmp_path.glob("stats*")) and not list(tmp_path.glob("*.beat"))

    def fails():
        time.sleep(1.0)
        raise RuntimeError("the first recording could not start")

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="could not start"):
        followups.with_first(fails, long, tmp_path / "raised", timeout_s=300, stall_s=30.0)
    assert time.monotonic() - t0 < 20 and not list((tmp_path / "raised").glob("stats*"))


@pytest.mark.parametrize("raised_at, want", [
    (1, ", last op aten.add.Tensor (raised);"),                         # the failing op is the last one
    (0, ", last op aten.add.Tensor; the latest op to raise: aten.mm.default at t.py:3;"),   # ops ran after it
    (None, ", last op aten.add.Tensor;"),                               # no op marked, a log that does not say
])
def test_02_names_the_op_that_raised_when_ops_ran_after_it(raised_at, want):
    from gpulab.trace import analysis
    from gpulab.trace.ring import OpRecord, Snapshot
    from gpulab.trace.run import Recording

    recs = tuple(OpRecord(i, n, [], f"t.py:{3 + i}", "main", 1.0 + i, 1.1 + i, None, None, raised=i == raised_at)
                 for i, n in enumerate(("aten.mm.default", "aten.add.Tensor")))
    rec = Recording(Snapshot(recs, 2, 2, None, "ops", 1, "cpu", 64, 0), 1, None, False, 4.0, "/o/ops.log",
                    ("python", "t.py"), "", "error", 30.0)
    head, _ = analysis.finding(rec, None, "script", "cpu", "ops.log")
    assert head.startswith("the workload did not finish: error (exit 1) after 2 ops" + want), head


def test_02_says_so_when_its_build_cannot_mark_the_op_that_raised():
    """A log whose recorder could not see raises (neither in flight nor by missing outputs): the last op is
    not called the failing one, nor left as if none raised."""
    from gpulab.trace import analysis
    from gpulab.trace.ring import OpRecord, Snapshot
    from gpulab.trace.run import Recording

    recs = (OpRecord(0, "aten.mm.default", [], "t.py:3", "main", 1.0, 1.1, None, None),)
    snap = Snapshot(recs, 1, 1, None, "ops", 1, "cpu", 64, 0, raise_marks=False)
    rec = Recording(snap, 1, None, False, 4.0, "/o/ops.log", ("python", "t.py"), "", "error", 30.0)
    head, _ = analysis.finding(rec, None, "script", "cpu", "ops.log")
    assert ", last op aten.mm.default (whether it raised is not known: this PyTorch build does not mark" in head, head


@pytest.mark.parametrize("snap_ops,rung,want", [
    (2, "forward", "2 ops recorded (forward rung on cpu)"),
    (2, None, "2 ops recorded (on cpu)"),                  # what a watch caught: no rung of the built-in workload
    (None, None, "no op log kept (on cpu)"),               # a capture of a stall that recovered: its logs dropped
])
def test_02_headline_of_a_finished_recording(snap_ops, rung, want):
    from gpulab.trace import analysis
    from gpulab.trace.ring import OpRecord, Snapshot
    from gpulab.trace.run import Recording

    recs = (OpRecord(0, "aten.mm.default", [], "t.py:3", "main", 1.0, 1.1, False, None),
            OpRecord(1, "aten.add.Tensor", [], "t.py:4", "main", 1.2, 1.3, False, None))
    snap = Snapshot(recs, 2, 2, None, "ops", 1, "cpu", 64, 0) if snap_ops else None
    rec = Recording(snap, 0, None, False, 4.0, "/o/ops.log", ("python", "t.py"), "", "ok", 30.0)
    head, _ = analysis.finding(rec, None, rung, "cpu", "ops.log")
    assert head.startswith(want + ";"), head
