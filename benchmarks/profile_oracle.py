"""Where notebook 05's time goes: its gate timed in-process (cProfile, the top functions by cumulative and own
time) and on the warm worker (as the notebook runs it), same candidates and cases.

    python benchmarks/profile_oracle.py [--cases default] [--device auto] [--top 40] [--per-candidate]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from gpulab.oracle.gate import gate  # noqa: E402

NOTEBOOK_05 = ["math", "flash", "efficient", "cudnn", "decomposed", "tiled"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="default")
    p.add_argument("--device", default="auto")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--per-candidate", action="store_true", help="only time each candidate alone, in-process, twice")
    a = p.parse_args()
    if a.per_candidate:
        for name in NOTEBOOK_05:
            times = []
            for _ in range(2):
                t0 = time.monotonic()
                gate([name], a.cases, a.device, isolate=False)
                times.append(round(time.monotonic() - t0, 1))
            print(f"{name}: {times} s (first, second in the same process)", flush=True)
        return 0
    prof = cProfile.Profile()
    t0 = time.monotonic()
    prof.enable()
    g = gate(NOTEBOOK_05, a.cases, a.device, isolate=False)
    prof.disable()
    t_in = time.monotonic() - t0
    t0 = time.monotonic()
    w = gate(NOTEBOOK_05, a.cases, a.device, isolate=True)
    t_warm = time.monotonic() - t0
    print(f"in-process {t_in:.1f} s, warm worker {t_warm:.1f} s; {g.headline()}")
    for key in ("cumulative", "tottime"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(a.top)
        print(s.getvalue()[-9000:])
    print("same verdicts:", {n: r.passed for n, r in g.reports.items()} == {n: r.passed for n, r in w.reports.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
