"""The chain runner: every numbered notebook, per scenario, through papermill, rendered, indexed.

The index and run.json are rewritten after every notebook, so a run stopped at any point is browsable and
says so: an interrupt (SIGINT/SIGTERM/SIGHUP) stops every child, marks the notebook it cut off as
`interrupted` and the rest `not run`, and the index says interrupted; a full disk ends the run as
`failed`, never as a success. Scenarios may run side by side (`jobs`), each in its own thread that only
waits on its papermill child.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import yaml

from gpulab import proc, report
from gpulab.chain import index, notebook, params, verdict
from gpulab.chain.autodevice import AutoDevice
from gpulab.fixes import scenario_env

DEFAULT_CELL_TIMEOUT_S = 1800.0
DEFAULT_NOTEBOOK_TIMEOUT_S = 3600.0
# not_applicable: the scenario's fix cannot apply on this device, so its notebooks are not run (not a failure)
NOTEBOOK_STATUSES = ("ok", "failed", "killed", "skipped", "interrupted", "not_run", verdict.NOT_APPLICABLE)
RUN_STATUSES = ("running", "ok", "failed", "interrupted")
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}
PROGRESS_POLL_S = 1.0   # how often the index follows a running notebook's cells


@dataclass(frozen=True)
class RunConfig:
    root: Path
    scenarios: tuple[str, ...] = ("baseline",)
    param_files: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    out: Path | None = None  # the outputs folder; a new run folder is made inside it
    only: tuple[str, ...] = ()  # notebook name prefixes to run (e.g. "01", "05_oracle"); empty = all
    kernel: str = "python3"
    cell_timeout_s: float = DEFAULT_CELL_TIMEOUT_S
    notebook_timeout_s: float = DEFAULT_NOTEBOOK_TIMEOUT_S
    jobs: int = 1  # scenarios run side by side

    def __post_init__(self) -> None:
        for key in ("cell_timeout_s", "notebook_timeout_s"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and v > 0):
                flag = "--" + key.replace("_s", "").replace("_", "-")
                raise params.ParamError(f"{flag} {v!r} is not valid; it must be a positive number of seconds")
        if not (isinstance(self.jobs, int) and self.jobs >= 1):
            raise params.ParamError(f"--jobs {self.jobs!r} is not valid; it must be a whole number >= 1")


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
        rel = p.relative_to(sc_dir)
        if p.is_file() and p.suffix in PRODUCT_SUFFIXES and rel.parts[0] not in PRODUCT_SKIP:
            found.append(str(p.relative_to(run_dir)))
    return found[:limit]


class DiskFull(OSError):
    """Writing a product failed for lack of space (or a size limit): the run cannot go on."""


def find_root(start: str | Path | None = None) -> Path:
    """The project folder: $GPULAB_ROOT, else the nearest parent with notebooks/ and params/."""
    if os.environ.get("GPULAB_ROOT"):
        return Path(os.environ["GPULAB_ROOT"]).resolve()
    here = Path(start or os.getcwd()).resolve()
    for cand in (here, *here.parents, Path(__file__).resolve().parents[2]):
        if (cand / "notebooks").is_dir() and (cand / "params").is_dir():
            return cand
    raise FileNotFoundError(f"no gpulab project (a folder with notebooks/ and params/) at or above {here}; "
                            "run from the project folder or set GPULAB_ROOT")


def discover(root: Path, only: Sequence[str] = ()) -> list[Path]:
    found = sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if only:
        names = [p.stem for p in found]
        picked = [p for p in found if any(p.stem == o or p.stem.startswith(o) for o in only)]
        unknown = [o for o in only if not any(n == o or n.startswith(o) for n in names)]
        if unknown:
            raise params.ParamError(f"no notebook matches {unknown}; notebooks: {', '.join(names)}")
        found = picked
    if not found:
        raise FileNotFoundError(f"no numbered notebooks in {root / 'notebooks'}")
    return found


def new_run_dir(out: Path) -> Path:
    """outputs/<timestamp>[-N]: never reuses a folder, even for two runs in the same second."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        cand = out / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            cand.mkdir()
            return cand
        except FileExistsError:
            continue
    raise RuntimeError(f"could not make a new run folder in {out}")


def _point_latest(out: Path, run_dir: Path) -> None:
    link = out / "latest"
    tmp = out / f".latest.{os.getpid()}"
    try:
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(run_dir.name)
        os.replace(tmp, link)
    except OSError:  # filesystems without symlinks: a text file says where the newest run is
        (out / "LATEST").write_text(run_dir.name + "\n")


def needs(nb_path: Path) -> list[str]:
    """Notebooks whose products this one cannot do without (notebook metadata gpulab.needs)."""
    meta = json.loads(nb_path.read_text()).get("metadata", {})
    return list(meta.get("gpulab", {}).get("needs", []))


