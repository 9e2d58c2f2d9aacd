"""Recording overhead, measured side by side, every variant interleaved (rotating order each repeat) so
that drift and warm-up hit all variants alike.

Two ways:
- in one process (`time_variants`; `python -m gpulab.trace.bench --json OUT --modes ops,stats -- <workload
  flags>`): notebook 02's quick in-run figure;
- the way a user runs it (gpulab.trace.userbench, the benchmarks' way): each variant its own process running
  the same unchanged script, the baselines under `python -m gpulab.trace.bench wrap --variant V` (this
  module's command), which runs the script exactly as the recorder's bootstrap does.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import runpy
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager, Mapping

from gpulab import beat, builtin_model, workloads
from gpulab.report import write_json
from gpulab.trace import lazydynamo
from gpulab.trace.recorder import Recorder
from gpulab.trace.ring import _check_mode

WRAPPERS = ("none", "passthrough", "debugmode", "jsonl_flush")


@dataclass(frozen=True)
class OverheadRow:
    variant: str
    ops: int
    median_s: float
    baseline_s: float
    us_per_op: float       # (median_s - baseline_s) / ops
    ratio: float | None    # us_per_op / reference us_per_op (reference: the pass-through mode when timed)
    samples_s: tuple[float, ...]


# ---------------------------------------------------------------------------------------------- the modes

def count_ops(fn: Callable[[], object]) -> int:
    """Ops one call of fn dispatches (a bare pass-through mode counting)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    n = [0]

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            n[0] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return n[0]


def passthrough_variant():
    from torch.utils._python_dispatch import TorchDispatchMode

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    return PassThrough


def debugmode_variant():
    """PyTorch's own op logger (in memory, not crash-safe), or None on a torch without it."""
    try:
        from torch.utils._debug_mode import DebugMode
    except ImportError:
        return None
    return DebugMode


def jsonl_variant(path: str | os.PathLike):
    """The naive crash-safe baseline: one JSON line per op, flushed before the op runs."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class JsonlRecorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.fh = open(path, "a")
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            # repr() only of scalars: the repr of a list of CUDA tensors (AdamW's _foreach ops) would
            # copy them to the host and measure that instead of the recording
            meta = [[list(a.shape), str(a.dtype), list(a.stride()), str(a.device)] if isinstance(a, torch.Tensor)
                    else repr(a)[:32] if isinstance(a, (int, float, bool, str, type(None)))
                    else f"{type(a).__name__}[{len(a)}]" if isinstance(a, (list, tuple)) else type(a).__name__
                    for a in args]
            self.fh.write(json.dumps({"seq": self.n, "op": str(func), "args": meta, "t": time.time(),
                                      "thread": threading.current_thread().name}) + "\n")
            self.fh.flush()
            return func(*args, **(kwargs or {}))

        def __exit__(self, *exc):
            self.fh.close()
            return super().__exit__(*exc)

    return JsonlRecorder


def wrapper_mode(variant: str, jsonl: str | os.PathLike | None = None):
    """The dispatch-mode class of a baseline variant (None: no mode at all)."""
    if variant not in WRAPPERS:
        raise ValueError(f"variant={variant!r} is not valid; choose one of {', '.join(WRAPPERS)}")
    if variant == "passthrough":
        return passthrough_variant()
    if variant == "debugmode":
        return debugmode_variant()
    if variant == "jsonl_flush":
        return jsonl_variant(jsonl or os.devnull)
    return None


# ---------------------------------------------------------------------------------------------- in one process

def time_variants(fn: Callable[[], object], variants: Mapping[str, Callable[[], ContextManager] | None],
                  repeats: int = 5, warmup: int = 1, sync: Callable[[], None] | None = None
                  ) -> dict[str, list[float]]:
    """Seconds per call of fn under each variant's context (None: bare), interleaved ABAB with rotation."""
    names = list(variants)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(warmup):
        for n in names:
            with (variants[n] or contextlib.nullcontext)():
                fn()
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            with (variants[n] or contextlib.nullcontext)():
                if sync:
                    sync()
                t0 = time.perf_counter()
                fn()
                if sync:
                    sync()
                samples[n].append(time.perf_counter() - t0)
    return samples


