"""The sentences of a job's finding: what each process does instead, its call, its progress, in words a
person can check against the table. Apart so that every rule (jobgroup, jobloop, job) says a process's
state the same way."""
from __future__ import annotations

from typing import Sequence

from gpulab.hang.jobs.jobfacts import Collective, ProcessView, _calls

_WAITS = {"lock": "blocked on a lock", "queue": "waiting on a queue", "collective": "waiting in a collective",
          "cuda_sync": "waiting for the GPU (CUDA sync)", "io": "blocked on I/O",
          "queue_flush": "ending, but waiting until what it put on a multiprocessing Queue is read"}


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
