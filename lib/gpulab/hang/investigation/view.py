"""Notebook 03's tables and plots of a verdict (pandas and matplotlib, imported where drawn: `gpulab.hang`
itself must import without them in a watched child)."""
from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from gpulab import report
from gpulab.hang.investigation import bisect, ladder, repro
from gpulab.hang import faults
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
            ("process", v.culprit or "-"),
            ("whose code", f"{v.owner['kind']}: {v.owner['where']}" if v.owner else "-"),
            ("memcheck", memcheck_line(v)),
            ("collective", "group {group}, seq {seq}: {op}".format(**v.divergence) if v.divergence else "-"),
            ("last completed op", op_brief(v.last_completed_op)), ("ops completed", v.ops_completed),
            ("signal / exit code", f"{v.signal or '-'} / {v.exit_code}"), ("elapsed", f"{v.elapsed_s:.2f} s"),
            ("time to verdict", f"{v.time_to_verdict_s:.2f} s" if v.time_to_verdict_s is not None else "-"),
            ("planted", f"yes, a self-test: {v.planted}" if v.planted else "no (the workload as it runs)"),
            ("trace mode", v.mode or "not recorded")]
    return pd.DataFrame(rows, columns=["field", "value"]).set_index("field")


def memcheck_line(v: Verdict) -> str:
    """The first invalid access compute-sanitizer reported, or why it did not run ('-' when not asked)."""
    mc = v.memcheck or {}
    if not mc:
        return "-"
    if mc.get("errors"):
        return mc["errors"][0].get("sentence") or "-"
    return mc.get("note") or ("ran: no invalid access reported" if mc.get("ran") else "-")


def memcheck_table(v: Verdict):
    """One row per invalid access: kernel, source line, block and thread, address, size, the allocation missed."""
    import pandas as pd

    rows = [{"kernel": e.get("kernel"), "source": f"{e['file']}:{e['line']}" if e.get("file") else "-",
             "access": f"{e.get('access')} of {e.get('size')} bytes", "block": e.get("block"),
             "thread": e.get("thread"), "address": e.get("address"),
             "allocation": (f"{e.get('distance')} bytes {e.get('relation')} {e.get('allocation')} "
                            f"({e.get('allocation_size')} bytes)" if e.get("relation") in ("after", "before") else
                            f"inside {e.get('allocation')} ({e.get('allocation_size')} bytes)"
                            if e.get("relation") == "inside" else "-")}
            for e in (v.memcheck or {}).get("errors") or ()]
    return pd.DataFrame(rows)


def owner_md(v: Verdict) -> str:
    """Whose code the failure is in and the next step that follows (gpulab.hang.owner), escaped."""
    from gpulab.hang import owner

    o = v.owner or {}
    if not o:
        return "**Whose code:** not decided (the run passed, or its verdict predates ownership)."
    step = owner.next_step(o)
    return (f"**Whose code: {report.esc(o.get('kind'))}** ({report.esc(o.get('where') or 'nowhere named')}): "
            f"{report.esc(o.get('why'))}." + (f"\n\n**Next step:** {report.esc(step)}." if step else ""))


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


# ------------------------------------------------------------------------------------ ladder and bisection

def ladder_table(lad: ladder.LadderResult):
    import pandas as pd

    return pd.DataFrame(ladder.table_rows(lad)).set_index("rung") if lad.rungs else pd.DataFrame()


