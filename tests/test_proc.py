"""gpulab.proc: children and everything they start end with their run, escapes included."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from gpulab import proc
from procscan import left_after, new_marker

FIX = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("escape", ["double-fork", "setsid"])
def test_escaped_daemon_is_reported_and_ended_when_the_child_exits(escape):
    name, mark = new_marker()
    r = proc.run([sys.executable, str(FIX / "escape_then_exit.py"), escape], timeout_s=30,
                 env={**os.environ, name: mark})
    assert r.status == "ok"
    (daemon,) = r.left_running  # the one process that really was still running
    assert ("sleep(300)" if escape == "setsid" else "escape_then_exit.py") in daemon.cmdline
    assert not proc.alive(daemon.pid)
    assert left_after(name, mark) == []


@pytest.mark.parametrize("escape", ["double-fork", "setsid"])
def test_escaped_daemon_is_ended_at_the_deadline(escape):
    name, mark = new_marker()
    t0 = time.monotonic()
    r = proc.run([sys.executable, str(FIX / "escape_then_exit.py"), escape, "sleep"], timeout_s=2,
                 env={**os.environ, name: mark})
    assert r.status == "timeout" and r.returncode is None and time.monotonic() - t0 < 10
    assert r.left_running == () and r.unkillable == ()
    assert left_after(name, mark) == []


def test_an_orphan_that_ended_by_itself_is_reaped_not_left_a_zombie():
    """This process is the subreaper (as gpulab is): a grandchild that ended before its parent was killed
    re-parents here as a zombie, and a long-lived caller (a notebook kernel running watch after watch, a test
    worker) would pile them up. The child's own exit code stays its Popen's."""
    code = ("import os, sys, time\npid = os.fork()\nif pid == 0:\n    os._exit(0)\n"
            "print(pid, flush=True)\ntime.sleep(60)\n")   # the forked one stays a zombie of this one
    r = proc.run([sys.executable, "-c", code], timeout_s=3, capture=True)
    assert r.status == "timeout" and r.stdout.strip().isdigit(), r
    assert not Path(f"/proc/{r.stdout.strip()}").exists()   # reaped (a pid is not reused this soon)


def test_a_clean_child_leaves_nothing_to_report():
    r = proc.run([sys.executable, "-c", "print('hi')"], timeout_s=30, capture=True)
    assert (r.status, r.stdout.strip(), r.left_running) == ("ok", "hi", ())


@pytest.mark.parametrize("code,status,sig", [("raise SystemExit(3)", "error", None),
                                             ("import os; os.kill(os.getpid(), 9)", "crash", 9)])
def test_exit_status(code, status, sig):
    r = proc.run([sys.executable, "-c", code], timeout_s=30)
    assert (r.status, r.signal) == (status, sig)


def test_output_goes_to_files_not_pipes(tmp_path):
    """A child writing far more than a pipe buffer (64 KiB) must not block."""
    r = proc.run([sys.executable, "-c", "import sys; sys.stdout.write('x' * 2_000_000)"], timeout_s=30,
                 stdout=tmp_path / "out.txt")
    assert r.status == "ok" and (tmp_path / "out.txt").stat().st_size == 2_000_000


def test_missing_program_is_command_not_found():
    with pytest.raises(proc.CommandNotFound, match="no-such-program-xyz"):
        proc.run(["no-such-program-xyz"], timeout_s=5)


@pytest.mark.parametrize("timeout", [0, -1])
def test_deadline_must_be_positive(timeout):
    with pytest.raises(ValueError, match="must be > 0"):
        proc.run([sys.executable, "-c", "pass"], timeout_s=timeout)


def test_stop_is_idempotent_and_children_carry_their_token():
    with proc.Child([sys.executable, "-c", "import time; time.sleep(60)"]) as c:
        time.sleep(0.2)
        assert c.token in proc.tokens_of(c.pid) and proc.guard().token in proc.tokens_of(c.pid)
        assert c.pid in c.members()
    assert c.stop() == () and not proc.alive(c.pid)


def test_guard_ends_the_tree_when_its_supervisor_is_killed():
    """SIGKILL of the supervising process: no handler runs, the guard sidecar still ends its children."""
    name, mark = new_marker()
    code = ("import sys, time; from gpulab import proc; "
            "proc.spawn([sys.executable, '-c', 'import time; time.sleep(300)']); print('up', flush=True); "
            "time.sleep(300)")
    sup = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                           env={**os.environ, name: mark, "PYTHONPATH": str(Path(proc.__file__).parents[1])})
    try:
        assert sup.stdout.readline().strip() == "up"
        assert len([p for p in (proc.marked(mark) or ())]) == 0  # the marker is not a gpulab token
        os.kill(sup.pid, signal.SIGKILL)
        sup.wait(10)
        assert left_after(name, mark, grace_s=5) == []
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()


@pytest.mark.parametrize("attempt", range(4))
def test_guard_ends_a_child_whose_exec_is_still_in_progress(attempt):
    """The supervisor dies the moment Popen returns: the child may not show its environment (its token)
    yet, because close-on-exec (which ends Popen's wait) comes before the kernel sets up the new image.
    Each attempt hits that window about half the time here; the guard must look again."""
    name, mark = new_marker()
    code = ("import os, sys; from gpulab import proc; "
            "proc.spawn([sys.executable, '-c', 'import time; time.sleep(300)']); os.kill(os.getpid(), 9)")
    sup = subprocess.Popen([sys.executable, "-c", code],
                           env={**os.environ, name: mark, "PYTHONPATH": str(Path(proc.__file__).parents[1])})
    assert sup.wait(30) == -signal.SIGKILL
    assert left_after(name, mark, grace_s=5) == []


def test_a_young_process_with_no_environment_yet_is_unsure_not_unmarked():
    """What an exec in progress looks like (an empty /proc/<pid>/environ) is held as unsure, so end_marked
    and the guard look again instead of leaving it running; a carrier of the token is found."""
    token = f"t{uuid.uuid4().hex[:12]}"
    empty = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env={})
    carrier = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                               env={**os.environ, proc.ENV_VAR: token}, start_new_session=True)
    try:
        time.sleep(0.3)
        found, unsure = proc._scan(token, None, ())
        assert carrier.pid in found and empty.pid in unsure and empty.pid not in found
        t0 = time.monotonic()
        assert proc.end_marked(token) == ()
        assert not proc.alive(carrier.pid) and proc.alive(empty.pid)
        assert time.monotonic() - t0 < proc._SETTLE_S + 1.0   # looked again for a while, then gave up
    finally:
        for k in (empty, carrier):
            if k.poll() is None:
                k.kill()
            k.wait()


@pytest.mark.parametrize("attempt", range(3))
def test_end_marked_waits_for_a_child_whose_exec_is_in_progress(attempt):
    """end_marked right after Popen returns (no process group to fall back on): every child is ended."""
    token = f"t{uuid.uuid4().hex[:12]}"
    env = {**os.environ, proc.ENV_VAR: token}
    kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env,
                             start_new_session=True) for _ in range(4)]
    try:
        assert proc.end_marked(token) == ()
        assert [proc.alive(k.pid) for k in kids] == [False] * 4   # end_marked reaps its own children
    finally:
        for k in kids:
            if k.poll() is None:
                k.kill()
                k.wait()


def test_session_turns_signals_into_interrupted_and_stops_children():
    name, mark = new_marker()
    code = ("import os, signal, sys, time\n"
            "from gpulab import proc\n"
            "def body(s):\n"
            "    proc.spawn([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    time.sleep(30)\n"
            "    return 0\n"
            "sys.exit(proc.main_guarded('demo', body))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, name: mark, "PYTHONPATH": str(Path(proc.__file__).parents[1])})
    assert r.returncode == 128 + signal.SIGTERM
    assert r.stderr.strip().splitlines() == ["demo: interrupted by SIGTERM; every child process was stopped"]
    assert left_after(name, mark) == []