def rows(samples: Mapping[str, list[float]], ops: int, baseline: str = "none",
         reference: str | None = "passthrough") -> list[OverheadRow]:
    """Pure: samples -> us/op and ratio to the reference variant's us/op."""
    if baseline not in samples:
        raise ValueError(f"baseline={baseline!r} is not among the variants {sorted(samples)}")
    base = statistics.median(samples[baseline])
    per = {n: (statistics.median(s) - base) / max(ops, 1) * 1e6 for n, s in samples.items()}
    ref = per.get(reference) if reference else None
    out = []
    for n, s in samples.items():
        ratio = per[n] / ref if ref and ref > 0 and n != baseline else None
        out.append(OverheadRow(n, ops, statistics.median(s), base, per[n], ratio, tuple(s)))
    return out


def recorder_variants(modes, log_dir: str | Path) -> tuple[dict, list]:
    """Context factories for each recorder mode (one log per mode, re-installed per call) + the recorders."""

    recs = {m: Recorder(Path(log_dir) / f"overhead_{m}.log", m, capacity=1 << 14) for m in modes}
    return {m: (lambda r=r: r) for m, r in recs.items()}, list(recs.values())


# ---------------------------------------------------------------------------------------------- commands

def wrap_main(argv: list[str]) -> int:
    """python -m gpulab.trace.bench wrap --variant V [--jsonl PATH] -- SCRIPT.py ARGS: run the script as
    `python -m gpulab.trace` does (runpy, same argv and sys.path), under a baseline mode instead."""
    if "--" not in argv:
        raise SystemExit("usage: python -m gpulab.trace.bench wrap --variant V [--jsonl PATH] -- SCRIPT.py ARGS")
    i = argv.index("--")
    p = argparse.ArgumentParser(prog="python -m gpulab.trace.bench wrap")
    p.add_argument("--variant", required=True, choices=WRAPPERS)
    p.add_argument("--jsonl", default=None)
    ns = p.parse_args(argv[:i])
    target = argv[i + 1:]
    if not target:
        p.error("no SCRIPT.py after '--'")
    lazydynamo.defer()   # the reference mode made as the recorder's is (unwrapped until dynamo is imported)
    mode = wrapper_mode(ns.variant, ns.jsonl)
    sys.argv = list(target)
    sys.path[0] = os.path.dirname(os.path.abspath(target[0]))
    with (mode or contextlib.nullcontext)():
        runpy.run_path(target[0], run_name="__main__")
    return 0


def main(argv: list[str] | None = None) -> int:
    beat.start_from_env()   # its parent (trace.run.overhead) stops a child that stalls
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["wrap"]:
        return wrap_main(argv[1:])
    i = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(prog="python -m gpulab.trace.bench")
    p.add_argument("--json", required=True)
    p.add_argument("--modes", default="ops,stats")
    p.add_argument("--repeats", type=int, default=5)
    ns = p.parse_args(argv[:i])

    cfg = workloads.parse_cli(argv[i + 1:])
    lazydynamo.defer()   # every mode timed here made as the recorder's is in a recorded run
    time_recorder(cfg, [m for m in ns.modes.split(",") if m], ns.repeats, ns.json)
    return 0


def time_recorder(cfg: workloads.WorkloadConfig, modes: list[str], repeats: int, json_path: str | os.PathLike
                  ) -> None:
    """The built-in workload's rung bare, under a bare dispatch mode and under each recording mode, interleaved in
    this process, written to json_path. The caller has deferred torch._dynamo (lazydynamo.defer) before anything
    imported it, so the modes are what a recorded run's are: this module's child, or 06's benchmark worker once
    its own timing is done (one process start and torch import fewer)."""
    for m in modes:
        _check_mode(m)
    prep = builtin_model.prepare(cfg)
    import torch

    sync = torch.cuda.synchronize if prep.device.startswith("cuda") else None
    ops = count_ops(prep.fn)
    with tempfile.TemporaryDirectory() as tmp:
        variants, recs = recorder_variants(modes, tmp)
        variants = {"none": None, "passthrough": passthrough_variant(), **variants}
        samples = time_variants(prep.fn, variants, repeats=repeats, sync=sync)
        for r in recs:
            r.close()
    out = [r.__dict__ | {"samples_s": list(r.samples_s)} for r in rows(samples, ops)]
    write_json(json_path, {"rung": cfg.rung, "device": prep.device, "ops": ops, "rows": out,
                           "hot_path": recs[0].hot_path if recs else None})


if __name__ == "__main__":
    sys.exit(main())
