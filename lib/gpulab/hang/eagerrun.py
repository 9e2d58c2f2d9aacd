"""A crash inside torch.compile'd code, named by the same program run once eager.

The kernels torch.compile generates fuse many ops into one and know only their temporaries (tmp2): a failed
bound check, a segfault or an illegal address inside them names no op and no line of the program (torch 2.11's
CPU kernels do not even check an index: the process just segfaults). Run eager (TORCHDYNAMO_DISABLE=1; with
CUDA_LAUNCH_BLOCKING=1, so that an asynchronous CUDA error surfaces at its own op), the same data meets
PyTorch's own op, which names itself in its error, and the traceback has the program's line. One bounded run
without the recorder, as memcheck's; `read` is pure (tested on real stderr), `run` the one part that starts a
process. A run that ends well eager puts the fault in the compiled code (or one that does not recur).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpulab import lastwords, proc
from gpulab.hang import classify
from gpulab.hang.owner import compiled_op, origin, short, traceback_frames

ENV = {"TORCHDYNAMO_DISABLE": "1", "CUDA_LAUNCH_BLOCKING": "1"}
TIMEOUT_S = 90.0            # bounded as memcheck is: the verdict must not wait long for a slow program
STDERR = "eager_rerun.stderr.txt"


@dataclass(frozen=True)
class Rerun:
    """How the eager run ended, and where, in the program's words."""
    ran: bool
    status: str = ""                 # error | crash | ok | timeout ('' when it did not run)
    returncode: int | None = None
    cls: str | None = None           # what its last words say (classify's classes), None when they say no class
    said: str = ""                   # the line that says it (the exception, the device assert)
    place: str = ""                  # the innermost line of the program's own in its traceback ("x.py:20 in forward")
    called_from: tuple[str, ...] = ()   # the program's lines outside it, innermost first
    seconds: float = 0.0
    note: str = ""                   # why it did not run, or what stopped it
    stderr: str | None = None        # its stderr, kept beside the verdict

    def to_dict(self) -> dict:
        return asdict(self)

    def facts(self, region: str) -> list[str]:
        head = f"the eager rerun (TORCHDYNAMO_DISABLE=1 CUDA_LAUNCH_BLOCKING=1) of the crash in {region}"
        if not self.ran:
            return [f"{head}: not run ({self.note})"]
        if self.status == "ok":
            return [f"{head} ran to its end in {self.seconds:g} s: eager, the same program does not fail"]
        if self.status == "timeout":
            return [f"{head} was stopped at its {self.note} deadline before it failed"]
        at = f" at {self.place}" + (f", called from {self.called_from[0]}" if self.called_from else "") \
            if self.place else " (no line of the program's in its traceback)"
        return [f"{head} ended ({self.status}) in {self.seconds:g} s{at}: {classify.brief(self.said)}"
                + (f" (class {self.cls})" if self.cls else "")]


def region(v: Mapping[str, Any]) -> str | None:
    """The compiled region (or the kernel torch.compile generated) the failed run was in, else None."""
    op = compiled_op(v)
    return op["name"] if op else None


def applies(v: Mapping[str, Any], env: Mapping[str, str]) -> bool:
    """A crash or an error inside compiled code whose own words name no op of the program's: a fault class, or
    no class at all (a segfault). An exception raised at the program's call names its line already; a planted
    fault is not planted again eager."""
    if v.get("status") not in ("crash", "error") or str(env.get("TORCHDYNAMO_DISABLE", "")) in ("1", "true"):
        return False
    if v.get("planted"):   # a self-test's fault is planted by the recorder, which the plain rerun does not run
        return False
    cls = v.get("class")
    return region(v) is not None and (cls in (None, "", "unknown") or cls in classify.FAULT_CLASSES)


def read(text: str, returncode: int | None, timed_out: bool, seconds: float = 0.0, timeout_s: float = TIMEOUT_S,
         stderr: str | None = None) -> Rerun:
    """The eager run's end from its stderr (pure)."""
    if timed_out:
        return Rerun(True, "timeout", None, seconds=round(seconds, 2), note=f"{timeout_s:g} s", stderr=stderr)
    if returncode == 0:
        return Rerun(True, "ok", 0, seconds=round(seconds, 2), stderr=stderr)
    cls, said = None, lastwords.of(text or "")
    fault = classify.memory_fault(text)
    if fault:
        cls, said = fault
    elif classify.out_of_memory(text):
        cls = "out_of_memory"
    elif classify.refused(text):
        cls = "refused_call"
    mine = [short(f, line, func) for func, f, line in traceback_frames(text) if origin(f)[0] == "program"]
    return Rerun(True, "crash" if returncode is not None and returncode < 0 else "error", returncode, cls, said,
                 mine[0] if mine else "", tuple(mine[1:4]), round(seconds, 2), stderr=stderr)


def run(command: Sequence[str], out_dir: str | Path, *, env: Mapping[str, str], timeout_s: float = TIMEOUT_S,
        cwd: str | Path | None = None) -> Rerun:
    """The program once more, eager, bounded by timeout_s; its stderr kept as out_dir/eager_rerun.stderr.txt."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        r = proc.run(list(command), timeout_s=timeout_s, env={**env, **ENV}, cwd=cwd, capture=True,
                     label="eager rerun")
    except OSError as exc:
        return Rerun(False, note=f"it could not start: {exc}")
    said = r.stderr[-200_000:]
    (out / STDERR).write_text(said)
    return read(said, r.returncode, r.timed_out, time.monotonic() - t0, timeout_s, STDERR)
