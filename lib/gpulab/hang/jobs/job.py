"""Many processes, one verdict: which process of a job is stuck, where, and why the others wait. Pure: the
per-process views in (read from the job's folder by gpulab.hang.jobs.jobread), the cross-process finding out.

A collective is matched across ranks by (process group, per-group sequence number): every rank of a group
calls the group's collectives in the same order, so the n-th call of each rank must be the same op with the
same shapes. The first sequence number where the ranks differ is the divergence: the ranks that reached it
wait, the ranks that did not are doing something else (named from their open op or their Python frame).

NCCL returns from a collective at launch: a rank's host goes on and blocks later elsewhere (a .item(), a
torch.save, the next collective), after issuing more collectives behind the one that can never complete. The
first collective of a rank that never completed is what it waits on (its row in the table says so), wherever
its host is. And NCCL matches a group's collectives by their order alone: a rank's call of another kind or size
at the same number (its barrier is an all_reduce of one element) pairs with the others' call, completes on its
side and lets it go on, while theirs never completes: the calls differ and only one side completed (paired).

Then the program's shape says why, where its source is known: the ranks that wait in the collective their
training loop issues every step (one they already matched at an earlier number, from the same line), while
another rank is past the end of that loop, ran out of steps (uneven_inputs: more batches on some ranks) or
skipped the collective in a step it ran (skipped_collective: a NaN guard, an `if` on local data), which the
ops its lines issued tell apart; a rank inside the loop in another collective took a branch the others did not
(skipped_collective).

By concern: the vocabulary (jobfacts: the views, the finding), one group's numbering (jobgroup), the program's
loop (jobloop), the sentences (jobwords); here the verdict that picks among them, and the table.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from gpulab.hang.jobs.jobfacts import CLASSES, Collective, Divergence, JobFinding, ProcessView
from gpulab.hang.jobs.jobgroup import _UNDECIDED, _Walk, _walk
from gpulab.hang.jobs.jobloop import _loop_shape
from gpulab.hang.jobs.jobwords import _instead, _latest, _op_text, _progress, _roles, _world_gaps

__all__ = ["CLASSES", "Collective", "Divergence", "JobFinding", "ProcessView", "analyse"]


# ------------------------------------------------------------------------------------------------ analysis

_LOADER_FRAMES = ("_get_data", "queue", "dataloader")   # "_try_get_data" contains "_get_data"
_BLOCKED = ("lock", "io", "cuda_sync", "collective")


def analyse(views: Sequence[ProcessView]) -> JobFinding:
    """The job's verdict. A collective divergence comes first: a rank that never reaches a collective stalls
    every rank of its group, whatever their DataLoader workers do; a stuck worker explains a hang only when
    the collectives agree."""
    order = _sorted(views)
    rows = tuple(_row(v) for v in order)
    gaps = _world_gaps(order)
    walks = [_walk(g, ms) for g, ms in _groups(order).items() if len(ms) >= 2]
    diverged = [w for w in walks if w.divergence is not None]
    if diverged:
        w = min(diverged, key=lambda w: w.t_first)
        rows = tuple(_paired_row(r, w.divergence) for r in rows)
        cls = "collective_mismatch" if w.divergence.mismatch else "rank_stuck"
        shape = _loop_shape(w.divergence, _groups(order)[w.divergence.group])
        if shape is not None:
            cls, culprit, why = shape
            kept = tuple(e for e in w.evidence if not e.startswith(_UNDECIDED))
            return JobFinding(cls, culprit, w.divergence, why + kept + _loader_links(order, w) + gaps, rows)
        return JobFinding(cls, w.culprit, w.divergence, w.evidence + _loader_links(order, w) + gaps, rows)
    agreed = tuple(s for w in walks for s in w.evidence) or (
        "no process group has two or more members in these views: no collective to compare",)
    gpu = _gpu_stuck(order)
    if gpu is not None:
        culprit, waiting, c, evidence = gpu
        div = Divergence(c.group, c.seq, c.op, _roles(waiting), (), {culprit.role: evidence[0]},
                         t_start=c.t_start) if c is not None and c.seq is not None else None
        return JobFinding("rank_stuck", culprit.role, div, evidence + agreed + gaps, rows)
    stuck = _stuck_worker(order)
    if stuck is None:
        return JobFinding(None, None, None, agreed + gaps, rows)
    worker, waiter = stuck
    what = "data" if worker.kind == "worker" else "its child process"
    evidence = (f"{waiter.role} waits for {what}: {_instead(waiter)}",
                f"{worker.role} (pid {worker.pid}) is running, {_progress(worker)}: {_instead(worker)}")
    if worker.wait == "queue_flush":
        evidence += (f"{worker.role} has left its target and, as it exits, waits for its multiprocessing Queue's "
                     f"feeder thread, which blocks writing what it put into a pipe nobody reads: its parent joins it "
                     f"before reading that queue (Python's multiprocessing guidelines, 'joining processes that use "
                     f"queues')",)
    return JobFinding("worker_stuck" if worker.kind == "worker" else "child_stuck", worker.role, None,
                      evidence + agreed + gaps, rows)


# ---------------------------------------------------------------------------------------- order and groups

def _sorted(views: Sequence[ProcessView]) -> list[ProcessView]:
    """Ranks by rank, then workers by their rank and id, then the rest by pid: the order a person reads."""
    by_pid = {(v.node, v.pid): v for v in views}

    def key(v: ProcessView) -> tuple:
        if v.kind == "rank":
            return (0, _num(v.rank), 0, v.pid)
        if v.kind == "worker":
            parent = by_pid.get((v.node, v.ppid))
            rank = v.rank if v.rank is not None else parent.rank if parent is not None else None
            return (1, _num(rank), _num(v.worker), v.pid)
        return (2, 0, 0, v.pid)
    return sorted(views, key=key)


def _num(x: int | None) -> float:
    return math.inf if x is None else x


def _groups(order: list[ProcessView]) -> dict[str, list[ProcessView]]:
    """group -> its members, in reading order: every process with a call in it (all ranks for 'default')."""
    groups: dict[str, list[ProcessView]] = {}
    for v in order:
        names = dict.fromkeys(c.group for c in v.collectives)
        if v.kind == "rank":
            names.setdefault("default")
        for g in names:
            groups.setdefault(g, []).append(v)
    return groups


# ------------------------------------------------------------------------------------------ GPU work

def _gpu_stuck(order: list[ProcessView]):
    """Every rank called the same collectives, but one rank's GPU work queued *before* its latest collective
    never completed: its collective never ran on its GPU (NCCL runs in stream order), so the others' copies
    of it wait for ever. GPU work that never completed *after* the collective is the waiting, not a cause."""
    ranks = [v for v in order if v.kind == "rank" and v.state in ("running", "unknown")]
    culprits, waiting = [], []
    for v in ranks:
        c = _latest(v.collectives)
        op = v.open_op or {}
        before = op.get("gpu") and c is not None and op.get("t_start") is not None and op["t_start"] < c.t_start
        (culprits if before else waiting).append(v)
    if not culprits or not waiting:
        return None
    v = culprits[0]
    c = _latest(v.collectives)
    first = (f"its GPU work {_op_text(v.open_op)} never completed, and its {c.op} (group {c.group}, seq {c.seq}) "
             "was queued on the GPU behind it: the collective never ran there")
    evidence = (f"{v.role}: {first}",
                f"{', '.join(_roles(waiting))} wait in {c.op} (group {c.group}, seq {c.seq}) for {v.role}")
    return v, waiting, c, evidence


# ------------------------------------------------------------------------------------------ workers

def _waits_on_loader(v: ProcessView) -> bool:
    frame = (v.frame or "").lower()
    return v.wait == "queue" or any(f in frame for f in _LOADER_FRAMES)


def _stuck_worker(order: list[ProcessView]) -> tuple[ProcessView, ProcessView] | None:
    """(worker, the process that waits for it): a worker under a waiting parent first, a blocked one (lock,
    I/O, an open op) before one idle on its own queue. A child process that is no DataLoader worker (a
    subprocess, a multiprocessing child) counts only when its own parent waits for its children."""
    by_pid = {(v.node, v.pid): v for v in order}
    waiters = [v for v in order if v.kind in ("rank", "main") and _waits_on_loader(v)]
    found = []
    for i, w in enumerate(order):
        if w.kind not in ("worker", "process") or w.state != "running" or (w.last_progress_s or 0) < 0:
            continue
        parent = by_pid.get((w.node, w.ppid))
        if w.kind == "process":
            waiter = parent if parent is not None and parent.wait == "children" else None
        else:
            waiter = parent if parent is not None and _waits_on_loader(parent) else (waiters or [None])[0]
        if waiter is not None:
            blocked = bool(w.open_op) or w.wait in _BLOCKED
            found.append(((waiter is not parent, not blocked, i), w, waiter))
    return min(found, key=lambda f: f[0])[1:] if found else None


def _loader_links(order: list[ProcessView], w: _Walk) -> tuple[str, ...]:
    """A culprit rank that itself waits on its DataLoader: name the worker it waits for."""
    culprits = set((w.culprit or "").split(", "))
    lines = []
    for r in (v for v in order if v.role in culprits and _waits_on_loader(v)):
        stuck = _stuck_worker([r] + [v for v in order if v.kind == "worker" and (v.node, v.ppid) == (r.node, r.pid)])
        if stuck is not None:
            lines.append(f"{r.role} waits for its DataLoader; {stuck[0].role} (pid {stuck[0].pid}) is "
                         f"{_instead(stuck[0])}, {_progress(stuck[0])}")
    return tuple(lines)


# ------------------------------------------------------------------------------------------ the table

def _first_open(v: ProcessView) -> Collective | None:
    """The first collective of the process that never completed: what it waits on, whatever its host does
    since (NCCL returns at launch; the host blocks later, in a .item(), a torch.save, the next collective)."""
    open_ = [c for c in v.collectives if not c.done]
    return min(open_, key=lambda c: (c.t_start, c.seq if c.seq is not None else math.inf)) if open_ else None


def _row(v: ProcessView) -> dict[str, Any]:
    """A process's row: its collective is the first one that never completed, else its latest."""
    c = _first_open(v) or _latest(v.collectives)
    coll = {"group": c.group, "seq": c.seq, "op": c.op, "shapes": c.shapes, "done": c.done} if c else None
    return {"role": v.role, "pid": v.pid, "node": v.node, "kind": v.kind, "state": v.state,
            "open_op": _op_text(v.open_op) if v.open_op else None, "collective": coll,
            "last_progress_s": v.last_progress_s, "wait": v.wait, "frame": v.frame, "own_code": v.own_code,
            "log": v.log}


def _paired_row(row: dict[str, Any], d: Divergence) -> dict[str, Any]:
    """A row whose collective the backend paired with the waiting ranks' different call says so."""
    c = row.get("collective")
    if row["role"] not in d.paired or not c or (c["group"], c["seq"]) != (d.group, d.seq):
        return row
    return {**row, "collective": {**c, "paired_with": f"{d.op} of {', '.join(d.waiting)}"}}
