"""What a run leaves on disk: readable by the team, and honest when the disk fills up."""
from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from nbfactory import RECORD, notebook, project

LIB = str(Path(__file__).resolve().parents[1] / "lib")
# A notebook with enough output that its HTML rendering (~0.3 MB of nbconvert's CSS alone) needs space.
PLOT = "import matplotlib.pyplot as plt; plt.plot(range(100)); plt.show()"
# device=cpu: the notebook uses no device, and device=auto on a GPU host would have the runner ask torch in a child (a torch
# import: a few CPU-seconds a run)
RUN = [sys.executable, "-m", "gpulab", "run", "-p", "device=cpu"]


def _proj(tmp_path):
    return project(tmp_path / "proj", {"01_plot": notebook("Plot", "", PLOT, RECORD.format(name="01_plot",
                                                                                          headline="drew"))})


def test_products_are_readable_by_the_team(tmp_path):
    proj = _proj(tmp_path)
    r = subprocess.run([*RUN, "--out", str(tmp_path / "out")], cwd=proj,
                       capture_output=True, text=True, timeout=180, env={**os.environ, "PYTHONPATH": LIB},
                       preexec_fn=lambda: os.umask(0o022))
    assert r.returncode == 0, r.stderr
    run_dir = Path(r.stdout.strip().splitlines()[-1]).parent
    for p in [run_dir, *run_dir.rglob("*")]:
        mode = stat.S_IMODE(p.lstat().st_mode)
        if p.is_symlink():
            continue
        want = 0o755 if p.is_dir() else 0o644
        assert mode & want == want, f"{p.relative_to(run_dir)} is {oct(mode)}"


def _limit_file_size():
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))  # a write past 200 kB fails with EFBIG


@pytest.mark.parametrize("how", ["tmpfs", "file_size_limit"])
def test_full_disk_is_a_failure_with_no_tmp_files_left(tmp_path, how):
    proj = _proj(tmp_path)
    out = tmp_path / "small"
    out.mkdir()
    pre = None
    if how == "tmpfs":
        if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(out)],
                                               capture_output=True).returncode != 0:
            pytest.skip("mounting a small tmpfs needs root with mount permission")
    else:
        pre = _limit_file_size
    try:
        r = subprocess.run([*RUN, "--out", str(out)], cwd=proj,
                           capture_output=True, text=True, timeout=180, env={**os.environ, "PYTHONPATH": LIB},
                           preexec_fn=pre)
        assert r.returncode == 1, r.stderr
        assert "Traceback" not in r.stderr
        assert "is the disk full?" in r.stderr.strip().splitlines()[-1]
        leftovers = [str(p) for p in out.rglob("*.tmp")]
        assert leftovers == []
        run_dir = next(out.glob("2*"))
        if (run_dir / "run.json").exists():
            run = json.loads((run_dir / "run.json").read_text())
            assert run["status"] in ("failed", "running"), run["status"]  # never ok
        if (run_dir / "index.html").exists():
            assert "ran to the end" not in (run_dir / "index.html").read_text()
    finally:
        if how == "tmpfs":
            subprocess.run(["umount", str(out)], capture_output=True)
