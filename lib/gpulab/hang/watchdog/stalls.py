"""A stall that may not be a hang: where the job was, whether the evidence shows one of the usual long pauses
(a checkpoint write, a compile, a slow data read, an evaluation pass), and how the stall window compares
with the job's own gaps between ops and steps. Pure: plain data in, plain data out.

Why judge pauses at all: under `gpulab watch --on-stall keep` a job that pauses longer than the window is
captured and goes on; a report that calls every checkpoint a hang is ignored. A pause is named only where the
stacks show it (no op open and the main thread in that kind of code, or every rank at the same place, or one
rank in such code while the others wait for it in their next collective, as ranks wait for rank 0's checkpoint);
otherwise it is `unknown`, and an open op or collectives the ranks call differently are never called a pause.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

KINDS = ("checkpoint", "compile", "data", "evaluation", "file_io", "same_place")
MAX_KEPT = 20     # stalls listed in a verdict: the first and the latest half of this each (the count is kept)

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>.*):(?P<line>\d+)\)$")
# (kind, a file path fragment, a function name pattern): the first frame (innermost first) that matches wins
_RULES: tuple[tuple[str, str | None, str | None], ...] = (
    ("compile", "torch/_dynamo/", None), ("compile", "torch/_inductor/", None), ("compile", "triton/compiler", None),
    ("compile", "torch/fx/", None),
    ("checkpoint", "torch/serialization.py", None), ("checkpoint", "torch/distributed/checkpoint/", None),
    ("checkpoint", "safetensors", None),
    ("data", "torch/utils/data/", None),
    ("file_io", "/shutil.py", None), ("file_io", "/pickle.py", None), ("file_io", "/gzip.py", None),
)
_OWN_NAMES = (("checkpoint", re.compile(r"checkpoint|ckpt|save", re.I)),
              ("evaluation", re.compile(r"eval|valid", re.I)),
              ("data", re.compile(r"load_data|read_data|next_batch|fetch|download", re.I)),
              ("file_io", re.compile(r"^(write|flush|fsync|read|copy\w*)$")))


def _get(rec: Any, key: str, default: Any = None) -> Any:
    return rec.get(key, default) if isinstance(rec, Mapping) else getattr(rec, key, default)


# ------------------------------------------------------------------------------------ gaps between ops

@dataclass(frozen=True)
class Gaps:
    """The job's own rhythm before a stall, from its op log: idle gaps between top-level ops, and the step
    period when an op repeats once per step."""
    ops: int
    span_s: float
    median_s: float
    p99_s: float
    longest_s: float
    longest_before: str | None     # the op (and call site) that came after the longest gap
    step_s: float | None = None    # median period of the least frequent op that repeats (once per step)
    step_op: str | None = None
    steps: int = 0

    def to_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def gaps(records: Sequence[Any], before: float | None = None) -> Gaps | None:
    """Gaps of the top-level ops that ended before `before` (the stall's last progress, on the records' clock);
    None with fewer than 3 such ops."""
    done = sorted((r for r in records if _get(r, "t_end") is not None and not _get(r, "depth", 0)
                   and (before is None or _get(r, "t_end") <= before)), key=lambda r: _get(r, "t_start"))
    if len(done) < 3:
        return None
    idle: list[tuple[float, Any]] = []
    end = _get(done[0], "t_end")
    for r in done[1:]:
        idle.append((max(0.0, _get(r, "t_start") - end), r))
        end = max(end, _get(r, "t_end"))
    values = sorted(g for g, _ in idle)
    longest, after = max(idle, key=lambda x: x[0])
    period, steps = step_period(done)
    step_s = step_op = None
    if period:
        starts = [_get(r, "t_start") for r in done]
        window = range(max(period, len(done) - STEP_WINDOW), len(done))
        step_s = statistics.median(starts[i] - starts[i - period] for i in window)
        first = done[len(done) - period]
        step_op = f"{period} ops from {_get(first, 'name')} at {_get(first, 'call_site') or '?'}"
    return Gaps(ops=len(done), span_s=end - _get(done[0], "t_start"), median_s=statistics.median(values),
                p99_s=values[min(len(values) - 1, int(0.99 * len(values)))], longest_s=longest,
                longest_before=f"{_get(after, 'name')} at {_get(after, 'call_site') or '?'}",
                step_s=step_s, step_op=step_op, steps=steps)


STEP_WINDOW = 3000     # ops compared when looking for the step's period
STEP_MATCH = 0.9       # share of ops that must repeat one period later


def step_period(done: Sequence[Any]) -> tuple[int | None, int]:
    """The job's step as a period in ops: the smallest P such that the op sequence (name, call site) repeats
    P ops later for STEP_MATCH of the last ops (a training loop runs the same ops every step). Candidates are
    the distances back to earlier occurrences of a few anchor ops near the end (the very last ops may belong
    to the pause itself). -> (P or None, how many whole periods the compared ops hold)."""
    seq = [(_get(r, "name"), _get(r, "call_site")) for r in done]
    n = len(seq)
    for back in (0, n // 10, n // 4, n // 2):
        anchor = n - 1 - back
        if anchor < 2:
            continue
        cands = [anchor - j for j in range(anchor - 1, -1, -1) if seq[j] == seq[anchor]][:200]
        for period in cands:
            end = anchor + 1
            width = min(end - period, max(3 * period, 50), STEP_WINDOW)
            if width < 2 * period:
                continue
            same = sum(seq[i] == seq[i - period] for i in range(end - width, end))
            if same >= STEP_MATCH * width:
                return period, width // period
    return None, 0


def window_note(stall_s: float, g: Gaps | None) -> str:
    """How the stall window compares with the job's own gaps, in a sentence a person can act on."""
    if g is None:
        return (f"the stall window ({stall_s:g} s) could not be compared with the job's own gaps: fewer than 3 "
                f"ops were recorded before the stall")
    step = (f", a step every {g.step_s:.3g} s ({g.step_op}, checked over {g.steps} steps)" if g.step_s else
            ", no repeating step found")
    text = (f"the stall window ({stall_s:g} s) against the job's own rhythm over its last {g.ops} recorded ops"
            f"{step}; gaps between ops: 99th percentile {g.p99_s:.3g} s, longest {g.longest_s:.3g} s (before "
            f"{g.longest_before}; Python may have been working then, an import or a first call)")
    if g.step_s:
        return text + f"; the window is {stall_s / max(g.step_s, 1e-9):.3g}x the step"
    return text + f"; the window is {stall_s / max(g.p99_s, 1e-9):.3g}x the 99th percentile gap"


