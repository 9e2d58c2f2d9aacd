"""Real faults in real child processes, judged by the watchdog from the outside.

Every hang here is a real one (a native mutex deadlock, a dlopen that never returns); stall windows are
short so the whole file runs in about a minute on 2 cores. conftest's fixture checks nothing is left running.
"""
from __future__ import annotations

import json
import shutil
import os
import sys
from pathlib import Path

import pytest

from gpulab import trace
from gpulab.hang import faults, verdict
from gpulab.hang.watchdog import watch

FIX = Path(__file__).parent / "fixtures"
STALL = 1.5


def _run(tmp_path, cmd, **kw):
    kw.setdefault("stall_s", STALL)
    kw.setdefault("timeout_s", 60)
    return watch.run(cmd, out_dir=tmp_path / "w", progress=lambda m: None, **kw)


def _assert_hang_evidence(v):
    assert v.stacks["python"].strip(), "no Python stacks"
    assert v.stacks["native"].strip(), f"no native stacks: {v.evidence}"
    assert v.left_running == ()
    assert v.time_to_verdict_s is not None and v.time_to_verdict_s >= v.stall_s
    assert (Path(v.log["dir"]) / v.log["verdict"]).exists()


# ------------------------------------------------------------------------------------------ pure parts

@pytest.mark.parametrize("spec,kind,op,nth", [
    ("deadlock:aten.mm@2,gil=released", "deadlock", "aten.mm", 2), ("segfault:addmm", "segfault", "aten.addmm", 1),
    ("slow:aten.bmm,seconds=0.5", "slow", "aten.bmm", 1), ("libload", "libload", None, 1),
    ("nan:aten._softmax@4", "nan", "aten._softmax", 4), ("spin:mm", "spin", "aten.mm", 1),
])
def test_fault_spec_parses(spec, kind, op, nth):
    fs = faults.parse(spec)
    assert (fs.kind, fs.op, fs.nth) == (kind, op, nth)
    assert faults.parse(str(fs)) == fs


@pytest.mark.parametrize("spec,msg", [
    ("hang:aten.mm", "choose one of deadlock"), ("deadlock", "needs an op"), ("libload:aten.mm", "takes no op"),
    ("deadlock:mm,gil=maybe", "held, released"), ("slow:mm,seconds=x", "not a float"), ("nan:mm@0", ">= 1"),
    ("segfault:mm,gil=held", "valid options: none"),
])
def test_fault_spec_errors_name_choices(spec, msg):
    with pytest.raises(faults.FaultSpecError, match=msg):
        faults.parse(spec)


@pytest.mark.parametrize("spec", [None, "", "none", "None"])
def test_no_fault(spec):
    assert faults.parse(spec) is None


@pytest.mark.parametrize("cmd,expect", [
    (["python", "x.py", "--a"], ["x.py", "--a"]), (["python3", "-u", "-m", "pkg.mod", "1"], ["-m", "pkg.mod", "1"]),
    ([sys.executable, "t.py"], ["t.py"]), (["train.py", "--lr", "1"], ["train.py", "--lr", "1"]),
    (["python", "-c", "print(1)"], None), (["bash", "-c", "sleep 1"], None), (["python"], None),
])
def test_python_command_detection(cmd, expect):
    got = watch.python_command(cmd)
    assert (got[2] if got else None) == expect


def test_localize_earliest_gpu_incomplete_and_host_blocked():
    R = trace.OpRecord
    recs = [R(1, "aten.mm.default", [], "a.py:1", "main", 1.0, 1.1, True, None),
            R(2, "aten.bmm.default", [], "a.py:2", "main", 1.2, 1.3, False, None),
            R(3, "aten.add.Tensor", [], "a.py:3", "main", 1.4, 1.5, False, None),
            R(4, "aten._local_scalar_dense.default", [], "a.py:4", "main", 1.6, None, None, None)]
    inflight, blocked, open_ = verdict.localize(recs)
    assert (inflight.name, blocked.name, [r.seq for r in open_]) == ("aten.bmm.default",
                                                                      "aten._local_scalar_dense.default", [4])
    inflight, blocked, _ = verdict.localize(recs[:1] + [recs[3]])
    assert (inflight.seq, blocked) == (4, None)


