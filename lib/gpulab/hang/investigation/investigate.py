"""Notebook 03's investigation of the configured workload: climb the ladder, and when a rung fails, take
the first failure's verdict, shrink the configuration, replay the ops, and bundle the evidence. Each step
is one call, so the notebook (and a script) reads as the steps a person would take.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

from gpulab import device, lastwords, report, trace, workloads
from gpulab.hang.investigation import bisect, bundle, firstrun, ladder, repro
from gpulab.hang import classify, faults
from gpulab.hang.verdict import Verdict, job_where, op_brief


def rungs(cfg: workloads.WorkloadConfig) -> list[ladder.Rung]:
    """The built-in workload climbs sdpa -> ... -> its configured rung; a user workload is one rung: itself."""
    if cfg.kind == "builtin":
        return ladder.builtin_rungs(cfg)
    return [ladder.Rung(cfg.kind, tuple(workloads.command(cfg)))]


LIGHT_BYTES = 256 << 20  # a trial's rough activation bound under which trials share one GPU 4 at a time


def light(cfg: workloads.WorkloadConfig, out_dir: str | Path | None = None) -> bool:
    """The built-in workload at sizes whose attention scores and activations stay well under a GPU's memory
    (the default needs ~12 MB): all of a rung's trials can run side by side. A user program's needs are known
    only from 02's run of it, when that run ended well (a failure stops short of the peak): light when its GPU
    memory, as the caching allocator reserved it, stayed under the same bound."""
    if cfg.kind != "builtin":
        peak = recorded_gpu_peak(out_dir) if out_dir is not None else None
        return peak is not None and peak < LIGHT_BYTES
    s = cfg.text_tokens + cfg.image_tokens
    return cfg.batch * cfg.layers * s * (3 * cfg.heads * s + 64 * cfg.heads * cfg.head_dim) * 4 < LIGHT_BYTES


def recorded_gpu_peak(out_dir: str | Path) -> int | None:
    """The most GPU memory 02's recorded run reserved, in bytes; None when that run did not end well, used no
    GPU or left no readable op log."""
    out = Path(out_dir)
    v = report.read_json(out / firstrun.FOLDER / "verdict.json", default=None)
    if not isinstance(v, dict) or v.get("status") != "ok" or not (out / "ops.log").is_file():
        return None
    try:
        snap = trace.read(out / "ops.log")
    except (OSError, ValueError):
        return None
    reserved = [m.reserved for m in snap.memory if m.reserved is not None]
    return max(reserved) if reserved else None


def climb(cfg: workloads.WorkloadConfig, out_dir: str | Path, *, repeats: int, jobs: int, stall_s: float,
          timeout_s: float, mode: str, fault: str | None, progress: Callable[[str], None] | None = None
          ) -> ladder.LadderResult:
    """The ladder, 02's recorded run counting as the first trial of its rung when it ran that very trial
    (gpulab.hang.investigation.firstrun.as_trial). When that run passed, the top rung's other trials come first:
    if none fails, the rungs below (parts of it) are not run, which halves a healthy workload's 03."""
    todo, lad_dir = rungs(cfg), Path(out_dir) / "ladder"
    given = {r.name: t for r in todo
             if (t := firstrun.as_trial(out_dir, r, mode=mode, fault=fault, stall_s=stall_s, ladder_dir=lad_dir))}
    top_passed = bool(todo) and getattr(given.get(todo[-1].name), "outcome", None) == "pass"
    return ladder.run(todo, repeats=repeats, jobs=device.trial_jobs(jobs, cfg.device, light(cfg, out_dir)),
                      stall_s=stall_s, timeout_s=timeout_s, out_dir=lad_dir, mode=mode, fault=fault,
                      stop_at_first_failure=True, progress=progress, given=given, top_first=top_passed)


def first_failure(lad: ladder.LadderResult, out_dir: str | Path) -> Verdict | None:
    """The full verdict (stacks included) of the first failing trial, read back from its folder."""
    rung = next((r for r in lad.rungs if r.failed), None)
    if rung is None or not rung.first_failure:
        return None
    data = report.read_json(Path(out_dir) / "ladder" / rung.first_failure["folder"] / "verdict.json")
    return Verdict.from_dict(data) if data else None


