"""Figure: what `gpulab watch` costs a real training step, eager and torch.compile'd: a GPT-2-small-like model
(benchmarks/gpt_step.py: 12 layers, width 768, batch 8 x 1024 tokens, bf16 autocast, fused AdamW) timed by the
program itself, run as a user runs it, without gpulab and under `gpulab watch` (its default mode, auto),
interleaved round by round. Ratio = median step watched / median step unwatched, with a BCa bootstrap 95% CI
over the steps of every round. Also says whether compile compiled the same graphs under gpulab, each run's
median step (a run slow throughout shows there) and the host's share of a step (the time to enqueue it,
before its one sync: when it nears the step time, the host's noise becomes the step's).

  python benchmarks/bench_real_step.py --out DIR [--rounds N] [--steps N] [--variants LIST] [--modes eager,compiled]

Variants: none (no gpulab), watch (the default recorder: the RecordFunction observer, kernels named),
watch_nokernels (GPULAB_TRACE_KERNELS=0: Inductor's launches unnamed, its fast launcher kept),
watch_dispatch (GPULAB_TRACE_OBSERVER=0: the TorchDispatchMode recorder, as a reference). On the CPU the model
is tiny (host-bound). Writes DIR/bench_real_step.json and prints the table last.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from gpulab import proc  # noqa: E402
from gpulab.stats import ratio_ci  # noqa: E402

PROGRAM = Path(__file__).resolve().with_name("gpt_step.py")
VARIANTS = {"none": None, "watch": {}, "watch_nokernels": {"GPULAB_TRACE_KERNELS": "0"},
            "watch_dispatch": {"GPULAB_TRACE_OBSERVER": "0"}}


def command(variant: str, mode: str, out: Path, tag: str, steps: int) -> tuple[list[str], dict]:
    res = out / f"{tag}.json"
    prog = [sys.executable, str(PROGRAM), "--json", str(res), "--steps", str(steps)]
    if mode == "compiled":
        prog.append("--compile")
    env = proc.python_env()
    if VARIANTS[variant] is None:
        return prog, env
    env.update(VARIANTS[variant])
    return [sys.executable, "-m", "gpulab", "watch", "--stall", "600", "--out", str(out / f"{tag}.watch"), "--json",
            str(out / f"{tag}.verdict.json"), "--", *prog], env


def rows(results: dict) -> list[dict]:
    """Pure: {(mode, variant): [run results]} -> a row per (mode, variant) with the ratio to `none`."""
    out = []
    for (mode, variant), runs in sorted(results.items()):
        steps = [s for r in runs for s in r["step_s"]]
        base = [s for r in results.get((mode, "none"), []) for s in r["step_s"]]
        if not steps:
            continue
        host = [s for r in runs for s in r.get("host_s") or ()]
        row = {"mode": mode, "variant": variant, "runs": len(runs), "step_ms": statistics.median(steps) * 1e3,
               "host_ms": statistics.median(host) * 1e3 if host else None,
               "per_run_ms": [round(statistics.median(r["step_s"]) * 1e3, 2) for r in runs],
               "ratio": None, "ratio_ci": None, "dynamo": runs[-1].get("dynamo")}
        if base and variant != "none":
            row["ratio"] = statistics.median(steps) / statistics.median(base)
            (lo, hi), _ = ratio_ci(steps, base)
            row["ratio_ci"] = [lo, hi]
        out.append(row)
    return out


def table(meta: dict, rs: list[dict]) -> str:
    lines = [f"{meta['device']} torch {meta['torch']}; {meta['rounds']} rounds x {meta['steps']} steps; "
             f"{meta['seconds']:.0f} s",
             f"{'mode':9} {'variant':16} {'step ms':>9} {'host ms':>8} {'ratio':>7} {'95% CI':>17}  per run; dynamo"]
    for r in rs:
        ci = f"[{r['ratio_ci'][0]:.3f}, {r['ratio_ci'][1]:.3f}]" if r["ratio_ci"] else ""
        ratio = f"{r['ratio']:.3f}" if r["ratio"] else ""
        host = f"{r['host_ms']:.2f}" if r.get("host_ms") is not None else "-"
        lines.append(f"{r['mode']:9} {r['variant']:16} {r['step_ms']:9.2f} {host:>8} {ratio:>7} {ci:>17}  "
                     f"{r['per_run_ms']}; {r['dynamo'] or ''}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--variants", default="none,watch,watch_nokernels,watch_dispatch")
    ap.add_argument("--modes", default="eager,compiled")
    ap.add_argument("--timeout", type=float, default=900.0, help="per run, seconds")
    a = ap.parse_args(argv)
    variants = a.variants.split(",")
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"--variants {','.join(bad)} unknown; choose from {', '.join(VARIANTS)}")
    modes = a.modes.split(",")
    if any(m not in ("eager", "compiled") for m in modes):
        ap.error(f"--modes {a.modes!r}: choose from eager, compiled")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    failures: list[str] = []
    t0 = time.time()
    for rnd in range(a.rounds):
        for mode in modes:
            order = variants if rnd % 2 == 0 else variants[::-1]   # ABBA: drift cancels
            for v in order:
                tag = f"{mode}-{v}-{rnd}"
                argv_, env = command(v, mode, out, tag, a.steps)
                r = proc.run(argv_, timeout_s=a.timeout, env=env, stdout=out / f"{tag}.out.txt",
                             stderr=out / f"{tag}.err.txt", label=tag)
                res = out / f"{tag}.json"
                if r.returncode != 0 or not res.exists():
                    failures.append(f"{tag}: {r.status} exit {r.returncode} (see {tag}.err.txt)")
                    continue
                results.setdefault((mode, v), []).append(json.loads(res.read_text()))
                print(f"[bench_real_step] {tag}: median {statistics.median(results[(mode, v)][-1]['step_s']) * 1e3:.2f} ms",
                      file=sys.stderr, flush=True)
    import torch
    meta = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "rounds": a.rounds, "steps": a.steps, "seconds": time.time() - t0,
            "failures": failures, "date": time.strftime("%Y-%m-%d")}
    rs = rows(results)
    (out / "bench_real_step.json").write_text(json.dumps({"meta": meta, "rows": rs,
                                                          "runs": {f"{m}/{v}": x for (m, v), x in results.items()}}))
    print("\n".join(failures))
    print(table(meta, rs))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
