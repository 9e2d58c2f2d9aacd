"""Oracle figures: wall time of the default case set, every backend's worst error ratio per dtype, false
alarms on correct candidates (goal 0) and planted bugs caught with the right pattern named (goal all).

    python benchmarks/bench_oracle.py --out DIR [--cases default] [--planted-cases quick] [--device auto]

Runs on the CPU (fp32; the same case sizes, there is no "full size" for correctness) and on a GPU (bf16 and
fp16 by default). Every part runs in child processes with deadlines (gpulab.oracle.gate), so a hanging or
faulting kernel costs only its own line; results are written to DIR/bench_oracle.json after every part.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))
os.environ["PYTHONPATH"] = f"{ROOT / 'lib'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"  # for the children

from gpulab import report  # noqa: E402


def _env() -> dict:
    import torch
    env = {"python": platform.python_version(), "torch": torch.__version__, "host": platform.node(),
           "cpu_count": os.cpu_count(), "load_avg": os.getloadavg()}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()
    return env


def _rows(g, part: str, expected: dict | None = None) -> list[dict]:
    rows = []
    for name, r in g.reports.items():
        s = r.summary()
        row = {"part": part, "dtype": "/".join(g.dtypes), "candidate": name, "passed": s["passed"],
               "worst_ratio": s["worst_ratio"], "failed": s["failed"], "cases": s["cases"],
               "unsupported": s["unsupported"], "wall_s": round(r.wall_s, 2), "patterns": s["patterns"],
               "reason": s["reason"][:300]}
        if not r.error and r.results:
            sup = sorted(x["ratio"] for x in r.rows() if x["status"] != "unsupported")
            row["ratio_median"] = sup[len(sup) // 2] if sup else None
            row["unsupported_reasons"] = sorted({x["pattern"][:120] for x in r.rows()
                                                 if x["status"] == "unsupported"})[:5]
            row["failing_cases"] = [x["case"] for x in r.rows() if x["status"] == "fail"][:20]
        if expected is not None:
            row["expected"] = expected[name]
            row["caught"] = not s["passed"]
            row["named"] = expected[name] in s["patterns"]
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="default", choices=("default", "quick"))
    ap.add_argument("--planted-cases", default="quick", choices=("default", "quick"))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtypes", default="auto", help="comma list (float32,bfloat16,float16) or auto")
    ap.add_argument("--timeout", type=float, default=600, help="deadline per candidate and part, seconds")
    a = ap.parse_args(argv)

    from gpulab import oracle
    from gpulab.oracle import candidates
    from gpulab.device import resolve
    from gpulab.workloads import dtype_name

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = resolve(a.device)
    dtypes = oracle.resolve_dtypes(None if a.dtypes == "auto" else a.dtypes.split(","), dev)
    dnames = [dtype_name(d) for d in dtypes]
    result: dict = {"env": _env(), "device": dev, "cases": a.cases, "n_cases": len(oracle.case_set(a.cases)),
                    "planted_cases": a.planted_cases, "dtypes": dnames, "parts": {}, "errors": {}}
    path = out / "bench_oracle.json"
    rows: list[dict] = []

    def save():  # bench_oracle.json (result + rows) and bench_oracle.csv, rewritten after every part
        report.write_rows(out, "bench_oracle", rows, **result)

    def part(name, fn):
        print(f"== {name}", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            got = fn()
            result["parts"][name] = {"ok": True, "wall_s": round(time.monotonic() - t0, 2)}
            return got
        except Exception as exc:  # noqa: BLE001 - one part failing must not lose the others
            result["parts"][name] = {"ok": False, "wall_s": round(time.monotonic() - t0, 2)}
            result["errors"][name] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"
            print(f"   {name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            save()

    # 1. Wall time of the case set for one candidate alone, in-process (torch import excluded).
    def wall():
        walls = {}
        for dt in dnames:
            t0 = time.monotonic()
            rep = oracle.check("sdpa_math", a.cases, dev, [dt], progress=False)
            walls[dt] = {"wall_s": round(time.monotonic() - t0, 2), "passed": rep.passed,
                         "worst_ratio": rep.worst_ratio}
        result["wall_default_set"] = walls
    part("wall", wall)

    # 2. Every correct candidate (vendor backends available here, references, fixes), per dtype.
    correct = list(candidates.available(dev))
    result["unavailable"] = candidates.unavailable(dev)
    for dt in dnames:
        def run_correct(dt=dt):
            g = oracle.gate(correct, a.cases, dev, [dt], out_dir=out / f"correct_{dt}", timeout_s=a.timeout)
            rows.extend(_rows(g, "correct"))
            result.setdefault("gate_wall_s", {})[dt] = round(g.wall_s, 2)
        part(f"correct/{dt}", run_correct)

    # 3. Planted bugs: each must fail with its pattern named.
    plant = candidates.planted()
    expected = {n: p.expected for n, p in plant.items()}
    for dt in dnames:
        def run_planted(dt=dt):
            g = oracle.gate(list(plant), a.planted_cases, dev, [dt], out_dir=out / f"planted_{dt}",
                            timeout_s=a.timeout)
            rows.extend(_rows(g, "planted", expected))
        part(f"planted/{dt}", run_planted)

    corr = [r for r in rows if r["part"] == "correct"]
    pl = [r for r in rows if r["part"] == "planted"]
    result["false_alarms"] = sum(not r["passed"] and r["unsupported"] < r["cases"] for r in corr)
    result["false_alarm_cases"] = sum(r["failed"] for r in corr)
    result["correct_checked"] = len(corr)
    result["planted_caught"] = sum(r["caught"] for r in pl)
    result["planted_named"] = sum(r["caught"] and r["named"] for r in pl)
    result["planted_checked"] = len(pl)
    save()

    cols = ("part", "dtype", "candidate", "passed", "worst_ratio", "failed", "cases", "unsupported", "wall_s",
            "expected", "named")

    def cell(v):
        return f"{v:.3g}" if isinstance(v, float) else ("" if v is None else str(v))
    if rows:  # plain formatting: pandas may be missing on the GPU host
        table = [[cell(r.get(c)) for c in cols] for r in rows]
        widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
        print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
        for t in table:
            print("  ".join(x.ljust(w) for x, w in zip(t, widths)))
    for name, w in (result.get("wall_default_set") or {}).items():
        print(f"wall time, {a.cases} set ({result['n_cases']} cases), sdpa_math {name} on {dev}: {w['wall_s']} s")
    print(f"false alarms on correct candidates: {result['false_alarms']} of {result['correct_checked']} "
          f"(failing cases: {result['false_alarm_cases']}); planted bugs caught: {result['planted_caught']} of "
          f"{result['planted_checked']}, pattern named: {result['planted_named']}; "
          f"errors in parts: {list(result['errors']) or 'none'}")
    print(f"wrote {path}")
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
