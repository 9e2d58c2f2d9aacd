"""Many processes, one verdict: which process of a job is stuck, where, and why the others wait. Pure: the
per-process views in (read from the job's folder by gpulab.hang.jobread), the cross-process finding out.

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
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

# classes this module adds to gpulab.hang.classify's vocabulary
CLASSES = ("collective_mismatch", "rank_stuck", "worker_stuck", "uneven_inputs", "skipped_collective")


@dataclass(frozen=True)
class Collective:
    """One torch.distributed call of one process, as its op log recorded it."""
    op: str                    # all_reduce, broadcast, barrier, send, recv, all_gather_object, new_group, ...
    group: str                 # the process group: "default" or its ranks "0,1"
    seq: int | None            # per-group sequence number (1-based) of collectives; None for p2p and new_group
    shapes: str = ""           # tensor shapes and dtypes, as the op log prints them: "f32[4, 4]"
    call_site: str = ""        # "train.py:42"
    done: bool = False         # completed (host call returned; NCCL: its GPU work completed)
    peer: int | None = None    # p2p: the other rank
    t_start: float = 0.0       # seconds, the process's op-log clock (comparable across processes of one host)
    t_end: float | None = None
    source: str = "op log"     # "op log" (the Python call), "flight recorder" (PyTorch's own entry), or both
    by_torch: bool = False     # issued by PyTorch inside the program's call (DDP's reducer in backward, FSDP's
                               # hooks, a functional collective), not a torch.distributed call of the program
    counted: bool = False      # its seq counted along the op log from a number the group gave (gpulab.hang.jobread)


@dataclass(frozen=True)
class ProcessView:
    """What the watchdog knows of one process of the job."""
    pid: int
    ppid: int | None
    role: str                  # "rank 1/4", "DataLoader worker 0 of rank 1", "pid 123: python x.py"
    kind: str                  # "rank" | "worker" | "launcher" | "main" | "process"
    state: str                 # "running" | "exited 0" | "exited 1" | "killed by SIGSEGV" | "unknown"
    rank: int | None = None
    world: int | None = None
    worker: int | None = None  # DataLoader worker id
    node: str = ""             # host name (a multi-node job merged from several folders)
    open_op: dict | None = None          # innermost op started and never completed: {"name", "args", "call_site"}
    collectives: tuple[Collective, ...] = ()
    ops_completed: int = 0
    last_progress_s: float | None = None  # seconds between its last progress and the stall (None: unknown)
    frame: str | None = None              # innermost Python frame of its main thread: "worker.py:12 in __getitem__"
    wait: str | None = None               # what its stacks show it waits in: lock | queue | collective | cuda_sync | io
    log: str | None = None                # its op log, relative to the job folder
    own_code: bool = False                # its main thread runs the program's own code (gpulab.hang.jobread)
    supervises: bool = False              # a launcher or supervisor of ranks (torchrun's agent, mp.spawn's parent)
    place: str | None = None              # the program's own line its main thread is at: "train.py:40"
    stack: tuple[str, ...] = ()           # the program's own lines on its main thread's stack, innermost first
    # around the lines that matter (its call sites, its stack): "train.py:40" -> the first and last line of
    # the innermost for/while holding it (None: at no loop, or the source is unknown) ...
    loops: dict = field(default_factory=dict)
    # ... and of the function holding it (the module: the whole file)
    scopes: dict = field(default_factory=dict)
    # ops the program's own lines issued (depth 0), by line: "train.py:31" -> count; None when the op log
    # lost records (then counts compare nothing)
    line_ops: dict | None = None
    # a line of the program -> the one line that calls the function holding it, read from the source
    # ("train.py:47" in average_gradients -> "train.py:70"): where a collective was issued from once the
    # host has moved on (NCCL returns at launch)
    callers: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Divergence:
    group: str
    seq: int
    op: str | None                         # the collective the waiting ranks are in
    waiting: tuple[str, ...]               # roles that reached seq and wait there
    missing: tuple[str, ...]               # roles that never reached seq
    instead: dict = field(default_factory=dict)   # role -> what it is doing instead (a sentence)
    mismatch: str | None = None            # "op" | "shape" when the ranks are at seq with different calls
    t_start: float | None = None           # when the first waiting call started (op-log clock): the timeline's mark
    # role -> its own call at seq, which completed although it differs from the waiting ranks': NCCL matches
    # a group's collectives by their order, so a rank's barrier (an all_reduce of one element) pairs with the
    # others' gradient all_reduce of the same number; it completes there, that rank goes on, theirs never does
    paired: dict = field(default_factory=dict)


@dataclass(frozen=True)
class JobFinding:
    cls: str | None                        # one of CLASSES, or None when nothing cross-process explains it
    culprit: str | None                    # the role of the process the finding names
    divergence: Divergence | None
    evidence: tuple[str, ...]
    processes: tuple[dict, ...]            # the per-process table (DESIGN.md: role, pid, state, open_op, collective, ...)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["class"] = d.pop("cls")
        return d


# ------------------------------------------------------------------------------------------------ analysis

_WAITS = {"lock": "blocked on a lock", "queue": "waiting on a queue", "collective": "waiting in a collective",
          "cuda_sync": "waiting for the GPU (CUDA sync)", "io": "blocked on I/O"}
_LOADER_FRAMES = ("_get_data", "queue", "dataloader")   # "_try_get_data" contains "_get_data"
_BLOCKED = ("lock", "io", "cuda_sync", "collective")


@dataclass(frozen=True)
class _Walk:
    """One group's comparison: its divergence (or None), and the sentences that back it."""
    divergence: Divergence | None
    culprit: str | None
    evidence: tuple[str, ...]
    t_first: float = math.inf


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
    return JobFinding("worker_stuck", worker.role, None, evidence + agreed + gaps, rows)


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


