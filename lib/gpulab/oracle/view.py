"""Tables and figures of oracle reports and of notebook 05's gate, so the notebook shows a failure in one
call. Reports and gates are taken as they come (OracleReport, Gate from gpulab.oracle.check); this module
imports none of the oracle's logic, so check can delegate its plot methods here.

pandas, matplotlib and IPython are imported where used: the child that runs the checks (and a GPU host
without them) never needs them.
"""
from __future__ import annotations

import math

import numpy as np

from gpulab import report

PASS_LINE = 2.0  # e(candidate) <= 2 * e(baseline) (+ atol): the rule's factor, drawn on every ratio plot


# ------------------------------------------------------------------------------------------ tables

def report_table(rep):
    """One row per case of an OracleReport."""
    import pandas as pd
    return pd.DataFrame(rep.rows())


def worst_table(rep, case: int | str | None = None):
    """The worst elements of a failing case (the worst case by default)."""
    import pandas as pd
    return pd.DataFrame(list(rep.pick(case, "heatmap").worst))


def plan_note(scope, device: str, cases: str, candidates) -> None:
    """What 05 is about to judge (device, dtypes, case set, candidates), or why it judges nothing."""
    from IPython.display import Markdown, display

    if not scope.applies:
        display(Markdown(f"**{report.esc(scope.note)}**"))
        return
    from gpulab.oracle.cases import case_set
    from gpulab.oracle.sets import for_device
    names = ", ".join(report.code(c) for c in candidates)
    chosen = for_device(cases, device)
    how = ("" if cases != "auto" else " (auto: the full set on a GPU)" if chosen == "default"
           else " (auto: one case per bug family on the CPU; oracle_cases=default judges the full set)")
    display(Markdown(f"Device {report.code(device)}; dtypes {', '.join(scope.dtypes)} (auto: the dtype "
                     f"the built-in workload runs in, or the dtypes the recorded program calls); case set "
                     f"{report.code(chosen)}{how} ({len(case_set(chosen))} cases per dtype); candidates {names}."
                     + (f" {report.esc(scope.note)}" if scope.note else "")))


def verdicts(gate):
    """One line per candidate: passed, how many cases failed, worst ratio and the reason (nothing when 05
    does not apply to the workload: the finding says why)."""
    import pandas as pd
    if not gate.applies:
        from IPython.display import Markdown
        return Markdown("")
    rows = []
    for name, r in gate.reports.items():
        s = r.summary()
        rows.append({"candidate": name, "kind": gate.kinds.get(name, ""), "passed": s["passed"],
                     "cases": s["cases"], "failed": s["failed"], "unsupported": s["unsupported"],
                     "worst ratio": s["worst_ratio"], "wall s": round(r.wall_s, 1), "reason": s["reason"]})
    return report.table(pd.DataFrame(rows), "candidate")


def gate_table(gate):
    """Every candidate's cases in one long table (candidate first)."""
    import pandas as pd
    return pd.DataFrame(gate.rows())


# ------------------------------------------------------------------------------------------ one report

def _row_ticks(ax, case) -> None:
    rows = case.batch * case.heads
    ax.set_ylabel("batch, head")
    if rows <= 16:
        ax.set_yticks(range(rows), [f"b{b} h{h}" for b in range(case.batch) for h in range(case.heads)], fontsize=7)


def _log_image(ax, hm: np.ndarray, **kw):
    """error / allowed on a log scale from 1e-3, infinite (NaN output) drawn as 1e6."""
    from matplotlib.colors import LogNorm
    hm = np.clip(np.nan_to_num(hm, posinf=1e6), 1e-3, 1e6)
    im = ax.imshow(hm, cmap="magma", norm=LogNorm(vmin=1e-3, vmax=max(1e1, hm.max())), interpolation="nearest",
                   **kw)
    ax.figure.colorbar(im, ax=ax, label="error / allowed")
    return hm


def _axes(ax, figsize):
    import matplotlib.pyplot as plt
    return ax or plt.subplots(figsize=figsize)[1]


def plot_heatmap(rep, case: int | str | None = None, ax=None):
    """Per-tile error / allowed: rows are (batch, head), columns query tiles; >1 fails."""
    r = rep.pick(case, "heatmap")
    ax = _axes(ax, (6, 2.5))
    hm = _log_image(ax, r.heatmap, aspect="auto")
    ax.set_xlabel(f"query tile ({rep.tile} rows)")
    _row_ticks(ax, r.case)
    ax.set_xticks(range(hm.shape[1]))
    ax.set_title(f"{rep.candidate}: {r.case.name} [{r.dtype}]", fontsize=8)
    return ax


def plot_p_heatmap(rep, case: int | str | None = None, ax=None):
    """Error of the exposed P per (query tile, key tile) on the worst head."""
    r = rep.pick(case, "p_heatmap")
    ax = _axes(ax, (4, 3))
    _log_image(ax, r.p_heatmap)
    ax.set_xlabel(f"key tile ({rep.tile})")
    ax.set_ylabel(f"query tile ({rep.tile})")
    ax.set_title(f"P error: {r.case.name}", fontsize=8)
    return ax


def plot_nan_map(rep, case: int | str | None = None, ax=None):
    """Where the output is non-finite (gold finite): rows (batch, head) x query position."""
    r = rep.pick(case, "nan_map")
    ax = _axes(ax, (6, 2.5))
    ax.imshow(r.nan_map, aspect="auto", cmap="Greys", interpolation="nearest", vmin=0, vmax=1)
    ax.set_xlabel("query row")
    _row_ticks(ax, r.case)
    ax.set_title(f"non-finite rows (black): {rep.candidate} {r.case.name} ({int(r.nan_map.sum())} rows)",
                 fontsize=8)
    return ax


