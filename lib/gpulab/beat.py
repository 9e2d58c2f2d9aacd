"""The heartbeat of a watched Python program: a file whose record changes only while the main thread makes
Python progress, so a watcher outside can tell a program that works from one that only burns CPU.

Why both tests, in each ~0.1 s window:
- the main thread ran Python bytecode: a pending call (`Py_AddPendingCall`) runs only in the main thread and
  only between two bytecodes, so it runs iff the main thread executes Python. CPU alone is not enough: a
  host thread spinning inside a driver call (a kernel launch under CUDA_LAUNCH_BLOCKING=1, cuInit) burns
  CPU without running any bytecode;
- the main thread's CPU time grew by at least 5% of the window. Bytecode alone is not enough: a polling
  loop (DataLoader's main loop waking on a queue while a worker is stuck) runs bytecode with ~no CPU.

A beat in a window where the main thread is loading code, inside an import (an importlib frame on its stack)
or a compilation (torch.compile's entry points: dynamo tracing a frame, Inductor compiling a graph), is also
counted apart: torch does both inside ops (a custom op's first call imports torch._dynamo: 1.6 s on a 2-core
CPU, more under load; a compiled step compiles its backward lazily, inside the autograd node that runs it, tens
of seconds with a cold cache), and a watcher that judges an open op by its completion alone would call that a
hang (gpulab.trace.liveness counts such beats as progress inside an op).

The child side is `start(path)` (or `start_from_env()`, when $GPULAB_BEAT names the file): a daemon thread
`gpulab-beat` that, in each window where both hold, writes (pid, beats, monotonic time, beats while
loading code) at offset 0 of the file. The parent side is `read(path)`: the raw record; a watcher compares two
of them. Standard library only, cheap to import: it starts before the program imports anything heavy.
"""
from __future__ import annotations

import ctypes
import os
import struct
import sys
import threading
import time
from typing import Callable

ENV = "GPULAB_BEAT"
THREAD_NAME = "gpulab-beat"
INTERVAL_S = 0.1
CPU_SHARE = 0.05          # of the window's wall time, in main-thread CPU time
RECORD = struct.Struct("<qqdq")   # pid, beats, time.monotonic() of the last beat, beats while loading code
_IMPORTLIB = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
# where torch.compile compiles (dynamo tracing a frame, Inductor compiling a graph: forward, or a backward
# compiled lazily), function to file: the same files hold wrappers that run compiled code (cudagraphify's run),
# and a stuck compiled region is no compilation. Keyed by name, so that almost every frame costs one lookup
_COMPILING = {"_compile": "torch/_dynamo/convert_frame.py",
              "compile_fx_inner": "torch/_inductor/compile_fx.py", "_compile_fx_inner": "torch/_inductor/compile_fx.py"}

_PENDING = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_thread: threading.Thread | None = None
_lock = threading.Lock()


class _BytecodeProbe:
    """Whether the main thread ran Python since the last check: one pending call outstanding at a time."""

    def __init__(self) -> None:
        ran = [0]

        def _ran(_arg, _ran=ran):   # no module globals: it may run while the interpreter tears them down
            _ran[0] += 1
            return 0

        self._ran, self._seen, self._outstanding = ran, 0, False
        self._fn = _PENDING(_ran)
        # never freed: a call still queued at exit may run during teardown, after this object is gone
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(self._fn))
        self._add = ctypes.PYFUNCTYPE(ctypes.c_int, _PENDING, ctypes.c_void_p)(("Py_AddPendingCall",
                                                                                   ctypes.pythonapi))

    def check(self) -> bool:
        ran = self._ran[0] != self._seen
        self._seen = self._ran[0]
        if ran or not self._outstanding:
            self._outstanding = self._add(self._fn, None) == 0   # -1: the queue is full; ask next window
        return ran


def _main_cpu_clock(main: threading.Thread) -> Callable[[], float]:
    """CPU seconds of the main thread: its pthread CPU clock, else /proc/self/task/<tid>/stat."""
    try:
        clock = time.pthread_getcpuclockid(main.ident)
        time.clock_gettime(clock)
        return lambda: time.clock_gettime(clock)
    except (AttributeError, OSError, TypeError):
        path, tick = f"/proc/self/task/{main.native_id}/stat", os.sysconf("SC_CLK_TCK")

        def from_proc() -> float:
            try:
                with open(path, "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
                return (int(fields[11]) + int(fields[12])) / tick
            except (OSError, ValueError, IndexError):
                return 0.0
        return from_proc


def _loading(ident: int | None) -> bool:
    """Is the thread importing or compiling (such a frame anywhere on its stack)?"""
    f = sys._current_frames().get(ident) if ident is not None else None
    while f is not None:
        code = f.f_code
        where = _COMPILING.get(code.co_name)
        if code.co_filename in _IMPORTLIB or (where is not None and _torch_part(code.co_filename) == where):
            return True
        f = f.f_back
    return False


def _torch_part(filename: str) -> str:
    """'torch/_dynamo/x.py' from any install's path to it, else ''."""
    path = filename.replace("\\", "/")
    i = path.rfind("torch/_")
    return path[i:] if i >= 0 else ""


def _loop(fd: int, pid: int, probe: _BytecodeProbe, cpu: Callable[[], float], main: int | None = None) -> None:
    beats = loads = 0
    probe.check()
    t_prev, c_prev = time.monotonic(), cpu()
    while True:
        time.sleep(INTERVAL_S)
        now, c = time.monotonic(), cpu()
        if probe.check() and c - c_prev >= CPU_SHARE * (now - t_prev):
            beats += 1
            loads += _loading(main)
            try:
                os.pwrite(fd, RECORD.pack(pid, beats, now, loads), 0)
            except OSError:
                return   # the file is gone or the disk is full: no more beats (the watcher sees a stall)
        t_prev, c_prev = now, c


def start(path: str | os.PathLike) -> threading.Thread:
    """Create the beat file (0 beats) and start the beat thread; a second call returns the running thread."""
    global _thread
    with _lock:
        if _thread is not None:
            return _thread
        pid = os.getpid()
        fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
        os.pwrite(fd, RECORD.pack(pid, 0, time.monotonic(), 0), 0)
        main = threading.main_thread()
        _thread = threading.Thread(target=_loop, args=(fd, pid, _BytecodeProbe(), _main_cpu_clock(main), main.ident),
                                   name=THREAD_NAME, daemon=True)
        _thread.start()
        return _thread


def _forget() -> None:
    """A fork() child has no beat thread (only the forking thread survives): let start() make one."""
    global _thread, _lock
    _thread, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget)


def start_from_env() -> threading.Thread | None:
    """Start the beat when $GPULAB_BEAT names a file (taken out of the environment, so that the program's
    own Python children do not write the same file); otherwise do nothing."""
    path = os.environ.pop(ENV, "")
    return start(path) if path else None


def read(path: str | os.PathLike) -> bytes | None:
    """The raw record (compare two: a change is a beat), or None when there is no beat file (yet)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(RECORD.size)
    except OSError:
        return None
    return data if len(data) == RECORD.size else None


def beats(record: bytes | None) -> int | None:
    """How many beats a record counts (for people and tests; a watcher compares raw records)."""
    return None if record is None else RECORD.unpack(record)[1]


def loads(record: bytes | None) -> int | None:
    """How many of its beats came while the main thread was importing or compiling."""
    return None if record is None else RECORD.unpack(record)[3]
