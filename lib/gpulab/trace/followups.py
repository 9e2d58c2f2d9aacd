"""02's two further runs of the workload: the profiler's GPU times (gpulab.trace.profile) and the stats-mode
NaN/Inf recording (gpulab.trace.run). They are independent children that only count and check, so side by side
they cost the longer of the two, not the sum (each pays interpreter, torch and device start-up). For the
built-in workload they start beside the first recording (`with_first`), and the one its outcome makes useless
is stopped (a hang's stats run would only hang again); a user's program is never run twice at once (its files,
its ports), so for it they start once the first recording is in. The recording-cost measurement is not one of
them: it times, so it runs in notebook 06, where nothing runs beside it, and only on the built-in workload
(`recorder_cost`); 02 itself times nothing, so it runs beside the notebooks that do not time either."""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class FollowUps:
    """The runs in flight; each accessor waits for its own run (its exception, if any, is raised there)."""

    _gpu: Future
    _stats: Future

    def gpu_times(self) -> tuple[Any, str]:
        """gpulab.trace.profile.gpu_times's (table or None, sentence)."""
        return self._gpu.result()

    def stats(self) -> tuple[Any, str]:
        """gpulab.trace.run.stats_recording's (Recording or None, sentence)."""
        return self._stats.result()

    def wait(self) -> None:
        """Both done (02's finding reads both; nothing of theirs is left running after 02)."""
        for f in (self._gpu, self._stats):
            f.exception()


def start(first: Any, cfg: Any, out_dir: str | Path, *, timeout_s: float = 300.0,
          stall_s: float | None = None) -> FollowUps:
    """Start both runs after 02's first Recording `first` (each decides from it whether to run at all)."""
    from gpulab.trace import profile, run

    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="02-followup")
    try:
        gpu = pool.submit(profile.gpu_times, cfg, out_dir, stall_s=stall_s, first=first)
        stats = pool.submit(run.stats_recording, first, cfg, out_dir=out_dir, timeout_s=timeout_s, stall_s=stall_s)
    finally:
        pool.shutdown(wait=False)   # the threads end with their runs
    return FollowUps(gpu, stats)


def with_first(record_first: Callable[[], Any], cfg: Any, out_dir: str | Path, *, timeout_s: float = 300.0,
               stall_s: float | None = None) -> tuple[Any, FollowUps]:
    """02's first recording (`record_first()`, in this thread) and both further runs -> (Recording, FollowUps).
    For the built-in workload the further runs start first, beside it; once it is in, each that it makes useless
    (profile.not_measured, run.stats_not_checked) is stopped and says why, as `start` would have. For anything
    else `start` runs them after it. Nothing is left running when record_first raises."""
    from gpulab.trace import profile, run

    if not _builtin(cfg):
        first = record_first()
        return first, start(first, cfg, out_dir, timeout_s=timeout_s, stall_s=stall_s)
    told: Future = Future()   # the first Recording, or None when record_first raised
    stop_gpu, stop_stats = threading.Event(), threading.Event()

    def gpu():
        ran = profile.gpu_times(cfg, out_dir, stall_s=stall_s, cancel=stop_gpu)
        first = told.result()
        why = profile.not_measured(cfg, first) if first is not None else "not measured"
        if why:
            _discard(out_dir, "gpu_times")
        return (None, why) if why else ran

    def stats():
        ran = run.record(cfg, mode="stats", out_dir=out_dir, timeout_s=timeout_s, name="stats", stall_s=stall_s,
                         cancel=stop_stats)
        first = told.result()
        if first is None or run.stats_not_checked(first):
            _discard(out_dir, "stats")
        return run.stats_recording(first, cfg, out_dir=out_dir, ran=ran) if first is not None else (None, "")

    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="02-followup")
    try:
        futures = FollowUps(pool.submit(gpu), pool.submit(stats))
    finally:
        pool.shutdown(wait=False)
    try:
        first = record_first()
    except BaseException:
        stop_gpu.set()
        stop_stats.set()
        told.set_result(None)
        futures.wait()
        raise
    if profile.not_measured(cfg, first):
        stop_gpu.set()
    if run.stats_not_checked(first):
        stop_stats.set()
    told.set_result(first)
    return first, futures


