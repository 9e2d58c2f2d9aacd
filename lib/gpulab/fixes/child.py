"""Run a Python program with the scenario's fixes installed and nothing else (no recorder, no watchdog
hooks), so its time is the program's own: the cost and numerics children of the fix matrix.

    python -m gpulab.fixes.child [--time FILE] -- (SCRIPT.py [ARGS...] | -m MODULE [ARGS...])

--time writes {"seconds": ...}: the program's wall time from the first line it runs (interpreter start-up
and the fixes' installation left out, since both sides of a comparison pay them alike).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from gpulab import beat, program
from gpulab.fixes.install import install_from_env


def main(argv: list[str] | None = None) -> int:
    beat.start_from_env()  # the watchdog's heartbeat, when it asked for one ($GPULAB_BEAT)
    raw = list(sys.argv[1:] if argv is None else argv)
    if "--" not in raw or raw.index("--") == len(raw) - 1:
        print("usage: python -m gpulab.fixes.child [--time FILE] -- (SCRIPT.py [ARGS...] | -m MODULE [ARGS...])",
              file=sys.stderr)
        return 2
    ap = argparse.ArgumentParser(prog="python -m gpulab.fixes.child")
    ap.add_argument("--time", default=None, metavar="FILE")
    ns = ap.parse_args(raw[:raw.index("--")])
    target = raw[raw.index("--") + 1:]
    install_from_env()
    t0 = time.perf_counter()
    code = program.run(target)
    if ns.time and code == 0:
        with open(ns.time, "w") as fh:
            json.dump({"seconds": time.perf_counter() - t0}, fh)
    return code


if __name__ == "__main__":
    sys.exit(main())