def plot_ratios(rep, ax=None):
    """e(candidate) / e(baseline) per case, with the pass line at 2 (plus the atol allowance)."""
    ax = _axes(ax, (6, 2.5))
    rs = [r for r in rep.supported if r.rule is not None]
    y = np.maximum([min(r.rule.ratio, 1e6) if math.isfinite(r.rule.ratio) else 1e6 for r in rs], 1e-3)
    for kind, color, marker in (("pass", "tab:green", "o"), ("fail", "tab:red", "o"), ("nonfinite", "tab:red", "x")):
        idx = [i for i, r in enumerate(rs) if (r.passed if kind == "pass" else
                                               (not r.passed and (r.rule.nonfinite > 0) == (kind == "nonfinite")))]
        if idx:
            ax.scatter(idx, y[idx], c=color, marker=marker, s=14, label=kind)
    ax.axhline(PASS_LINE, color="grey", ls="--", lw=1, label="2x baseline")
    ax.set_yscale("log")
    ax.set_xlabel("case")
    ax.set_ylabel("e(cand) / e(baseline)")
    ax.set_title(f"{rep.candidate}: worst ratio {rep.worst_ratio:.2f}", fontsize=9)
    ax.legend(fontsize=7)
    return ax


def plot_report(rep, ax=None):
    """The one figure that says most about a candidate: the worst heatmap when it fails, else its ratios."""
    return plot_heatmap(rep, ax=ax) if any(r.heatmap is not None for r in rep.results) else plot_ratios(rep, ax)


def show_report(rep) -> None:
    """plot_report, shown now (what the notebook's interactive picker calls)."""
    import matplotlib.pyplot as plt
    plot_report(rep)
    plt.show()


def failure_figure(rep):
    """A failing candidate in one row: heatmap of the worst case, ratios per case, and the NaN map when
    outputs are non-finite (else the P heatmap when the candidate exposes P)."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 3))
    plot_heatmap(rep, ax=axes[0])
    plot_ratios(rep, ax=axes[1])
    if any(r.nan_map is not None and r.nan_map.any() for r in rep.failures):
        plot_nan_map(rep, ax=axes[2])
    elif any(r.p_heatmap is not None for r in rep.failures):
        plot_p_heatmap(rep, ax=axes[2])
    else:
        axes[2].axis("off")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------ the gate

def plot_ratio_distribution(gate, ax=None):
    """Where each candidate sits against the 2x line: the margin a passing kernel has."""
    t = gate_table(gate)
    t = t[t.status != "unsupported"] if len(t) else t
    names = list(gate.reports)
    ax = _axes(ax, (7, 0.5 + 0.45 * len(names)))
    data = [np.clip(t[t.candidate == n].ratio.replace([np.inf], 1e6).dropna().to_numpy(), 1e-3, 1e6)
            if len(t) else np.array([]) for n in names]
    ax.boxplot([d if len(d) else [np.nan] for d in data], vert=False, showfliers=True)
    ax.set_yticks(range(1, len(names) + 1), names)
    ax.axvline(PASS_LINE, color="tab:red", ls="--", lw=1, label="2x baseline (pass line, before atol)")
    ax.set_xscale("log")
    finite = np.concatenate([d for d in data if len(d)]) if any(len(d) for d in data) else np.array([1.0])
    lo, hi = min(0.1, finite.min() / 1.5), max(10.0, finite.max() * 1.5)
    ax.set_xlim(lo, hi)
    ticks = [x for x in (1e-3, 1e-2, 0.1, 0.5, 1, 2, 5, 10, 1e2, 1e3, 1e4, 1e5, 1e6) if lo <= x <= hi]
    ax.set_xticks(ticks, [f"{x:g}" for x in ticks])
    ax.set_xlabel("e(candidate) / e(baseline) per case")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"oracle error ratios ({gate.device}, {'/'.join(gate.dtypes)})", fontsize=9)
    return ax


def show_finding(gate) -> None:
    """The gate's headline as the notebook's finding, with the backends this device lacks."""
    from IPython.display import Markdown, display
    missing = f" Not on this device: {', '.join(gate.unavailable)}." if gate.unavailable else ""
    display(Markdown(f"**Finding:** {report.esc(gate.headline())}.{missing}"))


def show_failures(gate, max_cases: int = 12) -> None:
    """For each failing candidate: the reason, its failing cases, the failure figure and the worst elements;
    then the ratio distribution of every candidate (for an all-pass gate, the only figure there is)."""
    if not gate.applies:   # before matplotlib's import: a notebook that does not apply ends in a second
        return
    import matplotlib.pyplot as plt
    from IPython.display import Markdown, display
    for rep in gate.failing:
        display(Markdown(f"### {rep.candidate}\n{rep.summary()['reason']}"))
        if rep.error:  # the check itself did not finish (hang, crash): no cases to show
            continue
        t = report_table(rep)
        display(t[~t.passed].head(max_cases))
        failure_figure(rep)
        plt.show()
        display(worst_table(rep))
    if not gate.failing:
        display(Markdown("Every candidate passes every supported case: no heatmap to show. The ratio distribution:"))
    plot_ratio_distribution(gate)
    plt.show()