def plot_ladder(lad: ladder.LadderResult, ax: Any = None):
    """Failure rate per rung with its Wilson 95% interval: one look says where the ladder breaks."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 2.8))
    if not lad.rungs:
        ax.text(0.5, 0.5, "no rung ran", ha="center", va="center")
        ax.set_axis_off()
        return ax
    names = [r.name for r in lad.rungs]
    rates = [r.fail_rate * 100 for r in lad.rungs]
    lo = [max(0.0, (r.fail_rate - r.fail_rate_ci[0]) * 100) for r in lad.rungs]
    hi = [max(0.0, (r.fail_rate_ci[1] - r.fail_rate) * 100) for r in lad.rungs]
    colors = ["#cf222e" if r.failed else "#1a7f37" for r in lad.rungs]
    ax.bar(names, rates, color=colors, alpha=0.8)
    ax.errorbar(names, rates, yerr=[lo, hi], fmt="none", ecolor="k", capsize=6, lw=1)
    for i, r in enumerate(lad.rungs):
        ax.text(i, min(100, r.fail_rate_ci[1] * 100) + 3, f"{r.trials - r.counts['pass']}/{r.trials}",
                ha="center", fontsize=9)
    if lad.covered:
        ax.text(0.01, 0.97, f"not run: {', '.join(lad.covered)} (the {names[-1]} rung runs "
                f"{'them' if len(lad.covered) > 1 else 'it'} and passed every trial)", transform=ax.transAxes,
                va="top", fontsize=8, color="#57606a")
    ax.set_ylim(0, 112)
    ax.set_ylabel("failed runs (%)")
    ax.set_title("failure rate per rung, with its 95% interval (Wilson)"
                 + (f"\n{lad.jobs} trials side by side" + (" on one GPU, which they shared" if _on_gpu(lad) else "")
                    if lad.jobs > 1 else ""), fontsize=10)
    return ax


def _on_gpu(lad: ladder.LadderResult) -> bool:
    """Whether the trials could reach a GPU: the built-in workload says its device; a program may use one
    whenever this machine has one."""
    from gpulab import device

    cmds = [" ".join(r.command) for r in lad.rungs]
    if any("--device" in c for c in cmds):
        return any("--device cuda" in c for c in cmds)
    return device.has_gpu()


def probes_table(bis: bisect.BisectResult):
    import pandas as pd

    rows = [{"probe": i + 1, "shrinking": p.dimension or "(the failing values)",
             "configuration": ", ".join(f"{k}={v}" for k, v in p.config.items()), "outcome": p.outcome,
             "trials": ", ".join(f"{n} {o}" for o, n in p.counts.items()), "seconds": round(p.seconds, 1)}
            for i, p in enumerate(bis.probes)]
    return pd.DataFrame(rows).set_index("probe")


def plot_probes(bis: bisect.BisectResult):
    """One panel per integer dimension: the value each probe tried, red when it failed: the threshold is
    where the colours meet."""
    import matplotlib.pyplot as plt

    dims = [d for d in dict.fromkeys(p.dimension for p in bis.probes if p.dimension)
            if isinstance(bis.minimal.get(d), int)]
    if not dims:
        fig, ax = plt.subplots(figsize=(6, 1.5))
        ax.text(0.5, 0.5, "no integer dimension was shrunk", ha="center", va="center")
        ax.set_axis_off()
        return fig
    fig, axes = plt.subplots(1, len(dims), figsize=(4.2 * len(dims), 2.8), squeeze=False)
    for ax, d in zip(axes[0], dims):
        pts = [(i + 1, p.config[d], p.outcome) for i, p in enumerate(bis.probes) if d in p.config]
        for outcome, color in (("pass", "#1a7f37"), ("fail", "#cf222e"), ("other", "#9a6700")):
            sel = [(x, y) for x, y, o in pts if o == outcome]
            if sel:
                ax.scatter(*zip(*sel), color=color, label=outcome, zorder=3)
        ax.axhline(bis.minimal[d], color="#cf222e", ls="--", lw=1)
        ax.text(0.02, 0.95, f"smallest failing {d} = {bis.minimal[d]}", transform=ax.transAxes, va="top", fontsize=9)
        ax.set_xlabel("probe")
        ax.set_ylabel(d)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle("bisection: value tried vs outcome")
    fig.tight_layout()
    return fig


def finding_md(headline: str) -> str:
    return f"**Finding.** {report.esc(headline)}."


def repro_md(rep: repro.ReproResult | None, out_dir: str | Path) -> str:
    """The verified repro inline (escaped), or why there is none."""
    if rep is None:
        return "No repro: nothing failed."
    if not rep.verified:
        return f"**No op replay reproduces the failure.** {report.esc(rep.explanation)}"
    src = (Path(out_dir) / "repro" / rep.verified).read_text()
    return f"**Verified repro** ({report.esc(rep.explanation)}):\n\n{report.pre(src)}"


def bundle_md(path: Path | None, out_dir: str | Path) -> str:
    if path is None:
        return "No evidence bundle: nothing failed."
    rel = Path(path).relative_to(Path(out_dir))
    return (f"**Evidence bundle for an upstream report:** <a href=\"{report.url(rel)}\">{report.esc(rel)}</a> "
            f"(with <a href=\"{report.url('issue.md')}\">issue.md</a>, in the shape PyTorch's bug template asks for).")


def intro_md(cfg: Any, fault: str | None, repeats: int, stall_s: float) -> str:
    planted = faults.parse(fault)
    if planted:
        return (f"**Self-test of the watchdog:** the fault {report.code(planted)} is planted in every run on purpose. "
                "What follows tests gpulab, not the workload.")
    what = ("the built-in workload" if cfg.kind == "builtin" else report.code(cfg.workload))
    return (f"**Watching {what} as it runs:** each rung {repeats} time(s), a hang is {stall_s:g} s without "
            "progress (no op finishing, no Python running in the main thread).")


def _text(value: Any) -> str:
    """Outside text inside HTML (an HTML display, a <details> block): only HTML-escaped. report.esc's
    Markdown escapes are for Markdown prose; here nothing removes them, so `[main]` would show as `\\[main\\]`."""
    return html.escape(str(value), quote=True)


def stacks_html(v: Verdict) -> str:
    """Every thread's stack, folded (innermost frame in the summary, the whole stack inside): never cut."""
    parts = []
    for kind in ("python", "native"):
        for line in v.collapsed.get(kind, ()):
            thread, _, stack = line.partition(": ")
            frames = stack.split(";")
            parts.append(f"<details><summary>{_text(kind)} · {_text(thread)} · innermost: "
                         f"{report.code(frames[-1] if frames else '')}</summary>"
                         f"{report.pre(chr(10).join(reversed(frames)))}</details>")
    return "\n".join(parts) or ("<p>No stacks: they are taken from a live, stuck process, and this one had "
                                 "already ended.</p>" if v.status in ("error", "crash", "ok") else
                                 "<p>No stacks were captured (see the evidence for why).</p>")


