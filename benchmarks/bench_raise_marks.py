"""Figure: what the observer's raise marks cost where a raise is not seen as an op ends (torch 2.11's CUDA wheels):
the callback then asks for every op's outputs (an op that raised has none). Runs a loop of small ops unrecorded and
recorded, alternating in one process, once with GPULAB_OBSERVER_RAISE=seen (outputs never asked for) and once with
=outputs (asked for), in fresh processes, --repeats times each; prints the median step times and their ratio.

    python benchmarks/bench_raise_marks.py [--repeats 3] [--steps 30]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CODE = r'''
import os, statistics, sys, tempfile, time, json, torch
sys.path.insert(0, os.path.join(sys.argv[1], "lib"))
from gpulab.trace import recorder
dev = "cuda" if torch.cuda.is_available() else "cpu"
m = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)]).to(dev)
x = torch.randn(16, 64, device=dev)
def step():
    for _ in range(20):
        m(x).relu().sum()
    if dev == "cuda":
        torch.cuda.synchronize()
r = recorder.Recorder(os.path.join(tempfile.mkdtemp(), "ops.log"), "auto", capacity=1 << 20)
for _ in range(5):
    step()
times = {"none": [], "recorded": []}
for _ in range(int(sys.argv[2])):
    t = time.perf_counter(); step(); times["none"].append(time.perf_counter() - t)
    with r:
        t = time.perf_counter(); step(); times["recorded"].append(time.perf_counter() - t)
print(json.dumps({k: statistics.median(v) * 1e3 for k, v in times.items()}))
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    a = ap.parse_args()
    for _ in range(a.repeats):
        for how in ("seen", "outputs"):
            p = subprocess.run([sys.executable, "-c", CODE, str(ROOT), str(a.steps)], capture_output=True, text=True,
                               env={**os.environ, "GPULAB_OBSERVER_RAISE": how}, timeout=300)
            if p.returncode:
                print(how, "failed:", p.stderr[-500:])
                continue
            d = json.loads(p.stdout.strip().splitlines()[-1])
            print(f"{how:8} unrecorded {d['none']:.3f} ms, recorded {d['recorded']:.3f} ms, "
                  f"ratio {d['recorded'] / d['none']:.3f}", flush=True)


if __name__ == "__main__":
    main()
