"""The captures of a job that stalls again and again under --on-stall keep, for days: each taken in a forked copy
of the watchdog (`apart`: its memory goes with the copy), the folders thinned to the first and the latest
(`thin_captures`), a stall that recovered lightened to its verdict and tails (`lighten`)."""
from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import time
import warnings
from pathlib import Path
from typing import Callable

from gpulab import proc, report
from gpulab.report import write_json

APART_LIMIT_S = 300.0    # a capture's forked copy gets this long (captures take seconds; 29 s seen under load)
MAX_CAPTURES = 4         # capture folders kept under keep: the first and the latest half each (the verdict lists every stall)


def apart(capture_fn: Callable[[], dict]) -> dict:
    """capture_fn() (a stall's capture under keep: files in its folder, -> its record) run in a forked copy of
    the watchdog, its record sent back as JSON; run here when the copy cannot do it (no fork, it failed).

    Why: a capture reads the op logs into ~100 MB of short-lived Python objects (a ring of 131072 records).
    In this process the few objects allocated meanwhile that outlive it (the record, the status thread's
    samples, the re and glob caches) each pin one of pymalloc's 1 MiB arenas, which are given back only
    when empty: measured, 12 arenas a stall stayed, and the watchdog grew by ~7 MB a stall however often it
    collected and trimmed. The copy's memory goes with it; the watchdog keeps the record only."""
    try:
        r, w = os.pipe()
    except OSError:
        return capture_fn()
    try:
        with warnings.catch_warnings():   # 3.12+ warns of fork with threads running: the copy takes none of
            warnings.simplefilter("ignore", DeprecationWarning)   # their locks (status writer, tees)
            pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return capture_fn()
    if pid == 0:   # the copy: never back into the watchdog's code, nor its exit handlers (they stop the job)
        code = 1
        try:
            os.close(r)
            with contextlib.suppress(ValueError):   # an interrupt ends the copy; the watchdog handles its own
                for sig in proc.HANDLED_SIGNALS:
                    signal.signal(sig, signal.SIG_DFL)
            data = json.dumps(capture_fn()).encode()
            code = 0
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
        except BaseException:  # noqa: BLE001 - the watchdog captures again itself
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    chunks: list[bytes] = []
    read = False
    deadline = time.monotonic() + APART_LIMIT_S
    try:
        # bounded: a copy forked while another thread held a lock it then needs would wait forever; past the
        # limit it is killed and the capture runs here
        while (left := deadline - time.monotonic()) > 0 and select.select([r], [], [], left)[0]:
            chunk = os.read(r, 1 << 16)
            if not chunk:
                read = True
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        if not read:   # interrupted meanwhile, or past the limit: the copy goes
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    try:
        if read:
            return json.loads(b"".join(chunks))
    except ValueError:
        pass
    return capture_fn()


def release() -> None:
    """After a capture: what it left in this process given back to the system (all of a capture run here when
    apart could not fork: a ring of 131072 records is ~100 MB of Python objects)."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)   # glibc keeps freed heap otherwise


def lighten(cap: Path, rec: dict) -> None:
    """A stall that recovered keeps its verdict, stacks and op-log tails, not its copies of the op logs (MBs
    each): the folder then grows by little per usual pause, however many a job of days takes. Its per-process
    files (a few hundred bytes each, one disk block each, dozens for a job with DataLoader workers) are
    folded into one procs.json, name -> text."""
    dropped = [p for p in (cap / "ops.log", *(cap / "procs").glob("*.log")) if p.is_file()]
    for p in dropped:
        p.unlink()
    if (cap / "procs").is_dir():
        small = {p.name: p.read_text(errors="replace") for p in sorted((cap / "procs").iterdir()) if p.is_file()}
        write_json(cap / "procs.json", small)
        shutil.rmtree(cap / "procs", ignore_errors=True)
    data = report.read_json(cap / "verdict.json", default=None)
    if data is not None:
        data["stall"] = rec
        data["log"] = {**data.get("log", {}), "op_log": None}
        data["notes"] = [*data.get("notes", []), f"the job recovered after {rec['for_s']:.1f} s (the capture "
                         f"itself included): the op logs copied at the stall were dropped, their tails kept, the "
                         f"per-process files folded into procs.json"]
        write_json(cap / "verdict.json", data)


def thin_captures(root: Path, limit: int = MAX_CAPTURES) -> None:
    """Keep the first and the latest capture folders of a job that stalls again and again."""
    caps = sorted(p for p in root.iterdir() if p.is_dir() and p.name.isdigit())
    half = limit // 2
    for p in caps[half:-half] if len(caps) > limit else ():
        shutil.rmtree(p, ignore_errors=True)
