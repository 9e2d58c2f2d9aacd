"""Threads that wait for each other's locks (gpulab.hang.lockcycle): read from Python stacks and the sources, on
synthetic stacks and on a real trainer whose logging thread takes two locks in the other order."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab.hang import capture, lockcycle

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tests" / "fixtures" / "calls" / "thread_locks.py"

SRC = """import threading
a = threading.Lock()
b = threading.Lock()

def one():
    with a:
        work()
        with b:
            pass

def two():
    with b:
        b.acquire() if False else None
        with a:
            pass

def three():
    a.acquire()
"""


def _thread(main: bool, *frames: tuple[str, int]) -> capture.Thread:
    return capture.Thread("1", "", tuple(f"{fn} (t.py:{ln})" for fn, ln in frames), main)


def _read(path):
    return SRC if path == "t.py" else None


def test_two_threads_taking_two_locks_in_opposite_orders_are_a_cycle():
    got = lockcycle.find([_thread(True, ("one", 8)), _thread(False, ("two", 14))], _read)
    assert got is not None and [t["waits_for"] for t in got["threads"]] == ["b", "a"], got
    assert got["threads"][0]["holds"] == {"a": "t.py:6 in one"} and got["threads"][0]["thread"] == "the main thread"
    said = got["said"]
    assert "waits for `b` at t.py:8 in one, which the thread running two() holds (taken at t.py:12 in two)" in said


@pytest.mark.parametrize("threads", [
    [_thread(True, ("one", 8)), _thread(False, ("two", 12))],      # the other waits for b, which nobody holds
    [_thread(True, ("one", 7)), _thread(False, ("two", 14))],      # the main thread is in work(), not a lock
    [_thread(True, ("three", 18))],                                  # acquire() with nothing held: no cycle
])
def test_waits_that_make_no_cycle_are_no_finding(threads):
    assert lockcycle.find(threads, _read) is None


def test_a_lock_taken_again_by_its_holder_is_a_cycle_of_one():
    src = "import threading\nl = threading.Lock()\ndef f():\n    with l:\n        with l:\n            pass\n"
    got = lockcycle.find([_thread(True, ("f", 5))], lambda p: src)
    assert got and "already holds (taken at t.py:4 in f" in got["said"] and "RLock" in got["said"]


def test_a_trainer_and_its_logging_thread_in_a_lock_order_deadlock_are_named_with_both_locks(tmp_path):
    out = tmp_path / "w"
    r = subprocess.run([sys.executable, "-m", "gpulab", "watch", "--quiet", "--status-every", "0", "--stall", "4",
                        "--out", str(out), "--", "python", str(PROGRAM)], capture_output=True, text=True, timeout=240,
                       cwd=ROOT)
    v = json.loads((out / "verdict.json").read_text())
    lines = PROGRAM.read_text().splitlines()
    waits = next(n for n, t in enumerate(lines, 1) if "# WAITS" in t)
    assert (v["status"], v["class"]) == ("hang", "lock_cycle"), (v["class"], v["evidence"])
    assert v["owner"]["kind"] == "program" and v["owner"]["where"].startswith(f"calls/thread_locks.py:{waits} in main")
    assert "the thread running logger() waits for `stats_lock`" in v["owner"]["why"] and not v["suggested"]
    assert "take the locks in one order everywhere" in r.stdout
