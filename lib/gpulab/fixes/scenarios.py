"""Which scenarios the matrix runs: names, `all`, or `auto` (what 01's risk rules and 03's verdict point at).

A scenario is a list of fixes: `baseline` (none), a fix's name, fixes joined with '+' (`sync_gemm+fp32_softmax`),
or a scenario file params/scenarios/NAME.yaml with a `fixes:` list. `auto` is the baseline, the fixes 01's
rules suggest (suggested_scenarios.json), those targeting the class of 03's verdict (a planted drill is not
a verdict) and, once the baseline ran, those targeting the class of its own failure.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpulab import paramsets, report
from gpulab.fixes import answers, registry
from gpulab.fixes.compose import compose
from gpulab.fixes.fix import UnknownFix
from gpulab.fixes.names import fix_names
from gpulab.hang.classify import op_kind

AUTO, ALL = "auto", "all"
BASELINE = "baseline"


@dataclass(frozen=True)
class Scenario:
    name: str
    fixes: tuple[str, ...] = ()
    why: str = ""               # why it is in the matrix

    @property
    def is_baseline(self) -> bool:
        return not self.fixes


@dataclass(frozen=True)
class Pointers:
    """What earlier notebooks found that `auto` follows."""
    suggested: tuple[str, ...] = ()      # 01: fixes its matched risk rules suggest
    because: tuple[tuple[str, str], ...] = ()   # fix -> rule ids, in words
    classes: tuple[str, ...] = ()        # 03: its verdict's class and its in-flight op's kind (none for a drill)
    evidence: Any = None                 # 03: its first failure's verdict (answers.brief), None for a drill


def root_dir() -> Path:
    return registry.project_dir().parent


def _files(root: Path) -> dict[str, tuple[str, ...]]:
    """Scenario files that name fixes: name -> fixes (files without `fixes:` change parameters only)."""
    out = {}
    for name in paramsets.list_scenarios(root):
        path = root / "params" / "scenarios" / f"{name}.yaml"
        fixes = paramsets.read_yaml(path).get("fixes")
        if fixes:
            out[name] = fix_names(fixes, f"params/scenarios/{name}.yaml")
    return out


def choices(root: Path | None = None) -> str:
    files = sorted(set(_files(root or root_dir())) - set(registry.names()))
    return (f"{BASELINE}, {AUTO}, {ALL}, a fix ({', '.join(registry.names())}), fixes joined with '+'"
            + (f", or a scenario file ({', '.join(files)})" if files else ""))


def named(name: str, root: Path | None = None) -> Scenario:
    name = name.strip()
    if name == BASELINE:
        return Scenario(BASELINE, (), "the workload as it is")
    if "+" in name:
        parts = tuple(p.strip() for p in name.split("+"))
        compose(registry.resolve(parts))   # unknown names and fixes that cannot be combined fail here
        return Scenario(name, parts, "asked for")
    if name in registry.load():
        return Scenario(name, (name,), "asked for")
    files = _files(root or root_dir())
    if name in files:
        return Scenario(name, files[name], f"params/scenarios/{name}.yaml")
    raise UnknownFix(f"unknown scenario {name!r}; choose {choices(root)}")


def parse(text: str, root: Path | None = None) -> tuple[tuple[Scenario, ...], bool]:
    """--scenario text -> (scenarios, auto?). The baseline always comes first: everything is compared with
    it. Raises UnknownFix (a ValueError) naming the bad name and the choices, before anything runs."""
    text = str(text).strip()
    if text == AUTO:
        return (Scenario(BASELINE, (), "the workload as it is"),), True
    if text == ALL:
        return (Scenario(BASELINE, (), "the workload as it is"),
                *(Scenario(n, (n,), "all") for n in registry.names())), False
    names = [n.strip() for n in text.split(",")]
    if not text or not all(names):
        raise UnknownFix(f"--scenario {text!r} names an empty scenario; choose {choices(root)} (comma-separated)")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UnknownFix(f"scenario(s) {', '.join(map(repr, dup))} listed more than once in {text!r}")
    picked = [named(n, root) for n in names]
    base = [s for s in picked if s.is_baseline] or [Scenario(BASELINE, (), "always run: the comparison")]
    return (base[0], *(s for s in picked if not s.is_baseline)), False


def pointers(out_dir: str | Path | None) -> Pointers:
    """01's suggestions and 03's first failure, read from a scenario folder when they are there."""
    if out_dir is None:
        return Pointers()
    out = Path(out_dir)
    sug = report.read_json(out / "suggested_scenarios.json", default={}) or {}
    known = set(registry.names())
    names = tuple(n for n in sug.get("scenarios") or () if n in known)
    because = tuple((n, ", ".join(sug.get("because", {}).get(n) or ())) for n in names)
    m03 = report.metrics_of(out, "03_bisect_hang")
    failed = m03.get("status") not in (None, "ok") and not m03.get("drill")
    evidence = (first_failure(out / "ladder") or caught_failure(out)) if failed else None
    return Pointers(names, because, failure_classes(m03.get("class"), m03.get("in_flight_op")) if failed else (),
                    evidence)


def times_anything(out_dir: str | Path, values: Mapping[str, Any]) -> bool:
    """Whether notebook 04 may time something in this scenario folder, once 01 and 03 ran: not when `auto`, with
    no planted fault, follows a healthy 03 whose ladder passed every trial and no suggestion of 01's (the baseline
    alone, 03's ladder standing for it, and a cost is a fix timed against the baseline), nor with no cost rounds. The chain's
    scheduler then runs 04 beside the notebooks that time nothing (notebook metadata `timed`)."""
    if int(values.get("cost_rounds", 1) or 0) == 0:
        return False
    try:
        chosen, is_auto = parse(str(values.get("scenarios", AUTO)))
    except UnknownFix:
        return True   # 04 says what is wrong; nothing is decided here
    if not is_auto:
        return len(chosen) > 1
    found = pointers(out_dir)
    lad = report.read_json(Path(out_dir) / "ladder" / "ladder.json", default=None) or {}
    # 03's ladder, which 04 takes as its baseline: its own answer (LadderResult.first_failing_rung)
    passed = bool(lad.get("rungs")) and not lad.get("interrupted") and lad.get("first_failing_rung") is None
    ran03 = report.metrics_of(out_dir, "03_bisect_hang").get("status") is not None
    return not (ran03 and passed and not found.suggested and found.evidence is None and not found.classes
                and str(values.get("fault", "none")) in ("", "none"))


def first_failure(ladder_dir: Path) -> dict | None:
    """The first failing trial's verdict of a ladder folder, brief (gpulab.fixes.answers.brief)."""
    lad = report.read_json(ladder_dir / "ladder.json", default={}) or {}
    ff = next((r.get("first_failure") for r in lad.get("rungs") or () if r.get("first_failure")), None)
    if not ff:
        return None
    full = report.read_json(ladder_dir / str(ff.get("folder")) / "verdict.json", default=None) or ff
    return answers.brief(full)


