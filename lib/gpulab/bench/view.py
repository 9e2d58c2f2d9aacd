"""Notebook 06's tables, plots and words, built from the benchmark child's results file.

A team reads these in the no-code HTML report, so tables hold text with units and a few significant digits
(the raw numbers stay in benchmark.json and the CSV products), and every term is plain or explained.
Functions return a pandas DataFrame, a matplotlib Figure, or a `Note` (Markdown) when there is nothing to
draw, so a notebook cell only calls them.
"""
from __future__ import annotations

import io
import math
import os
from dataclasses import asdict
from typing import Any, Mapping, Sequence

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

from gpulab.bench import flops
from gpulab.bench.child import RunResult, Spec
from gpulab.bench.decision import decision_from_dict
from gpulab.bench.measure import Comparison, Measurement, comparison_from_dict
from gpulab.bench.overhead import OVERHEAD_BUDGET, scenario_overhead
from gpulab.report import ORACLE_GATE_FILE, esc, product, table
from gpulab.workloads import AttentionCall

KIND_LABELS = {"vendor": "PyTorch SDPA", "reference": "reference (gpulab)", "fix": "fix (gpulab)",
               "user": "user", "planted": "planted bug (self-test)"}
STATUS_WORDS = {"champion": "champion", "baseline": "baseline", "slower": "slower", "tie": "tie",
                "overtaken": "was champion, now beaten", "excluded": "excluded (failed the oracle)",
                "suspect": "suspect (too fast to trust)", "unverified": "unverified (not in 05's gate)",
                "unsupported": "not supported for the workload's call", "error": "could not run"}
PEAK_LINE_MAX = 30.0   # draw the device's peak on the sweep only within this factor of the highest point
COMPARABILITY = ("These times are medians of many warmed-up calls timed one by one, forward only (on a GPU: "
                 "CUDA events with the GPU kept busy, so launch overhead is left out); notebook 01's quick "
                 "timing ran each backend a few times, synchronized after every call, launch overhead included "
                 "(and backward too for training rungs), so 01's milliseconds cannot be compared with these.")


class Note(str):
    """Text a notebook shows as Markdown (IPython calls _repr_markdown_), so gpulab needs no IPython."""

    def _repr_markdown_(self) -> str:
        return str(self)


class Chart(Figure):
    """A matplotlib Figure that shows itself in a notebook as a PNG, with no pyplot state (so it is shown
    once, where the cell returns it) and no IPython import."""

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=100)
        return buf.getvalue()

    def save(self, out_dir: str | os.PathLike | None, name: str) -> "Chart":
        """Also keep the plot as a product in out_dir (nothing when out_dir is None)."""
        if out_dir is not None:
            self.savefig(product(out_dir, name), dpi=110)
        return self


# ------------------------------------------------------------------------------------------ numbers


def sig(x: Any, digits: int = 3) -> str:
    """A number with `digits` significant digits and no exponent: 0.0123, 1.23, 1,234."""
    if x is None or not isinstance(x, (int, float)) or not math.isfinite(x):
        return "n/a"
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{decimals}f}"


def span(ci: Sequence[float] | None, digits: int = 3) -> str:
    """A confidence interval as '0.0123 – 0.0131'."""
    if not ci or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in ci):
        return "n/a"
    return f"{sig(ci[0], digits)} – {sig(ci[1], digits)}"


def _tick(v: float) -> str:
    """A tick label: 0.00001, 0.3, 2, 1,000 (no exponent, no trailing zeros)."""
    if v <= 0 or not math.isfinite(v):
        return ""
    if v >= 1:
        return f"{v:,.0f}" if v >= 10 else f"{v:g}"
    return f"{v:.{1 - math.floor(math.log10(v))}f}".rstrip("0").rstrip(".")


def _plain_ticks(axis, values: Sequence[float] | None = None, decades: float = 1.0) -> None:
    """Log-axis ticks as plain numbers: at `values` when given, else 1-2-5 per decade when the axis spans
    little more than one decade, 1-3 up to three, one per decade beyond (never crowded)."""
    subs = (1.0, 2.0, 5.0) if decades <= 1.5 else (1.0, 3.0) if decades <= 3 else (1.0,)
    axis.set_major_locator(FixedLocator(list(values)) if values is not None else LogLocator(subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: _tick(v)))
    axis.set_minor_locator(NullLocator() if values is not None else LogLocator(subs="auto"))
    axis.set_minor_formatter(NullFormatter())


