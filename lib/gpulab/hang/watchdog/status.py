"""A watched job's live status: `OUT/status.json` rewritten every few seconds, and a line on stderr every few
minutes, so a job that runs for days can be looked at without stopping it.

Per process: its role, ops per second since the last sample, when it last progressed, its resident memory
and the allocator's figure from its op log, and the work in flight (ops the host started and has not
finished, ops whose GPU work has not completed). Read from the op logs' first pages (gpulab.trace.ring) and
/proc only: cheap enough to run beside the watchdog's own polling. `rows` and `line` are pure.
"""
from __future__ import annotations

import os
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from gpulab.report import write_json

EVERY_S = 5.0           # status.json
SAY_EVERY_S = 300.0     # the stderr line (0: never)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class Sample:
    """One process at one moment."""
    pid: int
    role: str
    t: float                          # monotonic
    alive: bool
    started: int = 0                  # ops the host started
    completed: int = 0                # ops the host finished
    gpu_completed: int | None = None  # ops known complete on the GPU (None: not tracked)
    rss: int | None = None            # resident bytes (None: gone)
    mem_allocated: int | None = None  # the op log's last memory sample (the CUDA allocator on a GPU; RSS on a CPU)
    mem_reserved: int | None = None
    device: str | None = None


@dataclass(frozen=True)
class State:
    """What the watchdog itself knows, handed to the writer."""
    phase: str = "running"            # running | stalled | capturing | stopping | ended
    t0: float = field(default_factory=time.monotonic)                # when the job started (monotonic)
    last: float | None = None                                         # when the job last progressed
    last_by_pid: Mapping[int, float] = field(default_factory=dict)   # when each process last progressed
    stalls: int = 0
    recovered: int = 0
    note: str = ""


def rows(before: Mapping[int, Sample], now: Mapping[int, Sample], last_by_pid: Mapping[int, float]) -> list[dict]:
    """One row per process: rates from two samples of the same process."""
    out = []
    for pid, s in sorted(now.items()):
        b = before.get(pid)
        dt = s.t - b.t if b is not None else 0.0
        rate = round((s.completed - b.completed) / dt, 2) if b is not None and dt > 0 else None
        out.append({
            "pid": pid, "role": s.role, "alive": s.alive, "ops_completed": s.completed, "ops_per_s": rate,
            "last_progress_s": round(last_by_pid[pid], 1) if pid in last_by_pid else None,
            "rss_mb": round(s.rss / 2**20, 1) if s.rss is not None else None,
            "mem_allocated_mb": round(s.mem_allocated / 2**20, 1) if s.mem_allocated is not None else None,
            "mem_reserved_mb": round(s.mem_reserved / 2**20, 1) if s.mem_reserved is not None else None,
            "device": s.device,
            "host_open_ops": max(0, s.started - s.completed),
            "gpu_pending_ops": (max(0, s.completed - s.gpu_completed) if s.gpu_completed is not None else None),
        })
    return out


def line(state: State, table: Sequence[Mapping[str, Any]], now: float) -> str:
    """The stderr line: the job in one glance."""
    live = [r for r in table if r["alive"]]
    rate = sum(r["ops_per_s"] or 0 for r in live)
    rss = sum(r["rss_mb"] or 0 for r in live)
    busy = [r for r in live if r["host_open_ops"] or r["gpu_pending_ops"]]
    last = f", last progress {now - state.last:.0f} s ago" if state.last is not None else ""
    stalls = f", {state.stalls} stall(s) ({state.recovered} recovered)" if state.stalls else ""
    return (f"{state.phase} {(now - state.t0) / 60:.1f} min: {len(live)} process(es), {rate:.0f} ops/s, "
            f"{rss:.0f} MB resident{last}{stalls}"
            + (f"; work in flight in {', '.join(r['role'] for r in busy[:4])}" if busy else ""))


# ------------------------------------------------------------------------------------ reading

