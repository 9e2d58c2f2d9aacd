"""The run's front page: one findings table, scenarios x notebooks, that works opened from disk.

Pure rendering from a run summary (the dict the runner also writes as run.json): no network, no
external CSS or scripts, every link relative to the run folder.
"""
from __future__ import annotations

import html
from typing import Any, Mapping

STATUS_STYLE = {
    "ok": ("#1a7f37", "ok"),
    "failed": ("#cf222e", "failed"),
    "killed": ("#cf222e", "stopped at its time limit"),
    "skipped": ("#9a6700", "skipped"),
    "running": ("#0969da", "running"),
    "interrupted": ("#bc4c00", "interrupted"),
    "not_run": ("#59636e", "not run"),
}


def run_summary(run: Mapping[str, Any]) -> str:
    """The run's state in one sentence: never 'ok' unless every notebook ran and passed."""
    nbs = [nb for sc in run.get("scenarios", []) for nb in sc.get("notebooks", [])]
    counts: dict[str, int] = {}
    for nb in nbs:
        counts[nb.get("status", "?")] = counts.get(nb.get("status", "?"), 0) + 1
    status = run.get("status", "running")
    parts = ", ".join(f"{n} {STATUS_STYLE.get(k, ('', k))[1]}" for k, n in counts.items())
    if status == "interrupted":
        return f"INTERRUPTED ({run.get('note') or 'by a signal'}): {parts}"
    if status == "running":
        return f"running: {parts or 'nothing finished yet'}"
    if status == "failed" or any(k != "ok" for k in counts):
        return f"FAILED{' (' + run['note'] + ')' if run.get('note') else ''}: {parts}"
    return f"all {len(nbs)} notebooks ok"


CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2rem;color:#1f2328;max-width:1400px}
h1{font-size:1.5rem;margin-bottom:.2rem} .sub{color:#59636e;margin-top:0}
table{border-collapse:collapse;width:100%;margin-top:1rem} th,td{border:1px solid #d1d9e0;padding:.45rem .6rem;
vertical-align:top;text-align:left;font-size:.9rem} th{background:#f6f8fa}
.badge{display:inline-block;color:#fff;border-radius:1em;padding:0 .6em;font-size:.8rem;font-weight:600}
.err{color:#cf222e;font-family:ui-monospace,monospace;font-size:.8rem;white-space:pre-wrap;margin-top:.3rem}
.headline{margin:.25rem 0} .links a{margin-right:.6rem;font-size:.8rem} .dur{color:#59636e;font-size:.8rem}
.summary{font-size:1rem;font-weight:600} code{background:#f6f8fa;padding:0 .2em}
"""


def _badge(status: str) -> str:
    color, label = STATUS_STYLE.get(status, ("#59636e", status))
    return f'<span class="badge" style="background:{color}">{html.escape(label)}</span>'


def _cell(nb: Mapping[str, Any]) -> str:
    parts = [_badge(nb.get("status", "?"))]
    if nb.get("duration_s") is not None:
        parts.append(f' <span class="dur">{nb["duration_s"]:.1f} s</span>')
    if nb.get("headline"):
        parts.append(f'<div class="headline">{html.escape(str(nb["headline"]))}</div>')
    if nb.get("error"):
        parts.append(f'<div class="err">{html.escape(str(nb["error"]))[:1500]}</div>')
    links = [(label, nb[key]) for key, label in (("report", "report"), ("full", "full"), ("ipynb", "ipynb"))
             if nb.get(key)]
    if links:
        parts.append('<div class="links">' + "".join(
            f'<a href="{html.escape(href)}">{label}</a>' for label, href in links) + "</div>")
    return "".join(parts)


def render(run: Mapping[str, Any]) -> str:
    """HTML for a run summary: {run_id, started, duration_s, host, scenarios: [{name, description,
    notebooks: [{name, status, duration_s, headline, error, report, full, ipynb}]}]}."""
    scenarios = run.get("scenarios", [])
    names: list[str] = []
    for sc in scenarios:
        for nb in sc.get("notebooks", []):
            if nb["name"] not in names:
                names.append(nb["name"])
    summary = html.escape(run_summary(run))
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    rows = []
    for sc in scenarios:
        by_name = {nb["name"]: nb for nb in sc.get("notebooks", [])}
        desc = html.escape(sc.get("description") or "")
        cells = "".join(f"<td>{_cell(by_name[n]) if n in by_name else ''}</td>" for n in names)
        rows.append(f'<tr><th>{html.escape(sc["name"])}<div class="dur">{desc}</div></th>{cells}</tr>')
    meta = " · ".join(html.escape(str(x)) for x in (
        run.get("started", ""), f"{run.get('duration_s', 0):.0f} s" if run.get("duration_s") is not None else "",
        run.get("host", "")) if x)
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>gpulab run {html.escape(str(run.get('run_id', '')))}</title><style>{CSS}</style></head><body>"
        f"<h1>gpulab run <code>{html.escape(str(run.get('run_id', '')))}</code></h1>"
        f'<p class="sub">{meta}</p><p class="summary">{summary}</p>'
        f"<table><thead><tr><th>scenario</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        "<p class='sub'>report = findings without code; full = every cell with its code; ipynb = the executed notebook.</p>"
        "</body></html>\n"
    )
