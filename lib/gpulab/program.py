"""Run a Python program in this process as `python` would: `SCRIPT.py [ARGS...]` or `-m MODULE [ARGS...]`.

Why one function: the children that run a user's program (`python -m gpulab.trace`, under the recorder, and
`python -m gpulab.fixes.child`, with a scenario's fixes only) must run it alike, or what one of them sees
(its exit code, a timing) would not be the program's own under the other. Stdlib only: it runs in those
children before the program and must load nothing the program expects to import fresh.
"""
from __future__ import annotations

import os
import runpy
import sys
import traceback


def run(target: list[str]) -> int:
    """Run `target` as __main__ with the sys.argv and sys.path[0] that python gives it; the exit code:
    SystemExit's (a code that is not an int is printed, exit 1), 1 after the traceback of an exception, else
    0. The caller checks the target's shape (a module after -m)."""
    try:
        if target[0] == "-m":
            sys.argv = [target[1], *target[2:]]  # run_module(alter_sys=True) puts the module's path in argv[0]
            sys.path[0] = os.getcwd()
            runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        else:
            script = target[0]
            sys.argv = list(target)
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        c = exc.code
        if not isinstance(c, (int, type(None))):
            print(c, file=sys.stderr)
        return 0 if c is None else c if isinstance(c, int) else 1
    except BaseException:  # noqa: BLE001 - as python does: traceback, exit 1
        traceback.print_exc()
        return 1
    return 0