# ----------------------------------------------------------------------------------- reading results


def call_of(result: Mapping[str, Any]) -> AttentionCall | None:
    spec = result.get("spec") or {}
    return AttentionCall(**spec["call"]) if spec.get("call") else None


def comparisons(result: Mapping[str, Any]) -> dict[str, Comparison]:
    """name -> Comparison against the baseline, rebuilt from the results file."""
    return {n: comparison_from_dict(d) for n, d in (result.get("vs_baseline") or {}).items()}


def measurements(result: Mapping[str, Any]) -> dict[str, Measurement]:
    """Every candidate's samples on the workload's call, the baseline first."""
    comps = comparisons(result)
    if not comps:
        return {}
    base = next(iter(comps.values())).baseline
    return {base.name: base, **{n: c.candidate for n, c in comps.items()}}


def _names(result: Mapping[str, Any]) -> list[str]:
    spec = result.get("spec") or {}
    return list(dict.fromkeys([spec.get("baseline", ""), *spec.get("candidates", ())]))


def state(result: Mapping[str, Any], name: str) -> str:
    """What happened to a candidate on the workload's call, in words."""
    for key, words in (("skipped", "skipped on this device"), ("unsupported", "not supported"),
                       ("errors", "could not run")):
        if name in (result.get(key) or {}):
            return f"{words} ({result[key][name]})"
    if name in measurements(result):
        return "timed"
    if name in (result.get("not_timed") or ()):
        return "not timed: failed or missing from 05's oracle gate"
    return "not timed"


def _whose(spec: Mapping[str, Any] | None) -> str:
    """Whose call was timed: the built-in workload's own, or the user program's as notebook 02 recorded it."""
    spec = spec or {}
    kind = str((spec.get("workload") or {}).get("workload", "builtin")).strip()
    if spec.get("source"):
        return str(spec["source"])
    return ("the workload's own attention call" if kind == "builtin" else
            f"the built-in workload's attention call at these sizes (not the calls of workload={kind!r})")


def applies(result: Mapping[str, Any]) -> bool:
    """False when 06 timed nothing because the workload makes no attention call it can time (or it is
    unknown whether it makes one): every table and plot is then left empty, and the finding says why."""
    return result.get("stage") != "not_applicable"


def _reason(result: Mapping[str, Any]) -> str:
    return str(result.get("reason") or (result.get("spec") or {}).get("reason") or "")


def _user(spec: Mapping[str, Any]) -> str:
    return str((spec.get("workload") or {}).get("workload", "builtin"))


def _peak(result: Mapping[str, Any]) -> float | None:
    return (result.get("roof") or {}).get("tflops") or None


def flop_unit(result: Mapping[str, Any]) -> tuple[str, float]:
    """('TFLOP/s', 1) on a GPU-sized result, ('GFLOP/s', 1000) when every rate is below 1 TFLOP/s (a CPU),
    so the tables do not fill with leading zeros. Multiply TFLOP/s by the factor."""
    rates = [r.get("tflops") or 0 for r in result.get("sweep") or []] + [_peak(result) or 0]
    return ("TFLOP/s", 1.0) if max(rates) >= 1 else ("GFLOP/s", 1e3)


# ------------------------------------------------------------------------------------------ tables


def spec_note(spec: Spec) -> Note:
    """What will be timed, before it is (or why nothing will be)."""
    if not spec.applies:
        return Note(f"**Nothing is benchmarked for workload={esc(_user(asdict(spec)))}:** {esc(spec.reason)}.")
    gate = "found: only candidates that passed it may win" if spec.gate is not None else \
        "none in this out_dir, so every candidate is **unverified** (the champion will be provisional)"
    return Note(f"Device `{spec.device}`. Every candidate is timed on **{esc(_whose(asdict(spec)))}**: "
                f"{spec.call.describe()}. Candidates: {', '.join(f'`{n}`' for n in spec.candidates)}; "
                f"baseline `{spec.baseline}`. Oracle gate from notebook 05 ({ORACLE_GATE_FILE}): {gate}.")


def recorded_table(spec: Spec) -> pd.DataFrame | Note:
    """A user program's attention calls as notebook 02 recorded them, the most frequent first (nothing for
    the built-in workload, whose call is known)."""
    if not spec.recorded:
        return Note("")
    return table(pd.DataFrame(list(spec.recorded)), "call")


