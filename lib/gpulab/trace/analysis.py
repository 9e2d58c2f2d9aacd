"""What was recorded, as tables and a Chrome trace (pure functions of a Snapshot)."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpulab import report
from gpulab.trace import firstnan, vocab
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


def to_frame(snapshot: Snapshot | None):
    """One row per record (pandas), times relative to the log's creation (no rows without a log)."""
    import pandas as pd

    rows = []
    t0 = snapshot.t0 if snapshot is not None else 0.0
    for r in snapshot.records if snapshot is not None else ():
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


def memory_frame(snapshot: Snapshot | None):
    """Memory samples as separate series: host RSS, and GPU allocated/reserved once CUDA is in use (a sample
    without a reserved figure was taken before CUDA started and holds RSS; never mix the two in one line)."""
    import pandas as pd

    rows = []
    for m in snapshot.memory if snapshot is not None else ():
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
    kind = vocab.op_kind(name)
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


def _cost(ov, mode: str = "ops") -> tuple[str, dict[str, float] | None, float | None]:
    """(the recording cost of `mode` in words, us per op by mode, `mode` vs pass-through) from the overhead
    table."""
    if ov is None:
        return "recording cost not measured", None, None
    per_op = {r.variant: round(float(r.us_per_op), 2) for r in ov.itertuples() if r.variant != "none"}
    cost, bare = per_op.get(mode), per_op.get("passthrough")
    if cost is None:
        return "recording cost not measured", per_op, None
    if cost <= 0.5 or (bare is not None and bare <= 0.5):
        return ("the recorder's cost is below this run's timing noise (a shared or busy machine); "
                "benchmarks/bench_trace_overhead.py measures it properly"), per_op, None
    ratio = cost / bare if bare else None
    return (f"crash-safe recording ({mode} mode, as the chain records) costs {cost:.1f} us per op"
            + (f" ({ratio:.2f}x a bare dispatch mode)" if ratio else "")), per_op, ratio


def _where(rec: Any) -> tuple[OpRecord | None, OpRecord | None]:
    """(the op that did not finish when the run ended, the last op recorded). The op that did not finish is
    the watchdog's (hang.verdict.localize): the earliest op whose GPU work never completed, else the innermost
    op open on the host; never a sync that only waits behind it."""
    snap = rec.snapshot
    if snap is None or not snap.records:
        return None, None
    return localize(snap.records)[0], snap.records[-1]


def _raised_before(rec: Any) -> str:
    """The latest op the recorder saw raise, when ops ran after it (the exception's unwinding, a handler's
    cleanup): the last op recorded is then not the one that failed (03's verdict says which the traceback names)."""
    raised = next((r for r in reversed(rec.snapshot.records) if r.raised), None)
    if raised is None:   # none marked: none raised, unless this build's ops are not marked when they raise
        return (" (whether it raised is not known: this PyTorch build does not mark the ops that raise)"
                if rec.snapshot.raise_marks is False and rec.returncode not in (None, 0) else "")
    return f"; the latest op to raise: {raised.name}" + (f" at {raised.call_site}" if raised.call_site else "")


def _unfinished(r: OpRecord) -> str:
    return "never finished" if r.t_end is None else "its GPU work never completed"


def _ended(rec: Any) -> str:
    """How the run ended, in a few words: 'hang', 'error (exit 1)', 'crash (SIGSEGV)', 'timeout'."""
    if rec.status == "error":
        return f"error (exit {rec.returncode})"
    if rec.status == "crash" and rec.signal:
        try:
            return f"crash ({signal.Signals(rec.signal).name})"
        except ValueError:
            return f"crash (signal {rec.signal})"
    return rec.status


def cost_metrics(ov, mode: str = "ops") -> dict[str, Any]:
    """06's metrics of the recorder's cost (`recorder_cost`: the sentence; us per op by mode; `mode` against a
    bare dispatch)."""
    cost, per_op, ratio = _cost(ov, mode)
    return {"recorder_cost": cost, "recorder_us_per_op": per_op, "recorder_vs_passthrough": ratio}


