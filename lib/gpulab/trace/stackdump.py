"""Every thread's Python stack on SIGUSR1 (faulthandler), the watchdog's way to see a stalled job, for the whole
life of a recorded process, its teardown included.

Why the teardown: at the end of finalization CPython gives SIGUSR1 back to the handler faulthandler found, the
default one, which terminates; native teardown (libtorch's static destructors, seconds on a loaded machine) still
runs after it. A watchdog that took that quiet teardown for a stall and asked for stacks killed a job that was
ending well, and the verdict called it a crash in the program's own code (seen: `--on-stall keep` on 2 cores).
"""
from __future__ import annotations

import atexit
import faulthandler
import signal
from typing import TextIO


def install(fh: TextIO) -> None:
    """Fatal errors and SIGUSR1 dump every thread into fh; from the program's exit on, a SIGUSR1 that finds
    faulthandler gone is ignored, not fatal."""
    faulthandler.enable(file=fh)
    faulthandler.register(signal.SIGUSR1, file=fh, all_threads=True)
    atexit.register(ignore_after_finalization, fh)   # registered first, so it runs after the program's own


def ignore_after_finalization(fh: TextIO) -> None:
    """Register again over SIG_IGN, so the handler restored at finalization ignores the signal. Set at exit, not at
    start: an ignored signal stays ignored across exec, and the program's own children must start as without
    gpulab. Blocked in this thread meanwhile: a SIGUSR1 during the swap waits and is dumped."""
    if fh.closed:
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        faulthandler.unregister(signal.SIGUSR1)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        faulthandler.register(signal.SIGUSR1, file=fh, all_threads=True)
    except ValueError:   # not the main thread (an embedded interpreter): the default, as before
        pass
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
