"""`gpulab` command line: run (the chain), env (notebook 01's report), watch (the hang watchdog), params."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

USAGE = """gpulab <command> [options]

commands:
  run      run the notebook chain per scenario and publish HTML (gpulab run --help)
  env      the environment report and platform risks (gpulab env --help)
  watch    run a command under the hang watchdog (gpulab watch --help)
  params   list the parameters the notebooks accept, or show a scenario's merged values
"""


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpulab run", description="Run every numbered notebook per scenario "
                                "with papermill, render HTML, write outputs/<run-id>/index.html.")
    p.add_argument("--params", action="append", default=[], metavar="FILE",
                   help="YAML parameter file layered over params/base.yaml and the scenario (repeatable)")
    p.add_argument("--scenario", default="baseline", metavar="NAME|all",
                   help="a scenario from params/scenarios/ (comma-separated), or 'all' (default: baseline)")
    p.add_argument("-p", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one parameter; the value is read as YAML (repeatable)")
    p.add_argument("--out", type=Path, default=None, help="outputs folder (default: <project>/outputs)")
    p.add_argument("--only", action="append", default=[], metavar="NN",
                   help="run only notebooks whose name starts with this (repeatable), e.g. --only 01")
    p.add_argument("--kernel", default="python3", help="Jupyter kernel name (default: python3)")
    p.add_argument("--cell-timeout", type=float, default=None, metavar="S", help="per-cell limit (default 1800)")
    p.add_argument("--notebook-timeout", type=float, default=None, metavar="S",
                   help="wall-clock limit per notebook; a stalled kernel is killed (default 3600)")
    return p


def cmd_run(argv: list[str]) -> int:
    from gpulab.chain import params, runner

    args = _run_parser().parse_args(argv)
    try:
        root = runner.find_root()
        if args.scenario == "all":
            scenarios = tuple(params.list_scenarios(root))
        else:
            scenarios = tuple(s.strip() for s in args.scenario.split(",") if s.strip())
        cfg = runner.RunConfig(
            root=root, scenarios=scenarios, param_files=tuple(args.params), overrides=tuple(args.overrides),
            out=args.out, only=tuple(args.only), kernel=args.kernel,
            cell_timeout_s=args.cell_timeout or runner.DEFAULT_CELL_TIMEOUT_S,
            notebook_timeout_s=args.notebook_timeout or runner.DEFAULT_NOTEBOOK_TIMEOUT_S)
        code, index_path = runner.run(cfg)
    except (params.ParamError, FileNotFoundError) as exc:
        print(f"gpulab run: {exc}", file=sys.stderr)
        return 2
    print(index_path)
    return code


def cmd_params(argv: list[str]) -> int:
    from gpulab.chain import params, runner

    p = argparse.ArgumentParser(prog="gpulab params", description="Show the parameters the notebooks "
                                "accept, or the merged values of a scenario with where each came from.")
    p.add_argument("--scenario", default=None)
    p.add_argument("--params", action="append", default=[])
    p.add_argument("-p", dest="overrides", action="append", default=[])
    args = p.parse_args(argv)
    root = runner.find_root()
    schema = params.notebook_schema(runner.discover(root))
    if args.scenario is None:
        for spec in sorted(schema.values(), key=lambda s: s.name):
            choices = f"  choices: {', '.join(spec.choices)}" if spec.choices else ""
            print(f"{spec.name:<16} {spec.type:<6} default {spec.default!r:<22} [{', '.join(spec.notebooks)}]{choices}")
        return 0
    try:
        layered = params.resolve(root, args.scenario, args.params, args.overrides)
        values = params.validate(layered, schema)
    except params.ParamError as exc:
        print(f"gpulab params: {exc}", file=sys.stderr)
        return 2
    src = layered.sources()
    for k in sorted(values):
        print(f"{k:<16} {values[k]!r:<30} from {src[k]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "run":
        return cmd_run(rest)
    if cmd == "params":
        return cmd_params(rest)
    if cmd == "env":
        from gpulab import env
        return env.main(rest)
    if cmd == "watch":
        from gpulab.hang import watch
        return watch.main(rest)
    print(f"gpulab: unknown command {cmd!r}; choose one of: run, env, watch, params\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
