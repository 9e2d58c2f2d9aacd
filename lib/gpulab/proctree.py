"""Which processes carry a token, and ending them all: the /proc scans behind `gpulab.proc`.

A token in a process's environment (`GPULAB_PROC`) is inherited by everything it starts, a daemon that
calls setsid or double-forks included, so scanning /proc for it finds a whole tree that a process group
or a parent link would miss. `gpulab.proc` stops its children with these scans; callers use them through
`gpulab.proc` (the one module that starts and ends processes), which re-exports them.
"""
from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from typing import Sequence

ENV_VAR = "GPULAB_PROC"
_KILL_ROUNDS = 50
_SETTLE_S = 1.0        # how long a scan waits for environments that read empty (an exec in progress)
_PF_KTHREAD = 0x00200000  # /proc/<pid>/stat flags: a kernel thread (no environment, ever)
_YOUNG_S = 10.0       # an empty environment in a process started this recently may be an exec in progress
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    name: str
    cmdline: str

    def __str__(self) -> str:
        return f"{self.pid} {self.name}"


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


def children_by_parent() -> dict[int, list[int]]:
    """Every process's children, from one pass over /proc's parent links (a tree walk per process reads every
    process's stat file each time)."""
    kids: dict[int, list[int]] = {}
    for pid in _pids():
        st = _stat(pid)
        if st is not None:
            kids.setdefault(st[1], []).append(pid)
    return kids


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


def _reap(pids: Sequence[int], pgid: int | None = None) -> None:
    """Collect the exit status of orphans that re-parented to us (we are their subreaper): those in `pids`,
    and every one of process group `pgid` but its leader (whose status is its Popen's). A zombie keeps its
    group, so this finds the orphans no scan saw alive: ranks that ended by themselves before their launcher
    was killed, left as zombies in a long-lived process (a notebook kernel, a test worker) otherwise."""
    me, given = os.getpid(), set(pids)
    for pid in given | (set(_pids()) if pgid is not None else set()):
        st = _stat(pid)
        if (st is not None and st[1] == me and st[0] in ("Z", "X") and pid != pgid
                and (pid in given or st[2] == pgid)):
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
    _reap(list(seen), pgid)
    return tuple(info(p) for p in sorted(marked(token, pgid=pgid, exclude=exclude)))


def _signal_all(pids: set[int], pgid: int | None, sig: int) -> None:
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
