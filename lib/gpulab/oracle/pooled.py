"""Every (case, candidate) as a job on warm workers (gpulab.pool), each job with a deadline: check_many's
results, while a kernel that hangs or faults (and poisons the CUDA context) costs only its own report and
its worker, which a fresh one replaces.

Notebook 05's gate spends its time CPU-side, one job after another (Python, and cuDNN building an execution
plan for each new shape), so W workers run side by side, each driven by a thread of this process with a Pool
of its own. The unit of work is a case: every candidate of a case runs on the same worker, one after
another, so the case's inputs and gold are made once there (`_WORKER`), as check_many shares them. Threads
take cases in case order and the results are put back in case order, so the reports are those of one worker.

This module imports gpulab.oracle.check; check imports it only when used (gate), and re-exports isolated,
check_isolated and judge_job for the callers that name them there.
"""
from __future__ import annotations

import os
import queue
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Sequence

from gpulab.device import oracle_threads, oracle_workers, resolve
from gpulab.oracle.cases import Case, case_set, make_inputs, resolve_dtypes
from gpulab.oracle.check import (CaseResult, OracleReport, _as_candidate, _judge, _keep_worst_tensors, _report,
                                 _validate_signature)
from gpulab.oracle.errors import OracleError
from gpulab.oracle.rule import gold_and_baselines
from gpulab.workloads import dtype_name

if TYPE_CHECKING:  # imported when used: the worker (`python -m gpulab.pool`) imports this module, and must
    # not import gpulab.pool a second time under its own name
    from gpulab.pool import Pool

JOB = "gpulab.oracle.pooled:judge_job"   # what a worker runs: the module that holds judge_job and _WORKER
INIT = ("gpulab.fixes:install_from_env",)
_WORKER: dict = {}   # in a warm worker (gpulab.pool): resolved candidates, the current case's gold


# ------------------------------------------------------------------------------------------ in the worker

def judge_job(spec: str, case: Case, dtype: str, device: str, tile: int, worst_k: int, budget: int
              ) -> tuple[str, CaseResult, int, float, float]:
    """One candidate on one case, in a warm worker: (candidate name, result, explain budget left, seconds
    judging, seconds making the inputs and gold). Gold is kept for the next candidate on the same case, as
    check_many shares it; a fresh worker (after a hang or crash) makes it again."""
    cands = _WORKER.setdefault("cands", {})
    if spec not in cands:
        c = _as_candidate(spec, device)
        _validate_signature(c)
        cands[spec] = c
    shared = 0.0
    if _WORKER.get("key") != (case, dtype, device):
        _WORKER.pop("gold", None)   # free the last case's tensors first
        t0 = time.perf_counter()
        dt = resolve_dtypes([dtype], device)[0]
        inputs = make_inputs(case, dt, device)
        _WORKER["gold"] = (dt, inputs, *gold_and_baselines(inputs, dt))
        _WORKER["key"] = (case, dtype, device)
        shared = time.perf_counter() - t0
    dt, inputs, gold, bases = _WORKER["gold"]
    left = [budget]
    t0 = time.perf_counter()
    res = _judge(cands[spec], case, dt, inputs, gold, bases, device, tile, worst_k, left)
    return cands[spec].name, res, left[0], time.perf_counter() - t0, shared


# ------------------------------------------------------------------------------------------ driving workers

