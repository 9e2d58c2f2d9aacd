"""Figure: what one chain child costs before it does any work (interpreter, torch import, device
start-up, gpulab's recorder and watchdog), next to the work itself.

Every notebook of the chain starts children (ladder trials, recordings, the benchmark child), so a
child's fixed cost times their number is most of the chain's time on a GPU machine. Each variant runs
--repeats times, one after another, as a real process; the table gives the median wall time. Writes
child_cost.csv, and with --profile the recorded trial's `-X importtime` and cProfile, under --out.

    python benchmarks/bench_child_cost.py --out /tmp/cc [--device cuda] [--repeats 2] [--profile]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

WORKLOAD = ["-m", "gpulab.workloads", "--workload", "builtin", "--rung", "sdpa", "--batch", "2", "--heads", "4",
            "--head-dim", "32", "--text-tokens", "16", "--image-tokens", "64", "--layers", "2", "--lora-rank", "8",
            "--steps", "10", "--seed", "0"]


def variants(py: str, device: str, tmp: Path) -> dict[str, list[str]]:
    work = [*WORKLOAD, "--device", device]
    init = ("import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()" if device == "cuda"
            else "import torch; torch.zeros(1)")
    return {
        "python (no imports)": [py, "-c", "pass"],
        "import torch": [py, "-c", "import torch"],
        "import torch + device init": [py, "-c", init],
        "import gpulab.trace": [py, "-c", "import torch, gpulab.trace"],
        "workload (sdpa rung), bare": [py, *work],
        "workload under gpulab.trace --mode ops": [py, "-m", "gpulab.trace", "--log", str(tmp / "ops.log"),
                                                   "--mode", "ops", "--", *work],
        "workload under gpulab.trace --mode auto": [py, "-m", "gpulab.trace", "--log", str(tmp / "auto.log"),
                                                    "--mode", "auto", "--", *work],
        # torch._dynamo imported by the recorder before the program (by default: when the program does)
        "... --mode ops --dynamo eager": [py, "-m", "gpulab.trace", "--log", str(tmp / "opse.log"), "--mode",
                                          "ops", "--dynamo", "eager", "--", *work],
        "... --mode auto --dynamo eager": [py, "-m", "gpulab.trace", "--log", str(tmp / "autoe.log"), "--mode",
                                           "auto", "--dynamo", "eager", "--", *work],
        "workload under gpulab watch --no-record": [py, "-m", "gpulab", "watch", "--stall", "30", "--no-record",
                                                    "--out", str(tmp / "w0"), "--", py, *work],
        "workload under gpulab watch (a ladder trial)": [py, "-m", "gpulab", "watch", "--stall", "30",
                                                         "--out", str(tmp / "w1"), "--", py, *work],
    }


def timed(cmd: list[str], env: dict, log) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=300)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{cmd!r} exited {r.returncode}; see the log")
    return dt


def main(argv: list[str] | None = None) -> int:
    import os

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when there is one)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--profile", action="store_true", help="also -X importtime and cProfile of the trace child")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.device is None:
        import torch
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "lib"), os.environ.get("PYTHONPATH", "")])}
    rows = []
    with open(a.out / "children.log", "w") as log:
        for name, cmd in variants(sys.executable, a.device, a.out).items():
            times = [timed(cmd, env, log) for _ in range(a.repeats)]
            rows.append((name, statistics.median(times), min(times)))
            print(f"{name:48s} median {rows[-1][1]:6.2f} s  min {rows[-1][2]:6.2f} s", flush=True)
        if a.profile:
            work = [*WORKLOAD, "--device", a.device]
            trace = ["-m", "gpulab.trace", "--log", str(a.out / "prof.log"), "--mode", "auto", "--", *work]
            with open(a.out / "importtime.txt", "w") as f:
                subprocess.run([sys.executable, "-X", "importtime", *trace], env=env, stdout=log, stderr=f, timeout=300)
            subprocess.run([sys.executable, "-m", "cProfile", "-o", str(a.out / "trace_child.prof"), *trace],
                           env=env, stdout=log, stderr=subprocess.STDOUT, timeout=300)
            import pstats
            with open(a.out / "trace_child_profile.txt", "w") as f:
                pstats.Stats(str(a.out / "trace_child.prof"), stream=f).sort_stats("cumulative").print_stats(60)
    with open(a.out / "child_cost.csv", "w") as f:
        f.write("variant,median_s,min_s\n")
        f.writelines(f'"{n}",{m:.3f},{mn:.3f}\n' for n, m, mn in rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
