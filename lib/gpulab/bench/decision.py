"""Which attention implementation to ship: a decision matrix fed by measurements, not guesses.

Only candidates that passed notebook 05's oracle may win. A candidate becomes the champion only when its
ratio-of-medians confidence interval against the current champion lies wholly below 1 - delta; a correct
but slower one is "correct, N.NNx slower"; one that failed the oracle is excluded with its reason; one that
refuses the workload's own attention call is "not supported" (never timed on another call instead); a
speedup over 10x against a vendor kernel is flagged as suspect (a kernel that skips work is fast and wrong).

`choose` is pure: it gets a compare function, so tests drive it with synthetic comparisons and the
benchmark child with real ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Collection, Mapping, Protocol, Sequence

from gpulab.workloads import FUSED_BACKENDS

SUSPECT_SPEEDUP = 10.0
# PyTorch's fused kernels are the vendor yardstick (math is the reference composite: beating it 25x is normal)
VENDOR_KERNELS = frozenset(FUSED_BACKENDS)
STATUSES = ("champion", "baseline", "slower", "tie", "overtaken", "excluded", "suspect", "unverified",
            "unsupported", "error")
GATE_STATES = ("passed", "failed", "unverified")


class ComparisonLike(Protocol):
    ratio: float
    ratio_ci: tuple[float, float]
    verdict: str


@dataclass(frozen=True)
class Gate:
    """One candidate's line of 05's oracle gate."""

    passed: bool
    reason: str = ""
    worst_ratio: float | None = None
    cases: int | None = None


@dataclass(frozen=True)
class Row:
    name: str
    status: str                    # one of STATUSES
    label: str                     # what the decision table says, e.g. "correct, 1.73x slower than math"
    compared_with: str | None = None
    ratio: float | None = None     # median(name)/median(compared_with)
    ratio_ci: tuple[float, float] | None = None
    verdict: str | None = None
    gate: str = "unverified"       # one of GATE_STATES


@dataclass(frozen=True)
class Decision:
    champion: str | None
    baseline: str
    rows: tuple[Row, ...]
    provisional: bool              # True when there was no oracle gate: nothing was verified correct
    delta: float

    def row(self, name: str) -> Row:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no row {name!r}; rows: {', '.join(r.name for r in self.rows)}")


def parse_gate(data: Mapping[str, Any] | None, source: str = "oracle gate") -> dict[str, Gate] | None:
    """05's gate JSON -> {name: Gate}; None stays None (no gate: nothing verified)."""
    if data is None:
        return None
    out = {}
    for name, entry in data.items():
        if not isinstance(entry, Mapping) or "passed" not in entry:
            raise ValueError(f"{source}: entry {name!r} must be a mapping with 'passed' (got {entry!r})")
        out[str(name)] = Gate(bool(entry["passed"]), str(entry.get("reason", "")), entry.get("worst_ratio"),
                              entry.get("cases"))
    return out


def fmt_ci(ci: Sequence[float] | None) -> str:
    """A ratio's CI as '[0.412, 0.431]', or 'n/a' when it could not be computed."""
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci and all(math.isfinite(v) for v in ci) else "n/a"


def choose(names: Sequence[str], baseline: str, compare: Callable[[str, str], ComparisonLike], *,
           gate: Mapping[str, Gate] | None = None, order: Mapping[str, float] | None = None,
           vendor: Collection[str] = VENDOR_KERNELS, delta: float = 0.01,
           suspect_speedup: float = SUSPECT_SPEEDUP, errors: Mapping[str, str] | None = None,
           unsupported: Mapping[str, str] | None = None) -> Decision:
    """Run the decision matrix. `compare(a, b)` returns a comparison of a against b (ratio = a/b).

    Candidates are visited fastest-median first (`order`: name -> median ms), so each is judged against the
    best one known so far. Without a gate every candidate is eligible but the decision is provisional.
    A "faster" verdict more than `suspect_speedup` over the vendor champion, or over any vendor kernel's
    median in `order`, is flagged suspect and not promoted. `unsupported` names candidates that refused the
    workload's call (with the reason), `errors` those that could not run at all.
    """
    errors = dict(errors or {})
    unsupported = dict(unsupported or {})
    provisional = gate is None
    tag = "unverified" if provisional else "correct"

    def gate_of(n: str) -> str:
        if gate is None or n not in gate:
            return "unverified"
        return "passed" if gate[n].passed else "failed"

    def eligible(n: str) -> bool:
        return n not in errors and n not in unsupported and (provisional or gate_of(n) == "passed")

    rows: dict[str, Row] = {}
    everyone = [baseline] + [n for n in dict.fromkeys(names) if n != baseline]
    for n in everyone:
        if gate is not None and n in gate and not gate[n].passed:
            rows[n] = Row(n, "excluded", f"excluded: failed the oracle ({gate[n].reason or 'no reason given'})",
                          gate="failed")
        elif n in unsupported:
            rows[n] = Row(n, "unsupported", f"not supported for the workload's call: {unsupported[n]}",
                          gate=gate_of(n))
        elif n in errors:
            rows[n] = Row(n, "error", f"could not run: {errors[n]}", gate=gate_of(n))
        elif gate is not None and n not in gate:
            rows[n] = Row(n, "unverified", "not in 05's oracle gate: unverified, so it may not take the title",
                          gate="unverified")
    champion = baseline if eligible(baseline) else None
    if champion is not None:
        rows[baseline] = Row(baseline, "baseline", f"baseline ({tag})", gate=gate_of(baseline))
    rank = (lambda n: order.get(n, math.inf)) if order else (lambda n: everyone.index(n))
    promoted: list[str] = []
    for n in sorted((n for n in everyone if n != baseline and eligible(n)), key=rank):
        if champion is None:
            champion = n
            promoted.append(n)
            rows[n] = Row(n, "champion", f"champion by default ({tag}; baseline {baseline} not eligible)",
                          gate=gate_of(n))
            continue
        try:
            c = compare(n, champion)
        except Exception as exc:  # noqa: BLE001 - a candidate that breaks while timed is reported, not fatal
            rows[n] = Row(n, "error", f"comparison failed: {type(exc).__name__}: {exc}", champion, gate=gate_of(n))
            continue
        ci = tuple(c.ratio_ci)
        base = dict(compared_with=champion, ratio=c.ratio, ratio_ci=ci, verdict=c.verdict, gate=gate_of(n))
        speedup = 1.0 / c.ratio if c.ratio else math.inf
        over = {champion: speedup} if champion in vendor else {}
        if order and n in order and n not in vendor:  # any vendor kernel measured, not only the champion
            over.update({v: order[v] / order[n] for v in vendor if v in order and v != n and order[n] > 0})
        worst = max(over.items(), key=lambda kv: kv[1], default=(None, 0.0))
        if c.verdict == "faster" and worst[1] > suspect_speedup:
            rows[n] = Row(n, "suspect", f"suspect: {worst[1]:.1f}x faster than vendor kernel {worst[0]} "
                                        f"(> {suspect_speedup:g}x); check the oracle and the timing", **base)
        elif c.verdict == "faster":
            rows[n] = Row(n, "champion", f"{tag}, {speedup:.2f}x faster than {champion} "
                                         f"(95% CI {fmt_ci(ci)} < {1 - delta:g}): new champion", **base)
            champion = n
            promoted.append(n)
        elif c.verdict == "slower":
            rows[n] = Row(n, "slower", f"{tag}, {c.ratio:.2f}x slower than {champion}", **base)
        else:
            rows[n] = Row(n, "tie", f"{tag}, tie with {champion} (ratio {c.ratio:.3f}, 95% CI {fmt_ci(ci)} "
                                    f"within 1 ± {delta:g})", **base)
    for n in promoted:
        if n != champion:
            r, then = rows[n], f"was champion, then beaten by {champion}"
            label = r.label.replace("new champion", then) if "new champion" in r.label else f"{tag}: {then}"
            rows[n] = replace(r, status="overtaken", label=label)
    if champion is not None and champion == baseline:
        rows[baseline] = replace(rows[baseline], status="champion",
                                 label=f"baseline stays champion ({tag}): nothing beat it by more than {delta:.0%}")
    return Decision(champion, baseline, tuple(rows[n] for n in everyone if n in rows), provisional, delta)


def decision_from_dict(d: Mapping[str, Any]) -> Decision:
    """Rebuild a Decision written with dataclasses.asdict (by the benchmark child)."""
    rows = tuple(Row(**{**r, "ratio_ci": tuple(r["ratio_ci"]) if r.get("ratio_ci") else None}) for r in d["rows"])
    return Decision(d["champion"], d["baseline"], rows, d["provisional"], d["delta"])
