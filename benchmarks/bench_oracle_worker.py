"""Notebook 05's gate: one fresh child per candidate against one warm worker (gpulab.pool), side by side.

    python benchmarks/bench_oracle_worker.py --out DIR [--cases quick] [--device auto] [--repeats 2]

Three ways to run the same gate (notebook 05's candidates, the cases asked for), timed from the parent:

- per_child: every candidate in a fresh `python -m gpulab.oracle` child (interpreter, torch and CUDA start-up
  and the gold paid once per candidate): what isolating each candidate cost before the warm worker;
- before: the gate as it was: all candidates in one shared child, and when that child failed (one candidate
  hangs or crashes) every candidate again, each in a fresh child;
- warm: oracle.gate now: every (case, candidate) a job in one warm worker, a lost worker replaced.

Each runs on the clean candidate list and on the list plus one candidate that aborts its process. The reports
are compared (all but wall times): the three must agree. Results: DIR/bench_oracle_worker.json.
"""
from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))
os.environ["PYTHONPATH"] = f"{ROOT / 'lib'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"  # for the children

from gpulab import proc, report  # noqa: E402

NOTEBOOK_05 = ["math", "flash", "efficient", "cudnn", "decomposed", "tiled"]  # its default `candidates`
ABORT = "bench_abortmod:attn"


def one_child(specs, cases, dev, dts, timeout_s, tmp: Path) -> dict:
    """check_many() of specs in one fresh `python -m gpulab.oracle` child: {name: summary} or {spec: error}."""
    res = tmp / f"r{time.monotonic_ns()}.pkl"
    argv = [sys.executable, "-m", "gpulab.oracle", "--cases", cases, "--pickle", str(res), "--device", dev,
            "--dtypes", ",".join(dts)] + [x for s in specs for x in ("--candidate", s)]
    r = proc.run(argv, timeout_s=timeout_s, stdout=tmp / "child.log", stderr=tmp / "child.log", label="oracle")
    if r.status != "ok" or not res.exists():
        return {s: {"passed": False, "error": r.status} for s in specs}
    with open(res, "rb") as fh:
        return {n: rep.summary() for n, rep in pickle.load(fh).items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="quick", choices=("default", "quick"))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900)
    a = ap.parse_args(argv)

    from gpulab import oracle
    from gpulab.device import resolve
    from gpulab.oracle import candidates
    from gpulab.workloads import dtype_name

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-oracle-worker-"))
    (tmp / "bench_abortmod.py").write_text(textwrap.dedent("""
        import os
        def attn(q, k, v, attn_mask=None, is_causal=False, scale=None):
            os.abort()
    """))
    os.environ["PYTHONPATH"] = f"{tmp}{os.pathsep}{os.environ['PYTHONPATH']}"
    sys.path.insert(0, str(tmp))  # gate() resolves the candidates here too
    dev = resolve(a.device)
    dts = [dtype_name(d) for d in oracle.resolve_dtypes(None, dev)]
    avail = candidates.available(dev)
    clean = [c.name for c in candidates.resolve([n for n in NOTEBOOK_05
                                                 if candidates.ALIASES.get(n, n) in avail], dev)]
    import torch
    result = {"device": dev, "gpu": torch.cuda.get_device_name(0) if dev.startswith("cuda") else None,
              "cpu_count": os.cpu_count(), "load_avg_start": os.getloadavg(), "cases": a.cases,
              "n_cases": len(oracle.case_set(a.cases)), "dtypes": dts, "repeats": a.repeats, "runs": []}

    def per_child(specs):
        got = {}
        for s in specs:
            got.update(one_child([s], a.cases, dev, dts, a.timeout, tmp))
        return got

    def before(specs):
        got = one_child(specs, a.cases, dev, dts, a.timeout * len(specs), tmp)
        return per_child(specs) if any("error" in v for v in got.values()) else got

    def warm(specs):
        g = oracle.gate(specs, a.cases, dev, dts, timeout_s=a.timeout)
        return {n: {**r.summary(), **({"error": r.error.split(" ")[0]} if r.error else {})}
                for n, r in g.reports.items()}

    def same(x, y):
        strip = lambda d: {n: {k: v for k, v in s.items() if k not in ("wall_s", "reason", "error")}  # noqa: E731
                           for n, s in d.items() if "error" not in s}
        return strip(x) == strip(y) and {n for n, s in x.items() if "error" in s} == \
            {n for n, s in y.items() if "error" in s}

    for label, specs in (("clean", clean), ("one_aborts", clean[:2] + [ABORT] + clean[2:])):
        for rep in range(a.repeats):
            walls, got = {}, {}
            for mode, fn in (("per_child", per_child), ("before", before), ("warm", warm)):
                t0 = time.monotonic()
                got[mode] = fn(specs)
                walls[mode] = round(time.monotonic() - t0, 2)
            row = {"set": label, "repeat": rep, "candidates": specs, **{f"{m}_s": w for m, w in walls.items()},
                   "per_child/warm": round(walls["per_child"] / walls["warm"], 2),
                   "before/warm": round(walls["before"] / walls["warm"], 2),
                   "agree": same(got["per_child"], got["warm"]) and same(got["before"], got["warm"])}
            result["runs"].append(row)
            print(f"{label} #{rep}: per_child {walls['per_child']} s, before {walls['before']} s, warm "
                  f"{walls['warm']} s; per_child/warm {row['per_child/warm']}x, before/warm {row['before/warm']}x; "
                  f"reports agree: {row['agree']}", flush=True)
            report.write_json(out / "bench_oracle_worker.json", result)
    result["load_avg_end"] = os.getloadavg()
    report.write_json(out / "bench_oracle_worker.json", result)
    print(f"wrote {out / 'bench_oracle_worker.json'}")
    return 0 if all(r["agree"] for r in result["runs"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
