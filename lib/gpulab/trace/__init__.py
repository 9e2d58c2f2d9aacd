"""Notebook 02's question: which ops does the workload run, where do time and memory go, which op first
produces NaN/Inf, and what does recording cost?

`ring` is the crash-safe op log's format, `recorder` writes it from inside the workload (installed by
`python -m gpulab.trace`, with no change to the program), `run` records a workload in a gpulab.proc child,
`analysis` turns a snapshot into tables and a Chrome trace, `view` draws them. Importing gpulab.trace never
imports torch (the watchdog reads logs without it).
"""
from __future__ import annotations

from gpulab.trace.analysis import first_nonfinite, memory_frame, summary, to_chrome_trace, to_frame
from gpulab.trace.recorder import Recorder
from gpulab.trace.ring import (MODES, MemSample, OpRecord, Progress, Snapshot, create, parse_args, progress, read,
                               read_device)
from gpulab.trace.run import Recording, bootstrap_command, finding, modes_for, overhead, record
from gpulab.trace.view import plot_memory, plot_summary, plot_timeline

__all__ = [
    "MODES", "Progress", "OpRecord", "MemSample", "Snapshot", "Recording", "Recorder", "create", "progress",
    "read", "read_device", "parse_args", "first_nonfinite", "to_frame", "summary", "memory_frame",
    "to_chrome_trace", "record", "bootstrap_command", "overhead", "finding", "modes_for", "plot_timeline",
    "plot_summary", "plot_memory",
]
