"""Pure statistics of timing samples: confidence intervals, effect sizes and the faster/slower/tie rule (a root
module: 06's benchmark and 04's fix cost both read it, and 04 sits below 06).

Kept apart from the sampler so every rule can be checked on synthetic samples. "Faster" is decided from a
bootstrap confidence interval of the ratio of medians (BCa: bias-corrected and accelerated, scipy's
default), never from a mean or an effect size: latency is skewed and tight timings make effect sizes huge.
"""
from __future__ import annotations

import math
import warnings
from typing import Sequence

import numpy as np

VERDICTS = ("faster", "slower", "tie")


def is_stable(samples: Sequence[float], iqr_rel: float, std_rel: float) -> bool:
    """adaptive_autorange's IQR/median rule or nvbench's relative-std rule, whichever is met first."""
    x = np.asarray(samples, dtype=float)
    if x.size < 2:
        return False
    med = float(np.median(x))
    mean = float(np.mean(x))
    q75, q25 = np.percentile(x, [75, 25])
    by_iqr = med > 0 and (q75 - q25) / med < iqr_rel
    by_std = mean > 0 and float(np.std(x, ddof=1)) / mean < std_rel
    return bool(by_iqr or by_std)


def median_precise(samples: Sequence[float], ci_rel: float, confidence: float = 0.95) -> bool:
    """Whether the median is already known to within ci_rel: the distribution-free CI of the median (order
    statistics n/2 -+ z*sqrt(n)/2) is narrower than ci_rel of it. A microsecond kernel timed with CUDA events
    never gets its per-sample spread under 1% (event resolution alone is ~0.5 us), yet a few hundred
    samples pin its median; what the reader gets is the median's CI, so that is what sampling waits for."""
    if not ci_rel > 0:
        return False
    bounds = _median_bounds(samples, confidence)
    med = float(np.median(samples)) if bounds else 0.0
    return bool(bounds and med > 0 and (bounds[1] - bounds[0]) / med < ci_rel)


def _median_bounds(samples: Sequence[float], confidence: float) -> tuple[float, float] | None:
    """The distribution-free CI of the median: order statistics n/2 -+ z*sqrt(n)/2 (None: too few samples)."""
    x = np.sort(np.asarray(samples, dtype=float))
    n = x.size
    if n < 3:
        return None
    z = _z(confidence)
    lo = int(math.floor(n / 2 - z * math.sqrt(n) / 2))
    hi = int(math.ceil(n / 2 + z * math.sqrt(n) / 2))
    if lo < 0 or hi > n - 1:
        return None
    return float(x[lo]), float(x[hi])


DECIDED_CONFIDENCE = 0.999


def apart(candidate: Sequence[float], baseline: Sequence[float], delta: float = 0.01,
          confidence: float = DECIDED_CONFIDENCE) -> bool:
    """Whether a comparison's verdict is already beyond doubt: every ratio the two medians' order-statistic
    CIs allow lies on one side of the tie zone 1 +/- delta. A comparison that only waits for its verdict
    stops here; a tie, or a ratio near the zone's edge, still samples to its budget. Stricter than the
    verdict's own CI (99.9% a median, and the box of two CIs is wider than the ratio's) because the sampler
    looks several times: after each doubling of the samples."""
    a, b = _median_bounds(candidate, confidence), _median_bounds(baseline, confidence)
    if a is None or b is None or a[0] <= 0 or b[0] <= 0:
        return False
    return a[1] / b[0] < 1 - delta or a[0] / b[1] > 1 + delta


def _z(confidence: float) -> float:
    from statistics import NormalDist
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def flag_throttled(clocks_mhz: Sequence[float | None], frac: float = 0.75) -> tuple[bool, ...]:
    """nvbench's rule: a sample taken while the SM clock was below `frac` of the run's max clock."""
    if not 0 < frac <= 1:
        raise ValueError(f"frac={frac!r} must lie in (0, 1]")
    known = [c for c in clocks_mhz if c is not None and c > 0]
    if not known:
        return tuple(False for _ in clocks_mhz)
    floor = frac * max(known)
    return tuple(c is not None and c > 0 and c < floor for c in clocks_mhz)


BCA_MAX_N = 2000   # BCa's jackknife costs n^2 (time and memory): 20k per-call samples took minutes and GBs


