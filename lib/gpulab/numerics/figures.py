"""Two fingerprints (one output each, from gpulab.numerics.record) compared: bitwise equal, close within the
tolerance, or different, with the error figures a person checks. Pure (dicts in, numbers out).

What is judged: the fixed strided sample element by element (|cand - ref| against atol + rtol * |ref|, as
assert_close; an element far smaller than its tensor's mean magnitude is held to rtol of that mean instead,
so rounding left over after cancellation is not read as a divergence), and the sums, abs-sum and max-abs
against the bounds elementwise closeness implies for the whole tensor (sum |a - b| <= n * atol + rtol * sum
|b|): a difference outside the sample still shows there. NaN/Inf counts must be equal. `slack` widens the
allowance of every element by an absolute amount (a reduction's rounding: gpulab.numerics.reduction).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpulab.numerics.tolerance import Tolerance


@dataclass(frozen=True)
class Figures:
    comparable: bool          # same shape (else nothing else is meaningful)
    bitwise: bool             # the same bits (same dtype, checksum, sums and sample)
    excess: float             # worst error / its allowance: <= 1 within tolerance
    max_abs_err: float        # on the sample
    max_rel_err: float        # on the sample, |cand - ref| / |ref|
    sum_rel_err: float        # |sum cand - sum ref| / abs-sum ref
    nonfinite: tuple[int, int, int, int] = (0, 0, 0, 0)   # NaN ref, NaN cand, Inf ref, Inf cand
    why: str = ""             # what exceeds, in words
    tol: Tolerance | None = field(default=None, compare=False)
    slack: float = 0.0        # the absolute allowance added per element for the op's reduction

    @property
    def within(self) -> bool:
        return self.comparable and self.excess <= 1.0

    def to_dict(self) -> dict:
        return {"bitwise_equal": self.bitwise, "within_tolerance": self.within, "excess": _num(self.excess),
                "max_abs_err": _num(self.max_abs_err), "max_rel_err": _num(self.max_rel_err),
                "sum_rel_err": _num(self.sum_rel_err), "nan": list(self.nonfinite[:2]), "inf": list(self.nonfinite[2:]),
                "why": self.why, "tolerance": self.tol.to_dict() if self.tol else None,
                "reduction_allowance": self.slack}


def _num(v: float) -> float | str:
    return v if math.isfinite(v) else str(v)


def _bitwise(r: dict, c: dict) -> bool:
    return (r.get("dtype") == c.get("dtype") and r.get("ck") == c.get("ck") and _same(r.get("sum"), c.get("sum"))
            and _same(r.get("asum"), c.get("asum")) and r.get("nan") == c.get("nan") and r.get("inf") == c.get("inf")
            and all(_same(a, b) for a, b in zip(r.get("sample") or (), c.get("sample") or ())))


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def compare(r: dict, c: dict, tol: Tolerance, slack: float = 0.0) -> Figures:
    """ref record r, candidate record c -> their Figures under tol (each element allowed slack more)."""
    nf = (int(r.get("nan") or 0), int(c.get("nan") or 0), int(r.get("inf") or 0), int(c.get("inf") or 0))
    if list(r.get("shape") or []) != list(c.get("shape") or []):
        return Figures(False, False, math.inf, math.inf, math.inf, math.inf, nf,
                       f"shapes differ: {r.get('shape')} vs {c.get('shape')}", tol)
    if _bitwise(r, c):
        return Figures(True, True, 0.0, 0.0, 0.0, 0.0, nf, "", tol, slack)
    n = max(int(r.get("n") or 0), 1)
    worst, why = 0.0, ""
    if nf[0] != nf[1] or nf[2] != nf[3]:
        worst, why = math.inf, f"NaN {nf[0]} vs {nf[1]}, Inf {nf[2]} vs {nf[3]}"
    asum_r = _f(r.get("asum"))
    scale = asum_r / n if math.isfinite(asum_r) else 0.0
    max_abs = max_rel = 0.0
    for a, b in zip(r.get("sample") or (), c.get("sample") or ()):
        a, b = _f(a), _f(b)
        if _same(a, b) or (math.isinf(a) and a == b):
            continue
        if not (math.isfinite(a) and math.isfinite(b)):
            e = math.inf
            if worst < e:
                worst, why = e, f"a sampled element is {b} where the reference has {a}"
            continue
        err = abs(b - a)
        max_abs = max(max_abs, err)
        max_rel = max(max_rel, err / abs(a) if a else (math.inf if err else 0.0))
        allowed = tol.atol + tol.rtol * max(abs(a), scale) + slack
        x = err / allowed if allowed > 0 else (math.inf if err else 0.0)
        if x > worst:
            worst, why = x, f"sampled element {b:.6g} vs {a:.6g}"
    sum_rel = 0.0
    if not any(nf):
        for key in ("sum", "asum", "amax"):
            a, b = _f(r.get(key)), _f(c.get(key))
            if not (math.isfinite(a) and math.isfinite(b)):
                continue
            allowed = ((tol.atol + 2 * tol.rtol * abs(a) + slack) if key == "amax"
                       else (n * (tol.atol + slack) + 2 * tol.rtol * asum_r))
            err = abs(b - a)
            if key == "sum":
                sum_rel = err / asum_r if asum_r else (math.inf if err else 0.0)
            x = err / allowed if allowed > 0 else (math.inf if err else 0.0)
            if x > worst:
                worst, why = x, f"{_WHAT[key]} {b:.6g} vs {a:.6g}"
    return Figures(True, False, worst, max_abs, max_rel, sum_rel, nf, why, tol, slack)


_WHAT = {"sum": "the sum", "asum": "the abs-sum", "amax": "the max-abs"}


def _f(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan
