"""Figure: the watchdog's own CPU while it watches, against the job's (a watch runs for days beside training).

A real CPU training loop (`tests/fixtures/checkpoint_pause.py`, no pause) under `gpulab watch` with the default
poll, alone and as two torchrun ranks (`tests/fixtures/dist_job.py ok`); the watchdog runs in this process, so its
CPU is this process's, and the job's is its reaped children's. Writes summary.json under --out; prints a table.

    python benchmarks/bench_watch_cpu.py --out /tmp/wcpu [--steps 300]
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from gpulab.hang.watchdog import watch  # noqa: E402

FIX = ROOT / "tests" / "fixtures"


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def one(name: str, command: list[str], out: Path) -> dict:
    me, kids, t0 = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), time.monotonic()
    v = watch.run(command, stall_s=30.0, out_dir=out / name, native_tools=(), echo=False)
    wall = time.monotonic() - t0
    mine, theirs = _cpu(resource.RUSAGE_SELF) - me, _cpu(resource.RUSAGE_CHILDREN) - kids
    return {"case": name, "status": v.status, "wall_s": round(wall, 1), "watchdog_cpu_s": round(mine, 2),
            "job_cpu_s": round(theirs, 2), "watchdog_share_of_a_core": round(mine / wall, 4),
            "watchdog_per_job_cpu": round(mine / theirs, 4) if theirs else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--steps", type=int, default=300)
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    rows = [one("one process", [sys.executable, str(FIX / "checkpoint_pause.py"), "--steps", str(a.steps),
                                "--at", "0"], a.out),
            one("two torchrun ranks", [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                       "--nproc-per-node", "2", str(FIX / "dist_job.py"), "ok"], a.out)]
    (a.out / "summary.json").write_text(json.dumps(rows, indent=1))
    print("| case | verdict | wall | watchdog CPU | job CPU | watchdog, share of a core |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['status']} | {r['wall_s']} s | {r['watchdog_cpu_s']} s | {r['job_cpu_s']} s | "
              f"{100 * r['watchdog_share_of_a_core']:.1f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
