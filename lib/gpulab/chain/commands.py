"""`gpulab run` and `gpulab params`: the command lines of the notebook chain (DESIGN.md)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpulab import paramsets, proc, project
from gpulab.args import BadInput, comma_list, parser, positive, writable_dir
from gpulab.chain import params, runner
from gpulab.trace import liveness


def run_parser() -> argparse.ArgumentParser:
    p = parser("gpulab run", "Run every numbered notebook per scenario with papermill, render HTML, and write "
               "gpulab-runs/<run-id>/index.html (printed last). The workload runs in this folder, with this "
               "environment, as `python SCRIPT` would here.", "gpulab run -p workload='script:train.py --batch 4'")
    p.add_argument("--params", action="append", default=[], metavar="FILE",
                   help="YAML parameter file layered over params/base.yaml and the scenario (repeatable)")
    p.add_argument("--scenario", default="baseline", metavar="NAME[,NAME]|all",
                   help="scenario names from params/scenarios/ (comma-separated), or 'all'")
    p.add_argument("-p", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one parameter; the value is read as YAML (repeatable); e.g. the stall window, "
                        f"-p stall_s=S (default {liveness.STALL_S:g})")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for run folders (default: ./gpulab-runs; outputs/ inside a gpulab checkout)")
    p.add_argument("--only", action="append", default=[], metavar="NN[,NN]",
                   help="run only notebooks whose name starts with this (comma-separated or repeatable), "
                        "e.g. --only 01,02")
    p.add_argument("--from", dest="captures", nargs="+", type=Path, default=None, metavar="DIR",
                   help="run the chain on what `gpulab watch` caught (its --out folder, or one per node of a job): "
                        "02 and 03 read the capture instead of running the workload, 04 tries fixes on 03's "
                        "repro or on -p repro=COMMAND")
    p.add_argument("--jobs", type=int, default=1, help="scenarios run side by side")
    p.add_argument("--kernel", default="python3", help="Jupyter kernel name")
    p.add_argument("--cell-timeout", type=positive("--cell-timeout"), default=runner.DEFAULT_CELL_TIMEOUT_S,
                   metavar="S", help="per-cell limit in seconds")
    p.add_argument("--notebook-timeout", type=positive("--notebook-timeout"),
                   default=runner.DEFAULT_NOTEBOOK_TIMEOUT_S, metavar="S",
                   help="wall-clock limit per notebook in seconds; a stalled kernel is stopped")
    return p


def run_main(argv: list[str]) -> int:
    args = run_parser().parse_args(argv)
    try:
        root = runner.find_root()
        only = comma_list(args.only, "--only")
        out = writable_dir(args.out if args.out else project.default_runs(), "--out")
        overrides = tuple(args.overrides)
        if args.captures is not None:
            overrides = from_capture(args.captures, overrides)
        cfg = runner.RunConfig(
            root=root, scenarios=paramsets.parse_scenarios(root, args.scenario), param_files=tuple(args.params),
            overrides=overrides, out=out, only=only, kernel=args.kernel, workdir=Path.cwd(),
            cell_timeout_s=args.cell_timeout, notebook_timeout_s=args.notebook_timeout, jobs=args.jobs)
        code, index_path = runner.run(cfg)
    except (paramsets.ParamError, BadInput, FileNotFoundError) as exc:
        print(f"gpulab run: {exc}", file=sys.stderr)
        return proc.EXIT_BAD_INPUT
    print(index_path)
    return code


def from_capture(dirs: list[Path], overrides: tuple[str, ...]) -> tuple[str, ...]:
    """--from's parameters, before the user's own -p (which win): the capture folders, the captured command as
    the workload (what 05 and 06 name), and the stall window that caught it (03's replay and 04's trials)."""
    from gpulab.hang.investigation import caught   # only for --from

    folders = caught.check(dirs)
    first = caught.source(folders[0]).verdict
    given = {o.split("=", 1)[0].strip() for o in overrides}
    implied = {"capture": [str(d) for d in folders], "workload": caught.workload_of(first.get("command") or ()),
               "stall_s": float(first.get("stall_s") or liveness.STALL_S)}
    return tuple(f"{k}={json.dumps(v)}" for k, v in implied.items() if k not in given) + overrides


def params_main(argv: list[str]) -> int:
    p = parser("gpulab params", "Show every parameter the notebooks accept (description, type, default, range "
               "or choices, notebooks), or a scenario's merged values with where each came from.",
               "gpulab params --scenario baseline -p rung=step")
    p.add_argument("--scenario", default=None, help="show the merged values of this scenario")
    p.add_argument("--params", action="append", default=[], metavar="FILE", help="YAML file layered on top")
    p.add_argument("-p", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one parameter")
    args = p.parse_args(argv)
    try:
        root = runner.find_root()
        schema = params.notebook_schema(runner.discover(root))
        if args.scenario is None:
            print(params.schema_text(schema))
            return 0
        layered = params.resolve(root, args.scenario, args.params, args.overrides)   # checks the name first
        values = params.validate(layered, schema)
    except (paramsets.ParamError, FileNotFoundError) as exc:
        print(f"gpulab params: {exc}", file=sys.stderr)
        return proc.EXIT_BAD_INPUT
    src = layered.sources()
    for k in sorted(values):
        print(f"{k:<18} {values[k]!r:<30} from {src[k]}")
    return 0
