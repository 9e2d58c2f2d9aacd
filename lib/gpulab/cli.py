"""`gpulab` command line. Each command's options live beside the code they drive (`gpulab.chain.commands`,
`gpulab.env.cli`, `gpulab.hang.investigation.commands`, `gpulab.fixes.commands`; their shared input checks in `gpulab.args`);
this module only dispatches, and turns bad input into one line and exit 2, a missing program into 127, and an
interrupt into 128+signal. Nothing imports it but `gpulab.__main__`: it sits above every command.
"""
from __future__ import annotations

import sys
from typing import Callable

from gpulab import __version__, proc

USAGE = f"""gpulab {__version__}: a Jupyter investigation workbook for PyTorch GPU failures

usage: gpulab <command> [options]      (gpulab <command> --help for each command's options)

commands:
  run      run the notebook chain per scenario and publish HTML     gpulab run --params params/smoke.yaml
  env      the environment report and platform risks                gpulab env --json env.json
  watch    run a command under the hang watchdog                     gpulab watch --stall 30 -- python train.py
  params   the parameters the notebooks accept, or a scenario's merged values   gpulab params
  ladder   each rung (attention, forward, step, steps) repeated under the watchdog: failure rates
                                                                     gpulab ladder --json l.json --repeats 10
  bisect   shrink a failing configuration to the smallest that still fails
                                 gpulab bisect --json b.json --space seq=128:1 -- python x.py --seq {{seq}}
  fixes    each fix scenario on the ladder, its cost and numerics against the baseline, a recommendation
                                 gpulab fixes --json f.json --scenario auto -- python train.py
  merge    one cross-process verdict from the watch folders of a job's nodes
                                                                     gpulab merge --json job.json node0/ node1/
  compare  two runs of a program compared op by op: the first op that introduces a difference
                                 gpulab compare --json c.json 'python train.py --device cpu' 'python train.py --device cuda'
"""


# ------------------------------------------------------------------------------------------ dispatch

def _run(session: proc.Session, argv: list[str]) -> int:
    from gpulab.chain import commands
    return commands.run_main(argv)


def _params(session: proc.Session, argv: list[str]) -> int:
    from gpulab.chain import commands
    return commands.params_main(argv)


def _env(session: proc.Session, argv: list[str]) -> int:
    from gpulab import env
    return env.main(argv)


def _watch(session: proc.Session, argv: list[str]) -> int:
    from gpulab.fixes import commands   # the watchdog's verdict with the fixes it points at
    return commands.watch_main(argv)


def _ladder(session: proc.Session, argv: list[str]) -> int:
    from gpulab.hang.investigation import commands
    return commands.ladder_main(argv)


def _bisect(session: proc.Session, argv: list[str]) -> int:
    from gpulab.hang.investigation import commands
    return commands.bisect_main(argv)


def _merge(session: proc.Session, argv: list[str]) -> int:
    from gpulab.hang.jobs import merge
    return merge.main(argv)


def _compare(session: proc.Session, argv: list[str]) -> int:
    from gpulab.numerics import commands
    return commands.main(argv)


def _fixes(session: proc.Session, argv: list[str]) -> int:
    from gpulab.fixes import commands
    return commands.main(argv)


# Commands are imported when called: `gpulab --help` must not pay for torch, psutil and pandas.
COMMANDS: dict[str, Callable[[proc.Session, list[str]], int]] = {
    "run": _run, "env": _env, "watch": _watch, "params": _params, "ladder": _ladder, "bisect": _bisect,
    "fixes": _fixes, "merge": _merge, "compare": _compare,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else proc.EXIT_BAD_INPUT
    if argv[0] in ("-V", "--version", "version"):
        print(f"gpulab {__version__}")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"gpulab: unknown command {cmd!r}; choose one of: {', '.join(COMMANDS)}\n\n{USAGE}", file=sys.stderr)
        return proc.EXIT_BAD_INPUT
    return proc.main_guarded(f"gpulab {cmd}", COMMANDS[cmd], rest)


if __name__ == "__main__":
    raise SystemExit(main())