# ------------------------------------------------------------------------------------ where, and why

@dataclass(frozen=True)
class Pause:
    kind: str | None       # one of KINDS, or None when the evidence names none
    usual: bool | None     # True: one of the usual long pauses; False: something was stuck; None: unknown
    why: str


def _frame_kind(frames: Sequence[str]) -> tuple[str, str] | None:
    """(kind, the frame that says so) from a main thread's frames (innermost first)."""
    for frame in frames:
        m = _FRAME.match(frame)
        path = (m.group("file") if m else "").replace("\\", "/")
        for kind, part, _ in _RULES:
            if part and part in path:
                return kind, frame
    for frame in frames:
        m = _FRAME.match(frame)
        func = m.group("func") if m else frame
        path = (m.group("file") if m else "").replace("\\", "/")
        if "site-packages/" in path or "dist-packages/" in path:
            continue
        for kind, pat in _OWN_NAMES:
            if pat.search(func):
                return kind, frame
    return None


def judge_pause(open_op: Mapping[str, Any] | None, frames: Sequence[str], divergence: Mapping[str, Any] | None = None,
                ranks_at: Sequence[str] = ()) -> Pause:
    """What the evidence says the job was doing during a stall: open_op (the op in flight, if any), frames (the
    main thread's Python frames, innermost first), divergence (the job finding's), ranks_at (each rank's place,
    for a job of ranks)."""
    if divergence and (divergence.get("missing") or divergence.get("mismatch")):
        found = _frame_kind(frames) if _behind(divergence, open_op) else None
        if found:   # rank 0 writes the checkpoint while the others wait for it in the next collective: DDP's usual
            kind, frame = found
            late = ", ".join(divergence.get("missing") or ())
            return Pause(kind, True, f"{late} had not reached {_at(divergence)}: no op was open and its main thread "
                                     f"was in {_WORDS[kind]} ({frame}), while the other ranks waited for it there")
        return Pause(None, False, f"the ranks disagree at {_at(divergence)}: a stuck collective, not a pause")
    if open_op:
        name = open_op.get("name")
        return Pause(None, None, f"an op was open ({name} at {open_op.get('call_site') or '?'}): a slow op and a "
                                 f"stuck one look alike until it completes")
    found = _frame_kind(frames)
    if found:
        kind, frame = found
        return Pause(kind, True, f"no op was open and the main thread was in {_WORDS[kind]} ({frame})")
    if len(ranks_at) >= 2 and all(r and r == ranks_at[0] for r in ranks_at):
        return Pause("same_place", True, f"no op was open and every rank was at the same place ({ranks_at[0]})")
    if not frames:
        return Pause(None, None, "no Python stacks were captured: nothing says what the job was doing")
    return Pause(None, None, f"no op was open; the main thread was at {frames[0]}, which is none of the usual "
                             f"pauses (checkpoint, compile, data, evaluation, file I/O)")


