"""Notebook 04's table, plot and words, from a MatrixResult; `finding()` gives its headline and metrics.

pandas, matplotlib and IPython are imported where drawn: the fixes package is imported by children that
must start without them.
"""
from __future__ import annotations

from typing import Any

from gpulab import report
from gpulab.fixes import registry, verdict
from gpulab.fixes.matrix import MatrixConfig
from gpulab.fixes.outcome import MatrixResult, ScenarioResult, readings, rows
from gpulab.hang import faults
from gpulab.hang.investigation import ladder
from gpulab.workloads import WorkloadConfig

COLOURS = {"baseline": "#eaeef2", "fixes": "#aceebb", "partial": "#fff1b8", "no_effect": "#ffffff",
           "breaks_numerics": "#ffcecb", "too_slow": "#ffd8b5", "not_applicable": "#f6f8fa", "not run": "#f6f8fa"}
BAR = {"baseline": "#57606a", "fixes": "#1a7f37", "partial": "#bf8700", "no_effect": "#8c959f",
       "breaks_numerics": "#cf222e", "too_slow": "#bc4c00"}


def intro_md(cfg: WorkloadConfig, mcfg: MatrixConfig) -> str:
    planted = faults.parse(mcfg.fault)
    what = "the built-in workload" if cfg.kind == "builtin" else report.code(cfg.workload)
    head = (f"**Self-test:** the fault {report.code(planted)} is planted in every ladder run on purpose; a fix that "
            f"removes it shows the matrix works. What follows tests gpulab, not the workload.\n\n" if planted else "")
    return head + (f"**Fix scenarios for {what}:** {report.code(mcfg.scenarios)}; each climbs the ladder "
                   f"{mcfg.repeats} time(s) per rung in fresh children with its fixes applied (a hang is "
                   f"{mcfg.stall_s:g} s without progress), then is timed against the baseline in "
                   f"{mcfg.cost_rounds} interleaved round(s); a fix may cost up to {mcfg.max_overhead:.0%}.")


def matrix_table(m: MatrixResult):
    """The matrix, one row per scenario, coloured by verdict."""
    frame = report.table(rows(m), "scenario")
    if frame.empty:
        return frame
    return frame.style.apply(lambda col: [f"background-color: {COLOURS.get(v, '#ffffff')}" for v in col],
                             subset=["verdict"])


def plot_matrix(m: MatrixResult):
    """Left: the failure rate per scenario with its 95% interval; right: the cost with its interval and the
    budget line. Scenarios that did not run (not applicable) are left out."""
    import matplotlib.pyplot as plt

    ran = [s for s in m.scenarios if s.trials]
    if ran and not any(s.fixes for s in ran):  # an empty chart says less than a sentence
        from IPython.display import Markdown, display
        display(Markdown("*Only the baseline ran (no fix scenario was chosen or applicable): there is no failure "
                         "rate or cost to compare; the table below has its runs.*"))
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.5 * max(3, len(ran)) + 1.2), sharey=True)
    if not ran:
        left.text(0.5, 0.5, "no scenario ran", ha="center", va="center")
        return fig
    y = list(range(len(ran)))
    colours = [BAR.get(s.verdict or "", "#8c959f") for s in ran]
    rate = [s.fail_rate * 100 for s in ran]
    err = [[max(0.0, (s.fail_rate - s.fail_rate_ci[0]) * 100) for s in ran],
           [max(0.0, (s.fail_rate_ci[1] - s.fail_rate) * 100) for s in ran]]
    left.barh(y, rate, color=colours, alpha=0.85)
    left.errorbar(rate, y, xerr=err, fmt="none", ecolor="k", capsize=4, lw=1)
    left.set_yticks(y, [s.name for s in ran])
    left.invert_yaxis()
    left.set_xlim(0, 105)
    left.set_xlabel("failed runs (%), 95% interval (Wilson)")
    cost = [100 * (s.overhead or 0.0) for s in ran]
    cerr = [[max(0.0, c - 100 * s.overhead_ci[0]) if s.overhead_ci else 0.0 for c, s in zip(cost, ran)],
            [max(0.0, 100 * s.overhead_ci[1] - c) if s.overhead_ci else 0.0 for c, s in zip(cost, ran)]]
    right.barh(y, cost, color=colours, alpha=0.85)
    right.errorbar(cost, y, xerr=cerr, fmt="none", ecolor="k", capsize=4, lw=1)
    right.axvline(100 * m.max_overhead, color="#cf222e", ls="--", lw=1, label=f"budget {m.max_overhead:.0%}")
    right.axvline(0, color="k", lw=0.5)
    for i, s in enumerate(ran):
        if s.overhead is None and s.fixes:
            right.text(0, i, " not measured", va="center", fontsize=8, color="#57606a")
    right.set_xlabel("cost vs baseline (%), 95% interval (bootstrap)")
    right.legend(loc="lower right", fontsize=8)
    fig.suptitle("fix scenarios: does the failure go away, and at what cost?")
    fig.tight_layout()
    return fig


