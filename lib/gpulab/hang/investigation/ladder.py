"""The validation ladder: each rung (a bare attention call, one forward pass, one training step, many
steps) run `repeats` times under the watchdog, each trial a gpulab.proc child with a deadline.

Why repeats: hangs that strike in a fraction of launches are common (pytorch and flashinfer issues report
~2%); one clean run proves little. A rung's failure rate comes with a Wilson 95% interval (the normal
interval collapses at 0 of n), and the number of trials needed to see a rate p with 95% confidence,
ceil(log 0.05 / log(1 - p)), is reported beside it. On multi-step rungs the per-step memory (host RSS, and
CUDA allocated/reserved on a GPU) gives a growth rate and a leak flag.
"""
from __future__ import annotations

import math
import shlex
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from gpulab import proc, report, workloads
from gpulab.hang.watchdog import watch
from gpulab.hang.verdict import Verdict
from gpulab.trace import liveness
from gpulab.trace import run as trace_run

OUTCOMES = ("pass", "hang", "crash", "error", "timeout")
LEAK_MIN_BYTES_PER_STEP = 1 << 20      # below 1 MiB per step, growth is allocator noise
LEAK_MIN_FRACTION_PER_STEP = 0.005     # ... or below 0.5% of the level per step


# ------------------------------------------------------------------------------------ pure statistics

def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a rate k/n (95% by default); (0, 1) when n is 0."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= k <= n:
        raise ValueError(f"k={k} must be within 0..n={n}")
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def interval_text(lo: float, hi: float) -> str:
    """A rate's interval as every report writes it: '44%-100%'."""
    return f"{lo:.0%}-{hi:.0%}"


def trials_to_detect(rate: float, confidence: float = 0.95) -> int | None:
    """Trials needed to see at least one failure of a flake with this rate, with this confidence."""
    if not 0 < rate < 1:
        return 1 if rate >= 1 else None
    return math.ceil(math.log(1 - confidence) / math.log(1 - rate))


def memory_growth(per_step: Sequence[Mapping[str, float]]) -> dict | None:
    """Growth per step of each memory series (bytes/step, least squares over the steps after the first,
    which allocates optimizer state and caches) and a leak flag: a series that grows by more than 1 MiB
    and 0.5% per step, in most steps. None with fewer than 3 steps (no trend to speak of)."""
    if len(per_step) < 3:
        return None
    out: dict[str, Any] = {"steps": len(per_step), "series": {}}
    for key in sorted({k for s in per_step for k in s}):
        ys = [float(s[key]) for s in per_step[1:] if s.get(key) is not None]
        if len(ys) < 2:
            continue
        xs = list(range(len(ys)))
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
        rising = sum(1 for a, b in zip(ys, ys[1:]) if b > a) / (len(ys) - 1)
        leak = (slope > LEAK_MIN_BYTES_PER_STEP and slope > LEAK_MIN_FRACTION_PER_STEP * max(my, 1.0)
                and rising >= 0.7)
        out["series"][key] = {"first": float(per_step[0].get(key) or 0.0), "last": ys[-1],
                              "bytes_per_step": slope, "rising_fraction": round(rising, 3), "leak": leak}
    out["leak"] = any(s["leak"] for s in out["series"].values())
    return out


def growth_text(growth: Mapping[str, Any] | None, unit: str = "MiB/step", leak: str = "LEAK") -> str:
    """memory_growth()'s series as the reports write them, 'rss +1.25 MiB/step LEAK, cuda_allocated +0.00
    MiB/step' ('' when there is none): the tables name the unit in their header, hence `unit`."""
    return ", ".join(f"{k} {v['bytes_per_step'] / 2**20:+.2f} {unit}" + (f" {leak}" if v["leak"] else "")
                     for k, v in ((growth or {}).get("series") or {}).items())


# ------------------------------------------------------------------------------------ configs, results

@dataclass(frozen=True)
class Rung:
    name: str
    command: tuple[str, ...]
    result_json: str | None = None   # where the command writes gpulab.workloads' per-step result, if it does

    def __post_init__(self) -> None:
        if not self.name or not self.command:
            raise ValueError(f"a rung needs a name and a command; got name={self.name!r} command={self.command!r}")


@dataclass(frozen=True)
class Trial:
    rung: str
    index: int
    outcome: str                 # pass | hang | crash | error | timeout
    seconds: float
    folder: str                  # relative to the ladder's folder
    verdict: dict
    memory: tuple = ()           # per-step memory samples (built-in workload)


