"""What the reader of notebook 04's results needs, apart from how the matrix ran: a scenario's and the
matrix's results (what fixes.json holds) and the judgements over them: a ladder in brief, the verdicts and
the recommendation, how a user applies a fix, the table's rows.

Nothing here runs a child: gpulab.fixes.matrix runs them and builds these; view and `gpulab fixes` read them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpulab import report
from gpulab.fixes import answers, registry, verdict
from gpulab.hang import classify
from gpulab.hang.investigation import ladder


@dataclass(frozen=True)
class ScenarioResult:
    name: str
    fixes: tuple[str, ...]
    why: str                         # why it is in the matrix
    changes: str                     # what its fixes change, in words
    applicable: bool
    not_applicable: str | None = None
    counts: dict = field(default_factory=dict)
    trials: int = 0
    fail_rate: float | None = None
    fail_rate_ci: tuple[float, float] | None = None
    failing_rung: str | None = None
    rungs: tuple[dict, ...] = ()
    first_failure: dict | None = None
    memory_growth: dict | None = None
    overhead: float | None = None
    overhead_ci: list | None = None
    cost: dict = field(default_factory=dict)
    numerics: dict | None = None
    verdict: str | None = None
    verdict_why: str = ""
    seconds: float = 0.0
    stage: str = ""                  # auto: evidence | 01 | class | rest (asked: "")
    reused: str = ""                 # where its runs come from when they were not run again (03's ladder)
    minimal: dict | None = None      # the smaller failing configuration it was first tried on (03's bisection)

    @property
    def failures(self) -> int:
        return self.trials - self.counts.get("pass", 0)

    @property
    def numerics_ok(self) -> bool | None:
        return (self.numerics or {}).get("ok")

    def observed(self) -> verdict.Observed:
        per_run = self.seconds / self.trials if self.trials and self.seconds and not self.reused else None
        return verdict.Observed(self.name, self.fixes, self.applicable, self.trials, self.failures,
                                self.numerics_ok, self.overhead, per_run)


@dataclass(frozen=True)
class MatrixResult:
    workload: str
    kind: str
    platform: dict                  # gpulab.fixes.platform.facts; {"device", "asked": False} where no fix was judged
    scenarios: tuple[ScenarioResult, ...]
    recommendation: str | None
    next_step: str
    max_overhead: float
    repeats: int
    stall_s: float
    drill: str | None = None
    interrupted: bool = False
    numerics_note: str = ""
    jobs: int = 1                    # trials side by side
    shared_gpu: bool = False         # side-by-side trials shared one GPU (their times and contention mix)
    not_tried: tuple[dict, ...] = ()  # auto: {"scenario", "why"} it planned but did not run
    budget_s: float | None = None
    apply: dict = field(default_factory=dict)   # scenario -> how a user applies it in their own job
    # when the fixes were first tried on 03's smallest failing configuration: {"config", "scenarios"
    # ({name: verdict}), "removed" (the fixes confirmed on the original), "seconds"}
    minimal: dict | None = None
    # auto: the fixes the failure's evidence rules out (its class, whose code, the platform), not run:
    # {"scenario", "why", "planned_because"}; and the time that saved, estimated from the trials that ran
    skipped: tuple[dict, ...] = ()
    time_saved_s: float | None = None

    @property
    def baseline(self) -> ScenarioResult | None:
        return next((s for s in self.scenarios if not s.fixes), None)

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------------ pure parts

def ladder_summary(lr: ladder.LadderResult) -> dict[str, Any]:
    """The scenario's rate is its failing rung's (the climb stops there), else its top rung's."""
    if not lr.rungs:
        return {}
    rung = next((r for r in lr.rungs if r.failed), lr.rungs[-1])
    ff = rung.first_failure or {}
    return {"counts": dict(rung.counts), "trials": rung.trials, "fail_rate": rung.fail_rate,
            "fail_rate_ci": tuple(rung.fail_rate_ci), "failing_rung": rung.name if rung.failed else None,
            "rungs": tuple({"rung": r.name, "trials": r.trials, "failed": r.trials - r.counts.get("pass", 0),
                            "fail_rate_ci": list(r.fail_rate_ci)} for r in lr.rungs),
            "first_failure": {"status": ff.get("status"), "class": ff.get("class"), "phase": ff.get("phase"),
                              "in_flight_op": (ff.get("in_flight_op") or {}).get("name"),
                              "folder": ff.get("folder"), "rung": rung.name,
                              "evidence": answers.brief(ff),
                              "owner": ff.get("owner"),
                              "in_program": classify.program_cause(ff.get("class"), ff.get("culprit"),
                                                                   ff.get("processes") or (), ff.get("owner"))}
            if ff else None,
            "memory_growth": lr.rungs[-1].memory_growth}


