"""Child processes that cannot outlive their run.

Everything that may hang (a workload, a probe, a notebook kernel) starts in its own session and process
group, and is ended with `kill_group`, which also reaches descendants that moved to a group of their
own (a Jupyter kernel does), so no process is ever left behind.
"""
from __future__ import annotations

import os
import signal
import subprocess
from typing import Sequence


def descendants(pid: int) -> set[int]:
    import psutil

    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def kill_group(proc: subprocess.Popen, known: Sequence[int] = (), grace_s: float = 0.0) -> tuple[int, ...]:
    """End the child's process group and every descendant (seen now or `known` earlier).

    With `grace_s` > 0, SIGTERM first and SIGKILL whatever is still there after that long. Returns the
    pids still alive afterwards (empty when all went)."""
    import psutil

    pids = set(known) | descendants(proc.pid)
    for sig in ((signal.SIGTERM, signal.SIGKILL) if grace_s > 0 else (signal.SIGKILL,)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=grace_s if sig == signal.SIGTERM else 10)
        except subprocess.TimeoutExpired:
            pass
    alive = []
    for pid in pids | {proc.pid}:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            pass
    return tuple(sorted(alive))
