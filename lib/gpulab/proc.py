"""Child processes that cannot outlive their run: the one way gpulab starts a process.

Every child (a papermill notebook, a watched program, a probe, a benchmark, py-spy or gdb) starts in its
own session and process group, writes its output to files (a pipe can block a chatty child), and carries
a token in its environment (`GPULAB_PROC`). A token is inherited by everything the child starts, even a
daemon that calls setsid or double-forks, so `Child.stop()` finds and ends the whole tree by scanning
/proc for it, beside the process group and the live descendants. Three more nets catch what slips
through:

- the supervising process is a child subreaper (`prctl(PR_SET_CHILD_SUBREAPER)`, as tini does), so
  orphans re-parent to it instead of to init and can be reaped;
- a guard sidecar per supervising process holds the read end of a pipe; when the supervisor dies in any
  way (SIGKILL included), the pipe closes and the guard ends every process carrying the supervisor's
  token;
- `session()` turns SIGINT, SIGTERM and SIGHUP into `Interrupted`, so a command stops its children,
  writes what it finished and exits 128+signal.

This module holds the children and the sessions; the /proc scans live in `gpulab.proctree` and the
subreaper and guard in `gpulab.procguard`. Callers use this module only: it re-exports what they need of
those two (`proc.end_marked`, `proc.guard_pid`, ...). A re-exported constant is a copy: to change what the
scans read (`_SETTLE_S`), patch it on `gpulab.proctree`.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator, Mapping, Sequence

# Re-exported (noqa: F401): callers and tests name these as proc.guard_pid, proc.end_marked, proc._scan, ...
from gpulab.procguard import _LIVE, PR_SET_CHILD_SUBREAPER, _become_subreaper, guard, guard_pid  # noqa: F401
from gpulab.proctree import (  # noqa: F401
    _SETTLE_S, _YOUNG_S, ENV_VAR, ProcInfo, _scan, alive, children_by_parent, end_marked, info, marked, tokens_of)

EXIT_BAD_INPUT = 2
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
LIB_DIR = str(Path(__file__).resolve().parents[1])   # the folder holding this gpulab package


def python_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """env (default: this process's) with this gpulab first on PYTHONPATH, so that a Python child imports this
    very gpulab, whatever its PYTHONPATH said and whichever interpreter it is (a fix's patched-torch venv)."""
    out = dict(os.environ if env is None else env)
    out["PYTHONPATH"] = os.pathsep.join([LIB_DIR, *[p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]])
    return out


class CommandNotFound(FileNotFoundError):
    """The program to start does not exist (exit 127, as a shell says)."""

    def __init__(self, program: str):
        super().__init__(f"command not found: {program!r} (not on PATH and not a file)")
        self.program = program


class NotExecutable(PermissionError):
    """The program exists but cannot be executed (exit 126, as a shell says)."""

    def __init__(self, program: str, why: str):
        super().__init__(f"cannot execute {program!r}: {why}")
        self.program = program


class Interrupted(BaseException):
    """SIGINT/SIGTERM/SIGHUP arrived. A BaseException, so no `except Exception` swallows it on its way up."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return f"interrupted by {self.name}"


@dataclass(frozen=True)
class Result:
    """How a bounded child ended."""
    argv: tuple[str, ...]
    returncode: int | None           # None when it was stopped (deadline or interrupt) before it ended
    timed_out: bool
    elapsed_s: float
    stdout: str = ""                 # the text, when run(capture=True)
    stderr: str = ""
    left_running: tuple[ProcInfo, ...] = ()  # processes of the child alive after it ended by itself (then ended)
    unkillable: tuple[ProcInfo, ...] = ()    # still alive after SIGKILL (a process stuck in the kernel)

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None

    @property
    def status(self) -> str:
        """ok | error (non-zero exit) | crash (killed by a signal) | timeout (stopped at the deadline)."""
        if self.timed_out or self.returncode is None:
            return "timeout"
        return "ok" if self.returncode == 0 else ("crash" if self.returncode < 0 else "error")

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# ------------------------------------------------------------------------------------------ children

def _open_out(target: Any, owned: list[IO]) -> Any:
    if target is None:
        return subprocess.DEVNULL
    if isinstance(target, (str, os.PathLike)):
        fh = open(target, "wb")
        owned.append(fh)
        return fh
    return target  # an open file, subprocess.STDOUT or DEVNULL


class Child:
    """A started child process and everything it starts. Use as a context manager, or call stop()."""

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                 cwd: str | os.PathLike | None = None, stdout: Any = None, stderr: Any = None,
                 stdin: Any = None, label: str | None = None):
        self.argv = tuple(str(a) for a in argv)
        if not self.argv:
            raise ValueError("empty command: nothing to start")
        self.label = label or os.path.basename(self.argv[0])
        self.token = f"c{uuid.uuid4().hex[:12]}"
        g = guard()
        base = dict(os.environ if env is None else env)
        inherited = [t for t in base.get(ENV_VAR, "").split(":") if t]
        if g.token not in inherited:
            inherited.append(g.token)
        base[ENV_VAR] = ":".join(inherited + [self.token])
        self._owned: list[IO] = []
        out = _open_out(stdout, self._owned)
        err = _open_out(stderr, self._owned)
        self.started = time.monotonic()
        try:
            self._popen = subprocess.Popen(
                list(self.argv), stdin=subprocess.DEVNULL if stdin is None else stdin, stdout=out, stderr=err,
                env=base, cwd=None if cwd is None else str(cwd), start_new_session=True, close_fds=True)
        except FileNotFoundError as exc:
            self._close_files()
            missing = exc.filename if exc.filename else self.argv[0]
            if cwd is not None and not Path(cwd).is_dir():
                raise FileNotFoundError(f"working folder {str(cwd)!r} does not exist") from None
            raise CommandNotFound(str(missing)) from None
        except PermissionError as exc:
            self._close_files()
            raise NotExecutable(self.argv[0], exc.strerror or str(exc)) from None
        except BaseException:
            self._close_files()
            raise
        self.pid = self._popen.pid
        self.stdin = self._popen.stdin     # a pipe only when stdin=subprocess.PIPE was asked for
        self.left_running: tuple[ProcInfo, ...] = ()
        self.unkillable: tuple[ProcInfo, ...] = ()
        self._stopped = False
        _LIVE.add(self)

    # -- state
    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def poll(self) -> int | None:
        return self._popen.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code, or None when it is still running after `timeout` seconds."""
        try:
            return self._popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def members(self) -> set[int]:
        """Every live process of this child: its group, its token carriers (setsid and double-fork
        included) and the leader itself while it runs."""
        pids = marked(self.token, pgid=self.pid, exclude=_guard_pids())
        if self._popen.poll() is None:
            pids.add(self.pid)
        return pids

    def descendants(self) -> list[ProcInfo]:
        return [info(p) for p in sorted(self.members() - {self.pid})]

    # -- ending
    def stop(self, grace_s: float = 0.0) -> tuple[ProcInfo, ...]:
        """End the child and every process of it; idempotent. When the leader had already ended by
        itself, what was still running is kept in `left_running` (and ended). Returns `left_running`."""
        if self._stopped:
            return self.left_running
        self._stopped = True
        try:
            if self._popen.poll() is not None:
                self.left_running = tuple(info(p) for p in sorted(
                    marked(self.token, pgid=self.pid, exclude=_guard_pids())))
            if grace_s > 0 and self._popen.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, signal.SIGTERM)
            self.unkillable = end_marked(self.token, pgid=self.pid, grace_s=grace_s, exclude=_guard_pids())
            with contextlib.suppress(ProcessLookupError, PermissionError):
                self._popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout=10)
        finally:
            self._close_files()
            _LIVE.discard(self)
        return self.left_running

    def _close_files(self) -> None:
        for fh in self._owned:
            with contextlib.suppress(OSError):
                fh.close()
        self._owned = []

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<Child {self.label} pid={self.pid} rc={self._popen.returncode}>"


