"""Notebook 01's tables, plot, finding and the `gpulab env` text report: pure, facts and matches in.

pandas, matplotlib and ipywidgets are imported inside the functions that draw with them, so that
`import gpulab.env` (the probe child, the command line) stays cheap.
"""
from __future__ import annotations

import json
from typing import Any

from gpulab import report
from gpulab.env.facts import FACT_KEYS
from gpulab.env.probe import REPORT_ORDER
from gpulab.env.rules import RiskMatch, scenarios_product, suggested_scenarios

SUMMARY_KEYS = ("cpu_arch", "cpu_model", "host_memory_gb", "os_release", "python_version", "torch_version",
                "torch_git", "cuda_version", "hip_version", "cudnn_version", "nccl_version",
                "cuda_driver_version", "nvidia_driver", "device_kind", "device_name", "compute_capability",
                "gfx_arch", "device_memory_gb", "unified_memory", "arch_list", "arch_in_wheel", "cuda_init_s",
                "cpu_capability", "sdpa_selected", "sdpa_fused_usable", "sdpa_hung", "sdpa_failed",
                "ptrace_permitted", "ptrace_scope", "native_stack_tools", "torch_probe_status",
                "torch_probe_stuck_in", "in_container")
FAILED_RUNS = ("hang", "crash", "error")


def _short(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v)) if v else "(none)"
    if isinstance(v, dict):
        return json.dumps(v, default=str)
    return "" if v is None else str(v)


def _ms(v: Any) -> str:
    return f"{v:.3g} ms" if isinstance(v, (int, float)) else ""


def _frame(rows: list, columns: list[str]):
    import pandas as pd

    return report.table(pd.DataFrame(rows, columns=columns))


# -------------------------------------------------------------------------------------------- facts

def facts_rows(facts: dict, keys=SUMMARY_KEYS) -> list[tuple[str, str, str]]:
    return [(k, _short(facts.get(k)), FACT_KEYS.get(k, "")) for k in keys]


def facts_table(facts: dict, keys=SUMMARY_KEYS):
    return _frame(facts_rows(facts, keys), ["fact", "value", "meaning"])


def sdpa_rows(facts: dict) -> list[dict]:
    """One row per backend, fused ones first: enabled, usable, selected, how its real run ended."""
    sdpa = facts.get("sdpa") or {}
    rows = []
    for b in REPORT_ORDER:
        info = (sdpa.get("backends") or {}).get(b)
        if info is None:
            continue
        run = info.get("run") or {}
        rows.append({"backend": b, "enabled": info.get("enabled"), "usable": info.get("usable"),
                     "selected": sdpa.get("selected") == b,
                     "run": run.get("status", "not run" if info.get("usable") else "not usable"),
                     "ms": run.get("ms"), "reason": "; ".join(info.get("reasons") or []) or
                     ("" if info.get("usable") else "refused (no reason given)")})
    return rows


def sdpa_table(facts: dict):
    return _frame(sdpa_rows(facts), ["backend", "enabled", "usable", "selected", "run", "ms", "reason"])


def env_table(facts: dict):
    """Behaviour-changing variables, the investigation tools and the ptrace verdict, one row each."""
    rows = list((facts.get("env_vars") or {}).items())
    rows += [(f"tool:{k}", (f"{d.get('path')} ({d.get('version')})" if d.get("path") else d.get("error")))
             for k, d in (facts.get("tools") or {}).items()]
    p = facts.get("ptrace") or {}
    rows.append(("ptrace", f"permitted={p.get('permitted')} scope={p.get('ptrace_scope')} "
                           f"cap_sys_ptrace={p.get('cap_sys_ptrace')} sibling={_short(p.get('sibling'))}"))
    return _frame(rows, ["name", "value"])


def plot_sdpa(facts: dict, ax=None):
    """Measured time of each SDPA backend on the workload (hung/failed ones marked), so the reader sees
    which implementations actually run here and what they cost."""
    import matplotlib.pyplot as plt

    rows = sdpa_rows(facts)
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 2.6))
    vals = [r["ms"] if isinstance(r["ms"], (int, float)) else 0.0 for r in rows]
    colors = ["tab:green" if r["run"] == "ok" else "tab:red" if r["run"] in FAILED_RUNS else "tab:gray"
              for r in rows]
    ax.barh([r["backend"] for r in rows], vals, color=colors)
    for i, r in enumerate(rows):
        ax.text(vals[i], i, " " + (_ms(r["ms"]) or r["run"]) + ("  (selected)" if r["selected"] else ""),
                va="center", fontsize=8)
    sdpa = facts.get("sdpa") or {}
    ax.set_xlabel("ms per call (median of 5 after 2 warm-ups" + (", with backward)" if sdpa.get("requires_grad") else ")"))
    ax.set_title(f"SDPA on {facts.get('device_name') or sdpa.get('device')}: shape {sdpa.get('shape')}, "
                 f"{sdpa.get('dtype')}", fontsize=9)
    ax.set_xlim(0, max(vals + [1e-3]) * 1.5)
    ax.invert_yaxis()
    return ax


# -------------------------------------------------------------------------------------------- risks

def matches_table(matches: list[RiskMatch]):
    return _frame([{"severity": m.severity, "rule": m.rule_id, "title": m.title, "because": "; ".join(m.matched),
                    "fixes": ", ".join(m.fixes) or "(advice only)", "source": m.source} for m in matches],
                  ["severity", "rule", "title", "because", "fixes", "source"])


