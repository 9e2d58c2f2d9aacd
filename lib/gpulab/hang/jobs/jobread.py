"""A job's folder (gpulab.trace.follow: each process's <pid>.json, op log, beat, faulthandler file) -> the
per-process views gpulab.hang.jobs.job judges; and the capture of every live process of the job on a stall.

File and process handling only; the judgement is gpulab.hang.jobs.job's."""
from __future__ import annotations

import json
import os
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import psutil

from gpulab import trace
from gpulab.hang import capture, classify
from gpulab.hang.jobs.jobcalls import _family, collectives_of, shapes_text
from gpulab.hang.jobs.jobfacts import ProcessView
from gpulab.hang.jobs.jobframes import (_FRAME, _LINE, _callers, _known_paths, _line, _line_ops, _origin, _site_of_frame,
                                   _spans, main_frame)
# split out by concern (a process's collectives: jobcalls; its main frame and source: jobframes); callers and
# tests import these from here
from gpulab.hang.jobs.jobframes import MainFrame, loop_of, source_line  # noqa: F401
from gpulab.trace.analysis import localize
from gpulab.trace import collectives, follow

LAUNCHERS = follow.LAUNCHERS
HELPERS = {"multiprocessing.resource_tracker": "multiprocessing resource tracker",
           "multiprocessing.forkserver": "multiprocessing fork server"}
_LOADER_WAITS = ("_try_get_data ", "_get_data ", "_next_data ")
_QUEUE_FRAMES = ("_try_get_data", "_get_data", "_next_data", "queues.py", "connection.py", "queue.py")


# ------------------------------------------------------------------------------------ capture

def live(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def capture_python(folder: Path, metas: Mapping[int, dict], timeout_s: float = 2.0,
                   paused: bool = False) -> dict[int, capture.Capture]:
    """Every live followed process's Python stacks at once (its faulthandler on SIGUSR1, or py-spy first when
    `paused`: capture.python_stacks; in parallel, so the job costs one process's time, not the sum)."""
    todo = {pid: folder / m["faulthandler"] for pid, m in metas.items()
            if m.get("faulthandler") and not m.get("root") and live(pid)}
    if not todo:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(todo))) as ex:
        futs = {pid: ex.submit(capture.python_stacks, pid, fh, timeout_s, paused=paused) for pid, fh in todo.items()}
        return {pid: f.result() for pid, f in futs.items()}


def capture_native(pids: Sequence[int], tools: Sequence[str], timeout_s: float = 10.0) -> dict[int, capture.Capture]:
    """Native stacks of a few processes (the ones the finding names), in parallel."""
    pids = [p for p in pids if live(p)]
    if not pids or not tools:
        return {}
    with ThreadPoolExecutor(max_workers=min(4, len(pids))) as ex:
        futs = {pid: ex.submit(capture.native_stacks, pid, timeout_s, tuple(tools)) for pid in pids}
        return {pid: f.result() for pid, f in futs.items()}


# ------------------------------------------------------------------------------------ who is who