class _Run:
    """What the driving threads share, each field read and written under `lock`: results by case index,
    errors (the first per candidate wins), walls, the explain budgets, the cases fully judged."""

    def __init__(self, specs: list[str], units: list[tuple[int, str, Case]], explain_budget: int,
                 keep_tensors: int, progress: bool, workers: int):
        self.lock = threading.Lock()
        self.stop = threading.Event()         # an interrupt or a failure elsewhere: take no further job
        self.todo: queue.SimpleQueue = queue.SimpleQueue()
        for u in units:
            self.todo.put(u)
        self.specs, self.total, self.workers = specs, len(units), workers
        self.keep, self.progress = keep_tensors, progress
        self.results: dict[str, dict[int, CaseResult]] = {s: {} for s in specs}
        self.walls = {s: 0.0 for s in specs}
        self.budgets = {s: explain_budget for s in specs}
        self.names = {s: s for s in specs}
        self.errors: dict[str, str] = {}
        self.shared = 0.0                      # seconds making inputs and gold, all workers together
        self.done = 0
        self.t_start, self.last_print = time.monotonic(), 0.0
        self.failure: BaseException | None = None

    def take(self, s: str) -> int | None:
        """The explain budget a job of `s` may spend (0 or 1: a job names at most one bug), reserved so that
        workers side by side never name more than explain_budget; None when `s` gets no further job."""
        with self.lock:
            if s in self.errors or self.stop.is_set():
                return None
            token = 1 if self.budgets[s] > 0 else 0
            self.budgets[s] -= token
            return token

    def record(self, s: str, i: int, token: int, out: Any) -> None:
        with self.lock:
            if not out.ok:
                self.budgets[s] += token
                self.walls[s] += out.seconds
                if s not in self.errors and not self.stop.is_set():
                    self.errors[s] = out.detail
                    print(f"oracle: {s}: {out.detail[:200]}; a fresh worker goes on", file=sys.stderr, flush=True)
                return
            self.names[s], res, left, judged_s, gold_s = out.value
            self.budgets[s] += left   # what the job did not spend goes back
            self.shared += gold_s
            self.walls[s] += judged_s
            self.results[s][i] = res
            if res.tensors is not None:
                _keep_worst_tensors(self.results[s], self.keep)

    def case_done(self) -> None:
        with self.lock:
            self.done += 1
            now = time.monotonic() - self.t_start
            if self.progress and (now - self.last_print > 5 or self.done == self.total):
                self.last_print = now
                on = f" on {self.workers} workers" if self.workers > 1 else ""
                print(f"oracle: {self.done}/{self.total} cases ({now:.0f}s{on}) {', '.join(self.specs)[:60]}",
                      file=sys.stderr, flush=True)


def _drive(run: _Run, pool: Pool, dev: str, tile: int, worst_k: int, timeout_s: float) -> None:
    """One worker's loop: take the next case, run every candidate still standing on it, one job each."""
    while not run.stop.is_set():
        try:
            i, dt, case = run.todo.get_nowait()
        except queue.Empty:
            return
        for s in run.specs:
            token = run.take(s)
            if token is None:
                continue
            out = pool.run(JOB, (s, case, dt, dev, tile, worst_k, token), timeout_s=timeout_s)
            run.record(s, i, token, out)
        if not run.stop.is_set():
            run.case_done()


def _end_worker(pool: Pool) -> None:
    """Stop a pool's live worker from another thread: its driver's job returns at once (as a crash)."""
    w = pool.worker
    if w is not None and w.alive:
        w.child.stop()


