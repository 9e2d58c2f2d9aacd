"""Figure: what `gpulab compare`'s recorder costs a training step. A GPT-2-small-shaped training step
(benchmarks/gpt_step.py's model: 12 layers, width 768, 1024 tokens, batch 8, bf16 autocast, AdamW; a tiny size
on the CPU) timed unrecorded and recorded (gpulab.numerics.record's mode: a fingerprint of every floating
output, queued on the device, copied to the host a block at a time), side by side in one process with a third
variant, the same step under an empty Python dispatch mode (what any per-op Python recorder costs before it does
anything: the floor of this design). The variants alternate step by step after a warm-up, and each step ends at
the loss on the host (the .item() a training loop logs). Goal: recorded / unrecorded <= 1.5 on an H100.
--parts adds a fourth variant, the recorder with its figures left out (a sink that queues no kernel: the
mode's own Python, the records' bookkeeping and their lines), which splits the cost between the host's Python
and the figures' kernels.

  python benchmarks/bench_fingerprint.py --out DIR [--device auto|cpu|cuda] [--steps N] [--warmup N] [--tiny]
                                         [--parts]

Writes DIR/bench_fingerprint.json, prints the table and then one JSON line with the ratio last.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "lib"))
sys.path.insert(0, str(HERE))

import numpy  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import gpt_step  # noqa: E402
from gpulab.numerics import fingerprints, record  # noqa: E402

GOAL = 1.5


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--steps", type=int, default=10, help="timed steps per variant")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="a small size (the CPU's default)")
    ap.add_argument("--parts", action="store_true", help="also time the recorder with its figures left out")
    a = ap.parse_args()
    dev, model, opt, idx, tgt = gpt_step.setup(a.device, a.tiny)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="gpulab-fp-")   # the records themselves are not the figure: removed after
    fp = record.Fingerprints(os.path.join(scratch, "bench.jsonl"))
    mode_cls = record.make_mode(fp)

    def step() -> float:
        t0 = time.perf_counter()
        gpt_step.enqueue(dev, model, opt, idx, tgt).item()
        return time.perf_counter() - t0

    def recorded() -> float:
        with mode_cls():
            return step()

    class Empty(TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def empty_mode() -> float:
        with Empty():
            return step()

    run = {"unrecorded": step, "empty_mode": empty_mode, "recorded": recorded}
    if a.parts:
        bare = record.Fingerprints(os.path.join(scratch, "bare.jsonl"))
        bare.sinks[torch.device(dev)] = _NoFigures(dev)
        bare.block = fingerprints.CAP if dev != "cpu" else bare.block
        if dev != "cpu":
            bare._start_writer()   # as a GPU's records are written
        bare_cls = record.make_mode(bare)

        def no_figures() -> float:
            with bare_cls():
                return step()
        run["no_figures"] = no_figures
    samples: dict[str, list[float]] = {k: [] for k in run}
    for _ in range(a.warmup):
        for f in run.values():
            f()
    n0 = fp.n
    recorded()
    per_step = fp.n - n0
    for i in range(a.steps):
        for name in (list(run) if i % 2 == 0 else list(run)[::-1]):
            samples[name].append(run[name]())
    fp.close()
    if a.parts:
        bare.close()
    shutil.rmtree(scratch, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in samples.items()}
    ratios = [r / u for r, u in zip(samples["recorded"], samples["unrecorded"])]
    res = {"device": dev, "gpu": torch.cuda.get_device_name() if dev == "cuda" else None,
           "size": "tiny" if idx.shape[1] < 1024 else "gpt2-small", "batch": idx.shape[0], "records_per_step": per_step,
           "unrecorded_ms": med["unrecorded"] * 1e3, "recorded_ms": med["recorded"] * 1e3,
           "ratio": med["recorded"] / med["unrecorded"], "ratio_per_pair_median": statistics.median(ratios),
           "empty_mode_ms": med["empty_mode"] * 1e3, "empty_mode_ratio": med["empty_mode"] / med["unrecorded"],
           "us_per_record": (med["recorded"] - med["unrecorded"]) / max(per_step, 1) * 1e6, "goal": GOAL,
           "samples_s": samples}
    if a.parts:
        res.update(no_figures_ms=med["no_figures"] * 1e3, no_figures_ratio=med["no_figures"] / med["unrecorded"])
    (out / "bench_fingerprint.json").write_text(json.dumps(res, indent=1))
    print(f"{'variant':<12} {'median ms':>10}")
    for k in run:
        print(f"{k:<12} {med[k] * 1e3:>10.2f}")
    print(f"records/step {per_step}, {res['us_per_record']:.1f} us/record, ratio {res['ratio']:.3f} (goal <= {GOAL}); "
          f"an empty dispatch mode alone {res['empty_mode_ratio']:.3f}")
    print(json.dumps({k: v for k, v in res.items() if k != "samples_s"}))


class _NoFigures:
    """A sink that queues nothing on the device: each record gets a row of zeros (what --parts times)."""

    def __init__(self, dev: str):
        self.key, self.row = str(torch.device(dev)), 0

    def add(self, t) -> int:
        self.row += 1
        return self.row - 1

    def settle(self) -> None:
        pass

    def take(self):
        rows, self.row = self.row, 0
        return lambda: (numpy.zeros((rows, fingerprints.NF)), [[0, 0, 0]] * rows)


if __name__ == "__main__":
    main()
