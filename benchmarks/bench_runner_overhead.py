"""The runner's own cost per notebook: papermill + kernel start + parameter injection, and HTML rendering.

Runs a throwaway chain of trivial notebooks (one cell that records a metric) so that everything measured
is overhead, then, with --smoke, the real smoke chain (params/smoke.yaml) for its wall time and the same
split per notebook.   python benchmarks/bench_runner_overhead.py --out /tmp/ro [--n 5] [--smoke]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def split(run_json: Path) -> list[dict]:
    run = json.loads(run_json.read_text())
    rows = []
    for sc in run["scenarios"]:
        for nb in sc["notebooks"]:
            if nb.get("duration_s") is None:
                continue
            rows.append({"scenario": sc["name"], "notebook": nb["name"], "status": nb["status"],
                         "wall_s": nb["duration_s"], "cells_s": nb["cells_s"],
                         "overhead_s": nb["duration_s"] - (nb["cells_s"] or 0.0), "render_s": nb["render_s"]})
    return rows


def trivial_chain(n: int, out: Path) -> list[dict]:
    from nbfactory import RECORD, notebook, project
    from gpulab.chain import runner

    tmp = Path(tempfile.mkdtemp(prefix="gpulab-ro-"))
    nbs = {f"{i:02d}_t": notebook(f"T{i}", "", RECORD.format(name=f"{i:02d}_t", headline="x")) for i in range(1, n + 1)}
    proj = project(tmp, nbs)
    code, idx = runner.run(runner.RunConfig(root=proj, out=out / "trivial"), progress=lambda m: None)
    assert code == 0, "trivial chain failed"
    return split(idx.parent / "run.json")


def smoke_chain(out: Path) -> tuple[float, list[dict]]:
    from gpulab.chain import runner

    t0 = time.monotonic()
    cfg = runner.RunConfig(root=ROOT, out=out / "smoke", param_files=(str(ROOT / "params" / "smoke.yaml"),))
    code, idx = runner.run(cfg)
    return time.monotonic() - t0, split(idx.parent / "run.json")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    result = {"trivial": trivial_chain(a.n, a.out)}
    if a.smoke:
        wall, rows = smoke_chain(a.out)
        result["smoke_wall_s"], result["smoke"] = wall, rows
    (a.out / "runner_overhead.json").write_text(json.dumps(result, indent=2))
    t = result["trivial"]
    print(f"trivial notebooks: n={len(t)}  papermill+kernel overhead median {statistics.median(r['overhead_s'] for r in t):.2f} s"
          f"  render (2 HTML) median {statistics.median(r['render_s'] for r in t):.2f} s")
    if a.smoke:
        print(f"smoke chain wall: {result['smoke_wall_s']:.1f} s")
        print(f"{'notebook':<20}{'status':<8}{'wall s':>8}{'cells s':>9}{'overhead s':>11}{'render s':>9}")
        for r in result["smoke"]:
            print(f"{r['notebook']:<20}{r['status']:<8}{r['wall_s']:>8.1f}{r['cells_s']:>9.1f}{r['overhead_s']:>11.1f}{r['render_s']:>9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
