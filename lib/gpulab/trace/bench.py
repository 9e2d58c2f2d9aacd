"""Recording overhead, measured side by side, every variant interleaved (rotating order each repeat) so
that drift and warm-up hit all variants alike.

Two ways:
- in one process (`time_variants`; `python -m gpulab.trace.bench --json OUT --modes ops,stats -- <workload
  flags>`): notebook 02's quick in-run figure;
- the way a user runs it (`user_run`): each variant is its own process running the same unchanged script
  (PROGRAM: a loop of tiny ops and the built-in training step, each timed inside the script), under
  `python -m gpulab.trace --mode M` for the recorder, or under `python -m gpulab.trace.bench wrap
  --variant V` for the baselines (no mode, a bare pass-through mode, PyTorch's DebugMode, a naive flushed
  JSONL recorder), which run the script exactly as the recorder's bootstrap does.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Mapping, Sequence

from gpulab import beat, builtin_model, device, proc, workloads
from gpulab.report import write_json
from gpulab.trace import lazydynamo, native
from gpulab.trace.recorder import Recorder
from gpulab.trace.ring import _check_mode
from gpulab.trace.run import _child_env, bootstrap_command

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


# ---------------------------------------------------------------------------------------------- as a user runs it

# The unchanged program every variant runs. It times its own loops (wall and thread CPU time per block) and
# writes them to argv[1]; nothing in it knows which variant it runs under.
PROGRAM = '''"""A user's program for gpulab's overhead benchmarks: tiny ops in a loop, then the built-in training step."""
import argparse, json, time
import torch

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--device", default="cpu")
p.add_argument("--tiny", type=int, default=0, help="tiny ops per block (0: skip)")
p.add_argument("--blocks", type=int, default=5)
p.add_argument("--steps", type=int, default=0, help="training steps per block (0: skip)")
p.add_argument("--step-blocks", type=int, default=3)
p.add_argument("--workload", default="")
a = p.parse_args()
sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
if not a.device.startswith("cuda"):
    torch.set_num_threads(1)  # the per-op cost is measured; a thread pool on a busy CPU only adds noise
out = {"device": a.device}


def timed(body, blocks, warmup):
    for _ in range(warmup):
        body()
    sync()
    wall, cpu = [], []
    for _ in range(blocks):
        c0, t0 = time.thread_time(), time.perf_counter()
        body()
        sync()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    return {"unit_s": wall, "cpu_s": cpu}


if a.tiny:
    x = torch.ones(4, device=a.device)

    def tiny():
        y = x
        for _ in range(a.tiny):
            y = y + 1
        return y

    out["tiny_ops"] = dict(timed(tiny, a.blocks, 1), ops_per_unit=a.tiny)

if a.steps:
    from gpulab import builtin_model, workloads

    prep = builtin_model.prepare(workloads.parse_cli(a.workload.split()))

    def steps():
        for _ in range(a.steps):
            prep.fn()

    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    prep.fn()  # warm-up (allocator, lazy init), then one step counted
    with Count():
        prep.fn()
    out["transformer_step"] = dict(timed(steps, a.step_blocks, 1), ops_per_unit=Count.n * a.steps,
                                   steps_per_unit=a.steps)

with open(a.out, "w") as fh:
    json.dump(out, fh)
'''


@dataclass(frozen=True)
class Variant:
    """One way to run PROGRAM: a recorder mode through `python -m gpulab.trace`, or a baseline wrapper."""
    name: str
    mode: str | None = None            # recorder mode, or None for a wrapper
    wrapper: str | None = None         # one of WRAPPERS
    env: tuple[tuple[str, str], ...] = ()
    note: str = ""


def standard_variants(device: str) -> list[Variant]:
    """The variants of the overhead figure on this device (GPU-progress modes only differ on CUDA)."""
    cuda = str(device).startswith("cuda")
    out = [Variant("none", wrapper="none", note="no dispatch mode"),
           Variant("passthrough", wrapper="passthrough", note="bare pass-through TorchDispatchMode (reference)"),
           Variant("ops", mode="ops", note="gpulab crash-safe ring (native hot path when built)"),
           Variant("ops_python", mode="ops", env=(("GPULAB_TRACE_NATIVE", "0"),),
                   note="gpulab ops with the pure-Python hot path (no compiler)"),
           Variant("auto", mode="auto", note="default: ops until CUDA, then GPU progress (best mechanism)")]
    if cuda:
        out += [Variant("auto_python", mode="auto", env=(("GPULAB_TRACE_NATIVE", "0"),),
                        note="auto with the pure-Python hot path (GPU markers emitted and polled in Python)"),
                Variant("gpu_events", mode="gpu", note="GPU progress by pooled CUDA events"),
                Variant("sync", mode="sync", note="synchronize after each op")]
    out += [Variant("stats", mode="stats", note="min/max/NaN of every output (syncs on CUDA)"),
            Variant("jsonl_flush", wrapper="jsonl_flush", note="naive crash-safe: one flushed JSON line per op")]
    if debugmode_variant() is not None:
        out.append(Variant("debugmode", wrapper="debugmode", note="PyTorch DebugMode (in memory, not crash-safe)"))
    return out


def pick_variants(variants: Sequence[Variant], names: str | None) -> list[Variant]:
    """The variants named in a comma-separated list (None: all); `none` is always kept (the baseline)."""
    if not names:
        return list(variants)
    want = [n for n in names.split(",") if n]
    known = {v.name for v in variants}
    bad = [n for n in want if n not in known]
    if bad:
        raise ValueError(f"variants {', '.join(bad)} are not valid here; choose from {', '.join(sorted(known))}")
    return [v for v in variants if v.name in want or v.name == "none"]


def variant_command(v: Variant, program: Sequence[str], log: str | os.PathLike) -> list[str]:
    """argv that runs `program` (SCRIPT.py ARGS) under variant v."""
    if v.mode is not None:
        return bootstrap_command(program, log, v.mode)
    return [sys.executable, "-m", "gpulab.trace.bench", "wrap", "--variant", v.wrapper or "none",
            "--jsonl", str(log), "--", *program]


def child_env(extra: Sequence[tuple[str, str]] = ()) -> dict[str, str]:
    env = _child_env()
    env.update(dict(extra))
    return env


def user_run(variants: Sequence[Variant], program_args: Sequence[str], out_dir: str | os.PathLike,
             repeats: int, timeout_s: float = 600.0, say: Callable[[str], None] | None = None) -> dict:
    """Run PROGRAM under every variant, `repeats` rounds, rotating the order each round; -> raw results
    {variant: [per-run result dict]}. Each run is a gpulab.proc child; its stderr is kept on failure."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    script = out / "user_program.py"
    script.write_text(PROGRAM)
    names = [v.name for v in variants]
    by = {v.name: v for v in variants}
    raw: dict[str, list] = {n: [] for n in names}
    failures: dict[str, str] = {}
    for r in range(repeats):
        for n in names[r % len(names):] + names[:r % len(names)]:
            res = out / f"run_{n}.json"
            res.unlink(missing_ok=True)
            cmd = variant_command(by[n], [str(script), str(res), *program_args], out / f"run_{n}.log")
            err = out / f"run_{n}.stderr.txt"
            done = proc.run(cmd, timeout_s=timeout_s, env=child_env(by[n].env), stdout=err, stderr=subprocess.STDOUT,
                            label=f"bench {n}")
            if done.returncode != 0 or not res.exists():
                failures[n] = f"exit {done.returncode} ({done.status}): " + err.read_text(errors="replace")[-800:]
                continue
            data = json.loads(res.read_text())
            data["round"] = r
            raw[n].append(data)
        # every round kept as it ends: a benchmark cut off by its time limit still has what it measured
        write_json(out / "raw_so_far.json", {"rounds_done": r + 1, "raw": raw, "failures": failures})
        if say:
            say(f"round {r + 1}/{repeats} done")
    return {"raw": raw, "failures": failures}