@dataclass(frozen=True)
class RungResult:
    name: str
    command: tuple[str, ...]
    trials: int
    counts: dict
    fail_rate: float
    fail_rate_ci: tuple[float, float]
    first_failure: dict | None
    memory_growth: dict | None
    seconds: float
    interrupted: bool = False
    ops_completed: int = 0       # median over trials: ops recorded in one run
    median_s: float = 0.0        # median wall time of one trial


    @property
    def failed(self) -> bool:
        return self.trials > 0 and self.counts.get("pass", 0) < self.trials


@dataclass(frozen=True)
class LadderResult:
    rungs: tuple[RungResult, ...]
    repeats: int
    stall_s: float
    interrupted: bool = False
    drill: str | None = None     # the planted fault, when this ladder is a self-test
    mode: str | None = None      # how its trials ran: recording mode, deadline, fixes and side-by-side jobs
    timeout_s: float | None = None
    fixes: tuple[str, ...] = ()
    jobs: int = 1
    covered: tuple[str, ...] = ()   # rungs not run: the top rung, run first, passed every trial, and it runs them

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LadderResult":
        rungs = tuple(RungResult(**{**{k: v for k, v in r.items() if k in RungResult.__dataclass_fields__},
                                    "command": tuple(r.get("command") or ()),
                                    "fail_rate_ci": tuple(r.get("fail_rate_ci") or (0.0, 1.0))})
                      for r in d.get("rungs") or ())
        kw = {k: v for k, v in d.items() if k in cls.__dataclass_fields__ and k != "rungs"}
        kw["fixes"] = tuple(kw.get("fixes") or ())
        kw["covered"] = tuple(kw.get("covered") or ())
        return cls(rungs=rungs, **kw)

    @property
    def first_failing_rung(self) -> str | None:
        return next((r.name for r in self.rungs if r.failed), None)

    @property
    def passed(self) -> bool:
        return not self.interrupted and all(not r.failed for r in self.rungs) and bool(self.rungs)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["first_failing_rung"] = self.first_failing_rung
        return d


def outcome_of(v: Verdict) -> str:
    return "pass" if v.status == "ok" else v.status


