"""Evidence -> fixes: the one vocabulary the verdict's "try" sentence and `--scenario auto` share.

A fix declares, as data, the evidence it answers (`Answer`: the driver call the host is stuck in, the kind
of the op in flight, its operands' layout and dtype, the phase, platform facts, ...). `facts()` turns a
verdict into the same vocabulary and `match()` is the only function that pairs the two, so whatever a
report suggests is what `auto` runs first, and a test can hold every signature of every fix against a
verdict that shows it. Pure: plain data in, plain data out (no processes, no torch).
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, fields
from typing import Any, Iterable, Mapping, Sequence

from gpulab.hang.classify import (CALL_CLASSES, layout_problems, noncontiguous_args, op_kind, transposed_args)

# What a condition may test, and how: "any" = one of the values equals the fact (or, for a set-valued fact,
# is in it); "glob" = fnmatch on the fact; "text" = a case-insensitive substring of the fact.
CONDITIONS = {
    "status": "any",        # hang | crash | error | timeout
    "phase": "any",         # startup | ops
    "cls": "any",           # the verdict's class (gemm, softmax, layout, sync, library_load, host_lock, ...)
    "op_kind": "any",       # kind of the op in flight: gemm, softmax, attention, layout, sync, allocator, ...
    "op": "glob",           # the in-flight op's name, e.g. aten._scaled_dot_product_*
    "operands": "any",      # transposed | noncontiguous | strided (neither row- nor column-major)
    "dtype": "any",         # a dtype of the in-flight op's tensors, e.g. bfloat16
    "device": "any",        # cuda | cpu | rocm: where the in-flight op (else the workload) runs
    "driver_call": "glob",  # the GPU driver/runtime call the host thread is in, e.g. cuLaunchKernel
    "native": "text",       # a native frame of any thread, e.g. gomp_
    "stderr": "text",       # what the program said last, e.g. memory access fault
    "gpu": "any",           # platform: cuda | rocm
    "owner": "any",         # whose code the culprit is (gpulab.hang.owner): program | library | platform | unknown
}
# A setting of a library or the platform answers a failure in a library's or the platform's code, or one whose
# owner is unknown; a failure in the program's own code only where an Answer says so (owner=...program...) or
# rests on what the verdict shows directly (DIRECT, below).
NOT_THE_PROGRAM = ("library", "platform", "unknown")
# The conditions that, when the verdict knows the fact, rule a fix out for `auto` if none of its Answers
# agrees: the failure's class, its owner, the platform, and the op in flight (unless it is only the sync the
# host waits in: the sync line lies). The program's last words, a native frame or a driver call may simply not
# have been captured, so their absence rules nothing out.
RULES_OUT = ("status", "phase", "cls", "owner", "gpu", "device", "op_kind", "op", "operands", "dtype")
_OP_FACTS = ("op_kind", "op", "operands", "dtype")
# What the verdict shows directly: the driver call the host is blocked in, the op in flight, its operands, the
# program's last words. An Answer that rests on one of them is matched whoever owns the culprit: the owner is an
# inference from frames (a program's line calls every op), and a fix of what was seen can still change the failure
# (the program's own kernel over aten.mm gets a contiguous operand; lazy loading stops serialising a launch the
# program's kernels wait on). Ownership decides only for Answers that rest on coarser facts (class, phase, kind).
DIRECT = ("driver_call", "op", "operands", "stderr")
# How much a condition met says: a direct observation (the driver call, the op, its operands, a frame, the
# program's last words) over a kind of op or dtype, over a coarse class, phase or platform.
WEIGHT = {"driver_call": 3, "op": 3, "operands": 3, "native": 3, "stderr": 3, "op_kind": 2, "dtype": 2}
_ATTENTION = ("*scaled_dot_product*", "*flash_attention*", "*efficient_attention*", "*cudnn_attention*",
              "*attention_math*")
_ALLOCATOR = ("aten.empty*", "aten.new_empty*", "aten.empty_strided*", "aten.zeros*", "aten.ones*",
              "aten.full*", "aten._to_copy*", "aten.resize_*", "aten.record_stream*")


@dataclass(frozen=True)
class Answer:
    """One kind of evidence a fix answers: every condition given must hold (within one, any value will do)."""
    because: str                      # the evidence in words: "the host is stuck in a kernel-launch call"
    status: tuple[str, ...] = ()
    phase: tuple[str, ...] = ()
    cls: tuple[str, ...] = ()
    op_kind: tuple[str, ...] = ()
    op: tuple[str, ...] = ()
    operands: tuple[str, ...] = ()
    dtype: tuple[str, ...] = ()
    device: tuple[str, ...] = ()
    driver_call: tuple[str, ...] = ()
    native: tuple[str, ...] = ()
    stderr: tuple[str, ...] = ()
    gpu: tuple[str, ...] = ()
    owner: tuple[str, ...] = NOT_THE_PROGRAM

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name == "because":
                continue
            v = getattr(self, f.name)
            object.__setattr__(self, f.name, (v,) if isinstance(v, str) else tuple(v))
        if not self.because:
            raise ValueError("an Answer says in words what evidence it answers (because=...)")
        if not {k for k in self.conditions() if k != "owner"}:
            raise ValueError(f"Answer {self.because!r} has no condition: it would match every failure")

    def conditions(self) -> dict[str, tuple[str, ...]]:
        return {k: getattr(self, k) for k in CONDITIONS if getattr(self, k)}


@dataclass(frozen=True)
class Match:
    fix: str
    because: str          # the Answer's words
    facts: tuple[str, ...]  # the verdict's facts it rests on, each "condition=value"


# ------------------------------------------------------------------------------------ verdict -> facts

def _kind(name: str | None) -> str | None:
    """The op's kind, finer than the verdict's classes: attention and allocator ops are told apart."""
    if not name:
        return None
    if any(fnmatch.fnmatchcase(name, g) for g in _ATTENTION):
        return "attention"
    if any(fnmatch.fnmatchcase(name, g) for g in _ALLOCATOR):
        return "allocator"
    return op_kind(name)


def _device_kind(device: str | None) -> str | None:
    return str(device).split(":")[0] if device else None


def facts(verdict: Mapping[str, Any], platform: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A verdict (DESIGN.md's dict, or the ladder's brief of it) and the platform facts -> the evidence
    vocabulary of CONDITIONS. Set-valued facts are tuples; a missing fact is None or empty."""
    op = verdict.get("in_flight_op") or {}
    name = op.get("name")
    operands = []
    if op:
        if transposed_args(op):
            operands.append("transposed")
        if noncontiguous_args(op):
            operands.append("noncontiguous")
        if layout_problems(op):
            operands.append("strided")
    kinds = [k for k in (_kind(name), op_kind(name)) if k]   # attention ops are softmax reductions too
    stacks = verdict.get("stacks") or {}
    platform = dict(platform or {})
    return {
        "status": verdict.get("status"), "phase": verdict.get("phase"), "cls": verdict.get("class"),
        "op_kind": tuple(dict.fromkeys(kinds)), "op": name, "operands": tuple(operands),
        "dtype": tuple(dict.fromkeys(str(d).replace("torch.", "") for d in op.get("dtypes") or () if d)),
        "device": _device_kind(op.get("device")) or _device_kind(platform.get("device")),
        "driver_call": verdict.get("driver_call") or (verdict.get("host_blocked_in") or {}).get("api"),
        "native": str(stacks.get("native") or verdict.get("native_frames") or ""),
        "stderr": str(verdict.get("stderr_tail") or ""),
        "gpu": platform.get("gpu"),
        "owner": (verdict.get("owner") or {}).get("kind") or "unknown",
        "owner_seen": bool(verdict.get("owner_seen")) or owner_seen(verdict),
    }


