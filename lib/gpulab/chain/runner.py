"""The chain runner: every numbered notebook, per scenario, through papermill, rendered, indexed.

Each notebook runs in its own papermill child (own process group) under two limits: papermill's per-cell
execution timeout and our outer wall-clock limit, which kills the whole tree when a kernel stalls
(papermill has open bugs where it waits forever). Papermill saves the notebook after every cell, so a
killed notebook keeps the cells it finished; it is rendered and indexed like any other. The index and
run.json are rewritten after every notebook, so an interrupted run is still browsable.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

from gpulab import proc, report
from gpulab.chain import index, params

DEFAULT_CELL_TIMEOUT_S = 1800.0
DEFAULT_NOTEBOOK_TIMEOUT_S = 3600.0
HEARTBEAT_S = 15.0


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


@dataclass(frozen=True)
class NotebookResult:
    name: str
    status: str  # ok | failed | killed | skipped
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


def _cells_done(ipynb: Path) -> tuple[int, int, float]:
    """(cells finished, code cells, seconds inside cells) from papermill's per-cell metadata."""
    try:
        nb = json.loads(ipynb.read_text())
    except (OSError, ValueError):
        return 0, 0, 0.0
    code = [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]
    done = [c for c in code if c.get("metadata", {}).get("papermill", {}).get("status") == "completed"]
    secs = sum(float(c["metadata"]["papermill"].get("duration") or 0.0) for c in done)
    return len(done), len(code), secs


def notebook_error(ipynb: Path) -> str | None:
    """The first error a cell raised, as 'Name: message' (what a reader of the index needs first)."""
    try:
        nb = json.loads(ipynb.read_text())
    except (OSError, ValueError):
        return None
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []) or []:
            if out.get("output_type") == "error":
                return f"{out.get('ename', 'Error')}: {out.get('evalue', '')}".strip()
    return None


def render(ipynb: Path) -> tuple[Path | None, Path | None, str | None]:
    """Two HTML renderings: a no-input report for the team and the full notebook for engineers."""
    import nbformat
    from nbconvert import HTMLExporter

    try:
        nb = nbformat.read(str(ipynb), as_version=4)
        report_path = ipynb.with_suffix(".html")
        full_path = ipynb.with_suffix(".full.html")
        body, _ = HTMLExporter(exclude_input=True, exclude_input_prompt=True,
                               exclude_output_prompt=True).from_notebook_node(nb)
        report_path.write_text(body)
        body, _ = HTMLExporter().from_notebook_node(nb)
        full_path.write_text(body)
        return report_path, full_path, None
    except Exception as exc:  # a broken notebook file must not stop the chain
        return None, None, f"rendering failed: {type(exc).__name__}: {exc}"


