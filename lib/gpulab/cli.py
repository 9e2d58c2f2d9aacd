"""`gpulab` command line. Each command's options live beside the code they drive; this module dispatches,
and turns bad input into one line and exit 2, a missing program into 127, and an interrupt into 128+signal.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
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
"""


class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help shows every default, and keeps the examples' line breaks."""


class Parser(argparse.ArgumentParser):
    """Bad usage is one line on stderr and exit 2 (argparse's own error prints the whole usage first)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(proc.EXIT_BAD_INPUT, f"{self.prog}: {message} (see {self.prog} --help)\n")


def parser(prog: str, description: str, example: str) -> argparse.ArgumentParser:
    return Parser(prog=prog, description=description, formatter_class=Formatter, epilog=f"example:\n  {example}")


class BadInput(ValueError):
    """A command-line value that cannot work; the message names it and what is allowed (exit 2)."""


def writable_dir(path: Path, flag: str) -> Path:
    """`path` as an output folder that exists or can be made and can be written: checked before anything
    runs, by really creating (and removing) a file there."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise BadInput(f"{flag} {str(path)!r} is a file; give a folder (it is created when missing)")
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise BadInput(f"{flag} {str(path)!r} cannot be made: {str(probe)!r} is a file")
    try:
        fd, tmp = tempfile.mkstemp(dir=probe, prefix=".gpulab-write-test-")
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise BadInput(f"{flag} {str(path)!r} is not writable ({exc.strerror or exc}); give a folder you can "
                       f"write to") from None
    return path


def json_target(path: Path | None, flag: str = "--json") -> Path | None:
    """A file a command will write: refused up front when it is a folder or its folder cannot be written."""
    if path is None:
        return None
    path = Path(path)
    if path.is_dir():
        raise BadInput(f"{flag} {str(path)!r} is a folder; give a file name, e.g. {Path(path) / 'verdict.json'}")
    writable_dir(path.parent if str(path.parent) else Path("."), f"{flag} folder of")
    return path


def positive(flag: str) -> Callable[[str], float]:
    """argparse type: a number of seconds > 0 (a zero or negative limit would mean 'never' or 'at once')."""
    def conv(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} {text!r} is not a number of seconds") from None
        if not v > 0:
            raise argparse.ArgumentTypeError(f"{flag} {text!r} must be > 0 seconds")
        return v
    return conv


# ------------------------------------------------------------------------------------------ run

def _run_parser() -> argparse.ArgumentParser:
    from gpulab.chain import runner

    p = parser("gpulab run", "Run every numbered notebook per scenario with papermill, render HTML, and write "
               "outputs/<run-id>/index.html (printed last).", "gpulab run --scenario all -p rung=step")
    p.add_argument("--params", action="append", default=[], metavar="FILE",
                   help="YAML parameter file layered over params/base.yaml and the scenario (repeatable)")
    p.add_argument("--scenario", default="baseline", metavar="NAME[,NAME]|all",
                   help="scenario names from params/scenarios/ (comma-separated), or 'all'")
    p.add_argument("-p", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one parameter; the value is read as YAML (repeatable)")
    p.add_argument("--out", type=Path, default=None, help="outputs folder (default: <project>/outputs)")
    p.add_argument("--only", action="append", default=[], metavar="NN",
                   help="run only notebooks whose name starts with this (repeatable), e.g. --only 01")
    p.add_argument("--jobs", type=int, default=1, help="scenarios run side by side")
    p.add_argument("--kernel", default="python3", help="Jupyter kernel name")
    p.add_argument("--cell-timeout", type=positive("--cell-timeout"), default=runner.DEFAULT_CELL_TIMEOUT_S,
                   metavar="S", help="per-cell limit in seconds")
    p.add_argument("--notebook-timeout", type=positive("--notebook-timeout"),
                   default=runner.DEFAULT_NOTEBOOK_TIMEOUT_S, metavar="S",
                   help="wall-clock limit per notebook in seconds; a stalled kernel is stopped")
    return p


def cmd_run(session: proc.Session, argv: list[str]) -> int:
    from gpulab.chain import params, runner

    args = _run_parser().parse_args(argv)
    try:
        root = runner.find_root()
        out = writable_dir(args.out if args.out else root / "outputs", "--out")
        cfg = runner.RunConfig(
            root=root, scenarios=params.parse_scenarios(root, args.scenario), param_files=tuple(args.params),
            overrides=tuple(args.overrides), out=out, only=tuple(args.only), kernel=args.kernel,
            cell_timeout_s=args.cell_timeout, notebook_timeout_s=args.notebook_timeout, jobs=args.jobs)
        code, index_path = runner.run(cfg)
    except (params.ParamError, BadInput, FileNotFoundError) as exc:
        print(f"gpulab run: {exc}", file=sys.stderr)
        return proc.EXIT_BAD_INPUT
    print(index_path)
    return code


# ------------------------------------------------------------------------------------------ params

def cmd_params(session: proc.Session, argv: list[str]) -> int:
    from gpulab.chain import params, runner

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
        params.check_scenarios(root, [args.scenario])
        layered = params.resolve(root, args.scenario, args.params, args.overrides)
        values = params.validate(layered, schema)
    except (params.ParamError, FileNotFoundError) as exc:
        print(f"gpulab params: {exc}", file=sys.stderr)
        return proc.EXIT_BAD_INPUT
    src = layered.sources()
    for k in sorted(values):
        print(f"{k:<18} {values[k]!r:<30} from {src[k]}")
    return 0


# ------------------------------------------------------------------------------------------ dispatch

def _env(session: proc.Session, argv: list[str]) -> int:
    from gpulab import env
    return env.main(argv)


def _watch(session: proc.Session, argv: list[str]) -> int:
    from gpulab.hang import watch
    return watch.main(argv)


def _ladder(session: proc.Session, argv: list[str]) -> int:
    from gpulab.hang import commands
    return commands.ladder_main(argv)


def _bisect(session: proc.Session, argv: list[str]) -> int:
    from gpulab.hang import commands
    return commands.bisect_main(argv)


def _fixes(session: proc.Session, argv: list[str]) -> int:
    from gpulab.fixes import commands
    return commands.main(argv)


# Commands are imported when called: `gpulab --help` must not pay for torch, psutil and pandas.
COMMANDS: dict[str, Callable[[proc.Session, list[str]], int]] = {
    "run": cmd_run, "env": _env, "watch": _watch, "params": cmd_params, "ladder": _ladder, "bisect": _bisect,
    "fixes": _fixes,
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
