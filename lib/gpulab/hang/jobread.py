"""A job's folder (gpulab.trace.follow: each process's <pid>.json, op log, beat, faulthandler file) -> the
per-process views gpulab.hang.job judges; and the capture of every live process of the job on a stall.

File and process handling only; the judgement is gpulab.hang.job's."""
from __future__ import annotations

import ast
import functools
import json
import linecache
import os
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import psutil

from gpulab import trace
from gpulab.hang import capture
from gpulab.hang.job import Collective, ProcessView
from gpulab.trace.analysis import localize
from gpulab.trace import collectives, follow

LAUNCHERS = follow.LAUNCHERS
HELPERS = {"multiprocessing.resource_tracker": "multiprocessing resource tracker",
           "multiprocessing.forkserver": "multiprocessing fork server"}
_LOADER_WAITS = ("_try_get_data ", "_get_data ", "_next_data ")
_QUEUE_FRAMES = ("_try_get_data", "_get_data", "_next_data", "queues.py", "connection.py", "queue.py")
_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int64": "i64",
           "int32": "i32", "uint8": "u8", "bool": "b8"}


# ------------------------------------------------------------------------------------ capture

def live(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def capture_python(folder: Path, metas: Mapping[int, dict], timeout_s: float = 2.0) -> dict[int, capture.Capture]:
    """Every live followed process's Python stacks at once (its faulthandler on SIGUSR1; in parallel, so the
    job costs one process's time, not the sum)."""
    todo = {pid: folder / m["faulthandler"] for pid, m in metas.items()
            if m.get("faulthandler") and not m.get("root") and live(pid)}
    if not todo:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(todo))) as ex:
        futs = {pid: ex.submit(capture.python_stacks, pid, fh, timeout_s) for pid, fh in todo.items()}
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


def state_of(pid: int, meta: Mapping[str, Any]) -> str:
    if live(pid):
        return "running"
    if meta.get("exception"):
        return f"exited after an uncaught {meta['exception']}"
    return "exited" if meta.get("ended") else "ended (killed or exited without a word)"


# ------------------------------------------------------------------------------------ what it was doing

def shapes_text(args: Sequence[Any]) -> str:
    ts = [a for a in args if isinstance(a, Mapping) and "shape" in a]
    return ", ".join(f"{_DTYPES.get(a.get('dtype'), a.get('dtype'))}{list(a.get('shape') or [])}" for a in ts)


def collectives_of(records: Sequence[Any], answer: Mapping[str, Any] | None = None,
                   groups: Sequence[str] | None = None) -> tuple[Collective, ...]:
    """Each collective of one process, numbered as PyTorch numbers it (the group's sequence number, the same on
    every rank): its torch.distributed calls from the op log (numbered when called), the collectives PyTorch
    issues inside the program's calls (DDP's reducer in backward, FSDP's hooks, the functional collectives:
    their c10d ops in the op log, numbered by counting from a numbered call, see _units), and (answer: what
    the process said when asked, gpulab.trace.follow.ask) the flight recorder's entries, which number them all.
    `groups`: the job's process groups as any of its processes told them (a process holding the GIL answers
    nothing; its op log alone is counted, when the job has one group).

    A collective is done when its host call returned, none of the GPU work recorded inside it is known pending
    and the flight recorder (when asked) says it completed: NCCL returns at launch, so a rank whose peer never
    joins has returned from its all_reduce while its copy waits on the GPU (seen on two H100s)."""
    out: list[tuple[int, Collective]] = []
    sites = _sites(records)
    for i, r in enumerate(records):
        if not r.name.startswith(collectives.PREFIX):
            continue
        tags = collectives.parse(r.args)
        done = _done(records, i)
        out.append((i, Collective(op=r.name[len(collectives.PREFIX):], group=tags["group"] or collectives.DEFAULT_GROUP,
                                  seq=tags["seq"], shapes=shapes_text(r.args), call_site=sites[i], done=done,
                                  peer=tags["peer"], t_start=r.t_start, t_end=r.t_end, by_torch=_by_torch(r))))
    entries = [e for e in (answer or {}).get("fr") or () if not e.get("p2p") and e.get("seq")]
    out += _counted(records, sites, out, answer, groups, entries)
    out.sort(key=lambda ic: ic[0])
    calls = [c for _, c in out]
    if not entries:
        return tuple(calls)
    at = {(c.group, c.seq): i for i, c in enumerate(calls) if c.seq is not None}
    issued = [(r, sites[i]) for i, r in enumerate(records)
              if _family(r.name) and sites[i] and not r.name.startswith(collectives.PREFIX)]
    for e in entries:
        key = (e["group"], e["seq"])
        if key in at:   # the op log's call and the recorder's entry: one collective, done only if both say so
            c = calls[at[key]]
            calls[at[key]] = replace(c, done=c.done and e["retired"], source=c.source + " + flight recorder")
            continue
        site = _site_of(e, issued)
        calls.append(Collective(op=e["op"], group=e["group"], seq=e["seq"], shapes=_fr_shapes(e), call_site=site,
                                done=e["retired"], t_start=e["created"], t_end=e["created"] if e["retired"] else None,
                                source="flight recorder", by_torch=True))
    return tuple(calls)