def _calls(v: ProcessView, group: str) -> dict[int, Collective]:
    calls: dict[int, Collective] = {}
    for c in v.collectives:
        if c.group == group and c.seq is not None:
            calls.setdefault(c.seq, c)
    return calls


# ------------------------------------------------------------------------------------------- one group

def _walk(group: str, members: list[ProcessView]) -> _Walk:
    """The first seq where the members part: one missing it, or calls that differ in op or shapes. Where the
    calls differ but some completed while the others never do, the backend paired them (NCCL: see
    Divergence.paired): the ones that completed went on without the call the others wait in."""
    calls = {m.role: _calls(m, group) for m in members}
    seqs, matched = sorted(set().union(*calls.values())), 0
    for s in seqs:
        at = {m.role: calls[m.role][s] for m in members if s in calls[m.role]}
        if len(at) < len(members):
            if any(not c.done for c in at.values()):
                return _missing(group, s, members, at, matched)
            continue   # everyone who called it completed it: a record lost, not a divergence
        ops = {c.op for c in at.values()}
        kind = "op" if len(ops) > 1 else (
            "shape" if ops.isdisjoint(_SHAPES_DIFFER) and not _same_shapes(list(at.values())) else None)
        if kind:
            if 0 < sum(c.done for c in at.values()) < len(at):
                return _paired(group, s, members, at, kind, matched)
            return _mismatch(group, s, members, at, kind)
        matched += 1
    return _Walk(None, None, (_agreed(group, members, calls, seqs),))


# collectives whose tensors differ between ranks by design: the root of a scatter or gather holds every rank's
# part, the others only their own (DCP's save scatters its plan so: seen on the user path, where the ranks' shapes
# at its scatter were named the job's mismatch, not the all_reduce one rank called alone later); all_to_all's
# splits may be uneven
_SHAPES_DIFFER = frozenset({"scatter", "gather", "scatter_object_list", "gather_object", "all_to_all",
                            "all_to_all_single"})


def _same_shapes(cs: list[Collective]) -> bool:
    """The calls' tensors agree. The op log lists a call's tensors (all_gather_into_tensor: output and input),
    the flight recorder its inputs: an entry only the recorder knows agrees with a call whose tensors hold its."""
    logged = {c.shapes for c in cs if c.source != "flight recorder"}
    recorded = {c.shapes for c in cs if c.source == "flight recorder"}
    if len(logged) > 1 or len(recorded) > 1:
        return False
    if not logged or not recorded:
        return True
    have, inputs = set(next(iter(logged)).split(", ")), next(iter(recorded)).split(", ")
    return all(x in have for x in inputs)


_UNDECIDED = "no call is the most common"