def show_verdict(v: Verdict | None, out_dir: str | Path) -> None:
    """The first failure in full, or one sentence when nothing failed."""
    from IPython.display import HTML, Markdown, display

    if v is None:
        display(Markdown("**No run failed**, so there is no failure to describe."))
        return
    table = verdict_table(v)
    display(table[table["value"].astype(str) != "-"])  # rows that say nothing are left out
    if v.processes:   # a job of several processes: which one, where, and why the others wait
        from gpulab.hang.jobs import jobview
        jobview.show_job(v)
    display(Markdown("**Evidence the class rests on:**\n\n" + "\n".join(f"- {report.esc(f)}" for f in v.evidence)))
    display(Markdown(owner_md(v)))
    if (v.memcheck or {}).get("errors"):
        display(memcheck_table(v))
    folder = Path(v.log.get("dir", "."))
    links = [f'<a href="{report.url(Path(folder).relative_to(Path(out_dir)) / name)}">{_text(name)}</a>'
             for key, name in v.log.items() if key.startswith("stacks") and name]
    display(HTML("<p><b>Stacks</b> (innermost frame first inside each fold)"
                 + (": full text in " + ", ".join(links) if links else "") + "</p>" + stacks_html(v)))
    if v.oplog_tail:
        display(oplog_table(v))
    if v.time_to_verdict_s is not None:
        plot_time_to_verdict(v)


def show_bisection(bis: bisect.BisectResult | None, why: str) -> None:
    from IPython.display import Markdown, display

    if bis is None:
        display(Markdown(f"**No bisection:** {report.esc(why)}."))
        return
    display(Markdown("**Smallest failing configuration:** "
                     + ", ".join(report.code(f"{k}={v}") for k, v in bis.minimal.items())
                     + f" ({report.esc(why)}; {report.esc(bis.detection)})"))
    plot_probes(bis)
    display(probes_table(bis))


def ladder_controls(cfg: Any, out_dir: str | Path, **climb_kw: Any) -> None:
    """Widgets for the top rung, the repeats and the sizes to shrink; a button climbs again (interactive only)."""
    import dataclasses

    import ipywidgets as widgets
    from IPython.display import display

    from gpulab import workloads
    from gpulab.hang.investigation import investigate

    rung = widgets.Dropdown(options=list(workloads.RUNGS), value=cfg.rung, description="top rung")
    reps = widgets.IntSlider(value=3, min=1, max=50, description="repeats")
    dims = widgets.SelectMultiple(options=list(bisect.SHRINKABLE), value=("layers", "heads"), description="shrink")
    go = widgets.Button(description="climb", button_style="primary")
    shown = widgets.Output()

    def climb(_: Any) -> None:
        shown.clear_output()
        with shown:
            c = dataclasses.replace(cfg, rung=rung.value)
            lad = investigate.climb(c, Path(out_dir) / "interactive", repeats=reps.value, jobs=1, **climb_kw)
            display(ladder_table(lad))
            bis, why = investigate.shrink(c, lad, list(dims.value), Path(out_dir) / "interactive",
                                          repeats=reps.value, jobs=1, **climb_kw)
            show_bisection(bis, why)

    go.on_click(climb)
    display(widgets.VBox([widgets.HBox([rung, reps, dims, go]), shown]))
