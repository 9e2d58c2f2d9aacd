"""Notebook 06: how long a kernel takes, whether one is really faster than another, and which attention
implementation to ship.

    stats     pure statistics: bootstrap CIs of the median and of a ratio of medians, decide, throttling
    measure   BenchConfig, Measurement, Comparison; `measure(fn)` and `compare(a, b)` (the sampler)
    flops     FLOP and byte counts, datasheet peaks, % of peak
    decision  the champion decision matrix (pure): Gate, Row, Decision, `choose`
    child     the benchmark Spec (the built-in workload's attention call, or a user program's most frequent one
              as notebook 02 recorded it: gpulab.recorded) and `run`, which times it in a child process
    overhead  what each fix scenario costs against the baseline scenario
    view      notebook 06's tables, plots and words; `finding(run) -> (headline, metrics)`
"""
from __future__ import annotations

import importlib

from gpulab.bench.child import RunResult, Spec, load_gate, make_spec, run
from gpulab.bench.decision import Decision, Gate, Row, choose, decision_from_dict, parse_gate
from gpulab.bench.measure import (BenchConfig, Comparison, Measurement, compare, comparison_from,
                                  comparison_from_dict, measure, measurement_from_dict, summarize)
from gpulab.bench.overhead import scenario_overhead
from gpulab.stats import decide, flag_throttled, hedges_g, is_stable, mann_whitney_p, median_ci, ratio_ci

# view's names, loaded on first use: the benchmark child (gpulab.bench.worker) never draws, and view's pandas
# and matplotlib cost it a second of start-up
_VIEW = ("Chart", "Note", "candidates_table", "comparisons", "decision_table", "finding", "finding_text",
         "histogram_widget", "latency_figure", "overhead_note", "overhead_table", "recorded_table", "run_note",
         "spec_note", "sweep_figure", "sweep_note", "sweep_table", "workload_note")


def __getattr__(name: str):
    if name in _VIEW:
        return getattr(importlib.import_module("gpulab.bench.view"), name)
    raise AttributeError(f"module 'gpulab.bench' has no attribute {name!r}")


__all__ = [
    "BenchConfig", "Chart", "Comparison", "Decision", "Gate", "Measurement", "Note", "Row", "RunResult", "Spec",
    "candidates_table", "choose", "compare", "comparison_from", "comparison_from_dict", "comparisons", "decide",
    "decision_from_dict", "decision_table", "finding", "finding_text", "flag_throttled", "hedges_g",
    "histogram_widget", "is_stable", "latency_figure", "load_gate", "make_spec", "mann_whitney_p", "measure",
    "measurement_from_dict", "median_ci", "overhead_note", "overhead_table", "parse_gate", "ratio_ci",
    "recorded_table", "run", "run_note", "scenario_overhead", "spec_note", "summarize", "sweep_figure",
    "sweep_note", "sweep_table", "workload_note",
]
