"""Fast and light by default: a run folder keeps what a reader needs, and says the truth while
it runs. Real recorder, real watchdog children, a real `gpulab run` child."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from gpulab import proc, report, trace
from gpulab.chain import index, state
from gpulab.hang.investigation import ladder
from gpulab.trace import ring
from nbfactory import RECORD, notebook, project

FIXTURES = Path(__file__).resolve().parent / "fixtures"
pytestmark = pytest.mark.usefixtures("native_hot_path")


def _record(log: Path, n_ops: int, capacity: int = ring.DEFAULT_CAPACITY, mode: str = "ops"):
    import torch

    one = torch.ones(4)
    with trace.Recorder(log, mode, capacity=capacity) as rec:   # ops that run no op inside them: a record each
        x = one + one   # not torch.empty: its garbage can be NaN, and NaN != NaN in a compare
        for _ in range(n_ops - 1):
            x = x + one
    rec.close()
    return trace.read(log)


def test_shrink_cuts_a_finished_log_to_what_was_recorded_and_reads_the_same(tmp_path):
    log = tmp_path / "ops.log"
    before = _record(log, 50)
    size = log.stat().st_size
    assert size > 4_000_000   # the empty string table and memory ring count in a copy
    done = ring.shrink(log)
    assert done.before == size and done.after == log.stat().st_size < 40_000 and done.kept_whole == ()
    assert trace.read(log) == before   # every record, string and sample, the same capacity
    assert ring.shrink(log).after == done.after   # twice is once


def test_shrink_keeps_a_wrapped_op_ring_whole(tmp_path):
    log = tmp_path / "ops.log"
    before = _record(log, 100, capacity=16)
    assert before.dropped == 84
    done = ring.shrink(log)
    assert done.kept_whole == ("ops",) and done.after < done.before
    after = trace.read(log)
    assert after == before and [r.seq for r in after.records] == list(range(84, 100))


def test_shrink_stats_mode_and_a_log_that_is_not_one(tmp_path):
    log = tmp_path / "stats.log"
    before = _record(log, 20, mode="stats")
    ring.shrink(log)
    assert trace.read(log) == before
    other = tmp_path / "notes.log"
    other.write_text("a text log\n" * 1000)
    with pytest.raises(ValueError, match="is not a gpulab trace log"):
        ring.shrink(other)
    assert other.read_text() == "a text log\n" * 1000   # left as it was
    with pytest.raises(FileNotFoundError):
        ring.shrink(tmp_path / "missing.log")


def test_passing_trials_drop_their_op_log_failing_ones_keep_it_shrunk(tmp_path):
    ok = tmp_path / "ok.py"
    ok.write_text("import torch\nprint((torch.ones(3) + 1).sum())\n")
    rungs = ladder.command_rungs([f"ok={sys.executable} {ok}", f"bad={sys.executable} {FIXTURES / 'error_exit.py'}"])
    lr = ladder.run(rungs, repeats=1, stall_s=30, timeout_s=120, out_dir=tmp_path / "ladder", mode="ops",
                    progress=lambda m: None, stacks=False)
    assert [r.counts["pass"] for r in lr.rungs] == [1, 0]
    passed, failed = tmp_path / "ladder" / "ok-000", tmp_path / "ladder" / "bad-000"
    assert not (passed / "ops.log").exists()
    v = json.loads((passed / "verdict.json").read_text())
    assert v["status"] == "ok" and v["log"]["op_log"] is None and "passed" in v["log"]["op_log_note"]
    assert v["elapsed_s"] > 0 and (passed / "stdout.txt").exists()
    log = failed / "ops.log"
    assert log.exists() and log.stat().st_size < 200_000
    snap = trace.read(log)
    assert snap.started > 0 and snap.torn == 0 and any("relu" in r.name for r in snap.records)
    assert lr.rungs[1].first_failure["log"]["op_log"] == "ops.log"


def test_folder_contents_counts_apparent_size(tmp_path):
    (tmp_path / "sc" / "ladder" / "t-000").mkdir(parents=True)
    with open(tmp_path / "sc" / "ladder" / "t-000" / "sparse.log", "wb") as fh:
        fh.truncate(3_000_000)   # sparse: little disk, but a copy transfers all of it
    (tmp_path / "sc" / "a.html").write_text("x" * 1000)
    (tmp_path / "run.json").write_text("{}")
    c = report.folder_contents(tmp_path)
    assert c.files == 3 and c.bytes == 3_001_002
    assert [(p.name, p.files) for p in c.parts] == [("sc/ladder", 1), ("sc/*.html", 1), ("*.json", 1)]
    assert c.largest[0] == ("sc/ladder/t-000/sparse.log", 3_000_000)
    html = index.render({"run_id": "r", "status": "ok", "scenarios": [], "folder": c.to_dict()})
    assert "3 files, 3 MB in all" in html and "sc/ladder" in html


def test_running_text_says_which_cell():
    assert state.running_text("03_bisect_hang", 3, 10) == "running 03_bisect_hang, cell 4/10"
    assert state.running_text("03_bisect_hang", 0, 0) == "running 03_bisect_hang, starting"
    assert "rendering" in state.running_text("03_bisect_hang", 10, 10)


def _read(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def test_a_running_chain_says_running_and_gives_no_verdict_until_it_has_run(tmp_path):
    """A real `gpulab run` child; run.json and index.html are read while it runs."""
    fast = notebook("Fast", "", RECORD.format(name="01_fast", headline="fast and fine"))
    slow = notebook("Slow", "", "import time; time.sleep(1.5)", "import time; time.sleep(1.5)",
                    "import time; time.sleep(1.5)", RECORD.format(name="02_slow", headline="slow and fine"))
    proj = project(tmp_path / "proj", {"01_fast": fast, "02_slow": slow})
    out = tmp_path / "outputs"
    env = dict(proc.python_env(), GPULAB_ROOT=str(proj))
    seen: list[dict] = []
    pages: list[str] = []
    t0 = time.monotonic()
    # device=cpu: these notebooks use no device (auto on a GPU host has the runner ask torch in a child: a torch import)
    with proc.Child([sys.executable, "-m", "gpulab", "run", "-p", "device=cpu", "--out", str(out)], cwd=proj,
                    env=env, stdout=tmp_path / "run.out", stderr=tmp_path / "run.err", label="gpulab-run") as child:
        while child.wait(timeout=0.2) is None:
            assert time.monotonic() - t0 < 90, "the run took too long"
            runs = [p for p in out.glob("2*") if p.is_dir()]
            if not runs:
                continue
            run = _read(runs[0] / "run.json")
            if run and run["status"] == "running":
                seen.append(run)
                page = (runs[0] / "index.html").read_text() if (runs[0] / "index.html").exists() else ""
                if "02_slow, cell" in page:
                    pages.append(page)
    err = (tmp_path / "run.err").read_text()
    assert child.returncode == 0, err
    assert seen, "run.json never said running"
    for run in seen:   # while it ran: never a verdict for work that had not run
        sc = run["scenarios"][0]
        ran = [n for n in sc["notebooks"] if n["status"] != "running"]
        if len(ran) < 2:   # a notebook still to run or running: no verdict yet
            assert sc["verdict"] == "running" and sc["next_step"].startswith("wait"), sc
        else:              # both had run, the run not yet closed (its last write is a moment later)
            assert sc["verdict"] == "healthy" and sc["running"] is None, sc
    assert any(r["scenarios"][0]["verdict"] == "running" for r in seen)
    cells = {r["progress"] for r in seen if r["progress"] and "02_slow, cell" in r["progress"]}
    assert any("cell 2/" in c or "cell 3/" in c for c in cells), cells   # it followed the cells
    mid = next(r for r in seen if r["progress"] and "02_slow" in r["progress"])
    assert [n["status"] for n in mid["scenarios"][0]["notebooks"]] == ["ok", "running"]
    assert pages and all("healthy" not in p and "running (baseline: running 02_slow, cell" in p for p in pages)
    final = json.loads((next(out.glob("2*")) / "run.json").read_text())
    assert final["status"] == "ok" and final["progress"] is None
    sc = final["scenarios"][0]
    assert sc["verdict"] == "healthy" and sc["running"] is None
    assert [n["status"] for n in sc["notebooks"]] == ["ok", "ok"]
    assert final["folder"]["files"] > 5 and final["folder"]["bytes"] > 0
    assert "What this folder holds" in (next(out.glob("2*")) / "index.html").read_text()


def test_a_run_on_the_cpu_asks_torch_nothing_for_its_device(monkeypatch):
    """device=cpu resolves without torch: the runner starts no device=auto question for it (a child importing
    torch, a few CPU-seconds on every run on a CPU) and hands its kernels no stale answer; device=auto asks where
    the host has GPU device files, and not where it has none."""
    from types import SimpleNamespace

    from gpulab.chain import runner
    from gpulab.chain.autodevice import AutoDevice
    from gpulab.device import AUTO_ENV

    run = SimpleNamespace(auto=AutoDevice())
    env = {"PATH": "/usr/bin", AUTO_ENV: "cuda"}   # an answer found in another environment
    try:
        assert runner._device_env(run, env, {"device": "cpu"}) == {"PATH": "/usr/bin"}
        assert not runner._asks_device({"device": " CPU "}) and runner._asks_device({"device": "cuda:1"})
        assert run.auto._answers == {}   # no question started
        # a notebook's own kernel does not ask (it asks torch itself); the next notebook's head start does
        assert runner._device_env(run, env, {"device": "auto"}, ask=False) == {"PATH": "/usr/bin"}
        assert run.auto._answers == {}
        monkeypatch.setattr(runner, "no_gpu_files", lambda: True)
        assert runner._device_env(run, env, {"device": "auto"}) == {"PATH": "/usr/bin"}
        assert run.auto._answers == {}   # no GPU device file: auto is cpu, found by each kernel without torch
        monkeypatch.setattr(runner, "no_gpu_files", lambda: False)
        runner._device_env(run, env, {"device": "auto"})
        assert len(run.auto._answers) == 1
    finally:
        run.auto.close()   # the auto question's child is not left running
