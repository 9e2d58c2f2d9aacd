"""Figure: what each real fix costs on the built-in workload (and whether it keeps the numbers), measured by
the fix matrix of notebook 04: every scenario climbs the ladder in fresh children with its fix applied,
then is timed against the baseline in interleaved rounds of timing children (ratio of medians, bootstrap
95% interval) and its outputs compared with the fix-free run's.

  python benchmarks/bench_fixes.py --out DIR [--device auto|cpu|cuda] [--rounds N] [--jobs J]

GPU: a mid-size training step (bf16) with the SDPA backends, allocator settings, synchronized GEMMs, fp32
softmax, contiguous GEMM operands, plain attention, launch blocking, module loading and the memory cap;
about 3 minutes on an H100. CPU: smoke sizes, and most fixes are not_applicable there. Writes fixes.json
and fixes_table.csv (the matrix) and bench_fixes.json (the summary) under DIR; prints the table last.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from gpulab import device as gdevice  # noqa: E402
from gpulab.fixes import matrix  # noqa: E402
from gpulab.fixes.target import Target  # noqa: E402
from gpulab.report import write_json  # noqa: E402
from gpulab.workloads import WorkloadConfig  # noqa: E402

FIXES = ("sdpa_backend_math", "sdpa_backend_flash", "sdpa_backend_efficient", "sdpa_backend_cudnn", "sdpa_math_off",
         "decomposed_attention", "alloc_async", "alloc_expandable", "alloc_no_caching", "sync_gemm", "fp32_softmax",
         "contiguous_gemm_inputs", "launch_blocking", "module_loading_lazy", "module_loading_eager",
         "memory_fraction_cap")
SIZES = {"cuda": dict(batch=4, heads=8, head_dim=64, text_tokens=64, image_tokens=1024, layers=4),
         "cpu": dict(batch=1, heads=2, head_dim=16, text_tokens=8, image_tokens=24, layers=2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--rung", default="step", choices=("sdpa", "forward", "step", "steps"))
    ap.add_argument("--rounds", type=int, default=2, help="interleaved timing rounds")
    ap.add_argument("--time-s", type=float, default=None, help="seconds of timed repeats per timing child")
    ap.add_argument("--repeats", type=int, default=1, help="ladder runs per rung")
    ap.add_argument("--jobs", type=int, default=None, help="ladder runs side by side (default: 4 on a GPU, 1 on a CPU)")
    ap.add_argument("--fixes", default=",".join(FIXES), help="comma list of fixes to measure")
    a = ap.parse_args()
    dev = gdevice.resolve(a.device)
    kind = "cuda" if dev.startswith("cuda") else "cpu"
    cfg = WorkloadConfig(rung=a.rung, device=dev, **SIZES[kind])
    mcfg = matrix.MatrixConfig(a.fixes, repeats=a.repeats, jobs=a.jobs or (4 if kind == "cuda" else 1),
                               stall_s=60.0 if kind == "cuda" else 20.0, timeout_s=600.0, cost_rounds=a.rounds,
                               time_s=a.time_s or (1.0 if kind == "cuda" else 0.3))
    m = matrix.run(Target(cfg), mcfg, a.out)
    summary = [{"fix": s.name, "verdict": s.verdict, "applicable": s.applicable,
                "ladder": f"{s.trials - s.counts.get('pass', 0)}/{s.trials} failed" if s.trials else "-",
                "overhead": s.overhead, "overhead_ci": s.overhead_ci, "samples": s.cost.get("samples"),
                "numerics_ok": (s.numerics or {}).get("ok"), "max_abs_err": (s.numerics or {}).get("max_abs_err"),
                "why": s.verdict_why if s.applicable else s.not_applicable} for s in m.scenarios]
    write_json(a.out / "bench_fixes.json", {"workload": m.workload, "platform": m.platform, "rows": summary})
    print(f"\n{m.workload}; cost = median time / baseline's - 1, 95% bootstrap interval")
    print(f"{'fix':<24} {'verdict':<15} {'ladder':<11} {'cost':>8}  {'95% interval':<17} numerics")
    for r in summary:
        ci = r["overhead_ci"]
        cost = f"{r['overhead']:+.1%}" if r["overhead"] is not None else "-"
        span = f"{ci[0]:+.1%}..{ci[1]:+.1%}" if ci else "-"
        num = {True: "same", False: "CHANGED", None: "-"}[r["numerics_ok"]]
        print(f"{r['fix']:<24} {str(r['verdict']):<15} {r['ladder']:<11} {cost:>8}  {span:<17} {num}"
              + (f"  ({r['why']})" if not r["applicable"] else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
