"""One notebook of the chain: executed by papermill in a gpulab.proc child, then rendered to HTML.

Two limits bound a notebook: papermill's per-cell execution timeout and our wall-clock limit, which stops
the whole tree when a kernel stalls (papermill has open bugs where it waits forever). Papermill saves the
notebook after every cell, so a stopped notebook keeps the cells it finished and is rendered like any other.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gpulab import proc, report

HEARTBEAT_S = 15.0


@dataclass(frozen=True)
class Execution:
    status: str                 # ok | failed | killed (wall-clock limit) | interrupted (a signal stopped the run)
    seconds: float
    error: str | None


def _code_cells(ipynb: Path) -> tuple[list[dict], list[dict]]:
    """(code cells, those papermill finished)."""
    try:
        nb = json.loads(ipynb.read_text())
    except (OSError, ValueError):
        return [], []
    code = [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]
    return code, [c for c in code if c.get("metadata", {}).get("papermill", {}).get("status") == "completed"]


def _seconds(cell: dict) -> float:
    return float(cell["metadata"]["papermill"].get("duration") or 0.0)


def cells_done(ipynb: Path) -> tuple[int, int, float]:
    """(cells finished, code cells, seconds inside cells) from papermill's per-cell metadata."""
    code, done = _code_cells(ipynb)
    return len(done), len(code), sum(map(_seconds, done))


def cell_seconds(ipynb: Path) -> list[tuple[float, str]]:
    """(seconds, first line) of each code cell papermill finished: where a notebook's time goes."""
    return [(_seconds(c), "".join(c.get("source", "")).strip().split("\n", 1)[0][:80]) for c in _code_cells(ipynb)[1]]


def first_error(ipynb: Path) -> str | None:
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


def last_progress(log: Path, notebook: str, chars: int = 4096) -> str | None:
    """The newest line a notebook wrote to the scenario's progress.log (gpulab.report.progress_log)."""
    try:
        with open(log, "rb") as fh:
            fh.seek(max(0, log.stat().st_size - chars))
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    prefix = f"{notebook}: "
    mine = [ln[len(prefix):] for ln in lines if ln.startswith(prefix)]
    return mine[-1][:160] if mine else None


class Ahead:
    """A notebook's papermill child started before its turn (gpulab.chain.ahead): papermill imported, kernel
    up, waiting for `go`. Its kernel's connection files live in a folder of its own, removed with it. `cwd` is
    the kernel's folder, and so the workload's: a user's `script:train.py` and its own relative paths are
    found where the user ran `gpulab run`, as `python train.py` would find them."""

    def __init__(self, nb_path: Path, out_ipynb: Path, param_file: Path, *, cwd: Path, kernel: str,
                 cell_timeout_s: float, log: Path, env: dict[str, str] | None = None):
        self.nb_path, self.out_ipynb, self.log = nb_path, out_ipynb, log
        self.went = False
        cmd = [sys.executable, "-m", "gpulab.chain.ahead", str(nb_path), str(out_ipynb), "-k", kernel,
               "--cwd", str(cwd), "-f", str(param_file), "--execution-timeout", str(int(cell_timeout_s))]
        child_env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1",
                         MPLBACKEND="module://matplotlib_inline.backend_inline")
        # Kernel connection files go to the runtime dir (jupyter_client) or the temp dir (nbclient): both point
        # into a folder that is removed when the notebook ends, however it ends.
        self._runtime = tempfile.TemporaryDirectory(prefix="gpulab-kernel-")
        child_env.update(JUPYTER_RUNTIME_DIR=self._runtime.name, TMPDIR=self._runtime.name)
        try:
            self.child = proc.Child(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
                                    env=proc.python_env(child_env), cwd=cwd, label=nb_path.stem)
        except BaseException:
            self._runtime.cleanup()
            raise

    def go(self) -> None:
        """Run the notebook now (a child that already died reads as its exit code)."""
        self.went = True
        try:
            self.child.stdin.write(b"go\n")
            self.child.stdin.close()
        except OSError:
            pass

    def close(self) -> None:
        """End it and everything it started, whether it ran (by then it has shut its kernel down and exited,
        or was stopped) or not (an idle kernel: nothing to lose)."""
        try:
            with contextlib.suppress(OSError):
                self.child.stdin.close()
            self.child.stop(grace_s=0 if self.went else 0.5)
        finally:
            self._runtime.cleanup()


