"""Where gpulab's own data lives (notebooks/, params/, patches/), and where a run's folder goes by default.

Why one lookup: `gpulab run`, `gpulab params`, the scenario files and the fix registry must read the same
copy. A gpulab checkout overrides the copy installed with the package, so that editing a notebook or a
scenario in a checkout takes effect; a user's own project folder is never taken for one (it is where the
workload runs and the run folder lands, ./gpulab-runs/). Stdlib only: the registry and the root modules
call it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ENV_ROOT = "GPULAB_ROOT"
PACKAGE_DATA = Path(__file__).resolve().parent / "_data"   # what the wheel ships (setup.py copies it in)
SOURCE_TREE = Path(__file__).resolve().parents[2]          # the checkout this package was imported from, if any
RUNS_FOLDER = "gpulab-runs"                                 # ./gpulab-runs/<run-id> outside a checkout


@dataclass(frozen=True)
class Project:
    root: Path      # holds notebooks/, params/ and patches/
    found_by: str   # "GPULAB_ROOT" | "cwd" (a checkout at or above it) | "source tree" | "installed"


def is_checkout(folder: Path) -> bool:
    """A gpulab checkout (or a project laid out like one): numbered notebooks and params/scenarios/. A user's
    own notebooks/ and params/ folders are not enough."""
    return ((folder / "params" / "scenarios").is_dir() and (folder / "notebooks").is_dir()
            and any((folder / "notebooks").glob("[0-9][0-9]_*.ipynb")))


def find(cwd: str | Path | None = None) -> Project:
    """$GPULAB_ROOT, else a checkout at or above cwd, else the checkout this package runs from, else the copy
    installed with the package. Raises FileNotFoundError naming what it looked for."""
    given = os.environ.get(ENV_ROOT)
    if given:
        root = Path(given).expanduser().resolve()
        if not is_checkout(root):
            raise FileNotFoundError(f"{ENV_ROOT}={given!r} is not a gpulab project (it needs notebooks/NN_*.ipynb "
                                    f"and params/scenarios/); unset it to use the installed notebooks")
        return Project(root, ENV_ROOT)
    here = Path(cwd or os.getcwd()).resolve()
    for cand in (here, *here.parents):
        if is_checkout(cand):
            return Project(cand, "cwd")
    if is_checkout(SOURCE_TREE):
        return Project(SOURCE_TREE, "source tree")
    if is_checkout(PACKAGE_DATA):
        return Project(PACKAGE_DATA, "installed")
    raise FileNotFoundError(f"no gpulab notebooks: none at or above {here}, none in {SOURCE_TREE} and none "
                            f"installed in {PACKAGE_DATA} (reinstall gpulab, or set {ENV_ROOT} to a checkout)")


def root(cwd: str | Path | None = None) -> Path:
    return find(cwd).root


def patches_dir() -> Path:
    """The fix registry's patches/ (gpulab.fixindex calls this). $GPULAB_ROOT/patches as given, and the source
    tree's when nothing is found: a registry with no fixes, not an error in every reader of fix names.
    A project found through the cwd that has no patches/ of its own (a throwaway project of notebooks and
    scenarios) keeps gpulab's own fixes: its scenarios name them."""
    if os.environ.get(ENV_ROOT):
        return Path(os.environ[ENV_ROOT]).expanduser().resolve() / "patches"
    try:
        found = root() / "patches"
    except FileNotFoundError:
        found = None
    for cand in (found, SOURCE_TREE / "patches", PACKAGE_DATA / "patches"):
        if cand is not None and cand.is_dir():
            return cand
    return SOURCE_TREE / "patches"


def default_runs(cwd: str | Path | None = None) -> Path:
    """Where run folders go without --out: the checkout's outputs/ when working inside it, else
    ./gpulab-runs/ in the caller's folder (as pytest or py-spy leave their files where they are run)."""
    here = Path(cwd or os.getcwd()).resolve()
    try:
        proj = find(here)
    except FileNotFoundError:
        return here / RUNS_FOLDER
    inside = here == proj.root or proj.root in here.parents
    return proj.root / "outputs" if inside else here / RUNS_FOLDER