def _rel(path: Path | None, base: Path) -> str | None:
    return None if path is None else os.path.relpath(path, base)


def plan(cfg: RunConfig) -> tuple[list[Path], dict[str, params.ParamSpec], dict[str, ScenarioResult]]:
    """Everything that can be wrong with the input, checked before any notebook runs; each scenario's
    parameters and fixes are resolved here, once."""
    params.check_scenarios(cfg.root, cfg.scenarios)
    notebooks = discover(cfg.root, cfg.only)
    # The schema comes from every notebook, so a shared params file stays valid with --only.
    schema = params.notebook_schema(discover(cfg.root))
    resolved: dict[str, ScenarioResult] = {}
    problems = []
    for scen in cfg.scenarios:
        try:
            layered = params.resolve(cfg.root, scen, cfg.param_files, cfg.overrides)
            values = params.validate(layered, schema)
            resolved[scen] = ScenarioResult(scen, layered.description, values, changed=params.changed(values, schema),
                                            fixes=layered.fixes)
        except params.ParamError as exc:
            problems.append(f"scenario {scen!r}: {exc}" if len(cfg.scenarios) > 1 else str(exc))
    if problems:
        raise params.ParamError("\n".join(problems))
    return notebooks, schema, resolved


class _Run:
    """The state of one run, shared by the scenario threads; every change rewrites run.json and the index."""

    def __init__(self, cfg: RunConfig, run_dir: Path, notebooks: list[Path],
                 resolved: dict[str, ScenarioResult], say: Callable[[str], None]):
        self.cfg, self.run_dir, self.notebooks, self.say = cfg, run_dir, notebooks, say
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
        self.current: dict[str, tuple[str, Path, float]] = {}   # scenario -> (notebook, its .ipynb, start)
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
        """A notebook starts: the index says so at once (and follows its cells, `_follow`)."""
        with self.lock:
            self.current[scen] = (name, ipynb, time.monotonic())
            self.write_index()

    def add(self, scen: str, *res: NotebookResult) -> None:
        with self.lock:
            r = self.results[scen]
            self.results[scen] = replace(r, notebooks=r.notebooks + res)
            if scen in self.current and any(n.name == self.current[scen][0] for n in res):
                del self.current[scen]
            self.write_index()

    def running(self, scen: str) -> dict[str, Any] | None:
        """The notebook a scenario is running now and how far it got (papermill saves after every cell)."""
        if scen not in self.current:
            return None
        name, ipynb, t0 = self.current[scen]
        done, total, _ = notebook.cells_done(ipynb)
        return {"notebook": name, "cells_done": done, "cells": total, "seconds": round(time.monotonic() - t0, 1),
                "text": running_text(name, done, total)}

    def complete(self, s: ScenarioResult) -> bool:
        """Every notebook of the scenario has its result (or the run ended): only then is there a verdict."""
        return self.status != "running" or len(s.notebooks) >= len(self.notebooks)

    def scenario(self, s: ScenarioResult) -> dict[str, Any]:
        sc_dir = self.run_dir / s.name
        metrics = report.load_metrics(sc_dir)
        nbs = [asdict(n) for n in s.notebooks]
        v = verdict.judge(nbs, metrics, s.name, s.fixes) if nbs and self.complete(s) else None
        now = None if v else self.running(s.name)
        if now:
            nbs.append(asdict(NotebookResult(now["notebook"], "running", now["seconds"], now["text"])))
        waiting = (f"{len(self.notebooks) - len(s.notebooks)} of {len(self.notebooks)} notebooks still to run"
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
                self.results[scen] = replace(r, notebooks=r.notebooks + rest)


def running_text(name: str, done: int, total: int) -> str:
    """Pure: what a running notebook is doing, as the index says it ("running 03_bisect_hang, cell 4/10")."""
    if total <= 0:
        return f"running {name}, starting"
    if done >= total:
        return f"running {name}, rendering (all {total} cells done)"
    return f"running {name}, cell {done + 1}/{total}"


@contextlib.contextmanager
def _follow(run: _Run, every_s: float = PROGRESS_POLL_S):
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


def _disk(exc: OSError, what: Path) -> DiskFull:
    return DiskFull(exc.errno, f"cannot write {what}: {exc.strerror or exc} (is the disk full?)")


def _run_notebook(run: _Run, scen: str, sc_dir: Path, nb_path: Path, schema: dict, values: dict) -> NotebookResult:
    cfg, name = run.cfg, nb_path.stem
    nb_params = params.for_notebook(values, schema, name)
    nb_params["out_dir"] = str(sc_dir)
    if "scenario" in schema and name in schema["scenario"].notebooks:
        nb_params["scenario"] = scen
    pfile = sc_dir / "logs" / f"{name}.params.yaml"
    report.write_text(pfile, yaml.safe_dump(nb_params, sort_keys=True))
    out_ipynb = sc_dir / f"{name}.ipynb"
    run.say(f"[{scen}] {name}: running")
    run.begin(scen, name, out_ipynb)
    ex = notebook.execute(nb_path, out_ipynb, pfile, root=cfg.root, kernel=cfg.kernel,
                          cell_timeout_s=cfg.cell_timeout_s, notebook_timeout_s=cfg.notebook_timeout_s,
                          log=sc_dir / "logs" / f"{name}.log", progress=run.say, stopping=run.stopping,
                          env=run.auto.env_for(_scenario_env(scen, run) or os.environ))
    _, _, cells_s = notebook.cells_done(out_ipynb)
    t_render = time.monotonic()
    rep, full, render_err = notebook.render(out_ipynb) if out_ipynb.exists() else (None, None, "no notebook was written")
    entry = report.load_metrics(sc_dir).get(name, {})
    err = ex.error
    if ex.status == "ok" and not out_ipynb.exists():
        err = "papermill ended well but wrote no notebook"
    res = NotebookResult(name, ex.status if err is None or ex.status != "ok" else "failed", ex.seconds,
                         entry.get("headline"), err or (render_err if ex.status != "ok" else None),
                         _rel(out_ipynb if out_ipynb.exists() else None, run.run_dir), _rel(rep, run.run_dir),
                         _rel(full, run.run_dir), cells_s, time.monotonic() - t_render)
    run.say(f"[{scen}] {name}: {res.status} in {ex.seconds:.1f} s" + (f" - {err.splitlines()[0]}" if err else ""))
    return res


def visible_gpus() -> tuple[str, ...]:
    """The GPU ids scenarios can be spread over: CUDA_VISIBLE_DEVICES, else the NVIDIA driver's list. Read
    without torch: the runner must not hold a CUDA context its notebooks' children compete with."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return tuple(g.strip() for g in listed.split(",") if g.strip())
    driver = Path("/proc/driver/nvidia/gpus")
    return tuple(str(i) for i in range(len(list(driver.iterdir())))) if driver.is_dir() else ()


def _scenario_env(scen: str, run: _Run) -> dict[str, str] | None:
    """The environment a scenario's notebooks run in (None: this process's own): its fixes (GPULAB_FIXES and
    their variables, inherited by every child the notebooks start) and, when scenarios run side by side on
    several GPUs, the GPU it was given."""
    env = dict(os.environ)
    if run.gpu_of.get(scen) is not None:
        env["CUDA_VISIBLE_DEVICES"] = run.gpu_of[scen]
    env = scenario_env(run.results[scen].fixes, env)   # also drops inherited fixes: a baseline has none
    return None if env == os.environ else env


def _not_applicable(fixes: Sequence[str], values: Mapping[str, Any]) -> str | None:
    """Why the scenario's fixes cannot apply on the device it would run on (cuDNN or an allocator setting on
    a CPU), or None. Such a scenario is reported not_applicable, not run into an error of the fix's own."""
    if not fixes:
        return None
    from gpulab import device as gdevice
    from gpulab.fixes import platform, registry   # imports torch: only for scenarios with fixes
    from gpulab.fixes.compose import compose
    from gpulab.fixes.fix import not_applicable
    from gpulab.workloads import WorkloadConfig
    resolved = registry.resolve(fixes)
    # judged on the platform before the fix: cpu_fallback's own device=cpu must not make it "not on a GPU"
    own = compose(resolved).params
    before = {k: v for k, v in values.items() if not (k in own and own[k] == v)}
    try:
        mask = platform.workload_mask(WorkloadConfig.from_params(before))
        device = gdevice.resolve(str(before.get("device", "auto")))
    except (ValueError, RuntimeError):   # a bad value, cuda without a GPU: the notebooks report it
        return None
    facts = platform.facts(device, mask)
    why = not_applicable(resolved, facts)
    return f"{why} (device {facts['device']})" if why else None


