"""A scenario's overall verdict, the evidence in one phrase, and the next step: what a team lead must learn
from the index in ten seconds. Pure: read from the notebooks' statuses and metrics.json, nothing else.

Priority, first match wins: interrupted > failed (the tool could not answer) > hang > crash > error (the
workload itself) > wrong_numbers (a vendor attention kernel fails the oracle, the workload produces NaN/Inf,
or 05's comparison of the workload with itself diverges) > slow (the workload's attention runs on a backend
that is much slower than the best correct one for the same call) > healthy. A planted drill is a self-test
and never decides the verdict.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from gpulab.fixes import registry, suggest
from gpulab.hang.classify import program_cause
from gpulab.hang.owner import meets
from gpulab.numerics import variants

VERDICTS = ("healthy", "hang", "crash", "error", "wrong_numbers", "slow", "failed", "interrupted", "not_applicable")
# The status the runner gives the notebooks of a scenario whose fix cannot apply here (their error says why),
# and that scenario's verdict.
NOT_APPLICABLE = "not_applicable"
FINISHED = ("ok", NOT_APPLICABLE)   # notebook statuses that do not fail a run
SLOW_FACTOR = 1.5  # the workload's backend this much slower than the champion on the same call is "slow"


@dataclass(frozen=True)
class ScenarioVerdict:
    verdict: str
    evidence: str
    next_step: str


def _program_cause(hang: Mapping[str, Any]) -> str | None:
    """Why the failure is the program's own bug: 03's in_program (classify.program_cause, which follows the
    verdict's owner), or by class and owner alone for metrics written before 03 said so."""
    return hang.get("in_program") or program_cause(hang.get("class"), owner=hang.get("owner"))


def _owner(hang: Mapping[str, Any], kind: str) -> dict | None:
    o = hang.get("owner") or {}
    return o if o.get("kind") == kind else None


def _upstream(hang: Mapping[str, Any]) -> str:
    """The upstream report, addressed to whose code it is when 03 knows (a library), or the platform's settings."""
    plat = _owner(hang, "platform")
    if plat and plat.get("program"):
        return meets(plat)
    if plat:
        return (f"the platform ({plat.get('where')}): apply the fix registry's settings for it (the fixes 04 "
                f"tries for this platform) and check the driver, firmware and hardware; {plat.get('why')}")
    lib = _owner(hang, "library")
    if lib:
        return (f"attach bundle.zip (03), with its verified repro, to an upstream report for {lib.get('where')}: "
                f"{lib.get('why')}")
    return "attach bundle.zip (03) to an upstream report"


def _where_to_fix(hang: Mapping[str, Any]) -> str:
    """After "nothing tried fixes it": the program's own bug, else the platform or an upstream report."""
    cause = _program_cause(hang)
    return f": {cause}" if cause else f": {_upstream(hang)}"


def _nan_words(inst: Mapping[str, Any]) -> tuple[str, str, str | None]:
    """02's first NaN/Inf: what was made, where (op, line, pass), its cause in words."""
    return (inst.get("first_nonfinite_made") or "NaN/Inf",
            inst.get("first_nonfinite_where") or inst["first_nonfinite_op"], inst.get("first_nonfinite_cause"))


def _first_nan(inst: Mapping[str, Any]) -> tuple[str, str]:
    """Wrong numbers told as a hang is: the op, its line, the pass, the cause in words; then whose code to
    change, and a fix scenario only when one can answer that cause (gpulab.fixes.suggest.for_nan)."""
    made, where, cause = _nan_words(inst)
    evidence = (f"the workload first makes {made} in {where}: " + (cause or "its cause was not recorded")
                + " (02, stats mode)")
    step = inst.get("first_nonfinite_next") or "look at that op's inputs in 02's op table"
    fixes = suggest.for_nan(inst)
    if fixes:
        step += f"; try the {', '.join(fixes)} scenario"
    return evidence, step


def _passing_nan(inst: Mapping[str, Any]) -> str:
    """A NaN/Inf the run made and did not keep (a loss over no target, values it cleans, an overflow its
    GradScaler skipped): no fault, but the reader who saw a NaN in the logs finds it named here."""
    if inst.get("first_nonfinite_caught_by"):
        return f"02: {inst.get('first_nonfinite_sentence')}"
    if inst.get("first_nonfinite_op") and inst.get("first_nonfinite_lasted") is False:
        made, where, cause = _nan_words(inst)
        return f"02: {made} made in {where}" + (f" ({cause})" if cause else "") + " did not last"
    return ""


def _site(site: Any) -> str | None:
    """file:line in function, the file's folder left out (the full path is in 05's compare.json); None when the
    recorder saw no call site in the program (an op called from a library)."""
    path, sep, rest = str(site or "").partition(":")
    return (path.rsplit("/", 1)[-1] + sep + rest) if sep else None


def _diverged(cmp: Mapping[str, Any]) -> tuple[str, str]:
    """05's comparison told as a hang is: the op, its line, the pass, the cause; then whose code to change (the
    program's line, or a kernel that the float64 replay shows wrong)."""
    fd = cmp.get("first_divergence") or {}
    site = _site(fd.get("call_site"))
    at = (f"{fd.get('op')}" + (f" at {site}" if site else "") + f" (pass {fd.get('pass')}"
          + (", backward" if fd.get("backward") else "") + ("" if site else ", its call site not recorded") + ")")
    line = f"the program's line {site}" if site else f"the program's call that runs {fd.get('op')}"
    cause = fd.get("cause")
    excess = fd.get("excess")
    size = (" by NaN/Inf" if fd.get("nan_inf") else
            f" by {excess:.3g}x the tolerance" if isinstance(excess, (int, float)) else "")
    evidence = (f"05's {cmp.get('mode')} comparison: the runs first diverge at {at}{size}"
                + (f": {cause}" if cause else ""))
    rep, ref_ok, cand_ok = fd.get("replay"), fd.get("reference_right"), fd.get("candidate_right")
    if cause and "unknown" not in str(cause):
        step = f"fix {line}: {cause}"
    elif ref_ok is True and cand_ok is False:
        step = (f"the candidate's kernel is wrong: replay against float64 says {rep}; avoid {fd.get('op')} on the "
                f"candidate's side and report it upstream with 05's compare folder")
    elif ref_ok is False and cand_ok is True:
        step = f"the reference's kernel is wrong: replay against float64 says {rep}; report it upstream"
    elif cmp.get("same_command"):
        step = (f"fix {line}: the same command gives other numbers there (not deterministic); "
                f"seed its random numbers, or call torch.use_deterministic_algorithms(True)")
    elif ref_ok and cand_ok:
        step = (f"fix {line}: {fd.get('op')} amplifies its inputs' rounding past the tolerance "
                f"(replay against float64 says both runs compute it right); compute it in a wider dtype there")
    else:
        step = (f"look at {line}: 05's compare.json has both runs' figures"
                + (f"; replay against float64 says {rep}" if rep else ""))
    return evidence, step


def _m(metrics: Mapping[str, Any], nb: str) -> dict:
    return dict((metrics.get(nb) or {}).get("metrics") or {})


def _h(metrics: Mapping[str, Any], nb: str) -> str:
    return str((metrics.get(nb) or {}).get("headline") or "")


def _select(name: str) -> str:
    """The next step for a faster correct candidate: a fix scenario only where one exists for it."""
    if f"sdpa_backend_{name}" in registry.names():
        return f"select {name} (scenario sdpa_backend_{name}) and check 04's cost table"
    return (f"{name} is not a PyTorch SDPA backend (no fix scenario selects it): call it in the model's attention "
            f"if 05 passed it, and time the change with 06")


def judge(notebooks: Sequence[Mapping[str, Any]], metrics: Mapping[str, Any], scenario: str = "baseline",
          scenario_fixes: Sequence[str] = ()) -> ScenarioVerdict:
    status = {n["name"]: n.get("status") for n in notebooks}
    cut = [n for n in notebooks if n.get("status") == "interrupted"]
    if cut or any(s == "not_run" for s in status.values()) and any("interrupt" in str(n.get("error") or "")
                                                                   for n in notebooks):
        where = cut[0]["name"] if cut else "before it finished"
        return ScenarioVerdict("interrupted", f"the run was interrupted during {where}",
                               "run it again (gpulab run); the finished notebooks are linked below")
    if notebooks and all(n.get("status") == NOT_APPLICABLE for n in notebooks):
        return ScenarioVerdict(NOT_APPLICABLE, f"not run: {notebooks[0].get('error')}",
                               "nothing to do here; run this scenario on the platform the fix is for")
    broken = [n for n in notebooks if n.get("status") in ("failed", "killed")]
    if broken:
        n = broken[0]
        why = str(n.get("error") or n.get("status")).splitlines()[0][:160]
        return ScenarioVerdict("failed", f"{n['name']} could not finish: {why}",
                               f"open the {n['name']} report (with code) to see the error, fix the input or the "
                               f"environment, and run again")
    hang = _m(metrics, "03_bisect_hang")
    fixes = _m(metrics, "04_fix_scenarios")
    if hang and not hang.get("drill") and hang.get("status") in ("hang", "crash", "error", "timeout"):
        kind = "hang" if hang["status"] in ("hang", "timeout") else hang["status"]
        evidence = _h(metrics, "03_bisect_hang")
        rec = fixes.get("recommendation")
        if rec:
            cost = fixes.get("recommendation_overhead")
            runs = fixes.get("recommendation_runs")
            base = (f", baseline {fixes['baseline_failed']}/{fixes['baseline_trials']}"
                    if fixes.get("baseline_trials") else "")
            line = fixes.get("recommendation_apply")
            step = (f"{rec} fixes it" + (f" ({runs} failed{base})" if runs else "")
                    + (f" at {cost:+.0%} run time" if isinstance(cost, (int, float)) else "")
                    + (f": {fixes['recommendation_means']}" if fixes.get("recommendation_means") else "")
                    + (f"; apply with: {line}" if line else "")
                    + (f"; {fixes['also_fixes']}" if fixes.get("also_fixes") else "")
                    + (f"; it only works around the program's own bug: {_program_cause(hang)}"
                       if _program_cause(hang) else
                       f"; {meets(_owner(hang, 'platform'))}" if (_owner(hang, "platform") or {}).get("program")
                       else f"; {_upstream(hang)} (with that workaround)"))
        elif fixes:
            tried = fixes.get("tried") or []
            left = fixes.get("not_tried") or []
            ruled = fixes.get("skipped") or {}
            step = ("nothing tried fixes it" + (f" ({', '.join(tried)})" if tried else
                                                f" (no fix can answer it: 04 ruled out {len(ruled)} by the evidence)"
                                                if ruled else " (no fix applied here)")
                    + (f"; {len(left)} more not tried within the time budget (gpulab fixes --budget)" if left else "")
                    + _where_to_fix(hang))
        else:   # 04 did not run (gpulab run --only 01,02,03)
            cause = _program_cause(hang)
            step = (f"{cause} (no fix was tried: notebook 04, gpulab fixes)" if cause else
                    f"run the fix matrix (notebook 04, gpulab fixes), then {_upstream(hang)}")
        return ScenarioVerdict(kind, evidence, step)
    inst = _m(metrics, "02_instrument")
    if not hang and inst.get("status") in ("hang", "crash", "error", "timeout"):   # 03 did not run (--only 02)
        kind = "hang" if inst["status"] in ("hang", "timeout") else inst["status"]
        return ScenarioVerdict(kind, _h(metrics, "02_instrument"),
                               "run notebooks 03 and 04 the same way (gpulab run with --only 03,04, and the same "
                               "--from or workload) to replay it, name the op and whose code it is, and try the fixes")
    oracle = _m(metrics, "05_oracle")
    vendor_bad = [f for f in oracle.get("failures") or () if str(f).startswith("sdpa_")]
    cmp = oracle.get("compare") or {}
    compared = (cmp.get("status") == "diverged" and bool(cmp.get("first_divergence"))
                and not variants.precision_only(cmp))
    nan = inst.get("first_nonfinite_op") and inst.get("first_nonfinite_lasted", True)   # not one it cleans
    if vendor_bad or nan or compared:
        if vendor_bad:
            evidence = f"{', '.join(map(str, vendor_bad))} fail(s) the attention oracle: {_h(metrics, '05_oracle')}"
            step = "see 05's error heatmaps; avoid that backend (an sdpa_backend_* scenario) and report it upstream"
        elif nan:
            evidence, step = _first_nan(inst)
        else:
            evidence, step = _diverged(cmp)
        return ScenarioVerdict("wrong_numbers", evidence, step)
    bench = _m(metrics, "06_benchmark")
    env = _m(metrics, "01_environment")
    selected, champion = env.get("sdpa_selected"), str(bench.get("champion") or "")
    cands = bench.get("candidates") or {}
    builtin_call = not bench.get("call_recorded")   # 01 probes the built-in call; a program's own is another
    if builtin_call and selected and champion and champion != f"sdpa_{selected}" and f"sdpa_{selected}" in cands:
        mine = (cands.get(f"sdpa_{selected}") or {}).get("median_ms")
        best = (cands.get(champion) or {}).get("median_ms")
        if mine and best and mine / best >= SLOW_FACTOR:
            replaced = [f for f in scenario_fixes if f in registry.names() and registry.get(f).replaces_sdpa]
            if replaced:   # the fix swapped SDPA for its own attention: 06's sdpa_* rows time that instead
                return ScenarioVerdict("slow", f"with {replaced[0]} the workload's attention is no SDPA backend; "
                                       f"it is {mine / best:.1f}x slower than {champion} on the same call (06)",
                                       "that is the fix's own cost: see 04's cost column, and prefer a fix that "
                                       "keeps SDPA where one removes the failure")
            return ScenarioVerdict("slow", f"the workload's attention runs on {selected}, {mine / best:.1f}x slower "
                                   f"than {champion} on the same call (06)",
                                   _select(champion.removeprefix("sdpa_")))
    drill = " (03 ran a self-test of the watchdog, not a check of the workload)" if hang.get("drill") else ""
    parts = [p for p in (_h(metrics, "03_bisect_hang") if not hang.get("drill") else "",
                         _h(metrics, "05_oracle"), _passing_nan(inst)) if p]
    return ScenarioVerdict("healthy", ("; ".join(parts) or "every notebook finished") + drill,
                           "nothing to fix on this platform" if scenario == "baseline" else
                           "compare its cost with the baseline's in the table")
