"""A chain run's live state, shared by its scenario threads: the results so far, the notebook each scenario is
running and how far it got, and what run.json and the index say at every moment (a verdict only once every
notebook of a scenario has run; until then "running", with the notebook and cell)."""
from __future__ import annotations

import contextlib
import datetime as _dt
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from gpulab import report
from gpulab.chain import index, notebook, verdict
from gpulab.chain.autodevice import AutoDevice

if TYPE_CHECKING:
    from gpulab.chain.runner import RunConfig

# not_applicable: the scenario's fix cannot apply on this device, so its notebooks are not run (not a failure)
NOTEBOOK_STATUSES = ("ok", "failed", "killed", "skipped", "interrupted", "not_run", verdict.NOT_APPLICABLE)
RUN_STATUSES = ("running", "ok", "failed", "interrupted")
PROGRESS_POLL_S = 1.0   # how often the index follows a running notebook's cells


@dataclass(frozen=True)
class NotebookResult:
    name: str
    status: str  # one of NOTEBOOK_STATUSES
    duration_s: float | None = None
    headline: str | None = None
    error: str | None = None
    ipynb: str | None = None  # paths relative to the run folder
    report: str | None = None
    full: str | None = None
    cells_s: float | None = None  # time spent inside cells (papermill's per-cell durations)
    render_s: float | None = None


@dataclass(frozen=True)
class ScenarioResult:
    name: str
    description: str
    params: dict[str, Any]
    notebooks: tuple[NotebookResult, ...] = field(default_factory=tuple)
    changed: dict[str, Any] = field(default_factory=dict)   # parameters that differ from the notebooks' defaults
    fixes: tuple[str, ...] = ()   # registry fixes applied to every child of the scenario's notebooks


PRODUCT_SUFFIXES = (".json", ".csv", ".zip", ".md", ".py", ".sh", ".png", ".txt", ".log")
PRODUCT_SKIP = ("logs", "progress.log", "params.yaml")


def products(sc_dir: Path, run_dir: Path, limit: int = 60) -> list[str]:
    """The files a scenario produced (two levels deep; trial folders and logs left out), relative to the run."""
    found = []
    for p in sorted(sc_dir.glob("*")) + sorted(sc_dir.glob("*/*")):
        inner = p.relative_to(sc_dir)
        if p.is_file() and p.suffix in PRODUCT_SUFFIXES and inner.parts[0] not in PRODUCT_SKIP:
            found.append(str(p.relative_to(run_dir)))
    return found[:limit]