def _on_gpu(run: _Run, scen: str, schema: dict) -> None:
    run.take_gpu(scen)
    try:
        _run_scenario(run, scen, schema)
    finally:
        run.give_gpu(scen)


def _run_scenario(run: _Run, scen: str, schema: dict) -> None:
    values, fixes = run.results[scen].params, run.results[scen].fixes
    sc_dir = run.run_dir / scen
    try:
        (sc_dir / "logs").mkdir(parents=True)
        report.write_text(sc_dir / "params.yaml", yaml.safe_dump(values, sort_keys=True))
    except OSError as exc:
        raise _disk(exc, sc_dir) if exc.errno in DISK_ERRNOS else exc
    why_not = _not_applicable(fixes, values)
    if why_not:
        run.say(f"[{scen}] not applicable here: {why_not}; its notebooks are not run")
        run.add(scen, *(NotebookResult(p.stem, verdict.NOT_APPLICABLE, error=why_not) for p in run.notebooks))
        return
    status_of: dict[str, str] = {}
    for nb_path in run.notebooks:
        if run.stopping.is_set():
            return
        name = nb_path.stem
        missing = [n for n in needs(nb_path) if status_of.get(n, "ok") != "ok"]
        if missing:
            res = NotebookResult(name, "skipped", error=f"skipped: needs {', '.join(missing)}, which did not succeed")
            run.say(f"[{scen}] {name}: skipped (needs {', '.join(missing)})")
        else:
            try:
                res = _run_notebook(run, scen, sc_dir, nb_path, schema, values)
            except proc.Interrupted as exc:
                run.add(scen, _cut_off(run, sc_dir, name, exc))
                raise
            except OSError as exc:
                if exc.errno not in DISK_ERRNOS:
                    raise
                run.add(scen, NotebookResult(name, "failed", error=str(_disk(exc, sc_dir))))
                raise _disk(exc, sc_dir) from None
        status_of[name] = res.status
        run.add(scen, res)


