"""What a fix costs: timing children of the baseline and of each scenario, interleaved.

Each round runs the baseline and every scenario once, one child at a time (side-by-side children would
time each other's contention), in an order rotated every round, so drift (clocks, caches, other load)
hits every scenario alike: ABAB generalized to several B's. The timing children run on the healthy
configuration (no planted fault) without the recorder, under the watchdog (a hang costs its stall window).
The overhead is the ratio of median times minus one, with a bootstrap interval (gpulab.stats).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any, Callable, Mapping, Sequence

from gpulab.fixes.target import Target
from gpulab.hang.watchdog import watch
from gpulab import proc, workloads



@dataclass(frozen=True)
class Timing:
    scenario: str
    round: int
    status: str                  # the watchdog's: ok | hang | crash | error | timeout
    samples: tuple[float, ...]   # seconds (empty unless ok)
    folder: str


@dataclass(frozen=True)
class Arm:
    """One side of a comparison: a scenario's environment and workload parameters."""
    name: str
    env: Mapping[str, str]
    params: Mapping[str, Any]


def rotation(names: Sequence[str], round_: int) -> list[str]:
    """The order of one round: rotated by the round number, so no scenario always runs first or last."""
    k = round_ % len(names) if names else 0
    return list(names[k:]) + list(names[:k])


def overhead(candidate: Sequence[float], baseline: Sequence[float]) -> dict[str, Any]:
    """{overhead, overhead_ci, samples, method}: median(candidate)/median(baseline) - 1 and its bootstrap
    95% interval (None with fewer than 3 samples a side). Pure."""
    if not candidate or not baseline:
        return {"overhead": None, "overhead_ci": None, "samples": [len(candidate), len(baseline)], "method": "none"}
    from gpulab.stats import ratio_ci   # numpy and scipy: loaded when a cost is measured, not for --help

    (lo, hi), method = ratio_ci(sorted(candidate), sorted(baseline))
    ci = [lo - 1, hi - 1] if math.isfinite(lo) and math.isfinite(hi) else None
    mc, mb = median(candidate), median(baseline)
    return {"overhead": mc / mb - 1, "overhead_ci": ci, "samples": [len(candidate), len(baseline)], "method": method,
            "median_s": mc, "baseline_median_s": mb}


def time_once(target: Target, arm: Arm, folder: Path, *, time_s: float, stall_s: float, timeout_s: float,
              round_: int) -> Timing:
    folder.mkdir(parents=True, exist_ok=True)
    argv = target.timing_argv(arm.params, folder, arm.env.get(workloads.PYTHON_ENV), time_s)
    v = watch.run(argv, stall_s=stall_s, timeout_s=timeout_s, record=False, env=proc.python_env(arm.env),
                  out_dir=folder, progress=lambda m: None, stacks=False)
    samples = target.samples(folder, v.elapsed_s) if v.status == "ok" else ()
    return Timing(arm.name, round_, v.status, samples, folder.name)


def measure(target: Target, arms: Sequence[Arm], out: Path, *, rounds: int, time_s: float, stall_s: float,
            timeout_s: float, say: Callable[[str], None], after_round: Callable[[dict], None]
            ) -> dict[str, list[Timing]]:
    """rounds x (every arm once, rotated); `after_round` gets what is measured so far (saved as it goes)."""
    done: dict[str, list[Timing]] = {a.name: [] for a in arms}
    by_name = {a.name: a for a in arms}
    for r in range(rounds):
        for name in rotation([a.name for a in arms], r):
            t = time_once(target, by_name[name], out / f"{name}-{r:02d}", time_s=time_s, stall_s=stall_s,
                          timeout_s=timeout_s, round_=r)
            done[name].append(t)
            say(f"  timing {name} round {r + 1}/{rounds}: {t.status}"
                + (f", median {median(t.samples) * 1e3:.1f} ms" if t.samples else ""))
        after_round(done)
    return done