def _done(records: Sequence[Any], i: int) -> bool:
    """Record i's collective completed on the host and none of the GPU work recorded inside it is pending."""
    r = records[i]
    return r.t_end is not None and not r.raised and not _gpu_pending_inside(records, i)


def _is_collective(name: str) -> bool:
    """A record that issues one collective: the program's torch.distributed call, a c10d op of the dispatcher
    (`c10d.allreduce_`, what DDP's reducer and FSDP call), a functional collective, or a backend's own record
    (`nccl:all_reduce`, inside a c10d op; alone where PyTorch calls the backend from C++). Not p2p, not waits."""
    if name.startswith(collectives.PREFIX):
        return collectives.CALLS.get(name[len(collectives.PREFIX):]) == "collective"
    if name.startswith("gloo:"):   # gloo runs it on a thread of its own, for the c10d op that issued it
        return False
    return _family(name) is not None


def _units(records: Sequence[Any]) -> list[tuple[int, int]]:
    """(index, width) of each collective the op log shows this process issue, in order: the outermost record
    of each (a record nested in a collective's record is part of it), and how many sequence numbers it takes:
    a torch.distributed call as many as the c10d ops inside it (all_gather_object: two), at least one; any
    other one."""
    units: list[list[int]] = []                # [index, c10d ops inside]
    inside: dict[str, tuple[int, int]] = {}   # thread -> (depth, position in units) of its open collective record
    for i, r in enumerate(records):
        outer = inside.get(r.thread)
        if outer is not None and r.depth <= outer[0]:
            del inside[r.thread]
            outer = None
        if not _is_collective(r.name):
            continue
        if outer is not None:
            if r.name.startswith("c10d."):
                units[outer[1]][1] += 1
            continue
        units.append([i, 0])
        inside[r.thread] = (r.depth, len(units) - 1)
    return [(i, max(1, n) if records[i].name.startswith(collectives.PREFIX) else 1) for i, n in units]


