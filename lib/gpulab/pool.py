"""Warm workers: children that only compute (an oracle candidate on one case) share one persistent child
per device instead of paying interpreter, torch and CUDA start-up each, while a hang or a fault still ends
only the job that caused it.

`Pool` holds at most one live worker, a `python -m gpulab.pool` child started through gpulab.proc (own session,
token, a stop that reaches every descendant). It is fed one job at a time: a "module:function" name and its
arguments, pickled to a file in the pool's folder; the job's number goes down the worker's stdin, and "start N" (its
module loaded), then "done N", come back on a private pipe (the worker moves its fd 1 onto its log first, so nothing
a job prints can be mistaken for a reply, and a chatty job never blocks on a pipe). The parent waits with a per-job
deadline counted from "start N": a fresh worker's start-up (interpreter, torch) is no part of the job's time,
however loaded the machine (it has START_S of its own). A job that overruns it is a hang: the worker's whole tree is
stopped. A job that raises ends the worker with the traceback in its log (exit 1: a GPU fault poisons the CUDA
context, so the process is not reused); one killed by a signal is a crash. Either way the next job starts a fresh
worker. The outcome's `detail` reads as the one-shot child's did: "hang: no result within 8s (child process group
killed)", "crash (signal 6): <log tail>", "error (exit 1): <log tail>".

Nothing here knows the oracle (gpulab.oracle.check sends it its cases); the benchmark may send its points
the same way.
"""
from __future__ import annotations

import faulthandler
import importlib
import os
import pickle
import select
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpulab import proc

MODULE = "gpulab.pool"
STATUSES = ("ok", "hang", "crash", "error")
START_S = 120.0     # a job's start (a fresh worker's interpreter, init and the job's module) may take this long


@dataclass(frozen=True)
class Outcome:
    """How one job ended: ok (value set), hang, crash or error (detail says why, the log's tail included)."""
    status: str
    value: Any = None
    detail: str = ""
    seconds: float = 0.0      # from sending the job to its reply (a fresh worker's start-up included)
    fresh: bool = False       # the job started its worker

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _function(spec: str):
    mod, _, name = spec.partition(":")
    return getattr(importlib.import_module(mod), name)


def _dump(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        pickle.dump(obj, fh, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def _load(path: Path) -> Any:
    with open(path, "rb") as fh:
        return pickle.load(fh)


def log_tail(path: Path, lines: int = 3, chars: int = 400) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])[-chars:]


