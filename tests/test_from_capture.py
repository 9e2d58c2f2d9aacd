"""`gpulab run --from DIR`: the workbook on what `gpulab watch` caught. Each capture here is a real watch of a
real failing program (a native deadlock in a custom op, two gloo ranks calling different collectives, a
checkpoint that stalls), then the chain reads it without running the job again."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab.hang.investigation import caught
from gpulab.hang.jobs import merge

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
# `gpulab run --from` on the device the CPU programs ran on: cpu resolves without torch, while auto on a GPU host has the runner
# ask torch in a child (a torch import, ~3 CPU-s)
CPU = ("-p", "device=cpu")


def _gpulab(args, timeout=300):
    return subprocess.run([sys.executable, "-m", "gpulab", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def _watch(out: Path, *args: str, stall: str = "2") -> subprocess.CompletedProcess:
    return _gpulab(["watch", "--stall", stall, "--quiet", "--status-every", "0", "--out", str(out), *args],
                   timeout=180)


def _run_dir(out: Path) -> Path:
    return (out / "latest").resolve()


def _metrics(out: Path) -> dict:
    return json.loads((_run_dir(out) / "baseline" / "metrics.json").read_text())


@pytest.mark.parametrize("make,msg", [
    (lambda d: d / "missing", "is not a folder"),
    (lambda d: d, "is not a gpulab watch capture: it has no verdict.json"),
    (lambda d: (d / "verdict.json").write_text("{not json") and d, "is not a readable verdict"),
    (lambda d: (d / "verdict.json").write_text('{"rungs": []}') and d, "is not a gpulab watch verdict"),
])
def test_a_folder_that_is_not_a_capture_is_bad_input(tmp_path, make, msg):
    folder = tmp_path / "cap"
    folder.mkdir()
    bad = make(folder)
    r = _gpulab(["run", "--from", str(bad), "--out", str(tmp_path / "o")], timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and msg in lines[0] and str(bad) in lines[0], r.stderr
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())   # nothing run, nothing written


def test_a_caught_hang_gets_the_index_verdict_and_next_step_without_rerunning_the_job(tmp_path):
    """The chain on a caught single-process hang, fixes tried on the shorter command given as repro: the index
    says hang, names the op, and says what 04 found (a fix or nothing, with what was tried). 02 to 05: those
    that read the capture or the program (01 and 06 cannot change a hang's verdict: tests/chainrun.py)."""
    cap = tmp_path / "cap"
    job = ["python", str(FIX / "custom_op_deadlock.py"), "--gil", "released"]
    assert _watch(cap, "--", *job).returncode == 3
    r = _gpulab(["run", "--from", str(cap), "--only", "02,03,04,05", "--out", str(tmp_path / "o"), *CPU,
                 "-p", f"repro={' '.join(job)}",
                 "-p", "repeats=1", "-p", "cost_rounds=0", "-p", "fix_budget_s=10"], timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]   # its time: benchmarks/bench_run_from.py
    run = json.loads((_run_dir(tmp_path / "o") / "run.json").read_text())
    sc = run["scenarios"][0]
    assert sc["verdict"] == "hang" and "locked_scale" in sc["evidence"], sc
    assert "fixes it" in sc["next_step"] or "nothing tried fixes it" in sc["next_step"], sc["next_step"]
    m = _metrics(tmp_path / "o")
    m03 = m["03_bisect_hang"]["metrics"]
    assert m03["status"] == "hang" and m03["in_flight_op"].startswith("gpulab_fixtures.locked_scale")
    assert m03["from_capture"] == [str(cap.resolve())] and m03["runs"] == 0   # nothing climbed or re-run
    assert m["03_bisect_hang"]["headline"].startswith("caught by gpulab watch: hang")
    m04 = m["04_fix_scenarios"]["metrics"]
    assert m04["recommendation"] or "tried" in m04, m04
    assert m["02_instrument"]["metrics"]["status"] == "hang"   # the op log as the hang left it
    assert m["05_oracle"]["metrics"].get("applies") is False   # the program never called attention
    caught_v = json.loads((_run_dir(tmp_path / "o") / "baseline" / "caught" / "verdict.json").read_text())
    assert caught_v["status"] == "hang" and any("not run again" in n for n in caught_v["notes"])


def test_a_caught_two_rank_job_gives_the_cross_rank_verdict_gpulab_merge_gives(tmp_path):
    cap = tmp_path / "cap"
    assert _watch(cap, "--", "python", str(FIX / "dist_job.py"), "skip", "--world", "2", stall="3").returncode == 3
    _, found = merge.merge([cap])
    r = _gpulab(["run", "--from", str(cap), "--only", "03", "--out", str(tmp_path / "o"), *CPU], timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    m03 = _metrics(tmp_path / "o")["03_bisect_hang"]["metrics"]
    assert (m03["status"], m03["class"], m03["culprit"]) == ("hang", found.cls, found.culprit)
    assert found.cls == "collective_mismatch"
    v = json.loads((_run_dir(tmp_path / "o") / "baseline" / "caught" / "verdict.json").read_text())
    assert v["divergence"]["seq"] == found.divergence.seq and len(v["processes"]) == len(found.processes)


def test_a_stall_that_never_recovers_under_keep_is_the_evidence_read(tmp_path):
    """--on-stall keep with a timeout: the checkpoint never ends, the stall is captured in captures/01 and the
    watch goes on until the timeout; --from reads that capture (the job at the stall), not the timeout's end. The
    timeout leaves room for a start that takes 20 s on a loaded 2-core CI (the watch then sleeps, costing no CPU)."""
    cap = tmp_path / "cap"
    r = _gpulab(["watch", "--stall", "1.5", "--on-stall", "keep", "--timeout", "45", "--quiet", "--out", str(cap),
                 "--", "python", str(FIX / "checkpoint_pause.py"), "--steps", "40", "--at", "3", "--pause", "120"],
                timeout=180)
    assert r.returncode == 3, r.stderr
    top = json.loads((cap / "verdict.json").read_text())
    assert top["status"] == "hang" and top["stalls"][0]["recovered"] is False
    src = caught.source(cap)
    assert src.chosen == cap / "captures" / "01" and "never recovered" in src.why
    v = caught.first_failure([cap], tmp_path / "o")
    assert v.status == "hang" and "save_checkpoint" in v.stacks["python"]
    assert (tmp_path / "o" / "caught" / "ops.log").is_file()
    head, metrics = caught.finding([cap], v, None, "script:x.py")
    assert metrics["status"] == "hang" and metrics["stalls"] == 1 and metrics["stalls_recovered"] == 0
    # the capture's owner decides whose bug it is, as in a ladder run: the index sends it to the program
    assert metrics["owner"] == v.owner and v.owner["kind"] == "program", v.owner
    assert metrics["in_program"] and "checkpoint_pause.py" in metrics["in_program"], metrics["in_program"]
    assert "1 stall(s) while watched, 0 recovered (checkpoint)" in head


def test_a_capture_of_a_stall_that_recovered_is_no_hang(tmp_path):
    """--from on one of captures/NN of a keep watch, a checkpoint pause the job came back from: read as the hang it
    looked like then, the index said HANG and sent the user to fix save_checkpoint (seen on the user path). It is
    the stall's outcome: ok, what the capture saw kept as evidence, nothing to fix."""
    cap = tmp_path / "cap"
    r = _gpulab(["watch", "--stall", "1.5", "--on-stall", "keep", "--quiet", "--out", str(cap), "--", "python",
                 str(FIX / "checkpoint_pause.py"), "--steps", "30", "--at", "8", "--pause", "3.5"], timeout=180)
    assert r.returncode == 0, r.stderr
    one = cap / "captures" / "01"
    assert json.loads((one / "verdict.json").read_text())["status"] == "hang"   # as the capture saw it
    src = caught.source(one)
    assert "a stall that recovered after" in src.why and "checkpoint" in src.why, src.why
    v = caught.first_failure([one], tmp_path / "o")
    assert v.status == "ok" and v.cls is None and v.owner is None and not v.suggested
    assert v.evidence[0].startswith("a stall that recovered after") and "save_checkpoint" in v.stacks["python"]
    head, metrics = caught.finding([one], v, None, "script:x.py")
    assert metrics["status"] == "ok" and metrics["owner"] is None and metrics["in_program"] is None
    assert "not a hang" in head, head
    cmd, why = caught.repro_command("", tmp_path / "o")
    assert cmd is None and why.startswith("nothing to fix: a stall that recovered"), why
    assert caught.recording([one], tmp_path / "o").status == "ok"


@pytest.mark.parametrize("command,want", [
    (["python", "train.py", "--lr", "1e-4"], "script:train.py --lr 1e-4"),
    (["torchrun", "--nproc-per-node", "2", "train.py"], "script:-m torch.distributed.run --nproc-per-node 2 train.py"),
    (["python", "-m", "pkg.train", "a b"], "script:-m pkg.train 'a b'"),
])
def test_the_captured_command_as_the_workload(command, want):
    assert caught.workload_of(command) == want


def test_04_gives_03s_reason_when_there_is_no_repro(tmp_path):
    """A job's hang (one rank alone in a collective) is never replayed in one process: 04 passes on 03's reason,
    not 'the replay did not fail the same way' of a replay that never ran (seen on the user path)."""
    (tmp_path / caught.COPY).mkdir()
    (tmp_path / caught.COPY / "verdict.json").write_text(json.dumps({"status": "hang"}))
    (tmp_path / "repro").mkdir()
    (tmp_path / "repro" / "repro.json").write_text(json.dumps({"verified": None, "explanation": "the job is the repro"}))
    cmd, why = caught.repro_command("", tmp_path)
    assert cmd is None and why.startswith("no reproduction to try fixes on: the job is the repro;"), why
    assert "small_case.py" in caught.no_fixes_md(why)


@pytest.mark.parametrize("verdict,repro,want", [
    ({"status": "ok", "exit_code": 0, "stalls": [{"recovered": True}, {"recovered": True}]}, "",
     "nothing to fix: the watched job ended ok (exit code 0), after 2 stall(s) that recovered (2 of 2)"),
    ({"status": "ok", "exit_code": 0}, "", "nothing to fix: the watched job ended ok (exit code 0)"),
    ({"status": "hang"}, "", "no reproduction to try fixes on"),
    ({"status": "ok", "exit_code": 0}, "python small.py", "the command given as repro: python small.py"),
])
def test_04_says_there_is_nothing_to_fix_when_the_watched_job_ended_well(tmp_path, verdict, repro, want):
    """A job that ended well (its pauses recovered) has nothing to reproduce: 04 says so, not that 03's replay
    'did not fail the same way' (seen on the user path: run --from on a keep watch of a checkpointing job)."""
    (tmp_path / caught.COPY).mkdir()
    (tmp_path / caught.COPY / "verdict.json").write_text(json.dumps(verdict))
    cmd, why = caught.repro_command(repro, tmp_path)
    assert why.startswith(want) and (cmd is None) == (not repro), why
    if cmd is None:   # a shorter command is asked for only when there is something to reproduce
        assert ("small_case.py" in caught.no_fixes_md(why)) == (verdict["status"] != "ok")
