"""The program's shape behind a divergence (gpulab.hang.jobs.job's docstring): the ranks that wait in the
collective their training loop issues every step, while another rank left that loop (uneven_inputs) or
stepped around the collective (skipped_collective). Apart: it reads the program's source lines (loops,
callers, ops per line, as jobread found them), which the numbering rule never needs."""
from __future__ import annotations

from gpulab.hang.jobs.jobfacts import Collective, Divergence, ProcessView, _calls
from gpulab.hang.jobs.jobwords import _last_call, _roles, _state


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
