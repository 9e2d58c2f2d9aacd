"""Figure: `gpulab compare`'s time against the two runs' own (goal: at most their time + 30 s), with its verdict.

Each case is a fixture program run bare once per side (as the user runs it), then compared with `--vary`; the
verdict's status, op, line and pass come from the comparison's JSON. Writes cases.json under --out; prints a table.

    python benchmarks/bench_compare_time.py --out DIR [--device cuda] [--cases conv_default,gpt_on]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from gpulab import proc  # noqa: E402

FIX = ROOT / "tests" / "fixtures" / "numerics"
# name -> (KEY=REF,CAND for --vary, the program and its arguments, {KEY} where the side goes)
CASES = {
    "conv_default": ("device=cpu,{dev}", ["conv_train.py", "--tf32", "default", "--device", "{device}"]),
    "conv_matmul": ("device=cpu,{dev}", ["conv_train.py", "--tf32", "matmul", "--device", "{device}"]),
    "conv_off": ("device=cpu,{dev}", ["conv_train.py", "--tf32", "off", "--device", "{device}"]),
    "gpt_on": ("device=cpu,{dev}", ["gpt_train.py", "--tf32", "on", "--device", "{device}"]),
    "gpt_off": ("device=cpu,{dev}", ["gpt_train.py", "--tf32", "off", "--device", "{device}"]),
    "layers": ("device=cpu,{dev}", ["layers_train.py", "--device", "{device}"]),
}


def _timed(argv: list[str], out: Path, label: str, timeout_s: float) -> tuple[float, int | None]:
    t0 = time.monotonic()
    r = proc.run(argv, timeout_s=timeout_s, stdout=out / f"{label}.log", stderr=subprocess.STDOUT, label=label)
    return time.monotonic() - t0, r.returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda", help="the candidate's device (the reference runs on the CPU)")
    p.add_argument("--cases", default=",".join(CASES), help=f"subset of {', '.join(CASES)}")
    p.add_argument("--timeout", type=float, default=600.0)
    a = p.parse_args(argv)
    names = [c for c in a.cases.split(",") if c]
    bad = [c for c in names if c not in CASES]
    if bad:
        p.error(f"unknown case(s) {bad}; choose from {', '.join(CASES)}")
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        vary, prog = CASES[name]
        vary = vary.format(dev=a.device)
        key, values = vary.split("=")
        cmd = [sys.executable, str(FIX / prog[0]), *prog[1:]]
        bare = [_timed([x.replace("{" + key + "}", v) for x in cmd], a.out, f"{name}.{v}", a.timeout)[0]
                for v in values.split(",")]
        js = a.out / f"{name}.json"
        took, rc = _timed([sys.executable, "-m", "gpulab", "compare", "--json", str(js), "--out", str(a.out / name),
                           "--vary", vary, "--", *cmd], a.out, f"{name}.compare", a.timeout)
        got = json.loads(js.read_text()) if js.exists() else {}
        fd = got.get("first_divergence") or {}
        rows.append({"case": name, "bare_s": [round(b, 1) for b in bare], "compare_s": round(took, 1),
                     "over_runs_s": round(took - sum(bare), 1), "status": got.get("status"), "op": fd.get("op"),
                     "call_site": fd.get("call_site"), "pass": fd.get("pass"), "exit": rc,
                     "summary": got.get("summary")})
        print(f"{name}: {rows[-1]['status']} in {took:.1f} s (runs alone {' + '.join(f'{b:.1f}' for b in bare)} s)",
              file=sys.stderr, flush=True)
    (a.out / "cases.json").write_text(json.dumps(rows, indent=1))
    print(f"{'case':14} {'status':9} {'compare s':>9} {'runs s':>8} {'over s':>7}  op (pass)")
    for r in rows:
        print(f"{r['case']:14} {str(r['status']):9} {r['compare_s']:9.1f} {sum(r['bare_s']):8.1f} "
              f"{r['over_runs_s']:7.1f}  {r['op'] or ''} ({r['pass'] or ''})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
