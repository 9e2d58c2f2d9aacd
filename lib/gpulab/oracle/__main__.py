"""The isolated child (`python -m gpulab.oracle`): check_many() of some candidates, the reports pickled for
the parent (check_isolated, gate), which gave this process a deadline of its own."""
from __future__ import annotations

import argparse
import os
import pickle
from typing import Sequence

from gpulab.fixes import install_from_env
from gpulab.oracle.sets import CASE_SETS
from gpulab.oracle.check import check_many


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpulab.oracle", description="check attention candidates")
    ap.add_argument("--candidate", required=True, action="append", help="repeat for several")
    ap.add_argument("--cases", default="default", choices=CASE_SETS)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtypes", default=None, help="comma list: float32,bfloat16,float16")
    ap.add_argument("--tile", type=int, default=64)
    ap.add_argument("--worst-k", type=int, default=8)
    ap.add_argument("--pickle", default=None, help="write the reports (by candidate name) here")
    a = ap.parse_args(argv)
    install_from_env()  # the scenario's fixes ($GPULAB_FIXES), so 05 judges the fixed configuration
    reps = check_many(a.candidate, a.cases, a.device, a.dtypes.split(",") if a.dtypes else None, tile=a.tile,
                      worst_k=a.worst_k)
    if a.pickle:  # classes live in gpulab.oracle.check, not __main__, so the parent can unpickle them
        tmp = a.pickle + ".tmp"
        with open(tmp, "wb") as fh:
            pickle.dump(reps, fh)
        os.replace(tmp, a.pickle)
    for rep in reps.values():
        s = rep.summary()
        print(f"{rep.candidate}: {'PASS' if rep.passed else 'FAIL'} - {s['reason']} ({rep.wall_s:.1f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
