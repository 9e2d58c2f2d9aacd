"""The three places dependencies are named must agree: pyproject.toml, environment.yml, setup."""
from __future__ import annotations

import importlib.util

import pytest
import yaml

spec = importlib.util.spec_from_file_location("deps", __import__("pathlib").Path(__file__).resolve().parents[1] / "scripts" / "deps.py")
deps = importlib.util.module_from_spec(spec)
spec.loader.exec_module(deps)


def test_environment_yml_matches_pyproject(root):
    env = yaml.safe_load((root / "environment.yml").read_text())
    conda, pip = set(), set()
    for item in env["dependencies"]:
        if isinstance(item, dict):
            pip |= {deps.name(p) for p in item["pip"] if not p.startswith("-e")}
        else:
            conda.add(deps.name(item))
    conda -= {"python", "pip"}
    project = deps.load()
    wanted = {deps.name(r) for r in project["dependencies"]}
    for extra in ("lab", "test"):
        wanted |= {deps.name(r) for r in project["optional-dependencies"][extra]}
    assert conda | pip == wanted, f"only in environment.yml: {(conda | pip) - wanted}; only in pyproject: {wanted - (conda | pip)}"


def test_setup_never_installs_torch_over_an_importable_one(root):
    text = (root / "scripts" / "setup.sh").read_text()
    assert "--exclude torch" in text and "import torch" in text
    assert "torch" not in deps.deps(exclude={"torch"})


def test_ci_calls_the_readme_test_command(root):
    readme = (root / "README.md").read_text()
    assert "make test" in readme and "make run" in readme
    assert "make test" in (root / ".ci" / "run").read_text()


@pytest.mark.parametrize("req,missing", [("pytest", False), ("pytest>=1", False), ("pytest<1", True),
                                         ("no-such-package-gpulab", True), ("PyYAML", False)])
def test_setup_installs_only_what_is_missing(req, missing):
    """A set-up with nothing to install starts no installer (scripts/deps.py --missing)."""
    assert deps.missing([req]) == ([req] if missing else [])


@pytest.mark.parametrize("part", ["science", "jupyter", "compiler"])
def test_setup_warm_step_runs(root, part):
    """scripts/warm.py (set-up's bytecode step, which only warns when it fails) still imports everything and
    runs a cell through papermill; science's last line is set-up's "ready" text; compiler leaves bytecode for
    every file of Inductor's code generators (no chain import reaches them)."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, str(root / "scripts" / "warm.py"), part], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    if part == "science":
        assert res.stdout.strip().splitlines()[-1].startswith("torch ")
    if part == "compiler":
        from pathlib import Path

        codegen = Path(importlib.util.find_spec("torch").submodule_search_locations[0]) / "_inductor" / "codegen"
        missing = [p.name for p in codegen.glob("*.py") if not Path(importlib.util.cache_from_source(str(p))).exists()]
        assert not missing, missing
