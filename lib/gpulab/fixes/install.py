"""The child's side: install the `apply` parts of the fixes named in $GPULAB_FIXES, before the program runs.

Every gpulab child entry point calls `install_from_env()` (the trace bootstrap after a planted fault and
before the recorder, so the recorder sees the program's own ops and a fault sees the fixed ones; the oracle
child; the benchmark worker; `python -m gpulab.fixes.child`). The `env` parts are already in the
environment: the parent set them before this process started, when the libraries read them.
"""
from __future__ import annotations

import os
import sys
from typing import Mapping

from gpulab.fixes import registry
from gpulab.fixes.compose import FIXES_VAR, active

MARK = "gpulab.fixes: installed"
_DONE: list[str] = []


def install(names: tuple[str, ...]) -> tuple[str, ...]:
    """Apply each fix's runtime part once per process; announce it on stderr (the run's log says so)."""
    fixes = registry.resolve(names)
    for fx in fixes:
        if fx.apply is not None and fx.name not in _DONE:
            fx.apply()
            _DONE.append(fx.name)
    if fixes:
        print(f"{MARK} {','.join(f.name for f in fixes)}", file=sys.stderr, flush=True)
    return tuple(f.name for f in fixes)


def install_from_env(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The fixes of $GPULAB_FIXES (names), installed; () when it is unset."""
    env = os.environ if environ is None else environ
    if not env.get(FIXES_VAR):
        return ()
    return install(active(env))