def _paired(group: str, s: int, members: list[ProcessView], at: dict, kind: str, earlier: int) -> _Walk:
    """At seq s the members called different collectives, and the backend matched them as one: on some ranks
    the call completed (they went on), on the others it never will (they wait). The ranks that wait are the
    divergence's; the others never called what they wait in (missing, their own call paired). Which side is
    out of place: the call of the fewer members (a tie names nobody; the program's loop may, _loop_shape)."""
    waiting = [m for m in members if not at[m.role].done]
    went = [m for m in members if at[m.role].done]
    key, ranked, tie = _ranked(members, at, kind)
    culprit = None if tie else ", ".join(m.role for m in members if key(m) != ranked[0][0])
    op = Counter(at[m.role].op for m in waiting).most_common(1)[0][0]
    theirs = _call(at[waiting[0].role])
    instead = {m.role: f"its {_call(at[m.role])} (group {group}, seq {s}) completed, paired with the others' "
                       f"{at[waiting[0].role].op}; then: {_instead(m)}" for m in went}
    paired = {m.role: _call(at[m.role]) for m in went}
    t = min(at[m.role].t_start for m in waiting)
    div = Divergence(group, s, op, _roles(waiting), _roles(went), instead, kind, t, paired)
    what = "ops" if kind == "op" else "shapes"
    barrier = "; its barrier is an all_reduce of one element" if any(c.op == "barrier" for c in at.values()) else ""
    gone, stay = ", ".join(_roles(went)), ", ".join(_roles(waiting))
    lines = [f"group {group}, seq {s}: the members called different {what}: {_who(waiting + went, at, 'call', True)}",
             (f"{gone} and {stay} called their different collectives as the same number {s}: the backend matched "
              f"them as one (NCCL pairs a group's collectives by their order, not their kind or size{barrier}), so "
              f"{gone} completed {'its' if len(went) == 1 else 'their'} call and went on, while {stay} "
              f"wait{'s' if len(waiting) == 1 else ''} in {theirs} for a partner that never calls it")]
    if earlier:
        lines.append(f"group {group}: {earlier} earlier collective(s) matched on all {len(members)} members")
    lines += [f"{m.role}: after its seq {s}: {_instead(m)}; {_progress(m)}" for m in went]
    lines.append(f"{_UNDECIDED} ({' vs '.join(str(n) for _, n in ranked)} members): which side's call is out of "
                 "place the calls alone do not tell" if tie else
                 f"{culprit} differ(s) from the call of {ranked[0][1]} of {len(members)} members")
    return _Walk(div, culprit, tuple(lines), t)


def _ranked(members: list[ProcessView], at: dict, kind: str) -> tuple[Callable, list, bool]:
    """(what each member's call at the seq is compared by, its values most common first, whether the top two
    tie): _mismatch and _paired judge the calls alike."""
    key = (lambda m: at[m.role].op) if kind == "op" else (lambda m: at[m.role].shapes)
    ranked = Counter(key(m) for m in members).most_common()
    return key, ranked, ranked[0][1] == ranked[1][1]


def _missing(group: str, s: int, members: list[ProcessView], at: dict, earlier: int) -> _Walk:
    waiting = [m for m in members if m.role in at and not at[m.role].done]
    missing = [m for m in members if m.role not in at]
    instead = {m.role: _instead(m) for m in missing}
    op = Counter(at[m.role].op for m in waiting).most_common(1)[0][0]
    t = min(at[m.role].t_start for m in waiting)
    div = Divergence(group, s, op, _roles(waiting), _roles(missing), instead, t_start=t)
    head = f"group {group}, seq {s}: {_who(waiting, at, 'wait in')}" + "".join(
        f"; {m.role} never called it: {instead[m.role]}" for m in missing)
    lines = [head] + ([f"group {group}: {earlier} earlier collective(s) matched on all {len(members)} members"]
                      if earlier else [])
    lines += [f"{m.role}: last call in group {group}: {_last_call(m, group)}; {_progress(m)}" for m in missing]
    return _Walk(div, missing[0].role, tuple(lines), t)


