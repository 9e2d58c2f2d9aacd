"""The run's front page: what is wrong and what to do, per scenario, then the evidence behind it.

Pure rendering from the run summary (the dict the runner also writes as run.json): no network, no
external CSS or scripts, every string from outside escaped, every link relative and URL-encoded.
"""
from __future__ import annotations

import html
from typing import Any, Mapping, Sequence

from gpulab.chain.verdict import FINISHED, NOT_APPLICABLE
from gpulab.report import size_text, url

STATUS_STYLE = {
    "ok": ("#1a7f37", "ok"),
    "failed": ("#cf222e", "failed"),
    "killed": ("#cf222e", "stopped at its time limit"),
    "skipped": ("#9a6700", "skipped"),
    "running": ("#0969da", "running"),
    "interrupted": ("#bc4c00", "interrupted"),
    "not_run": ("#59636e", "not run"), "not_applicable": ("#59636e", "not applicable"),
    "does_not_apply": ("#59636e", "does not apply"),   # ran, and found its question is not the workload's
}
VERDICT_STYLE = {
    "healthy": ("#1a7f37", "healthy"), "hang": ("#cf222e", "HANG"), "crash": ("#cf222e", "CRASH"),
    "error": ("#cf222e", "ERROR"), "wrong_numbers": ("#cf222e", "WRONG NUMBERS"), "slow": ("#9a6700", "SLOW"),
    "failed": ("#8250df", "COULD NOT CHECK"), "interrupted": ("#bc4c00", "INTERRUPTED"),
    "running": ("#0969da", "running"), "not_applicable": ("#59636e", "not applicable"),
}
GLOSSARY = (
    ("rung", "a step of the validation ladder: one attention call (sdpa), one forward pass, one training step, "
             "many steps"),
    ("self-test", "a run with a fault planted on purpose, to check that gpulab finds it; never a finding"),
    ("does not apply", "the notebook ran and found its question is not the workload's (an attention check or "
                       "benchmark of a program that makes no attention call); its line says why"),
    ("oracle", "notebook 05's check of each attention kernel against fp64 attention, with FlashAttention's "
               "error rule"),
    ("95% interval", "the range the true rate or ratio lies in with 95% confidence, given the runs made"),
    ("report / with code / notebook", "the findings without code, every cell with its code, the executed .ipynb"),
)

CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2rem;color:#1f2328;max-width:1500px}
h1{font-size:1.5rem;margin-bottom:.2rem} h2{font-size:1.15rem;margin-top:1.8rem} .sub{color:#59636e;margin-top:0}
table{border-collapse:collapse;width:100%;margin-top:.6rem} th,td{border:1px solid #d1d9e0;padding:.45rem .6rem;
vertical-align:top;text-align:left;font-size:.9rem} th{background:#f6f8fa}
.badge{display:inline-block;color:#fff;border-radius:1em;padding:0 .6em;font-size:.8rem;font-weight:600;white-space:nowrap}
.err{color:#cf222e;font-family:ui-monospace,monospace;font-size:.8rem;white-space:pre-wrap;margin-top:.3rem}
.headline{margin:.25rem 0;overflow-wrap:anywhere} .links a{margin-right:.6rem;font-size:.8rem} .dur{color:#59636e;font-size:.8rem}
.summary{font-size:1.05rem;font-weight:600} code{background:#f6f8fa;padding:0 .2em;font-size:.85em}
.platform{background:#f6f8fa;border:1px solid #d1d9e0;border-radius:6px;padding:.6rem .8rem}
.next{font-weight:600} dl{font-size:.85rem;color:#59636e} dt{font-weight:600;display:inline} dd{display:inline;margin:0 1rem 0 .3rem}
"""


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _badge(style: Mapping[str, tuple[str, str]], status: str) -> str:
    color, label = style.get(status, ("#59636e", status))
    return f'<span class="badge" style="background:{color}">{esc(label)}</span>'


def run_summary(run: Mapping[str, Any]) -> str:
    """The run's state in one sentence: never 'ok' unless every notebook ran and passed."""
    nbs = [nb for sc in run.get("scenarios", []) for nb in sc.get("notebooks", [])]
    counts: dict[str, int] = {}
    for nb in nbs:
        key = nb.get("status", "?")
        counts[key] = counts.get(key, 0) + 1
    status = run.get("status", "running")
    parts = ", ".join(f"{n} {STATUS_STYLE.get(k, ('', k))[1]}" for k, n in counts.items())
    if status == "interrupted":
        return f"INTERRUPTED ({run.get('note') or 'by a signal'}): {parts}"
    if status == "running":
        now = run.get("progress") or "between notebooks"
        ended = ", ".join(f"{n} {STATUS_STYLE.get(k, ('', k))[1]}" for k, n in counts.items() if k != "running")
        return f"running ({now}); finished so far: {ended or 'nothing yet'}"
    if status == "failed" or any(k not in FINISHED for k in counts):
        return f"FAILED{' (' + run['note'] + ')' if run.get('note') else ''}: {parts}"
    na = counts.get(NOT_APPLICABLE, 0)
    if na:
        return f"{counts.get('ok', 0)} notebooks ran to the end; {na} not run (their scenario's fix cannot apply here)"
    return f"all {len(nbs)} notebooks ran to the end"


def _link(href: str, label: str) -> str:
    return f'<a href="{url(href)}">{esc(label)}</a>'


def _applies(sc: Mapping[str, Any], name: str) -> bool:
    """False when the notebook ran and found that its question does not apply to the workload (its metrics
    say `applies: false`, e.g. 05/06 on a program that makes no attention call); its headline says why."""
    return ((sc.get("metrics") or {}).get(name) or {}).get("metrics", {}).get("applies") is not False


def _cell(nb: Mapping[str, Any], applies: bool = True) -> str:
    status = nb.get("status", "?")
    parts = [_badge(STATUS_STYLE, "does_not_apply" if status == "ok" and not applies else status)]
    if nb.get("duration_s") is not None:
        parts.append(f' <span class="dur">{nb["duration_s"]:.1f} s</span>')
    if nb.get("headline"):
        parts.append(f'<div class="headline">{esc(nb["headline"])}</div>')
    if nb.get("error"):
        parts.append(f'<div class="err">{esc(str(nb["error"])[:1500])}</div>')
    links = [_link(nb[k], label) for k, label in (("report", "report"), ("full", "with code"), ("ipynb", "notebook"))
             if nb.get(k)]
    if links:
        parts.append('<div class="links">' + "".join(links) + "</div>")
    return "".join(parts)


def _platform(run: Mapping[str, Any]) -> str:
    p = run.get("platform") or {}
    if not p:
        return ""
    facts = [f"device <b>{esc(p.get('device_name') or '?')}</b> ({esc(p.get('device_kind') or '?')})",
             f"torch {esc(p.get('torch_version') or '?')}"]
    if p.get("cuda_version"):
        facts.append(f"CUDA {esc(p['cuda_version'])}")
    if p.get("sdpa_selected"):
        facts.append(f"attention runs on the <code>{esc(p['sdpa_selected'])}</code> SDPA backend")
    risks = p.get("risks") or []
    risk = (f"<b>{len(risks)} known platform risk(s):</b> " + ", ".join(f"<code>{esc(r)}</code>" for r in risks)
            + " (details in 01)") if risks else "no known platform risk matches (01)"
    return f'<div class="platform">{" · ".join(facts)}<br>{risk}</div>'


def _changed(sc: Mapping[str, Any]) -> str:
    ch = sc.get("changed") or {}
    fixes = sc.get("fixes") or []
    parts = [f"<code>{esc(k)}={esc(v)}</code>" for k, v in ch.items()]
    if fixes:
        parts.insert(0, "fixes " + ", ".join(f"<code>{esc(f)}</code>" for f in fixes))
    return "; ".join(parts) or "defaults"


def _compare(sc: Mapping[str, Any]) -> list[str]:
    """Side-by-side numbers: hang rate (03), oracle (05), workload time and the fix's cost (06, 04)."""
    m = sc.get("metrics") or {}
    h = (m.get("03_bisect_hang") or {}).get("metrics") or {}
    o = (m.get("05_oracle") or {}).get("metrics") or {}
    b = (m.get("06_benchmark") or {}).get("metrics") or {}
    f = (m.get("04_fix_scenarios") or {}).get("metrics") or {}
    runs = h.get("rungs") or {}
    failed = sum(r.get("failed", 0) for r in runs.values())
    hangs = (f"{failed} of {h.get('runs', 0)} runs failed" + (" (self-test)" if h.get("drill") else "")) if runs else "-"
    oracle = (f"{o.get('passed')} of {o.get('candidates_checked')} pass" if o.get("candidates_checked") else
              "does not apply" if o.get("applies") is False else "-")
    speed = f"{b['workload_ms']:.3g} ms per {esc(sc.get('params', {}).get('rung', 'rung'))}" if b.get("workload_ms") else "-"
    cost = f.get("overhead")
    cost_txt = f"{cost:+.0%} vs baseline" if isinstance(cost, (int, float)) else "-"
    return [hangs, oracle, speed, cost_txt]


def _products(sc: Mapping[str, Any]) -> str:
    items = sc.get("products") or []
    return " ".join(_link(p, p.split("/", 1)[1] if "/" in p else p) for p in items) or "-"


def _verdicts(scenarios: Sequence[Mapping[str, Any]]) -> str:
    """The answer first: each scenario's verdict, the worst first."""
    order = {v: i for i, v in enumerate(("hang", "crash", "error", "wrong_numbers", "failed", "interrupted", "slow",
                                         "running", "healthy", "not_applicable"))}
    ranked = sorted(scenarios, key=lambda sc: order.get(sc.get("verdict") or "running", 99))
    return " ".join(f"{_badge(VERDICT_STYLE, sc.get('verdict') or 'running')} {esc(sc['name'])}" for sc in ranked)


def _folder(run: Mapping[str, Any]) -> str:
    """What the run folder holds and its total apparent size: what a copy or an upload of it transfers."""
    f = run.get("folder") or {}
    if not f:
        return ""
    rows = "".join(f"<tr><td><code>{esc(p['name'])}</code></td><td>{int(p['files'])}</td>"
                   f"<td>{esc(size_text(p['bytes']))}</td></tr>" for p in f.get("parts") or ())
    big = ", ".join(f"{_link(x['path'], x['path'])} ({esc(size_text(x['bytes']))})" for x in f.get("largest") or ())
    return ("<h2>What this folder holds</h2>"
            f"<p class=\"sub\">{int(f.get('files') or 0)} files, {esc(size_text(f.get('bytes') or 0))} in all "
            "(apparent size: what a copy, an archive or an upload of this folder transfers)"
            + (f"; the largest: {big}" if big else "") + "</p>"
            f"<table><thead><tr><th>what</th><th>files</th><th>size</th></tr></thead><tbody>{rows}</tbody></table>")


def _shared_note(run: Mapping[str, Any]) -> str:
    jobs = run.get("shared_jobs") or 1
    if jobs <= 1:
        return ""
    return (f'<p class="sub">Up to {int(jobs)} scenarios ran side by side on one machine (no GPU each): their '
            f"workload times (06) include each other's load and compare only roughly across scenarios; "
            f"within one scenario, 06's candidates were timed in the same process. Run with --jobs 1 (or one "
            f"GPU per scenario) to compare speeds.</p>")


def render(run: Mapping[str, Any]) -> str:
    """HTML for a run summary (see gpulab.chain.runner: run.json)."""
    scenarios: Sequence[Mapping[str, Any]] = run.get("scenarios", [])
    names: list[str] = []
    for sc in scenarios:
        for nb in sc.get("notebooks", []):
            if nb["name"] not in names:
                names.append(nb["name"])
    todo = "".join(
        f'<tr><th>{esc(sc["name"])}<div class="dur">{esc(sc.get("description") or "")}</div></th>'
        f'<td>{_badge(VERDICT_STYLE, sc.get("verdict") or "running")}</td><td>{esc(sc.get("evidence") or "")}</td>'
        f'<td class="next">{esc(sc.get("next_step") or "")}</td></tr>' for sc in scenarios)
    compare = "".join(
        f'<tr><th>{esc(sc["name"])}</th><td>{_badge(VERDICT_STYLE, sc.get("verdict") or "running")}</td>'
        + "".join(f"<td>{c}</td>" for c in _compare(sc)) + f"<td>{_changed(sc)}</td></tr>" for sc in scenarios)
    head = "".join(f"<th>{esc(n)}</th>" for n in names)
    grid = []
    for sc in scenarios:
        by_name = {nb["name"]: nb for nb in sc.get("notebooks", [])}
        cells = "".join(f"<td>{_cell(by_name[n], _applies(sc, n)) if n in by_name else ''}</td>" for n in names)
        grid.append(f'<tr><th>{esc(sc["name"])}</th>{cells}</tr>')
    products = "".join(f"<tr><th>{esc(sc['name'])}</th><td class='links'>{_products(sc)}</td></tr>" for sc in scenarios)
    meta = " · ".join(esc(x) for x in (
        run.get("started", ""), f"{run.get('duration_s', 0):.0f} s" if run.get("duration_s") is not None else "",
        f"{len(scenarios)} scenario(s)") if x)
    glossary = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in GLOSSARY)
    rid = esc(run.get("run_id", ""))
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>gpulab run {rid}</title><style>{CSS}</style></head><body>"
        f"<h1>gpulab run <code>{rid}</code></h1>"
        f'<p class="sub">{meta}</p><p class="summary">{_verdicts(scenarios)}</p>'
        f'<p class="sub">{esc(run_summary(run))}</p>{_platform(run)}'
        "<h2>What is wrong, and what to do</h2>"
        f"<table><thead><tr><th>scenario</th><th>verdict</th><th>evidence</th><th>next step</th></tr></thead>"
        f"<tbody>{todo}</tbody></table>"
        "<h2>Scenarios side by side</h2>"
        "<table><thead><tr><th>scenario</th><th>verdict</th><th>hangs (03)</th><th>attention oracle (05)</th>"
        "<th>workload time (06)</th><th>cost of the fix (04)</th><th>what differs from the defaults</th></tr></thead>"
        f"<tbody>{compare}</tbody></table>{_shared_note(run)}"
        f"<h2>Notebooks</h2><table><thead><tr><th>scenario</th>{head}</tr></thead><tbody>{''.join(grid)}</tbody></table>"
        f"<h2>Products</h2><table><tbody>{products}</tbody></table>{_folder(run)}"
        f"<dl>{glossary}</dl></body></html>\n"
    )
