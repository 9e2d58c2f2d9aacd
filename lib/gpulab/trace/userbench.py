"""Recording overhead the way a user runs it (benchmarks/bench_trace_overhead.py, bench_step_time.py): each
variant is its own process running the same unchanged script (PROGRAM: a loop of tiny ops and the built-in
training step, each timed inside the script), under `python -m gpulab.trace --mode M` for the recorder, or
under `python -m gpulab.trace.bench wrap --variant V` for the baselines (no mode, a bare pass-through mode,
PyTorch's DebugMode, a naive flushed JSONL recorder); variants interleaved, rotating order each round. The
in-process figure of notebook 02 is gpulab.trace.bench's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from gpulab import device, proc
from gpulab.report import write_json
from gpulab.trace import native
from gpulab.trace.bench import debugmode_variant
from gpulab.trace.run import _child_env, bootstrap_command


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


# PyTorch's own cost of any recorder that sees each op through RecordFunction, as the profiler does: the observer's
# callback registered as gpulab registers it, returning at once (GPULAB_TRACE_ABLATE, read by the C++ observer;
# meaningful only when the observer is built: floor_variants_valid says)
FLOOR_VARIANTS = (
    Variant("rf_floor", mode="ops", env=(("GPULAB_TRACE_ABLATE", "32"),),
            note="PyTorch's RecordFunction with each op's argument list, the callback returning at once (a floor)"),
    Variant("rf_floor_noargs", mode="ops", env=(("GPULAB_TRACE_ABLATE", "96"),),
            note="the same without the argument list (no shapes could be recorded): the lowest floor"))


def floor_variants_valid(env: dict) -> bool:
    """The floor variants measure RecordFunction only where the observer is built (else the dispatch mode runs)."""
    return not str(env.get("observer", "")).startswith("not built")


def standard_variants(device: str) -> list[Variant]:
    """The variants of the overhead figure on this device (GPU-progress modes only differ on CUDA)."""
    cuda = str(device).startswith("cuda")
    out = [Variant("none", wrapper="none", note="no dispatch mode"),
           Variant("passthrough", wrapper="passthrough", note="bare pass-through TorchDispatchMode (reference)"),
           Variant("ops", mode="ops", note="gpulab crash-safe ring (the RecordFunction observer when built)"),
           Variant("ops_dispatch", mode="ops", env=(("GPULAB_TRACE_OBSERVER", "0"),),
                   note="gpulab ops from the TorchDispatchMode's C hot path (the recorder before the observer)"),
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
    obs, obs_why = native.ensure_observer()
    return {"torch": version, "native": str(built) if built else f"not built: {why}",
            "observer": str(obs) if obs else f"not built: {obs_why}", "cpu_count": os.cpu_count(),
            "load_avg": os.getloadavg()}


