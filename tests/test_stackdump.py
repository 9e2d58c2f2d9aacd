"""A recorded process asked for its stacks (SIGUSR1) while its native teardown runs, after the interpreter's
finalization gave the signal back: ignored, not fatal. Seen on 2 cores: `gpulab watch --on-stall keep` took a job's
slow exit for a stall, its capture's SIGUSR1 killed the job, and the verdict said crash in the program's own code."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

# after Py_Finalize, exit() runs the C atexit handlers: pause() stands for a native teardown that takes its time
# (it returns only for a signal that is caught, so an ignored SIGUSR1 leaves it waiting)
PROG = """
import ctypes
libc = ctypes.CDLL(None)
libc.__cxa_atexit(ctypes.cast(libc.pause, ctypes.c_void_p), None, None)
print("ready", flush=True)
"""


def _bits(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def test_stacks_asked_for_during_native_teardown_do_not_kill_the_job(tmp_path):
    (tmp_path / "prog.py").write_text(PROG)
    p = subprocess.Popen([sys.executable, "-m", "gpulab.trace", "--log", str(tmp_path / "ops.log"), "--faulthandler",
                          str(tmp_path / "fh.txt"), "--", str(tmp_path / "prog.py")], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        usr1 = 1 << (signal.SIGUSR1 - 1)
        deadline = time.monotonic() + 60
        # finalization done: faulthandler no longer catches SIGUSR1 (the process now waits in its C atexit handler)
        while _bits(p.pid, "SigCgt") & usr1:
            assert p.poll() is None and time.monotonic() < deadline, "the process never finished finalizing"
            time.sleep(0.05)
        assert _bits(p.pid, "SigIgn") & usr1, "after finalization SIGUSR1 is back to its default: it terminates"
        p.send_signal(signal.SIGUSR1)
        time.sleep(0.3)
        assert p.poll() is None, f"SIGUSR1 during the native teardown ended the process ({p.returncode})"
    finally:
        p.kill()
        p.wait()


def test_the_programs_children_start_with_sigusr1_as_without_gpulab(tmp_path):
    """Ignored only from the exit on: a child the program starts meanwhile gets the default, as it would alone."""
    (tmp_path / "prog.py").write_text("import subprocess, sys\n"
                                      "print(subprocess.run(['grep', '-E', '^Sig(Ign|Cgt)', '/proc/self/status'],"
                                      " capture_output=True, text=True).stdout)\n")
    r = subprocess.run([sys.executable, "-m", "gpulab.trace", "--log", str(tmp_path / "ops.log"), "--faulthandler",
                        str(tmp_path / "fh.txt"), "--", str(tmp_path / "prog.py")], capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    ign = next(int(line.split()[1], 16) for line in r.stdout.splitlines() if line.startswith("SigIgn:"))
    assert not ign & (1 << (signal.SIGUSR1 - 1)), r.stdout