def recommendation_md(m: MatrixResult) -> str:
    if m.recommendation:
        return f"**Recommendation: {report.code(m.recommendation)}.** {report.esc(m.next_step)}."
    return f"**No recommendation.** {report.esc(m.next_step[0].upper() + m.next_step[1:])}."


def _numerics(s: ScenarioResult) -> str:
    n = s.numerics
    if not s.fixes:
        return "the reference"
    if not n:
        return "not compared"
    word = {True: "unchanged (within tolerance)", False: "CHANGED", None: "not compared"}[n.get("ok")]
    return f"{word}: {n.get('note', '')}" + (f" (tolerance {n['tolerance']:.0e} x magnitude)" if "tolerance" in n
                                           else "")


def _memory(s: ScenarioResult) -> str:
    return (ladder.growth_text(s.memory_growth, leak="(LEAK)")
            or "no per-step trend (fewer than 3 steps on the top rung)")


def details_md(m: MatrixResult) -> str:
    """Per scenario: what its fixes change and how they reach the child, the verdict's reasons, numerics,
    memory, and the first failure."""
    fixes = registry.load()
    out = []
    for s in m.scenarios:
        how = "; ".join(f"{report.code(n)}: {report.esc(fixes[n].changes)} ({report.esc(fixes[n].how())})"
                        for n in s.fixes if n in fixes) or "nothing: the workload as it is"
        ff = s.first_failure or {}
        fail = (f"{ff.get('status')} ({ff.get('class')}) on the {ff.get('rung')} rung"
                + (f" in {report.code(ff['in_flight_op'])}" if ff.get("in_flight_op") else "") if ff else "none")
        verdict = "no fix" if s.verdict == "baseline" else (s.verdict or "not run")
        out.append(f"**{report.esc(s.name)}** ({report.esc(verdict)}): "
                   f"{report.esc(s.verdict_why if s.applicable else s.not_applicable)}\n\n"
                   f"- changes: {how}\n- why tried: {report.esc(s.why)}\n- first failure: {fail}\n"
                   f"- numerics: {report.esc(_numerics(s))}\n- memory: {report.esc(_memory(s))}")
    if m.numerics_note:
        out.append(f"*{report.esc(m.numerics_note)}.*")
    return "\n\n".join([order_md(m), *out])


STAGE_WORDS = {"evidence": "the evidence points at it", "01": "01's risk rules", "class": "targets the failure's class",
               "rest": "another applicable fix"}


def order_md(m: MatrixResult) -> str:
    """What ran, in order and why, what was planned and not run, and whether trials shared a GPU."""
    lines = []
    for i, s in enumerate(m.scenarios, 1):
        how = (f"from {s.reused}, not run again" if s.reused else
               f"{s.failures}/{s.trials} failed" if s.trials else (s.not_applicable or "not run"))
        stage = f" [{STAGE_WORDS.get(s.stage, s.stage)}]" if s.stage else ""
        lines.append(f"{i}. {report.code(s.name)}{report.esc(stage)}: {report.esc(s.why)} ({report.esc(how)})")
    skipped = [f"- {report.code(t['scenario'])}: {report.esc(t['why'])}" for t in m.not_tried]
    ruled = [f"- {report.code(t['scenario'])}: {report.esc(t['why'])}" for t in m.skipped]
    shared = (f"\n\n*{m.jobs} trials ran side by side on one GPU: they shared it, so a trial's time includes the "
              f"others' load (the cost rounds run one child at a time).*" if m.shared_gpu else "")
    if m.minimal:
        tried = ", ".join(f"{report.code(k)} {report.esc(v or '-')}" for k, v in m.minimal["scenarios"].items())
        lines.insert(0, f"*First on 03's smallest failing configuration ({report.esc(m.minimal['config'])}, "
                        f"{m.minimal['seconds']:g} s): {tried}; "
                        + (f"confirmed below on the configured workload: {report.esc(', '.join(m.minimal['removed']))}.*\n"
                           if m.minimal["removed"] else "nothing removed the failure there.*\n"))
    return ("**In the order tried:**\n\n" + "\n".join(lines)
            + ("\n\n**Planned, not tried:**\n\n" + "\n".join(skipped) if skipped else "")
            + (f"\n\n**Not run: the evidence rules them out** ({report.esc(skipped_text(m))}):\n\n" + "\n".join(ruled)
               if ruled else "") + shared)


def skipped_text(m: MatrixResult) -> str:
    """How many fixes the evidence ruled out and the time that saved, in words."""
    if not m.skipped:
        return ""
    saved = (f"about {m.time_saved_s:.0f} s saved, estimated from the trials that ran" if m.time_saved_s
             else "time saved not estimated: nothing ran to time")
    return f"{len(m.skipped)} fix(es) that cannot answer this failure; {saved}"


