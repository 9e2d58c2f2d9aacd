"""What each fix scenario costs: the workload's time in every scenario against the baseline scenario's.

Notebook 06 times the scenario's own workload; scenarios run one after another in sibling folders, so a
scenario sees the 06 metrics of those that ran before it (the run's index shows them all).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpulab.report import load_metrics

NOTEBOOK = "06_benchmark"
OVERHEAD_BUDGET = 0.20  # what a fix may cost before it is called too slow


def overhead_rows(found: Mapping[str, tuple[float, Sequence[float | None]]], baseline_scenario: str,
                  budget: float = OVERHEAD_BUDGET) -> list[dict[str, Any]]:
    """{scenario: (median ms, CI)} -> one row per scenario against the baseline scenario (pure)."""
    b_ms, b_ci = found[baseline_scenario]
    rows = []
    for name, (ms, ci) in found.items():
        ratio = ms / b_ms
        lo = ci[0] / b_ci[1] if None not in (ci[0], b_ci[1]) and b_ci[1] else None
        hi = ci[1] / b_ci[0] if None not in (ci[1], b_ci[0]) and b_ci[0] else None
        rows.append({"scenario": name, "workload ms": ms, "vs baseline": ratio, "bound low": lo, "bound high": hi,
                     "overhead %": 100 * (ratio - 1),
                     "within budget": "baseline" if name == baseline_scenario else
                     ("OVER BUDGET" if ratio > 1 + budget else "ok")})
    return rows


def scenario_overhead(out_dir: str | os.PathLike, baseline_scenario: str = "baseline",
                      budget: float = OVERHEAD_BUDGET) -> tuple[list[dict[str, Any]], str]:
    """Each sibling scenario's workload time against the baseline scenario's; (rows, note)."""
    here = Path(out_dir).resolve()
    parent = here.parent
    found = {}
    for d in sorted(p for p in parent.iterdir() if p.is_dir()) if parent.exists() else []:
        entry = load_metrics(d).get(NOTEBOOK)
        ms = (entry or {}).get("metrics", {}).get("workload_ms")
        if ms is not None:
            found[d.name] = (float(ms), (entry["metrics"].get("workload_ci_ms") or [None, None]))
    if len(found) < 2:
        return [], (f"There is only one scenario ({', '.join(found) or here.name}) with a 06 workload time in "
                    f"{parent.name}/: "
                    f"no fix-overhead table (run several scenarios with `gpulab run --scenario all`).")
    if baseline_scenario not in found:
        return [], f"Baseline scenario {baseline_scenario!r} has no 06 workload time yet; have: {', '.join(found)}."
    note = (f"{len(found)} scenarios; overhead = workload time / {baseline_scenario}'s - 1, budget {budget:.0%}. "
            f"The bounds combine each side's confidence interval of the median (separate runs, not "
            f"interleaved, so they are wide on purpose).")
    return overhead_rows(found, baseline_scenario, budget), note
