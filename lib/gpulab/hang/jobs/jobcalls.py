"""Each collective of one process, numbered as PyTorch numbers it (the process group's sequence number):
from its op log (the program's torch.distributed calls, the c10d ops PyTorch issues inside them) and
from the flight recorder when the process was asked. Apart from the reading of the job's folder: the
numbering is pure (records in, calls out), so it is checked on records built by hand (tests/test_jobread.py)."""
from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import replace
from typing import Any, Mapping, Sequence

from gpulab.hang.jobs.jobfacts import Collective
from gpulab.hang.jobs.jobframes import _origin
from gpulab.trace import collectives

_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int64": "i64",
           "int32": "i32", "uint8": "u8", "bool": "b8"}


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
