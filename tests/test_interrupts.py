"""Signals to long-running commands: every process of the run ends, what finished is written, the index
says interrupted, and the exit code is 128+signal with one line and no traceback."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nbfactory import RECORD, notebook, project
from procscan import left_after, new_marker, sigterm_once_saved

FIX = Path(__file__).parent / "fixtures"
LIB = str(Path(__file__).resolve().parents[1] / "lib")

# A notebook whose kernel starts a gpulab.proc child and a setsid daemon, says it is running, then waits.
BUSY_CELL = """import subprocess, sys, time, pathlib
from gpulab import proc
sleeper = proc.spawn([sys.executable, '-c', 'import time; time.sleep(300)'])
daemon = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)
pathlib.Path(out_dir, 'busy.started').write_text('yes')
time.sleep(300)"""


def _env(tmp_path, name, mark):
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    return {**os.environ, name: mark, "TMPDIR": str(tmp), "PYTHONPATH": LIB}


def _wait_for(path: Path, p: subprocess.Popen, limit_s: float = 90) -> None:
    deadline = time.monotonic() + limit_s
    while not path.exists():
        assert p.poll() is None, f"the command ended early: {p.returncode}"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


@pytest.mark.parametrize("sig, side_by_side", [(signal.SIGTERM, False), (signal.SIGINT, False),
                                               (signal.SIGTERM, True)])
def test_signal_to_gpulab_run_mid_notebook(tmp_path, sig, side_by_side):
    """Side by side too: each waits for the one before's products, the later kernels already started ahead;
    every one ends with the run."""
    nbs = {"01_first": notebook("First", "", RECORD.format(name="01_first", headline="first done")),
           "02_busy": notebook("Busy", "", BUSY_CELL),
           "03_later": notebook("Later", "", RECORD.format(name="03_later", headline="later"))}
    nbs["02_busy"].metadata["gpulab"] = {"after": {"01_first": "always"}}
    nbs["03_later"].metadata["gpulab"] = {"after": {"02_busy": "always"}}
    proj = project(tmp_path / "proj", nbs, base="device: cpu\n")   # no device=auto child (test_runner's)
    name, mark = new_marker()
    env = {**_env(tmp_path, name, mark), "GPULAB_NOTEBOOKS_SIDE_BY_SIDE": "always" if side_by_side else "0"}
    p = subprocess.Popen([sys.executable, "-m", "gpulab", "run", "--out", str(tmp_path / "out")], cwd=proj,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        run_dir = None
        deadline = time.monotonic() + 90
        while run_dir is None:
            found = [d for d in (tmp_path / "out").glob("2*") if (d / "baseline" / "busy.started").exists()]
            run_dir = found[0] if found else None
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read() if p.poll() is not None else "slow"
            time.sleep(0.1)
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + sig, err
    assert "Traceback" not in err
    assert ("side by side" in err) is side_by_side, err
    assert f"interrupted by {signal.Signals(sig).name}" in err.strip().splitlines()[-1]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "interrupted" and signal.Signals(sig).name in run["note"]
    status = {n["name"]: n["status"] for n in run["scenarios"][0]["notebooks"]}
    assert status == {"01_first": "ok", "02_busy": "interrupted", "03_later": "not_run"}
    cut = [n for n in run["scenarios"][0]["notebooks"] if n["name"] == "02_busy"][0]
    assert "cut off by" in cut["error"] and (run_dir / cut["report"]).exists()  # its finished cells, rendered
    html = (run_dir / "index.html").read_text()
    assert "interrupted" in html and "notebooks ran to the end" not in html
    assert left_after(name, mark) == []  # papermill, the kernel, its gpulab.proc child, the setsid daemon
    assert list((tmp_path / "tmp").glob("gpulab-kernel-*")) == []  # kernel connection files went with it


def test_sigterm_to_gpulab_watch_stops_the_watched_program(tmp_path):
    name, mark = new_marker()
    p = subprocess.Popen([sys.executable, "-m", "gpulab", "watch", "--stall", "60", "--out", str(tmp_path / "w"),
                          "--", "python", str(FIX / "escape_then_exit.py"), "setsid", "sleep"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path, name, mark))
    try:
        _wait_for(tmp_path / "w" / "stdout.txt", p)
        deadline = time.monotonic() + 60
        while b"escaped" not in (tmp_path / "w" / "stdout.txt").read_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 143, err
    assert "Traceback" not in err and "interrupted by SIGTERM" in err.strip().splitlines()[-1]
    assert left_after(name, mark) == []


def test_timeout_wrapping_gpulab_watch(tmp_path):
    """`timeout 5 gpulab watch ...`: timeout's SIGTERM ends the watchdog and the whole watched tree."""
    name, mark = new_marker()
    r = subprocess.run(["timeout", "5", sys.executable, "-m", "gpulab", "watch", "--stall", "60", "--out",
                        str(tmp_path / "w"), "--", "python", str(FIX / "escape_then_exit.py"), "double-fork", "sleep"],
                       capture_output=True, text=True, timeout=60, env=_env(tmp_path, name, mark))
    assert r.returncode == 124  # timeout's own code: it had to send its signal
    assert "Traceback" not in r.stderr and "interrupted by SIGTERM" in r.stderr
    assert left_after(name, mark) == []


@pytest.mark.parametrize("escape", ["double-fork", "setsid"])
def test_watched_program_that_leaves_a_daemon(tmp_path, escape):
    name, mark = new_marker()
    r = subprocess.run([sys.executable, "-m", "gpulab", "watch", "--stall", "30", "--json", str(tmp_path / "v.json"),
                        "--", "python", str(FIX / "escape_then_exit.py"), escape],
                       capture_output=True, text=True, timeout=120, env=_env(tmp_path, name, mark))
    assert r.returncode == 0, r.stderr
    v = json.loads((tmp_path / "v.json").read_text())
    assert v["status"] == "ok" and len(v["left_running"]) == 1  # what really was still running ...
    assert any("still running after it ended" in f for f in v["evidence"])
    assert left_after(name, mark) == []  # ... and it was ended


@pytest.mark.parametrize("command", ["ladder", "bisect"])
def test_an_interrupted_ladder_or_bisection_keeps_the_json_it_was_asked_for(tmp_path, command):
    """--json is rewritten after every trial: SIGTERM after the first one leaves it holding what was seen."""
    target = tmp_path / "user.json"
    name, mark = new_marker()
    if command == "ladder":
        args = ["--repeats", "3", "--jobs", "1", "--rung",
                f"a={sys.executable} {FIX / 'custom_op_deadlock.py'} --gil released"]
        seen = lambda d: d["rungs"] and d["rungs"][0]["trials"]   # noqa: E731
    else:
        args = ["--space", "seq=200:1", "--", sys.executable, str(FIX / "threshold_hang.py"), "--seq", "{seq}"]
        seen = lambda d: d["probes"]   # noqa: E731
    p = subprocess.Popen([sys.executable, "-m", "gpulab", command, "--json", str(target), "--out", str(tmp_path / "o"),
                          "--stall", "2", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=_env(tmp_path, name, mark))
    saved = sigterm_once_saved(p, target, seen)
    assert saved["interrupted"] is True and seen(saved)
    assert left_after(name, mark) == []