@pytest.mark.parametrize("kw,msg", [({"mode": "fast"}, "ops, sync, gpu, stats"), ({"stall_s": 0}, "must both be > 0"),
                                    ({"capture_gpu": "yes"}, "True, False or 'auto'")])
def test_bad_arguments_are_named(tmp_path, kw, msg):
    with pytest.raises(ValueError, match=msg):
        watch.run(["python", "x.py"], out_dir=tmp_path, **kw)


def test_fault_needs_python_command(tmp_path):
    with pytest.raises(ValueError, match="needs a Python command"):
        watch.run(["bash", "-c", "true"], fault="deadlock:aten.mm", out_dir=tmp_path)


# ------------------------------------------------------------------------------------------ real faults

def test_cli_names_custom_op_in_unmodified_script(tmp_path, capsys):
    out = tmp_path / "v.json"
    code = watch.main(["--stall", str(STALL), "--timeout", "60", "--json", str(out), "--out", str(tmp_path / "w"),
                       "--", "python", str(FIX / "custom_op_deadlock.py"), "--at", "3"])
    v = json.loads(out.read_text())
    assert code == watch.EXIT_CODES["hang"] == 3
    assert (v["status"], v["phase"], v["class"]) == ("hang", "ops", "host_lock")
    op = v["in_flight_op"]
    assert op["name"] == "gpulab_fixtures.locked_scale.default"
    assert op["shapes"] == [[4, 16]] and op["dtypes"] == ["float32"] and "custom_op_deadlock.py:" in op["call_site"]
    assert "locked_scale" in v["stacks"]["python"] and "pthread_mutex_lock" in v["stacks"]["native"]
    assert v["planted"] is None and v["left_running"] == []
    assert "gpulab_fixtures.locked_scale.default" in capsys.readouterr().out


def test_custom_op_deadlock_gil_released(tmp_path):
    v = _run(tmp_path, ["python", str(FIX / "custom_op_deadlock.py"), "--at", "2", "--gil", "released"])
    assert (v.status, v.cls, v.in_flight_op["name"]) == ("hang", "host_lock", "gpulab_fixtures.locked_scale.default")
    _assert_hang_evidence(v)


def test_a_hang_after_a_thread_of_the_program_died_names_that_thread_with_the_waiting_line(tmp_path):
    # a logging thread dies of an exception; the end-of-epoch Queue.join waits for its task_done for ever
    v = _run(tmp_path, ["python", str(FIX / "queue_hang.py")])
    lines = (FIX / "queue_hang.py").read_text().splitlines()
    join, raised = (next(n for n, t in enumerate(lines, 1) if t.rstrip().endswith(m)) for m in ("# JOIN", "# RAISE"))
    assert (v.status, v.in_flight_op) == ("hang", None), v.evidence
    died = f"thread metrics-logger died: ValueError: bad loss"
    assert any(f.startswith(f"before the hang, {died}") and f"queue_hang.py:{raised} in logger" in f
               for f in v.evidence), v.evidence
    assert v.owner["kind"] == "program" and f"queue_hang.py:{join} in main" in v.owner["where"], v.owner
    assert died in v.owner["why"] and "a Queue's task_done" in v.owner["why"], v.owner


def test_unmodified_script_library_deadlock_is_startup_library_load(tmp_path):
    lib = faults.build_library()
    v = _run(tmp_path, ["python", str(FIX / "libload_deadlock.py"), str(lib)])
    assert (v.status, v.phase, v.cls, v.in_flight_op) == ("hang", "startup", "library_load", None)
    assert any("dynamic loader" in f and "dlopen" in f for f in v.evidence)
    _assert_hang_evidence(v)


