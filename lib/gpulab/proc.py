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
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
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

ENV_VAR = "GPULAB_PROC"
EXIT_BAD_INPUT = 2
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
PR_SET_CHILD_SUBREAPER = 36
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_KILL_ROUNDS = 50
_SETTLE_S = 1.0        # how long a scan waits for environments that read empty (an exec in progress)
_PF_KTHREAD = 0x00200000  # /proc/<pid>/stat flags: a kernel thread (no environment, ever)
_YOUNG_S = 10.0       # an empty environment in a process started this recently may be an exec in progress
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
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
class ProcInfo:
    pid: int
    name: str
    cmdline: str

    def __str__(self) -> str:
        return f"{self.pid} {self.name}"


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


# ------------------------------------------------------------------------------------------ /proc scans

def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _stat(pid: int) -> tuple[str, int, int, int, int] | None:
    """(state, ppid, pgid, flags, start time in clock ticks after boot) of a process, or None when gone."""
    raw = _read(f"/proc/{pid}/stat")
    if not raw:
        return None
    try:
        fields = raw.rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[6]), int(fields[19])
    except (IndexError, ValueError):
        return None


def _ticks_now() -> float:
    """Clock ticks since boot (the unit of a process's start time in /proc/<pid>/stat)."""
    try:
        with open("/proc/uptime", "rb") as fh:
            return float(fh.read().split()[0]) * _CLK_TCK
    except (OSError, ValueError, IndexError):
        return float("inf")


def tokens_of(pid: int) -> tuple[str, ...]:
    """The gpulab tokens in a process's environment (as it was at exec)."""
    return _tokens(_read(f"/proc/{pid}/environ"))


def _tokens(environ: bytes) -> tuple[str, ...]:
    for item in environ.split(b"\0"):
        if item.startswith(ENV_VAR.encode() + b"="):
            return tuple(t for t in item.split(b"=", 1)[1].decode(errors="replace").split(":") if t)
    return ()


def _pids() -> list[int]:
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []


def info(pid: int) -> ProcInfo:
    name = _read(f"/proc/{pid}/comm").decode(errors="replace").strip()
    cmd = _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace").strip()
    return ProcInfo(pid, name or "?", cmd[:300])


def _scan(token: str, pgid: int | None, exclude: Sequence[int]) -> tuple[set[int], set[int]]:
    """(carriers of `token` or members of `pgid`, processes whose environment reads empty). The second are
    not yet known: a process in the middle of exec shows an empty environment until the kernel has set up
    its new image, and its parent's Popen has already returned by then (close-on-exec comes first)."""
    skip = {os.getpid(), *exclude}
    found, unsure = set(), set()
    young = _ticks_now() - _YOUNG_S * _CLK_TCK
    for pid in _pids():
        if pid in skip:
            continue
        st = _stat(pid)
        if st is None or st[0] in ("Z", "X") or st[3] & _PF_KTHREAD:
            continue
        if pgid is not None and st[2] == pgid:
            found.add(pid)
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read()
        except OSError:   # gone, or another user's
            continue
        if token in _tokens(env):
            found.add(pid)
        elif not env and st[4] >= young:   # an old process with no environment (init, env -i) is settled
            unsure.add(pid)
    return found, unsure


def marked(token: str, *, pgid: int | None = None, exclude: Sequence[int] = ()) -> set[int]:
    """Live (not zombie) processes carrying `token`, or in process group `pgid`."""
    return _scan(token, pgid, exclude)[0]


def alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def _reap(pids: Sequence[int]) -> None:
    """Collect the exit status of orphans that re-parented to us (we are their subreaper)."""
    me = os.getpid()
    for pid in pids:
        st = _stat(pid)
        if st is not None and st[1] == me and st[0] in ("Z", "X"):
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)