def shrink(cfg: workloads.WorkloadConfig, lad: ladder.LadderResult, dims: Sequence[str], out_dir: str | Path, *,
           repeats: int, jobs: int, stall_s: float, timeout_s: float, mode: str, fault: str | None,
           progress: Callable[[str], None] | None = None) -> tuple[bisect.BisectResult | None, str]:
    """Bisect the built-in workload's dimensions at the first failing rung -> (result or None, why)."""
    failing = lad.first_failing_rung
    if failing is None:
        return None, "nothing to bisect: no rung failed"
    if cfg.kind != "builtin":
        return None, ("the workload is a user program: to shrink it, give its sizes as {NAME} placeholders to "
                      "gpulab bisect (see gpulab bisect --help)")
    dims = [d for d in dims if getattr(cfg, d, 1) > bisect.SHRINKABLE.get(d, 1)]
    if not dims:
        return None, "every dimension to shrink is already at its smallest value"
    template, ints = bisect.builtin_space(replace(cfg, rung=failing), dims)
    try:
        res = bisect.run(template, ints, out_dir=Path(out_dir) / "bisect", repeats=repeats,
                         jobs=device.trial_jobs(jobs, cfg.device, light(cfg)),
                         stall_s=stall_s, timeout_s=timeout_s, mode=mode, fault=fault, progress=progress)
    except bisect.NothingToBisect as exc:  # an intermittent failure that did not show again
        return None, str(exc)
    return res, (f"{len(res.probes)} probes from " + ", ".join(f"{d.name}={d.failing}" for d in ints)
                 + " to " + ", ".join(f"{k}={v}" for k, v in res.minimal.items()))


def replay(v: Verdict | None, out_dir: str | Path, *, stall_s: float, timeout_s: float,
           progress: Callable[[str], None] | None = None) -> repro.ReproResult | None:
    """Op replay of the first failure from its op log (None when nothing failed)."""
    if v is None:
        return None
    if v.drill:  # the fault lives in gpulab's bootstrap, not in the ops: no replay of them can reproduce it
        return repro.ReproResult(None, (), {"status": v.status}, f"a self-test: the planted {v.planted} is put "
                                 "there by gpulab's bootstrap, so no replay of the ops alone reproduces it")
    folder = Path(v.log.get("dir", ""))
    log = folder / v.log["op_log"] if v.log.get("op_log") else None
    records = trace.read(log).records if log and log.exists() else ()
    return repro.make(v, records, Path(out_dir) / "repro", stall_s=stall_s, timeout_s=timeout_s, progress=progress)


def replay_early(cfg: workloads.WorkloadConfig, out_dir: str | Path, *, mode: str, fault: str | None,
                 stall_s: float, timeout_s: float, progress: Callable[[str], None] | None = None
                 ) -> Future | None:
    """The op replay of 02's failing run, started now, beside the ladder's other trials (a Future of `replay`'s
    result), when that run is trial 0 of the ladder's first rung: the ladder's first failure is then known
    before it climbs, and each replay candidate costs a stall window that need not follow the ladder's. None
    when 02's run is not that trial or did not fail."""
    first_rung = rungs(cfg)[0]
    lad_dir = Path(out_dir) / "ladder"
    t = firstrun.as_trial(out_dir, first_rung, mode=mode, fault=fault, stall_s=stall_s, ladder_dir=lad_dir)
    if t is None or t.outcome == "pass":
        return None
    v = Verdict.from_dict(report.read_json(Path(out_dir) / firstrun.FOLDER / "verdict.json"))
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="03-replay")
    try:
        return pool.submit(replay, v, out_dir, stall_s=stall_s, timeout_s=timeout_s, progress=progress)
    finally:
        pool.shutdown(wait=False)   # the thread ends with its replay


def write_bundle(out_dir: str | Path, v: Verdict | None, bis: bisect.BisectResult | None,
                 rep: repro.ReproResult | None) -> Path | None:
    """bundle.zip and issue.md for an upstream report (only when something failed)."""
    if v is None:
        return None
    out = Path(out_dir)
    return bundle.write(out, verdict_dir=v.log.get("dir"), ladder_dir=out / "ladder",
                        bisect_dir=out / "bisect" if bis else None, repro_dir=out / "repro" if rep else None,
                        env_json=out / "env.json")


