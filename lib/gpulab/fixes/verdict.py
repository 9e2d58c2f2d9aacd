"""Pure rules: a scenario's verdict against the baseline, the recommendation, and what to try next.

A fix "fixes" when the failure rate drops to zero on the same ladder, the numbers stay within the dtype's
tolerance of the fix-free run's, and the cost stays within `max_overhead`; "partial" when the rate drops
but not to zero. Only a fix that removes the failure is judged on numerics and cost: one that changes
nothing is `no_effect` whatever it costs. The recommendation is the cheapest scenario that fixes it
(unknown cost sorts last, then fewer fixes); when there is none, the next step says why in words.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from gpulab.hang.owner import meets


VERDICTS = ("baseline", "fixes", "partial", "no_effect", "breaks_numerics", "too_slow", "not_applicable")
BASELINE = "baseline"


@dataclass(frozen=True)
class Observed:
    """What a scenario's runs showed: all a verdict rests on."""
    name: str
    fixes: tuple[str, ...] = ()
    applicable: bool = True
    trials: int = 0
    failures: int = 0
    numerics_ok: bool | None = None    # None: not compared (a plain command, or no fix-free run finished)
    overhead: float | None = None      # median time / baseline's - 1; None: not measured
    per_run_s: float | None = None     # its ladder's seconds a run (None: its runs were not its own)

    @property
    def rate(self) -> float:
        return self.failures / self.trials if self.trials else 0.0


def _pct(x: float) -> str:
    return f"{x:+.0%}"


def judge(o: Observed, base: Observed, max_overhead: float = 0.2) -> tuple[str | None, str]:
    """(verdict, why in words); verdict None while the scenario has not run."""
    if not o.fixes:
        return BASELINE, (f"the workload as it is: {base.failures} of {base.trials} runs failed" if base.trials
                          else "the workload as it is")
    if not o.applicable:
        return "not_applicable", "cannot apply on this platform"
    if not o.trials or not base.trials:
        return None, "not run"
    runs = f"{o.failures}/{o.trials} runs failed (baseline {base.failures}/{base.trials})"
    if base.failures == 0:
        extra = "; it FAILS where the baseline passed" if o.failures else ""
        return "no_effect", f"nothing to fix: the baseline did not fail; {runs}{extra}"
    if o.rate >= base.rate:
        return "no_effect", runs
    verdict = "fixes" if o.failures == 0 else "partial"
    if o.numerics_ok is False:
        return "breaks_numerics", f"{runs}, but the outputs differ from the fix-free run beyond the tolerance"
    if o.overhead is not None and o.overhead > max_overhead:
        return "too_slow", f"{runs}, but it costs {_pct(o.overhead)} (over the {max_overhead:.0%} budget)"
    cost = f", cost {_pct(o.overhead)}" if o.overhead is not None else ", cost not measured"
    return verdict, runs + cost


def _after_fix(in_program: str | None, owner: Mapping[str, Any] | None) -> str:
    """What follows a fix that works: the program's own bug it works around, the program's own way out where the
    platform's behaviour meets its code, else the upstream report."""
    if in_program:
        return f"; it only works around the program's own bug: {in_program}"
    if owner and owner.get("kind") == "platform" and owner.get("program"):
        return f"; or, in the program itself: {owner['program']}"
    return "; then report the bug upstream with 03's bundle, naming the fix that works"


def _cheapest_key(o: Observed, diagnostic: Mapping[str, str]) -> tuple:
    """Measured cost first; where none is (the baseline never finished a run), a real fix before a diagnostic
    one, then the one whose runs took less time."""
    cost = o.overhead if o.overhead is not None and math.isfinite(o.overhead) else math.inf
    return (cost, bool(diagnostic.get(o.name)), o.per_run_s if o.per_run_s is not None else math.inf,
            len(o.fixes), o.name)


def others(best: Observed, fixing: Sequence[Observed], diagnostic: Mapping[str, str]) -> str:
    """The other scenarios that remove the failure, with what tells them apart (their runs' time, what a
    diagnostic gives up): the user picks knowing them."""
    def one(o: Observed) -> str:
        bits = [f"{o.failures}/{o.trials} failed"]
        if o.overhead is not None:
            bits.append(f"cost {_pct(o.overhead)}")
        elif o.per_run_s is not None and best.per_run_s is not None:
            bits.append(f"about {o.per_run_s:.0f} s a run against {best.per_run_s:.0f} s")
        if diagnostic.get(o.name):
            bits.append(f"it {diagnostic[o.name]}")
        return f"{o.name} ({'; '.join(bits)})"
    rest = [one(o) for o in sorted(fixing, key=lambda o: _cheapest_key(o, diagnostic)) if o is not best]
    return f"; also fixes it: {', '.join(rest)}" if rest else ""


