"""Figure: instructions per op of each recorder mode, counted by valgrind's callgrind, not timed.

On a shared CPU the wall-clock ratios of bench_trace_overhead.py swing between runs (1.35x-2.88x for the
same variants on this project's 2-core VM on one idle afternoon). Instructions executed do not depend on the
neighbours: the same program (userbench.PROGRAM's tiny-op loop) runs under each variant at two loop lengths,
and the difference of the two totals, divided by the difference in ops, is the cost of one op with start-up
and imports cancelled out. An instruction count is not a time (cache misses and branch mispredictions are
not in it), so this settles the work each mode adds per op, not its seconds.

    python benchmarks/bench_trace_instructions.py --out /tmp/ti [--ops 1000,4000] [--variants passthrough,ops,auto]
    python benchmarks/bench_trace_instructions.py --out /tmp/ti --work step --ops 1,3
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from gpulab import proc  # noqa: E402
from gpulab.trace import userbench  # noqa: E402

_REFS = re.compile(rb"^(?:summary|totals):\s+(\d+)", re.M)


def count(v: userbench.Variant, n: int, out: Path, work: str) -> int:
    """Instructions of the whole program (every process it starts): a loop of n tiny ops run twice, or n
    training steps run twice (plus two more, the program's warm-up and op count)."""
    d = out / f"{work}-{v.name}-{n}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    what = ["--tiny", str(n), "--blocks", "1"] if work == "tiny" else ["--steps", str(n), "--step-blocks", "1"]
    program = [str(out / "program.py"), str(d / "result.json"), "--device", "cpu", *what]
    cmd = ["valgrind", "--tool=callgrind", "--trace-children=yes", f"--callgrind-out-file={d}/cg.%p",
           *userbench.variant_command(v, program, d / "ops.log")]
    with open(d / "valgrind.log", "w") as err:
        res = proc.run(cmd, timeout_s=1200, env=userbench.child_env(v.env), stdout=err, stderr=subprocess.STDOUT)
    if res.returncode != 0:
        raise RuntimeError(f"{v.name} n={n}: exit {res.returncode}; see {d / 'valgrind.log'}")
    total = 0
    for f in d.glob("cg.*"):
        m = _REFS.search(f.read_bytes())
        total += int(m.group(1)) if m else 0
    return total


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ops", default="1000,4000", help="two loop lengths (each loop runs twice: warm-up, timed)")
    ap.add_argument("--work", default="tiny", choices=("tiny", "step"),
                    help="tiny CPU ops, or the built-in training step (--ops then counts steps, e.g. 1,3)")
    ap.add_argument("--variants", default="passthrough,ops,auto")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    n1, n2 = (int(x) for x in a.ops.split(","))
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "program.py").write_text(userbench.PROGRAM)
    variants = userbench.pick_variants(userbench.standard_variants("cpu"), a.variants)
    jobs = [(v, n) for v in variants for n in (n1, n2)]
    with ThreadPoolExecutor(a.jobs) as pool:
        counts = dict(zip([(v.name, n) for v, n in jobs], pool.map(lambda j: count(j[0], j[1], a.out, a.work), jobs)))
    per_unit = 1
    if a.work == "step":   # ops per step, as the program counted them
        res = json.loads((a.out / f"step-none-{n1}" / "result.json").read_text())["transformer_step"]
        per_unit = res["ops_per_unit"] // res["steps_per_unit"]
    per_op = {v.name: (counts[(v.name, n2)] - counts[(v.name, n1)]) / (2 * (n2 - n1) * per_unit) for v in variants}
    base = per_op.get("passthrough")
    rows = [{"variant": k, "instructions_per_op": round(x), "vs_passthrough": round(x / base, 3) if base else None,
             "totals": [counts[(k, n1)], counts[(k, n2)]]} for k, x in per_op.items()]
    (a.out / f"instructions_{a.work}.json").write_text(json.dumps({"work": a.work, "lengths": [n1, n2],
                                                                    "ops_per_step": per_unit, "rows": rows}, indent=2) + "\n")
    what = "tiny CPU ops" if a.work == "tiny" else f"the built-in training step ({per_unit} ops a step)"
    print(f"{what}, instructions per op (callgrind; loops of {n1} and {n2}, each run twice)")
    for r in rows:
        print(f"  {r['variant']:<12} {r['instructions_per_op']:>9,}  {r['vs_passthrough'] or '-'}x pass-through")
    return 0


if __name__ == "__main__":
    sys.exit(main())