def _guard_pids() -> tuple[int, ...]:
    return tuple(p for p in (guard_pid(),) if p)


def spawn(argv: Sequence[str], **kw: Any) -> Child:
    """Start a child (see Child); the caller must stop() it or use it in a `with` block."""
    return Child(argv, **kw)


def run(argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike | None = None, stdout: Any = None, stderr: Any = None, capture: bool = False,
        grace_s: float = 0.0, label: str | None = None) -> Result:
    """Run a child to its end or its deadline, then end everything it left. With capture=True its output
    goes to temporary files that are read back into the Result (never a pipe)."""
    if not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s!r} must be > 0")
    tmp = None
    if capture:
        tmp = tempfile.TemporaryDirectory(prefix="gpulab-run-")
        stdout, stderr = Path(tmp.name) / "out", Path(tmp.name) / "err"
    try:
        with Child(argv, env=env, cwd=cwd, stdout=stdout, stderr=stderr, label=label) as child:
            rc = child.wait(timeout_s)
            timed_out = rc is None
            child.stop(grace_s=grace_s if timed_out else 0.0)
        out = err = ""
        if tmp is not None:
            out = (Path(tmp.name) / "out").read_bytes().decode("utf-8", "replace")
            err = (Path(tmp.name) / "err").read_bytes().decode("utf-8", "replace")
        return Result(child.argv, None if timed_out else rc, timed_out, time.monotonic() - child.started, out, err,
                      child.left_running if not timed_out else (), child.unkillable)
    finally:
        if tmp is not None:
            tmp.cleanup()