def finding(rec: Any, stats_rec: Any, rung: str | None, device: str, log: str, mode: str = "ops",
            cost: str = "recording cost not measured") -> tuple[str, dict[str, Any]]:
    """Notebook 02's headline and metrics, from the first Recording (made in `mode`) and the stats-mode Recording
    (None: not run). 02 times nothing: `cost` says what of the recorder's cost a finished run can say
    (gpulab.trace.followups.cost_words). A run that did not finish says so first, with where it ended."""
    snap = rec.snapshot
    started = snap.started if snap is not None else 0
    checked = stats_rec is not None and stats_rec.snapshot is not None
    bad = first_nonfinite(stats_rec.snapshot) if checked else None
    why = firstnan.read(getattr(stats_rec, "log", None)) if bad else None   # its line, pass and cause
    if firstnan.caught(why):   # a GradScaler's overflow, caught: no NaN/Inf of the program's
        bad, nan = None, "no NaN/Inf that the GradScaler did not catch: " + firstnan.sentence(why)
    elif not checked:
        nan = "NaN/Inf not checked"
    else:
        nan = ((firstnan.sentence(why) or f"first op to produce NaN/Inf: {bad.name}") if bad
               else "no op produced NaN/Inf")
    open_op, last = _where(rec)
    if rec.ok:
        counted = f"{started} ops recorded" if snap is not None else "no op log kept"
        what = f"{rung} rung on {device}" if rung else f"on {device}"   # no rung: what a watch caught
        headline = f"{counted} ({what}); {cost}; {nan}"
    else:
        where = (f", in op {open_op.name} ({_unfinished(open_op)})" if open_op else
                 f", last op {last.name}" + (" (raised)" if last.raised else _raised_before(rec)) if last else
                 ", before any op of its own" if getattr(rec, "processes", 0) else ", before any op")
        if getattr(rec, "shown", ""):
            where = f" (in {rec.shown}){where}"
        skipped = "recording cost and GPU times not measured"
        headline = f"the workload did not finish: {_ended(rec)} after {started} ops{where}; {skipped}; {nan}"
    if getattr(rec, "processes", 0):
        shown = getattr(rec, "shown", "")
        which = (f"02 shows {shown}'s, the busiest (the program it started ran no op of its own: a launcher)"
                 if shown else "02 shows the one it started")
        headline += (f"; it started {rec.processes} other Python process(es), each recorded "
                     f"({getattr(rec, 'process_ops', 0)} ops together; {which}; 03 judges them all)")
    metrics = dict(status=rec.status, ops_recorded=started, exit_code=rec.returncode, recording_mode=mode,
                   overhead_us_per_op=None, mode_vs_passthrough=None,   # the cost is 06's (recorder_us_per_op)
                   first_nonfinite_op=bad.name if bad else None,
                   first_nonfinite_seq=bad.seq if bad else None, nonfinite_checked=checked,
                   in_flight_op=open_op.name if open_op else None, last_op=last.name if last else None, log=log,
                   processes=getattr(rec, "processes", 0), process_ops=getattr(rec, "process_ops", 0),
                   **(firstnan.metrics(why, stats_rec.snapshot) if why else {}))
    return headline, metrics


def save(snapshot: Snapshot | None, frame, out_dir: str | os.PathLike) -> None:
    """02's products: every record as ops.csv, and a Chrome trace (Perfetto) as trace.json (with a log)."""
    report.write_text(report.product(out_dir, "ops.csv"), frame.to_csv(index=False))
    if snapshot is not None:
        to_chrome_trace(snapshot, report.product(out_dir, "trace.json"))


def _how(rec: Any) -> str:
    if rec.ok:
        return "finished"
    if rec.status == "hang":
        return f"made no progress for {rec.stall_s:g} s and was stopped (a hang)"
    if rec.status == "timeout":
        return "was stopped at its deadline, still making progress"
    return f"ended with {_ended(rec)}"


def unfinished_note(rec: Any) -> str:
    """The one sentence that says which measurements a run that did not finish leaves out, and why."""
    if rec.status in ("hang", "timeout"):
        again = "only hang again" if rec.status == "hang" else "only run out of time again"
        return (f"**Not measured:** GPU time per op, the recording cost and the NaN/Inf check need a run that "
                f"finishes, and re-running this one would {again}.")
    return ("**Not measured:** GPU time per op and the recording cost need a run that finishes well; the NaN/Inf "
            "check still runs (stopped when it stalls), since the first NaN/Inf often comes before the "
            f"{rec.status}.")


def recording_note(rec: Any, out_dir: str | os.PathLike) -> str:
    """A few sentences (Markdown, outside text escaped) about the recorded run: how it ended, what it left,
    and, when it did not finish, what is not measured and why."""
    snap = rec.snapshot
    log = os.path.relpath(rec.log, out_dir)
    if snap is None:
        text = (f"**The recorded run left no op log** ({report.esc(_ended(rec))}; see "
                f"{report.code(os.path.relpath(Path(rec.log).with_suffix('.stderr.txt'), out_dir))}).")
    else:
        open_op, _ = _where(rec)
        text = (f"The workload {_how(rec)} after {rec.elapsed_s:.1f} s: {snap.started} ops recorded"
                + (f", the oldest {snap.dropped} overwritten (ring of {snap.capacity})" if snap.dropped else "")
                + (f"; {report.code(open_op.name)} at {report.code(open_op.call_site)} {_unfinished(open_op)}"
                   if open_op and not rec.ok else "")
                + f". Products: {report.code('ops.csv')} (every op), {report.code('trace.json')} (open it in "
                f"Perfetto), the op log {report.code(log)}.")
    return text if rec.ok else f"{text}\n\n{unfinished_note(rec)}"