def _bootstrap(data: tuple, statistic, confidence: float, n_resamples: int, seed: int, paired: bool = False):
    """scipy's BCa bootstrap; falls back to percentile when BCa degenerates (ties, tiny samples). Above
    BCA_MAX_N samples a side, percentile only (its skew correction is negligible there), in batches that
    bound memory."""
    big = max(len(d) for d in data) > BCA_MAX_N
    for method in (("percentile",) if big else ("BCa", "percentile")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from scipy import stats as _scipy  # 0.4 s to import: only where a bootstrap runs

            res = _scipy.bootstrap(data, statistic, n_resamples=n_resamples, confidence_level=confidence,
                                   method=method, paired=paired, vectorized=True,
                                   batch=max(1, 2_000_000 // max(len(d) for d in data)) if big else None,
                                   random_state=np.random.default_rng(seed))
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(lo) and math.isfinite(hi):
            return (lo, hi), method
    return (float("nan"), float("nan")), "none"


def _median(x, axis=-1):
    return np.median(x, axis=axis)


def _ratio_of_medians(x, y, axis=-1):
    return np.median(x, axis=axis) / np.median(y, axis=axis)


def median_ci(samples: Sequence[float], confidence: float = 0.95, n_resamples: int = 2000,
              seed: int = 0) -> tuple[tuple[float, float], str]:
    """BCa bootstrap CI of the median; ((lo, hi), method). Degenerate input gives a point or NaN CI."""
    x = np.asarray(samples, dtype=float)
    if x.size == 0:
        return (float("nan"), float("nan")), "none"
    if x.size < 3 or np.all(x == x[0]):
        m = float(np.median(x))
        return ((m, m), "none") if np.all(x == x[0]) else ((float("nan"), float("nan")), "none")
    return _bootstrap((x,), _median, confidence, n_resamples, seed)


def ratio_ci(candidate: Sequence[float], baseline: Sequence[float], confidence: float = 0.95,
             n_resamples: int = 2000, seed: int = 0) -> tuple[tuple[float, float], str]:
    """BCa CI of median(candidate)/median(baseline), two independent samples (scipy, paired=False)."""
    a = np.asarray(candidate, dtype=float)
    b = np.asarray(baseline, dtype=float)
    if a.size < 3 or b.size < 3:
        return (float("nan"), float("nan")), "none"
    if np.all(a == a[0]) and np.all(b == b[0]):
        r = float(a[0] / b[0])
        return (r, r), "none"
    return _bootstrap((a, b), _ratio_of_medians, confidence, n_resamples, seed, paired=False)


def hedges_g(candidate: Sequence[float], baseline: Sequence[float]) -> float:
    """Standardized mean difference with the small-sample correction: reported, never what decides."""
    a = np.asarray(candidate, dtype=float)
    b = np.asarray(baseline, dtype=float)
    na, nb = a.size, b.size
    if na < 2 or nb < 2:
        return float("nan")
    pooled = math.sqrt(((na - 1) * a.var(ddof=1) + (nb - 1) * b.var(ddof=1)) / (na + nb - 2))
    diff = float(a.mean() - b.mean())
    if pooled == 0:
        return 0.0 if diff == 0 else math.copysign(float("inf"), diff)
    correction = 1 - 3 / (4 * (na + nb) - 9)
    return diff / pooled * correction


def check_delta(delta: float) -> float:
    """The tie zone 1 +/- delta must be a fraction below 1."""
    if not 0 <= delta < 1:
        raise ValueError(f"delta={delta!r} must lie in [0, 1), e.g. 0.01 for 1%")
    return float(delta)


def decide(ci: tuple[float, float], delta: float = 0.01) -> str:
    """'faster' only when the whole CI of the ratio lies below 1-delta, 'slower' above 1+delta, else 'tie'."""
    check_delta(delta)
    lo, hi = ci
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "tie"
    if hi < 1 - delta:
        return "faster"
    if lo > 1 + delta:
        return "slower"
    return "tie"


def mann_whitney_p(candidate: Sequence[float], baseline: Sequence[float]) -> float:
    """Two-sided Mann-Whitney U p-value: reported beside the CI for readers who expect a test."""
    a = np.asarray(candidate, dtype=float)
    b = np.asarray(baseline, dtype=float)
    if a.size < 1 or b.size < 1:
        return float("nan")
    from scipy import stats as _scipy

    return float(_scipy.mannwhitneyu(a, b, alternative="two-sided").pvalue)
