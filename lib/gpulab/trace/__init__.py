"""Notebook 02's question: which ops does the workload run, where do time and memory go, which op first
produces NaN/Inf, and what does recording cost?

`ring` is the crash-safe op log's format (slots of string ids, a string table, per-stream GPU progress),
`recorder` writes it from inside the workload (installed by `python -m gpulab.trace`, with no change to the
program; `native` its optional C hot path, `gpu` the GPU-progress mechanisms of the `auto` and `gpu`
modes), `run` records a workload in a gpulab.proc child, `liveness` decides whether a child still makes
progress (the watchdog's rule, also 02's stall detection), `bench` measures what recording costs, `analysis`
turns a snapshot into tables and a Chrome trace, `view` draws them. Importing gpulab.trace never imports
torch (the watchdog reads logs without it).
"""
from __future__ import annotations

from gpulab.trace.analysis import first_nonfinite, memory_frame, summary, to_chrome_trace, to_frame
from gpulab.trace.recorder import Recorder
from gpulab.trace.ring import (MODES, MemSample, OpRecord, Progress, Snapshot, StreamProgress, create, gpu_completed,
                               gpu_done, parse_args, progress, read, read_device, trim)
from gpulab.trace.view import plot_memory, plot_summary, plot_timeline

# gpulab.trace.run imports gpulab.workloads: loaded on first use, so that `python -m gpulab.trace -- -m
# gpulab.workloads` runs that module fresh as __main__ (runpy warns when it was imported before)
_RUN = ("Recording", "bootstrap_command", "measure_overhead", "modes_for", "overhead", "record", "stats_recording")


def __getattr__(name: str):
    if name in _RUN:
        from gpulab.trace import run
        return getattr(run, name)
    raise AttributeError(f"module 'gpulab.trace' has no attribute {name!r}")

__all__ = [
    "MODES", "Progress", "OpRecord", "MemSample", "Snapshot", "StreamProgress", "Recording", "Recorder", "create",
    "progress", "read", "read_device", "trim", "parse_args", "gpu_completed", "gpu_done",
    "first_nonfinite", "to_frame", "summary", "memory_frame", "to_chrome_trace", "record", "bootstrap_command",
    "overhead", "measure_overhead", "stats_recording", "modes_for", "plot_timeline", "plot_summary", "plot_memory",
]
