"""Figure: what stopping on the median's CI (BenchConfig.ci_rel), then on a verdict beyond doubt
(BenchConfig.decide_early, gpulab.stats.apart), save against the per-sample spread rules alone, with the same
decisions.

Notebook 06 compares every candidate with the baseline on the workload's attention call. On the H100 every
one of those comparisons ran to its max_time_s cap: with CUDA events a microsecond kernel's per-sample
spread never gets under 1% (the timer's resolution alone is ~0.5 us), although a few hundred samples pin
its median. Here the same comparisons run side by side, interleaved by repeat, with ci_rel=0 (the spread
rules only), ci_rel=0.01, and ci_rel=0.01 with decide_early (the default now); the table gives time spent,
samples, the ratio, its CI and the verdict of each.

    python benchmarks/bench_stop_rule.py [--device auto] [--max-time 1.0] [--repeats 3] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))


RULES = {"spread only": (0.0, False), "ci_rel 0.01": (0.01, False), "ci_rel 0.01, decided": (0.01, True)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--max-time", type=float, default=1.0, help="max_time_s of each comparison (06's default)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    import torch
    import torch.nn.functional as F

    from gpulab import bench, device
    from gpulab.oracle.candidates import decomposed

    dev = device.resolve(a.device)
    dtype = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 80, 32, generator=g).to(dev, dtype) for _ in range(3))  # 06's built-in call
    mask = torch.ones(2, 1, 80, 80, dtype=torch.bool, device=dev)
    mask[..., 12:16] = False

    def math_():
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def fused():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def decomp():
        return decomposed(q, k, v, attn_mask=mask)

    pairs = {"sdpa (auto) vs math": (fused, math_), "decomposed vs math": (decomp, math_)}
    rows = []
    for r in range(a.repeats):
        for name, (cand, base) in pairs.items():
            for rule, (ci_rel, early) in RULES.items():
                c = bench.compare(cand, base, device=dev, max_time_s=a.max_time, ci_rel=ci_rel, decide_early=early)
                rows.append({"pair": name, "rule": rule, "repeat": r, "timed_s": c.candidate.timed_s,
                             "samples": c.candidate.n, "stopped": c.candidate.stopped, "ratio": c.ratio,
                             "ratio_ci": list(c.ratio_ci), "verdict": c.verdict})
    print(f"device {dev} ({torch.cuda.get_device_name() if dev.startswith('cuda') else 'CPU'}), max_time_s "
          f"{a.max_time}, {a.repeats} repeats interleaved; medians over repeats")
    print(f"{'pair':22s} {'rule':>18s} {'timed s':>8s} {'samples':>8s} {'ratio':>7s} {'ratio CI':>17s}  verdicts")
    for name in pairs:
        for rule in RULES:
            rs = [x for x in rows if x["pair"] == name and x["rule"] == rule]
            med = lambda key: statistics.median(x[key] for x in rs)  # noqa: E731
            lo = statistics.median(x["ratio_ci"][0] for x in rs)
            hi = statistics.median(x["ratio_ci"][1] for x in rs)
            print(f"{name:22s} {rule:>18s} {med('timed_s'):8.3f} {med('samples'):8.0f} {med('ratio'):7.3f} "
                  f"{f'[{lo:.3f}, {hi:.3f}]':>17s}  {','.join(sorted({x['verdict'] for x in rs}))}")
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "stop_rule.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
