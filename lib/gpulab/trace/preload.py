"""What a recorded child runs before the program, named by its parent in $GPULAB_PRELOAD ("module:function", comma
separated, called in order): a planted fault (gpulab.hang.faults.plant_from_env, first, so the fixes sit above it),
the scenario's fixes (gpulab.fixes.install.install_from_env), in the root process and in every followed process
of a job.

Why by name: the recorder sits below gpulab.hang and gpulab.fixes in the layer order, so it imports neither; the
parent that composes them (gpulab.hang.faults.child_env, gpulab.fixes.scenario_env) names what to call, and the
child only calls it. A name that cannot be imported is an error: a scenario whose
fixes silently did not install would be judged as if they had."""
from __future__ import annotations

import importlib
import os
from typing import Mapping

ENV = "GPULAB_PRELOAD"


def run(environ: Mapping[str, str] | None = None) -> list[str]:
    """Call each function $GPULAB_PRELOAD names, in order; -> the names called."""
    env = os.environ if environ is None else environ
    done = []
    for item in (x.strip() for x in env.get(ENV, "").split(",")):
        if not item:
            continue
        mod, _, func = item.partition(":")
        if not mod or not func:
            raise ValueError(f"{ENV}={env.get(ENV)!r}: {item!r} is not module:function")
        getattr(importlib.import_module(mod), func)()
        done.append(item)
    return done
