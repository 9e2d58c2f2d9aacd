"""Where the observer's per-step cost goes, in one process: a GPT-2-small-like step (benchmarks/gpt_step.py),
eager and compiled, timed with no recorder and with the recorder in each configuration: mode ops (no GPU
markers), auto (markers), and auto with parts of each record switched off (GPULAB_TRACE_ABLATE: 1 no call
sites, 2 no argument summaries, 4 no GPU markers, 8 no capture check, 16 no marker enqueued, 32 the callback
returns at once, 64 with 32: no argument list asked of PyTorch), and the dispatch-mode recorder for reference. Prints per
configuration the median step, the median host time to enqueue it (before the step's one sync: what the
recorder adds when the GPU does not hide it), the records per step and the observer's counters.

  python scripts/diag_observer_cost.py [--steps N] [--modes eager,compiled] [--tiny] [--builtin] [--rounds R]
      [--configs none,ops,...]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import torch  # noqa: E402

import gpt_step  # noqa: E402
from gpulab import trace  # noqa: E402
from gpulab.stats import ratio_ci  # noqa: E402
from gpulab.trace import native  # noqa: E402

CONFIGS = [("none", None, {}), ("ops", "ops", {}), ("auto", "auto", {}), ("auto-nosite", "auto", {"GPULAB_TRACE_ABLATE": "1"}),
           ("auto-noargs", "auto", {"GPULAB_TRACE_ABLATE": "2"}), ("auto-nomarks", "auto", {"GPULAB_TRACE_ABLATE": "4"}),
           ("auto-bare", "auto", {"GPULAB_TRACE_ABLATE": "7"}), ("auto-nocapcheck", "auto", {"GPULAB_TRACE_ABLATE": "8"}),
           ("auto-noenqueue", "auto", {"GPULAB_TRACE_ABLATE": "16"}), ("auto-nokernels", "auto", {"GPULAB_TRACE_KERNELS": "0"}),
           ("dispatch-auto", "auto", {"GPULAB_TRACE_OBSERVER": "0"}),
           # PyTorch's own floor: the RecordFunction callback registered, returning at once (with, then without,
           # the argument list it builds for every op)
           ("rf-empty", "auto", {"GPULAB_TRACE_ABLATE": "32"}), ("rf-empty-noinputs", "auto", {"GPULAB_TRACE_ABLATE": "96"})]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--modes", default="eager,compiled")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--builtin", action="store_true", help="the built-in workload's step at its small, host-bound "
                    "size (benchmarks/bench_step_time.py --size host) instead of the GPT step; --modes is ignored")
    ap.add_argument("--rounds", type=int, default=1, help="configs interleaved, each round in a new order; with "
                    "more than one, each config's steps of all rounds are pooled at the end (median, ratio to none "
                    "with a BCa 95%% interval): short rounds spread a host's drift over every config alike")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--configs", default=",".join(c[0] for c in CONFIGS))
    a = ap.parse_args()
    print(native.ensure_all() or "built", flush=True)
    dev = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    wanted = a.configs.split(",")
    unknown = [w for w in wanted if w not in {c[0] for c in CONFIGS}]
    if unknown:
        ap.error(f"unknown config {unknown}; choose from {', '.join(c[0] for c in CONFIGS)}")
    if a.builtin:
        measure("builtin", *builtin_step(dev), wanted, a.steps, a.rounds)
        return
    for mode in a.modes.split(","):
        measure(mode, *gpt_step_fn(mode, dev, a.tiny or dev == "cpu"), wanted, a.steps, a.rounds)


def gpt_step_fn(mode: str, dev: str, tiny: bool):
    cfg = dict(vocab=512, ctx=64, d=64, layers=2, heads=4) if tiny else dict(vocab=50304, ctx=1024, d=768, layers=12,
                                                                               heads=12)
    batch = 4 if tiny else 8
    torch.manual_seed(0)
    model = gpt_step.GPT(**cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=dev == "cuda")
    fwd = torch.compile(model) if mode == "compiled" else model
    idx = torch.randint(0, cfg["vocab"], (batch, cfg["ctx"]), device=dev)
    tgt = torch.randint(0, cfg["vocab"], (batch, cfg["ctx"]), device=dev)
    host = []

    def step():
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = fwd(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        host.append(time.perf_counter())
        return loss.item()
    return step, host


def builtin_step(dev: str):
    """The built-in workload's training step at the size bench_step_time.py calls host-bound."""
    from bench_step_time import sizes
    from gpulab import builtin_model
    from gpulab.workloads import WorkloadConfig

    if dev == "cpu":
        torch.set_num_threads(1)   # as bench_step_time's program: a thread pool on a busy CPU only adds noise
    prep = builtin_model.prepare(WorkloadConfig(rung="step", device=dev, **sizes(dev, "host")))
    host = []

    def step():
        out = prep.fn()   # ends in the loss's float(): one sync
        host.append(time.perf_counter())
        return out
    return step, host


def measure(label: str, step, host: list, wanted: list, steps: int, rounds: int) -> None:
    for _ in range(5):
        step()
    by_name = {c[0]: c for c in CONFIGS}
    pooled: dict = {}
    for r in range(rounds):
        order = wanted[r % len(wanted):] + wanted[:r % len(wanted)]
        for name, rmode, env in (by_name[w] for w in order):   # a name given twice runs twice (drift shows)
            old = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            rec = None
            try:
                if rmode is not None:
                    rec = trace.Recorder(Path(tempfile.mkdtemp()) / "ops.log", rmode).install()
                for _ in range(3):
                    step()
                s0 = rec._mode_obj.stats() if rec is not None and rec.hot_path == "observer" else None
                seq0 = trace.progress(rec.log).started if rec is not None else 0
                times, hosts = [], []
                for _ in range(steps):
                    t0 = time.perf_counter()
                    step()
                    times.append(time.perf_counter() - t0)
                    hosts.append(host[-1] - t0)
                per = (trace.progress(rec.log).started - seq0) / steps if rec is not None else 0
                st = rec._mode_obj.stats() if s0 is not None else None
                delta = {k: round((st[k] - s0[k]) / steps, 1) for k in ("markers", "python_marks", "misses")} \
                    if st else {}
                extra = {k: st[k] for k in ("native_streams", "capture_check", "frames")} if st else {}
                med = statistics.median(times)
                pooled.setdefault(name, []).extend(times)
                print(f"{label:9} {name:17} {med * 1e3:8.3f} ms  host {statistics.median(hosts) * 1e3:8.3f} ms  "
                      f"records/step {per:7.0f}  {rec.hot_path if rec else '':9} {rec.gpu_path if rec else ''} "
                      f"per step {delta} {extra}", flush=True)
            finally:
                if rec is not None:
                    rec.close()
                for k, v in old.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
    if rounds > 1:
        ref = pooled.get("none")
        for name in dict.fromkeys(wanted):
            med = statistics.median(pooled[name])
            ratio = ""
            if ref:
                (lo, hi), _ = ratio_ci(pooled[name], ref)
                ratio = f"  {med / statistics.median(ref):.3f}x [{lo:.3f}, {hi:.3f}]"
            print(f"{label:9} {name:17} pooled {len(pooled[name])} steps of {rounds} rounds  median "
                  f"{med * 1e3:8.3f} ms{ratio}", flush=True)


if __name__ == "__main__":
    main()
