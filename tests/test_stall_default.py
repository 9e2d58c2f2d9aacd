"""One stall window by default, wherever a run starts: every command, every function behind one and the
notebooks' `stall_s` begin from gpulab.trace.liveness.STALL_S, and each command's --help says it."""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from gpulab import cli
from gpulab.fixes import matrix
from gpulab.hang.investigation import bisect, ladder, repro
from gpulab.hang.watchdog import watch
from gpulab.numerics import compare
from gpulab.trace.liveness import STALL_S

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("fn", [watch.run, ladder.run, bisect.run, repro.make, compare.run, compare.run_side], ids=lambda f: f.__module__)
def test_every_function_behind_a_command_defaults_to_the_window(fn):
    assert inspect.signature(fn).parameters["stall_s"].default == STALL_S


def test_the_fix_matrix_defaults_to_the_window():
    assert matrix.MatrixConfig("baseline").stall_s == STALL_S


@pytest.mark.parametrize("command", ["watch", "ladder", "bisect", "fixes", "compare"])
def test_each_command_says_the_default_in_its_help(command, capsys):
    with pytest.raises(SystemExit) as ex:
        cli.main([command, "--help"])
    assert ex.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"--stall S no progress for S seconds is a" in out and f"(default {STALL_S:g})" in out, out


def test_run_says_the_default_in_its_help(capsys):
    with pytest.raises(SystemExit) as ex:
        cli.main(["run", "--help"])
    assert ex.value.code == 0 and f"-p stall_s=S (default {STALL_S:g})" in " ".join(capsys.readouterr().out.split())


def test_the_notebooks_and_the_readme_say_the_same_window():
    from gpulab.chain.params import notebook_schema

    spec = notebook_schema(sorted((ROOT / "notebooks").glob("*.ipynb")))["stall_s"]
    assert (spec.type, spec.default) == ("float", STALL_S) and len(spec.notebooks) >= 2
    assert f"`--stall` seconds (default {STALL_S:g}" in (ROOT / "README.md").read_text()