def execute(nb_path: Path, out_ipynb: Path, param_file: Path, cfg: RunConfig, log: Path,
            progress: Callable[[str], None]) -> tuple[str, float, str | None]:
    """Run one notebook in a papermill child; returns (status, seconds, error)."""
    cmd = [sys.executable, "-m", "papermill", str(nb_path), str(out_ipynb), "-k", cfg.kernel,
           "--cwd", str(cfg.root), "-f", str(param_file), "--execution-timeout", str(int(cfg.cell_timeout_s)),
           "--no-progress-bar", "--log-level", "WARNING"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", MPLBACKEND="module://matplotlib_inline.backend_inline")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpulab-kernel-") as runtime:
        env["JUPYTER_RUNTIME_DIR"] = runtime  # kernel connection files: removed with the folder, whatever happens
        with proc.Child(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cfg.root, label=nb_path.stem) as child:
            next_beat = t0 + HEARTBEAT_S
            while (rc := child.wait(timeout=0.5)) is None:
                now = time.monotonic()
                if now - t0 > cfg.notebook_timeout_s:
                    child.stop(grace_s=3)
                    return "killed", now - t0, (f"killed after {now - t0:.0f} s: the notebook's wall-clock "
                                                f"limit is {cfg.notebook_timeout_s:.0f} s (--notebook-timeout)")
                if now >= next_beat:
                    done, total, _ = _cells_done(out_ipynb)
                    progress(f"    ... {nb_path.stem} running {now - t0:.0f} s (cell {done}/{total} done)")
                    next_beat = now + HEARTBEAT_S
    elapsed = time.monotonic() - t0
    if rc == 0:
        return "ok", elapsed, None
    err = notebook_error(out_ipynb)
    if err is None:
        tail = log.read_text(errors="replace").strip().splitlines()[-8:]
        err = "\n".join(tail) or f"papermill exited with {rc}"
    return "failed", elapsed, err


def _rel(path: Path | None, base: Path) -> str | None:
    return None if path is None else os.path.relpath(path, base)


def _summary(cfg: RunConfig, run_dir: Path, started: float, scenarios: list[ScenarioResult]) -> dict[str, Any]:
    return {
        "run_id": run_dir.name,
        "started": _dt.datetime.fromtimestamp(started).isoformat(timespec="seconds"),
        "duration_s": time.time() - started,
        "host": socket.gethostname(),
        "command": " ".join(sys.argv),
        "scenarios": [
            {"name": s.name, "description": s.description, "params": s.params,
             "notebooks": [asdict(n) for n in s.notebooks]} for s in scenarios],
    }


def write_index(run_dir: Path, summary: dict[str, Any]) -> Path:
    report.write_json(run_dir / "run.json", summary)
    path = run_dir / "index.html"
    path.write_text(index.render(summary))
    return path


def plan(cfg: RunConfig) -> tuple[list[Path], dict[str, params.ParamSpec], dict[str, tuple[dict, str]]]:
    """Everything that can be wrong with the input, checked before any notebook runs."""
    notebooks = discover(cfg.root, cfg.only)
    # The schema comes from every notebook, so a shared params file stays valid with --only.
    schema = params.notebook_schema(discover(cfg.root))
    resolved: dict[str, tuple[dict, str]] = {}
    problems = []
    for scen in cfg.scenarios:
        try:
            layered = params.resolve(cfg.root, scen, cfg.param_files, cfg.overrides)
            resolved[scen] = (params.validate(layered, schema), layered.description)
        except params.ParamError as exc:
            problems.append(f"scenario {scen!r}: {exc}")
    if problems:
        raise params.ParamError("\n".join(problems))
    return notebooks, schema, resolved


def run(cfg: RunConfig, progress: Callable[[str], None] | None = None) -> tuple[int, Path]:
    """Run the chain; returns (exit status, index.html). Raises ParamError before running on bad input."""
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    notebooks, schema, resolved = plan(cfg)
    out = (cfg.out or cfg.root / "outputs").resolve()
    run_dir = new_run_dir(out)
    _point_latest(out, run_dir)
    started = time.time()
    say(f"gpulab run {run_dir.name}: {len(cfg.scenarios)} scenario(s) x {len(notebooks)} notebook(s) -> {run_dir}")
    results: list[ScenarioResult] = []
    failed = False
    for scen in cfg.scenarios:
        values, description = resolved[scen]
        sc_dir = run_dir / scen
        (sc_dir / "logs").mkdir(parents=True)
        (sc_dir / "params.yaml").write_text(yaml.safe_dump(values, sort_keys=True))
        scen_result = ScenarioResult(scen, description, values)
        results.append(scen_result)
        status_of: dict[str, str] = {}
        for nb_path in notebooks:
            name = nb_path.stem
            missing = [n for n in needs(nb_path) if status_of.get(n, "ok") != "ok"]
            if missing:
                res = NotebookResult(name, "skipped", error=f"skipped: needs {', '.join(missing)}, which did not succeed")
                say(f"[{scen}] {name}: skipped (needs {', '.join(missing)})")
            else:
                nb_params = params.for_notebook(values, schema, name)
                nb_params["out_dir"] = str(sc_dir)
                if "scenario" in schema and name in schema["scenario"].notebooks:
                    nb_params["scenario"] = scen
                pfile = sc_dir / "logs" / f"{name}.params.yaml"
                pfile.write_text(yaml.safe_dump(nb_params, sort_keys=True))
                out_ipynb = sc_dir / f"{name}.ipynb"
                say(f"[{scen}] {name}: running")
                status, secs, err = execute(nb_path, out_ipynb, pfile, cfg, sc_dir / "logs" / f"{name}.log", say)
                _, _, cells_s = _cells_done(out_ipynb)
                t_render = time.monotonic()
                rep, full, render_err = render(out_ipynb) if out_ipynb.exists() else (None, None, "no notebook was written")
                render_s = time.monotonic() - t_render
                entry = report.load_metrics(sc_dir).get(name, {})
                res = NotebookResult(
                    name, status, secs, entry.get("headline"),
                    err or (render_err if status != "ok" else None),
                    _rel(out_ipynb if out_ipynb.exists() else None, run_dir), _rel(rep, run_dir),
                    _rel(full, run_dir), cells_s, render_s)
                say(f"[{scen}] {name}: {status} in {secs:.1f} s" + (f" - {err.splitlines()[0]}" if err else ""))
            status_of[name] = res.status
            failed |= res.status in ("failed", "killed")
            scen_result = replace(scen_result, notebooks=scen_result.notebooks + (res,))
            results[-1] = scen_result
            write_index(run_dir, _summary(cfg, run_dir, started, results))
    index_path = write_index(run_dir, _summary(cfg, run_dir, started, results))
    say(f"done in {time.time() - started:.0f} s: " + ("some notebooks FAILED" if failed else "all notebooks ok"))
    return (1 if failed else 0), index_path