def _counted(records: Sequence[Any], sites: Sequence[str], python: Sequence[tuple[int, Collective]],
             answer: Mapping[str, Any] | None, groups: Sequence[str] | None,
             entries: Sequence[Mapping[str, Any]]) -> list[tuple[int, Collective]]:
    """The collectives PyTorch issued inside the program's calls, numbered by counting every collective the op
    log shows (_units) from a number the group gave: a torch.distributed call's (its record carries it) or
    the flight recorder's (the entry created when the c10d op ran), else from the first (an op log that
    holds the process from its start). Only in a job of one process group (the c10d op's record does not
    say its group) and only where the counts agree with every number known: else none."""
    keys = {g.get("key") for g in (answer or {}).get("groups") or ()} | set(groups or ())
    keys |= {c.group for _, c in python if c.seq is not None}
    if len(keys - {None}) > 1 or any(r.name == collectives.PREFIX + "new_group" for r in records):
        return []
    group = next(iter(keys - {None}), collectives.DEFAULT_GROUP)
    units = _units(records)
    if not units:
        return []
    before, k = [], 0
    for i, w in units:
        before.append(k)
        k += w
    tagged = {i: c.seq for i, c in python if c.seq is not None and "counted" not in
              {a.get("value") for a in records[i].args if isinstance(a, dict)}}
    offsets = [(n, tagged[i] - (before[n] + 1)) for n, (i, _) in enumerate(units) if i in tagged]
    if not offsets:
        offsets = _fr_offsets(records, units, before, entries, group)
    if not offsets and records[0].seq == 0:
        offsets = [(0, 0)]   # the op log holds the process from its start: the first collective is number 1
    if not offsets or len({o for _, o in offsets}) > 1:
        return []   # no number to count from, or the counts disagree with the numbers known (coalesced calls)
    offset = offsets[0][1]
    have = {c.seq for _, c in python if c.seq is not None and c.group == group}
    fr = {e["seq"]: e for e in entries if e["group"] == group}
    out = []
    for n, (i, _) in enumerate(units):
        r = records[i]
        if r.name.startswith(collectives.PREFIX):
            continue
        seq = offset + before[n] + 1
        op = collectives.dispatcher_op(r.name)
        if seq in have or seq in fr and (_family("c10d." + fr[seq]["op"]) != _family(r.name) or fr[seq].get("created")
                                          and abs(fr[seq]["created"] - r.t_start) > 1.0):
            return []   # a number taken twice, or not the recorder's collective of that number: miscounted
        done = _done(records, i)
        out.append((i, Collective(op=op, group=group, seq=seq, shapes=shapes_text(r.args), call_site=sites[i],
                                  done=done, t_start=r.t_start, t_end=r.t_end if done else None,
                                  by_torch=_by_torch(r), counted=True)))
    return out


def _fr_offsets(records: Sequence[Any], units: Sequence[tuple[int, int]], before: Sequence[int],
                entries: Sequence[Mapping[str, Any]], group: str) -> list[tuple[int, int]]:
    """Where no call of the program carries a number: each flight-recorder entry against the unit of its kind
    created at the same moment (within 50 ms: both clocks are the host's), the offset most of them give."""
    votes: Counter = Counter()
    for e in entries:
        if e["group"] != group or not e.get("created"):
            continue
        fam = _family("c10d." + e["op"])
        near = [(abs(records[i].t_start - e["created"]), n) for n, (i, _) in enumerate(units)
                if _family(records[i].name) == fam]
        if near and min(near)[0] < 0.05:
            votes[e["seq"] - (before[min(near)[1]] + 1)] += 1
    return [(0, votes.most_common(1)[0][0])] if votes else []


def _by_torch(r: Any) -> bool:
    """A collective's record made inside another op's (DDP's reducer in backward, FSDP's hooks in forward), or
    on a thread of PyTorch's own: PyTorch issued it, not a call on the program's line."""
    return bool(getattr(r, "depth", 0)) or not _on_main(r)


def _on_main(r: Any) -> bool:
    return str(r.thread or "").startswith("MainThread")


def _sites(records: Sequence[Any]) -> list[str]:
    """Each record's call site; a record of a thread PyTorch runs on its own (the autograd engine's on a GPU,
    where DDP's reducer and FSDP's hooks issue their collectives) has none: it gets the program's line the main
    thread was at when it ran (`loss.backward()`), the last one the main thread recorded before it."""
    out, main = [], ""
    for r in records:
        site = r.call_site or ""
        if _on_main(r):
            main = site or main
        elif not site and str(r.thread or "").startswith("native"):
            site = main
        out.append(site)
    return out