def caught_failure(out_dir: Path) -> dict | None:
    """03's verdict of what a watch caught (gpulab run --from: out_dir/caught/), brief."""
    full = report.read_json(out_dir / "caught" / "verdict.json", default=None)
    return answers.brief(full) if full else None


def failure_classes(cls: str | None, in_flight_op: str | None) -> tuple[str, ...]:
    """A failure's class and the kind of the op it was in (a deadlock inside softmax is classed host_lock
    from its stacks, yet the softmax fixes are the ones to try too)."""
    return tuple(dict.fromkeys(c for c in (cls, op_kind(in_flight_op)) if c))


STAGES = ("evidence", "01", "class", "rest")


@dataclass(frozen=True)
class Plan:
    """`auto`'s plan: the stages in the order they run, and the fixes left out because the failure's evidence
    rules them out (its class, whose code it is, the platform, the op in flight), each with why."""
    stages: tuple[tuple[str, tuple[Scenario, ...]], ...] = ()
    skipped: tuple[dict, ...] = ()     # {"scenario", "why", "planned_because"}


def stages(found: Pointers, evidence: Sequence[Mapping[str, Any]], platform: Mapping[str, Any],
           classes: Sequence[str], have: Sequence[str] = ()) -> list[tuple[str, tuple[Scenario, ...]]]:
    """`auto`'s stages (plan(...).stages)."""
    return list(plan(found, evidence, platform, classes, have).stages)


def plan(found: Pointers, evidence: Sequence[Mapping[str, Any]], platform: Mapping[str, Any],
         classes: Sequence[str], have: Sequence[str] = ()) -> Plan:
    """`auto`'s plan, in the order it runs (pure but for the registry): (1) the fixes whose declared
    evidence the failures show (gpulab.fixes.answers.suggest: the same fixes a verdict's "try" names),
    (2) those 01's risk rules suggest, (3) the other applicable fixes that target the failure's class, (4)
    every other applicable fix. None twice, none in `have`; a fix that cannot apply here is left out, and so
    is one after (1) whose every Answer the failure's known facts contradict (answers.ruled_out: a segfault in
    the program's own op gets no SDPA or DataLoader scenario): those are listed in `skipped` with why."""
    fixes = registry.load()
    usable = [f for n, f in sorted(fixes.items()) if f.applies(platform)]
    seen = set(have)
    out: list[tuple[str, tuple[Scenario, ...]]] = []
    skipped: list[dict] = []
    failures = [e for e in evidence if e]

    def add(stage: str, picks: Sequence[tuple[str, str]]) -> None:
        got = []
        for name, why in picks:
            if name not in seen and name in fixes and fixes[name].applies(platform):
                seen.add(name)
                no = answers.ruled_out(fixes[name], failures, platform) if stage != "evidence" else None
                if no:
                    skipped.append({"scenario": name, "why": f"cannot answer this failure: it answers {no}",
                                    "planned_because": why})
                else:
                    got.append(Scenario(name, (name,), why))
        if got:
            out.append((stage, tuple(got)))

    matched = [m for ev in evidence if ev for m in answers.suggest(usable, ev, platform)]
    add("evidence", [(m.fix, f"the evidence: {m.because} ({', '.join(m.facts)})") for m in matched])
    because = dict(found.because)
    add("01", [(n, f"01's risk rules ({because.get(n) or 'matched'})") for n in found.suggested])
    add("class", [(f.name, f"targets {c}, the failure's class") for c in classes for f in usable if c in f.targets])
    add("rest", [(f.name, "another applicable fix (nothing more specific removed the failure)") for f in usable])
    return Plan(tuple(out), tuple(skipped))