def _env_int(meta: Mapping[str, Any], key: str) -> int | None:
    v = (meta.get("env") or {}).get(key)
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def rank_of(meta: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(rank, world): what init_process_group said, else torchrun's environment."""
    if meta.get("rank") is not None:
        return meta["rank"], meta.get("world")
    return _env_int(meta, "rank"), _env_int(meta, "world_size")


def command_text(meta: Mapping[str, Any], width: int = 60) -> str:
    """The command as the user gave it: the recorded root's `python -m gpulab.trace ... --` left out."""
    argv = list(meta.get("argv") or ())
    if "gpulab.trace" in argv and "--" in argv:
        argv = argv[:1] + argv[argv.index("--") + 1:]
    argv = [os.path.basename(a) if i == 0 or (os.sep in a and not a.startswith("-")) else a
            for i, a in enumerate(argv)]
    text = " ".join(argv)
    return text if len(text) <= width else text[:width - 3] + "..."


def role_of(meta: Mapping[str, Any], metas: Mapping[int, Mapping[str, Any]]) -> tuple[str, str]:
    """(role, kind) of one process, named the way a user thinks of it."""
    argv = " ".join(meta.get("argv") or ())
    if meta.get("worker") is not None:
        parent = metas.get(meta.get("ppid")) or {}
        prank, pworld = rank_of(parent)
        of = f"rank {prank}" if prank is not None else "main" if parent.get("root") else f"pid {meta.get('ppid')}"
        return f"DataLoader worker {meta['worker']} of {of}", "worker"
    rank, world = rank_of(meta)
    held = _rank_held_elsewhere(meta, metas, rank)
    if rank is not None and held is None:
        return f"rank {rank}/{world if world is not None else '?'}", "rank"
    for mark, name in HELPERS.items():
        if mark in argv:
            return f"{name} (pid {meta.get('pid')})", "helper"
    if follow.is_launcher(meta):
        return f"launcher (pid {meta.get('pid')}: {command_text(meta)})", "launcher"
    if meta.get("root"):
        return f"main (pid {meta.get('pid')})", "main"
    if "multiprocessing.spawn" in argv or "--multiprocessing-fork" in argv:   # spawn's and forkserver's children
        return (f"multiprocessing child (pid {meta.get('pid')} of pid {meta.get('ppid')})" + (f" ({held})" if held
                                                                                              else "")), "process"
    return f"pid {meta.get('pid')}: {command_text(meta)}" + (f" ({held})" if held else ""), "process"


def _rank_held_elsewhere(meta: Mapping[str, Any], metas: Mapping[int, Mapping[str, Any]],
                         rank: int | None) -> str | None:
    """Why a process whose environment names a rank is not that rank, or None. A rank's child inherits its
    RANK (torch.compile's compile workers and the `python -c` checks Inductor runs, a wrapper's training
    script): seen on the user path, where such helpers, exited, were counted as ranks and hid the real ranks'
    collectives. Not the rank: a child of a process with the same rank, or a process whose rank another one
    took by calling init_process_group."""
    if rank is None or meta.get("rank") is not None:
        return None
    parent = metas.get(meta.get("ppid")) or {}
    if parent and rank_of(parent)[0] == rank:
        return f"child of rank {rank}"
    if any(m.get("rank") == rank and m.get("pid") != meta.get("pid") for m in metas.values()):
        return f"launches rank {rank}"
    return None


def state_of(pid: int, meta: Mapping[str, Any], folder: Path | None = None) -> str:
    """running, exited, exited after an uncaught exception, died of a signal (as its faulthandler file in the job
    folder says), or ended without a word (killed by a signal Python cannot catch)."""
    if live(pid):
        return "running"
    if meta.get("exception"):
        return f"exited after an uncaught {meta['exception']}"
    if meta.get("ended"):
        return f"exited {meta['exitcode']}" if meta.get("exitcode") else "exited"
    sig = classify.fatal_signal(fatal_text(folder, pid)) if folder is not None else None
    return f"{DIED_OF}{sig}" if sig else "ended (killed or exited without a word)"


DIED_OF = "died of "


def fatal_text(folder: Path, pid: int) -> str:
    """A process's faulthandler file ('' when it has none)."""
    f = follow.files(folder, pid)["faulthandler"]
    return f.read_text(errors="replace") if f.is_file() else ""


# ------------------------------------------------------------------------------------ what it was doing

def wait_of(frame: str | None, frames: Sequence[str], open_op: Mapping[str, Any] | None) -> str | None:
    """What the main thread waits in, from the open op and the Python frames (None when nothing says)."""
    name = (open_op or {}).get("name") or ""
    if name.startswith(collectives.PREFIX) or _family(name) or "wait_tensor" in name:
        return "collective"
    if name and ("synchronize" in name or "_local_scalar_dense" in name):
        return "cuda_sync"
    if any(f.startswith("_finalize_join ") and "queues.py" in f for f in frames[:8]):
        return "queue_flush"   # exiting: a multiprocessing Queue's feeder thread still writes what it put
    src = (frame or "").split("`")[1] if frame and "`" in frame else ""
    if ".acquire(" in src or re.search(r"\bwith\b.*\block\b", src, re.I) or re.search(r"lock\w*\(", src, re.I):
        return "lock"
    if any(f.startswith(_LOADER_WAITS) for f in frames[:8]):
        return "queue"
    if any(f.startswith(("join ", "_try_wait ", "wait (", "communicate ")) and (
            "multiprocessing" in f or "subprocess" in f) for f in frames[:8]):
        return "children"
    if any(q in f for f in frames[:6] for q in _QUEUE_FRAMES):
        return "queue"
    return None


def _open_op(records: Sequence[Any]) -> dict | None:
    """The op the process is stuck in: GPU work that never completed first, else the main thread's innermost
    open op (the program's own call: dist.barrier, not the gloo:barrier a backend thread runs for it), else
    any thread's."""
    inflight, _, open_host = localize(records) if records else (None, None, [])
    main = [r for r in open_host if str(r.thread or "").startswith("MainThread")]
    if inflight is not None and inflight.t_end is None and main:
        inflight = max(main, key=lambda r: r.seq)
    if inflight is None:
        return None
    return {"name": inflight.name, "args": shapes_text(inflight.args), "call_site": inflight.call_site or "",
            "gpu": inflight.t_end is not None and inflight.gpu_done is False, "t_start": inflight.t_start}


@dataclass(frozen=True)
class Left:
    """What one process left in the job folder: its <pid>.json and its op log as read (None: none, or torn),
    and its answer when asked for its collectives (None: not asked, or no answer)."""
    meta: dict
    log: Path | None
    snap: Any
    answer: dict | None = None


def read_job(folder: str | os.PathLike, ask: bool = False) -> dict[int, Left]:
    """Every process's <pid>.json and op log, read once (the views and the op-log tails share them). ask: first
    ask every live process for its collectives as PyTorch numbers them (its <pid>.collectives.json: the groups'
    sequence numbers, the flight recorder's entries), while the job is still stuck."""
    folder = Path(folder)
    if ask:
        follow.ask(folder, [pid for pid in follow.metas(folder) if live(pid)])
    out = {}
    for pid, meta in follow.metas(folder).items():
        log = folder / meta["log"] if meta.get("log") else None
        snap = None
        if log is not None and log.exists():
            try:
                snap = trace.read(log)
            except Exception:  # noqa: BLE001 - a torn log still leaves the process's role and stacks
                snap = None
        answer = follow.files(folder, pid)["collectives"]
        try:
            got = json.loads(answer.read_text()) if answer.exists() else None
        except (OSError, ValueError):
            got = None
        out[pid] = Left(meta, log, snap, got)
    return out


def views(folder: str | os.PathLike, pythons: Mapping[int, str], last_progress: Mapping[int, float] | None = None,
          now: float | None = None, seen: Mapping[int, Mapping[str, Any]] | None = None,
          node: str | None = None, left: Mapping[int, Left] | None = None) -> list[ProcessView]:
    """One view per process that announced itself in the folder (the root included). Live: `last_progress`
    (monotonic times) and the processes themselves say how far each got and whether it runs. From a folder
    read later (gpulab merge): `seen`, the rows of the verdict written at the stall, say it instead.
    `left`: the folder as read_job already read it."""
    folder = Path(folder)
    left = read_job(folder) if left is None else left
    metas = {pid: lf.meta for pid, lf in left.items()}
    now = time.monotonic() if now is None else now
    frames = {pid: main_frame(pythons.get(pid, "")) for pid in left}
    paths = _known_paths(metas, frames)
    root = next((pid for pid, m in metas.items() if m.get("root")), None)
    bosses = follow.supervisors(metas, root, live if seen is None else (lambda pid: True))
    # the job's process groups, as the processes that answered told them (one that holds the GIL answers nothing)
    groups = sorted({str(g.get("key")) for lf in left.values() for g in (lf.answer or {}).get("groups") or ()
                     if g.get("key")})
    out = []
    for pid, lf in sorted(left.items()):
        meta, snap = lf.meta, lf.snap
        records: Sequence[Any] = snap.records if snap is not None else ()
        role, kind = role_of(meta, metas)
        rank, world = rank_of(meta)
        open_op = _open_op(records)
        mf = frames[pid]
        row = (seen or {}).get(pid)
        if row is not None:
            state, progress = row.get("state") or "unknown", row.get("last_progress_s")
        else:
            t = (last_progress or {}).get(pid)
            state, progress = state_of(pid, meta, folder), round(now - t, 2) if t is not None else None
        # a DataLoader worker issues no collective: what it answers (flight recorder, calls) is its rank's state
        # copied when it was forked, and as a member it would be named as the one that never called the next
        calls = () if kind == "worker" else collectives_of(records, lf.answer, groups)
        place = _line(_site_of_frame(mf.own)) if mf.own else None
        stack = tuple(_line(_site_of_frame(f)) for f in mf.frames if _origin(f) == "own" and _FRAME.match(f))
        issued = {_line(c.call_site) for c in calls if c.call_site}
        callers = _callers(issued, paths)
        sites = issued | set(stack) | ({place} if place else set()) | set(callers.values())
        sites = sorted(x for x in sites if _LINE.match(x))
        spans = {x: _spans(paths.get(x.rsplit(":", 1)[0]), int(x.rsplit(":", 1)[1])) for x in sites}
        out.append(ProcessView(
            pid=pid, ppid=meta.get("ppid"), role=role, kind=kind, state=state, rank=rank, world=world,
            worker=meta.get("worker"), node=node or meta.get("host") or socket.gethostname(), open_op=open_op,
            collectives=calls, ops_completed=snap.completed if snap is not None else 0,
            last_progress_s=progress, frame=mf.where, wait=wait_of(mf.inner, mf.frames, open_op),
            own_code=mf.own_code,
            log=os.path.relpath(lf.log, folder) if lf.log is not None else None,
            supervises=pid in bosses, place=place, stack=stack, callers=callers,
            loops={x: sp[0] for x, sp in spans.items()},
            scopes={x: sp[1] for x, sp in spans.items() if sp[1] is not None},
            line_ops=_line_ops(records) if snap is not None and not snap.dropped else None))
    return out


def stacks_files(folder: str | os.PathLike, kind: str = "python") -> dict[int, str]:
    """The stacks the watchdog saved per process (<pid>.stacks_<kind>.txt) at the stall."""
    out = {}
    for p in Path(folder).glob(f"*.stacks_{kind}.txt"):
        head = p.name.split(".", 1)[0]
        if head.isdigit():
            out[int(head)] = p.read_text(errors="replace")
    return out


def write_tails(folder: str | os.PathLike, left: Mapping[int, Left], n: int = 15) -> None:
    """Each followed process's last n ops as text beside its log (<pid>.oplog_tail.txt): what the bundle
    carries of a process whose binary log stays behind."""
    from gpulab.hang.verdict import op_dict, oplog_line
    from gpulab.report import write_text

    for pid, lf in left.items():
        if lf.snap is None or lf.meta.get("root"):
            continue
        lines = [oplog_line(op_dict(r)) + "".join(f" {a['value']}" for a in r.args if isinstance(a, dict)
                                                   and str(a.get("value", "")).startswith(("g=", "seq=", "peer=")))
                 for r in lf.snap.records[-n:]]
        write_text(Path(folder) / f"{pid}.oplog_tail.txt", "\n".join(lines) + "\n")
