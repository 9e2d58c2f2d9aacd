"""Command-line input helpers shared by every `gpulab` command: the parser with one-line errors, BadInput,
and the up-front checks of folders, files and seconds.

Below the commands (gpulab.cli dispatches to them, they import this): a command must never import the
dispatcher, or `gpulab.cli` and the subpackages would import each other.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Callable

from gpulab import proc


class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help shows every default, and keeps the examples' line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        # a help text that already says its default in words ("default: a new temp folder") keeps only that
        text = action.help or ""
        if "(default" in text:
            return text
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """Bad usage is one line on stderr and exit 2 (argparse's own error prints the whole usage first)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(proc.EXIT_BAD_INPUT, f"{self.prog}: {message} (see {self.prog} --help)\n")


def split_command(argv) -> tuple[list[str], list[str] | None]:
    """gpulab's options, then the command after '--' (None when there is no '--': a command may be empty)."""
    raw = list(argv)
    return (raw[:raw.index("--")], raw[raw.index("--") + 1:]) if "--" in raw else (raw, None)


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


def comma_list(values: list[str], flag: str) -> tuple[str, ...]:
    """A repeatable option that also takes a comma list (`--only 01,02` = `--only 01 --only 02`); an empty
    name is refused rather than read as 'everything'."""
    names = []
    for value in values:
        parts = [p.strip() for p in value.split(",")]
        if not all(parts):
            raise BadInput(f"{flag} {value!r} has an empty name; give names separated by commas, e.g. {flag} 01,02")
        names += parts
    return tuple(dict.fromkeys(names))
