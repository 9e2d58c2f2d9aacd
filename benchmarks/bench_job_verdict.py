"""Figure: time from the stall of a multi-process job to its cross-process verdict (goal: under 15 s for 4
gloo ranks on the CPU and 2 NCCL ranks on two GPUs; the NCCL flight recorder dumps on the watchdog's
timeout, 10 minutes by default).

Each trial is a real job under `gpulab.hang.watch`: ranks by mp.spawn (or torchrun), DataLoader workers,
with one process doing the wrong thing (tests/fixtures/dist_job.py, nccl_job.py). Reported per case: the
stall window, the time from the last progress seen to the verdict (stall window + capture + judgement +
stop), the capture alone, the verdict's class and culprit. Writes trials.csv and summary.json under --out.

    python benchmarks/bench_job_verdict.py --out /tmp/jobv [--cases gloo4_skip,gloo2_stuck,...] [--stall 5]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from gpulab.hang import watch  # noqa: E402

DIST, NCCL = ROOT / "tests" / "fixtures" / "dist_job.py", ROOT / "tests" / "fixtures" / "nccl_job.py"
CASES = {
    "gloo4_skip": ["python", str(DIST), "skip", "--world", "4"],
    "gloo4_stuck": ["python", str(DIST), "stuck", "--world", "4"],
    "gloo2_torchrun_stuck": ["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", str(DIST), "stuck"],
    "loader_fork": ["python", str(DIST), "loader", "--start", "fork"],
    "nccl2_skip": ["python", str(NCCL), "skip", "--world", "2"],
    "nccl2_spin": ["python", str(NCCL), "spin", "--world", "2"],
    "cuda_gloo2_skip": ["python", str(NCCL), "skip", "--world", "2", "--backend", "gloo"],
    "cuda_gloo2_spin": ["python", str(NCCL), "spin", "--world", "2", "--backend", "gloo"],
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cases", default="gloo4_skip,gloo4_stuck,gloo2_torchrun_stuck,loader_fork",
                   help=f"comma-separated subset of {', '.join(CASES)}")
    p.add_argument("--stall", type=float, default=5.0)
    p.add_argument("--repeats", type=int, default=1)
    a = p.parse_args(argv)
    cases = [c for c in a.cases.split(",") if c]
    bad = [c for c in cases if c not in CASES]
    if bad:
        p.error(f"unknown case(s) {bad}; choose from {', '.join(CASES)}")
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in cases:
        for r in range(a.repeats):
            t0 = time.monotonic()
            v = watch.run(CASES[case], stall_s=a.stall, timeout_s=240, out_dir=a.out / "runs" / f"{case}_r{r}",
                          progress=lambda m: None)
            div = v.divergence or {}
            rows.append({"case": case, "repeat": r, "status": v.status, "class": v.cls, "culprit": v.culprit,
                         "group": div.get("group"), "seq": div.get("seq"), "op": div.get("op"),
                         "processes": len(v.processes), "stall_s": a.stall,
                         "stall_to_verdict_s": round(v.time_to_verdict_s - a.stall, 2)
                         if v.time_to_verdict_s is not None else None,
                         "last_progress_to_verdict_s": v.time_to_verdict_s,
                         "capture_s": v.capture_s.get("total"), "capture_processes_s": v.capture_s.get("processes"),
                         "wall_s": round(time.monotonic() - t0, 2)})
            print(json.dumps(rows[-1]), flush=True)
    import pandas as pd

    df = pd.DataFrame(rows)
    df.to_csv(a.out / "trials.csv", index=False)
    (a.out / "summary.json").write_text(json.dumps(rows, indent=1))
    print(df[["case", "status", "class", "culprit", "seq", "op", "processes", "stall_s", "stall_to_verdict_s",
              "capture_s", "wall_s"]].to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