def _mismatch(group: str, s: int, members: list[ProcessView], at: dict, kind: str) -> _Walk:
    """The most common call is the reference; the members that differ from it are the culprits. On a tie
    nobody is: the first member's side is listed first and both sides are named."""
    key, ranked, tie = _ranked(members, at, kind)
    top = {k for k, n in ranked if n == ranked[0][1]}
    ref = next(key(m) for m in members if key(m) in top)
    same = [m for m in members if key(m) == ref]
    other = [m for m in members if key(m) != ref]
    waiting = [m for m in same if not at[m.role].done]
    instead = {m.role: _in_call(at[m.role]) for m in other}
    t = min(at[m.role].t_start for m in (waiting or members))
    div = Divergence(group, s, at[same[0].role].op, _roles(waiting), (), instead, kind, t_start=t)
    culprit = None if tie else ", ".join(_roles(other))
    what = "ops" if kind == "op" else "shapes"
    head = f"group {group}, seq {s}: the members call different {what}: {_who(same + other, at, 'call', True)}"
    why = (f"{_UNDECIDED} ({' vs '.join(str(n) for _, n in ranked)} members): neither side is "
           "named the culprit" if tie else
           f"{culprit} differ(s) from the call of {len(same)} of {len(members)} members: {_call(at[same[0].role])}")
    return _Walk(div, culprit, (head, why), t)


def _agreed(group: str, members: list[ProcessView], calls: dict, seqs: list[int]) -> str:
    n = len(members)
    if not seqs:
        return f"group {group}: no numbered collective recorded on its {n} members"
    last = {m.role: calls[m.role].get(seqs[-1]) for m in members}
    open_ = [c for c in last.values() if c is not None and not c.done]
    if not open_:
        return f"group {group}: all {n} members called seq {seqs[0]} to {seqs[-1]} alike and all completed"
    return (f"group {group}, seq {seqs[-1]}: all {n} members are in {_call(open_[0])}, {len(open_)} not "
            "completed: the calls match, so no member is missing from it")


# ------------------------------------------------------------------------------------ the program's loop

def _site_line(site: str) -> str:
    """'dir/train.py:12 in main' -> 'dir/train.py:12'."""
    return site.split(" in ", 1)[0].strip()


def _split(line: str | None) -> tuple[str, int] | None:
    file, _, n = (line or "").rpartition(":")
    return (file, int(n)) if file and n.isdigit() else None


def _repeated(v: ProcessView, group: str, c: Collective) -> bool:
    """The call is the one the loop issues every step: the same op from the same line matched at an earlier
    number of the group on this rank."""
    line = _site_line(c.call_site)
    return bool(line) and any(o.seq is not None and o.seq < (c.seq or 0) and o.done and o.op == c.op
                              and _site_line(o.call_site) == line for o in v.collectives if o.group == group)


def _in_loop(line: str | None, loop: tuple[str, int, int]) -> bool:
    at = _split(line)
    return at is not None and at[0] == loop[0] and loop[1] <= at[1] <= loop[2]


def _iterations(stay: ProcessView, off: ProcessView, loop: tuple[str, int, int], upto: int) -> str | None:
    """'same' when the rank that is off ran as many steps of the loop as the one that stays (it skipped a
    collective in a step it ran), 'fewer' when it ran fewer (it ran out of data); None when the op logs cannot
    tell (records lost, or no line to compare). The one that stays is in step S at `upto` (and, its host gone
    on, maybe at a later line of the loop): a line before that ran S times on it. A line before that issued as
    many ops on the rank that is off ran as many times there: that rank reached it in step S ('same'; a skip
    makes only the lines after the skip's decision issue fewer). When every such line issued fewer, it ran
    fewer steps. A line after ran S - 1 times on the one that stays: it says 'same' only when it issued more
    on the other. The loop's own header never counts: a DataLoader's iterator issues its ops once, at the
    start, as many on every rank."""
    if stay.line_ops is None or off.line_ops is None:
        return None
    here = [at[1] for x in stay.stack if (at := _split(x)) is not None and _in_loop(x, loop)]
    lo, hi = min([upto, *here]), max([upto, *here])
    seen = set()
    for line in set(stay.line_ops) | set(off.line_ops):
        at = _split(line)
        if at is None or not _in_loop(line, loop) or at[1] == loop[1] or lo <= at[1] <= hi:
            continue
        a, b = stay.line_ops.get(line, 0), off.line_ops.get(line, 0)
        if at[1] < lo and a > 0:
            seen.add("same" if b >= a else "fewer")
        elif at[1] > hi and b > a:
            seen.add("same")
    return "same" if "same" in seen else "fewer" if seen else None