def evidence_table(matches: list[RiskMatch]):
    rows = [{"rule": m.rule_id, "fact": k, "observed": v if isinstance(v, (str, int, float, bool)) or v is None
             else str(v)} for m in matches for k, v in m.evidence.items()]
    return _frame(rows, ["rule", "fact", "observed"])


def scenarios_table(matches: list[RiskMatch]):
    """The fix scenarios notebook 04 should try, what each does, and the rules that suggest it."""
    sug = scenarios_product(matches)
    return _frame([{"scenario": s, "what": sug["descriptions"][s], "because": ", ".join(sug["because"][s])}
                   for s in sug["scenarios"]], ["scenario", "what", "because"])


def risk_markdown(m: RiskMatch | None) -> str:
    return f"**{m.title}**\n\n{m.risk}\n\nSource: {m.source}" if m else "Nothing matched."


def risk_browser(matches: list[RiskMatch]):
    """A dropdown over the matched risks showing each one's explanation (notebook 01's interactive mode)."""
    import ipywidgets as widgets
    from IPython.display import Markdown, display

    by_id = {m.rule_id: m for m in matches}
    pick = widgets.Dropdown(options=list(by_id) or ["(no risks)"], description="risk")
    shown = widgets.Output()

    def show(change=None):
        shown.clear_output()
        with shown:
            display(Markdown(risk_markdown(by_id.get(pick.value))))

    pick.observe(show, names="value")
    show()
    return widgets.VBox([pick, shown])


# -------------------------------------------------------------------------------------------- finding

def headline(facts: dict, matches: list[RiskMatch]) -> str:
    """One line for the index: the platform, the SDPA path it takes, and how many known risks apply."""
    dev = facts.get("device_name") or facts.get("device_kind") or "unknown device"
    where = f"{dev} ({facts.get('compute_capability') or facts.get('gfx_arch') or facts.get('cpu_arch')})"
    parts = [f"{where}, torch {facts.get('torch_version')}: SDPA selects {facts.get('sdpa_selected') or 'n/a'}"]
    if facts.get("sdpa_hung"):
        parts.append(f"{', '.join(facts['sdpa_hung'])} hung")
    if facts.get("torch_probe_status") not in (None, "ok"):
        parts.append(f"probe {facts['torch_probe_status']} in {facts.get('torch_probe_stuck_in')}")
    high = [m.rule_id for m in matches if m.severity == "high"]
    parts.append(f"{len(matches)} known risk(s)" + (f", high: {', '.join(high)}" if high else ""))
    return "; ".join(parts)


def finding_text(facts: dict, matches: list[RiskMatch]) -> str:
    """The finding paragraph (markdown): the headline, then the most severe risk's advice."""
    text = f"**Finding.** {headline(facts, matches)}."
    if not matches:
        return text + " No known platform problem matches these facts."
    return text + (f" Advice: {matches[0].advice}" if matches[0].advice else "")


def finding(facts: dict, matches: list[RiskMatch]) -> tuple[str, dict]:
    """Notebook 01's headline and metrics for gpulab.report.record."""
    return headline(facts, matches), {
        "device_name": facts.get("device_name"), "device_kind": facts.get("device_kind"),
        "torch_version": facts.get("torch_version"),
        "cuda_version": facts.get("cuda_version") or facts.get("hip_version"),
        "sdpa_selected": facts.get("sdpa_selected"), "sdpa_hung": facts.get("sdpa_hung"),
        "sdpa_failed": facts.get("sdpa_failed"),
        "sdpa_call": (facts.get("sdpa") or {}).get("call"), "risks": len(matches),
        "risk_ids": [m.rule_id for m in matches], "suggested_scenarios": suggested_scenarios(matches),
        "probe_status": facts.get("torch_probe_status")}


def format_report(facts: dict, matches: list[RiskMatch]) -> str:
    """The `gpulab env` text report."""
    sdpa = facts.get("sdpa") or {}
    lines = ["gpulab env: platform facts", ""]
    lines += [f"  {k:<22} {v}" for k, v, _ in facts_rows(facts)]
    lines += ["", f"SDPA backends for the workload {sdpa.get('call') or sdpa.get('shape')}:"]
    for r in sdpa_rows(facts):
        lines.append(f"  {r['backend']:<10} enabled={str(r['enabled']):<5} usable={str(r['usable']):<5} "
                     f"{'SELECTED ' if r['selected'] else ''}run={r['run']} {_ms(r['ms'])}".rstrip())
        if r["reason"]:
            lines.append(f"{'':14}{r['reason'][:300]}")
    ev = facts.get("env_vars") or {}
    lines += ["", "Environment variables that change behaviour: "
              + (", ".join(f"{k}={v}" for k, v in ev.items()) or "(none set)")]
    tl = facts.get("tools") or {}
    lines.append("Tools: " + ", ".join(f"{k}={'yes' if d.get('path') else 'no'}" for k, d in tl.items())
                 + f", ptrace={facts.get('ptrace_permitted')}")
    lines += ["", f"Platform risks matched: {len(matches)}"]
    for m in matches:
        lines += [f"  [{m.severity}] {m.rule_id}: {m.title}", f"      because: {'; '.join(m.matched)}",
                  f"      risk: {m.risk}"]
        lines += [f"      advice: {m.advice}"] if m.advice else []
        lines.append(f"      source: {m.source}")
    suggested = suggested_scenarios(matches)
    lines.append("Suggested fix scenarios: " + (", ".join(suggested) if suggested else "(none)"))
    if facts.get("errors"):
        lines += ["", "Probe errors: " + "; ".join(f"{k}: {v}" for k, v in facts["errors"].items())]
    return "\n".join(lines)
