"""02's recorded run is a ladder trial: 03 counts it as its first, and 02 never runs a user's script
again only to time the recorder. Real children: a native deadlock in a custom op, a healthy script."""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpulab.hang.investigation import firstrun, investigate, ladder
from gpulab.trace import followups
from gpulab.workloads import WorkloadConfig

FIX = Path(__file__).parent / "fixtures"
STALL = 2.0


def _cfg(script: str) -> WorkloadConfig:
    return WorkloadConfig.from_params({"workload": f"script:{FIX / script}"}, device="cpu")


def test_02s_hang_is_03s_first_trial_and_only_the_same_trial_counts(tmp_path):
    cfg = _cfg("custom_op_deadlock.py")
    rec = firstrun.record(cfg, tmp_path, mode="auto", timeout_s=120, stall_s=STALL)
    assert rec.status == "hang" and rec.snapshot is not None and rec.snapshot.started > 0
    assert (tmp_path / "ops.log").is_file() and (tmp_path / "ops.stderr.txt").is_file()
    assert (tmp_path / firstrun.FOLDER / "ops.log").is_file()      # a failure keeps its log for 03's replay
    rung = investigate.rungs(cfg)[0]
    same = dict(mode="auto", fault="none", stall_s=STALL, ladder_dir=tmp_path / "ladder")
    assert firstrun.as_trial(tmp_path, rung, **same).outcome == "hang"
    # anything that decides a trial's outcome differs: 03 runs its own
    assert firstrun.as_trial(tmp_path, rung, **{**same, "stall_s": STALL + 1}) is None
    assert firstrun.as_trial(tmp_path, rung, **{**same, "mode": "ops"}) is None
    assert firstrun.as_trial(tmp_path, rung, **{**same, "fault": "deadlock:aten.mm@3"}) is None
    other = ladder.Rung(rung.name, (*rung.command, "--at", "2"))
    assert firstrun.as_trial(tmp_path, other, **same) is None

    early = investigate.replay_early(cfg, tmp_path, mode="auto", fault="none", stall_s=STALL, timeout_s=120)
    t0 = time.monotonic()
    lad = investigate.climb(cfg, tmp_path, repeats=1, jobs=1, stall_s=STALL, timeout_s=120, mode="auto",
                            fault="none")
    assert time.monotonic() - t0 < 5                               # nothing ran again
    assert not any((tmp_path / "ladder").glob(f"{rung.name}-*"))
    (r,) = lad.rungs
    assert r.trials == 1 and r.counts["hang"] == 1 and r.first_failure["folder"] == f"../{firstrun.FOLDER}"
    v = investigate.first_failure(lad, tmp_path)                   # 03's verdict, stacks and all, read back
    assert v.status == "hang" and v.cls == "host_lock" and "locked_scale" in v.in_flight_op["name"]
    assert v.stacks.get("python")
    rep = early.result(timeout=300)                                # 02's run replayed while the ladder climbed
    assert rep.verified == "repro.py" and (tmp_path / "repro" / "repro.py").is_file()
    assert firstrun.as_trial(tmp_path, rung, **same) is not None and investigate.replay_early(
        cfg, tmp_path, mode="auto", fault="none", stall_s=STALL + 1, timeout_s=120) is None


def test_a_healthy_script_passes_once_and_is_not_rerun_to_time_the_recorder(tmp_path):
    cfg = _cfg("healthy_train.py")
    rec = firstrun.record(cfg, tmp_path, mode="auto", timeout_s=120, stall_s=30.0)
    assert rec.status == "ok" and rec.snapshot.started > 100
    assert "final loss" in (tmp_path / "ops.stderr.txt").read_text()
    assert not (tmp_path / firstrun.FOLDER / "ops.log").exists()   # a pass drops the watch's copy
    rung = investigate.rungs(cfg)[0]
    t = firstrun.as_trial(tmp_path, rung, mode="auto", fault="none", stall_s=30.0, ladder_dir=tmp_path / "ladder")
    assert t is not None and t.outcome == "pass" and t.index == 0
    assert investigate.replay_early(cfg, tmp_path, mode="auto", fault="none", stall_s=30.0, timeout_s=120) is None
    assert investigate.recorded_gpu_peak(tmp_path) is None and not investigate.light(cfg, tmp_path)   # no GPU used
    t0 = time.monotonic()
    ov, note = followups.recorder_cost(cfg, tmp_path, mode="auto", repeats=5, stall_s=30.0)
    assert ov is None and "for a user program" in note and time.monotonic() - t0 < 1
    assert not list(tmp_path.glob("overhead*"))


def test_the_builtin_workload_is_the_configured_rungs_trial(tmp_path):
    cfg = WorkloadConfig.from_params({"rung": "forward", "layers": 1, "batch": 1, "heads": 2, "head_dim": 16,
                                      "text_tokens": 8, "image_tokens": 8}, device="cpu")
    top = firstrun.rung_of(cfg)
    assert top == investigate.rungs(cfg)[-1] and top.name == "forward"
    assert firstrun.rung_of(replace(cfg, rung="sdpa")).name == "sdpa"


@pytest.mark.gpu
def test_a_script_that_passed_with_little_gpu_memory_shares_the_gpu_four_at_a_time(tmp_path):
    script = tmp_path / "small_cuda.py"
    script.write_text("import torch\nx = torch.randn(256, 256, device='cuda')\nfor _ in range(20):\n"
                      "    x = torch.tanh(x @ x)\ntorch.cuda.synchronize()\nprint(float(x.sum()))\n")
    cfg = WorkloadConfig.from_params({"workload": f"script:{script}"}, device="cuda")
    rec = firstrun.record(cfg, tmp_path, mode="auto", timeout_s=120, stall_s=30.0)
    assert rec.status == "ok"
    peak = investigate.recorded_gpu_peak(tmp_path)
    assert peak is not None and 0 < peak < investigate.LIGHT_BYTES and investigate.light(cfg, tmp_path)
    lad = investigate.climb(cfg, tmp_path, repeats=5, jobs=0, stall_s=30.0, timeout_s=120, mode="auto",
                            fault="none")
    assert lad.jobs == 4 and lad.rungs[0].trials == 5 and lad.passed
