"""Notebook 03's tables and plots of a verdict (pandas and matplotlib, imported where drawn: `gpulab.hang`
itself must import without them in a watched child)."""
from __future__ import annotations

from typing import Any

from gpulab.hang.verdict import Verdict, op_brief


def verdict_table(v: Verdict):
    """One row per verdict field a person reads first."""
    import pandas as pd

    op = v.in_flight_op or {}
    rows = [("status", v.status), ("phase", v.phase), ("class", v.cls or "-"),
            ("in-flight op", op_brief(v.in_flight_op)), ("dtypes", ", ".join(map(str, op.get("dtypes") or ())) or "-"),
            ("strides", " x ".join(str(tuple(s)) for s in op.get("strides") or ()) or "-"),
            ("device", op.get("device") or "-"), ("call site", op.get("call_site") or "-"),
            ("host blocked in", (v.host_blocked_in or {}).get("name", "-")),
            ("last completed op", op_brief(v.last_completed_op)), ("ops completed", v.ops_completed),
            ("signal / exit code", f"{v.signal or '-'} / {v.exit_code}"), ("elapsed", f"{v.elapsed_s:.2f} s"),
            ("time to verdict", f"{v.time_to_verdict_s:.2f} s" if v.time_to_verdict_s is not None else "-"),
            ("planted", f"yes, a self-test: {v.planted}" if v.planted else "no (the workload as it runs)"),
            ("trace mode", v.mode or "not recorded")]
    return pd.DataFrame(rows, columns=["field", "value"]).set_index("field")


def evidence_table(v: Verdict):
    import pandas as pd

    return pd.DataFrame({"fact": list(v.evidence)})


def stacks_table(v: Verdict, max_chars: int = 400):
    """Collapsed stacks (outermost;...;innermost), one row per thread, innermost end kept when cut."""
    import pandas as pd

    rows = []
    for kind in ("python", "native"):
        for line in v.collapsed.get(kind, ()):
            thread, _, stack = line.partition(": ")
            rows.append({"kind": kind, "thread": thread,
                         "stack (outer;...;inner)": stack if len(stack) <= max_chars else "..." + stack[-max_chars:]})
    return pd.DataFrame(rows, columns=["kind", "thread", "stack (outer;...;inner)"])


def oplog_table(v: Verdict):
    import pandas as pd

    rows = [{"seq": o["seq"], "op": o["name"], "shapes": " x ".join(str(tuple(s)) for s in o["shapes"]),
             "state": "IN FLIGHT" if o["t_end"] is None else "done",
             "gpu": {None: "-", True: "done", False: "PENDING"}[o["gpu_done"]],
             "ms": round(o["duration_s"] * 1e3, 3) if o["duration_s"] is not None else None,
             "call site": o["call_site"]} for o in v.oplog_tail]
    return pd.DataFrame(rows, columns=["seq", "op", "shapes", "state", "gpu", "ms", "call site"])


def plot_time_to_verdict(v: Verdict, ax: Any = None):
    """Where the time between the hang's start and the verdict went: stall window, then each capture."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 2.2))
    if v.time_to_verdict_s is None:
        ax.text(0.5, 0.5, f"status {v.status}: no hang, so no time to verdict", ha="center", va="center")
        ax.set_axis_off()
        return ax
    parts = [("stall window", v.stall_s)] + [(f"{k} capture", s) for k, s in v.capture_s.items()
                                             if k not in ("total", "oplog")]
    parts.append(("stop + verdict", max(0.0, v.time_to_verdict_s - v.stall_s - v.capture_s.get("total", 0.0))))
    left, colors = 0.0, plt.get_cmap("tab10").colors
    for i, (label, width) in enumerate(parts):
        ax.barh(0, width, left=left, color=colors[i % 10], label=f"{label} {width:.2f} s")
        left += width
    ax.axvline(v.stall_s + 5.0, color="k", ls="--", lw=1)
    ax.text(v.stall_s + 5.0, 0.45, " goal: capture within 5 s", fontsize=8, va="bottom")
    ax.set_yticks([])
    ax.set_xlabel("seconds after the last progress (the hang's start)")
    ax.set_title(f"time to verdict {v.time_to_verdict_s:.2f} s ({v.status}, {v.cls})")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=3, fontsize=8, frameon=False)
    return ax