REMOVED = ("fixes", "too_slow", "breaks_numerics")   # verdicts of a scenario with no failure left


def self_test(m: MatrixResult) -> tuple[bool, str] | None:
    """For a planted fault: did the baseline fail as planted, and did some scenario remove it? (Its cost and
    numbers are the workload's business, not the self-test's.)"""
    if not m.drill:
        return None
    base = m.baseline
    ff = (base.first_failure or {}) if base else {}
    ok, said = faults.self_test(m.drill, ff.get("status") or "ok", ff.get("in_flight_op"))
    removed = [s.name for s in m.scenarios if s.verdict in REMOVED]
    if not ok:
        return False, said
    if not removed:
        return False, f"{said}, but no scenario removed it"
    return True, f"{said}, and {', '.join(removed)} removed it"


def finding(m: MatrixResult) -> tuple[str, dict[str, Any]]:
    """Notebook 04's headline and metrics: what was observed, per scenario (a drill says so)."""
    base = m.baseline
    test = self_test(m)
    drill = f"self-test {'passed' if test[0] else 'FAILED'} ({test[1]}): " if test else ""
    by = {s.name: s for s in m.scenarios}
    if m.recommendation:
        s = by[m.recommendation]
        cost = (f"cost {s.overhead:+.1%}" + (f" (95% {s.overhead_ci[0]:+.0%}..{s.overhead_ci[1]:+.0%})"
                                              if s.overhead_ci else "") if s.overhead is not None else "cost not measured")
        line = m.apply.get(s.name)
        headline = (f"{drill}{s.name} removes the failure: {base.failures}/{base.trials} "
                    f"failed runs without it, 0/{s.trials} with it; {cost}; numerics "
                    f"{_numerics(s).split(':')[0]}" + (f"; apply with: {line}" if line else ""))
    elif base is not None and base.trials and base.counts.get("pass", 0) == base.trials:
        others = sum(1 for s in m.scenarios if s.fixes)
        runs = sum(r["trials"] for r in base.rungs)
        headline = (f"{drill}nothing to fix: the baseline passed all {runs} runs up to the {base.rungs[-1]['rung']} "
                    f"rung (stall window {m.stall_s:g} s)" + (f"; {others} fix scenario(s) measured" if others else ""))
    else:
        ruled = f" ({skipped_text(m)})" if m.skipped else ""
        headline = f"{drill}no fix scenario removed the failure{ruled}; next: {m.next_step}"
    metrics = {
        "recommendation": m.recommendation, "next_step": m.next_step, "kind": m.kind, "drill": bool(m.drill),
        "recommendation_overhead": by[m.recommendation].overhead if m.recommendation else None,
        "recommendation_apply": m.apply.get(m.recommendation) if m.recommendation else None,
        "recommendation_runs": (f"{by[m.recommendation].failures}/{by[m.recommendation].trials}"
                                if m.recommendation else None),
        **_besides(m),
        "tried": [s.name for s in m.scenarios if s.fixes and s.trials],
        "not_tried": [t["scenario"] for t in m.not_tried], "jobs": m.jobs, "shared_gpu": m.shared_gpu,
        "skipped": {t["scenario"]: t["why"] for t in m.skipped}, "time_saved_s": m.time_saved_s,
        "planted": m.drill, "self_test": None if test is None else ("passed" if test[0] else "failed"),
        "baseline_failed": base.failures if base else None,
        "baseline_trials": base.trials if base else 0, "baseline_fail_rate": base.fail_rate if base else None,
        "max_overhead": m.max_overhead, "interrupted": m.interrupted,
        "scenarios": {s.name: {"fixes": list(s.fixes), "verdict": s.verdict, "applicable": s.applicable,
                               "trials": s.trials, "failed": s.failures,
                               "fail_rate": s.fail_rate, "fail_rate_ci": list(s.fail_rate_ci or ()) or None,
                               "overhead": s.overhead, "overhead_ci": s.overhead_ci,
                               "numerics_ok": s.numerics_ok} for s in m.scenarios},
    }
    return headline, metrics


def _besides(m: MatrixResult) -> dict[str, str]:
    """What the index says beside the recommended fix (gpulab.chain.verdict): what its working tells of the
    cause, and the other scenarios that remove the failure too, as 04's next step says them."""
    if not m.recommendation:
        return {"recommendation_means": "", "also_fixes": ""}
    said = readings(m.scenarios)
    obs = {s.name: s.observed() for s in m.scenarios}
    fixing = [obs[s.name] for s in m.scenarios if s.verdict == "fixes"]
    best = obs[m.recommendation]
    return {"recommendation_means": verdict.meaning(best, said["means"]).removeprefix(": "),
            "also_fixes": verdict.others(best, fixing, said["diagnostic"]).removeprefix("; ")}


def finding_md(headline: str) -> str:
    return f"**Finding.** {report.esc(headline)}."
