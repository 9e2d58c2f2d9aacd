"""`gpulab run` where the user works: from the user's own folder, the workload runs there, with the
caller's environment, and the run folder lands there; the wheel carries the notebooks, params and patches."""
from __future__ import annotations

import json
import os
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT
from gpulab import proc, project

TRAIN = '''"""A user's training script: a data file by relative path, a helper beside it, a module on PYTHONPATH."""
import argparse
import os

import torch

import helper            # beside the script
import team_utils        # only on the caller's PYTHONPATH

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=2)
p.add_argument("--tag", default="")
args = p.parse_args()
rows = [[float(x) for x in line.split()] for line in open("data/points.txt")]
x = torch.tensor(rows)
model = torch.nn.Linear(x.shape[1], 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(args.steps):
    loss = helper.loss(model, x)
    opt.zero_grad()
    loss.backward()
    opt.step()
with open("ran_here.log", "a") as fh:
    fh.write(f"{os.getcwd()}|{args.steps}|{args.tag}|{team_utils.NAME}\\n")
print("loss", float(loss))
'''


@pytest.fixture
def user_folder(tmp_path):
    """A project of the user's own, nowhere near a gpulab checkout."""
    me = tmp_path / "myproject"
    (me / "data").mkdir(parents=True)
    (me / "train.py").write_text(TRAIN)
    (me / "helper.py").write_text("def loss(model, x):\n    return (model(x) ** 2).mean()\n")
    (me / "data" / "points.txt").write_text("".join(f"{i} {i % 3} {i % 5}\n" for i in range(16)))
    (tmp_path / "team" / "team_utils.py").parent.mkdir()
    (tmp_path / "team" / "team_utils.py").write_text("NAME = 'team'\n")
    return me


def test_a_user_folder_is_not_taken_for_a_checkout(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "params").mkdir()   # a user's own notebooks/ and params/ folders
    found = project.find(tmp_path)
    assert found.root != tmp_path and found.found_by in ("source tree", "installed")
    assert project.default_runs(tmp_path) == tmp_path / "gpulab-runs"
    assert project.default_runs(ROOT / "lib") == ROOT / "outputs"   # inside a checkout: its outputs/


def test_gpulab_root_must_be_a_project(tmp_path, monkeypatch):
    monkeypatch.setenv(project.ENV_ROOT, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="is not a gpulab project"):
        project.find()


@pytest.mark.slow
def test_run_from_the_users_folder_runs_the_workload_there(user_folder, tmp_path):
    """The whole chain with smoke's sizes (gpulab's params/smoke.yaml, named from the user's folder; one trial
    per rung: 03 takes 02's run of the script as its trial), started from the user's folder with a relative
    script path and its arguments in one quoted value: the script finds its data, its helper and the caller's
    PYTHONPATH, and the index says healthy; the run folder is ./gpulab-runs/<run-id>."""
    env = proc.python_env()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(tmp_path / "team")])
    env.pop(project.ENV_ROOT, None)
    argv = [sys.executable, "-m", "gpulab", "run", "--params", "params/smoke.yaml",   # gpulab's own, found from here
            "-p", "workload=script:train.py --steps 3 --tag quoted", "-p", "repeats=1", "--notebook-timeout", "400"]
    r = proc.run(argv, timeout_s=900, cwd=user_folder, env=env, capture=True, label="gpulab-run-user")
    assert r.returncode == 0, r.stderr[-4000:]
    index = Path(r.stdout.strip().splitlines()[-1])
    assert index.parent.parent == user_folder / "gpulab-runs" and index.exists()
    runs = [line.split("|") for line in (user_folder / "ran_here.log").read_text().splitlines()]
    assert runs and all(run == [str(user_folder.resolve()), "3", "quoted", "team"] for run in runs), runs
    summary = json.loads((index.parent / "run.json").read_text())
    sc = summary["scenarios"][0]
    assert sc["verdict"] == "healthy", sc
    assert [n["status"] for n in sc["notebooks"]] == ["ok"] * len(sc["notebooks"]), sc["notebooks"]
    assert not (ROOT / "train.py").exists() and not (ROOT / "ran_here.log").exists()


@pytest.mark.slow
def test_the_wheel_carries_notebooks_params_and_patches(tmp_path):
    """`pip wheel --no-deps .` (from a copy of the checkout, so the build leaves nothing in it); the installed
    package then finds its own notebooks from a folder far from any checkout."""
    src = tmp_path / "src"
    src.mkdir()
    keep = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "lib", "notebooks", "params", "patches")
    for name in keep:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(
            ROOT / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__", "*.egg-info")}
                                        if (ROOT / name).is_dir() else {}))
    r = proc.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", ".", "-w",
                  str(tmp_path / "dist")], timeout_s=300, cwd=src, capture=True, label="pip-wheel")
    assert r.returncode == 0, r.stderr[-3000:]
    wheel = next((tmp_path / "dist").glob("gpulab-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    lib = ROOT / "lib"
    sources = {f.relative_to(lib).as_posix() for f in (lib / "gpulab").rglob("*")
               if f.is_file() and "__pycache__" not in f.parts and not f.name.endswith(".pyc")}
    assert sources - names == set(), "the package's own files (sources the recorder builds, templates) are missing"
    for folder, pattern in (("notebooks", "[0-9][0-9]_*.ipynb"), ("params", "*.yaml"), ("params/scenarios", "*.yaml"),
                            ("patches", "*.py")):
        wanted = {f"gpulab/_data/{folder}/{p.name}" for p in (ROOT / folder).glob(pattern)}
        assert wanted and wanted <= names, sorted(wanted - names)
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != project.ENV_ROOT}
    env["PYTHONPATH"] = str(site)
    r = proc.run([sys.executable, "-c", "from gpulab import fixindex, project; p = project.find(); "
                  "print(p.found_by, p.root, fixindex.project_dir())"], timeout_s=60, cwd=elsewhere, env=env,
                 capture=True, label="installed-gpulab")
    assert r.returncode == 0, r.stderr
    data = site / "gpulab" / "_data"
    assert r.stdout.split() == ["installed", str(data), str(data / "patches")]
