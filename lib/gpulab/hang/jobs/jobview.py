"""The notebook's view of a hung multi-process job: the per-process table, the collective timeline and a
one-paragraph summary (pandas and matplotlib imported where drawn: `gpulab.hang` imports without them)."""
from __future__ import annotations

from typing import Any, Sequence

from gpulab import report
from gpulab.hang.jobs.job import Collective, JobFinding, ProcessView


def process_table(finding: JobFinding):
    """One row per process, in the finding's order (ranks first): what each one is in and waits on."""
    import pandas as pd

    rows = [{"role": p["role"], "pid": p["pid"], "state": p["state"], "open op": p["open_op"] or "-",
             "collective": _collective_text(p["collective"]), "last progress": _progress_text(p["last_progress_s"]),
             "waits in": p["wait"] or "-", "frame": p["frame"] or "-"} for p in finding.processes]
    columns = ["role", "pid", "state", "open op", "collective", "last progress", "waits in", "frame"]
    return pd.DataFrame(rows, columns=columns).set_index("role")


def _collective_text(c: dict | None) -> str:
    if not c:
        return "-"
    seq = f"seq {c['seq']}" if c["seq"] is not None else "p2p"
    shapes = f" {c['shapes']}" if c["shapes"] else ""
    paired = f", paired with {c['paired_with']}" if c.get("paired_with") else ""
    return f"{c['op']}{shapes} ({c['group']}, {seq}, {'done' if c['done'] else 'OPEN'}{paired})"


def _progress_text(s: float | None) -> str:
    return "unknown" if s is None else f"{s:.1f} s before the stall"


def plot_timeline(views: Sequence[ProcessView], finding: JobFinding, ax: Any = None, t_capture: float | None = None):
    """A lane per process, a bar per collective: the call some lanes wait in while another lane never
    reaches it is the hang, and the dashed line marks where it starts. t_capture (the op-log clock at the
    stall's capture): open calls are drawn up to it, so the bar's length is how long they waited."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.lines import Line2D

    roles = [p["role"] for p in finding.processes]
    by_role = {v.role: v for v in views}
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 1.8 + 0.45 * max(1, len(roles))))
    calls = [c for v in views for c in v.collectives]
    t0 = min((c.t_start for c in calls), default=0.0)
    seen = max((max(c.t_start, c.t_end or c.t_start) for c in calls), default=t0)
    span = seen - t0 if seen - t0 > 1e-6 else 1.0
    t_last = seen + 0.12 * span   # open calls run past the latest time seen: the stall, its length unknown
    if t_capture is not None and t_capture > t_last:
        t_last, span = t_capture, t_capture - t0
    for y, role in enumerate(roles):
        v = by_role.get(role)
        if v is not None:
            _lane(ax, y, v, t0, t_last, span)
    _mark_divergence(ax, finding, views, t0, span)
    ax.set_yticks(range(len(roles)), roles, fontsize=8)
    ax.set_ylim(len(roles) - 0.5, -0.5 - (0.6 if finding.divergence else 0))   # lane 0 (rank 0) on top
    ax.set_xlim(-0.02 * span, t_last - t0)
    ax.set_xlabel("seconds since the first collective (op-log clock)")
    ax.set_title(f"collectives per process: {finding.cls or 'no cross-process finding'}"
                 + (f", culprit {finding.culprit}" if finding.culprit else ""), fontsize=10)
    ax.legend(handles=[Patch(color="#4c72b0", label="completed"),
                       Patch(facecolor="none", edgecolor="#cf222e", hatch="///", label="never completed"),
                       Line2D([], [], marker="X", color="#cf222e", ls="none", label="open op")],
              loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3, fontsize=8, frameon=False)
    ax.figure.tight_layout()
    return ax.figure


def _lane(ax: Any, y: int, v: ProcessView, t0: float, t_last: float, span: float) -> None:
    for c in v.collectives:
        _bar(ax, y, c, t0, t_last, span)
    if v.wait and not v.collectives and not v.open_op:
        ax.text(0, y, f"waits: {v.wait}" + (f" at {v.frame}" if v.frame else ""), fontsize=7, va="center",
                color="#555555", style="italic")
    if v.open_op:
        mine = [max(c.t_start, c.t_end or c.t_start) for c in v.collectives]
        t = v.open_op.get("t_start", max(mine, default=t0))
        ax.plot([t - t0], [y], marker="X", color="#cf222e", ms=9, ls="none")
        ax.annotate(str(v.open_op.get("name", "?")), (t - t0, y), xytext=(6, -9), textcoords="offset points",
                    fontsize=7, color="#cf222e")


def _bar(ax: Any, y: int, c: Collective, t0: float, t_last: float, span: float) -> None:
    left = c.t_start - t0
    width = max((c.t_end if c.done and c.t_end is not None else t_last) - c.t_start, 0.004 * span)
    if c.done:
        ax.barh(y, width, left=left, height=0.5, color="#4c72b0", edgecolor="white")
    else:
        ax.barh(y, width, left=left, height=0.5, facecolor="none", edgecolor="#cf222e", hatch="///")
    label = c.op + (f" #{c.seq}" if c.seq is not None else "")
    ax.text(left, y - 0.3, label, fontsize=6.5, va="bottom")


def _mark_divergence(ax: Any, finding: JobFinding, views: Sequence[ProcessView], t0: float, span: float) -> None:
    d = finding.divergence
    if d is None:
        return
    t = d.t_start
    if t is None:
        starts = [c.t_start for v in views if v.role in d.waiting for c in v.collectives
                  if c.group == d.group and c.seq == d.seq]
        t = min(starts, default=t0)
    ax.axvline(t - t0, color="k", ls="--", lw=1)
    right = t - t0 > span / 2   # the note on the side with room
    ax.annotate(f"group {d.group} seq {d.seq}: {d.op}", (t - t0, -0.5), xytext=(-4 if right else 4, -2),
                textcoords="offset points", fontsize=8, va="bottom", ha="right" if right else "left")


def finding_md(finding: JobFinding) -> str:
    """One paragraph for the notebook: the class, the culprit and the sentence that shows it."""
    e = report.esc
    cls = e(finding.cls) if finding.cls else "no cross-process finding"
    culprit = e(finding.culprit) if finding.culprit else "none named"
    lead = f" {e(finding.evidence[0])}." if finding.evidence else ""
    return f"**Job finding:** {cls}; **culprit:** {culprit}.{lead}"


def show_job(v: Any) -> None:
    """Notebook 03's view of a job's verdict: the finding, one row per process, every process on one time
    axis with the divergence marked. Read back from the verdict's folder (procs/), as `gpulab merge` does."""
    from pathlib import Path

    from IPython.display import Markdown, display

    from gpulab.hang.jobs import job, merge

    try:
        views = merge.node_views(Path(v.log["dir"]))
    except Exception as exc:  # noqa: BLE001 - the table in the verdict is still shown
        display(Markdown(f"*The job's folder could not be read again ({report.esc(str(exc))}); its table:*"))
        import pandas as pd
        display(pd.DataFrame(list(v.processes)))
        return
    finding = job.analyse(views)
    display(Markdown(f"**{len(views)} processes in this job.** " + finding_md(finding)))
    display(process_table(finding))
    taken = [p.stat().st_mtime for p in (Path(v.log["dir"]) / "procs").glob("*.stacks_python.txt")]
    plot_timeline(views, finding, t_capture=min(taken) if taken else None)