def _cut_off(run: _Run, sc_dir: Path, name: str, exc: proc.Interrupted) -> NotebookResult:
    """The notebook a signal stopped: its finished cells (papermill saved them) are still rendered."""
    ipynb = sc_dir / f"{name}.ipynb"
    rep = full = None
    if ipynb.exists():
        with contextlib.suppress(Exception):
            rep, full, _ = notebook.render(ipynb)
    done, total, _ = notebook.cells_done(ipynb)
    return NotebookResult(name, "interrupted", None, None,
                          f"cut off by {exc.name} after {done} of {total} code cells",
                          _rel(ipynb if ipynb.exists() else None, run.run_dir), _rel(rep, run.run_dir),
                          _rel(full, run.run_dir))


def run(cfg: RunConfig, progress: Callable[[str], None] | None = None) -> tuple[int, Path]:
    """Run the chain; returns (exit status, index.html). Raises ParamError before anything runs on bad
    input, and proc.Interrupted (after writing the index) when a signal stops the run."""
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    notebooks, schema, resolved = plan(cfg)
    out = (cfg.out or cfg.root / "outputs").resolve()
    run_dir = new_run_dir(out)
    _point_latest(out, run_dir)
    state = _Run(cfg, run_dir, notebooks, resolved, say)
    say(f"gpulab run {run_dir.name}: {len(cfg.scenarios)} scenario(s) x {len(notebooks)} notebook(s) -> {run_dir}")
    with _follow(state):   # stopped before the final index is written
        try:
            state.write_index()
            if cfg.jobs == 1 or len(cfg.scenarios) == 1:
                for scen in cfg.scenarios:
                    _run_scenario(state, scen, schema)
            else:
                with ThreadPoolExecutor(max_workers=cfg.jobs, thread_name_prefix="scenario") as pool:
                    futures = [pool.submit(_on_gpu, state, scen, schema) for scen in cfg.scenarios]
                    try:
                        for f in futures:
                            while not f.done():
                                time.sleep(0.2)  # the main thread stays interruptible
                            f.result()
                    except BaseException:
                        state.stopping.set()
                        proc.stop_all(grace_s=1)
                        raise
        except proc.Interrupted as exc:
            state.stopping.set()
            proc.stop_all(grace_s=1)
            state.status, state.note = "interrupted", f"interrupted by {exc.name}"
            state.finish_unrun("not_run", f"not run: the run was interrupted by {exc.name}")
            with contextlib.suppress(OSError):
                state.write_index()
            say(f"interrupted by {exc.name}: children stopped; {run_dir / 'index.html'} says what finished")
            raise
        except DiskFull as exc:
            state.stopping.set()
            proc.stop_all()
            state.status, state.note = "failed", str(exc)
            state.finish_unrun("not_run", "not run: the run stopped when the disk was full")
            try:
                path = state.write_index()
            except OSError:
                path = run_dir / "index.html"
            say(f"gpulab run: {exc}; the run stopped (nothing is reported as a success)")
            return 1, path
    statuses = [n.status for r in state.results.values() for n in r.notebooks]
    failed = any(s not in verdict.FINISHED for s in statuses)
    state.status = "failed" if failed else "ok"
    summary = state.summary()
    index_path = state.write_index(summary)
    verdicts = ", ".join(f"{sc['name']} {sc['verdict']}" for sc in summary["scenarios"])
    na = statuses.count(verdict.NOT_APPLICABLE)
    ran = "every notebook ran to the end" + (f" ({na} not run: their scenario's fix cannot apply here)" if na else "")
    say(f"done in {time.time() - state.started:.0f} s: " + ("some notebooks FAILED" if failed else ran)
        + f"; verdict: {verdicts}")
    return (1 if failed else 0), index_path
