"""Did memory grow step after step before it ran out? Read from the recorder's memory samples.

Why: an out-of-memory error names the call that asked last, which is seldom the cause. A run whose held memory
climbs through the whole run keeps tensors alive across steps (a loss summed without .item(), outputs kept in a
list); one that stays level until the failing call asked for more than was free needs a smaller batch or model.
The samples are PyTorch's allocated bytes once CUDA is up, else the process's resident memory; the run is cut into
fifths by the ops it ran, so that start-up, long but with few ops, does not read as a climb. Pure.
"""
from __future__ import annotations

from typing import Any, Sequence

from gpulab.hang.classify import size_text

PARTS = 5                 # the run cut into fifths: a leak raises the peak of every one
MIN_SAMPLES = 10
MIN_BYTES = 64 << 20      # the last fifth's peak over the first's by at least this: a small program's noise is no leak


def _get(s: Any, key: str) -> Any:
    return s.get(key) if isinstance(s, dict) else getattr(s, key, None)


def trend(samples: Sequence[Any]) -> dict | None:
    """{"what", "first", "last", "seconds", "samples", "grew"} over the samples of one kind (GPU allocated once
    CUDA started, else resident memory), or None when there are too few to say."""
    gpu = [s for s in samples if _get(s, "reserved") is not None]
    # resident memory also grows while the program imports: read from its first op on
    series = gpu or [s for s in samples if (_get(s, "seq") or 0) > 0]
    series = [s for s in series if (_get(s, "allocated") or -1) >= 0]
    if len(series) < MIN_SAMPLES:
        return None
    # fifths of the run by ops, not by time: start-up (CUDA's, the imports') takes time but few ops, and a step
    # runs about as many ops as the next
    lo, hi = _get(series[0], "seq") or 0, _get(series[-1], "seq") or 0
    if hi - lo < PARTS:
        return None
    peaks = []
    for i in range(PARTS):
        a, b = lo + (hi - lo) * i / PARTS, lo + (hi - lo) * (i + 1) / PARTS
        part = [int(_get(s, "allocated")) for s in series if a <= (_get(s, "seq") or 0) <= b]
        if not part:
            return None   # a fifth with no sample: too few to say
        peaks.append(max(part))
    total = peaks[-1] - peaks[0]
    # every fifth above the one before by a fair share of the whole climb: a run that allocates its optimizer's
    # state in the first steps and then stays level is no leak
    grew = total >= MIN_BYTES and all(b - a >= total / (PARTS * 4) for a, b in zip(peaks, peaks[1:]))
    return {"what": "the memory PyTorch held on the GPU" if gpu else "the process's resident memory",
            "first": peaks[0], "last": peaks[-1], "seconds": round(_get(series[-1], "t") - _get(series[0], "t"), 1),
            "samples": len(series), "grew": grew}


def climbed(samples: Sequence[Any]) -> dict | None:
    """The trend when memory rose through the whole run (a process the host's out-of-memory killer ends), else
    None."""
    tr = trend(samples)
    return tr if tr and tr["grew"] else None


# a process killed by SIGKILL while its memory climbed: the host's out-of-memory killer is the usual sender
KILLED = ("the process was killed by SIGKILL, which it cannot catch (so it left no traceback), while its memory "
          "climbed: the host's out-of-memory killer ends a process so when the host's memory runs out (the "
          "kernel's log says so: `dmesg | grep -i 'killed process'`; a job scheduler's memory limit does the same)")


def words(tr: dict) -> str:
    if tr["grew"]:
        return (f"{tr['what']} rose in every fifth of the run, from {size_text(tr['first'])} to {size_text(tr['last'])} over "
                f"{tr['seconds']} s, before it ran out: the program keeps tensors alive across steps (a loss summed "
                f"without .item(), outputs or losses kept in a list, a cache that only grows)")
    return (f"{tr['what']} did not climb through the run (peak {size_text(tr['first'])} in its first fifth, "
            f"{size_text(tr['last'])} in its last, over {tr['seconds']} s): no leak across steps; the call that failed "
            f"asked for more than was free")