_FAMILIES = ("allreduce", "allgather", "reducescatter", "broadcast", "barrier", "alltoall", "reduce", "gather",
             "scatter")


def _family(name: str) -> str | None:
    """The kind of collective an op's name is, whatever layer names it: c10d.allreduce_.default,
    _c10d_functional.all_reduce.default, gloo:all_reduce, dist.all_reduce -> 'allreduce'."""
    if not any(m in name for m in ("c10d", "gloo:", "nccl:", collectives.PREFIX)):
        return None
    flat = re.sub(r"[^a-z]", "", name.lower().split(".default")[0])
    return next((f for f in _FAMILIES if f in flat), None)


def _site_of(entry: Mapping[str, Any], issued: Sequence[tuple[Any, str]]) -> str:
    """The call site of a flight-recorder entry: its own Python frames when it kept them, else that of the
    op-log record of the same kind nearest in time ((record, its site) each; the line that issued it:
    `loss.backward()` for DDP's)."""
    for f in entry.get("frames") or ():
        place, _, func = f.partition(" in ")
        if _origin(f"{func} ({place})") == "own":
            return f"{os.sep.join(place.split(os.sep)[-2:])} in {func}"
    fam = _family("c10d." + entry.get("op", ""))
    same = [(r, site) for r, site in issued if _family(r.name) == fam]
    if not same:
        return ""
    t = entry.get("created") or 0.0
    return min(same, key=lambda rs: abs((rs[0].t_start or 0.0) - t))[1]


def _fr_shapes(entry: Mapping[str, Any]) -> str:
    dtypes = [_FR_DTYPES.get(d, d) for d in entry.get("dtypes") or ()]
    return ", ".join(f"{_DTYPES.get(d, d)}{list(s)}" for d, s in zip(dtypes, entry.get("sizes") or ()))


_FR_DTYPES = {"Float": "float32", "Half": "float16", "BFloat16": "bfloat16", "Double": "float64", "Long": "int64",
              "Int": "int32", "Byte": "uint8", "Bool": "bool"}


def _gpu_pending_inside(records: Sequence[Any], i: int) -> bool:
    """Does a record nested in records[i] (the ones after it on its thread, deeper, until one is not) have
    GPU work the GPU never completed?"""
    outer = records[i]
    for r in records[i + 1:]:
        if r.thread != outer.thread:
            continue
        if r.depth <= outer.depth:
            return False
        if r.gpu_done is False:
            return True
    return False


@dataclass(frozen=True)
class MainFrame:
    """Where a process's main thread was when its stacks were dumped."""
    where: str | None            # as a person reads it: the program's own line first (see main_frame)
    inner: str | None            # its innermost frame, library or not (what it waits in)
    frames: tuple[str, ...]      # all its frames, innermost first
    own_code: bool = False       # running the program's own code (or the standard library on its behalf)
    own: str | None = None       # the program's innermost own frame, as faulthandler wrote it (full path)


def main_frame(text: str) -> MainFrame:
    """The main thread's place, from a faulthandler dump. Stopped inside the standard library or an installed
    package, the place named is the program's own innermost line, with the library frame after it:
    `dist_job.py:52 in main: `re.match(...)`, inside re/__init__.py:166 in match` says where to look,
    `re/__init__.py:166` alone does not."""
    threads = capture.parse_python(text or "")
    main = next((t for t in threads if t.main), None)
    if main is None or not main.frames:
        return MainFrame(None, None, ())
    origins = [_origin(f) for f in main.frames]
    inner = _where(main.frames[0])
    i = origins.index("own") if "own" in origins else None
    # the program's own code, or the standard library called from it; not torch or another package
    own_code = i is not None and "package" not in origins[:i]
    own = main.frames[i] if i is not None else None
    if i is None or i == 0:
        return MainFrame(inner, inner, main.frames, own_code, own)
    return MainFrame(f"{_where(main.frames[i])}, inside {_where(main.frames[0], quote=False)}", inner, main.frames,
                     own_code, own)