def meaning(best: Observed, means: Mapping[str, str]) -> str:
    """What the chosen fix's working says of the cause (its declared `means`)."""
    said = [means[f] for f in best.fixes if means.get(f)]
    return f": so {' and '.join(said)}" if said else ""


def recommend(observed: Sequence[Observed], verdicts: Sequence[str | None], *, stall_s: float,
              untried: Sequence[str] = (), apply_lines: Mapping[str, str] | None = None,
              in_program: str | None = None, owner: Mapping[str, Any] | None = None,
              means: Mapping[str, str] | None = None,
              diagnostic: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """(the cheapest scenario that fixes the failure or None, the next step in a sentence, with the line
    that applies it in the user's own job). in_program: why the baseline's failure is the program's own bug
    (classify.program_cause), where no fix works the next step points there instead of upstream, and a fix
    that works only works around it. owner (gpulab.hang.owner's dict): the platform's behaviour meeting the
    program's code has a way out in the program too, said beside the fix. means: fix -> what its working
    tells of the cause; diagnostic: scenario -> what it gives up (Fix.means, Fix.diagnostic): the other
    scenarios that work are named too, since which one a job can afford is the user's call."""
    base = next((o for o in observed if not o.fixes), None)
    by = dict(zip((o.name for o in observed), verdicts))
    fixing = [o for o in observed if by.get(o.name) == "fixes"]
    diagnostic = diagnostic or {}
    if fixing:
        best = min(fixing, key=lambda o: _cheapest_key(o, diagnostic))
        cost = (f"at {_pct(best.overhead)} run time" if best.overhead is not None else
                "(cost not measured: the baseline never finished a run to compare with)" if base and not base.rate < 1
                else "(cost not measured)")
        what = best.name + (f" ({', '.join(best.fixes)})" if best.fixes != (best.name,) else "")
        line = (apply_lines or {}).get(best.name)
        return best.name, (f"{what} fixes it ({best.failures}/{best.trials} failed, baseline "
                           f"{base.failures if base else '?'}/{base.trials if base else '?'}) {cost}"
                           + meaning(best, means or {}) + (f"; apply with: {line}" if line else "")
                           + others(best, fixing, diagnostic) + _after_fix(in_program, owner))
    if base is None or not base.trials:
        return None, "the baseline did not run: nothing can be compared"
    if base.failures == 0:
        return None, (f"nothing to fix: the baseline passed {base.trials} of {base.trials} runs of its top rung "
                      f"(stall window {stall_s:g} s); if the failure is intermittent, run more repeats")
    named = {v: [o.name for o in observed if by.get(o.name) == v] for v in ("partial", "breaks_numerics", "too_slow")}
    if named["partial"]:
        return None, (f"{', '.join(named['partial'])} lowers the failure rate but not to zero: combine it with "
                      f"another fix (a scenario 'a+b') or run more repeats to see whether it only hides the failure")
    if named["breaks_numerics"] or named["too_slow"]:
        which = named["breaks_numerics"] + named["too_slow"]
        return None, (f"{', '.join(which)} removes the failure but changes the numbers or costs too much: it "
                      f"localizes the bug (that is where a targeted fix belongs); raise max_overhead only knowingly")
    tried = sum(1 for o in observed if o.fixes and o.trials)
    more = f"; not tried (time budget): {', '.join(untried)}" if untried else ""
    budget = ", or raise --budget to try the rest" if untried else ""
    if in_program:
        return None, f"nothing tried fixes it ({tried} fix scenario(s) ran){more}: {in_program}{budget}"
    if owner and owner.get("kind") == "platform" and owner.get("program"):   # both sides, not an upstream report
        return None, f"nothing tried fixes it ({tried} fix scenario(s) ran){more}: {meets(owner)}{budget}"
    return None, f"nothing tried fixes it ({tried} fix scenario(s) ran){more}; take 03's evidence bundle upstream{budget}"
