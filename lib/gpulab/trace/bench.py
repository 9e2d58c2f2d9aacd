"""Recording overhead, measured side by side: the same callable with no recorder and under each recorder,
interleaved (rotating order each repeat) so that drift and warm-up hit all variants alike.

  python -m gpulab.trace.bench --json OUT --modes ops,stats --repeats 5 -- <python -m gpulab.workloads flags>
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager, Mapping

from gpulab import workloads
from gpulab.report import write_json
from gpulab.trace.recorder import Recorder
from gpulab.trace.ring import _check_mode


@dataclass(frozen=True)
class OverheadRow:
    variant: str
    ops: int
    median_s: float
    baseline_s: float
    us_per_op: float       # (median_s - baseline_s) / ops
    ratio: float | None    # us_per_op / reference us_per_op (reference: the pass-through mode when timed)
    samples_s: tuple[float, ...]


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


def passthrough_variant():
    from torch.utils._python_dispatch import TorchDispatchMode

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    return PassThrough


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    i = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(prog="python -m gpulab.trace.bench")
    p.add_argument("--json", required=True)
    p.add_argument("--modes", default="ops,stats")
    p.add_argument("--repeats", type=int, default=5)
    ns = p.parse_args(argv[:i])

    modes = [m for m in ns.modes.split(",") if m]
    for m in modes:
        _check_mode(m)
    cfg = _cfg_from_flags(argv[i + 1:])
    prep = workloads.prepare(cfg)
    import torch

    sync = torch.cuda.synchronize if prep.device.startswith("cuda") else None
    ops = count_ops(prep.fn)
    with tempfile.TemporaryDirectory() as tmp:
        variants, recs = recorder_variants(modes, tmp)
        variants = {"none": None, "passthrough": passthrough_variant(), **variants}
        samples = time_variants(prep.fn, variants, repeats=ns.repeats, sync=sync)
        for r in recs:
            r.close()
    out = [r.__dict__ | {"samples_s": list(r.samples_s)} for r in rows(samples, ops)]

    write_json(ns.json, {"rung": cfg.rung, "device": prep.device, "ops": ops, "rows": out})
    return 0


def _cfg_from_flags(flags: list[str]):
    import dataclasses


    p = argparse.ArgumentParser(prog="workload flags")
    for f in dataclasses.fields(workloads.WorkloadConfig):
        p.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, default=f.default,
                       type=int if f.name in workloads._INT_KEYS else str)
    return workloads.WorkloadConfig(**vars(p.parse_args(flags)))


if __name__ == "__main__":
    sys.exit(main())
