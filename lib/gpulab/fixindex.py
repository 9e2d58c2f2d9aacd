"""Which fixes there are and what each changes, read from the fix modules' text without running them.

Why apart from gpulab.fixes.registry (which loads each module's `FIX`): 01's risk rules (gpulab.env) name
fixes and show what they change, and env sits below gpulab.fixes in the layer order; a fix module imports
gpulab.fixes, so loading one from env would import upward. The registry reads its folders here, so both agree
on where fixes live (`project_dir`, the one place that says so) and on their names (a module's file name,
which the registry checks against `FIX.name`).
"""
from __future__ import annotations

import ast
import os
from pathlib import Path

from gpulab import project

ENV_DIRS = "GPULAB_PATCHES"


def project_dir() -> Path:
    """patches/ of the project gpulab.project finds (a checkout overrides the copy installed with gpulab)."""
    return project.patches_dir()


def dirs() -> tuple[Path, ...]:
    """The project's patches/, then each folder of $GPULAB_PATCHES (os.pathsep-separated)."""
    extra = [Path(p) for p in os.environ.get(ENV_DIRS, "").split(os.pathsep) if p.strip()]
    return tuple(dict.fromkeys([project_dir(), *extra]))


def files(folders=None) -> list[Path]:
    """Every fix module (files starting with '_' are helpers or templates), folder by folder."""
    return [p for d in map(Path, dirs() if folders is None else folders) if d.is_dir()
            for p in sorted(d.glob("[!_]*.py"))]


def names() -> tuple[str, ...]:
    return tuple(sorted({p.stem for p in files()}))


def changes(path: Path) -> str:
    """What the module's `FIX = Fix(name, changes, ...)` says it changes, when written as a literal (as every
    fix in patches/ is); else the first line of the module's docstring."""
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "FIX" for t in node.targets) \
                and isinstance(node.value, ast.Call):
            call = node.value
            arg = call.args[1] if len(call.args) > 1 else next(
                (k.value for k in call.keywords if k.arg == "changes"), None)
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                return arg.value
    return (ast.get_docstring(tree) or path.stem).strip().splitlines()[0]


def catalog() -> dict[str, str]:
    """name -> what it changes (the first folder that has the name wins, as the registry refuses twice)."""
    out: dict[str, str] = {}
    for p in files():
        out.setdefault(p.stem, changes(p))
    return dict(sorted(out.items()))