def owner_seen(verdict: Mapping[str, Any]) -> bool:
    """Whether the owner is itself observed, not inferred: compute-sanitizer found the faulting access in a
    kernel it named (gpulab.hang.owner). Then the owner rules fixes out even for an Answer on direct evidence:
    the program's last words ("illegal memory access") say a fault happened, memcheck says whose code made it."""
    mc = verdict.get("memcheck") or {}
    return any(e.get("file") or e.get("kernel") for e in mc.get("errors") or () if isinstance(e, Mapping))


def brief(verdict: Mapping[str, Any]) -> dict[str, Any]:
    """What a trial keeps of a verdict so that it can be matched later without its stacks: the top native
    frames of every thread travel as `native_frames`."""
    keep = ("status", "phase", "class", "in_flight_op", "host_blocked_in", "driver_call", "stderr_tail", "owner")
    out = {k: verdict.get(k) for k in keep if verdict.get(k) is not None}
    if owner_seen(verdict):
        out["owner_seen"] = True
    native = (verdict.get("stacks") or {}).get("native")
    if native:
        out["native_frames"] = native[:20000]
    return out


# ------------------------------------------------------------------------------------ matching

def _holds(kind: str, wanted: Sequence[str], fact: Any) -> str | None:
    """The fact's value that meets the condition, or None."""
    if fact is None or fact == "" or fact == ():
        return None
    values = fact if isinstance(fact, tuple) else (fact,)
    for v in values:
        v = str(v)
        for w in wanted:
            if kind == "any" and v == w:
                return v
            if kind == "glob" and fnmatch.fnmatchcase(v, w):
                return v
            if kind == "text" and w.lower() in v.lower():
                return w
    return None


def direct(answer: Answer) -> bool:
    """Whether the Answer rests on a fact the verdict shows directly (DIRECT): its owner condition is then moot,
    unless the owner was observed too (owner_seen)."""
    return any(k in DIRECT for k in answer.conditions())


