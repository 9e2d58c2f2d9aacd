"""`gpulab ladder` and `gpulab bisect`: the command lines of the ladder and the bisection (DESIGN.md)."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Sequence

from gpulab import device, paramsets, proc, report, workloads
from gpulab.args import BadInput, json_target, parser, positive, split_command, writable_dir
from gpulab.hang.investigation import bisect, ladder
from gpulab.hang import faults
from gpulab.hang.watchdog import watch
from gpulab.trace import liveness


def _split(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    opts, command = split_command(argv)
    return opts, command or []


def _common(p) -> None:
    p.add_argument("--json", type=Path, required=True, metavar="FILE", help="write the result here")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="folder for every trial's products (default: a new temp folder)")
    p.add_argument("--repeats", type=int, default=3, metavar="R", help="trials per rung or configuration")
    p.add_argument("--jobs", type=int, default=0, metavar="J",
                   help="trials run side by side (default 0: the machine's cores for CPU programs, 2 on a GPU)")
    p.add_argument("--stall", type=positive("--stall"), default=liveness.STALL_S, metavar="S",
                   help="no progress for S seconds is a hang (default %(default)g)")
    p.add_argument("--timeout", type=positive("--timeout"), default=3600.0, metavar="S", help="bound on each trial")
    p.add_argument("--mode", default="auto", choices=watch.MODES, help="op recording mode of each trial")
    p.add_argument("--no-record", action="store_true", help="run Python commands as they are (no op log)")
    p.add_argument("--fault", default=None, metavar="SPEC", help="plant a fault in every trial (a self-test)")


def _check(args) -> None:
    """The options both commands share, checked before anything runs or is written."""
    if args.repeats < 1:
        raise BadInput(f"--repeats {args.repeats} is not valid; it must be a whole number >= 1")
    if args.jobs < 0:
        raise BadInput(f"--jobs {args.jobs} is not valid; it must be a whole number >= 0 (0: auto)")
    args.jobs = device.trial_jobs(args.jobs)
    json_target(args.json)
    if args.out:
        writable_dir(args.out, "--out")
    faults.parse(args.fault)


def ladder_main(argv: Sequence[str]) -> int:
    opts, command = _split(argv)
    p = parser("gpulab ladder", "Run each rung REPEATS times under the watchdog and report per rung the outcome "
               "counts, the failure rate with a Wilson 95% interval, the first failure's verdict and the memory "
               "growth per step. Rungs are commands (--rung NAME=COMMAND, repeatable), one command after '--', "
               "or the built-in workload's ladder (sdpa -> forward -> step -> steps) up to -p rung=NAME. "
               "Exit 0 when every trial passed, 1 otherwise, 2 bad input.",
               "gpulab ladder --json ladder.json --repeats 10 --jobs 2 --rung 'one=python train.py --steps 1' "
               "--rung 'ten=python train.py --steps 10'")
    _common(p)
    p.add_argument("--rung", action="append", default=[], metavar="NAME=COMMAND", help="a rung (repeatable)")
    p.add_argument("-p", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="built-in workload parameter (when no rung or command is given)")
    p.add_argument("--keep-going", action="store_true", help="climb past a failing rung")
    args = p.parse_args(opts)
    try:
        _check(args)
        if args.rung and command:
            raise BadInput("give rungs either with --rung NAME=COMMAND or as one command after '--', not both")
        if args.rung:
            rungs = ladder.command_rungs(args.rung)
        elif command:
            watch.check_command(command)
            rungs = [ladder.Rung("command", tuple(command))]
        else:
            kv = dict(paramsets.parse_override(o) for o in args.overrides)
            cfg = workloads.WorkloadConfig.from_params(kv, device=device.resolve(str(kv.get("device", "auto"))))
            rungs = ladder.builtin_rungs(cfg)
        for r in rungs:
            if r.result_json is None:
                watch.check_command(r.command)
        out = args.out or Path(tempfile.mkdtemp(prefix="gpulab-ladder-"))  # only once the input is known good
        result = ladder.run(rungs, repeats=args.repeats, jobs=args.jobs, stall_s=args.stall, timeout_s=args.timeout,
                            out_dir=out, mode=args.mode, fault=args.fault, record=not args.no_record,
                            stop_at_first_failure=not args.keep_going, json_copy=args.json)
    except proc.CommandNotFound as exc:
        print(f"gpulab ladder: {exc}", file=sys.stderr)
        return proc.EXIT_NOT_FOUND
    except (ValueError, FileNotFoundError, BadInput, paramsets.ParamError, faults.FaultSpecError) as exc:
        print(f"gpulab ladder: {exc}", file=sys.stderr)
        return proc.EXIT_BAD_INPUT
    report.write_json(args.json, result.to_dict())
    for row in ladder.table_rows(result):
        print(f"{row['rung']:<10} {row['trials'] - row['pass']}/{row['trials']} failed  "
              f"(95% {row['95% interval']})  {row['first failure']}")
    print(args.json)
    return 0 if result.passed else 1


def bisect_main(argv: Sequence[str]) -> int:
    opts, command = _split(argv)
    p = parser("gpulab bisect", "Shrink a failing configuration to the smallest that still fails, every probe a "
               "watched child with a deadline. COMMAND holds {NAME} placeholders for the --space (integers: "
               "binary search from FAILING down to SMALLEST) and --choice (alternatives, simplest first; "
               "env.VAR sets an environment variable) dimensions. A configuration fails when any of its "
               "--repeats trials fails the way the failing values do. Exit 0 when a minimal failing "
               "configuration was found, 2 when the failing values do not fail or the input is bad.",
               "gpulab bisect --json b.json --repeats 5 --space seq=128:1 --space heads=8:1 "
               "--choice dtype=bfloat16:float32 -- python attn.py --seq {seq} --heads {heads} --dtype {dtype}")
    _common(p)
    p.set_defaults(repeats=1, stall=liveness.STALL_S, timeout=600.0)
    p.add_argument("--space", action="append", default=[], metavar="NAME=FAILING:SMALLEST",
                   help="an integer dimension (repeatable)")
    p.add_argument("--choice", action="append", default=[], metavar="NAME=FAILING:ALT1,ALT2",
                   help="a choice dimension (repeatable)")
    args = p.parse_args(opts)
    try:
        _check(args)
        ints = [bisect.parse_space(s) for s in args.space]
        choices = [bisect.parse_choice(c) for c in args.choice]
        bisect.check(command, ints, choices)
        first, _ = bisect.instantiate(command, {d.name: d.failing for d in (*ints, *choices)})
        watch.check_command(first)
        out = args.out or Path(tempfile.mkdtemp(prefix="gpulab-bisect-"))
        result = bisect.run(command, ints, choices, out_dir=out, repeats=args.repeats, jobs=args.jobs,
                            stall_s=args.stall, timeout_s=args.timeout, mode=args.mode, record=not args.no_record,
                            fault=args.fault, json_copy=args.json)
    except proc.CommandNotFound as exc:
        print(f"gpulab bisect: {exc}", file=sys.stderr)
        return proc.EXIT_NOT_FOUND
    except (bisect.BisectError, ValueError, FileNotFoundError, BadInput, faults.FaultSpecError) as exc:
        if isinstance(exc, bisect.NothingToBisect):  # the probes ran: their record is kept
            report.write_json(args.json, report.read_json(out / "bisect.json", default={}))
        print(f"gpulab bisect: {exc}", file=sys.stderr)
        return proc.EXIT_BAD_INPUT
    report.write_json(args.json, result.to_dict())
    print("minimal failing configuration: " + ", ".join(f"{k}={v}" for k, v in result.minimal.items()))
    print(f"{len(result.probes)} probes; repro: {result.repro}")
    print(args.json)
    return 0
