"""Notebook 02's plots of a recording (matplotlib, imported where drawn)."""
from __future__ import annotations

from typing import Any

from gpulab.trace.analysis import KINDS_ORDER, op_category


def log_axis(ax: Any, label: str, axis: str = "x") -> None:
    """A log-scale axis with its label, ticks as plain numbers (0.3, 1, 30), not 3x10^-1."""
    from matplotlib.ticker import FuncFormatter

    x = axis == "x"
    (ax.set_xscale if x else ax.set_yscale)("log")
    target = ax.xaxis if x else ax.yaxis
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    (ax.set_xlabel if x else ax.set_ylabel)(label)


def _nothing(ax: Any, text: str):
    """A sentence where a plot would be empty."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    return ax


def _top_rows(table, ax: Any, top: int):
    """(axes to draw on, the table's first `top` rows bottom-up: horizontal bars list the largest on top)."""
    import matplotlib.pyplot as plt

    return ax or plt.subplots(figsize=(8, 4))[1], table.head(top).iloc[::-1]


def plot_timeline(frame, ax: Any = None, max_rows: int = 4000):
    """Host time of each op against wall time, one lane per kind of work (matrix multiplies, attention,
    layout copies, syncs, ...), coloured by thread: where the time goes and when, at a glance."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(11, 3.4))[1]
    f = frame[frame["kind"] == "op"].head(max_rows)
    if f.empty:
        return _nothing(ax, "no op was recorded")
    f = f.assign(start_ms=f["start_ms"] - f["start_ms"].min())  # from the first op, not the recorder's start
    cats = f["name"].map(op_category)
    lanes = [k for k in KINDS_ORDER if (cats == k).any()]
    threads = list(dict.fromkeys(f["thread"]))
    cmap = plt.get_cmap("tab10")
    for j, th in enumerate(threads):
        for i, lane in enumerate(lanes):
            sel = f[(f["thread"] == th) & (cats == lane)]
            if sel.empty:
                continue
            dur = (sel["dur_us"].fillna(0) / 1e3).clip(lower=0.002)
            ax.broken_barh(list(zip(sel["start_ms"], dur)), (i - 0.4, 0.8), color=cmap(j % 10), alpha=0.85,
                           label=(th.split(" (")[0] if i == 0 or th.split(" (")[0] not in
                                  ax.get_legend_handles_labels()[1] else None))
    fl = f[f["in_flight"]]
    if not fl.empty:
        ax.scatter(fl["start_ms"], [lanes.index(op_category(n)) for n in fl["name"]], marker="x", color="red",
                   zorder=5, s=60, label="in flight (never finished)")
    ax.set_yticks(range(len(lanes)), lanes)
    ax.set_xlabel("ms since the first op")
    ax.set_title(f"op timeline: {len(f)} ops by kind of work (colour: thread)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, title="thread", title_fontsize=8)
    return ax


def plot_summary(summ, ax: Any = None, top: int = 15):
    """Total host time per op type, on a log axis: op types span several decades."""
    ax, s = _top_rows(summ, ax, top)
    if s.empty:
        return _nothing(ax, "no op was recorded")
    ax.barh(s["name"].str.replace("aten.", "", regex=False), s["total_ms"].clip(lower=1e-4))
    log_axis(ax, "total host time (ms, log scale)")
    ax.set_title(f"time per op type (top {min(top, len(summ))})")
    ax.tick_params(axis="y", labelsize=8)
    return ax


def plot_warmup(ws, ax: Any = None, top: int = 12):
    """First calls (set-up: handles, autotuning, module loading) against the calls after them, per op type."""
    ax, s = _top_rows(ws, ax, top)
    if s.empty:
        return _nothing(ax, "no op was recorded")
    names = s["name"].str.replace("aten.", "", regex=False)
    y = range(len(s))
    ax.barh([i + 0.2 for i in y], s["first_calls_ms"].clip(lower=1e-4), height=0.4, color="#bc4c00",
            label="first call of each shape (warm-up)")
    steady = s["steady_ms"].where(s["steady_calls"] > 0)  # no later call: no bar (not a zero-length one)
    ax.barh([i - 0.2 for i in y], steady, height=0.4, color="#0969da", label="every later call (steady state)")
    ax.set_yticks(list(y), names, fontsize=8)
    log_axis(ax, "host time (ms, log scale)")
    ax.set_title("warm-up apart from steady state")
    ax.legend(fontsize=8, loc="lower right")
    return ax


def plot_overhead(ov, device: str, rung: str, ax: Any = None, mode: str | None = None):
    """What each recording mode costs per op in this run, on a log axis (modes differ by decades), the chain's
    own `mode` in a colour of its own; nothing when it was not measured (ov None)."""
    import matplotlib.pyplot as plt

    if ov is None:
        return None
    ax = ax or plt.subplots(figsize=(7, 3))[1]
    rows = ov[(ov["variant"] != "none") & (ov["us_per_op"] > 0)]
    if rows.empty:
        return _nothing(ax, "the cost of recording was below this run's timing noise")
    ax.bar(rows["variant"], rows["us_per_op"],
           color=["#cf222e" if v == mode else "#0969da" for v in rows["variant"]])
    log_axis(ax, "us per op over no recorder (log)", "y")
    ax.set_title(f"recording cost per op ({device}, {rung} rung, measured in this run)"
                 + (f"; red: {mode}, the chain's mode" if mode in set(rows["variant"]) else ""))
    return ax


def plot_memory(mem, device: str, ax: Any = None):
    """Host memory (RSS) and GPU memory (allocated, reserved by the caching allocator), as separate series."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(8, 3))[1]
    if mem.empty:
        return _nothing(ax, "no memory samples")
    mem = mem.assign(t_s=mem["t_s"] - mem["t_s"].min())
    series = [("rss_mb", "host RSS"), ("allocated_mb", "GPU allocated"), ("reserved_mb", "GPU reserved")]
    for col, label in series:
        if col in mem and mem[col].notna().any():
            ax.plot(mem["t_s"], mem[col], label=label)
    ax.set_xlabel("s since the first sample")
    ax.set_ylabel("MiB")
    ax.set_title("memory during the recording")
    ax.legend(fontsize=8)
    return ax