@dataclass(frozen=True)
class UserRow:
    """One variant of one workload, measured as a user runs it."""
    workload: str
    variant: str
    runs: int
    ops_per_unit: int
    us_per_op: float            # median over runs of (median block time / ops)
    over_none_us: float         # us_per_op - none's
    ratio: float | None         # over_none_us / pass-through's over_none_us
    ratio_per_round: float | None   # median over rounds of the same ratio within the round (drift-free)
    cpu_us_per_op: float        # the same from thread CPU time (robust to other load on the machine)
    cpu_ratio: float | None
    note: str = ""
    samples_us: tuple[float, ...] = field(default=(), repr=False)


def per_op_us(run: dict, workload: str, key: str = "unit_s") -> float | None:
    """Microseconds per op in one run of PROGRAM: its median `workload` block time (`unit_s` wall, `cpu_s`
    thread CPU) over the ops in a block; None when the run has no such block."""
    w = run.get(workload)
    if not w or not w.get(key):
        return None
    return statistics.median(w[key]) / max(w["ops_per_unit"], 1) * 1e6


def summarize(raw: Mapping[str, list[dict]], workload: str, notes: Mapping[str, str] | None = None,
              baseline: str = "none", reference: str = "passthrough") -> list[UserRow]:
    """Pure: per-run block times -> us/op per variant, over the no-mode baseline, and the ratio to the
    pass-through mode (from the medians, and per round: each round's variants ran within seconds)."""
    notes = notes or {}
    samples: dict[str, tuple[float, ...]] = {}       # wall us/op of each run, in run order
    per_round: dict[str, dict[int, float]] = {}
    wall: dict[str, float | None] = {}
    cpu: dict[str, float | None] = {}
    ops = 0
    for name, runs in raw.items():
        pairs = [(r["round"], v) for r in runs if (v := per_op_us(r, workload)) is not None]
        cpus = [v for r in runs if (v := per_op_us(r, workload, "cpu_s")) is not None]
        samples[name], per_round[name] = tuple(v for _, v in pairs), dict(pairs)
        wall[name] = statistics.median(samples[name]) if pairs else None
        cpu[name] = statistics.median(cpus) if cpus else None
        ops = max(ops, max((r[workload]["ops_per_unit"] for r in runs if workload in r), default=0))
    if wall.get(baseline) is None:
        return []

    def ratio(a: float | None, base: float | None, ref: float | None) -> float | None:
        if a is None or base is None or ref is None or ref - base <= 0:
            return None
        return (a - base) / (ref - base)

    def round_ratio(name: str) -> float | None:
        vals = [ratio(v, per_round[baseline].get(r), per_round.get(reference, {}).get(r))
                for r, v in per_round[name].items()]
        vals = [v for v in vals if v is not None]
        return statistics.median(vals) if vals else None

    out = []
    for name, w in wall.items():
        if w is None:
            continue
        is_base = name == baseline
        out.append(UserRow(
            workload, name, len(samples[name]), ops, w, w - wall[baseline],
            None if is_base else ratio(w, wall[baseline], wall.get(reference)),
            None if is_base else round_ratio(name),
            cpu[name] if cpu[name] is not None else float("nan"),
            None if is_base else ratio(cpu[name], cpu[baseline], cpu.get(reference)),
            notes.get(name, ""), samples[name]))
    return out