def holds(answer: Answer, evidence: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The facts an Answer rests on when every one of its conditions holds, else None. An Answer on direct
    evidence holds whoever owns the culprit (DIRECT). An error at the program's call (classify.CALL_CLASSES:
    refused arguments, memory, a dead worker) is not explained by the op's kind or operands: only an Answer that
    names its class or the program's words holds for it (a shape error raised in aten.addmm is no GEMM's)."""
    conds = answer.conditions()
    if evidence.get("cls") in CALL_CLASSES and "cls" not in conds and "stderr" not in conds:
        return None
    cited = []
    for key, wanted in conds.items():
        if key == "owner" and direct(answer) and not evidence.get("owner_seen"):
            continue
        got = _holds(CONDITIONS[key], wanted, evidence.get(key))
        if got is None:
            return None
        cited.append(f"{key}={got}")
    return tuple(cited)


def match(fixes: Iterable[Any], verdict: Mapping[str, Any] | None,
          platform: Mapping[str, Any] | None = None) -> tuple[Match, ...]:
    """The fixes whose declared evidence the verdict shows, most specific evidence first (the WEIGHT of the
    conditions met), then in the given order; each fix once, with its most specific matching Answer. A
    passing run, or no verdict, matches nothing."""
    if not verdict or verdict.get("status") in (None, "ok"):
        return ()
    ev = facts(verdict, platform)
    found = []
    for order, fx in enumerate(fixes):
        best = None
        for a in getattr(fx, "answers", ()):
            cited = holds(a, ev)
            score = sum(WEIGHT.get(k, 1) for k in a.conditions())
            if cited is not None and (best is None or score > best[2]):
                best = (a, cited, score)
        if best is not None:
            found.append((-best[2], order, Match(fx.name, best[0].because, best[1])))
    return tuple(m for _, _, m in sorted(found, key=lambda t: t[:2]))


def suggest(fixes: Iterable[Any], verdict: Mapping[str, Any] | None, platform: Mapping[str, Any]) -> tuple[Match, ...]:
    """The matches whose fix can apply on this platform: what a report may tell a user to try, and exactly
    what `--scenario auto` runs first."""
    return tuple(m for m in match([f for f in fixes if f.applies(platform)], verdict, platform))


def _contradicted(answer: Answer, ev: Mapping[str, Any]) -> list[str]:
    """The conditions of an Answer the verdict's known facts contradict, each as 'key=fact (answers: wanted)'."""
    only_sync = "sync" in (ev.get("op_kind") or ()) and len(ev.get("op_kind") or ()) == 1
    out = []
    for key, wanted in answer.conditions().items():
        if key not in RULES_OUT or (key in _OP_FACTS and (not ev.get("op") or only_sync)):
            continue
        fact = ev.get(key)
        if key in ("operands", "op_kind") and fact == ():
            fact = ("plain",) if key == "operands" else ("other",)   # the op is known, and it is neither
        if fact is None or fact == "" or fact == ():
            continue
        if _holds(CONDITIONS[key], wanted, fact) is None:
            shown = ",".join(map(str, fact)) if isinstance(fact, tuple) else fact
            out.append(f"{key}={shown} (it answers {key}={'|'.join(wanted)})")
    return out


def ruled_out(fix: Any, verdicts: Sequence[Mapping[str, Any]], platform: Mapping[str, Any] | None = None) -> str | None:
    """Why a fix cannot answer any of these failures, or None: every one of its Answers meets a known fact of
    every failure it would be tried on that says otherwise (the class, the owner, the platform, the op in
    flight). A fix one of whose Answers a failure shows (holds) is never ruled out, whoever owns the culprit:
    direct evidence outranks ownership. A fix that declares no Answer is never ruled out either. Pure: what
    `auto` leaves out, and says why."""
    found = [v for v in verdicts if v and v.get("status") not in (None, "ok")]
    if not found or not getattr(fix, "answers", ()):
        return None
    why = []
    for verdict in found:
        ev = facts(verdict, platform)
        if any(holds(a, ev) is not None for a in fix.answers):
            return None
        against = [_contradicted(a, ev) for a in fix.answers]
        if any(not c for c in against):
            return None
        best = min(range(len(against)), key=lambda i: len(against[i]))
        why.append(f"{fix.answers[best].because}, not this failure: " + "; ".join(against[best]))
    return why[0]


def try_sentence(matches: Sequence[Match], apply_lines: Mapping[str, str] | None = None) -> str:
    """One sentence for a report: the fixes to try and the evidence each answers."""
    if not matches:
        return ""
    parts = []
    for m in matches:
        line = (apply_lines or {}).get(m.fix)
        parts.append(f"{m.fix} ({m.because}" + (f"; apply with: {line}" if line else "") + ")")
    return "try " + "; ".join(parts)