def with_evidence(summary: dict, ladder_dir: Path) -> dict:
    """The first failure's evidence in brief (answers.brief of its verdict.json), what `auto` matches fixes to."""
    ff = summary.get("first_failure")
    if ff:
        full = report.read_json(ladder_dir / str(ff["folder"]) / "verdict.json", default=None)
        if full:
            ff["evidence"] = answers.brief(full)
    return summary


def judged(results: Sequence[ScenarioResult], max_overhead: float, stall_s: float,
           not_tried: Sequence[Mapping[str, str]] = ()) -> tuple[list[ScenarioResult], str | None, str]:
    """Every scenario's verdict, then the recommendation and the next step (pure but for the registry's
    apply lines)."""
    base = next((r for r in results if not r.fixes), None)
    ff = (base.first_failure or {}) if base else {}
    base_obs = base.observed() if base else verdict.Observed("baseline")
    out = []
    for r in results:
        v, why = verdict.judge(r.observed(), base_obs, max_overhead)
        out.append(dataclasses.replace(r, verdict=v, verdict_why=why))
    rec, nxt = verdict.recommend([r.observed() for r in out], [r.verdict for r in out], stall_s=stall_s,
                                 untried=[t["scenario"] for t in not_tried], apply_lines=apply_lines(results),
                                 in_program=ff.get("in_program"), owner=ff.get("owner"),
                                 **readings(results))
    return out, rec, nxt


def time_saved(results: Sequence[ScenarioResult], skipped: int) -> float | None:
    """Seconds the skipped scenarios would have cost: each as long as the fix scenarios that ran took on average
    (their ladders stop at the first failure, as a skipped one's would), else as the baseline's own ladder."""
    if not skipped:
        return None
    ran = [r.seconds for r in results if r.fixes and r.trials and r.seconds and not r.reused]
    base = next((r.seconds for r in results if not r.fixes and r.seconds), None)
    each = sum(ran) / len(ran) if ran else base
    return round(each * skipped, 1) if each else None


def readings(results: Sequence[ScenarioResult]) -> dict[str, dict[str, str]]:
    """What the registry's fixes say beside a verdict: `means` (fix -> what its working tells of the cause)
    and `diagnostic` (scenario -> what its fixes give up), for verdict.recommend."""
    fixes = registry.load()
    means = {n: fixes[n].means for r in results for n in r.fixes if n in fixes and fixes[n].means}
    diag = {r.name: "; ".join(fixes[n].diagnostic for n in r.fixes if n in fixes and fixes[n].diagnostic)
            for r in results if r.fixes}
    return {"means": means, "diagnostic": {k: v for k, v in diag.items() if v}}


def apply_lines(results: Sequence[ScenarioResult]) -> dict[str, str]:
    """scenario -> how a user applies its fixes in their own job (gpulab.fixes.fix.Fix.apply_line)."""
    fixes = registry.load()
    return {r.name: "; ".join(fixes[n].apply_line() for n in r.fixes if n in fixes) for r in results if r.fixes}


def rows(m: MatrixResult) -> list[dict]:
    """One row per scenario: the table of the notebook and fixes_table.csv."""
    out = []
    for s in m.scenarios:
        ci = s.fail_rate_ci
        oci = s.overhead_ci
        out.append({
            "scenario": s.name, "fixes": ", ".join(s.fixes) or "-", "verdict": s.verdict or "not run",
            "failed": f"{s.failures}/{s.trials}" if s.trials else "-",
            "fail rate 95%": ladder.interval_text(*ci) if ci and s.trials else "-",
            "cost": (f"{s.overhead:+.1%}" + (f" ({oci[0]:+.0%}..{oci[1]:+.0%})" if oci else "")
                     if s.overhead is not None else "-"),
            "numerics": "ok" if s.numerics_ok else "CHANGED" if s.numerics_ok is False else "-",
            "memory/step": ladder.growth_text(s.memory_growth, unit="MiB") or "-",
            "why": s.verdict_why if s.applicable else s.not_applicable,
        })
    return out
