"""The three places dependencies are named must agree: pyproject.toml, environment.yml, setup."""
from __future__ import annotations

import importlib.util

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
