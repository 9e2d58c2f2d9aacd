"""The fix matrix: every scenario climbs the validation ladder with repeats in isolated children, then
timing children (interleaved with the baseline's) give its cost and its outputs; each scenario gets a
verdict and the matrix a recommendation.

fixes.json (and fixes_table.csv) is rewritten after every scenario and every timing round, so an
interrupt keeps what was observed. Layout of out_dir: <scenario>/ holds that scenario's ladder (one
folder per trial), timing/ the timing children. What the results are, and how they are judged, is
gpulab.fixes.outcome's.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from gpulab import device as gdevice
from gpulab import proc, report, workloads
from gpulab.fixes import cost, platform, registry, scenarios
from gpulab.fixes.compose import FIXES_VAR, clean_env, compose, scenario_env
from gpulab.fixes.fix import not_applicable
# the results and their judgements live in outcome; named here too, as notebooks and tests name them (matrix.X)
from gpulab.fixes.outcome import (MatrixResult, ScenarioResult, apply_lines, judged, ladder_summary, rows,
                                  time_saved, with_evidence)
from gpulab.fixes.scenarios import Scenario
from gpulab.fixes.target import Target
from gpulab.hang.investigation import ladder
from gpulab.hang.watchdog import watch
from gpulab.trace import liveness

NAME = "fixes"
PLAIN = ("a plain command: outcomes and time only (its outputs are not known to gpulab, so numerics are not "
         "compared)")


@dataclass(frozen=True)
class MatrixConfig:
    scenarios: str = "auto"         # names (comma list, '+' joins fixes), auto or all
    repeats: int = 3                # trials per rung
    jobs: int = 1                   # trials side by side
    stall_s: float = liveness.STALL_S
    timeout_s: float = 3600.0
    max_overhead: float = 0.2       # a fix that costs more than this is too_slow
    cost_rounds: int = 3            # interleaved timing rounds (0: no cost and no numerics)
    time_s: float = 1.0             # seconds of timed repeats of the built-in rung in each timing child
    mode: str = "auto"
    fault: str | None = None        # a planted fault (a labelled self-test)
    budget_s: float = 120.0         # auto: seconds of trying fixes beyond those the evidence points at (the chain's
    #                                 goal: a recommendation within 4 minutes on a GPU, 5 on a CPU)

    def __post_init__(self) -> None:
        for key in ("repeats", "jobs"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{key}={v!r} is not valid; it must be a whole number >= 1")
        if isinstance(self.cost_rounds, bool) or not isinstance(self.cost_rounds, int) or self.cost_rounds < 0:
            raise ValueError(f"cost_rounds={self.cost_rounds!r} is not valid; it must be a whole number >= 0")
        for key in ("stall_s", "timeout_s", "time_s", "budget_s"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{key}={v!r} is not valid; it must be a number of seconds > 0")
        if isinstance(self.max_overhead, bool) or not isinstance(self.max_overhead, (int, float)) \
                or not self.max_overhead >= 0:
            raise ValueError(f"max_overhead={self.max_overhead!r} is not valid; it must be a fraction >= 0 (0.2 = 20%)")
        if self.mode not in watch.MODES:
            raise ValueError(f"mode={self.mode!r} is not valid; choose one of {', '.join(watch.MODES)}")
        object.__setattr__(self, "fault", watch.resolve_fault(self.fault))

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "MatrixConfig":
        """From notebook parameters (a notebook's globals()): its trace_mode is the ladder's mode; keys that
        are not the matrix's are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in params.items() if k in names}
        if "trace_mode" in params:
            kw["mode"] = params["trace_mode"]
        if "fix_budget_s" in params:
            kw["budget_s"] = params["fix_budget_s"]
        if "jobs" in params:
            kw["jobs"] = gdevice.trial_jobs(params["jobs"], str(params.get("device") or "auto"))
        return cls(**kw)


# ------------------------------------------------------------------------------------ running

class _Matrix:
    """The state of one matrix run: results so far (in the planned order), saved after every change."""

    def __init__(self, target: Target, cfg: MatrixConfig, out: Path, device: str, say: Callable[[str], None],
                 pointers: scenarios.Pointers, json_copy: Path | None = None):
        self.target, self.cfg, self.out, self.device, self.say, self.pointers = target, cfg, out, device, say, pointers
        self._facts: dict | None = None
        self.json_copy = json_copy
        self.order: list[str] = []
        self.done: dict[str, ScenarioResult] = {}
        self.arms: dict[str, cost.Arm] = {}
        self.not_tried: list[dict] = []
        self.skipped: list[dict] = []     # auto: fixes the failure's evidence rules out, with why
        self.interrupted = False
        self.lock = threading.RLock()

    @property
    def facts(self) -> dict:
        """The platform facts fixes are judged against (gpulab.fixes.platform), asked when a fix is first judged:
        where none is (the baseline passed, nothing to fix), a GPU's kernel never imports torch for them (4 s of
        04 on the H100 machine)."""
        if self._facts is None:
            self._facts = platform.facts(self._device_seen(), platform.workload_mask(self.target.cfg))
        return self._facts

    def _device_seen(self) -> str:
        """Where a command's failing op ran, as its baseline showed it: before a command runs gpulab cannot tell a
        CPU program from a GPU one (device auto is the machine's GPU), and a CUDA fix means nothing to an op on
        the CPU. The configured device for the built-in workload, and wherever the evidence does not say."""
        base = self.baseline
        op = (((base.first_failure or {}) if base else {}).get("evidence") or {}).get("in_flight_op")
        seen = op.get("device") if isinstance(op, Mapping) else None
        if self.target.cfg is None and gdevice.kind(seen or "") == "cpu":
            return "cpu"
        return self.device

    @property
    def results(self) -> list[ScenarioResult]:
        return [self.done[n] for n in self.order if n in self.done]

    @property
    def baseline(self) -> ScenarioResult | None:
        return next((r for r in self.results if not r.fixes), None)

    def classes(self) -> tuple[str, ...]:
        """The baseline's failure class and op kind, then 03's."""
        base = self.baseline
        ff = (base.first_failure or {}) if base else {}
        seen = scenarios.failure_classes(ff.get("class"), ff.get("in_flight_op"))
        return tuple(dict.fromkeys(seen + self.pointers.classes))

    def evidence(self) -> list[dict]:
        """The failures `auto` matches fixes against: the baseline's first failure, then 03's."""
        base = self.baseline
        ff = (base.first_failure or {}) if base else {}
        return [e for e in (ff.get("evidence"), self.pointers.evidence) if e]

    def result(self) -> MatrixResult:
        judged_, rec, nxt = judged(self.results, self.cfg.max_overhead, self.cfg.stall_s, self.not_tried)
        note = "" if self.target.compares_outputs else PLAIN
        facts = self._facts if self._facts is not None else {"device": str(self.device), "asked": False}
        return MatrixResult(self.target.describe(), self.target.kind, facts, tuple(judged_), rec, nxt,
                            self.cfg.max_overhead, self.cfg.repeats, self.cfg.stall_s, self.cfg.fault,
                            self.interrupted, note, self.cfg.jobs,
                            self.cfg.jobs > 1 and str(self.device).startswith("cuda"),
                            tuple(self.not_tried), self.cfg.budget_s, apply_lines(self.results),
                            skipped=tuple(self.skipped), time_saved_s=time_saved(self.results, len(self.skipped)))

    def save(self, res: ScenarioResult | None = None) -> MatrixResult:
        with self.lock:
            if res is not None:
                self.done[res.name] = res
            m = self.result()
            report.write_json(self.out / f"{NAME}.json", m.to_dict())
            if self.json_copy is not None:   # the user's --json holds what was observed so far, too
                report.write_json(self.json_copy, m.to_dict())
            report.write_rows(self.out, f"{NAME}_table", rows(m))
            return m

    def _start(self, sc: Scenario, stage: str) -> tuple[ScenarioResult, Any] | None:
        fixes = registry.resolve(sc.fixes)
        comp = compose(fixes)
        changes = "; ".join(f"{f.name}: {f.changes}" for f in fixes) or "nothing (the workload as it is)"
        why_not = not_applicable(fixes, self.facts) if fixes else None   # the baseline needs no facts
        res = ScenarioResult(sc.name, sc.fixes, sc.why, changes, why_not is None, why_not, stage=stage)
        if why_not:
            self.say(f"{sc.name}: not applicable ({why_not})")
            self.save(res)
            return None
        return res, comp

    def climb(self, sc: Scenario, base_env: Mapping[str, str], jobs: int, stage: str = "") -> None:
        started = self._start(sc, stage)
        if started is None:
            return
        res, comp = started
        env = scenario_env(sc.fixes, base_env)   # the fixes reach the ladder's children in it: hang knows no fix
        self.arms[sc.name] = cost.Arm(sc.name, env, comp.params)
        self.say(f"{sc.name}: the ladder with {', '.join(sc.fixes) or 'no fix'} ({sc.why})")
        t0 = time.monotonic()
        # stacks for the baseline only: its failure's evidence picks `auto`'s fixes; the others need outcomes
        lr = ladder.run(self.target.rungs(comp.params), repeats=self.cfg.repeats, jobs=jobs,
                        stall_s=self.cfg.stall_s, timeout_s=self.cfg.timeout_s, out_dir=self.out / sc.name,
                        mode=self.cfg.mode, fault=self.cfg.fault, stop_at_first_failure=True, fixes=sc.fixes,
                        env=env if sc.fixes else base_env, progress=lambda m: self.say(f"  [{sc.name}] {m}"),
                        stacks=not sc.fixes,
                        on_save=lambda so_far: self.save(dataclasses.replace(res, **ladder_summary(so_far))))
        summary = ladder_summary(lr)
        if not sc.fixes:   # the stacks, for the evidence `auto` matches
            with_evidence(summary, self.out / sc.name)
        m = self.save(dataclasses.replace(res, seconds=round(time.monotonic() - t0, 3), **summary))
        got = next(s for s in m.scenarios if s.name == sc.name)
        self.say(f"{sc.name}: {got.failures}/{got.trials} failed -> {got.verdict}")

    def reuse(self, sc: Scenario, lr: ladder.LadderResult, where: str, ladder_dir: Path) -> None:
        """The baseline from a ladder already climbed with the same rungs and settings (03's): not run again."""
        res, comp = self._start(sc, "")
        self.arms[sc.name] = cost.Arm(sc.name, dict(clean_env(os.environ)), comp.params)
        summary = with_evidence(ladder_summary(lr), ladder_dir)
        ff = summary.get("first_failure")
        if ff:
            ff["folder"] = os.path.relpath(ladder_dir / str(ff["folder"]), self.out / sc.name)
        self.say(f"{sc.name}: {where} (same rungs, repeats, stall window and mode): not run again")
        self.save(dataclasses.replace(res, reused=where, seconds=sum(r.seconds for r in lr.rungs), **summary))

    def climb_all(self, todo: Sequence[Scenario], base_env: Mapping[str, str], stage: str = "") -> None:
        """Scenarios side by side when jobs allow: `jobs` children at a time in all (a scenario's trials share
        its slot's part)."""
        workers = max(1, min(self.cfg.jobs, len(todo)))
        per = max(1, self.cfg.jobs // workers)
        if workers == 1:
            for sc in todo:
                self.climb(sc, base_env, per, stage)
            return
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="scenario") as pool:
            pending = {pool.submit(self.climb, sc, base_env, per, stage) for sc in todo}
            try:
                while pending:
                    finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                    for f in finished:
                        f.result()
            except BaseException:
                for f in pending:
                    f.cancel()
                proc.stop_all()
                raise

    def removed(self) -> list[str]:
        """Fix scenarios that ran the ladder without a failure where the baseline failed."""
        base = self.baseline
        if base is None or not base.failures:
            return []
        return [r.name for r in self.results if r.fixes and r.trials and not r.failures]

    def explore(self, base_env: Mapping[str, str], t0: float) -> None:
        """`auto` after the baseline: the fixes the evidence points at, all of them; then, only while none
        removed the failure and the budget lasts, 01's, the class's and the rest, `jobs` scenarios at a
        time. What was planned and not run is kept with the reason."""
        base = self.baseline
        failed = bool(base and base.failures)
        if not failed and not self.pointers.suggested:
            return   # nothing to fix and nothing 01 suggests: no scenario to plan
        planned = scenarios.plan(self.pointers, self.evidence() if failed else [], self.facts,
                                 self.classes() if failed else (), self.order)
        plan = list(planned.stages)
        if not failed:   # nothing to fix: 01's suggestions only, as a table of what they would cost
            plan = [(st, scs) for st, scs in plan if st == "01"]
        else:
            self.skipped = list(planned.skipped)
            if self.skipped:
                self.say(f"auto: {len(self.skipped)} fix(es) not run, the evidence rules them out: "
                         + ", ".join(t["scenario"] for t in self.skipped))
        self.order += [sc.name for _, scs in plan for sc in scs]
        for stage, scs in plan:
            todo = list(scs)
            while todo:
                if self.removed() and stage != "evidence":
                    self._skip(todo, f"not needed: {', '.join(self.removed())} already removed the failure")
                    break
                if stage not in ("evidence", "01") and time.monotonic() - t0 + self.batch_s() > self.cfg.budget_s:
                    self._skip(todo, f"the time budget ({self.cfg.budget_s:g} s, --budget) was spent")
                    break
                batch = todo if stage in ("evidence", "01") else todo[:self.cfg.jobs]
                todo = todo[len(batch):]
                self.say(f"auto, {stage}: " + ", ".join(f"{sc.name} ({sc.why})" for sc in batch))
                self.climb_all(batch, base_env, stage)
        self.save()

    def batch_s(self) -> float:
        """What one more batch is expected to take: the longest scenario so far (a batch runs side by side), so
        that a batch that would end past the budget is not started."""
        return max((r.seconds or 0.0 for r in self.results if not r.reused), default=0.0)

    def _skip(self, todo: Sequence[Scenario], why: str) -> None:
        self.not_tried += [{"scenario": sc.name, "why": why, "planned_because": sc.why} for sc in todo]
        self.order = [n for n in self.order if n not in {sc.name for sc in todo}]
        self.say(f"auto: {len(todo)} more fix(es) not tried: {why}")

    def timed(self) -> list[str]:
        """Scenarios worth timing: applicable, and not failing every run (unless the failure is planted: the
        timing children run without it)."""
        keep = [r.name for r in self.results
                if r.name in self.arms and (r.counts.get("pass", 0) > 0 or self.cfg.fault)]
        base = self.baseline
        return keep if base is not None and base.name in keep and len(keep) > 1 else []

    def apply_costs(self, timings: Mapping[str, Sequence[cost.Timing]]) -> None:
        base = self.baseline
        base_samples = [x for t in timings.get(base.name, ()) for x in t.samples]
        base_out = self._outputs(timings.get(base.name, ()))
        for r in self.results:
            if r.name not in timings:
                continue
            samples = [x for t in timings[r.name] for x in t.samples]
            c = cost.overhead(samples, base_samples) if r.fixes else {"overhead": 0.0, "overhead_ci": None,
                                                                        "samples": [len(samples)] * 2}
            c["runs"] = [t.status for t in timings[r.name]]
            num = None if self.target.compares_outputs else {"ok": None, "note": PLAIN}
            if r.fixes and self.target.compares_outputs:
                got = self._outputs(timings[r.name])
                from gpulab.fixes import numerics   # torch: only where outputs are compared

                num = (numerics.compare_files(base_out, got, self.target.dtype({}),
                                              self.target.dtype(self.arms[r.name].params))
                       if base_out and got else {"ok": None, "note": "no finished timing run of "
                                                 + ("the baseline" if not base_out else "this scenario")})
            self.done[r.name] = dataclasses.replace(r, overhead=c.pop("overhead"), overhead_ci=c.pop("overhead_ci"),
                                                    cost=c, numerics=num)

    def _outputs(self, timings: Sequence[cost.Timing]) -> Path | None:
        ok = next((t for t in timings if t.status == "ok"), None)
        path = self.out / "timing" / ok.folder / "outputs.pt" if ok else None
        return path if path is not None and path.exists() else None


def reusable(lr_dict: Mapping[str, Any] | None, rungs: Sequence[ladder.Rung], cfg: MatrixConfig) -> ladder.LadderResult | None:
    """A ladder (03's ladder.json) that ran exactly what the baseline would run: the same rung commands,
    repeats, stall window, timeout, recording mode and planted fault, without fixes. Else None."""
    if not lr_dict or lr_dict.get("interrupted"):
        return None
    try:
        lr = ladder.LadderResult.from_dict(lr_dict)
    except (TypeError, ValueError, KeyError):   # another version's ladder.json: run the baseline again
        return None
    want = [r.command for r in rungs]
    if lr.covered:   # 03 ran the top rung first and it passed every trial: the rungs below are parts of it
        shape = (lr.passed and [r.command for r in lr.rungs] == want[-1:]
                 and list(lr.covered) == [r.name for r in rungs[:-1]])
    else:            # bottom up to the first failing rung, as the baseline climbs (03 may have run the top too)
        cut = next((i + 1 for i, r in enumerate(lr.rungs) if r.failed), len(lr.rungs))
        lr = dataclasses.replace(lr, rungs=lr.rungs[:cut])
        shape = (bool(lr.rungs) and [r.command for r in lr.rungs] == want[:cut]
                 and (lr.rungs[-1].failed or cut == len(rungs)))
    same = (lr.repeats == cfg.repeats and lr.stall_s == cfg.stall_s and lr.timeout_s == cfg.timeout_s
            and lr.mode == cfg.mode and lr.drill == cfg.fault and not lr.fixes and shape)
    return lr if same else None


def run(target: Target, cfg: MatrixConfig, out_dir: str | Path, *, pointers_dir: str | Path | None = None,
        env: Mapping[str, str] | None = None, progress: Callable[[str], None] | None = None,
        json_copy: str | Path | None = None, reuse_ladder: str | Path | None = None) -> MatrixResult:
    """Run the matrix; raises ValueError (UnknownFix, FixError) before anything runs on bad input. The
    baseline runs first (or comes from `reuse_ladder`, a ladder folder that ran exactly what it would
    run); with `auto`, its failure's evidence picks the fixes (scenarios.stages); the other scenarios side by
    side when `jobs` allows; then the timing rounds, one child at a time. fixes.json (and `json_copy`) is
    rewritten after every scenario and every timing round."""
    chosen, is_auto = scenarios.parse(cfg.scenarios)
    say = progress or (lambda m: print(f"[gpulab fixes] {m}", file=sys.stderr, flush=True))
    dev = target.cfg.device if target.cfg is not None else gdevice.resolve("auto")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    found = scenarios.pointers(pointers_dir)
    mx = _Matrix(target, cfg, out, dev, say, found, Path(json_copy) if json_copy else None)
    base_env = clean_env(os.environ if env is None else env)
    say(f"{target.describe()}: {len(chosen)} scenario(s){' (auto)' if is_auto else ''}, {cfg.repeats} run(s) per "
        f"rung, {cfg.jobs} side by side, stall {cfg.stall_s:g} s"
        + (f", planted fault {cfg.fault} (a self-test)" if cfg.fault else ""))
    base, rest = chosen[0], list(chosen[1:])
    mx.order = [base.name] + [s.name for s in rest]
    t0 = time.monotonic()
    try:
        prior = None
        if reuse_ladder is not None and env is None and not os.environ.get(FIXES_VAR):
            prior = reusable(report.read_json(Path(reuse_ladder) / "ladder.json", default=None),
                             target.rungs({}), cfg)
        if prior is not None:
            mx.reuse(base, prior, "03's ladder", Path(reuse_ladder))
        else:
            mx.climb(base, base_env, cfg.jobs)
        if is_auto:
            mx.explore(base_env, t0)
        else:
            mx.climb_all(rest, base_env)
        names = mx.timed()
        if names and cfg.cost_rounds:
            say(f"cost: {cfg.cost_rounds} interleaved round(s) of {', '.join(names)} (no planted fault, no recorder)")
            cost.measure(target, [mx.arms[n] for n in names], out / "timing", rounds=cfg.cost_rounds,
                         time_s=cfg.time_s, stall_s=cfg.stall_s, timeout_s=cfg.timeout_s, say=say,
                         after_round=lambda timings: (mx.apply_costs(timings), mx.save()))
    except proc.Interrupted:
        mx.interrupted = True
        mx.save()
        raise
    m = mx.save()
    say(f"recommendation: {m.recommendation or 'none'}: {m.next_step}")
    return m


def minimal_config(cfg: workloads.WorkloadConfig, out_dir: Path) -> workloads.WorkloadConfig | None:
    """03's smallest failing configuration of the built-in workload (its bisection, at the failing rung), when
    it is smaller than the configured one; else None."""
    if cfg.kind != "builtin":
        return None
    bis = report.read_json(out_dir / "bisect" / "bisect.json", default=None) or {}
    lad = report.read_json(out_dir / "ladder" / "ladder.json", default=None) or {}
    rung = next((r["name"] for r in lad.get("rungs") or () if r.get("trials", 0) > r.get("counts", {}).get("pass", 0)),
                None)
    fields = {f.name for f in dataclasses.fields(cfg)}
    small = {k: v for k, v in (bis.get("minimal") or {}).items() if k in fields}
    if not small or rung is None or all(getattr(cfg, k) == v for k, v in small.items()):
        return None
    return dataclasses.replace(cfg, rung=rung, **small)


def run_command(command: Sequence[str], mcfg: MatrixConfig, out_dir: str | Path, *,
                progress: Callable[[str], None] | None = None) -> MatrixResult:
    """Notebook 04 on what a watch caught: the fixes tried on a reproduction (a command), products in
    out_dir/fixes; the job itself is never run again."""
    return run(Target(command=command), mcfg, Path(out_dir) / NAME, pointers_dir=out_dir, progress=progress)


def run_workload(cfg: workloads.WorkloadConfig, mcfg: MatrixConfig, out_dir: str | Path, *,
                 progress: Callable[[str], None] | None = None) -> MatrixResult:
    """Notebook 04's matrix: the configured workload, products in out_dir/fixes, `auto` following the 01/03
    products already in out_dir, and the baseline taken from 03's ladder when it ran the same trials.

    Where 03 bisected the built-in workload, the fixes are tried first on its smallest failing configuration
    (each trial costs less), and only those that remove the failure there are confirmed, and timed, on the
    configured one."""
    out = Path(out_dir)
    say = progress or (lambda m: print(f"[gpulab fixes] {m}", file=sys.stderr, flush=True))
    small = minimal_config(cfg, out)
    if small is None:
        return run(Target(cfg), mcfg, out / NAME, pointers_dir=out, progress=progress, reuse_ladder=out / "ladder")
    shown = ", ".join(f"{k}={getattr(small, k)}" for k in ("rung", *bisect_dims(cfg, small)))
    say(f"first on 03's smallest failing configuration ({shown})")
    t0 = time.monotonic()
    first = run(Target(small), dataclasses.replace(mcfg, cost_rounds=0), out / NAME / "minimal", pointers_dir=out,
                progress=progress)
    removed = [s.name for s in first.scenarios if s.fixes and s.trials and not s.failures]
    stage = {"config": shown, "scenarios": {s.name: s.verdict for s in first.scenarios},
             "removed": removed, "seconds": round(time.monotonic() - t0, 1)}
    if not removed:
        say("no fix removed the failure on the smallest configuration: the configured one is not tried again")
        return dataclasses.replace(first, minimal=stage)
    say(f"confirming {', '.join(removed)} on the configured workload")
    confirm = dataclasses.replace(mcfg, scenarios=",".join([scenarios.BASELINE, *removed]))
    m = run(Target(cfg), confirm, out / NAME, pointers_dir=out, progress=progress, reuse_ladder=out / "ladder")
    why = f"removed the failure on 03's smallest failing configuration ({shown})"
    m = dataclasses.replace(m, minimal=stage, scenarios=tuple(dataclasses.replace(s, why=why) if s.name in removed
                                                              else s for s in m.scenarios))
    report.write_json(out / NAME / f"{NAME}.json", m.to_dict())
    return m


def bisect_dims(cfg: workloads.WorkloadConfig, small: workloads.WorkloadConfig) -> list[str]:
    return [f.name for f in dataclasses.fields(cfg) if f.name != "rung" and getattr(cfg, f.name) != getattr(small, f.name)]
