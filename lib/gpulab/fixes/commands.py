"""`gpulab fixes`: the fix matrix from the command line (DESIGN.md's contract); and `gpulab watch`, whose
verdict ends with the fixes to try (gpulab.hang knows no fixes, so the command that adds them lives here).

Exit 0 when a scenario is recommended, 1 when none is, 2 on bad input (one line naming the bad value and
the choices; nothing run, nothing written), 127 when the command is not found.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Sequence

from gpulab import device, paramsets, proc, report, workloads
from gpulab.args import BadInput, json_target, parser, positive, split_command, writable_dir
from gpulab.fixes import matrix, outcome, scenarios, suggest
from gpulab.fixes.target import Target
from gpulab.hang.watchdog import watch
from gpulab.trace import liveness


def _parser():
    p = parser("gpulab fixes", "Run each fix scenario's validation ladder (REPEATS runs per rung under the "
               "watchdog, each a child with the scenario's fixes applied), time it against the baseline "
               "(interleaved children, ratio of medians with a bootstrap interval), compare its outputs with the "
               "fix-free run's, and recommend the cheapest scenario that removes the failure. The workload is the "
               "command after '--', or the built-in one from -p KEY=VALUE. Scenarios: a comma list of baseline, "
               "fix names and fixes joined with '+', or auto (the baseline plus what 01's rules and 03's verdict "
               "in --from point at, and the fixes for the baseline's own failure class), or all.",
               "gpulab fixes --json fixes.json --scenario baseline,sdpa_math_off,fp32_softmax --repeats 5 "
               "-- python train.py --steps 10")
    p.add_argument("--json", type=Path, required=True, metavar="FILE", help="write the matrix here")
    p.add_argument("--out", type=Path, default=None, metavar="DIR", help="products folder (default: a new temp dir)")
    p.add_argument("--scenario", default="auto", metavar="LIST|auto|all", help="the scenarios to run")
    p.add_argument("--repeats", type=int, default=3, metavar="R", help="runs per rung and scenario")
    p.add_argument("--jobs", type=int, default=0, metavar="J",
                   help="runs side by side (default 0: the machine's cores for CPU programs, 2 on a GPU)")
    p.add_argument("--budget", type=positive("--budget"), default=matrix.MatrixConfig.budget_s, metavar="S",
                   help="auto: seconds of trying fixes beyond those the evidence points at")
    p.add_argument("--stall", type=positive("--stall"), default=liveness.STALL_S, metavar="S",
                   help="no progress for S seconds is a hang (default %(default)g)")
    p.add_argument("--timeout", type=positive("--timeout"), default=3600.0, metavar="S", help="bound on each run")
    p.add_argument("--max-overhead", type=float, default=0.2, metavar="F",
                   help="a fix costing more than this fraction is too_slow")
    p.add_argument("--cost-rounds", type=int, default=3, metavar="N",
                   help="interleaved timing rounds (0: no cost, no numerics)")
    p.add_argument("--time-s", type=positive("--time-s"), default=1.0, metavar="S",
                   help="seconds of timed repeats of the built-in rung in each timing child")
    p.add_argument("--mode", default="auto", choices=watch.MODES, help="op recording mode of each run")
    p.add_argument("--fault", default=None, metavar="SPEC", help="plant a fault in every ladder run (a self-test)")
    p.add_argument("--from", dest="pointers", type=Path, default=None, metavar="DIR",
                   help="a scenario folder of a gpulab run whose 01/03 products `auto` follows (default: --out)")
    p.add_argument("-p", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="built-in workload parameter (when no command is given)")
    return p


def _target(command: Sequence[str], overrides: Sequence[str]) -> Target:
    if command:
        if overrides:
            raise BadInput("give the workload either as a command after '--' or with -p KEY=VALUE, not both")
        watch.check_command(command)
        return Target(command=tuple(command))
    kv = dict(paramsets.parse_override(o) for o in overrides)
    return Target(workloads.WorkloadConfig.from_params(kv, device=device.resolve(str(kv.get("device", "auto")))))


def main(argv: Sequence[str]) -> int:
    opts, command = split_command(argv)
    command = command or []
    args = _parser().parse_args(opts)
    try:
        if args.jobs < 0:
            raise BadInput(f"--jobs {args.jobs} is not valid; it must be a whole number >= 0 (0: auto)")
        scenarios.parse(args.scenario)
        json_target(args.json)
        if args.out:
            writable_dir(args.out, "--out")
        target = _target(command, args.overrides)
        jobs = device.trial_jobs(args.jobs, target.cfg.device if target.cfg is not None else "auto")
        cfg = matrix.MatrixConfig(args.scenario, args.repeats, jobs, args.stall, args.timeout, args.max_overhead,
                                  args.cost_rounds, args.time_s, args.mode, args.fault, args.budget)
        out = args.out or Path(tempfile.mkdtemp(prefix="gpulab-fixes-"))  # only once the input is known good
        result = matrix.run(target, cfg, out, pointers_dir=args.pointers or args.out, json_copy=args.json)
    except (ValueError, FileNotFoundError, BadInput) as exc:   # FixError, ParamError, FaultSpecError: ValueErrors
        print(f"gpulab fixes: {exc}", file=sys.stderr)
        return proc.EXIT_NOT_FOUND if isinstance(exc, proc.CommandNotFound) else proc.EXIT_BAD_INPUT
    report.write_json(args.json, result.to_dict())
    for row in outcome.rows(result):
        print(f"{row['scenario']:<24} {row['verdict']:<16} failed {row['failed']:<6} cost {row['cost']:<22} "
              f"numerics {row['numerics']}")
    print(f"recommendation: {result.recommendation or 'none'} - {result.next_step}")
    print(args.json)
    return 0 if result.recommendation else 1


def watch_main(argv: Sequence[str]) -> int:
    """`gpulab watch`: the watchdog's command line, its verdict (printed and saved) with the "try" sentence."""
    return watch.main(argv, finish=suggest.with_suggestions)