def _crash_frame(path: Path) -> str:
    """The innermost Python frame of faulthandler's dump in the log ('File "m.py", line 4 in attn'), or ""."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for i, line in enumerate(lines[:-1]):
        if "most recent call first" in line and lines[i + 1].strip().startswith("File"):
            return lines[i + 1].strip()[:400]
    return ""


class Worker:
    """One live worker child; `submit` runs one job. After a non-ok outcome the worker is stopped (`alive`
    is False) and a Pool starts another."""

    def __init__(self, folder: Path, *, init: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 label: str = "worker", index: int = 0):
        self.folder = folder
        self.log = folder / f"worker-{index}.log"
        jobs_r, jobs_w = os.pipe()
        replies_r, replies_w = os.pipe()
        try:
            self.child = proc.Child([sys.executable, "-m", MODULE, str(folder), *init],
                                    env=proc.python_env(env), stdin=jobs_r, stdout=replies_w, stderr=self.log,
                                    label=label)
        except BaseException:
            for fd in (jobs_w, replies_r):
                os.close(fd)
            raise
        finally:
            os.close(jobs_r)
            os.close(replies_w)
        self._jobs = jobs_w
        self._replies = replies_r
        self._buf = b""
        self.alive = True
        self.jobs = 0

    def _readline(self, deadline: float) -> bytes | None:
        """The next reply line; b"" when the worker is gone; None at the deadline."""
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._replies], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(self._replies, 65536)
                if not chunk:
                    return b""
                self._buf += chunk
            elif self.child.poll() is not None:  # ended, though a descendant may still hold the pipe open
                return b""
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def submit(self, fn: str, args: tuple, kwargs: dict | None, timeout_s: float) -> Outcome:
        self.jobs += 1
        n = self.jobs
        job, res = self.folder / f"job-{n}.pkl", self.folder / f"res-{n}.pkl"
        _dump(job, (fn, args, kwargs or {}))
        t0 = time.monotonic()
        # the job's deadline runs from its start: a fresh worker's interpreter, its init and the job's module
        # (torch) load first, which a loaded machine makes slow, under a start-up deadline of their own
        start_s = max(timeout_s, START_S)
        deadline, started = t0 + start_s, False
        try:
            os.write(self._jobs, f"{n}\n".encode())
            while True:
                line = self._readline(deadline)
                if line is None:
                    self.stop(kill=True)
                    said = (f"no result within {timeout_s:.0f}s" if started else
                            f"the worker did not start the job within {start_s:.0f}s")
                    return Outcome("hang", detail=f"hang: {said} (child process group killed)",
                                   seconds=time.monotonic() - t0)
                if line == b"":
                    break
                if not started and line.strip() == f"start {n}".encode():
                    deadline, started = time.monotonic() + timeout_s, True
                    continue
                if line.strip() == f"done {n}".encode():
                    value = _load(res)
                    return Outcome("ok", value, seconds=time.monotonic() - t0)
        except BrokenPipeError:
            pass
        finally:
            for p in (job, res):
                p.unlink(missing_ok=True)
        # the worker ended while running the job: a signal (crash) or an exception (error, exit 1)
        rc = self.child.wait(timeout=10)
        self.stop(kill=True)
        rc = self.child.returncode if rc is None else rc
        crash = rc is not None and rc < 0
        kind = f"crash (signal {-rc})" if crash else f"error (exit {rc})"
        where = (_crash_frame(self.log) if crash else "") or log_tail(self.log)
        return Outcome("crash" if crash else "error", detail=f"{kind}: {where}", seconds=time.monotonic() - t0)

    def stop(self, kill: bool = False) -> None:
        """End the worker: closing its stdin lets an idle one exit by itself; then the whole tree is stopped."""
        if not self.alive:
            return
        self.alive = False
        for fd in (self._jobs, self._replies):
            try:
                os.close(fd)
            except OSError:
                pass
        if not kill:
            self.child.wait(timeout=5)
        self.child.stop()


class Pool:
    """At most one warm worker; a lost one (hang, crash, error) is replaced on the next job. Use as a context
    manager: the worker is stopped on the way out. `started` counts the workers started so far."""

    def __init__(self, *, init: Sequence[str] = (), env: Mapping[str, str] | None = None, label: str = "worker"):
        self.init, self.env, self.label = tuple(init), env, label
        self.folder = Path(tempfile.mkdtemp(prefix="gpulab-pool-"))
        self.worker: Worker | None = None
        self.started = 0

    def run(self, fn: str, args: tuple = (), kwargs: dict | None = None, *, timeout_s: float) -> Outcome:
        """fn(*args, **kwargs) in the warm worker ("module:function", picklable arguments and result)."""
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r} must be > 0")
        fresh = self.worker is None or not self.worker.alive
        if fresh:
            self.worker = Worker(self.folder, init=self.init, env=self.env, label=self.label, index=self.started)
            self.started += 1
        out = self.worker.submit(fn, args, kwargs, timeout_s)
        return Outcome(out.status, out.value, out.detail, out.seconds, fresh)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            self.worker = None
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ------------------------------------------------------------------------------------------ the worker

def serve(folder: str, init: Sequence[str]) -> int:
    """The worker's loop: job numbers on stdin, "done N" on the reply pipe (the original fd 1). An exception
    in a job is not caught: its traceback goes to the log and the worker exits 1, as a one-shot child would."""
    reply = os.dup(1)              # private: not inherited by anything a job starts
    os.dup2(2, 1)                  # what a job prints goes to the log, never into the replies
    faulthandler.enable()          # a fatal signal leaves the job's Python stack in the log (the crash's detail)
    for spec in init:              # e.g. the scenario's fixes (gpulab.fixes:install_from_env)
        _function(spec)()
    base = Path(folder)
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            return 0               # the parent closed the pipe: done
        n = int(line)
        fn, args, kwargs = _load(base / f"job-{n}.pkl")
        call = _function(fn)       # its module loaded before the job's deadline starts
        os.write(reply, f"start {n}\n".encode())
        value = call(*args, **kwargs)
        _dump(base / f"res-{n}.pkl", value)
        os.write(reply, f"done {n}\n".encode())


if __name__ == "__main__":
    raise SystemExit(serve(sys.argv[1], sys.argv[2:]))
