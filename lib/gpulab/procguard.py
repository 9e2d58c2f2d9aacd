"""What ends a supervisor's children when the supervisor itself dies without cleaning up (SIGKILL included).

A handler or atexit never runs after SIGKILL, so two nets live outside the supervising process's code:
it becomes a child subreaper (`prctl(PR_SET_CHILD_SUBREAPER)`, as tini does), so orphans re-parent to it
instead of to init and can be reaped; and a guard sidecar holds the read end of a pipe, so when the
supervisor dies in any way the pipe closes and the guard ends every process carrying the supervisor's
token. `gpulab.proc` makes the guard on its first child and re-exports `guard` and `guard_pid`.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import subprocess
import sys
import threading
import uuid
from typing import Any

from gpulab.proctree import ENV_VAR

PR_SET_CHILD_SUBREAPER = 36

# The sidecar runs as `python -I -S -c _GUARD_CODE token fd` (isolated, no site, no PYTHONPATH): gpulab is
# not importable there, so it repeats gpulab.proctree's scan in a few lines of its own.
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
_LIVE: set[Any] = set()  # gpulab.proc Children started and not yet stopped (a forgotten one is still
                         # ended at exit); proc adds and discards them, the guard's close() ends them


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