def _what(v: Verdict | None) -> str:
    """What failed, in words: the op for a hang in an op, else how the process ended and its last words."""
    if v is None:
        return "a failure"
    if v.culprit or v.divergence:   # a job: the process and the collective
        return f"{v.status} ({v.cls}) {job_where(v)}"
    if v.in_flight_op:
        return f"{v.status} ({v.cls}) in {op_brief(v.in_flight_op)}"
    last = lastwords.of(v.stderr_tail)
    said = f" (on stderr: {classify.brief(last, 160)})" if last else ""
    if v.status == "error":
        named = f" ({v.cls})" if v.cls and v.cls != "unknown" else ""
        return f"the program exits with code {v.exit_code}{named} in phase {v.phase}{said}"
    if v.status == "crash":
        return f"the program is killed by {v.signal} in phase {v.phase}{said}"
    return f"{v.status} ({v.cls}) in phase {v.phase}"


def finding(cfg: workloads.WorkloadConfig, lad: ladder.LadderResult, v: Verdict | None,
            bis: bisect.BisectResult | None, rep: repro.ReproResult | None) -> tuple[str, dict[str, Any]]:
    """Notebook 03's headline and metrics: only what was observed on this workload (a drill says so)."""
    top = lad.rungs[-1] if lad.rungs else None
    failing = next((r for r in lad.rungs if r.failed), None)
    drill, test = "", None
    if lad.drill:
        test = faults.self_test(lad.drill, v.status if v else "ok", (v.in_flight_op or {}).get("name") if v else None)
        drill = f"self-test of the watchdog {'passed' if test[0] else 'FAILED'} ({test[1]}): "
    if failing is None:
        n = len(lad.covered)
        within = f", which also runs what the rung{'s' if n > 1 else ''} below it ({', '.join(lad.covered)}) run" \
                 f"{'' if n > 1 else 's'}"
        headline = (f"{drill}no hang in {sum(r.trials for r in lad.rungs)} runs "
                    + (f"of the {top.name} rung{within}" if lad.covered else f"up to the {top.name} rung")
                    + f" (stall window {lad.stall_s:g} s; the {top.name} rung ran {top.ops_completed} ops in "
                      f"{top.median_s:.1f} s)" if top else "nothing ran")
    else:
        k = failing.trials - failing.counts["pass"]
        ci = ladder.interval_text(*failing.fail_rate_ci)
        headline = (f"{drill}{_what(v)} on the "
                    f"{failing.name} rung, {k} of {failing.trials} runs (95% interval {ci})"
                    + (f"; smallest failing config {', '.join(f'{a}={b}' for a, b in bis.minimal.items())}" if bis else "")
                    + ("; a verified repro.py" if rep and rep.verified else "")
                    + (f"; whose code: {v.owner['kind']}, {v.owner['where']}" if v and (v.owner or {}).get("where")
                       and v.owner.get("kind") != "unknown" else ""))
    metrics = {
        "status": v.status if v else "ok", "class": v.cls if v else None,
        "in_program": classify.program_cause(v.cls, v.culprit, v.processes, v.owner) if v else None,
        "owner": v.owner if v else None,
        "in_flight_op": (v.in_flight_op or {}).get("name") if v else None,
        "call_site": (v.in_flight_op or {}).get("call_site") if v else None,
        "host_blocked_in": (v.host_blocked_in or {}).get("name") if v and v.host_blocked_in else None,
        "first_failing_rung": lad.first_failing_rung, "drill": bool(lad.drill), "planted": lad.drill,
        "self_test": None if test is None else ("passed" if test[0] else "failed"),
        "rungs": {r.name: {"trials": r.trials, "failed": r.trials - r.counts["pass"],
                           "fail_rate_ci": list(r.fail_rate_ci),
                           "leak": bool((r.memory_growth or {}).get("leak"))} for r in lad.rungs},
        "runs": sum(r.trials for r in lad.rungs), "stall_s": lad.stall_s, "covered": list(lad.covered),
        "minimal": bis.minimal if bis else None, "probes": len(bis.probes) if bis else 0,
        "repro_verified": bool(rep and rep.verified), "workload": cfg.kind, "rung": cfg.rung,
        "suggested": [s["fix"] for s in v.suggested] if v else [], "jobs": lad.jobs,
    }
    return headline, metrics
