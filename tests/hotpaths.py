"""The recorder's three hot paths, for tests that run each: the RecordFunction observer (the default), and the
dispatch mode's C and Python paths (the modes that act after each op, and the fallback)."""
from __future__ import annotations

PATHS = ("observer", "native", "python")


def env(path: str) -> dict[str, str]:
    """A recorded child's environment for `path`."""
    return {"GPULAB_TRACE_NATIVE": "0" if path == "python" else "1",
            "GPULAB_TRACE_OBSERVER": "1" if path == "observer" else "0"}


def kw(path: str) -> dict[str, bool]:
    """gpulab.trace.Recorder's arguments for `path`."""
    return {"native": path != "python", "observer": path == "observer"}


def expected(path: str) -> str:
    """The hot path a recorder reports for `path`, given what is built here."""
    from gpulab.trace import native

    if path == "observer":
        return "observer" if native.load_observer() is not None else expected("native")
    return "native" if path == "native" and native.load() is not None else "python"


def top(records) -> list:
    """The program's own calls: records not nested in another (the observer also records what an op runs
    inside it, one level deeper)."""
    return [r for r in records if r.depth == 0]
