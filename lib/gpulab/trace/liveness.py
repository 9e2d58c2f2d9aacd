"""Whether a watched child is still making progress: the one rule the watchdog (gpulab.hang.watchdog.watch) and 02's
recordings (gpulab.trace.run) share, so that both call the same run a hang.

Progress, poll by poll:
- once the op log has a started op: newly completed records (host or GPU). An open op, or GPU work the
  host has run ahead of, advances only by completing, or while the heartbeat says the main thread works
  inside an import or a compilation (torch does both inside ops: a custom op's first call imports
  torch._dynamo, a compiled step compiles its backward inside the autograd node that runs it), or while the
  child's own child processes outside the job's followed ones burn CPU (the compiler that backward waits
  for);
- between ops (every started op completed, the GPU caught up), and before the first op or without an op
  log: the heartbeat (gpulab.beat: the main thread ran Python bytecode AND burnt CPU) when the child keeps
  one, plus the main-thread CPU of its child processes (a compiler or a worker the program waits for);
  without a heartbeat (not a Python program, or run as is), the main-thread CPU of the whole process tree.
  Main-thread CPU alone would call a host spinning in a driver call progress; bytecode alone a polling loop.
  So the child's own main-thread CPU without bytecode is weak progress: it holds off a hang for at most
  SPIN_WINDOWS stall windows (a long native computation outside ops, numpy's or cuInit's, is not a hang;
  a host spinning in a driver call is one, later);
- before the first op or without an op log, new output (stdout/stderr growing) too.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import psutil

from gpulab import beat, proc
from gpulab.trace.ring import progress as log_progress

POLL_S = 0.1
STALL_S = 30.0      # the default stall window: every command (watch, ladder, bisect, fixes, run) and notebook
                    # (`stall_s`) starts from it; above a usual step and checkpoint, below a user's patience
SPIN_WINDOWS = 4    # stall windows of weak progress only (CPU, no bytecode) before it is a hang
SPIN_SHARE = 0.2    # weak progress: the main thread busy at least this share of the time (a polling loop is ~1%)
STRONG, WEAK, NONE = 2, 1, 0
STATUSES = ("ok", "hang", "crash", "error", "timeout")


def main_thread_cpu(pid: int) -> float:
    """CPU seconds of a process's main thread: the thread that imports, loads libraries and inits CUDA.
    Helper threads (the recorder's sampler, BLAS pools) are left out: they tick on while the main one is stuck."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        try:
            t = psutil.Process(pid).cpu_times()
            return t.user + t.system
        except psutil.Error:
            return 0.0


# the system calls a process blocked reading its terminal sits in, by machine: read(0, ...); select/pselect6 over
# fd 0 alone (nfds 1: readline's wait for a key, pdb's); no others (a poll's fds cannot be read from outside)
_TERMINAL_READS = {"x86_64": {0: "fd", 23: "nfds", 270: "nfds"}, "aarch64": {63: "fd", 72: "nfds"}}


def reading_terminal(pid: int) -> bool:
    """Whether the process's main thread waits for a line from a terminal on its standard input (pdb's prompt,
    input()): a program paused for its user, not a hang. Linux only (/proc/PID/syscall); False where unknown."""
    calls = _TERMINAL_READS.get(os.uname().machine)
    try:
        if calls is None or not os.readlink(f"/proc/{pid}/fd/0").startswith(("/dev/pts/", "/dev/tty")):
            return False
        with open(f"/proc/{pid}/syscall") as fh:
            fields = fh.read().split()
    except OSError:
        return False
    if len(fields) < 2 or not fields[0].isdigit() or int(fields[0]) not in calls:
        return False
    arg = int(fields[1], 16)
    return arg == 0 if calls[int(fields[0])] == "fd" else arg == 1


_TREE: dict[str, Any] = {"at": -1.0, "kids": {}}   # the last scan of /proc's parent links, shared by every Progress


def descendants(pid: int, max_age_s: float = POLL_S / 2) -> list[int]:
    """pid's descendant processes, from one scan of /proc's parent links shared by the Progress objects of a poll
    (a job's processes are polled one after another within milliseconds).

    Why shared: psutil's children(recursive=True) reads every process's stat file on the machine; called per
    followed process and per poll (10 a second), it was most of a watchdog's own CPU on a busy host, and this
    kernel has no /proc/PID/task/TID/children to ask for the tree alone."""
    if time.monotonic() - _TREE["at"] > max_age_s:
        kids = proc.children_by_parent()
        _TREE["at"], _TREE["kids"] = time.monotonic(), kids
    kids, out, seen, todo = _TREE["kids"], [], {pid}, [pid]
    while todo:
        for child in kids.get(todo.pop(), ()):
            if child not in seen:   # a pid reused within the scan cannot make a cycle of it
                seen.add(child)
                out.append(child)
                todo.append(child)
    return out


class Progress:
    """Decides, poll by poll, whether the child advanced (the rules are in the module docstring).

    log: the op log when the child is recorded; beat: the heartbeat file the child may keep; outputs: its
    stdout/stderr files."""

    def __init__(self, pid: int, log: str | os.PathLike | None = None, beat_path: str | os.PathLike | None = None,
                 outputs: Sequence[str | os.PathLike] = ()):
        self.ps = psutil.Process(pid)
        self.log = Path(log) if log else None
        self.beat = Path(beat_path) if beat_path else None
        self.outputs = tuple(Path(p) for p in outputs)
        self.last_ops: Any = None
        self.last_size = -1
        self.last_beat: bytes | None = None
        self.cpu_prev = {"tree": 0.0, "children": 0.0}
        self.own = (time.monotonic(), 0.0)   # (when, main-thread CPU) at the last poll
        self.followed: frozenset[int] = frozenset()   # processes of a job judged by their own Progress

    def _cpu_grew(self, which: str) -> bool:
        """Did the main threads of the tree (or of the child's children only) burn CPU since the last poll?
        A followed process of the job is left out: its own beat and op log say whether it progresses."""
        pids = descendants(self.ps.pid) + ([self.ps.pid] if which == "tree" else [])
        cpu = sum(main_thread_cpu(pid) for pid in pids if pid not in self.followed)
        grew, self.cpu_prev[which] = cpu > self.cpu_prev[which], cpu
        return grew

    def _counters(self) -> tuple[int, int, int] | None:
        """(started, completed, gpu_completed or -1 outside gpu mode) from the log header, or None."""
        if self.log is None or not self.log.exists():
            return None
        try:
            p = log_progress(self.log)
        except Exception:  # a header being created; try again next poll
            return None
        return p.started, p.completed, -1 if p.gpu_completed is None else p.gpu_completed

    def _python_progress(self) -> tuple[int, bool]:
        """Outside any op: the heartbeat (or, without one, main-thread CPU); the child's own main-thread CPU
        without bytecode is WEAK. And whether an open op advances otherwise than by completing: a beat while
        the main thread loaded code (an import, a compilation), or CPU in the child's own child processes (a
        compiler the op waits for: a compiled step's lazy backward runs g++ from inside its autograd node)."""
        record = beat.read(self.beat) if self.beat is not None else None
        if record is None:
            return (STRONG if self._cpu_grew("tree") else NONE), False
        last, self.last_beat = self.last_beat, record
        loading = last is not None and beat.loads(record) != beat.loads(last)
        children = self._cpu_grew("children")
        return (STRONG if children or record != last else WEAK if self._busy() else NONE), loading or children

    def _busy(self) -> bool:
        """The child's own main thread burnt CPU for at least SPIN_SHARE of the time since the last poll: a
        computation or a spin, not a loop that wakes now and then (a launcher polling its workers)."""
        now, cpu = time.monotonic(), main_thread_cpu(self.ps.pid)
        (then, before), self.own = self.own, (now, cpu)
        return cpu - before >= SPIN_SHARE * (now - then)

    def advanced(self) -> int:
        """STRONG, WEAK or NONE progress since the last poll. Ops that completed settle it: the beat and the CPU of
        the process tree are read only when they do not (a running job's usual poll reads one log header)."""
        counters = self._counters()
        if counters is not None and counters[0] > 0:
            started, completed, gpu_done = counters
            advanced = (completed, gpu_done) != self.last_ops   # newly completed records (host or GPU)
            self.last_ops = (completed, gpu_done)
            if advanced:
                return STRONG
            idle, working = self._python_progress()
            between_ops = started == completed and (gpu_done < 0 or gpu_done >= completed)
            return STRONG if working else idle if between_ops else NONE
        idle, _ = self._python_progress()
        size = sum(p.stat().st_size for p in self.outputs if p.exists())
        grew, self.last_size = size != self.last_size, size
        return STRONG if grew else idle


class JobProgress:
    """A job of several processes (ranks, DataLoader workers, subprocesses) followed into one folder
    (gpulab.trace.follow): each process is judged by the rule above over its own beat and op log, and the
    job advances when any of its processes does, except a launcher or supervisor of running ranks (torchrun's
    agent, mp.spawn's parent, a shell wrapper): its monitor loop, its CPU and the output the ranks write
    through it are not the ranks' progress. `last[pid]` is when each was last seen advancing."""

    def __init__(self, root: Progress, folder: str | os.PathLike):
        from gpulab.trace import follow   # the recorder's side of the folder; no torch

        self.root, self.folder, self._follow = root, Path(folder), follow
        self.procs: dict[int, Progress] = {}
        self.metas: dict[int, dict] = {}
        self.seen: set[int] = set()   # every <pid>.json read once (the root's and those that ended too)
        self.last: dict[int, float] = {}
        self.supervisors: set[int] = set()
        self._ranks_pending: set[int] = set()   # followed processes not yet known as ranks (mp.spawn: until init)
        self._polls = 0

    def _discover(self) -> None:
        new = self._follow.metas(self.folder, skip=self.seen)
        # a process learns its rank after it announced itself (init_process_group): read those again, now and then
        self._polls += 1
        again = (self._follow.metas(self.folder, skip=set(self.seen) - self._ranks_pending)
                 if self._ranks_pending and self._polls % 5 == 0 else {})
        for pid, meta in again.items():
            self.metas[pid] = meta
            if self._follow.is_rank(meta):
                self._ranks_pending.discard(pid)
        for pid, meta in new.items():
            self.seen.add(pid)
            self.metas[pid] = meta
            if meta.get("root") or pid == self.root.ps.pid:
                continue
            if not self._follow.is_rank(meta) and not self._follow.is_launcher(meta):
                self._ranks_pending.add(pid)
            try:
                self.procs[pid] = Progress(pid, self.folder / meta["log"] if meta.get("log") else None,
                                           self.folder / meta["beat"] if meta.get("beat") else None)
            except (psutil.Error, KeyError):
                continue   # it ended before it was seen
        if new or again:
            self.supervisors = self._follow.supervisors(self.metas, self.root.ps.pid, self._alive, _parent)
        if not new:
            return
        followed = frozenset(self.procs)
        for p in (self.root, *self.procs.values()):
            p.followed = followed

    def forget(self, pid: int) -> None:
        """An ended process whose files went (the watchdog keeps only the latest few): nothing of it is kept, so
        a job that starts DataLoader workers every epoch for days costs no more memory, nor time per poll."""
        for held in (self.procs, self.metas, self.last):
            held.pop(pid, None)
        for held in (self.seen, self._ranks_pending, self.supervisors):
            held.discard(pid)

    def _alive(self, pid: int) -> bool:
        p = self.procs.get(pid)
        try:
            return p is not None and p.ps.is_running() and p.ps.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def advanced(self) -> int:
        self._discover()
        if self.supervisors and not any(self._alive(pid) for pid, m in self.metas.items()
                                        if self._follow.is_rank(m)):
            self.supervisors = set()   # the ranks ended: the launcher's own work (a restart) is the job's again
        now, best = time.monotonic(), NONE
        for pid, p in ((self.root.ps.pid, self.root), *self.procs.items()):
            level = p.advanced()
            if level:
                self.last[pid] = now
            if pid not in self.supervisors:
                best = max(best, level)
        return best


def _parent(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return None


def wait(child: proc.Child, progress: Progress, *, stall_s: float | None, timeout_s: float | None, t0: float,
         poll_s: float = POLL_S, each_poll: Callable[[float], None] | None = None,
         cancel: threading.Event | None = None) -> tuple[str | None, float | None]:
    """The stall rule, the one place it is written (02's recordings and the watchdog both call it): poll until
    the child ends (None, None), makes no progress for stall_s, or only weak progress for SPIN_WINDOWS x
    stall_s ('hang', seconds from t0 to the last strong progress), or runs past timeout_s ('timeout', None).
    stall_s None: no stall detection; timeout_s None: no deadline. each_poll(monotonic time of the last
    progress) runs between polls, so a caller serves its own duties there (the watchdog's status file, the job
    folder's bounds, a signal). `cancel`, once set: ('cancelled', None), the caller no longer wants the run."""
    last = strong = t0
    while child.poll() is None:
        if cancel is not None and cancel.is_set():
            return "cancelled", None
        now = time.monotonic()
        level = progress.advanced()
        if level:
            last = now
        if level == STRONG:
            strong = now
        if each_poll is not None:
            each_poll(last)
        if stall_s is not None and (now - last > stall_s or now - strong > SPIN_WINDOWS * stall_s):
            return "hang", strong - t0
        if timeout_s is not None and now - t0 > timeout_s:
            return "timeout", None
        time.sleep(poll_s)
    return None, None


@dataclass(frozen=True)
class End:
    """How a child run under `run` ended."""
    status: str                  # ok | hang | crash | error | timeout | cancelled (liveness.run's `cancel`)
    returncode: int | None       # None when it was stopped (hang or timeout)
    elapsed_s: float
    last_progress_s: float | None = None   # for a hang: when progress was last seen, from the start

    @property
    def timed_out(self) -> bool:
        return self.status == "timeout"

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None


def status_of(returncode: int | None) -> str:
    return "ok" if returncode == 0 else ("crash" if returncode is not None and returncode < 0 else "error")


def run(argv: Sequence[str], *, timeout_s: float, stall_s: float | None = None, log: str | os.PathLike | None = None,
        beat_path: str | os.PathLike | None = None, env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike | None = None, stdout: Any = None, stderr: Any = None,
        label: str | None = None, follow: str | os.PathLike | None = None,
        cancel: threading.Event | None = None) -> End:
    """Run a gpulab.proc child to its end, its deadline, or (stall_s) its first stall; then end everything
    it started. With beat_path the child is asked (through $GPULAB_BEAT) to keep a heartbeat there. follow:
    the job folder where the recorded child's processes announce themselves (gpulab.trace.follow); each is
    then judged by its own beat and op log (JobProgress), so a rank spinning in a CUDA sync is no progress
    of its launcher. `cancel`: an Event another thread sets when the run's result is no longer wanted (it is
    then stopped as a stalled one is, status 'cancelled')."""
    if not timeout_s > 0 or (stall_s is not None and not stall_s > 0):
        raise ValueError(f"timeout_s={timeout_s!r} and stall_s={stall_s!r} must be > 0")
    env = dict(os.environ if env is None else env)
    if beat_path is not None:
        Path(beat_path).unlink(missing_ok=True)   # a beat file from an earlier run is no heartbeat of this one
        env[beat.ENV] = str(beat_path)
    outputs = [p for p in (stdout, stderr) if isinstance(p, (str, os.PathLike))]
    t0 = time.monotonic()
    with proc.Child(argv, env=env, cwd=cwd, stdout=stdout, stderr=stderr, label=label) as child:
        tracker: Any = Progress(child.pid, log, beat_path, outputs)
        if follow is not None:
            tracker = JobProgress(tracker, follow)
        stopped, last = wait(child, tracker, stall_s=stall_s, timeout_s=timeout_s, t0=t0, cancel=cancel)
        child.stop()
    rc = None if stopped else child.returncode
    return End(stopped or status_of(rc), rc, time.monotonic() - t0, last)
