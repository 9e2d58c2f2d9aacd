"""Bisection cost (README figure): probes and wall time to the minimal failing configuration.

Parts (each independent; a failure is recorded and the rest still run):
  threshold     a native deadlock from seq 65 on (CPU, no op log): --space seq=128:1 --space heads=8:1;
                probes per dimension against the goal ceil(log2 M) + 2
  intermittent  the same hang in every 4th launch only (a known rate of 25%): the repeats needed for 95%
                detection, ceil(log 0.05 / log 0.75) = 11, then the ladder's interval and the bisection
  gpu           (CUDA) a kernel that spins forever from 65 rows on, the host blocking later in .item():
                the ladder, the bisection and the op replay under the GPU-localizing mode

    python benchmarks/bench_bisect.py --out DIR [--parts threshold,intermittent,gpu] [--stall S]

Writes DIR/bisect_bench.json and .csv, and each part's products under DIR/<part>/; prints a table last.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from gpulab import report, trace  # noqa: E402
from gpulab.hang.investigation import bisect, ladder, repro
from gpulab.hang.watchdog import watch  # noqa: E402

FIX = ROOT / "tests" / "fixtures"
PY = sys.executable


def threshold(out: Path, stall: float) -> dict:
    t0 = time.monotonic()
    res = bisect.run([PY, str(FIX / "threshold_hang.py"), "--seq", "{seq}", "--heads", "{heads}"],
                     [bisect.IntDim("seq", 128, 1), bisect.IntDim("heads", 8, 1)], out_dir=out, stall_s=stall,
                     timeout_s=120, record=False, progress=lambda m: None)
    per = {d: sum(1 for p in res.probes if p.dimension == d) for d in ("seq", "heads")}
    return {"part": "threshold", "minimal": res.minimal, "probes_seq": per["seq"],
            "goal_seq": math.ceil(math.log2(128)) + 2, "probes_heads": per["heads"],
            "goal_heads": math.ceil(math.log2(8)) + 2, "probes_total": len(res.probes),
            "wall_s": round(time.monotonic() - t0, 1)}


def intermittent(out: Path, stall: float) -> dict:
    rate = 0.25
    repeats = ladder.trials_to_detect(rate)
    counter = out / "launches"
    out.mkdir(parents=True, exist_ok=True)
    counter.write_text("0")
    cmd = [PY, str(FIX / "threshold_hang.py"), "--every", "4", "--counter", str(counter), "--seq"]
    t0 = time.monotonic()
    lad = ladder.run([ladder.Rung("big", tuple(cmd + ["80"]))], repeats=20, jobs=2, stall_s=stall, timeout_s=120,
                     out_dir=out / "ladder", record=False, stacks=False, progress=lambda m: None)
    t_lad = time.monotonic() - t0
    r = lad.rungs[0]
    t1 = time.monotonic()
    res = bisect.run(cmd + ["{seq}"], [bisect.IntDim("seq", 128, 1)], out_dir=out / "bisect", repeats=repeats,
                     stall_s=stall, timeout_s=120, record=False, progress=lambda m: None)
    return {"part": "intermittent", "true_rate": rate, "ladder_failed": r.trials - r.counts["pass"],
            "ladder_trials": r.trials, "ladder_ci": [round(x, 3) for x in r.fail_rate_ci],
            "ci_holds_true_rate": r.fail_rate_ci[0] <= rate <= r.fail_rate_ci[1], "repeats_for_95pct": repeats,
            "minimal": res.minimal, "probes_total": len(res.probes),
            "trials_total": sum(sum(p.counts.values()) for p in res.probes),
            "ladder_wall_s": round(t_lad, 1), "wall_s": round(time.monotonic() - t1, 1)}


def gpu(out: Path, stall: float, mode: str) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"part": "gpu", "skipped": "no CUDA device"}
    spin = [PY, str(FIX / "gpu_threshold_spin.py"), "--n"]
    t0 = time.monotonic()
    lad = ladder.run([ladder.Rung("small", tuple(spin + ["32"])), ladder.Rung("big", tuple(spin + ["80"]))],
                     repeats=2, stall_s=stall, timeout_s=180, out_dir=out / "ladder", mode=mode,
                     progress=lambda m: print(f"  [ladder] {m}", flush=True))
    t_lad = time.monotonic() - t0
    first = next(r for r in lad.rungs if r.failed) if lad.first_failing_rung else None
    t1 = time.monotonic()
    res = bisect.run(spin + ["{n}", "--heads", "{heads}"], [bisect.IntDim("n", 128, 1), bisect.IntDim("heads", 4, 1)],
                     out_dir=out / "bisect", stall_s=stall, timeout_s=180, mode=mode,
                     progress=lambda m: print(f"  [bisect] {m}", flush=True))
    t_bis = time.monotonic() - t1
    v = watch.run(spin + ["80"], stall_s=stall, timeout_s=180, mode=mode, out_dir=out / "watch",
                  progress=lambda m: None)
    records = trace.read(Path(v.log["dir"]) / v.log["op_log"]).records if v.log.get("op_log") else ()
    t2 = time.monotonic()
    rep = repro.make(v, records, out / "repro", stall_s=stall, timeout_s=180,
                     progress=lambda m: print(f"  [repro] {m}", flush=True))
    return {"part": "gpu", "mode": mode, "ladder": {r.name: f"{r.trials - r.counts['pass']}/{r.trials}" for r in lad.rungs},
            "first_failure_op": ((first.first_failure or {}).get("in_flight_op") or {}).get("name") if first else None,
            "first_failure_host_blocked_in": ((first.first_failure or {}).get("host_blocked_in") or {}).get("name")
            if first else None,
            "minimal": res.minimal, "probes_total": len(res.probes),
            "watch_in_flight": (v.in_flight_op or {}).get("name"), "watch_class": v.cls,
            "repro_verified": rep.verified, "repro_candidates": [(c.ops, c.status, c.in_flight_op) for c in rep.candidates],
            "ladder_wall_s": round(t_lad, 1), "bisect_wall_s": round(t_bis, 1),
            "repro_wall_s": round(time.monotonic() - t2, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default="threshold,intermittent,gpu")
    ap.add_argument("--stall", type=float, default=1.5, help="stall window of the CPU parts (the GPU part uses 5 s)")
    ap.add_argument("--gpu-mode", default="gpu", help="recording mode of the GPU part")
    a = ap.parse_args()
    rows, errors = [], {}
    for part in a.parts.split(","):
        print(f"== {part}", flush=True)
        try:
            if part == "gpu":
                rows.append(gpu(a.out / part, max(a.stall, 5.0), a.gpu_mode))
            else:
                rows.append({"threshold": threshold, "intermittent": intermittent}[part](a.out / part, a.stall))
        except Exception as exc:  # noqa: BLE001 - one part's failure must not lose the others
            errors[part] = "".join(traceback.format_exception(exc))[-3000:]
            print(errors[part], file=sys.stderr)
        report.write_rows(a.out, "bisect_bench", rows, errors=errors)
    for r in rows:
        print(r)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