def run_note(run: RunResult) -> Note:
    if run.status == "not_applicable":
        return Note("")
    if run.status == "ok":
        return Note(f"The benchmark child finished in {run.elapsed_s:.1f} s.")
    return Note(f"**The benchmark child ended with status `{run.status}`** after {run.elapsed_s:.1f} s "
                f"({run.detail}); what it measured before that is shown below.")


def candidates_table(result: Mapping[str, Any]) -> pd.DataFrame:
    """One row per candidate: what happened on the workload's call, its time with a 95% confidence interval,
    its ratio to the baseline, and its throughput."""
    if not applies(result):
        return Note("")
    ms, comps, call, peak = measurements(result), comparisons(result), call_of(result), _peak(result)
    unit, scale = flop_unit(result)
    work = flops.attention_flops(call.batch, call.heads, call.seq_len, call.keys, call.head_dim,
                                 causal=call.causal) if call else float("nan")
    kinds = result.get("candidates") or {}
    rows = []
    for n in _names(result):
        m, c = ms.get(n), comps.get(n)
        tf = flops.tflops(work, m.median_ms) if m else None
        rows.append({
            "candidate": n, "kind": KIND_LABELS.get((kinds.get(n) or {}).get("kind"), "-"),
            "on the workload's call": state(result, n),
            "median (ms)": sig(m.median_ms) if m else "", "95% CI (ms)": span(m.ci_ms) if m else "",
            "samples": m.n if m else "",
            "vs baseline": ("baseline" if m and not c else _versus(c) if c else ""),
            "ratio 95% CI": span(c.ratio_ci) if c else "",
            unit: sig(tf * scale) if m else "", "% of peak": sig(100 * tf / peak, 2) if m and peak else ""})
    return table(pd.DataFrame(rows), "candidate")


def _versus(c: Comparison) -> str:
    if c.verdict == "faster":
        return f"{sig(1 / c.ratio)}x faster"
    if c.verdict == "slower":
        return f"{sig(c.ratio)}x slower"
    return f"tie (ratio {sig(c.ratio)})"


def decision_table(result: Mapping[str, Any]) -> pd.DataFrame | Note:
    d = result.get("decision")
    if not applies(result):
        return Note("")
    if not d:
        return Note("No decision was reached (the benchmark child stopped before it could decide).")
    kinds = result.get("candidates") or {}
    return pd.DataFrame([{"candidate": r.name, "kind": KIND_LABELS.get((kinds.get(r.name) or {}).get("kind"), "-"),
                          "status": STATUS_WORDS.get(r.status, r.status), "decision": r.label,
                          "compared with": r.compared_with or "",
                          "ratio": sig(r.ratio) if r.ratio is not None else "",
                          "ratio 95% CI": span(r.ratio_ci) if r.ratio_ci else "", "oracle": r.gate}
                         for r in decision_from_dict(d).rows])


def sweep_table(result: Mapping[str, Any]) -> pd.DataFrame | Note:
    rows = result.get("sweep") or []
    if not applies(result):
        return Note("")
    if not rows:
        return Note("No sequence-length sweep was run (`seq_lens` is empty, or the child stopped before it).")
    unit, scale = flop_unit(result)
    return pd.DataFrame([{"candidate": r["candidate"], "sequence length": r["seq_len"],
                          "masked keys": r.get("masked_keys", 0), "median (ms)": sig(r.get("median_ms")),
                          "95% CI (ms)": span(r.get("ci_ms")),
                          unit: sig(r["tflops"] * scale) if r.get("tflops") else "",
                          "% of peak": sig(r.get("pct_peak"), 2), "GB/s": sig(r.get("gbs")),
                          "bound by": r.get("bound", "").replace("unknown", ""), "error": r.get("error", "")}
                         for r in rows])


def overhead_note(out_dir: str | os.PathLike) -> Note:
    """How the fix-overhead table was made, or why there is none yet."""
    return Note(scenario_overhead(out_dir)[1])


def overhead_table(out_dir: str | os.PathLike) -> pd.DataFrame | None:
    """Each scenario's workload time against the baseline scenario's; None (nothing shown) without one."""
    rows = scenario_overhead(out_dir)[0]
    if not rows:
        return None
    return pd.DataFrame([{"scenario": r["scenario"], "workload (ms)": sig(r["workload ms"]),
                          "vs baseline": f"{sig(r['vs baseline'])}x",
                          "bounds": span((r["bound low"], r["bound high"])),
                          "overhead": f"{r['overhead %']:+.1f}%", "within budget": r["within budget"]}
                         for r in rows], columns=["scenario", "workload (ms)", "vs baseline", "bounds", "overhead",
                                                  "within budget"])