def last_ops_table(rec: Any, n: int = 15):
    """The last n ops of a run that did not finish (None for one that did): where it was when it ended."""
    snap = rec.snapshot
    if rec.ok or snap is None or not snap.records:
        return None
    rows = [{"seq": r.seq, "op": r.name, "shapes": _args_brief(r.args), "call site": r.call_site,
             "state": "open" if r.t_end is None else "raised" if r.raised else
             "GPU pending" if r.gpu_done is False else "done"}
            for r in snap.records[-n:]]
    return report.table(rows, "seq")


def nonfinite_note(stats_rec: Any, note: str = "") -> str:
    """What the stats-mode rerun found (or why it was not run), in Markdown."""
    if stats_rec is None or stats_rec.snapshot is None:
        return note or "**NaN/Inf not checked:** the stats-mode rerun left no op log."
    snapshot = stats_rec.snapshot
    bad = first_nonfinite(snapshot)
    rec = firstnan.read(getattr(stats_rec, "log", None)) if bad is not None else None   # its line, pass and cause
    if firstnan.caught(rec):
        text = (f"**No NaN/Inf that the GradScaler did not catch** in {snapshot.started} recorded ops: "
                f"{report.esc(firstnan.sentence(rec))}.")
    elif bad is None:
        text = f"**No op produced NaN/Inf** in {snapshot.started} recorded ops (stats mode checks every output)."
    else:
        text = (f"**First op to produce NaN/Inf:** {report.code(bad.name)} (op {bad.seq}) at "
                f"{report.code(bad.call_site)}, inputs {report.code(_args_brief(bad.args))}.")
        why = firstnan.sentence(rec)
        if why:
            text += f" **Why:** {report.esc(why)}."
    return f"{text} {note}".strip()


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
    """06's overhead.csv (and .json): what each recording mode cost in this run (nothing when not measured)."""
    if ov is None:
        return
    report.write_rows(out_dir, "overhead", _overhead_rows(ov).to_dict("records"))


def overhead_table(ov):
    if ov is None:
        return None
    cols = {"variant": "recording mode", "ops": "ops", "median_s": "run s (median)", "baseline_s": "no recorder s",
            "us_per_op": "us per op over no recorder", "ratio": "x pass-through"}
    return _reader_table(_overhead_rows(ov), cols, "recording mode")


def _field(rec: Any, key: str, default: Any = None) -> Any:
    return rec.get(key, default) if isinstance(rec, Mapping) else getattr(rec, key, default)


_COMPILED = ("Torch-Compiled Region", "CompiledFunction", "## Call CompiledFxGraph", "autograd::engine::evaluate_function:"
             " CompiledFunctionBackward", "triton_", "cudagraph")


def enclosing(records: Sequence[Any], rec: Any) -> list[Any]:
    """Pure: the records `rec` ran inside, outermost first (a thread's records nest: the nearest earlier record
    one level up is its parent). Empty when `rec` is at the top or its parents left the ring."""
    depth, thread = _field(rec, "depth", 0) or 0, _field(rec, "thread")
    out: list[Any] = []
    for r in sorted((r for r in records if _field(r, "seq") < _field(rec, "seq") and _field(r, "thread") == thread),
                    key=lambda r: -_field(r, "seq")):
        d = _field(r, "depth", 0) or 0
        if d < depth:
            out.append(r)
            depth = d
            if d == 0:
                break
    return out[::-1]


def compiled_code(names: Sequence[str]) -> bool:
    """Whether records of these names are torch.compile's: a compiled region or graph call, or a kernel Inductor
    generated (named by what it fuses: triton_poi_..., triton_red_...)."""
    return any(str(n).startswith(_COMPILED) for n in names)


def localize(records: Sequence[Any]) -> tuple[Any, Any, list[Any]]:
    """(in-flight record, host-blocked-in record, all open records).

    When earlier ops finished on the host but their GPU work never completed, the earliest of those is
    the culprit and the op the host is still inside (a sync) is reported apart."""
    open_host = [r for r in records if _field(r, "t_end") is None]
    gpu_pending = [r for r in records if _field(r, "t_end") is not None and _field(r, "gpu_done") is False]
    host = max(open_host, key=lambda r: _field(r, "seq")) if open_host else None
    if gpu_pending:
        first = min(gpu_pending, key=lambda r: _field(r, "seq"))
        while _field(first, "kind") == "composite":   # the op inside it whose work did not complete
            inner = [r for r in gpu_pending if _field(r, "seq") > _field(first, "seq")
                     and _field(r, "depth", 0) > _field(first, "depth", 0)
                     and (_field(r, "t_start") or 0) <= _field(first, "t_end")]
            if not inner:
                break
            first = min(inner, key=lambda r: _field(r, "seq"))
        blocked = host if host is not None and _field(host, "seq") > _field(first, "seq") else None
        return first, blocked, open_host
    return host, None, open_host
