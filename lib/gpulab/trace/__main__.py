"""Run a Python program under the recorder, exactly as `python` would run it.

  python -m gpulab.trace --log LOG [--mode ops|sync|gpu|stats|auto] [--gpu-mechanism M] [--faulthandler FILE]
                         [--capacity N] [--follow DIR] [--dynamo eager|lazy]
                         -- (SCRIPT.py [ARGS...] | -m MODULE [ARGS...])

Order matters (the watchdog relies on it): the heartbeat starts first ($GPULAB_BEAT, gpulab.beat), so
Python that computes before the first op is told from a host spinning in a driver call; the log exists
(header written) before torch is imported, so a hang while loading libraries is seen as phase `startup`;
what $GPULAB_PRELOAD names runs before the recorder is installed (gpulab.trace.preload: a planted fault, then
the scenario's fixes), so the recorder (outermost) writes the op's record before a fault blocks inside it.

torch._dynamo is imported when the program imports it, as without the recorder, not by the recorder's first
op (gpulab.trace.lazydynamo; 1.7 s of a 5 s recorded forward run on a 2-core CPU); `--dynamo eager` imports
it before the program, to compare the two. Where torch imports it inside an op (a custom op's
first call does), the heartbeat tells the watchdog that the main thread is importing (gpulab.beat).
"""
from __future__ import annotations

import argparse
import os
import sys

from gpulab import beat, program
from gpulab.trace import gpu, lazydynamo, preload, recorder, ring  # no torch yet


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise SystemExit("usage: python -m gpulab.trace --log LOG [--mode MODE] [--faulthandler FILE] "
                         "-- (SCRIPT.py [ARGS...] | -m MODULE [ARGS...])\n"
                         "error: missing '--' before the target program")
    i = argv.index("--")
    p = argparse.ArgumentParser(prog="python -m gpulab.trace")
    p.add_argument("--log", required=True)
    p.add_argument("--mode", default="auto", choices=ring.MODES)
    p.add_argument("--gpu-mechanism", default=None, choices=gpu.PREFERENCES,
                   help="force how GPU progress is tracked in auto/gpu mode (default: the mode's own)")
    p.add_argument("--faulthandler", default=None)
    p.add_argument("--capacity", type=int, default=None)
    p.add_argument("--follow", default=None, metavar="DIR",
                   help="record the program's Python child processes too, each into DIR (gpulab.trace.follow)")
    p.add_argument("--dynamo", default="lazy", choices=("eager", "lazy"),
                   help="when torch._dynamo is imported: when the program (or torch on its behalf) imports it "
                        "(lazy, the default), or by the recorder before the program (eager)")
    ns = p.parse_args(argv[:i])
    target = argv[i + 1:]
    if not target or (target[0] == "-m" and len(target) < 2):
        p.error("no target after '--': give SCRIPT.py [ARGS...] or -m MODULE [ARGS...]")
    return ns, target


def main(argv: list[str] | None = None) -> int:
    beat_path = os.environ.get(beat.ENV)
    beat.start_from_env()
    ns, target = _parse(sys.argv[1:] if argv is None else argv)

    kw = {"capacity": ns.capacity} if ns.capacity else {}
    ring.create(ns.log, ns.mode, **kw)
    fh = None
    if ns.faulthandler:
        from gpulab.trace import stackdump

        fh = open(ns.faulthandler, "w")
        stackdump.install(fh)
    if ns.dynamo == "lazy":
        lazydynamo.defer()
    preload.run()  # what the parent named ($GPULAB_PRELOAD): a planted fault, then the scenario's fixes; below the recorder
    rec = recorder.Recorder(ns.log, ns.mode, create_log=False, gpu_mechanism=ns.gpu_mechanism)
    rec.install()
    if ns.follow:
        from gpulab.trace import follow

        def rel(p: str | None) -> str | None:
            return os.path.relpath(os.path.abspath(p), os.path.abspath(ns.follow)) if p else None
        follow.adopt(ns.follow, ns.mode, {"log": rel(ns.log), "beat": rel(beat_path), "faulthandler": rel(ns.faulthandler)})
    try:
        code = program.run(target)
    finally:
        rec.close()
        if fh is not None:
            fh.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