def stop_all(grace_s: float = 0.0) -> None:
    """End every child this process started that is still live (an interrupt's first act)."""
    for child in list(_LIVE):
        with contextlib.suppress(Exception):
            child.stop(grace_s=grace_s)


# ------------------------------------------------------------------------------------------ sessions

class Session:
    """A command's lifetime (see `session`). `interrupted` holds the first signal's number."""

    def __init__(self, name: str):
        self.name = name
        self.interrupted: int | None = None
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.interrupted is None:
            self.interrupted = signum
            raise Interrupted(signum)
        # a second signal while we clean up: the cleanup is short and bounded; finish it

    def shield(self) -> contextlib.AbstractContextManager:
        """Block the interrupt while a short critical step (writing the index) completes."""
        return _Shield(self)


class _Shield:
    def __init__(self, s: Session):
        self.s = s
        self.pending: int | None = None

    def __enter__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self.saved = {sig: signal.getsignal(sig) for sig in HANDLED_SIGNALS}
        for sig in HANDLED_SIGNALS:
            signal.signal(sig, self._defer)

    def _defer(self, signum: int, frame: Any) -> None:
        if self.pending is None:
            self.pending = signum

    def __exit__(self, *exc: Any) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, h in self.saved.items():
            signal.signal(sig, h)
        if self.pending is not None:
            self.s._handler(self.pending, None)


@contextlib.contextmanager
def session(name: str) -> Iterator[Session]:
    """Run a long command: SIGINT/SIGTERM/SIGHUP raise Interrupted in the main thread (the command writes
    what it finished and re-raises), and on the way out every child is ended, however the command ends."""
    s = Session(name)
    guard()
    main = threading.current_thread() is threading.main_thread()
    if main:
        for sig in HANDLED_SIGNALS:
            s._old[sig] = signal.getsignal(sig)
            signal.signal(sig, s._handler)
    try:
        yield s
    finally:
        if main:
            for sig in HANDLED_SIGNALS:  # no second Interrupted in the middle of the cleanup
                signal.signal(sig, lambda *_: None)
        try:
            stop_all(grace_s=0.5 if s.interrupted else 0.0)
        finally:
            if main:
                for sig, old in s._old.items():
                    signal.signal(sig, old)


def main_guarded(name: str, body: Any, *args: Any) -> int:
    """Run `body(session, *args)` in a session; an interrupt becomes one line on stderr and 128+signal."""
    try:
        with session(name) as s:
            return body(s, *args)
    except Interrupted as exc:
        print(f"{name}: {exc}; every child process was stopped", file=sys.stderr, flush=True)
        return exc.exit_code
