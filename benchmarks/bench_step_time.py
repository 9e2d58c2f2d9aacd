"""Figure: what recording costs a training step, as % of the step time: the built-in workload's step
(`python -m gpulab.workloads --rung step`; forward, backward, AdamW) under each recorder mode against the
same program with no recorder, each variant its own process as a user runs it (`python -m gpulab.trace
--mode M -- program.py`), interleaved, medians over rounds. On CUDA the size is GPU-bound (the host's
per-op cost hides behind GPU work unless a mode syncs); on the CPU the size is small (host-bound: the
figure is then the per-op cost).

  python benchmarks/bench_step_time.py --out DIR [--device auto|cpu|cuda] [--size auto|host] [--repeats N] [--quick]

Goals at a GPU-bound size: `ops` <= 3 %, the GPU-localizing `auto` <= 10 %. `rf_floor` and
`rf_floor_noargs` (with the C++ observer built) are PyTorch's own part: its RecordFunction callback registered
as gpulab registers it, returning at once, with and without each op's argument list; no recorder that sees every
op through RecordFunction (the profiler's hook) can cost less. "cpu %" compares the
program's thread CPU time (less disturbed by other load on the machine; on a GPU it is host time only).
Writes DIR/bench_step_time.json and .csv, prints the table last.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from gpulab.report import write_rows  # noqa: E402
from gpulab.trace import userbench  # noqa: E402
from gpulab.workloads import WorkloadConfig, cli_args  # noqa: E402

GOALS = {"ops": 3.0, "auto": 10.0}


def sizes(device: str, size: str = "auto") -> dict:
    """auto: GPU-bound on CUDA, host-bound on the CPU; host: the small host-bound size on any device (the
    per-op cost is then most of the step, the worst case for a recorder)."""
    if device == "cuda" and size != "host":   # 6 layers of dim 1024 over 2304 tokens, batch 32: GPU-bound
        # (~0.1 ms of GPU work per op)
        return dict(batch=32, heads=16, head_dim=64, text_tokens=256, image_tokens=2048, layers=6, lora_rank=16)
    return dict(batch=1, heads=2, head_dim=16, text_tokens=8, image_tokens=24, layers=2, lora_rank=4)


def step_rows(raw: dict, variants: list) -> list[dict]:
    """Pure: per-run step-block times -> median step time per variant and % over no recorder (from the
    medians, and within each round, whose runs were seconds apart)."""
    def step_s(run: dict, key: str = "unit_s") -> float | None:
        w = run.get("transformer_step")
        return statistics.median(w[key]) / w["steps_per_unit"] if w and w.get(key) else None

    per = {n: {r["round"]: s for r in runs if (s := step_s(r)) is not None} for n, runs in raw.items()}
    cpu = {n: statistics.median(c) for n, runs in raw.items()
           if (c := [s for r in runs if (s := step_s(r, "cpu_s")) is not None])}
    base = per.get("none", {})
    if not base:
        return []
    base_med = statistics.median(base.values())
    out = []
    for v in variants:
        vals = per.get(v.name, {})
        if not vals:
            continue
        med = statistics.median(vals.values())
        rounds = [(vals[r] - base[r]) / base[r] * 100 for r in vals if r in base]
        out.append({"variant": v.name, "runs": len(vals), "step_ms": med * 1e3,
                    "overhead_pct": (med - base_med) / base_med * 100 if v.name != "none" else 0.0,
                    "overhead_pct_per_round": statistics.median(rounds) if rounds and v.name != "none" else 0.0,
                    "cpu_overhead_pct": (cpu[v.name] - cpu["none"]) / cpu["none"] * 100
                    if v.name in cpu and "none" in cpu else None,
                    "goal_pct": GOALS.get(v.name), "note": v.note, "samples_ms": [vals[r] * 1e3 for r in sorted(vals)]})
    return out


COLUMNS = (("variant", "variant", 12, "{}"), ("step ms", "step_ms", 10, "{:.2f}"),
           ("% over none", "overhead_pct", 13, "{:.1f}"), ("%/round", "overhead_pct_per_round", 10, "{:.1f}"),
           ("cpu %", "cpu_overhead_pct", 9, "{:.1f}"), ("goal", "goal_pct", 7, "{:.0f}%"))


def table(meta: dict, rows: list[dict]) -> str:
    head = (f"device={meta['device']} torch={meta['torch']} size={meta['size']} native hot path: {meta['native']}; "
            f"{meta['repeats']} rounds, {meta['seconds']:.0f} s")
    return "\n".join([head, *userbench.text_table(rows, COLUMNS), *userbench.failure_lines(meta["failures"])])


def main(argv=None) -> int:
    ap = userbench.benchmark_parser(__doc__.splitlines()[0], "rounds (default 5; --quick 2)")
    ap.add_argument("--size", default="auto", choices=["auto", "host"],
                    help="auto: GPU-bound on CUDA; host: the small host-bound size on any device")
    ns = ap.parse_args(argv)
    dev, out, env = userbench.setup(ns)
    keep = {"none", "ops", "auto", "gpu_events", "sync", "stats"} if not ns.quick else {"none", "ops", "auto"}
    floors = list(userbench.FLOOR_VARIANTS) if userbench.floor_variants_valid(env) else []
    variants = userbench.pick_variants([v for v in userbench.standard_variants(dev) if v.name in keep] + floors,
                                       ns.variants)
    repeats = ns.repeats or (2 if ns.quick else 5)
    size = sizes(dev, ns.size)
    cfg = WorkloadConfig(rung="step", device=dev, **size)
    steps = (3 if ns.quick else 5) if dev == "cuda" else (1 if ns.quick else 2)
    args = ["--device", dev, "--steps", str(steps), "--step-blocks", "3" if ns.quick else "5",
            "--workload", " ".join(cli_args(cfg))]
    say = lambda m: print(f"[bench_step_time] {m}", file=sys.stderr, flush=True)  # noqa: E731
    say(f"device={dev} variants={[v.name for v in variants]} rounds={repeats} steps/block={steps}")
    t0 = time.time()
    runs = userbench.user_run(variants, args, out / "runs", repeats, say=say)
    rows = step_rows(runs["raw"], variants)
    meta = {"device": dev, **env, "size": size, "steps_per_block": steps, "repeats": repeats, "quick": ns.quick,
            "seconds": time.time() - t0, "goals_pct": GOALS, "failures": runs["failures"], "raw": runs["raw"]}
    write_rows(out, "bench_step_time", rows, **meta)
    print(table(meta, rows))
    return 1 if runs["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