def workload_note(result: Mapping[str, Any]) -> Note:
    wl = result.get("workload") or {}
    err = (result.get("stage_errors") or {}).get("workload")
    if not applies(result):
        return Note("")
    if err:
        return Note(f"The workload could not be timed: {err}.")
    if wl.get("median_ms") is None:
        return Note(f"Workload: {wl.get('what', 'not timed')}.")
    n = wl.get("n") or 0
    spread = (f"95% CI {span(wl.get('ci_ms'))} ms, {n} runs" if n >= 3 else
              f"only {n} run{'s' if n != 1 else ''} fit in max_time_s, so no confidence interval")
    return Note(f"This scenario's workload ({wl['what']}): median {sig(wl['median_ms'])} ms per run ({spread}). "
                f"A fix may cost up to {OVERHEAD_BUDGET:.0%} of the baseline scenario's time.")


# ------------------------------------------------------------------------------------------- plots


def latency_figure(result: Mapping[str, Any], out_dir: str | os.PathLike | None = None) -> Chart | Note:
    """Left: every sample per candidate (the spread a median hides). Right: each ratio to the baseline with
    its 95% bootstrap confidence interval, against the tie zone."""
    ms, comps = measurements(result), comparisons(result)
    if not applies(result):
        return Note("")
    if not ms:
        return Note("Nothing was timed on the workload's call, so there is no latency plot.")
    fig = Chart(figsize=(12, 3.8), layout="constrained")
    ax, fx = fig.subplots(1, 2, width_ratios=(1, 1.2))
    ax.boxplot([m.samples_ms for m in ms.values()], showfliers=True, flierprops={"markersize": 2})
    ax.set_xticks(range(1, len(ms) + 1), list(ms), rotation=20, ha="right")
    ax.set_yscale("log")
    every = [v for m in ms.values() for v in m.samples_ms if v > 0]
    _plain_ticks(ax.yaxis, decades=math.log10(max(every) / min(every)) if every else 1.0)
    ax.set_ylabel("time per call (ms, log scale)")
    ax.set_title("every timed call of the workload's attention", fontsize=10)
    if comps:
        _forest(fx, comps, result)
    else:
        fx.set_axis_off()
        fx.text(0.5, 0.5, "only the baseline was timed: no ratio to show", ha="center", va="center")
    return fig.save(out_dir, "benchmark_latency.png")


