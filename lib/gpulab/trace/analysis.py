"""What was recorded, as tables and a Chrome trace (pure functions of a Snapshot)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpulab import report
from gpulab.hang import classify
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
    """Memory samples as separate series: host RSS, and GPU allocated/reserved once CUDA is in use (a sample
    without a reserved figure was taken before CUDA started and holds RSS; never mix the two in one line)."""
    import pandas as pd

    rows = []
    for m in snapshot.memory:
        gpu = m.reserved is not None
        rows.append({"t_s": m.t - snapshot.t0, "seq": m.seq, "rss_mb": None if gpu else m.allocated / 2**20,
                     "allocated_mb": m.allocated / 2**20 if gpu else None,
                     "reserved_mb": m.reserved / 2**20 if gpu else None})
    return pd.DataFrame(rows, columns=["t_s", "seq", "rss_mb", "allocated_mb", "reserved_mb"])


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
    return report.write_text(path, json.dumps({"traceEvents": ev, "displayTimeUnit": "ms",
                                "otherData": {"mode": snapshot.mode, "device": snapshot.device,
                                              "dropped": snapshot.dropped}}))


# ---------------------------------------------------------------------------------------------- warm-up

KINDS_ORDER = ("gemm", "attention", "layout", "sync", "collective", "other")


def op_category(name: str) -> str:
    """The lane an op is drawn in: what kind of work it is (gemm, attention/softmax, layout/copy, ...)."""
    kind = classify.op_kind(name)
    return {"softmax": "attention", None: "other"}.get(kind, kind)


def warmup_split(frame):
    """Per op type: the first call of each (op, argument signature) - handle creation, autotuning, lazy
    module loading - apart from the calls after it (steady state). A first call that costs many times the
    steady median is set-up, not the op's cost."""
    import pandas as pd

    cols = ["name", "calls", "first_calls_ms", "steady_calls", "steady_median_us", "steady_ms", "warmup_share"]
    ops = frame[(frame["kind"] == "op") & frame["dur_us"].notna()]
    if ops.empty:
        return pd.DataFrame(columns=cols)
    first = ~ops.duplicated(subset=["name", "args"], keep="first")
    rows = []
    for name, g in ops.groupby("name"):
        f, s = g[first[g.index]], g[~first[g.index]]
        warm_ms, steady_ms = f["dur_us"].sum() / 1e3, s["dur_us"].sum() / 1e3
        rows.append({"name": name, "calls": len(g), "first_calls_ms": warm_ms, "steady_calls": len(s),
                     "steady_median_us": float(s["dur_us"].median()) if len(s) else None,
                     "steady_ms": steady_ms,
                     "warmup_share": warm_ms / (warm_ms + steady_ms) if warm_ms + steady_ms else 0.0})
    return pd.DataFrame(rows, columns=cols).sort_values("first_calls_ms", ascending=False).reset_index(drop=True)


def finding(snap: Snapshot, returncode: int | None, ov, bad: OpRecord | None, rung: str, device: str,
            log: str) -> tuple[str, dict[str, Any]]:
    """Notebook 02's headline and metrics. The recording cost is stated only when this run could measure
    it: a cost below the run's noise (a negative or near-zero difference) is said to be too small to see."""
    per_op = {r.variant: round(float(r.us_per_op), 2) for r in ov.itertuples() if r.variant != "none"}
    ops_cost, bare = per_op.get("ops"), per_op.get("passthrough")
    if ops_cost is None:
        cost = "recording cost not measured"
        ratio = None
    elif ops_cost <= 0.5 or (bare is not None and bare <= 0.5):
        cost = ("the recorder's cost is below this run's timing noise (a shared or busy machine); "
                "benchmarks/bench_trace_overhead.py measures it properly")
        ratio = None
    else:
        ratio = ops_cost / bare if bare else None
        cost = f"crash-safe recording costs {ops_cost:.1f} us per op" + (f" ({ratio:.2f}x a bare dispatch mode)"
                                                                         if ratio else "")
    headline = (f"{snap.started} ops recorded ({rung} rung on {device}); {cost}"
                + (f"; first op to produce NaN/Inf: {bad.name}" if bad else "; no op produced NaN/Inf"))
    metrics = dict(ops_recorded=snap.started, exit_code=returncode, overhead_us_per_op=per_op,
                   ops_vs_passthrough=ratio, first_nonfinite_op=bad.name if bad else None,
                   first_nonfinite_seq=bad.seq if bad else None, log=log)
    return headline, metrics


