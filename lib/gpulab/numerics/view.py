"""Notebook 05's comparison shown: the error along the run (op index against error over tolerance, log scale, the
tolerance line at 1 and the first divergence marked), the first diverging ops, and the finding in a sentence.
pandas, matplotlib and IPython are imported where used (the recorded children never need them).
"""
from __future__ import annotations

import math

from gpulab import report

FLOOR = 1e-9   # an exact match drawn here on the log axis (zero has no place on it)
CEIL = 1e9     # NaN/Inf differences drawn here


def _y(v) -> float:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return CEIL
    return min(max(float(v), FLOOR), CEIL)


def plot_error_along(c, ax=None):
    """Each aligned op's error over tolerance in run order; above the line at 1 an op is beyond tolerance."""
    import matplotlib.pyplot as plt

    t = c.table
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3.4))
    if t.empty:
        ax.text(0.5, 0.5, "no aligned ops to plot", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return ax
    ys = [_y(v) for v in t["excess"]]
    ax.scatter(t["n"], ys, s=6, c=["tab:red" if y > 1.0 else "tab:blue" for y in ys], linewidths=0)
    ax.axhline(1.0, color="black", lw=0.8, ls="--", label="tolerance (error = tolerance)")
    first = t[t["first_divergence"]]
    if not first.empty:
        r = first.iloc[0]
        ax.axvline(r["n"], color="tab:red", lw=0.8)
        ax.annotate(f"first divergence: {r['op']}\n{r['call_site']} (pass {r['pass']})", (r["n"], _y(r["excess"])),
                    xytext=(8, 8), textcoords="offset points", fontsize=8, color="tab:red")
    ax.set_yscale("log")
    ax.set_xlabel("op index (aligned, reference order)")
    ax.set_ylabel("error / tolerance")
    ax.set_title(f"Error along the run ({c.status})")
    ax.legend(loc="upper left", fontsize=8)
    return ax


def diverging_table(c, k: int = 10):
    """The first k ops beyond tolerance, in run order (the first one is where the difference starts)."""
    cols = ["n", "op", "call_site", "pass", "backward", "excess", "max_rel_err", "first_divergence"]
    return report.table(c.diverging[cols].head(k), "n")


def show(v, c) -> None:
    """What was compared, and (when something ran) the verdict, the plot and the first diverging ops."""
    from IPython.display import Markdown, display

    if c is None:
        display(Markdown(f"**Comparison `{report.esc(v.mode)}`**: {report.esc(v.what)}"))
        return
    stop = "" if v.what.endswith(("?", ".")) else "."
    display(Markdown(f"**Comparison `{report.esc(v.mode)}`**: {report.esc(v.what)}{stop}\n\n"
                     f"**{report.esc(c.status)}**: {report.esc(c.summary)}"))
    if c.rows:
        plot_error_along(c)
        import matplotlib.pyplot as plt
        plt.show()
    if c.status == "diverged" and not c.diverging.empty:
        display(diverging_table(c))
