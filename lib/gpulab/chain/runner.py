"""The chain runner: every numbered notebook, per scenario, through papermill, rendered, indexed.

The index and run.json are rewritten after every notebook, so a run stopped at any point is browsable and
says so: an interrupt (SIGINT/SIGTERM/SIGHUP) stops every child, marks the notebook it cut off as
`interrupted` and the rest `not run`, and the index says interrupted; a full disk ends the run as
`failed`, never as a success. Scenarios may run side by side (`jobs`), each in its own thread that only
waits on its papermill child. Within a scenario the built-in workload's notebooks run side by side on a
machine with cores to spare, each once those whose products it reads have finished, and a notebook that
times something (`timed` in its metadata) with nothing beside it (`schedule`).
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
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import yaml

from gpulab import paramsets, proc, project, report
from gpulab.chain import notebook, params, verdict
from gpulab.chain.state import NotebookResult, RunState, ScenarioResult, follow, rel
from gpulab.device import AUTO_ENV, kind as device_kind, no_gpu_files, usable_cores
from gpulab.fixes import scenario_env

DEFAULT_CELL_TIMEOUT_S = 1800.0
DEFAULT_NOTEBOOK_TIMEOUT_S = 3600.0
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}
SIDE_BY_SIDE_CORES = 8   # usable cores from which a scenario's notebooks may run side by side
SIDE_BY_SIDE_ENV = "GPULAB_NOTEBOOKS_SIDE_BY_SIDE"   # 0: one at a time; always: side by side on any machine
SIDE_BY_SIDE_CHOICES = ("auto", "0", "always")


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
    # where the notebooks' kernels, and so the workload, run (`gpulab run`: the caller's folder); None: root
    workdir: Path | None = None

    def __post_init__(self) -> None:
        for key in ("cell_timeout_s", "notebook_timeout_s"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and v > 0):
                flag = "--" + key.replace("_s", "").replace("_", "-")
                raise params.ParamError(f"{flag} {v!r} is not valid; it must be a positive number of seconds")
        if not (isinstance(self.jobs, int) and self.jobs >= 1):
            raise params.ParamError(f"--jobs {self.jobs!r} is not valid; it must be a whole number >= 1")


class DiskFull(OSError):
    """Writing a product failed for lack of space (or a size limit): the run cannot go on."""


def find_root(start: str | Path | None = None) -> Path:
    """The notebooks and params/ to run (gpulab.project: a checkout, else the copy installed with gpulab)."""
    return project.root(start)


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


def _meta(nb_path: Path) -> dict:
    return json.loads(nb_path.read_text()).get("metadata", {}).get("gpulab", {})


def needs(nb_path: Path) -> list[str]:
    """Notebooks whose products this one cannot do without (notebook metadata gpulab.needs)."""
    return list(_meta(nb_path).get("needs", []))


def waits_for(metas: Mapping[str, dict], program: bool) -> dict[str, set[str]]:
    """Per notebook, the notebooks of this run whose products it reads, from each one's metadata: `needs`, and
    `after` ({notebook: "always" or "program"}: read only when the workload is the user's program)."""
    return {name: {n for n, when in {**{k: "always" for k in m.get("needs", [])}, **m.get("after", {})}.items()
                   if n in metas and n != name and (when == "always" or program)}
            for name, m in metas.items()}


def schedule(pending: Sequence[str], running: set[str], done: set[str], after: Mapping[str, set[str]],
             timed: set[str]) -> list[str]:
    """Pure: which pending notebooks start now. Those whose inputs are done may start together, but a timed one
    (it measures time: a benchmark, a recorder's or a fix's cost) only with nothing running, and nothing starts
    beside it; a ready timed one goes first and holds the others back (it would wait for ever behind them)."""
    if running & timed:
        return []
    ready = [n for n in pending if after.get(n, set()) <= done]
    first = next((n for n in ready if n in timed), None)
    if first is not None:
        return [] if running else [first]
    return ready


def times_now(meta: Mapping[str, Any], sc_dir: Path, values: Mapping[str, Any],
              say: Callable[[str], None] = lambda m: None) -> bool:
    """A notebook's metadata `timed`, once the notebooks it waits for have ended: true, or 'module:function'
    (sc_dir, values) -> whether it may time something with what they left (04 times no fix after a healthy 03).
    A function that cannot be asked (a wrong name, an error reading the products) leaves the notebook timed, and
    `say`s why: alone is never wrong, only slower."""
    t = meta.get("timed")
    if not isinstance(t, str):
        return bool(t)
    import importlib

    mod, _, fn = t.partition(":")
    try:
        return bool(getattr(importlib.import_module(mod), fn)(sc_dir, values))
    except Exception as exc:  # noqa: BLE001 - the schedule goes on; the notebook runs alone
        say(f"notebook metadata timed={t!r} could not be asked ({type(exc).__name__}: {exc}); it runs alone")
        return True


def plan(cfg: RunConfig) -> tuple[list[Path], dict[str, params.ParamSpec], dict[str, ScenarioResult]]:
    """Everything that can be wrong with the input, checked before any notebook runs; each scenario's
    parameters and fixes are resolved here, once."""
    paramsets.check_scenarios(cfg.root, cfg.scenarios)
    asked = os.environ.get(SIDE_BY_SIDE_ENV, "auto")
    if asked not in SIDE_BY_SIDE_CHOICES:
        raise params.ParamError(f"{SIDE_BY_SIDE_ENV}={asked!r} is not valid; it must be one of "
                                f"{', '.join(SIDE_BY_SIDE_CHOICES)}")
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


def _disk(exc: OSError, what: Path) -> DiskFull:
    return DiskFull(exc.errno, f"cannot write {what}: {exc.strerror or exc} (is the disk full?)")


def _params_file(scen: str, sc_dir: Path, nb_path: Path, schema: dict, values: dict) -> Path:
    """The notebook's parameters (those it declares, its out_dir, its scenario) as the file papermill reads."""
    name = nb_path.stem
    nb_params = params.for_notebook(values, schema, name)
    nb_params["out_dir"] = str(sc_dir)
    if "scenario" in schema and name in schema["scenario"].notebooks:
        nb_params["scenario"] = scen
    return report.write_text(sc_dir / "logs" / f"{name}.params.yaml", yaml.safe_dump(nb_params, sort_keys=True))


def _ahead(run: RunState, scen: str, sc_dir: Path, nb_path: Path, pfile: Path, env: Mapping[str, str]
           ) -> notebook.Ahead:
    cfg = run.cfg
    return notebook.Ahead(nb_path, sc_dir / f"{nb_path.stem}.ipynb", pfile, cwd=cfg.workdir or cfg.root,
                          kernel=cfg.kernel, cell_timeout_s=cfg.cell_timeout_s,
                          log=sc_dir / "logs" / f"{nb_path.stem}.log", env=dict(env))


def _asks_device(values: Mapping[str, Any]) -> bool:
    """Whether the scenario's kernels need device=auto's answer: device=cpu needs no torch to resolve, nor does
    auto on a host without GPU device files (gpulab.device.no_gpu_files), and the question imports torch in a
    child (a few CPU-seconds on every run on a CPU)."""
    kind = device_kind(values.get("device", "auto"))
    return kind != "cpu" and not (kind == "auto" and no_gpu_files())


def _device_env(run: RunState, env: Mapping[str, str], values: Mapping[str, Any], ask: bool = True
                ) -> dict[str, str]:
    """A notebook kernel's environment: `env` with device=auto's answer when it is in (none asked for cpu)."""
    if _asks_device(values):
        return run.auto.env_for(env, ask=ask)
    return {k: v for k, v in env.items() if k != AUTO_ENV}


class _NextUp:
    """The next notebook's papermill child, started while this one runs (gpulab.chain.ahead) as soon as the
    device answer its kernel would otherwise find itself is in (gpulab.chain.autodevice): its papermill
    import and kernel start then overlap this notebook instead of following it."""

    def __init__(self, run: RunState, scen: str, sc_dir: Path, nb_path: Path, schema: dict, values: dict):
        self.ahead: notebook.Ahead | None = None
        self._now = threading.Event()
        self._thread = threading.Thread(target=self._start, args=(run, scen, sc_dir, nb_path, schema, values),
                                        name="gpulab-next-notebook", daemon=True)
        self._thread.start()

    def _start(self, run: RunState, scen: str, sc_dir: Path, nb_path: Path, schema: dict, values: dict) -> None:
        base = dict(_scenario_env(scen, run) or os.environ)   # a copy: os.environ changes as children start
        asks = _asks_device(values)
        if asks:
            run.auto.env_for(base)   # the question, if this environment has none yet
        while asks and not run.auto.ready(base) and not self._now.wait(0.1):
            pass
        if self._now.is_set() or run.stopping.is_set():
            return
        with contextlib.suppress(Exception):   # no head start (a full disk, no process left): it starts in turn
            self.ahead = _ahead(run, scen, sc_dir, nb_path, _params_file(scen, sc_dir, nb_path, schema, values),
                                _device_env(run, base, values))

    def take(self) -> notebook.Ahead | None:
        """The started child (None: it had not started yet, and will not)."""
        self._now.set()
        self._thread.join()
        return self.ahead


def _run_notebook(run: RunState, scen: str, sc_dir: Path, nb_path: Path, schema: dict, values: dict,
                  ahead: notebook.Ahead | None = None, ask: bool = False) -> NotebookResult:
    cfg, name = run.cfg, nb_path.stem

    def started() -> notebook.Ahead:
        return _ahead(run, scen, sc_dir, nb_path, _params_file(scen, sc_dir, nb_path, schema, values),
                      # the question is the next notebook's (_NextUp asks it): with none, as in `--only 03`, the
                      # answer would come after this kernel asked torch itself (side by side, later ones use it)
                      _device_env(run, _scenario_env(scen, run) or os.environ, values, ask=ask))

    def executed(head: notebook.Ahead) -> notebook.Execution:
        return notebook.execute(head, notebook_timeout_s=cfg.notebook_timeout_s, progress=run.say,
                                stopping=run.stopping)

    ahead = ahead or started()
    out_ipynb = ahead.out_ipynb
    run.say(f"[{scen}] {name}: running")
    run.begin(scen, name, out_ipynb)
    ex = executed(ahead)
    if notebook.died_starting(ex, out_ipynb) and not run.stopping.is_set():
        run.say(f"[{scen}] {name}: its kernel died as it started, before any cell ran; starting it once more")
        ex = executed(started())
    _, _, cells_s = notebook.cells_done(out_ipynb)
    t_render = time.monotonic()
    rep, full, render_err = notebook.render(out_ipynb) if out_ipynb.exists() else (None, None, "no notebook was written")
    entry = report.load_metrics(sc_dir).get(name, {})
    err = ex.error
    if ex.status == "ok" and not out_ipynb.exists():
        err = "papermill ended well but wrote no notebook"
    res = NotebookResult(name, ex.status if err is None or ex.status != "ok" else "failed", ex.seconds,
                         entry.get("headline"), err or (render_err if ex.status != "ok" else None),
                         rel(out_ipynb if out_ipynb.exists() else None, run.run_dir), rel(rep, run.run_dir),
                         rel(full, run.run_dir), cells_s, time.monotonic() - t_render)
    run.say(f"[{scen}] {name}: {res.status} in {ex.seconds:.1f} s" + (f" - {err.splitlines()[0]}" if err else ""))
    return res


def _scenario_env(scen: str, run: RunState) -> dict[str, str] | None:
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


def _on_gpu(run: RunState, scen: str, schema: dict) -> None:
    run.take_gpu(scen)
    try:
        _run_scenario(run, scen, schema)
    finally:
        run.give_gpu(scen)


def _skipped(run: RunState, scen: str, name: str, missing: Sequence[str]) -> NotebookResult:
    """A notebook not run because a notebook it needs did not succeed (metadata `needs`)."""
    run.say(f"[{scen}] {name}: skipped (needs {', '.join(missing)})")
    return NotebookResult(name, "skipped", error=f"skipped: needs {', '.join(missing)}, which did not succeed")


def _disk_failed(run: RunState, scen: str, name: str, sc_dir: Path, exc: OSError) -> DiskFull:
    """A notebook ended by a full disk: its row says so, and the run stops (raise what this returns)."""
    if exc.errno not in DISK_ERRNOS:
        raise exc
    run.add(scen, NotebookResult(name, "failed", error=str(_disk(exc, sc_dir))))
    return _disk(exc, sc_dir)


def _run_scenario(run: RunState, scen: str, schema: dict) -> None:
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
    if _side_by_side(run, values):
        _run_side_by_side(run, scen, sc_dir, schema, values)
        return
    status_of: dict[str, str] = {}
    ahead: notebook.Ahead | None = None   # this notebook's child, started while the one before ran
    try:
        for i, nb_path in enumerate(run.notebooks):
            if run.stopping.is_set():
                return
            name = nb_path.stem
            missing = [n for n in needs(nb_path) if status_of.get(n, "ok") != "ok"]
            if missing:
                res = _skipped(run, scen, name, missing)
                if ahead is not None:
                    ahead.close()
                    ahead = None
            else:
                later = run.notebooks[i + 1:]
                next_up = _NextUp(run, scen, sc_dir, later[0], schema, values) if later else None
                try:
                    mine, ahead = ahead, None
                    res = _run_notebook(run, scen, sc_dir, nb_path, schema, values, ahead=mine)
                except proc.Interrupted as exc:
                    run.add(scen, _cut_off(run, sc_dir, name, exc))
                    raise
                except OSError as exc:
                    raise _disk_failed(run, scen, name, sc_dir, exc) from None
                finally:
                    ahead = next_up.take() if next_up is not None else None
            status_of[name] = res.status
            run.add(scen, res)
    finally:
        if ahead is not None:
            ahead.close()


def _side_by_side(run: RunState, values: Mapping[str, Any]) -> bool:
    """Whether a scenario's notebooks may run side by side: the built-in workload (its memory and time are
    known to be small; a user's program keeps the GPU and the cores to itself, notebook after notebook), one
    scenario at a time, and cores to spare; $GPULAB_NOTEBOOKS_SIDE_BY_SIDE: 0 never (a timing pair), always
    whatever the cores (the chain's tests on a small machine)."""
    alone = run.cfg.jobs == 1 or len(run.cfg.scenarios) == 1
    asked = os.environ.get(SIDE_BY_SIDE_ENV, "auto")
    return (alone and asked != "0" and str(values.get("workload", "builtin")) == "builtin" and len(run.notebooks) > 1
            and (asked == "always" or usable_cores() >= SIDE_BY_SIDE_CORES))


def _run_side_by_side(run: RunState, scen: str, sc_dir: Path, schema: dict, values: dict) -> None:
    """The scenario's notebooks as `schedule` allows, each in a thread that waits on its papermill child; only
    this thread adds their results (an interrupt cuts off the running ones here, and their threads' late
    results are dropped)."""
    paths = {p.stem: p for p in run.notebooks}
    metas = {name: _meta(p) for name, p in paths.items()}
    after = waits_for(metas, program=False)
    timed = {name for name, m in metas.items() if m.get("timed")}   # until the ones it waits for have ended
    decided: set[str] = set()
    pending, running, done, status_of = list(paths), {}, set(), {}
    run.say(f"[{scen}] notebooks side by side where they read nothing of each other's ({usable_cores()} cores)"
            + (f"; {', '.join(sorted(timed))} alone when they time something" if timed else ""))
    pool = ThreadPoolExecutor(max_workers=len(paths), thread_name_prefix="notebook")
    # every notebook's papermill child and kernel started now, each waiting for its turn: their start-up (seconds
    # a kernel) overlaps the notebooks before them, as the next one's does in the one-at-a-time chain
    heads = {name: _NextUp(run, scen, sc_dir, paths[name], schema, values) for name in pending}
    ended = False
    try:
        while (pending or running) and not run.stopping.is_set():
            for name in [n for n in pending if n in timed and n not in decided and after.get(n, set()) <= done]:
                decided.add(name)
                if not times_now(metas[name], sc_dir, values, say=lambda m: run.say(f"[{scen}] {name}: {m}")):
                    timed.discard(name)
                    run.say(f"[{scen}] {name} times nothing here: it runs beside the others")
            starts = schedule(pending, set(running), done, after, timed)
            if not (starts or running):   # metadata whose `after` goes round in a circle
                raise RuntimeError(f"notebooks {', '.join(pending)} each wait for another of them (their metadata's "
                                   f"`after`: {', '.join(f'{n} after {sorted(after[n])}' for n in pending)})")
            for name in starts:
                pending.remove(name)
                missing = [n for n in metas[name].get("needs", []) if status_of.get(n, "ok") != "ok"]
                if missing:
                    started = heads.pop(name).take()
                    if started is not None:
                        started.close()
                    status_of[name] = "skipped"   # and so is what needs it
                    run.add(scen, _skipped(run, scen, name, missing))
                    done.add(name)
                    continue
                running[name] = pool.submit(_run_notebook, run, scen, sc_dir, paths[name], schema, values,
                                            heads.pop(name).take(), True)
            finished, _ = wait(list(running.values()), timeout=0.2, return_when=FIRST_COMPLETED)
            for name, fut in list(running.items()):
                if fut in finished:
                    del running[name]
                    done.add(name)
                    try:
                        res = fut.result()
                    except OSError as exc:
                        raise _disk_failed(run, scen, name, sc_dir, exc) from None
                    status_of[name] = res.status
                    run.add(scen, res)
        ended = not (pending or running)
    except proc.Interrupted as exc:
        for name in running:
            run.add(scen, _cut_off(run, sc_dir, name, exc))
        running.clear()
        raise
    finally:
        if not ended:   # cut short: the children end, and with them the threads waiting on them
            run.stopping.set()
            proc.stop_all(grace_s=1)
        for head in heads.values():   # the started children of notebooks that never ran
            started = head.take()
            if started is not None:
                started.close()
        pool.shutdown(wait=True)


def _cut_off(run: RunState, sc_dir: Path, name: str, exc: proc.Interrupted) -> NotebookResult:
    """The notebook a signal stopped: its finished cells (papermill saved them) are still rendered."""
    ipynb = sc_dir / f"{name}.ipynb"
    rep = full = None
    if ipynb.exists():
        with contextlib.suppress(Exception):
            rep, full, _ = notebook.render(ipynb)
    done, total, _ = notebook.cells_done(ipynb)
    return NotebookResult(name, "interrupted", None, None,
                          f"cut off by {exc.name} after {done} of {total} code cells",
                          rel(ipynb if ipynb.exists() else None, run.run_dir), rel(rep, run.run_dir),
                          rel(full, run.run_dir))


def run(cfg: RunConfig, progress: Callable[[str], None] | None = None) -> tuple[int, Path]:
    """Run the chain; returns (exit status, index.html). Raises ParamError before anything runs on bad
    input, and proc.Interrupted (after writing the index) when a signal stops the run."""
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    notebooks, schema, resolved = plan(cfg)
    out = (cfg.out or cfg.root / "outputs").resolve()
    run_dir = new_run_dir(out)
    _point_latest(out, run_dir)
    state = RunState(cfg, run_dir, notebooks, resolved, say)
    notebook.preload_renderer()
    say(f"gpulab run {run_dir.name}: {len(cfg.scenarios)} scenario(s) x {len(notebooks)} notebook(s) -> {run_dir}")
    # follow stops before the final index is written; a device question still running (a short run) ends with the run
    with contextlib.closing(state.auto), follow(state):
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