def _behind(divergence: Mapping[str, Any], open_op: Mapping[str, Any] | None) -> bool:
    """A rank had not reached the collective the others wait in, and ran no op: it is somewhere of its own
    (where its frame says), not calling another collective."""
    return bool(divergence.get("missing")) and not divergence.get("mismatch") and not open_op


def _at(divergence: Mapping[str, Any]) -> str:
    return f"{divergence.get('op')} (group {divergence.get('group')}, seq {divergence.get('seq')})"


_WORDS = {"checkpoint": "a checkpoint write", "compile": "compilation", "data": "a data read",
          "evaluation": "an evaluation pass", "file_io": "file I/O", "same_place": "the same place on every rank"}


def where(open_op: Mapping[str, Any] | None, divergence: Mapping[str, Any] | None, frame: str | None,
          process: str | None = None) -> str:
    """Where the job was during a stall: the op, else the collective, else the main thread's frame (a rank that
    had not reached the collective the others wait in: its own frame, then that collective)."""
    who = f"{process}: " if process else ""
    if divergence and divergence.get("op") and _behind(divergence, open_op) and frame:
        return f"{who}frame {frame}; the other ranks waited for it in {_at(divergence)}"
    if divergence and divergence.get("op"):
        return f"{who}collective {_at(divergence)}"
    if open_op and open_op.get("name"):
        return f"{who}op {open_op['name']} at {open_op.get('call_site') or '?'}"
    if frame:
        return f"{who}frame {frame}"
    return f"{who}unknown (no open op and no Python stacks)"


class Seen:
    """Every stall of one watch, bounded in memory whatever the job's length: the counts of all of them, and
    the first and the latest (what `kept` lists) as records."""

    def __init__(self, limit: int = MAX_KEPT):
        self.limit, self.items, self.count, self.recovered = limit, [], 0, 0

    def add(self, rec: dict) -> dict:
        self.count += 1
        self.items.append(rec)
        if len(self.items) > self.limit:
            del self.items[self.limit // 2]   # the oldest of the latest: the first half stays
        return rec

    def recover(self, rec: dict) -> None:
        rec["recovered"] = True
        self.recovered += 1

    @property
    def last(self) -> dict | None:
        return self.items[-1] if self.items else None
