"""Figure: time from the stall of a multi-process job to its cross-process verdict (goal: under 15 s for 4
gloo ranks on the CPU and 2 NCCL ranks on two GPUs; the NCCL flight recorder dumps on the watchdog's
timeout, 10 minutes by default), and the verdicts of real training hangs (goal: the rank that left or
skipped and its line, the collective and its sequence number, a class that is not unknown, within the stall
window + 5 s of the ranks' last progress).

Each trial is a real job under `gpulab.hang.watchdog.watch`: ranks by mp.spawn or torchrun, DataLoader workers, with
one process doing the wrong thing (tests/fixtures/dist_job.py, nccl_job.py, train_job.py: DDP, FSDP2 and the
functional collectives). Reported per case: the stall window, the time from the ranks' last progress to the
verdict, the capture alone, the verdict's class, culprit, collective, sequence number and the culprit's line.
Writes trials.csv and summary.json under --out.

    python benchmarks/bench_job_verdict.py --out /tmp/jobv [--cases train,gloo4_skip,...] [--stall 5]
    python benchmarks/bench_job_verdict.py --out /tmp/jobv --cases gpu      # two GPUs: NCCL cases
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from gpulab.hang.watchdog import watch  # noqa: E402

DIST, NCCL = ROOT / "tests" / "fixtures" / "dist_job.py", ROOT / "tests" / "fixtures" / "nccl_job.py"
TRAIN = str(ROOT / "tests" / "fixtures" / "train_job.py")
TORCHRUN = ["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
TRAIN_CASES = {
    "ddp2_uneven_torchrun": [*TORCHRUN, TRAIN, "uneven"],
    "ddp2_uneven_spawn": ["python", TRAIN, "uneven"],
    "ddp2_nan_torchrun": [*TORCHRUN, TRAIN, "nan"],
    "ddp2_barrier_spawn": ["python", TRAIN, "barrier"],
    "funcol2_nan_spawn": ["python", TRAIN, "nan", "--wrap", "none"],
    "funcol2_uneven_torchrun": [*TORCHRUN, TRAIN, "uneven", "--wrap", "none"],
    "fsdp2_uneven_spawn": ["python", TRAIN, "uneven", "--wrap", "fsdp"],
    "fsdp2_uneven_torchrun": [*TORCHRUN, TRAIN, "uneven", "--wrap", "fsdp"],
}
GPU_CASES = {
    "nccl2_ddp_uneven_torchrun": [*TORCHRUN, TRAIN, "uneven", "--backend", "nccl"],
    "nccl2_ddp_nan_spawn": ["python", TRAIN, "nan", "--backend", "nccl"],
    "nccl2_funcol_nan_torchrun": [*TORCHRUN, TRAIN, "nan", "--backend", "nccl", "--wrap", "none"],
    "nccl2_fsdp_uneven_spawn": ["python", TRAIN, "uneven", "--backend", "nccl", "--wrap", "fsdp"],
    "nccl2_ddp_branch_spawn": ["python", TRAIN, "branch", "--backend", "nccl"],
}
CASES = {
    **TRAIN_CASES, **GPU_CASES,
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
                   help=f"comma-separated subset of {', '.join(CASES)}; 'train': the CPU training cases; "
                        "'gpu': the NCCL training cases")
    p.add_argument("--stall", type=float, default=5.0)
    p.add_argument("--repeats", type=int, default=1)
    a = p.parse_args(argv)
    groups = {"train": list(TRAIN_CASES), "gpu": list(GPU_CASES)}
    cases = [x for c in a.cases.split(",") if c for x in groups.get(c, [c])]
    bad = [c for c in cases if c not in CASES]
    if bad:
        p.error(f"unknown case(s) {bad}; choose from {', '.join(CASES)}")
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in cases:
        for r in range(a.repeats):
            t0 = time.monotonic()
            run_dir = a.out / "runs" / f"{case}_r{r}"
            command = CASES[case] + (["--folder", str(run_dir / "ckpt")] if TRAIN in CASES[case] else [])
            (run_dir / "ckpt").mkdir(parents=True, exist_ok=True)
            v = watch.run(command, stall_s=a.stall, timeout_s=240, out_dir=run_dir, progress=lambda m: None)
            div = v.divergence or {}
            ranks = [p for p in v.processes if p.get("kind") == "rank"]
            culprit = next((p for p in v.processes if p.get("role") == v.culprit), {})
            # the ranks' last progress, before the capture; the capture's own time comes on top
            ranks_quiet = min((p["last_progress_s"] for p in ranks if p.get("last_progress_s") is not None),
                              default=None)
            rows.append({"case": case, "repeat": r, "status": v.status, "class": v.cls, "culprit": v.culprit,
                         "group": div.get("group"), "seq": div.get("seq"), "op": div.get("op"),
                         "line": (culprit.get("frame") or "")[:70], "processes": len(v.processes),
                         "stall_s": a.stall,
                         "stall_to_verdict_s": round(v.time_to_verdict_s - a.stall, 2)
                         if v.time_to_verdict_s is not None else None,
                         "last_progress_to_verdict_s": v.time_to_verdict_s,
                         "ranks_progress_to_verdict_s": round(ranks_quiet + (v.capture_s.get("total") or 0), 2)
                         if ranks_quiet is not None else None,
                         "capture_s": v.capture_s.get("total"), "capture_processes_s": v.capture_s.get("processes"),
                         "wall_s": round(time.monotonic() - t0, 2)})
            print(json.dumps(rows[-1]), flush=True)
    import pandas as pd

    df = pd.DataFrame(rows)
    df.to_csv(a.out / "trials.csv", index=False)
    (a.out / "summary.json").write_text(json.dumps(rows, indent=1))
    print(df[["case", "status", "class", "culprit", "op", "seq", "line", "stall_s", "ranks_progress_to_verdict_s",
              "capture_s", "wall_s"]].to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
