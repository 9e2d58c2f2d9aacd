"""`gpulab compare`: two runs of the user's unchanged program compared op by op (DESIGN.md).

  gpulab compare [options] 'REFERENCE COMMAND' 'CANDIDATE COMMAND'
  gpulab compare --vary KEY=REF,CAND [options] -- COMMAND ... {KEY} ...

Exit 0 when the runs agree, 1 when they diverge, cannot be aligned or a run failed (the verdict says which and
where), 2 for bad options (one line, nothing run), 127 when a command is not found.
"""
from __future__ import annotations

import shlex
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from gpulab import proc, report
from gpulab.args import BadInput, json_target, parser, positive, split_command, writable_dir
from gpulab.hang.investigation import bisect
from gpulab.numerics import tolerance
from gpulab.trace import liveness


def parse_vary(spec: str) -> tuple[str, str, str]:
    """`KEY=REF,CAND` -> (KEY, REF, CAND); `env.VAR=REF,CAND` varies an environment variable."""
    name, eq, rest = spec.partition("=")
    values = rest.split(",")
    if not eq or not name.strip() or len(values) != 2 or not all(v.strip() for v in values):
        raise BadInput(f"--vary {spec!r} is not KEY=REF,CAND (two values, the reference's first), e.g. "
                       f"--vary impl=good,bad or --vary env.MY_FLAG=0,1")
    return name.strip(), values[0].strip(), values[1].strip()


def commands_of(positional: list[str], command: list[str] | None, vary: list[str]
                ) -> tuple[list[str], list[str], dict[str, str], dict[str, str]]:
    """The two argv and their environment variables, from either form; BadInput names what is wrong."""
    if command is None:
        if vary:
            raise BadInput("--vary needs the command after '--', with {KEY} placeholders, e.g. "
                           "gpulab compare --vary impl=good,bad -- python train.py --impl {impl}")
        if len(positional) != 2:
            raise BadInput(f"give two commands, the reference first, each quoted as one argument (got "
                           f"{len(positional)}), e.g. gpulab compare 'python train.py --device cpu' "
                           f"'python train.py --device cuda'")
        argvs = [shlex.split(c) for c in positional]
        for side, argv in zip(("reference", "candidate"), argvs):
            if not argv:
                raise BadInput(f"the {side} command is empty; give the program to run, e.g. 'python train.py'")
        return argvs[0], argvs[1], {}, {}
    if positional:
        raise BadInput(f"unexpected argument(s) before '--': {' '.join(positional)}; with --vary the command goes "
                       f"after '--' (or give two quoted commands and no --vary)")
    if not command:
        raise BadInput("no command after '--'; give it with {KEY} placeholders, e.g. -- python train.py --impl {impl}")
    if not vary:
        raise BadInput("a command after '--' needs --vary KEY=REF,CAND (what differs between the two runs)")
    dims = [parse_vary(v) for v in vary]
    try:
        bisect.check(command, [], [bisect.ChoiceDim(n, r, (c,)) for n, r, c in dims])
    except bisect.BisectError as exc:
        raise BadInput(str(exc).replace("--space or --choice", "--vary").replace("dimension", "--vary key")) from None
    ref, ref_env = bisect.instantiate(command, {n: r for n, r, _ in dims})
    cand, cand_env = bisect.instantiate(command, {n: c for n, _, c in dims})
    return ref, cand, ref_env, cand_env


def main(argv: Sequence[str]) -> int:
    opts, command = split_command(argv)
    p = parser("gpulab compare", "Run a reference and a candidate command, each recorded with a fingerprint of "
               "every op's output (no change to the program), align them op by op and name the first op whose "
               "inputs agree and whose output does not: op, call site, pass, error figures against the "
               "tolerance. The same command twice asks which op is not deterministic. Exit 0 agree, 1 diverged, "
               "unaligned or failed, 2 bad options, 127 a command not found.",
               "gpulab compare --json c.json 'python train.py --device cpu' 'python train.py --device cuda'\n  "
               "gpulab compare --vary dtype=float32,bfloat16 -- python train.py --dtype {dtype}")
    p.add_argument("commands", nargs="*", metavar="COMMAND", help="the reference, then the candidate, each quoted (default: none; with --vary the command goes after '--')")
    p.add_argument("--vary", action="append", default=[], metavar="KEY=REF,CAND",
                   help="a {KEY} placeholder of the command after '--' (repeatable; env.VAR for a variable) (default: none)")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the verdict here too (default: only OUT/compare.json)")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="folder for both runs' records and output (default: a new temp folder)")
    p.add_argument("--stall", type=positive("--stall"), default=liveness.STALL_S, metavar="S",
                   help="no progress for S seconds is a hang: that run is stopped (default %(default)g)")
    p.add_argument("--timeout", type=positive("--timeout"), default=3600.0, metavar="S", help="bound on each run")
    p.add_argument("--rtol", type=float, default=None, help="relative tolerance (default: by dtype, as assert_close)")
    p.add_argument("--atol", type=float, default=None, help="absolute tolerance (default: by dtype, as assert_close)")
    p.add_argument("--no-replay", action="store_true", help="do not rerun both sides to replay the diverging op")
    args = p.parse_args(opts)
    try:
        tolerance.check(args.rtol, args.atol)
        ref, cand, ref_env, cand_env = commands_of(args.commands, command, args.vary)
        json_target(args.json)
        if args.out:
            writable_dir(args.out, "--out")
    except (BadInput, ValueError) as exc:
        print(f"gpulab compare: {exc}", file=sys.stderr)
        return proc.EXIT_BAD_INPUT
    from gpulab.numerics import compare   # torch-free here; the children import torch

    out = args.out or Path(tempfile.mkdtemp(prefix="gpulab-compare-"))
    res = compare.run(ref, cand, out, ref_env=ref_env, cand_env=cand_env, rtol=args.rtol, atol=args.atol,
                      timeout_s=args.timeout, stall_s=args.stall, replay=not args.no_replay)
    if args.json:
        report.write_json(args.json, res.to_dict())
    print(res.summary)
    print(args.json or Path(out) / "compare.json")
    if any(r.status == "not_started" and ("not found" in r.why or "no such" in r.why) for r in res.runs):
        return proc.EXIT_NOT_FOUND
    return 0 if res.status == "agree" else 1
