"""What was recorded, as tables and a Chrome trace (pure functions of a Snapshot)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpulab.trace.ring import OpRecord, Snapshot

def first_nonfinite(snapshot: Snapshot) -> OpRecord | None:
    """The first op whose floating outputs held NaN/Inf (stats mode), or None."""
    if snapshot.first_nonfinite is not None:
        rec = snapshot.by_seq(snapshot.first_nonfinite)
        if rec is not None:
            return rec
    for r in snapshot.records:
        if r.stats and r.stats.get("nonfinite"):
            return r
    return None


def _args_brief(args: list) -> str:
    parts = []
    for a in args:
        if "shape" in a:
            parts.append(f"{a['dtype']}{a['shape']}" + ("" if a["contiguous"] else "nc"))
        else:
            parts.append(str(a.get("value", a.get("truncated", ""))))
    return ", ".join(parts)


def to_frame(snapshot: Snapshot):
    """One row per record (pandas), times relative to the log's creation."""
    import pandas as pd

    rows = []
    t0 = snapshot.t0
    for r in snapshot.records:
        tensors = [a for a in r.args if "shape" in a]
        rows.append({
            "seq": r.seq, "name": r.name, "kind": r.kind, "depth": r.depth, "thread": r.thread,
            "call_site": r.call_site, "start_ms": (r.t_start - t0) * 1e3,
            "dur_us": (r.t_end - r.t_start) * 1e6 if r.t_end is not None else float("nan"),
            "in_flight": r.t_end is None, "raised": r.raised, "gpu_done": r.gpu_done,
            "args": _args_brief(r.args), "device": tensors[0]["device"] if tensors else "",
            "dtype": tensors[0]["dtype"] if tensors else "",
            "min": r.stats["min"] if r.stats else None, "max": r.stats["max"] if r.stats else None,
            "mean": r.stats["mean"] if r.stats else None, "nan": r.stats["nan"] if r.stats else None,
            "inf": r.stats["inf"] if r.stats else None,
            "neginf": r.stats["neginf"] if r.stats else None,
        })
    cols = ["seq", "name", "kind", "depth", "thread", "call_site", "start_ms", "dur_us", "in_flight", "raised",
            "gpu_done", "args", "device", "dtype", "min", "max", "mean", "nan", "inf", "neginf"]
    return pd.DataFrame(rows, columns=cols)


def summary(frame):
    """Per op type: count, total and mean host time (composites excluded: they contain other rows)."""
    import pandas as pd

    ops = frame[frame["kind"] == "op"]
    if ops.empty:
        return pd.DataFrame(columns=["name", "count", "total_ms", "mean_us", "share"])
    g = ops.groupby("name")["dur_us"].agg(["count", "sum", "mean"]).reset_index()
    g = g.rename(columns={"sum": "total_ms", "mean": "mean_us"})
    g["total_ms"] = g["total_ms"] / 1e3
    total = g["total_ms"].sum()
    g["share"] = g["total_ms"] / total if total else 0.0
    return g.sort_values("total_ms", ascending=False).reset_index(drop=True)


def memory_frame(snapshot: Snapshot):
    import pandas as pd

    return pd.DataFrame([{"t_s": m.t - snapshot.t0, "seq": m.seq, "allocated_mb": m.allocated / 2**20,
                          "reserved_mb": None if m.reserved is None else m.reserved / 2**20}
                         for m in snapshot.memory], columns=["t_s", "seq", "allocated_mb", "reserved_mb"])


def to_chrome_trace(snapshot: Snapshot, path: str | os.PathLike) -> Path:
    """Chrome-trace JSON (Perfetto / chrome://tracing): one row per thread, memory as a counter track."""
    t0 = snapshot.t0
    end = max([r.t_end or r.t_start for r in snapshot.records] + [t0])
    ev: list[dict[str, Any]] = []
    tids: dict[str, int] = {}
    for r in snapshot.records:
        tid = tids.setdefault(r.thread, len(tids) + 1)
        t1 = r.t_end if r.t_end is not None else end
        ev.append({"name": r.name, "cat": r.kind, "ph": "X", "pid": snapshot.pid, "tid": tid,
                   "ts": (r.t_start - t0) * 1e6, "dur": max(0.0, (t1 - r.t_start) * 1e6),
                   "args": {"seq": r.seq, "args": _args_brief(r.args), "call_site": r.call_site,
                            "in_flight": r.t_end is None, "gpu_done": r.gpu_done, "stats": r.stats}})
    for name, tid in tids.items():
        ev.append({"name": "thread_name", "ph": "M", "pid": snapshot.pid, "tid": tid, "args": {"name": name}})
    label = "cuda allocated MB" if snapshot.device == "cuda" else "memory MB"
    for m in snapshot.memory:
        ev.append({"name": label, "ph": "C", "pid": snapshot.pid, "ts": (m.t - t0) * 1e6,
                   "args": {"allocated": m.allocated / 2**20}})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": ev, "displayTimeUnit": "ms",
                                "otherData": {"mode": snapshot.mode, "device": snapshot.device,
                                              "dropped": snapshot.dropped}}))
    return path