def benchmark_parser(description: str, rounds_help: str) -> argparse.ArgumentParser:
    """The options the user-run benchmarks share (benchmarks/bench_trace_overhead.py, bench_step_time.py)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--repeats", type=int, default=None, help=rounds_help)
    p.add_argument("--quick", action="store_true", help="fewer rounds, variants and steps (< 1 min on a CPU)")
    p.add_argument("--variants", default=None, help="comma-separated subset of the variants (default: all)")
    return p


def text_table(rows: Sequence[Mapping], columns: Sequence[tuple[str, str, int, str]]) -> list[str]:
    """A benchmark's table for the terminal: a header line, then a line per row. columns: (title, key, width,
    format such as "{:.2f}"); the first is left-aligned, the rest right-aligned; None prints as "-"."""
    (title, key, width, _), rest = columns[0], columns[1:]
    lines = [f"  {title:<{width}}" + "".join(f"{t:>{w}}" for t, _, w, _ in rest)]
    for r in rows:
        lines.append(f"  {r[key]:<{width}}" + "".join(f"{'-' if r[k] is None else fmt.format(r[k]):>{w}}"
                                                      for _, k, w, fmt in rest))
    return lines


def failure_lines(failures: Mapping[str, str]) -> list[str]:
    """One line per variant whose runs failed (the last line of its output)."""
    return [f"FAILED {name}: {why.strip().splitlines()[-1] if why.strip() else why}" for name, why in failures.items()]


def setup(ns: argparse.Namespace) -> tuple[str, Path, dict]:
    """(device, output folder, environment) of a benchmark run from its parsed options."""
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    return device.resolve(ns.device).split(":")[0], out, environment()


def environment() -> dict:
    """What a benchmark's numbers depend on: torch, the hot path, the machine's load."""
    try:
        import torch
        version = torch.__version__
    except ImportError:
        version = None
    built, why = native.ensure()
    return {"torch": version, "native": str(built) if built else f"not built: {why}", "cpu_count": os.cpu_count(),
            "load_avg": os.getloadavg()}


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

    modes = [m for m in ns.modes.split(",") if m]
    for m in modes:
        _check_mode(m)
    cfg = workloads.parse_cli(argv[i + 1:])
    lazydynamo.defer()   # every mode timed here made as the recorder's is in a recorded run
    prep = builtin_model.prepare(cfg)
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

    write_json(ns.json, {"rung": cfg.rung, "device": prep.device, "ops": ops, "rows": out,
                         "hot_path": recs[0].hot_path if recs else None})
    return 0


if __name__ == "__main__":
    sys.exit(main())
