"""Time to the index from a capture: `gpulab watch` catches a real failing program, then `gpulab run --from
CAPTURE` runs the chain on what it caught (the job is not run again; 04 tries fixes on the repro or on a
shorter command). Per case: the watch's wall time, the chain's wall time until the index is written, the
index's verdict and next step, and for a job of ranks whether 03's cross-rank verdict is the one `gpulab merge`
gives. Goal: the index's verdict and next step in under 4 minutes on the CPU.

    python benchmarks/bench_run_from.py --out DIR [--cases single,ranks] [--stall 3]

Cases (tests/fixtures): single (a custom op that deadlocks on a native mutex, GIL released; 04's fixes tried
on the program itself as -p repro), ranks (two gloo ranks, one skips a collective). Writes DIR/results.json
and prints a table.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from gpulab import proc  # noqa: E402
from gpulab.hang.jobs import merge  # noqa: E402

FIX = ROOT / "tests" / "fixtures"
CASES = {
    "single": ([str(FIX / "custom_op_deadlock.py"), "--gil", "released"], True),
    "ranks": ([str(FIX / "dist_job.py"), "skip", "--world", "2"], False),
}


def gpulab(args: list[str], timeout_s: float, log: Path) -> tuple[int | None, float]:
    r = proc.run([sys.executable, "-m", "gpulab", *args], timeout_s=timeout_s, cwd=ROOT, stdout=log,
                 stderr=log.with_suffix(".err.txt"))
    return r.returncode, r.elapsed_s


def run_case(name: str, out: Path, stall: float, limit_s: float) -> dict:
    program, repro = CASES[name]
    cap, chain = out / name / "capture", out / name / "chain"
    cap.parent.mkdir(parents=True, exist_ok=True)
    rc_w, t_watch = gpulab(["watch", "--stall", str(stall), "--quiet", "--status-every", "0", "--out", str(cap),
                            "--", sys.executable, *program], 300, out / name / "watch.txt")
    params = ["--params", "params/smoke.yaml"]
    if repro:
        params += ["-p", "repro=" + " ".join([sys.executable, *program])]
    rc_c, t_chain = gpulab(["run", "--from", str(cap), "--out", str(chain), *params], limit_s,
                           out / name / "chain.txt")
    latest = (chain / "latest").resolve() if (chain / "latest").exists() else None
    run = json.loads((latest / "run.json").read_text()) if latest else {}
    sc = (run.get("scenarios") or [{}])[0]
    row = {"case": name, "watch_exit": rc_w, "watch_s": round(t_watch, 1), "chain_exit": rc_c,
           "chain_s": round(t_chain, 1), "verdict": sc.get("verdict"), "evidence": sc.get("evidence"),
           "next_step": sc.get("next_step")}
    if name == "ranks" and latest:
        _, found = merge.merge([cap])
        m = json.loads((latest / "baseline" / "metrics.json").read_text())
        m03 = (m.get("03_bisect_hang") or {}).get("metrics") or {}
        row["same_as_merge"] = (m03.get("class"), m03.get("culprit")) == (found.cls, found.culprit)
        row["merge"] = f"{found.cls}, {found.culprit}"
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--stall", type=float, default=3.0)
    ap.add_argument("--limit", type=float, default=600.0, help="seconds before a chain is stopped")
    a = ap.parse_args(argv)
    names = [n for n in a.cases.split(",") if n]
    bad = [n for n in names if n not in CASES]
    if bad:
        ap.error(f"unknown case(s) {', '.join(bad)}; choose from {', '.join(CASES)}")
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        print(f"[bench_run_from] {name}: watching, then gpulab run --from", file=sys.stderr, flush=True)
        rows.append(run_case(name, a.out, a.stall, a.limit))
        (a.out / "results.json").write_text(json.dumps(rows, indent=1))
    for r in rows:
        print(f"{r['case']}: watch {r['watch_s']} s (exit {r['watch_exit']}), run --from {r['chain_s']} s "
              f"(exit {r['chain_exit']}); verdict {r['verdict']}: {r['evidence']}")
        print(f"   next step: {r['next_step']}")
        if "same_as_merge" in r:
            print(f"   03 as gpulab merge gives it ({r['merge']}): {r['same_as_merge']}")
    return 0 if all(r["chain_exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