def _rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _log_sample(path: Path) -> dict:
    """Counters, GPU progress and the last memory sample from an op log's first pages."""
    from gpulab.trace import ring   # the recorder's file format; no torch

    try:
        p = ring.progress(path)
        fd = os.open(path, os.O_RDONLY)
        try:
            head = os.pread(fd, ring.HEADER_SIZE, 0)
            lay, static = ring._header(head, path)
            memcount = ring._COUNTERS.unpack_from(head, ring.COUNTERS_OFF)[4]
            mem = None
            if memcount > 0:
                raw = os.pread(fd, ring.MEM_SIZE, lay.mem_off + ((memcount - 1) % lay.mem_capacity) * ring.MEM_SIZE)
                if len(raw) == ring.MEM_SIZE:
                    mem = ring._MEM.unpack(raw)
        finally:
            os.close(fd)
    except (OSError, ValueError, struct.error):
        return {}
    out = {"started": p.started, "completed": p.completed, "gpu_completed": p.gpu_completed,
           "device": ring._cstr(static[9]) or None}
    if mem is not None and mem[0] > 0:
        out["mem_allocated"], out["mem_reserved"] = mem[2], (mem[3] if mem[3] >= 0 else None)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def sample(procs: Mapping[int, tuple[str, Path | None]]) -> dict[int, Sample]:
    """pid -> (role, op log or None) -> each process's Sample now."""
    now = time.monotonic()
    out = {}
    for pid, (role, log) in procs.items():
        alive = _alive(pid)
        got = _log_sample(log) if log is not None and log.exists() else {}
        out[pid] = Sample(pid, role, now, alive, rss=_rss(pid) if alive else None, **got)
    return out


def job_processes(root_pid: int, root_log: Path | None, folder: Path | None, limit: int = 64
                  ) -> dict[int, tuple[str, Path | None]]:
    """The job's processes: the one the watchdog started and those that announced themselves in the job
    folder (gpulab.trace.follow); at most `limit`, the live ones first."""
    from gpulab.hang.jobs import jobread   # roles, as the verdict names them
    from gpulab.trace import follow

    out: dict[int, tuple[str, Path | None]] = {root_pid: ("main", root_log)}
    metas = follow.metas(folder) if folder is not None and folder.is_dir() else {}
    for pid, meta in sorted(metas.items(), key=lambda kv: (not _alive(kv[0]), kv[0])):
        if len(out) >= limit:
            break
        role, _ = jobread.role_of(meta, metas)
        if meta.get("root") or pid == root_pid:
            out[root_pid] = (role, root_log)
            continue
        out[pid] = (role, folder / meta["log"] if meta.get("log") else None)
    return out


class Writer:
    """A thread that rewrites OUT/status.json every `every_s` seconds (and says a line every `say_every_s`)
    from the watchdog's State and the processes' own files; `stop()` writes the last one."""

    def __init__(self, out: Path, processes: Callable[[], Mapping[int, tuple[str, Path | None]]],
                 say: Callable[[str], None], every_s: float = EVERY_S, say_every_s: float = SAY_EVERY_S):
        if not every_s > 0 or say_every_s < 0:
            raise ValueError(f"every_s={every_s!r} must be > 0 and say_every_s={say_every_s!r} >= 0")
        self.path, self.processes, self.say = Path(out) / "status.json", processes, say
        self.every_s, self.say_every_s = every_s, say_every_s
        self.state = State()
        self._before: dict[int, Sample] = {}
        self._said = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="gpulab-status", daemon=True)

    def start(self) -> "Writer":
        self._thread.start()
        return self

    def update(self, state: State, now: bool = False) -> None:
        self.state = state
        if now:
            self.write()

    def write(self) -> dict:
        with self._lock:
            samples = sample(self.processes())
            st, now = self.state, time.monotonic()
            table = rows(self._before, samples, {pid: now - t for pid, t in st.last_by_pid.items()})
            self._before = samples
            doc = {"phase": st.phase, "elapsed_s": round(now - st.t0, 1), "written": time.time(),
                   "last_progress_s": None if st.last is None else round(now - st.last, 1),
                   "stalls": st.stalls, "recovered": st.recovered, "note": st.note, "processes": table}
            try:
                write_json(self.path, doc)
            except OSError:
                pass   # a full disk must not stop the watching
            if self.say_every_s and time.monotonic() - self._said >= self.say_every_s:
                self._said = time.monotonic()
                self.say(line(st, table, now))
            return doc

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.write()
            except Exception:  # noqa: BLE001 - the status is a window on the job, never a reason to stop it
                continue

    def stop(self, state: State | None = None) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        if state is not None:
            self.state = state
        self.write()
