"""The fix registry: one module per fix in the project's patches/ folder (plus the folders in
$GPULAB_PATCHES, os.pathsep-separated, for a team's own fixes and for tests), each defining `FIX`; where they
live and their names without loading them are gpulab.fixindex's (01's rules read it, below gpulab.fixes).

The registry is the single source of fix names: scenario files, 01's risk rules, `gpulab fixes` and the
children all resolve names here, so a typo fails before anything runs, naming the fixes there are.
Modules are loaded without torch (their `apply` imports it when the child calls it).
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Iterable, Sequence

from gpulab.fixes.fix import Fix, FixError, UnknownFix
from gpulab.fixindex import ENV_DIRS, dirs, files, project_dir  # noqa: F401  where fixes live: one place, below env

_CACHE: dict[tuple[str, ...], dict[str, Fix]] = {}


def _load(path: Path) -> Fix:
    mod_name = f"gpulab_patches.{path.stem}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise FixError(f"cannot load fix module {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    fix = getattr(module, "FIX", None)
    if not isinstance(fix, Fix):
        raise FixError(f"{path}: a fix module must define FIX = Fix(...) (gpulab.fixes.fix.Fix)")
    if fix.name != path.stem:
        raise FixError(f"{path}: FIX.name {fix.name!r} must be the file's name {path.stem!r}")
    return fix


def load(folders: Iterable[Path] | None = None) -> dict[str, Fix]:
    """name -> Fix for every patches/*.py (files starting with '_' are helpers or templates)."""
    key = tuple(str(d) for d in (dirs() if folders is None else folders))
    if key not in _CACHE:
        found: dict[str, Fix] = {}
        where: dict[str, Path] = {}
        for path in files(key):
            fix = _load(path)
            if fix.name in found:
                raise FixError(f"fix {fix.name!r} is defined twice: {where[fix.name]} and {path}")
            found[fix.name], where[fix.name] = fix, path
        _CACHE[key] = found
    return _CACHE[key]


def names() -> tuple[str, ...]:
    return tuple(sorted(load()))


def get(name: str) -> Fix:
    fixes = load()
    if name not in fixes:
        raise UnknownFix(f"unknown fix {name!r}; known fixes: {', '.join(sorted(fixes)) or '(none in patches/)'}")
    return fixes[name]


def resolve(fix_names: Sequence[str]) -> tuple[Fix, ...]:
    """Names -> fixes, in order, each once; an unknown or repeated name is an error naming the choices."""
    names_ = [str(n).strip() for n in fix_names]
    dup = sorted({n for n in names_ if names_.count(n) > 1})
    if dup:
        raise UnknownFix(f"fix(es) {', '.join(map(repr, dup))} listed more than once")
    return tuple(get(n) for n in names_)


def targeting(cls: str | None) -> tuple[str, ...]:
    """The fixes meant for a hang class (03's verdict), in name order."""
    return tuple(n for n, f in sorted(load().items()) if cls and cls in f.targets)


def catalog() -> dict[str, str]:
    """name -> what it changes: what 01's rules and the notebooks show beside a name."""
    return {n: f.changes for n, f in sorted(load().items())}
