"""Did memory grow step after step before it ran out? Read from the recorder's memory samples.

Why: an out-of-memory error names the call that asked last, which is seldom the cause. A run whose held memory
climbs through the whole run keeps tensors alive across steps (a loss summed without .item(), outputs kept in a
list); one that stays level until the failing call asked for more than was free needs a smaller batch or model.
The samples are PyTorch's allocated bytes once CUDA is up, else the process's resident memory. Pure.
"""
from __future__ import annotations

from typing import Any, Sequence

PARTS = 5                 # the run cut into fifths: a leak raises the peak of every one
MIN_SAMPLES = 10
GROWTH = 1.5              # the last fifth's peak over the first's
MIN_BYTES = 64 << 20      # and at least this much more: noise of a small program is not a leak


def _mib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _get(s: Any, key: str) -> Any:
    return s.get(key) if isinstance(s, dict) else getattr(s, key, None)


def trend(samples: Sequence[Any]) -> dict | None:
    """{"what", "first", "last", "seconds", "samples", "grew"} over the samples of one kind (GPU allocated once
    CUDA started, else resident memory), or None when there are too few to say."""
    gpu = [s for s in samples if _get(s, "reserved") is not None]
    series = gpu or list(samples)
    series = [s for s in series if (_get(s, "allocated") or -1) >= 0]
    if len(series) < MIN_SAMPLES:
        return None
    values = [int(_get(s, "allocated")) for s in series]
    size = len(values) // PARTS
    peaks = [max(values[i * size:(i + 1) * size]) for i in range(PARTS - 1)] + [max(values[(PARTS - 1) * size:])]
    rising = all(b >= a * 0.98 for a, b in zip(peaks, peaks[1:]))
    grew = rising and peaks[-1] >= peaks[0] * GROWTH and peaks[-1] - peaks[0] >= MIN_BYTES
    return {"what": "the memory PyTorch held on the GPU" if gpu else "the process's resident memory",
            "first": peaks[0], "last": peaks[-1], "seconds": round(_get(series[-1], "t") - _get(series[0], "t"), 1),
            "samples": len(values), "grew": grew}


def words(tr: dict) -> str:
    if tr["grew"]:
        return (f"{tr['what']} rose in every fifth of the run, from {_mib(tr['first'])} to {_mib(tr['last'])} over "
                f"{tr['seconds']} s, before it ran out: the program keeps tensors alive across steps (a loss summed "
                f"without .item(), outputs or losses kept in a list, a cache that only grows)")
    return (f"{tr['what']} did not climb through the run (peak {_mib(tr['first'])} in its first fifth, "
            f"{_mib(tr['last'])} in its last, over {tr['seconds']} s): no leak across steps; the call that failed "
            f"asked for more than was free")
