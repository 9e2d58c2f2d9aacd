"""gpulab: a Jupyter investigation workbook for PyTorch GPU failures.

Submodules are imported lazily so that `import gpulab` stays cheap and never imports torch
(the runner and the watchdog must work before torch loads, and even when it cannot).
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_SUBMODULES = {
    "bench", "chain", "cli", "device", "env", "fixes", "hang", "oracle", "proc", "report", "trace", "workloads",
}


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"gpulab.{name}")
    raise AttributeError(f"module 'gpulab' has no attribute {name!r}")
