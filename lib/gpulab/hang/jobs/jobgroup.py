"""One process group's collectives compared across its members: the first sequence number where they part
(one never called it, or they called different ops or shapes, or the backend paired different calls), with
the sentences that back it. Apart from the rest of the judgement: the numbering rule alone, one group at a
time (gpulab.hang.jobs.job picks the group that parted first)."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from gpulab.hang.jobs.jobfacts import Collective, Divergence, ProcessView, _calls
from gpulab.hang.jobs.jobwords import _call, _in_call, _instead, _last_call, _progress, _roles, _who


@dataclass(frozen=True)
class _Walk:
    """One group's comparison: its divergence (or None), and the sentences that back it."""
    divergence: Divergence | None
    culprit: str | None
    evidence: tuple[str, ...]
    t_first: float = math.inf


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
