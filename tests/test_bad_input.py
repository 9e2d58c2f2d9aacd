"""Bad input is stopped before anything runs: exit 2 (127 for a missing program), one line naming the bad
value and what is allowed, no traceback, nothing written."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nbfactory import RECORD, notebook, project

LIB = str(Path(__file__).resolve().parents[1] / "lib")
RANGED = 'layers: int = 2  # how many blocks; range: 1..64\nscale: float = 1.0  # range: 0..\n'


@pytest.fixture(scope="module")
def proj(tmp_path_factory):
    root = tmp_path_factory.mktemp("proj")
    nbs = {"01_ok": notebook("Ok", RANGED, RECORD.format(name="01_ok", headline="fine"))}
    project(root, nbs, scenarios={"baseline": "description: plain\n", "other": "layers: 3\n"})
    (root / "afile.txt").write_text("not a folder\n")
    (root / "pfolder").mkdir()
    return root


def gpulab(args, cwd, timeout=60):
    return subprocess.run([sys.executable, "-m", "gpulab", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": LIB})


def _one_line(r):
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr and len(lines) == 1, r.stderr
    return lines[0]


@pytest.mark.parametrize("args,needle", [
    (["--scenario", "../smoke"], "is not a scenario name"),
    (["--scenario", "/abs/file.yaml"], "use --params /abs/file.yaml"),
    (["--scenario", "baseline,baseline"], "listed more than once"),
    (["--scenario", ","], "names no scenario"),
    (["--scenario", "nope"], "valid scenarios: baseline, other"),
    (["-p", "layers=-3"], "'layers' (from -p) = -3 is out of range; it must be within 1..64"),
    (["-p", "layers=1000000000"], "out of range; it must be within 1..64"),
    (["-p", "scale=-0.5"], "within 0.."),
    (["-p", "layers=two"], "must be int"),
    (["--notebook-timeout", "0"], "--notebook-timeout '0' must be > 0 seconds"),
    (["--notebook-timeout", "-5"], "must be > 0 seconds"),
    (["--cell-timeout", "0"], "--cell-timeout '0' must be > 0 seconds"),
    (["--jobs", "0"], "--jobs 0 is not valid"),
    (["--out", "afile.txt"], "'afile.txt' is a file; give a folder"),
    (["--params", "pfolder"], "'pfolder' is a folder, not a YAML file"),
    (["--params", "missing.yaml"], "'missing.yaml' does not exist"),
])
def test_gpulab_run_bad_input(proj, args, needle):
    r = gpulab(["run", *args], proj)
    assert r.returncode == 2 and needle in _one_line(r)
    assert not (proj / "outputs").exists()


def test_gpulab_run_out_not_writable(proj, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root writes through permission bits: a read-only filesystem is what stops it
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)],
                          capture_output=True).returncode != 0:
            pytest.skip("root without mount permission: cannot make a folder root cannot write")
    else:
        ro.chmod(0o555)
    try:
        r = gpulab(["run", "--out", str(ro / "outputs")], proj)
        assert r.returncode == 2 and "is not writable" in _one_line(r)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ro)], capture_output=True)
        ro.chmod(0o755)


@pytest.mark.parametrize("args,code,needle", [
    (["--", "no-such-program-xyz", "--flag"], 127, "command not found: 'no-such-program-xyz'"),
    (["--", "./no-such-dir/prog"], 127, "command not found"),
    (["--", "python", "missing_script.py"], 2, "no such Python script: 'missing_script.py'"),
    (["--stall", "0", "--", "true"], 2, "--stall '0' must be > 0 seconds"),
    (["--timeout", "-1", "--", "true"], 2, "--timeout '-1' must be > 0 seconds"),
    (["--json", "pfolder", "--", "true"], 2, "'pfolder' is a folder; give a file name"),
    (["--mode", "fast", "--", "true"], 2, "invalid choice: 'fast'"),
    (["--fault", "hang:mm", "--", "python", "x.py"], 2, "choose one of deadlock"),
    ([], 2, "give the command after '--'"),
])
def test_gpulab_watch_bad_input(proj, args, code, needle):
    out = proj / "watch_out"
    r = gpulab(["watch", "--out", str(out), *args] if "--json" not in args else ["watch", *args], proj)
    assert r.returncode == code and needle in _one_line(r)
    assert not out.exists()


def test_unknown_command_and_version(proj):
    r = gpulab(["frobnicate"], proj)
    assert r.returncode == 2 and "unknown command 'frobnicate'" in r.stderr
    r = gpulab(["--version"], proj)
    assert r.returncode == 0 and r.stdout.startswith("gpulab ")


def test_params_shows_description_range_and_notebooks(proj):
    r = gpulab(["params"], proj)
    assert r.returncode == 0
    text = r.stdout
    assert "layers  (int, default 2; range: 1..64)" in text and "how many blocks" in text
    assert "used by: 01_ok" in text


@pytest.mark.parametrize("cmd", ["run", "watch", "params"])
def test_help_shows_defaults_and_an_example(proj, cmd):
    r = gpulab([cmd, "--help"], proj)
    assert r.returncode == 0 and "example:" in r.stdout and "(default:" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["--only", "01,zz"], "no notebook matches ['zz']; notebooks: 01_ok"),
    (["--only", "01", "--only", "zz"], "no notebook matches ['zz']; notebooks: 01_ok"),
    (["--only", "01,"], "--only '01,' has an empty name"),
])
def test_gpulab_run_only_takes_a_comma_list_and_names_the_choices(proj, args, needle):
    r = gpulab(["run", *args], proj)
    assert r.returncode == 2 and needle in _one_line(r)
    assert not (proj / "outputs").exists()


def _option_blocks(text: str) -> list[str]:
    """--help text cut into one block per option (an option's help may wrap over several lines)."""
    blocks: list[str] = []
    for line in text.splitlines():
        if line.startswith("  ") and not line.startswith("    ") or not blocks:
            blocks.append(line)
        else:
            blocks[-1] += " " + line.strip()
    return blocks


@pytest.mark.parametrize("cmd", ["run", "env", "watch", "params", "ladder", "bisect", "fixes"])
def test_help_says_each_default_once(proj, cmd):
    r = subprocess.run([sys.executable, "-m", "gpulab", cmd, "--help"], cwd=proj, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": LIB, "COLUMNS": "100"})
    assert r.returncode == 0 and "example:" in r.stdout, r.stderr
    doubled = [b for b in _option_blocks(r.stdout) if b.count("(default") > 1]
    assert not doubled, doubled