def _builtin(cfg: Any) -> bool:
    """gpulab's own workload: known to be safe to run twice at once, and the one whose recorder cost is timed."""
    from gpulab.workloads import WorkloadConfig

    return isinstance(cfg, WorkloadConfig) and cfg.kind == "builtin"


def _discard(out_dir: str | Path, stem: str) -> None:
    """A run started ahead whose result is not used leaves nothing behind that a reader could take for one."""
    import shutil

    for p in Path(out_dir).glob(f"{stem}.*"):
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


NOT_TIMED = ("**Recording cost not measured:** for a user program, one recorded run has no unrecorded twin to "
             "compare with, and timing the recorder would mean running the program again and again (minutes for "
             "a short script); `benchmarks/bench_trace_overhead.py` and `gpulab.trace.userbench` measure it on "
             "the built-in workload and on a script, as users run them.")


def cost_words(cfg: Any, captured: bool = False) -> str:
    """What 02's headline says of the recorder's cost: where it is timed (the built-in workload's, in 06), or
    that it is not measured (a user program, or what a watch caught)."""
    return ("the recorder's cost is timed in 06, where nothing runs beside it" if _builtin(cfg) and not captured
            else "recording cost not measured")


def _not_timed(cfg: Any, out_dir: str | Path) -> str:
    """Why the recorder's cost is not timed for this workload ("" where it is): a user program (NOT_TIMED), or
    02's run of the workload did not finish (its wall time measures nothing, a rerun would only fail again)."""
    from gpulab import report
    from gpulab.trace import run

    if not _builtin(cfg):
        return NOT_TIMED
    status = report.metrics_of(out_dir, "02_instrument").get("status")
    return "" if status in (None, "ok") else run.unfinished_cost(status, "02's run of the workload")


def recorder_plan(cfg: Any, out_dir: str | Path, *, mode: str, repeats: int) -> dict | None:
    """What 06's benchmark worker times of the recorder once its own timing is done, in the same process (one
    process start and torch import fewer than a child of its own: about 5 s on the H100 machine): {"modes",
    "repeats", "json"}; None where recorder_cost would time nothing (a user program, 02's run unfinished)."""
    from gpulab.trace import native, run

    if _not_timed(cfg, out_dir):
        return None
    native.ensure_all()   # built by a launcher, never by the process that records (gpulab.trace.native)
    return {"modes": list(run.modes_for(cfg, mode)), "repeats": int(repeats),
            "json": str(Path(out_dir) / run.OVERHEAD_RAW)}


def recorder_cost(cfg: Any, out_dir: str | Path, *, mode: str, repeats: int, stall_s: float | None = None,
                  timed: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """Notebook 06's table of what recording costs the built-in workload (02's recording mode against none and a
    bare dispatch) -> (DataFrame or None, a sentence why not), saved as overhead.csv and .json. 06 runs with
    nothing beside it, 02 beside the notebooks that time nothing: the cost is timed where timing is trusted. Not
    timed when 02's run of the workload did not finish (its wall time measures nothing, a rerun would only fail
    again) or for a user program (NOT_TIMED says why). timed: what the benchmark worker said of the timing
    recorder_plan asked of it (its "status", and "why" where it could not); its figures are read, not timed
    again; where it could not time them in its process, a child of their own does."""
    from gpulab.trace import analysis, run

    why = _not_timed(cfg, out_dir)
    if why:
        return None, why
    if timed and timed.get("status") == "ok":
        ov, note = run.overhead_from(timed["json"]), ""
    elif timed and timed.get("status") in ("hang", "crash", "error"):
        return None, (f"**Recording cost not measured:** its timing in the benchmark worker ended as "
                      f"{timed['status']} ({timed.get('why') or 'see benchmark.log'}).")
    else:
        ov, note = run.timed_overhead(cfg, mode=mode, repeats=repeats, out_dir=out_dir, stall_s=stall_s)
    analysis.save_overhead(ov, out_dir)
    return ov, note