@pytest.mark.parametrize("spec,status,cls,op", [
    ("deadlock:aten.mm@2,gil=held", "hang", "host_lock", "aten.mm.default"),
    ("deadlock:aten.tanh@2,gil=released", "hang", "host_lock", "aten.tanh.default"),
    ("segfault:aten.mm@2", "crash", "gemm", "aten.mm.default"),
    ("libload", "hang", "library_load", None),
    ("error:aten.tanh@3", "error", "unknown", "aten.tanh.default"),
])
def test_planted_fault_verdict(tmp_path, spec, status, cls, op):
    v = _run(tmp_path, ["python", str(FIX / "slow_then_ok.py"), "0"], fault=spec)
    assert (v.status, v.cls) == (status, cls), v.evidence
    assert (v.in_flight_op["name"] if v.in_flight_op else None) == op
    assert v.planted == str(faults.parse(spec)) and any("PLANTED" in f for f in v.evidence)
    assert v.left_running == ()
    if status == "hang":
        _assert_hang_evidence(v)
        assert v.phase == ("startup" if spec == "libload" else "ops")
    if status == "crash":
        assert v.signal == "SIGSEGV" and v.exit_code == -11
        assert "Segmentation fault" in v.stacks["python"] and "slow_then_ok.py" in v.stacks["python"]
    if status == "error":
        assert v.exit_code == 1 and "planted error" in v.stderr_tail


def test_slow_op_within_stall_window_is_ok(tmp_path):
    v = _run(tmp_path, ["python", str(FIX / "slow_then_ok.py"), "0"], fault="slow:aten.mm@2,seconds=1.0",
             stall_s=2.5, tail=200)   # the whole log: the recorder also records what each matmul runs inside it
    assert (v.status, v.cls, v.exit_code) == ("ok", None, 0)
    slow = [o for o in v.oplog_tail if o["name"] == "aten.mm.default" and (o["duration_s"] or 0) >= 1.0]
    assert len(slow) == 1  # the slow op really took its second, and it was not a hang


def test_nan_fault_is_seen_by_stats_mode(tmp_path):
    v = _run(tmp_path, ["python", str(FIX / "slow_then_ok.py"), "0"], fault="nan:aten.mm@2", mode="stats")
    assert v.status == "ok"
    snap = trace.read(Path(v.log["dir"]) / v.log["op_log"])
    first = trace.first_nonfinite(snap)
    assert first is not None and first.name == "aten.mm.default"
    assert [r.seq for r in snap.records if r.name == "aten.mm.default"].index(first.seq) == 1


def test_error_exit_reports_code_and_stderr_tail(tmp_path):
    v = _run(tmp_path, ["python", str(FIX / "error_exit.py")])
    assert (v.status, v.exit_code) == ("error", 1)
    assert "RuntimeError" in v.stderr_tail and any("stderr tail" in f for f in v.evidence)
    assert v.last_completed_op is not None


def test_timeout_while_progressing(tmp_path):
    v = _run(tmp_path, ["python", str(FIX / "busy_forever.py")], stall_s=5, timeout_s=9)
    assert v.status == "timeout" and v.phase == "ops" and v.ops_completed > 5 and v.left_running == ()
    assert v.stacks["native"] and v.elapsed_s < 25


def test_non_python_command_whole_group_killed(tmp_path):
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    v = _run(tmp_path, ["bash", "-c", "sleep 120 & sleep 120; wait"])
    assert v.status == "hang" and v.mode is None and v.log["op_log"] is None
    assert v.left_running == ()


def test_bare_python_runs_in_gpulabs_interpreter_not_paths(tmp_path, monkeypatch):
    """In CI the venv is not on PATH: `python` there has no torch and no recorder."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python").write_text("#!/bin/sh\nexit 99\n")
    (fake / "python").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    assert watch.python_command(["python", "x.py"])[0] == sys.executable
    assert watch.python_command([str(fake / "python"), "x.py"])[0] == str(fake / "python")
