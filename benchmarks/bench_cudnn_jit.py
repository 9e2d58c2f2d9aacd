"""What cuDNN's attention costs at first use, by the state of the CUDA driver's JIT cache: why notebook 05 on a
freshly started GPU machine is slower than on the same machine later.

    python benchmarks/bench_cudnn_jit.py --out DIR [--parts 3] [--splits-only]

The cudnn candidate alone over the oracle's 320 default cases (bfloat16), the first call of each shape timed,
in fresh child processes: with an empty cache (CUDA_CACHE_PATH a new folder), again with that cache filled,
with the cache off (CUDA_CACHE_DISABLE=1), and the cases split over --parts processes side by side (empty
cache, then none). `--parts 3,6,8 --splits-only`: only the split variants with an empty cache, one per count
(how many oracle workers side by side pay off). Prints one JSON line per variant and writes
DIR/cudnn_jit.json. Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from gpulab import proc  # noqa: E402


def part(k: int, n: int) -> None:
    """In a child: the first call of every k-th of n cases; prints its seconds."""
    import warnings

    import torch

    from gpulab.oracle import cases as C
    from gpulab.oracle.candidates import sdpa_backend
    warnings.filterwarnings("ignore")   # 'cudnn SDPA does not support ...': those cases are refused, as in 05
    torch.zeros(1, device="cuda")
    first = 0.0
    for i, case in enumerate(C.case_set("default")):
        if i % n != k:
            continue
        inp = C.make_inputs(case, torch.bfloat16, "cuda")
        torch.cuda.synchronize()
        t = time.perf_counter()
        try:
            sdpa_backend(inp["q"], inp["k"], inp["v"], attn_mask=inp["attn_mask"], is_causal=case.causal,
                         scale=case.scale, enable_gqa=case.gqa, backend="cudnn")
        except RuntimeError:
            pass
        torch.cuda.synchronize()
        first += time.perf_counter() - t
    print(json.dumps({"first_calls_s": round(first, 2)}))


def variant(name: str, parts: int, env: dict, out: Path) -> dict:
    """`parts` children side by side under `env`; the wall time and each child's first-call seconds."""
    t0 = time.monotonic()
    kids = [proc.Child([sys.executable, __file__, "--part", str(k), str(parts)], env=env,
                       stdout=out / f"{name}.{k}.out", stderr=out / f"{name}.{k}.err", label=f"{name}-{k}")
            for k in range(parts)]
    try:
        codes = [c.wait(timeout=1200) for c in kids]
    finally:
        for c in kids:
            c.stop()
    wall = time.monotonic() - t0
    firsts = []
    for k in range(parts):
        lines = (out / f"{name}.{k}.out").read_text().splitlines()
        firsts.append(json.loads(lines[-1])["first_calls_s"] if lines else None)
    return {"variant": name, "processes": parts, "wall_s": round(wall, 1), "first_calls_s": firsts, "exit": codes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--parts", default="3", help="processes side by side for the split variants (a comma list)")
    ap.add_argument("--splits-only", action="store_true", help="only the split variants, an empty cache each")
    ap.add_argument("--part", nargs=2, type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.part:
        part(*a.part)
        return 0
    try:
        counts = [int(x) for x in a.parts.split(",") if x.strip()]
    except ValueError:
        counts = []
    if a.out is None or not counts or min(counts) < 1:
        ap.error(f"--out DIR is required, and --parts must be whole numbers >= 1 (got {a.parts!r})")
    from gpulab.device import has_gpu
    if not has_gpu():
        ap.error("needs a CUDA GPU: cuDNN's attention runs on one only")
    a.out.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_CACHE_")}
    empty = {**base, "CUDA_CACHE_PATH": str(a.out / "cache1")}
    off = {**base, "CUDA_CACHE_DISABLE": "1"}
    splits = [(f"empty_cache_x{n}", n, {**base, "CUDA_CACHE_PATH": str(a.out / f"cache_x{n}")}) for n in counts]
    plan = splits if a.splits_only else [("empty_cache", 1, empty), ("filled_cache", 1, empty),
                                         ("no_cache", 1, off), *splits,
                                         *[(f"no_cache_x{n}", n, off) for n in counts]]
    rows = []
    with proc.session("bench_cudnn_jit"):
        for name, parts, env in plan:
            rows.append(variant(name, parts, env, a.out))
            print(json.dumps(rows[-1]), flush=True)
            (a.out / "cudnn_jit.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