_FRAME = re.compile(r"(?P<func>.*) \((?P<file>.*):(?P<line>\d+)\)$")
_STDLIB = re.compile(r"([/\\]lib[/\\]python\d[\d.]*[/\\])|(^<)")   # <prefix>/lib/python3.X/, frozen modules
_PACKAGES = re.compile(r"[/\\](site|dist)-packages[/\\]")
_GPULAB = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _origin(frame: str) -> str:
    """Whose code a faulthandler frame runs: "package" (an installed package: torch, numpy, ...; or gpulab),
    "stdlib" (the standard library, frozen modules) or "own" (the program's)."""
    m = _FRAME.match(frame)
    if not m:
        return "own"   # not a file frame: nothing says it is a library's
    path = m.group("file")
    if _PACKAGES.search(path) or path.startswith(_GPULAB):
        return "package"
    return "stdlib" if _STDLIB.search(path) else "own"


def _where(frame: str, quote: bool = True) -> str:
    """'dir/file.py:12 in func: `its line`' from faulthandler's 'func (/path/dir/file.py:12)' (quote=False: no
    source line)."""
    m = _FRAME.match(frame)
    if not m:
        return frame
    parts = m.group("file").split(os.sep)
    where = f"{os.sep.join(parts[-2:])}:{m.group('line')} in {m.group('func')}"
    src = source_line(m.group("file"), int(m.group("line"))) if quote else ""
    return f"{where}: `{src[:80]}`" if src else where


def source_line(path: str, line: int) -> str:
    """The code of a frame's line as a person quotes it: no trailing comment, one space between words."""
    src = re.sub(r"\s+#.*$", "", linecache.getline(path, line).strip())
    return " ".join(src.split())


def wait_of(frame: str | None, frames: Sequence[str], open_op: Mapping[str, Any] | None) -> str | None:
    """What the main thread waits in, from the open op and the Python frames (None when nothing says)."""
    name = (open_op or {}).get("name") or ""
    if name.startswith(collectives.PREFIX) or _family(name) or "wait_tensor" in name:
        return "collective"
    if name and ("synchronize" in name or "_local_scalar_dense" in name):
        return "cuda_sync"
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
            state, progress = state_of(pid, meta), round(now - t, 2) if t is not None else None
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


# ------------------------------------------------------------------------------------ the program's loops

_LINE = re.compile(r"^(?P<file>.+\.py):(?P<line>\d+)$")


def _line(site: str) -> str:
    """'dir/train.py:12 in main' (a call site) -> 'dir/train.py:12'."""
    return site.split(" in ", 1)[0].strip()


def _site_of_frame(frame: str) -> str:
    """faulthandler's 'func (/path/dir/train.py:12)' -> 'dir/train.py:12 in func', as a call site reads."""
    m = _FRAME.match(frame or "")
    if not m:
        return ""
    return f"{os.sep.join(m.group('file').split(os.sep)[-2:])}:{m.group('line')} in {m.group('func')}"


def _known_paths(metas: Mapping[int, Mapping[str, Any]], frames: Mapping[int, MainFrame]) -> dict[str, str]:
    """'dir/train.py' (how call sites name a file) -> its full path, from every stack and command line seen."""
    full = set()
    for mf in frames.values():
        for f in mf.frames:
            m = _FRAME.match(f)
            if m and os.path.isabs(m.group("file")):
                full.add(m.group("file"))
    for meta in metas.values():
        for a in meta.get("argv") or ():
            if str(a).endswith(".py"):
                full.add(os.path.join(meta.get("cwd") or "", str(a)))
    return {os.sep.join(p.split(os.sep)[-2:]): p for p in sorted(full)}