def _lines(v: ProcessView, c: Collective | None) -> list[str]:
    """A rank's own lines, innermost first: its call at the divergence and the lines that call it (read from
    the source: the host may have moved on since it issued the call), then its main thread's stack."""
    first: list[str] = []
    line = _site_line(c.call_site) if c is not None and c.call_site else None
    while line and line not in first:
        first.append(line)
        line = v.callers.get(line)
    return first + [x for x in v.stack if x not in first] or ([v.place] if v.place else [])


def _enclosing(stay: ProcessView, ref: Collective, off: list[ProcessView], calls: dict):
    """The loop the waiting ranks are in that the others are not inside, seen from the same function: walking
    out from the waiting rank's innermost own line, the first loop for which every other rank has a line in
    that loop's function (or has ended). -> (loop, the waiting rank's line in it, {role: the other's line or
    None when it ended}) or None."""
    for line in _lines(stay, ref):
        span, scope, at = stay.loops.get(line), stay.scopes.get(line), _split(line)
        if span is None or scope is None or at is None:
            continue
        loop, inside = (at[0], span[0], span[1]), (at[0], scope[0], scope[1])
        where: dict = {}
        for m in off:
            if m.state not in ("running", "unknown"):
                where[m.role] = None
                continue
            mine = next((x for x in _lines(m, calls[m.role]) if _in_loop(x, inside)), None)
            if mine is None:
                break
            where[m.role] = mine
        else:
            return loop, at[1], where
    return None


def _loop_shape(d: Divergence, members: list[ProcessView]) -> tuple[str, str, tuple[str, ...]] | None:
    """(class, culprit, sentences) when the divergence has the shape of a training loop that some ranks left or
    stepped around (module docstring); None when it has not, or the source does not say."""
    calls = {m.role: _calls(m, d.group).get(d.seq) for m in members}
    stay = [m for m in members if calls[m.role] is not None and not calls[m.role].done
            and _repeated(m, d.group, calls[m.role])]
    off = [m for m in members if m not in stay]
    if not stay or not off:
        return None
    ref = calls[stay[0].role]
    found = _enclosing(stay[0], ref, off, calls)
    if found is None:
        return None
    loop, upto, where = found
    span = f"{loop[0]}:{loop[1]}-{loop[2]}"
    line = _site_line(ref.call_site)
    issued = (f"{ref.op} (group {d.group}, seq {d.seq}), the collective their loop at {span} issues every step"
              + (f" from {line}" if line else "")
              + (f" (called from {loop[0]}:{upto})" if line and _split(line) != (loop[0], upto) else "")
              + (" (issued inside that call by PyTorch, as DDP's gradient all_reduce is in backward)"
                 if ref.by_torch or ref.source == "flight recorder" else ""))
    left = [m for m in off if where[m.role] is None or not _in_loop(where[m.role], loop)]
    branch = [m for m in off if m not in left and calls[m.role] is not None]
    waiting = f"{', '.join(_roles(stay))} wait{'s' if len(stay) == 1 else ''} in {issued}"
    if branch and not left and len(branch) == len(off):
        culprit = ", ".join(_roles(branch))
        lines = tuple(f"{m.role} {_branch_call(m, calls[m.role], d)} at {where[m.role]}, inside the same loop: a "
                      f"collective in a branch the others did not take (the ranks decided differently whether to "
                      f"call it)" for m in branch)
        return "skipped_collective", culprit, (waiting,) + lines
    if not left or len(left) != len(off):
        return None   # a rank inside the loop in its own code or an op: stuck there, not a shape of the loop
    kinds = {_iterations(stay[0], m, loop, upto) for m in left}
    cls = "skipped_collective" if kinds == {"same"} else "uneven_inputs"
    culprit = ", ".join(_roles(left))
    lines = [waiting]
    for m in left:
        now = _state(m.state) if where[m.role] is None else f"at {m.frame or where[m.role]}"
        after = (f"; its {d.paired[m.role]} (seq {d.seq}, outside that loop) was paired with their {ref.op}, "
                 f"completed, and it went on" if m.role in d.paired else f", after {_last_call(m, d.group)}")
        lines.append(f"{m.role} left that loop: it is {now}, past its end{after}")
    if cls == "skipped_collective":
        lines.append(f"{culprit} ran as many steps of the loop as {stay[0].role} (the loop's lines issued as many ops "
                     "on both) but one collective fewer: it skipped the collective in a step it ran (a NaN guard, an "
                     "`if` on its own data)")
    elif kinds == {"fewer"}:
        lines.append(f"{culprit} ran fewer steps of the loop than {stay[0].role} (the loop's lines before the "
                     "collective issued fewer ops on it): it ran out of data first (uneven inputs)")
    else:
        lines.append(f"the op logs do not tell whether {culprit} ran out of data (uneven inputs) or skipped a step "
                     "(a rank-local skip): either way it left the loop before the others")
    return cls, culprit, tuple(lines)