def visible_gpus() -> tuple[str, ...]:
    """The GPU ids scenarios can be spread over: CUDA_VISIBLE_DEVICES, else the NVIDIA driver's list. Read
    without torch: the runner must not hold a CUDA context its notebooks' children compete with."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return tuple(g.strip() for g in listed.split(",") if g.strip())
    driver = Path("/proc/driver/nvidia/gpus")
    return tuple(str(i) for i in range(len(list(driver.iterdir())))) if driver.is_dir() else ()


def rel(path: Path | None, base: Path) -> str | None:
    return None if path is None else os.path.relpath(path, base)


class RunState:
    """The state of one run, shared by the scenario threads; every change rewrites run.json and the index."""

    def __init__(self, cfg: RunConfig, run_dir: Path, notebooks: list[Path],
                 resolved: dict[str, ScenarioResult], say: Callable[[str], None]):
        self.cfg, self.run_dir, self.notebooks = cfg, run_dir, notebooks
        said = threading.Lock()

        def say_whole(msg: str) -> None:   # one line at a time from the threads of notebooks side by side
            with said:
                say(msg)
        self.say = say_whole
        self.started = time.time()
        self.lock = threading.RLock()
        self.stopping = threading.Event()
        self.status = "running"
        self.note: str | None = None
        self.results = dict(resolved)   # in cfg.scenarios order
        parallel = cfg.jobs > 1 and len(cfg.scenarios) > 1
        self.gpu_load = {g: 0 for g in visible_gpus()} if parallel else {}   # GPU id -> scenarios on it
        # scenarios that share a machine (no GPU of their own) time each other's load in 06
        self.shared_jobs = cfg.jobs if parallel and len(self.gpu_load) < cfg.jobs else 1
        self.gpu_of: dict[str, str] = {}
        # scenario -> {notebook: (its .ipynb, start)}: those running now (several where they run side by side)
        self.current: dict[str, dict[str, tuple[Path, float]]] = {}
        self._order = {p.stem: i for i, p in enumerate(notebooks)}
        self.auto = AutoDevice()   # device=auto's answer per scenario environment, for the later kernels

    def take_gpu(self, scen: str) -> None:
        """With several GPUs, a scenario running beside others gets the least busy one to itself."""
        with self.lock:
            if len(self.gpu_load) > 1:
                gpu = min(self.gpu_load, key=lambda g: (self.gpu_load[g], g))
                self.gpu_load[gpu] += 1
                self.gpu_of[scen] = gpu

    def give_gpu(self, scen: str) -> None:
        with self.lock:
            gpu = self.gpu_of.pop(scen, None)
            if gpu is not None:
                self.gpu_load[gpu] -= 1

    def begin(self, scen: str, name: str, ipynb: Path) -> None:
        """A notebook starts: the index says so at once (and follows its cells, `follow`)."""
        with self.lock:
            self.current.setdefault(scen, {})[name] = (ipynb, time.monotonic())
            self.write_index()

    def add(self, scen: str, *res: NotebookResult) -> None:
        with self.lock:
            r = self.results[scen]
            self.results[scen] = replace(r, notebooks=self._ordered(r.notebooks + res))
            for n in res:
                self.current.get(scen, {}).pop(n.name, None)
            self.write_index()

    def _rank(self, name: str) -> int:
        """A notebook's place in the chain: results and running rows are listed in it, whatever order they
        finished in (notebooks that ran side by side)."""
        return self._order.get(name, len(self._order))

    def _ordered(self, nbs: tuple[NotebookResult, ...]) -> tuple[NotebookResult, ...]:
        return tuple(sorted(nbs, key=lambda n: self._rank(n.name)))

    def running_all(self, scen: str) -> list[dict[str, Any]]:
        """The notebooks a scenario is running now and how far each got (papermill saves after every cell)."""
        out = []
        for name, (ipynb, t0) in sorted(self.current.get(scen, {}).items(), key=lambda kv: self._rank(kv[0])):
            done, total, _ = notebook.cells_done(ipynb)
            out.append({"notebook": name, "cells_done": done, "cells": total,
                        "seconds": round(time.monotonic() - t0, 1), "text": running_text(name, done, total)})
        return out

    def running(self, scen: str, now: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
        """What a scenario is running now, in one entry (several notebooks' texts joined), or None; `now`: its
        running_all, when the caller has read it already."""
        now = self.running_all(scen) if now is None else now
        if not now:
            return None
        if len(now) == 1:
            return now[0]
        return {"notebook": ", ".join(n["notebook"] for n in now), "cells_done": tuple(n["cells_done"] for n in now),
                "cells": tuple(n["cells"] for n in now), "seconds": max(n["seconds"] for n in now),
                "text": "; ".join(n["text"] for n in now) + " (side by side)"}

    def complete(self, s: ScenarioResult) -> bool:
        """Every notebook of the scenario has its result (or the run ended): only then is there a verdict."""
        return self.status != "running" or len(s.notebooks) >= len(self.notebooks)

    def scenario(self, s: ScenarioResult) -> dict[str, Any]:
        sc_dir = self.run_dir / s.name
        metrics = report.load_metrics(sc_dir)
        nbs = [asdict(n) for n in s.notebooks]
        v = verdict.judge(nbs, metrics, s.name, s.fixes) if nbs and self.complete(s) else None
        each = [] if v else self.running_all(s.name)   # each running .ipynb read once per index
        now = self.running(s.name, each)
        if now:
            nbs.extend(asdict(NotebookResult(n["notebook"], "running", n["seconds"], n["text"])) for n in each)
            nbs.sort(key=lambda n: self._rank(n["name"]))
        waiting = (f"{len(self.notebooks) - len(s.notebooks)} of {len(self.notebooks)} notebooks still to finish"
                   if not v else "")
        return {"name": s.name, "description": s.description, "params": s.params, "changed": s.changed,
                "fixes": list(s.fixes), "notebooks": nbs, "verdict": v.verdict if v else "running",
                "running": now,
                "evidence": v.evidence if v else (now["text"] if now else "waiting to start") + f" ({waiting})",
                "next_step": v.next_step if v else "wait: the verdict comes when every notebook has run",
                "metrics": metrics, "products": products(sc_dir, self.run_dir) if sc_dir.exists() else []}

    def summary(self) -> dict[str, Any]:
        scenarios = [self.scenario(s) for s in self.results.values()]
        env = next(((sc["metrics"].get("01_environment") or {}).get("metrics") for sc in scenarios
                    if sc["metrics"].get("01_environment")), None) or {}
        return {
            "run_id": self.run_dir.name,
            "status": self.status,
            "note": self.note,
            "started": _dt.datetime.fromtimestamp(self.started).isoformat(timespec="seconds"),
            "duration_s": time.time() - self.started,
            "command": " ".join(sys.argv[1:]),
            "platform": {k: env.get(k) for k in ("device_name", "device_kind", "torch_version", "cuda_version",
                                                 "sdpa_selected")} | {"risks": env.get("risk_ids") or []}
            if env else {},
            "scenarios": scenarios,
            "progress": "; ".join(f"{sc['name']}: {sc['running']['text']}" for sc in scenarios if sc["running"])
            or None,
            "shared_jobs": self.shared_jobs,
            "folder": report.folder_contents(self.run_dir).to_dict(),
        }

    def write_index(self, summary: dict[str, Any] | None = None, *, only_running: bool = False) -> Path | None:
        """run.json and index.html from the state now. only_running (the poller): nothing once the run
        has ended, so a poll can never overwrite the final page."""
        with self.lock:
            if only_running and self.status != "running":
                return None
            summary = self.summary() if summary is None else summary
            report.write_json(self.run_dir / "run.json", summary)
            return report.write_text(self.run_dir / "index.html", index.render(summary))

    def finish_unrun(self, status: str, why: str) -> None:
        """Every notebook that never ran gets a row saying so (the index must not look complete)."""
        with self.lock:
            for scen, r in self.results.items():
                done = {n.name for n in r.notebooks}
                rest = tuple(NotebookResult(p.stem, status, error=why) for p in self.notebooks if p.stem not in done)
                self.results[scen] = replace(r, notebooks=self._ordered(r.notebooks + rest))


def running_text(name: str, done: int, total: int) -> str:
    """Pure: what a running notebook is doing, as the index says it ("running 03_bisect_hang, cell 4/10")."""
    if total <= 0:
        return f"running {name}, starting"
    if done >= total:
        return f"running {name}, rendering (all {total} cells done)"
    return f"running {name}, cell {done + 1}/{total}"


@contextlib.contextmanager
def follow(run: RunState, every_s: float = PROGRESS_POLL_S):
    """While the run goes on, rewrite run.json and the index whenever a running notebook finishes a cell, so
    that a reader sees how far it got (a notebook can run for an hour)."""
    done = threading.Event()

    def poll() -> None:
        seen = None
        while not done.wait(every_s):
            with run.lock:
                now = tuple((s, (r or {}).get("cells_done")) for s in list(run.current) for r in [run.running(s)])
            if now != seen:
                seen = now
                with contextlib.suppress(OSError):
                    run.write_index(only_running=True)

    t = threading.Thread(target=poll, name="gpulab-run-progress", daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join()
