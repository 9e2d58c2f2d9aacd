"""`gpulab watch` at a terminal: the job reads it as it would without gpulab (pdb, input()), and a job waiting
for its user's line is no hang; a job that is stuck is one all the same. Each case is a real terminal (a pty)
in front of a real `gpulab watch`."""
from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpulab.trace import liveness

LIB = str(Path(__file__).resolve().parents[1] / "lib")
WAITS = "waits for input from the terminal"

ASK = """import torch
x = torch.ones(3)
name = input("name? ")
print("got", name, (x * 2).sum().item(), flush=True)
"""
STUCK = """import threading, torch
x = torch.ones(3) * 2
lock = threading.Lock()
lock.acquire()
lock.acquire()   # never returns
"""


class Terminal:
    """`gpulab watch --stall S -- python PROG` with a pty as its standard input; stderr read as it comes."""

    def __init__(self, tmp_path: Path, program: str, stall_s: float = 2.0):
        prog = tmp_path / "prog.py"
        prog.write_text(program)
        self.out = tmp_path / "cap"
        self.master, slave = pty.openpty()
        self.p = subprocess.Popen([sys.executable, "-m", "gpulab", "watch", "--stall", str(stall_s), "--quiet",
                                   "--status-every", "0", "--out", str(self.out), "--", sys.executable, str(prog)],
                                  stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": LIB})
        os.close(slave)
        self.lines: list[str] = []
        self.waits = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.p.stderr:
            self.lines.append(line)
            if WAITS in line:
                self.waits.set()

    def type(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def end(self, timeout: float = 120) -> tuple[int, str, dict]:
        try:
            out = self.p.stdout.read()
            rc = self.p.wait(timeout)
        finally:
            if self.p.poll() is None:
                self.p.kill()
            os.close(self.master)
        return rc, out, json.loads((self.out / "verdict.json").read_text())


def test_a_job_waiting_for_its_users_line_is_no_hang_and_gets_it(tmp_path):
    t = Terminal(tmp_path, ASK)
    assert t.waits.wait(120), "".join(t.lines)
    time.sleep(3)   # past the stall window again: still waiting, still no hang
    t.type("gpulab")
    rc, out, v = t.end()
    assert rc == 0 and v["status"] == "ok", (rc, "".join(t.lines))
    assert (t.out / "stdout.txt").read_text().endswith("name? got gpulab 6.0\n")


def test_a_job_stuck_at_a_terminal_is_still_a_hang(tmp_path):
    t = Terminal(tmp_path, STUCK)
    rc, _, v = t.end()
    assert rc == 3 and v["status"] == "hang", (rc, "".join(t.lines))
    assert not any(WAITS in line for line in t.lines), "".join(t.lines)


@pytest.mark.parametrize("stdin", ["pty", "pipe", "sleep"])
def test_only_a_read_of_a_terminal_is_waiting_for_a_user(stdin):
    """liveness.reading_terminal: a child blocked reading a pty is; one reading a pipe (a batch job's input
    that never comes) or sleeping is not."""
    master, slave = pty.openpty()
    code = "import time; time.sleep(60)" if stdin == "sleep" else "import sys; sys.stdin.readline()"
    p = subprocess.Popen([sys.executable, "-c", code], stdin=slave if stdin != "pipe" else subprocess.PIPE)
    try:
        deadline, blocked = time.monotonic() + 30, 0
        while blocked < 5 and not liveness.reading_terminal(p.pid):   # or in a system call for half a second
            assert time.monotonic() < deadline, "the child never blocked"
            time.sleep(0.1)
            with open(f"/proc/{p.pid}/syscall") as fh:
                blocked = blocked + 1 if fh.read().split()[0].isdigit() else 0
        assert liveness.reading_terminal(p.pid) is (stdin == "pty")
    finally:
        p.kill()
        p.wait()
        os.close(master)
        os.close(slave)