def _forest(ax, comps: Mapping[str, Comparison], result: Mapping[str, Any]) -> None:
    spec = result.get("spec") or {}
    delta = spec.get("delta", 0.01)
    colors = {"faster": "tab:green", "slower": "tab:red", "tie": "tab:gray"}
    for i, (n, c) in enumerate(comps.items()):
        lo, hi = (v if math.isfinite(v) else c.ratio for v in c.ratio_ci)
        ax.errorbar([c.ratio], [i], xerr=[[max(c.ratio - lo, 0)], [max(hi - c.ratio, 0)]], fmt="o",
                    color=colors.get(c.verdict, "k"), capsize=4)
        ax.annotate(f"  {_versus(c)}", (hi, i), va="center", fontsize=8)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.axvspan(1 - delta, 1 + delta, color="tab:gray", alpha=0.2, label=f"tie zone 1 ± {delta:g}")
    ax.set_yticks(range(len(comps)), list(comps))
    ax.set_ylim(-0.7, len(comps) - 0.3)
    ax.set_xscale("log")
    r = [v for c in comps.values() for v in (c.ratio, *c.ratio_ci) if math.isfinite(v) and v > 0]
    lo, hi = min(min(r), 1 - delta) / 1.3, max(max(r), 1 + delta) * 2.5  # room for the words on the right
    ax.set_xlim(lo, hi)
    _plain_ticks(ax.xaxis, decades=math.log10(hi / lo))
    ax.set_xlabel(f"median time / {spec.get('baseline', 'baseline')}'s (log scale; below 1 is faster)")
    ax.set_title("ratio to the baseline, 95% bootstrap confidence interval", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")


def sweep_figure(result: Mapping[str, Any], out_dir: str | os.PathLike | None = None) -> Chart | Note:
    """TFLOP/s of the same call at other sequence lengths, on a log axis (the candidates span decades)."""
    rows = [r for r in result.get("sweep") or [] if r.get("tflops") and r["tflops"] > 0]
    if not applies(result):
        return Note("")
    if not rows:
        return Note("No throughput to plot: the sweep did not run or measured nothing.")
    unit, scale = flop_unit(result)
    fig = Chart(figsize=(9, 3.8), layout="constrained")
    ax = fig.subplots()
    for n in dict.fromkeys(r["candidate"] for r in rows):
        pts = sorted((r["seq_len"], r["tflops"] * scale) for r in rows if r["candidate"] == n)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=n)
    top, bottom = max(r["tflops"] for r in rows) * scale, min(r["tflops"] for r in rows) * scale
    peak, roof = (_peak(result) or 0) * scale, result.get("roof") or {}
    if peak and peak <= PEAK_LINE_MAX * top:
        what = "measured matmul" if str(roof.get("source", "")).startswith("measured") else "datasheet"
        ax.axhline(peak, color="k", ls="--", lw=0.8, label=f"device peak {sig(peak)} {unit} ({what})")
        top = peak
    ax.set_yscale("log")
    ax.set_ylim(bottom / 1.5, top * 1.5)
    _plain_ticks(ax.yaxis, decades=math.log10(top / bottom * 2.25))
    ax.set_xscale("log", base=2)
    _plain_ticks(ax.xaxis, sorted({r["seq_len"] for r in rows}))
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel(f"{unit} (log scale)")
    call = call_of(result)
    mask = {"padding": "same boolean padding mask", "bool": "same boolean mask",
            "additive": "same additive mask"}.get(call.mask if call else "", "no mask, as the workload")
    ax.set_title(f"the workload's attention call at other sequence lengths ({mask})", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig.save(out_dir, "benchmark_sweep.png")


def sweep_note(result: Mapping[str, Any]) -> Note:
    """What the sweep timed, and the peak when it is off the plot."""
    call = call_of(result)
    if call is None or not result.get("sweep"):
        return Note("")
    mask = {"padding": f"the same boolean key-padding mask ({call.padded_keys} text-padding keys masked; they "
                       f"shrink in proportion at lengths shorter than the text)",
            "bool": "the same kind of boolean mask, stretched to each length",
            "additive": "the same kind of additive mask, stretched to each length"}.get(call.mask,
                                                                                     "no mask, as the workload")
    keys = (f"; the keys stay at {call.kv_len} (only the queries change length)"
            if call.kv_len is not None and call.kv_len != call.seq_len else "")
    text = (f"Each point times the workload's attention call (B={call.batch} H={call.heads} D={call.head_dim} "
            f"{call.dtype}{', causal' if call.causal else ''}) at another sequence length, with {mask}{keys}. "
            f"FLOPs are counted as for dense attention (the masked keys are still computed).")
    peak, top = _peak(result), max((r.get("tflops") or 0 for r in result["sweep"]), default=0)
    unit, scale = flop_unit(result)
    if peak and top and peak > PEAK_LINE_MAX * top:
        text += (f" The device peak ({sig(peak * scale)} {unit}, {result['roof']['source']}) is "
                 f"{sig(peak / top, 2)}x above the best point, so it is not drawn.")
    return Note(text)


def histogram_figure(result: Mapping[str, Any], name: str) -> Chart:
    """One candidate's samples, for the interactive view."""
    ms = measurements(result)
    if name not in ms:
        raise KeyError(f"no samples for {name!r}; have: {', '.join(ms)}")
    m = ms[name]
    fig = Chart(figsize=(6, 3), layout="constrained")
    ax = fig.subplots()
    ax.hist(m.samples_ms, bins=60)
    ax.axvline(m.median_ms, color="k")
    ax.axvspan(*m.ci_ms, color="tab:orange", alpha=0.4)
    ax.set_xlabel("time per call (ms)")
    ax.set_title(f"{name}: median {sig(m.median_ms)} ms, 95% CI {span(m.ci_ms)} ms, {m.n} samples", fontsize=9)
    return fig


def histogram_widget(result: Mapping[str, Any]):
    """A dropdown of candidates and the histogram of the chosen one's samples (interactive runs only)."""
    import ipywidgets as widgets  # optional dependency, used only when the notebook's `interactive` is true
    from IPython.display import display

    names = list(measurements(result))
    return widgets.interact(lambda name: display(histogram_figure(result, name)),
                            name=widgets.Dropdown(options=names, value=names[0] if names else None))


# ------------------------------------------------------------------------------------------ finding


def finding_text(run: RunResult) -> Note:
    """The paragraph under the decision table."""
    res, parts = run.result, []
    if not applies(res):
        return Note(f"**Nothing was benchmarked:** {esc(_reason(res))}.")
    if run.status != "ok":
        parts.append(f"**The benchmark child ended with status `{run.status}`** ({run.detail}); what it "
                     f"measured before that is shown.")
    if res.get("call"):
        parts.append(f"Every time here is of {esc(_whose(res.get('spec')))} ({res['call']}).")
    d = res.get("decision")
    if d is None:
        return Note(" ".join(parts + ["No decision was reached."]))
    dec = decision_from_dict(d)
    if dec.provisional:
        parts.append(f"There is no `{ORACLE_GATE_FILE}` from notebook 05 in this out_dir: every candidate is "
                     f"**unverified**, so the champion is provisional (fast is not the same as right).")
    if dec.champion is None:
        parts.append("No candidate is eligible to be champion.")
    else:
        parts.append(f"Champion: **{dec.champion}** ({dec.row(dec.champion).label}).")
    for n, why in (res.get("unsupported") or {}).items():
        parts.append(f"`{n}` is **not supported for the workload's call**: {why.rstrip('.')}. It was not timed "
                     f"on any other call instead.")
    parts += [f"`{r.name}`: {r.label}." for r in dec.rows if r.status in ("suspect", "excluded", "error")]
    if res.get("skipped"):
        parts.append("Not available on this device: " + ", ".join(f"`{n}`" for n in res["skipped"]) + ".")
    parts.append(COMPARABILITY)
    return Note(" ".join(parts))


def finding(run: RunResult) -> tuple[str, dict[str, Any]]:
    """Headline and metrics for gpulab.report.record: `applies` is false when nothing was timed because the
    workload makes no attention call 06 can time, or it is unknown whether it makes one (`reason` says)."""
    res = run.result
    if not applies(res):
        spec, reason = res.get("spec") or {}, _reason(res)
        metrics = {"status": run.status, "applies": False, "reason": reason, "champion": None, "provisional": None,
                   "baseline": spec.get("baseline"), "call": None, "candidates": {}, "unsupported": {}, "tflops": {},
                   "workload_ms": None, "workload_ci_ms": None, "errors": {},
                   "recorded_calls": list(spec.get("recorded") or [])}
        return f"nothing benchmarked for workload={_user(spec)}: {reason}", metrics
    d, comps = res.get("decision"), comparisons(res)
    sweep = {f"{r['candidate']}@{r['seq_len']}": r.get("tflops") for r in res.get("sweep") or []}
    wl = res.get("workload") or {}
    metrics = {"status": run.status, "champion": d["champion"] if d else None,
               "provisional": d["provisional"] if d else None, "baseline": (res.get("spec") or {}).get("baseline"),
               "call": res.get("call"),
               "candidates": {n: {"median_ms": c.candidate.median_ms, "ratio": c.ratio, "ratio_ci": list(c.ratio_ci),
                                  "verdict": c.verdict} for n, c in comps.items()},
               "unsupported": res.get("unsupported") or {}, "tflops": sweep, "workload_ms": wl.get("median_ms"),
               "workload_ci_ms": wl.get("ci_ms"), "errors": res.get("errors") or {},
               "device_name": res.get("device_name"), "applies": True,
               "call_source": _whose(res.get("spec")),
               "call_recorded": bool((res.get("spec") or {}).get("source"))}
    if comps:
        metrics["baseline_median_ms"] = next(iter(comps.values())).baseline.median_ms
    if not d:
        return f"benchmark {run.status}: no decision reached", metrics
    champ = d["champion"]
    if champ is None:
        head = "no eligible candidate: nothing passed the oracle and ran the workload's call"
    else:
        c = comps.get(champ)
        speed = (f", {sig(1 / c.ratio)}x vs {c.baseline.name} (95% CI {span([1 / v for v in c.ratio_ci[::-1]])}x)"
                 if c else "")
        whose = "the workload's attention call" if not (res.get("spec") or {}).get("source") else \
            "the program's most frequent timed attention call"
        head = f"champion on {whose}: {champ}{speed}"
    if res.get("unsupported"):
        head += f"; not supported for that call: {', '.join(res['unsupported'])}"
    if d["provisional"]:
        head += " [unverified: no oracle gate from 05]"
    if run.status != "ok":
        head += f" [benchmark {run.status}]"
    return head, metrics