def _side_by_side(run: _Run, pools: list[Pool], *args: Any) -> None:
    """One driving thread per pool while this thread waits, interruptibly. On an interrupt here, or an
    exception in a thread, the live workers are stopped so that every thread's job returns and it ends."""
    def body(pool: Pool) -> None:
        try:
            _drive(run, pool, *args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            with run.lock:
                run.failure = run.failure or exc
            run.stop.set()
            for p in pools:
                if p is not pool:
                    _end_worker(p)

    threads = [threading.Thread(target=body, args=(p,), name=f"oracle-worker-{n}", daemon=True)
               for n, p in enumerate(pools)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.5)
    finally:
        run.stop.set()
        deadline = time.monotonic() + 30
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            for p in pools:       # again each round: a thread may have been starting a worker
                _end_worker(p)
            for t in threads:
                t.join(0.2)
    if run.failure is not None:
        raise run.failure


def _reports(run: _Run, dev: str, tile: int) -> dict[str, OracleReport]:
    reports = {}
    for s in run.specs:
        if s in run.errors:
            reports[s] = OracleReport(s, dev, tile, (), wall_s=run.walls[s], error=run.errors[s])
            continue
        name = run.names[s]
        reports[name] = _report(name, dev, tile, [r for _, r in sorted(run.results[s].items())],
                                run.walls[s] + run.shared / max(1, len(run.specs)))
    return reports


def _worker_env(dev: str, workers: int) -> dict[str, str] | None:
    """CPU workers side by side share the cores: each gets its share as torch threads, unless the user set
    OMP_NUM_THREADS (then theirs stands). A GPU's workers keep torch's default."""
    if workers < 2 or dev.startswith("cuda") or "OMP_NUM_THREADS" in os.environ:
        return None
    return {**os.environ, "OMP_NUM_THREADS": str(oracle_threads(workers))}


# ------------------------------------------------------------------------------------------ the calls

def isolated(specs: Sequence[str], cases: str | Sequence[Case] = "default", device: str | None = None,
             dtypes: Any = None, *, tile: int = 64, worst_k: int = 8, timeout_s: float = 900.0,
             explain_budget: int = 12, keep_tensors: int = 3, progress: bool = True,
             pool: Pool | None = None, workers: int = 0) -> dict[str, OracleReport]:
    """check_many() of `specs`, every (case, candidate) a job on warm workers (gpulab.pool) with a deadline
    of timeout_s: results as check_many's. A candidate whose job hangs, crashes or raises gets a report
    carrying the error (and no results; side by side, the first error to arrive) and no further job; its
    worker is stopped, and the next job there starts a fresh one, so the other candidates are still judged.

    `workers`: how many run side by side, each taking whole cases; 0 picks gpulab.device.oracle_workers (up
    to 3 on a GPU; on the CPU one per core, up to 4). The pass/fail results do not depend on it. The explain
    budget (how many failures get their bug named: alternative golds cost fp64 attentions) stays one per
    candidate, shared, so with several workers which failures get the bug named can differ from one worker's
    run; never more.
    wall_s adds up each job's seconds, whichever worker ran it. `pool`: a caller's own, reused and not closed;
    with it one worker runs (workers is ignored)."""
    from gpulab.pool import Pool

    dev = resolve("auto" if device is None else device)
    dts = [dtype_name(d) for d in resolve_dtypes(dtypes, dev)]
    cases_l = case_set(cases)
    if not isinstance(tile, int) or tile < 1:
        raise OracleError(f"tile={tile!r} must be a positive integer")
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
        raise OracleError(f"workers={workers!r} must be a whole number >= 0 (0: as many as the device suits)")
    units = [(i, dt, case) for i, (dt, case) in enumerate((dt, c) for dt in dts for c in cases_l)]
    w = 1 if pool is not None else max(1, min(workers or oracle_workers(dev, len(units)), len(units)))
    run = _Run(list(dict.fromkeys(specs)), units, explain_budget, keep_tensors, progress, w)
    pools = [] if pool is None else [pool]
    try:
        while len(pools) < w:
            pools.append(Pool(init=INIT, label="oracle", env=_worker_env(dev, w)))
        if w == 1:
            _drive(run, pools[0], dev, tile, worst_k, timeout_s)
        else:
            _side_by_side(run, pools, dev, tile, worst_k, timeout_s)
    finally:
        if pool is None:
            for p in pools:
                p.close()
    return _reports(run, dev, tile)


def check_isolated(spec: str, cases: str | Sequence[Case] = "default", device: str | None = None,
                   dtypes: Any = None, *, tile: int = 64, worst_k: int = 8, timeout_s: float = 900.0,
                   workers: int = 0) -> OracleReport:
    """check() in warm worker children with a deadline per case: a kernel that hangs or faults (and poisons
    the CUDA context) cannot take the notebook down. `spec` is a registry name or 'module:function'
    (something a fresh process can resolve)."""
    return next(iter(isolated([spec], cases, device, dtypes, tile=tile, worst_k=worst_k, timeout_s=timeout_s,
                              workers=workers).values()))