def end_marked(token: str, *, pgid: int | None = None, grace_s: float = 0.0, exclude: Sequence[int] = (),
               ) -> tuple[ProcInfo, ...]:
    """SIGTERM (when grace_s > 0), then SIGKILL every process carrying `token` (or in `pgid`), rescanning
    until none is left: a process that forks while being killed is caught on the next round. Returns the
    processes still alive after the last round (stuck in the kernel: uninterruptible sleep)."""
    seen: set[int] = set()
    if grace_s > 0:
        pids = marked(token, pgid=pgid, exclude=exclude)
        seen |= pids
        _signal_all(pids, pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            _reap(list(seen))
            pids = {p for p in pids if alive(p)}
    settle = time.monotonic() + _SETTLE_S
    for _ in range(_KILL_ROUNDS):
        pids, unsure = _scan(token, pgid, exclude)
        if not pids:
            if not unsure or time.monotonic() > settle:
                break
            time.sleep(0.02)   # an exec in progress: its environment (and token) shows in a moment
            continue
        seen |= pids
        _signal_all(pids, pgid, signal.SIGKILL)
        time.sleep(0.01)
        _reap(list(seen))
    _reap(list(seen))
    return tuple(info(p) for p in sorted(marked(token, pgid=pgid, exclude=exclude)))


def _signal_all(pids: set[int], pgid: int | None, sig: int) -> None:
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


# ------------------------------------------------------------------------------------------ the guard

_GUARD_CODE = r"""
import os, sys, time
token, fd, me = sys.argv[1], int(sys.argv[2]), os.getpid()
try:
    while os.read(fd, 4096):
        pass
except OSError:
    pass
tck = os.sysconf('SC_CLK_TCK')
def scan():
    out, unsure = [], []
    young = float(open('/proc/uptime').read().split()[0]) * tck - 10 * tck
    for n in os.listdir('/proc'):
        if not n.isdigit() or int(n) == me:
            continue
        try:
            st = open('/proc/%s/stat' % n, 'rb').read().rsplit(b')', 1)[1].split()
            if st[0] in (b'Z', b'X') or int(st[6]) & 0x00200000:
                continue
            started = int(st[19])
            env = open('/proc/%s/environ' % n, 'rb').read()
        except (OSError, IndexError, ValueError):
            continue
        if not env and started >= young:   # an exec in progress: its environment shows in a moment
            unsure.append(int(n))
        for item in env.split(b'\0'):
            if item.startswith(b'GPULAB_PROC=') and token in item[12:].decode(errors='replace').split(':'):
                out.append(int(n))
    return out, unsure
settle = time.monotonic() + 2.0
for _ in range(200):
    pids, unsure = scan()
    if not pids and (not unsure or time.monotonic() > settle):
        break
    for pid in pids:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    time.sleep(0.02)
"""


class _Guard:
    """This process's token, subreaper flag and guard sidecar, made once, on the first child started."""

    def __init__(self) -> None:
        self.token = f"p{os.getpid()}-{uuid.uuid4().hex[:10]}"
        self.pid: int | None = None
        self._popen: subprocess.Popen | None = None
        self._write_fd: int | None = None
        inherited = os.environ.get(ENV_VAR, "")
        os.environ[ENV_VAR] = ":".join([t for t in inherited.split(":") if t] + [self.token])
        _become_subreaper()
        env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
        r, w = os.pipe()
        try:
            self._popen = subprocess.Popen([sys.executable, "-I", "-S", "-c", _GUARD_CODE, self.token, str(r)],
                                           pass_fds=(r,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, env=env, start_new_session=True,
                                           close_fds=True)
            self.pid = self._popen.pid
            self._write_fd = w
            os.set_inheritable(w, False)
        except OSError:
            os.close(w)
        finally:
            os.close(r)
        atexit.register(self.close)

    def close(self) -> None:
        """End what this process started, then let the guard go (it finds nothing and exits)."""
        for child in list(_LIVE):
            with contextlib.suppress(Exception):
                child.stop()
        if self._write_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._write_fd)
            self._write_fd = None
        if self._popen is not None:
            try:
                self._popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._popen.kill()
                self._popen.wait()
            self._popen = None


_GUARD: _Guard | None = None
_GUARD_LOCK = threading.Lock()
_LIVE: "set[Child]" = set()  # started and not yet stopped (a forgotten child is still ended at exit)


def _become_subreaper() -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def guard() -> _Guard:
    global _GUARD
    with _GUARD_LOCK:
        if _GUARD is None or _GUARD.token not in os.environ.get(ENV_VAR, ""):
            _GUARD = _Guard()
        return _GUARD


def guard_pid() -> int | None:
    """The guard sidecar's pid (tests that look for leftover children leave it out)."""
    return _GUARD.pid if _GUARD is not None else None


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