def summarize(rung: Rung, trials: Sequence[Trial], seconds: float, interrupted: bool = False) -> RungResult:
    """Counts, rate with its interval, the first failure's verdict, and memory growth: pure."""
    counts = {o: 0 for o in OUTCOMES}
    for t in trials:
        counts[t.outcome] += 1
    n = len(trials)
    k = n - counts["pass"]
    first = next((t for t in sorted(trials, key=lambda t: t.index) if t.outcome != "pass"), None)
    first_failure = None
    if first is not None:
        first_failure = {**first.verdict, "trial": first.index, "folder": first.folder}
    growth = None
    passing = [t for t in trials if t.outcome == "pass" and len(t.memory) >= 3]
    if passing:
        growth = memory_growth(passing[0].memory)
    ops = sorted(int(t.verdict.get("ops_completed") or 0) for t in trials)
    secs = sorted(t.seconds for t in trials)
    return RungResult(rung.name, rung.command, n, counts, k / n if n else 0.0, wilson(k, n), first_failure,
                      growth, round(seconds, 3), interrupted, ops[len(ops) // 2] if ops else 0,
                      secs[len(secs) // 2] if secs else 0.0)


# ------------------------------------------------------------------------------------ running

def builtin_rungs(cfg: workloads.WorkloadConfig, up_to: str | None = None, out_dir: str | Path = ".") -> list[Rung]:
    """The built-in workload's ladder: sdpa -> forward -> step -> steps, climbing up to `up_to` (the
    configured rung by default). Each trial writes its per-step losses and memory to result.json."""
    top = up_to or cfg.rung
    if top not in workloads.RUNGS:
        raise ValueError(f"rung {top!r} is not valid; choose one of {', '.join(workloads.RUNGS)}")
    rungs = []
    for name in workloads.RUNGS[: workloads.RUNGS.index(top) + 1]:
        rc = replace(cfg, rung=name)
        rungs.append(Rung(name, tuple(workloads.command(rc)) + ("--json", "{trial}/result.json"),
                          "{trial}/result.json"))
    return rungs


def command_rungs(specs: Sequence[str]) -> list[Rung]:
    """`NAME=COMMAND` texts (COMMAND split as a shell would) -> rungs; names must be unique."""
    rungs, seen = [], set()
    for spec in specs:
        name, eq, cmd = spec.partition("=")
        name = name.strip()
        if not eq or not name or not cmd.strip():
            raise ValueError(f"--rung {spec!r} is not NAME=COMMAND (e.g. --rung 'step=python train.py --steps 1')")
        if name in seen:
            raise ValueError(f"rung name {name!r} is given twice; each rung needs its own name")
        seen.add(name)
        rungs.append(Rung(name, tuple(shlex.split(cmd))))
    return rungs


def memory_of(rung: Rung, trial_dir: Path) -> tuple:
    """The per-step memory samples a trial's command wrote (the built-in workload), else ()."""
    if not rung.result_json:
        return ()
    data = report.read_json(Path(rung.result_json.replace("{trial}", str(trial_dir))), default=None) or {}
    return tuple(data.get("memory") or ())


def run_trial(rung: Rung, index: int, folder: Path, *, stall_s: float, timeout_s: float, mode: str,
              fault: str | None, record: bool, fixes: Sequence[str] = (), env: Mapping[str, str] | None = None,
              stacks: bool = True) -> Trial:
    """One watched run of a rung. `{trial}` in the command is this trial's folder."""
    tdir = folder / f"{rung.name}-{index:03d}"
    tdir.mkdir(parents=True, exist_ok=True)
    cmd = [c.replace("{trial}", str(tdir)) for c in rung.command]
    t0 = time.monotonic()
    v = watch.run(cmd, stall_s=stall_s, timeout_s=timeout_s, mode=mode, fault=fault, record=record,
                  out_dir=tdir, progress=lambda m: None, fixes=fixes, env=env, stacks=stacks)
    v = keep_what_matters(v, tdir)
    return Trial(rung.name, index, outcome_of(v), round(time.monotonic() - t0, 3), tdir.name,
                 brief(v), memory_of(rung, tdir))


OP_LOG_DROPPED = "not kept: the trial passed (its outcome and timing are in this verdict)"


def keep_what_matters(v: Verdict, tdir: Path) -> Verdict:
    """A passing trial keeps its verdict and result but not its op log (nothing to investigate, and a ladder
    of passes would otherwise fill the run folder); a failing trial keeps everything, its op log cut to what
    was recorded (gpulab.trace.ring.shrink). A passing trial's verdict.json is rewritten to say so."""
    name = (v.log or {}).get("op_log")
    log = tdir / (name or "ops.log")
    if v.status != "ok":
        trace_run.keep_recorded(log)
        return v
    if not log.exists():
        return v
    log.unlink()
    v = replace(v, log={**v.log, "op_log": None, "op_log_note": OP_LOG_DROPPED})
    report.write_json(tdir / "verdict.json", v.to_dict())
    return v


def brief(v: Verdict) -> dict:
    """What the ladder keeps of a trial's verdict (the full one stays in its folder)."""
    d = v.to_dict()
    for k in ("stacks", "oplog_tail", "open_ops", "collapsed"):
        d.pop(k, None)
    return d


def run(rungs: Sequence[Rung], *, repeats: int = 3, jobs: int = 1, stall_s: float = liveness.STALL_S, timeout_s: float = 3600.0,
        out_dir: str | Path, mode: str = "auto", fault: str | None = None, record: bool = True,
        stop_at_first_failure: bool = False, fixes: Sequence[str] = (), env: Mapping[str, str] | None = None,
        progress: Callable[[str], None] | None = None, name: str = "ladder", stacks: bool = True,
        json_copy: str | Path | None = None, on_save: Callable[[LadderResult], None] | None = None,
        given: Mapping[str, Trial] | None = None, top_first: bool = False) -> LadderResult:
    """Climb the ladder; ladder.json (and a CSV, and `json_copy`) is rewritten after every trial, so an
    interrupt or a crash of this process keeps what was observed. `given`: a trial already run, by rung name
    (02's recorded run, gpulab.hang.investigation.firstrun), counted as that rung's trial 0; the others run as usual.
    `top_first`: the top rung runs first, and when it passes every trial the rungs below are not run (each rung
    runs what the ones below it run: they are `covered`); when it fails, the rungs below climb as usual to find
    the smallest that fails. Results are always in ladder order."""
    if repeats < 1 or jobs < 1:
        raise ValueError(f"repeats={repeats!r} and jobs={jobs!r} must both be >= 1")
    if not rungs:
        raise ValueError("the ladder has no rung; give --rung NAME=COMMAND or a command after '--'")
    say = progress or (lambda m: print(f"[gpulab ladder] {m}", file=sys.stderr, flush=True))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    done: dict[str, RungResult] = {}
    lock = threading.Lock()
    top = rungs[-1]
    first_top = top_first and len(rungs) > 1

    def save(current: RungResult | None = None, interrupted: bool = False, covered: tuple[str, ...] = ()
             ) -> LadderResult:
        have = {**done, **({current.name: current} if current is not None else {})}
        lr = LadderResult(tuple(have[r.name] for r in rungs if r.name in have), repeats, stall_s, interrupted,
                          watch.resolve_fault(fault), mode, timeout_s, tuple(fixes), jobs, covered)
        with lock:
            for path in (out / f"{name}.json", *([Path(json_copy)] if json_copy else [])):
                report.write_json(path, lr.to_dict())
            report.write_rows(out, f"{name}_table", table_rows(lr))
        if on_save is not None:
            on_save(lr)
        return lr

    for rung in ([top, *rungs[:-1]] if first_top else rungs):
        if first_top and rung is not top and not done[top.name].failed:
            below = tuple(r.name for r in rungs[:-1])
            say(f"{', '.join(below)}: not run: the {top.name} rung passed every trial, and it runs what "
                f"{'each of them runs' if len(below) > 1 else below[0] + ' runs'}")
            return save(covered=below)
        known = (given or {}).get(rung.name)
        say(f"{rung.name}: {repeats} trial(s), {min(jobs, repeats)} at a time: {' '.join(rung.command)}"
            + (f" (the first is 02's recorded run: {known.outcome})" if known else ""))
        t0 = time.monotonic()
        trials: list[Trial] = []

        def on_trial(t: Trial, rung: Rung = rung, t0: float = t0) -> None:
            trials.append(t)
            say(f"  {t.rung} #{t.index}: {t.outcome} in {t.seconds:.1f} s")
            save(summarize(rung, trials, time.monotonic() - t0))   # so far: nothing lost

        try:
            if known:
                on_trial(known)
            _trials(rung, range(1 if known else 0, repeats), jobs, out, stall_s=stall_s, timeout_s=timeout_s,
                    mode=mode, fault=fault, record=record, fixes=fixes, env=env, stacks=stacks, on_trial=on_trial)
            trials.sort(key=lambda t: t.index)
        except proc.Interrupted:
            save(summarize(rung, trials, time.monotonic() - t0, interrupted=True), interrupted=True)
            raise
        rr = summarize(rung, trials, time.monotonic() - t0)
        done[rung.name] = rr
        say(f"{rung.name}: {rr.trials - rr.counts['pass']} of {rr.trials} failed "
            f"(rate {rr.fail_rate:.0%}, 95% interval {interval_text(*rr.fail_rate_ci)})"
            + ("; the rungs below climb to the smallest that fails" if first_top and rung is top and rr.failed else ""))
        save()
        if stop_at_first_failure and rr.failed and not (first_top and rung is top):
            break
    return save()


def _trials(rung: Rung, indexes: range, jobs: int, out: Path, *, on_trial: Callable[[Trial], None],
            **kw: Any) -> list[Trial]:
    done: list[Trial] = []
    if jobs == 1:
        for i in indexes:
            done.append(run_trial(rung, i, out, **kw))
            on_trial(done[-1])
        return done
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix=f"trial-{rung.name}") as pool:
        pending: set[Future] = {pool.submit(run_trial, rung, i, out, **kw) for i in indexes}
        try:
            while pending:
                finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                for f in finished:
                    done.append(f.result())
                    on_trial(done[-1])
        except BaseException:
            for f in pending:
                f.cancel()
            proc.stop_all()
            raise
    return sorted(done, key=lambda t: t.index)


def table_rows(lr: LadderResult) -> list[dict]:
    """One row per rung, for the notebook, the CSV and the bundle; a rung the top rung covered says so."""
    top = lr.rungs[-1].name if lr.rungs else "top"
    rows = [{"rung": name, "trials": 0, **{o: 0 for o in OUTCOMES}, "fail rate": None, "95% interval": "-",
             "first failure": f"not run: the {top} rung, which runs it, passed every trial",
             "memory growth": "-", "seconds": 0.0} for name in lr.covered]
    for r in lr.rungs:
        ff = r.first_failure or {}
        op = (ff.get("in_flight_op") or {}).get("name")
        where = (f"in {op}" if op else f"exit code {ff.get('exit_code')}" if ff.get("status") == "error" else
                 f"signal {ff.get('signal')}" if ff.get("status") == "crash" else f"phase {ff.get('phase')}")
        rows.append({"rung": r.name, "trials": r.trials, **{o: r.counts.get(o, 0) for o in OUTCOMES},
                     "fail rate": round(r.fail_rate, 3), "95% interval": interval_text(*r.fail_rate_ci),
                     "first failure": f"{ff.get('status')} ({ff.get('class')}) {where}" if ff else "-",
                     "memory growth": growth_text(r.memory_growth) or "-",
                     "seconds": r.seconds})
    return rows
