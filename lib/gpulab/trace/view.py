"""Notebook 02's plots of a recording."""
from __future__ import annotations

def plot_timeline(frame, ax=None, max_rows: int = 4000):
    """Host time of each op against wall time, one lane per thread (composite SDPA records drawn wide)."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(11, 3.2))[1]
    f = frame.head(max_rows)
    threads = list(dict.fromkeys(f["thread"]))
    names = f["name"].str.replace("aten.", "", regex=False).str.split(".").str[0]
    top = names.value_counts().index[:9].tolist()
    cmap = plt.get_cmap("tab10")
    for i, th in enumerate(threads):
        sub = f[f["thread"] == th]
        sn = names[sub.index]
        for j, key in enumerate(top + ["other"]):
            sel = sub[sn.isin([key]) if key != "other" else ~sn.isin(top)]
            if sel.empty:
                continue
            dur = (sel["dur_us"].fillna(0) / 1e3).clip(lower=0.002)
            ax.broken_barh(list(zip(sel["start_ms"], dur)), (i - 0.4, 0.8), color=cmap(j % 10),
                           label=key if i == 0 or key not in ax.get_legend_handles_labels()[1] else None)
        fl = sub[sub["in_flight"]]
        if not fl.empty:
            ax.scatter(fl["start_ms"], [i] * len(fl), marker="x", color="red", zorder=5, label="in flight")
    ax.set_yticks(range(len(threads)), [t[:28] for t in threads])
    ax.set_xlabel("ms since the recorder started")
    ax.set_title(f"op timeline ({len(f)} records)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    return ax


def plot_summary(summ, ax=None, top: int = 15):
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(8, 4))[1]
    s = summ.head(top).iloc[::-1]
    ax.barh(s["name"].str.replace("aten.", "", regex=False), s["total_ms"])
    ax.set_xlabel("total host time (ms)")
    ax.set_title("time per op type")
    return ax


def plot_memory(mem, device: str, ax=None):
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(8, 3))[1]
    if mem.empty:
        ax.text(0.5, 0.5, "no memory samples", ha="center", transform=ax.transAxes)
        return ax
    ax.plot(mem["t_s"], mem["allocated_mb"], label="allocated" if device == "cuda" else "process RSS")
    if device == "cuda" and mem["reserved_mb"].notna().any():
        ax.plot(mem["t_s"], mem["reserved_mb"], label="reserved")
    ax.set_xlabel("s since the recorder started")
    ax.set_ylabel("MB")
    ax.set_title("memory during the recording" + (" (CUDA caching allocator)" if device == "cuda" else ""))
    ax.legend()
    return ax