def execute(ahead: Ahead, *, notebook_timeout_s: float, progress: Callable[[str], None],
            stopping: threading.Event | None = None) -> Execution:
    """Run the notebook of a started papermill child (`Ahead`) to its end, its wall-clock limit or an
    interrupt; the child is ended either way. `stopping` set by another thread (an interrupt while scenarios
    run in parallel) stops it as `interrupted`."""
    nb_path, out_ipynb, log = ahead.nb_path, ahead.out_ipynb, ahead.log
    t0 = time.monotonic()
    try:
        child = ahead.child
        ahead.go()
        next_beat = t0 + HEARTBEAT_S
        while (rc := child.wait(timeout=0.25)) is None:
            now = time.monotonic()
            if stopping is not None and stopping.is_set():
                child.stop(grace_s=1)
                return Execution("interrupted", now - t0, "the run was interrupted while this notebook ran")
            if now - t0 > notebook_timeout_s:
                child.stop(grace_s=3)
                return Execution("killed", now - t0, f"stopped after {now - t0:.0f} s: the notebook's "
                                 f"wall-clock limit is {notebook_timeout_s:.0f} s (--notebook-timeout)")
            if now >= next_beat:
                done, total, _ = cells_done(out_ipynb)
                last = last_progress(out_ipynb.parent / "progress.log", nb_path.stem)
                where = f"cell {done}/{total} done" if total else "its kernel starting"   # no cell saved yet
                progress(f"    ... {nb_path.stem} running {now - t0:.0f} s ({where})" + (f": {last}" if last else ""))
                next_beat = now + HEARTBEAT_S
    finally:
        ahead.close()
    elapsed = time.monotonic() - t0
    if stopping is not None and stopping.is_set():
        return Execution("interrupted", elapsed, "the run was interrupted while this notebook ran")
    if rc == 0:
        return Execution("ok", elapsed, None)
    err = first_error(out_ipynb)
    if err is None:
        tail = log.read_text(errors="replace").strip().splitlines()[-8:] if log.exists() else []
        err = "\n".join(tail) or f"papermill exited with {rc}"
    return Execution("failed", elapsed, err)


KERNEL_DIED_STARTING = "Kernel died before replying to kernel_info"   # jupyter_client's words


def died_starting(ex: Execution, out_ipynb: Path) -> bool:
    """The notebook failed because its kernel died while starting, before any cell ran: nothing of the notebook
    happened, so running it again cannot repeat a side effect. Kernels started many at once (notebooks side by
    side, scenarios in parallel) can lose that race (a port taken between being picked and bound)."""
    started = [c for c in _code_cells(out_ipynb)[0]   # papermill marks a failed start's cells completed, untimed
               if c.get("metadata", {}).get("papermill", {}).get("start_time")]
    return ex.status == "failed" and KERNEL_DIED_STARTING in (ex.error or "") and not started


TEMPLATES = Path(__file__).resolve().parent / "templates"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = ("(an interactive control: it works in JupyterLab; this page shows the static table or plot it "
               "controls above)")
_BODY = re.compile(r"<body[^>]*>")


def static(nb, team: bool):
    """The notebook as a reader of a static page meets it: widgets become a sentence (a static page cannot
    run them; an empty box says nothing), and in the team report stderr (progress, warnings) is left out."""
    import nbformat

    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    for cell in nb.cells:
        outs = []
        for out in cell.get("outputs", []):
            if WIDGET_VIEW in out.get("data", {}):
                outs.append(nbformat.v4.new_output("display_data", data={"text/plain": WIDGET_NOTE}))
            elif team and out.get("output_type") == "stream" and out.get("name") == "stderr":
                continue
            else:
                outs.append(out)
        if "outputs" in cell:
            cell["outputs"] = outs
    nb.metadata.pop("widgets", None)
    return nb


def nav(ipynb: Path, team: bool) -> str:
    """A bar back to the run's index (every report links back), and to the other renderings."""
    other = (ipynb.with_suffix(".full.html").name, "with code") if team else (ipynb.with_suffix(".html").name,
                                                                             "report without code")
    return (f'<nav class="gpulab-nav"><a href="../index.html">&#8592; run index</a>'
            f'<a href="{report.url(other[0])}">{other[1]}</a><a href="{report.url(ipynb.name)}">notebook (.ipynb)</a>'
            f"<a href=\"./\">all products (folder)</a></nav>")


_EXPORTERS: dict[bool, object] = {}   # team report (no input) / full notebook -> its HTMLExporter, built once
_RENDER_LOCK = threading.Lock()       # scenario threads render one at a time (an exporter is not thread-safe)


def _exporter(team: bool):
    """The HTMLExporter for one rendering, built once a run (its templates compile in ~0.2 s)."""
    if team not in _EXPORTERS:
        from nbconvert import HTMLExporter
        _EXPORTERS[team] = HTMLExporter(template_name="gpulab", extra_template_basedirs=[str(TEMPLATES)],
                                        exclude_input=team, exclude_input_prompt=team, exclude_output_prompt=team)
    return _EXPORTERS[team]


def preload_renderer() -> None:
    """Import nbconvert and build the exporters in the background while the first notebook runs (about 1 s
    that its render would otherwise wait for)."""
    def load() -> None:
        with contextlib.suppress(Exception), _RENDER_LOCK:
            _exporter(True)
            _exporter(False)
    threading.Thread(target=load, name="gpulab-preload-nbconvert", daemon=True).start()


def render(ipynb: Path) -> tuple[Path | None, Path | None, str | None]:
    """Two self-contained HTML renderings (no request to any other host): a no-input report for the team
    and the full notebook for engineers."""
    import nbformat

    try:
        nb = nbformat.read(str(ipynb), as_version=4)
        paths = []
        for team, path in ((True, ipynb.with_suffix(".html")), (False, ipynb.with_suffix(".full.html"))):
            with _RENDER_LOCK:
                body, _ = _exporter(team).from_notebook_node(static(nb, team))
            body = _BODY.sub(lambda m: m.group(0) + nav(ipynb, team), body, count=1)
            report.write_text(path, body)
            paths.append(path)
        return paths[0], paths[1], None
    except OSError:
        raise  # a full disk is the run's problem, not this notebook's
    except Exception as exc:  # a broken notebook file must not stop the chain
        return None, None, f"rendering failed: {type(exc).__name__}: {exc}"