def _spans(path: str | None, line: int) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """(the innermost for/while loop holding `line`, the function holding it, or the whole module), each as its
    first and last line, in the source at `path`; (None, None) when the source cannot be read."""
    mtime = _mtime(path)
    if mtime is None:
        return None, None
    loops, funcs, end, _, _ = _blocks(path, mtime)
    if end == 0:
        return None, None

    def inner(spans):
        held = [sp for sp in spans if sp[0] <= line <= sp[1]]
        return min(held, key=lambda sp: sp[1] - sp[0]) if held else None
    return inner(loops), inner(funcs) or (1, end)


def _callers(lines: set[str], paths: Mapping[str, str], depth: int = 4) -> dict[str, str]:
    """'dir/train.py:47' -> the line that calls the function holding it ('dir/train.py:70'), and so on outwards
    (up to `depth` calls): where the program issued a collective from, when its stack has moved on since (NCCL
    returns at launch: the host is elsewhere by the time the collective is seen to hang). Read from the source:
    only a function called from exactly one place in its own file has a caller here."""
    out: dict[str, str] = {}
    todo = [(x, 0) for x in sorted(lines) if _LINE.match(x)]
    while todo:
        line, n = todo.pop()
        if line in out or n >= depth:
            continue
        short, _, num = line.rpartition(":")
        at = _caller(paths.get(short), int(num))
        if at is not None:
            out[line] = f"{short}:{at}"
            todo.append((out[line], n + 1))
    return out


def _caller(path: str | None, line: int) -> int | None:
    """The one line of the file at `path` that calls the function holding `line` (None: at module level, called
    from nowhere or from several places in that file, or the source cannot be read)."""
    mtime = _mtime(path)
    if mtime is None:
        return None
    _, _, _, funcs, calls = _blocks(path, mtime)
    held = [(end - start, name) for start, end, name in funcs if start <= line <= end]
    if not held:
        return None
    sites = calls.get(min(held)[1], ())
    return sites[0] if len(sites) == 1 else None


def loop_of(path: str | None, line: int) -> tuple[int, int] | None:
    """The first and last line of the innermost for/while loop holding `line` in the source at `path`, or None
    (at no loop, or the source cannot be read)."""
    return _spans(path, line)[0]


def _mtime(path: str | None) -> float | None:
    """The source's modification time (what _blocks' cache is keyed on), None when it cannot be read."""
    try:
        return os.stat(path).st_mtime if path else None
    except OSError:
        return None


@functools.lru_cache(maxsize=64)
def _blocks(path: str, mtime: float) -> tuple[tuple, tuple, int, tuple, dict]:
    """(loops, functions, last line, named functions as (first, last line, name), name -> the lines that call
    it) of a source file, from one parse: _spans and _caller read the same files."""
    try:
        text = Path(path).read_text(errors="replace")
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError):
        return (), (), 0, (), {}
    span = lambda n: (n.lineno, n.end_lineno or n.lineno)   # noqa: E731
    nodes = list(ast.walk(tree))
    calls: dict[str, list[int]] = {}
    for n in nodes:
        if isinstance(n, ast.Call):
            f = n.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name:
                calls.setdefault(name, []).append(n.lineno)
    return (tuple(span(n) for n in nodes if isinstance(n, (ast.For, ast.While, ast.AsyncFor))),
            tuple(span(n) for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))),
            max(1, text.count("\n") + 1),
            tuple((*span(n), n.name) for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))),
            {k: tuple(sorted(set(v))) for k, v in calls.items()})


def _line_ops(records: Sequence[Any]) -> dict[str, int]:
    """How many ops each of the program's lines issued (depth 0: what the line called, not what ran inside)."""
    return dict(Counter(_line(r.call_site) for r in records if r.call_site and not getattr(r, "depth", 0)))


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