def _branch_call(m: ProcessView, c: Collective, d: Divergence) -> str:
    if m.role in d.paired:
        return (f"called {c.op}{f' ({c.shapes})' if c.shapes else ''} as seq {d.seq}, which completed, paired with the "
                f"others' {d.op}")
    return f"is in {c.op}"


# -------------------------------------------------------------------------------------------- sentences

def _roles(ms: list[ProcessView]) -> tuple[str, ...]:
    return tuple(m.role for m in ms)


def _at(site: str | None) -> str:
    return f" at {site}" if site else " (call site not recorded)"


def _call(c: Collective, state: bool = False) -> str:
    text = c.op + (f" ({c.shapes})" if c.shapes else "") + _at(c.call_site)
    return text + (", completed" if c.done else ", not completed") if state else text


def _in_call(c: Collective) -> str:
    peer = f"rank {c.peer}" if c.peer is not None else "unknown"
    where = f"group {c.group}, seq {c.seq}" if c.seq is not None else f"group {c.group}, peer {peer}"
    of = f" of {c.shapes}" if c.shapes else ""
    return f"{'in' if not c.done else 'completed'} {c.op}{of} ({where}){_at(c.call_site)}"


def _who(ms: list[ProcessView], at: dict, verb: str, state: bool = False) -> str:
    """'rank 0/4, rank 2/4 wait in all_reduce (f32[4]) at train.py:10; ...': members grouped by their call."""
    by: dict[str, list[str]] = {}
    for m in ms:
        by.setdefault(_call(at[m.role], state), []).append(m.role)
    first, _, rest = verb.partition(" ")
    return "; ".join(f"{', '.join(rs)} {first if len(rs) > 1 else first + 's'}{' ' + rest if rest else ''} {call}"
                     for call, rs in by.items())


def _op_text(op: dict) -> str:
    return f"{op.get('name') or 'an unnamed op'}{_at(op.get('call_site'))}"


def _state(state: str) -> str:
    return f"exited with code {state[7:]}" if state.startswith("exited ") else state


def _instead(v: ProcessView) -> str:
    """What a process does instead, from the strongest evidence: its end, its open call, its frame."""
    if v.state not in ("running", "unknown"):
        return _state(v.state)
    c = _latest([c for c in v.collectives if not c.done])
    if c is not None:
        return _in_call(c)
    if v.open_op:
        return f"in {_op_text(v.open_op)} (started, never completed)"
    if v.wait:
        where = f" at {v.frame}" if v.frame else " (no Python frame captured)"
        return _WAITS.get(v.wait, f"waiting ({v.wait})") + where
    if v.frame:
        return f"at {v.frame} (no op open)"
    return "unknown (no op open, no Python frame captured)"


def _latest(cs: Sequence[Collective]) -> Collective | None:
    return max(reversed(cs), key=lambda c: c.t_start) if cs else None   # a tie: the later record


def _last_call(v: ProcessView, group: str) -> str:
    c = _latest(list(_calls(v, group).values()))
    return f"seq {c.seq} {_call(c, True)}" if c else "none recorded"


def _progress(v: ProcessView) -> str:
    s = v.last_progress_s
    return "last progress unknown" if s is None else f"no progress for {s:.1f} s before the stall"


def _world_gaps(order: list[ProcessView]) -> tuple[str, ...]:
    """Ranks the world size promises but no view shows: their state is unknown, and is said to be."""
    seen = {v.rank for v in order if v.kind == "rank" and v.rank is not None}
    world = max((v.world for v in order if v.kind == "rank" and v.world), default=0)
    absent = [r for r in range(world) if r not in seen]
    return (f"world size {world}, but no view of rank(s) {', '.join(map(str, absent))}: their state is "
            "unknown (on other nodes? `gpulab merge` the watch folders of every node)",) if absent else ()


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