def save(snapshot: Snapshot, frame, out_dir: str | os.PathLike) -> None:
    """02's products: every record as ops.csv, and a Chrome trace (Perfetto) as trace.json."""
    report.write_text(report.product(out_dir, "ops.csv"), frame.to_csv(index=False))
    to_chrome_trace(snapshot, report.product(out_dir, "trace.json"))


def recording_note(rec: Any, out_dir: str | os.PathLike) -> str:
    """One sentence (Markdown, outside text escaped) about the recorded run."""
    snap = rec.snapshot
    log = os.path.relpath(rec.log, out_dir)
    if snap is None:
        return f"**The recorded run left no op log** (exit {report.esc(rec.returncode)}; see {report.code(log)})."
    how = "finished" if rec.ok else ("was stopped at its deadline" if rec.timed_out else f"ended with exit code {rec.returncode}")
    return (f"The workload {how} after {rec.elapsed_s:.1f} s: {snap.started} ops recorded"
            + (f", the oldest {snap.dropped} overwritten (ring of {snap.capacity})" if snap.dropped else "")
            + f". Products: {report.code('ops.csv')} (every op), {report.code('trace.json')} (open it in "
            f"Perfetto), the op log {report.code(log)}.")


def nonfinite_note(bad: OpRecord | None, snapshot: Snapshot) -> str:
    if bad is None:
        return f"**No op produced NaN/Inf** in {snapshot.started} recorded ops (stats mode checks every output)."
    return (f"**First op to produce NaN/Inf:** {report.code(bad.name)} (op {bad.seq}) at "
            f"{report.code(bad.call_site)}, inputs {report.code(_args_brief(bad.args))}.")


def _reader_table(frame, columns: dict[str, str], index: str, percent: str | None = None):
    """A table for a reader: columns renamed to words, `percent` (a share) as a percentage."""
    t = frame.rename(columns=columns)
    if percent:
        t[percent] = [f"{v:.0%}" for v in t[percent]]
    return report.table(t, index)


def summary_table(summ, top: int = 12):
    """02's host-time table for a reader: op, calls, total and mean host time, share (and GPU time)."""
    cols = {"name": "op", "count": "calls", "total_ms": "host ms (total)", "mean_us": "host us (mean)",
            "share": "share of host time", "gpu_ms": "GPU ms (total)"}
    return _reader_table(summ.head(top), cols, "op", "share of host time")


def warmup_table(ws, top: int = 12):
    cols = {"name": "op", "calls": "calls", "first_calls_ms": "first calls, ms (warm-up)",
            "steady_calls": "later calls", "steady_median_us": "later calls, median us", "steady_ms": "later calls, ms",
            "warmup_share": "warm-up share"}
    return _reader_table(ws.head(top), cols, "op", "warm-up share")


def _overhead_rows(ov):
    """The overhead table without its raw samples."""
    return ov.drop(columns=["samples_s"], errors="ignore")


def save_overhead(ov, out_dir: str | os.PathLike) -> None:
    """02's overhead.csv (and .json): what each recording mode cost in this run."""
    report.write_rows(out_dir, "overhead", _overhead_rows(ov).to_dict("records"))


def overhead_table(ov):
    cols = {"variant": "recording mode", "ops": "ops", "median_s": "run s (median)", "baseline_s": "no recorder s",
            "us_per_op": "us per op over no recorder", "ratio": "x pass-through"}
    return _reader_table(_overhead_rows(ov), cols, "recording mode")
