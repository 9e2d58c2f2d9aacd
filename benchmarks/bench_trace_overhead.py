"""Figure: per-op cost of each recorder mode, measured the way a user runs it: `python -m gpulab.trace --mode
M -- program.py` around an unchanged program that times its own loops (tiny ops, and the built-in
transformer training step), against the same program under a bare pass-through TorchDispatchMode, PyTorch's
DebugMode, a naive flushed-JSONL recorder and no mode at all. Every variant is its own process; variants are
interleaved (the order rotates each round); medians over rounds.

  python benchmarks/bench_trace_overhead.py --out DIR [--device auto|cpu|cuda] [--repeats N] [--quick]

us/op = median block time / ops in the block; "over none" subtracts the no-mode run; ratio = over-none cost /
the pass-through's over-none cost (goal for ops: <= 1.5). ratio/round takes the ratio within each round
(variants of a round ran seconds apart) and the median over rounds; cpu ratio uses the program's thread CPU
time, which other load on the machine disturbs less than wall time.
Writes DIR/bench_trace_overhead.json and .csv, prints the table last.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from gpulab.report import write_rows  # noqa: E402
from gpulab.trace import userbench  # noqa: E402
from gpulab.workloads import WorkloadConfig, cli_args  # noqa: E402

GOAL = 1.5


def sizes(device: str) -> dict:
    """The built-in step: 6 layers; GPU-sized on CUDA, small on the CPU (its per-op cost is what is measured)."""
    if device == "cuda":
        return dict(batch=4, heads=16, head_dim=64, text_tokens=128, image_tokens=1024, layers=6, lora_rank=16)
    return dict(batch=1, heads=2, head_dim=16, text_tokens=8, image_tokens=24, layers=6, lora_rank=4)


def program_args(device: str, quick: bool) -> list[str]:
    cfg = WorkloadConfig(rung="step", device=device, **sizes(device))
    tiny = 500 if quick else (3000 if device == "cuda" else 1500)
    return ["--device", device, "--tiny", str(tiny), "--blocks", "3" if quick else "5",
            "--steps", "1", "--step-blocks", "3" if quick else "5", "--workload", " ".join(cli_args(cfg))]


COLUMNS = (("variant", "variant", 12, "{}"), ("us/op", "us_per_op", 9, "{:.2f}"),
           ("over none", "over_none_us", 11, "{:.2f}"), ("ratio", "ratio", 8, "{:.2f}"),
           ("ratio/round", "ratio_per_round", 13, "{:.2f}"), ("cpu ratio", "cpu_ratio", 11, "{:.2f}"))


def table(result: dict) -> str:
    lines = [f"device={result['device']} torch={result.get('torch')} native hot path: {result['native']}; "
             f"{result['repeats']} rounds, {result['seconds']:.0f} s (goal: ops <= {GOAL}x pass-through)"]
    for wname in ("tiny_ops", "transformer_step"):
        rows = [r for r in result["rows"] if r["workload"] == wname]
        if rows:
            lines += [f"\n{wname} ({rows[0]['ops_per_unit']} ops per block)", *userbench.text_table(rows, COLUMNS)]
    return "\n".join(lines + userbench.failure_lines(result["failures"]))


def main(argv=None) -> int:
    ns = userbench.benchmark_parser(__doc__.splitlines()[0], "rounds (default 7; --quick 2)").parse_args(argv)
    dev, out, env = userbench.setup(ns)
    variants = userbench.standard_variants(dev)
    if ns.quick:  # each run starts torch (and the recorder, dynamo's import): a few seconds per run here
        variants = [v for v in variants if v.name in ("none", "passthrough", "ops") or (dev == "cuda" and v.name == "auto")]
    variants = userbench.pick_variants(variants, ns.variants)
    repeats = ns.repeats or (2 if ns.quick else 7)
    t0 = time.time()
    say = lambda m: print(f"[bench_trace_overhead] {m}", file=sys.stderr, flush=True)  # noqa: E731
    say(f"device={dev} variants={[v.name for v in variants]} rounds={repeats} native={env['native']}")
    runs = userbench.user_run(variants, program_args(dev, ns.quick), out / "runs", repeats, say=say)
    notes = {v.name: v.note for v in variants}
    rows = [r for w in ("tiny_ops", "transformer_step") for r in userbench.summarize(runs["raw"], w, notes)]
    meta = {"device": dev, **env, "repeats": repeats, "quick": ns.quick, "seconds": time.time() - t0,
            "goal_ratio": GOAL, "failures": runs["failures"], "raw": runs["raw"]}
    table_rows = [dict(r.__dict__, samples_us=list(r.samples_us)) for r in rows]
    write_rows(out, "bench_trace_overhead", table_rows, **meta)
    print(table({**meta, "rows": table_rows}))
    return 1 if runs["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
