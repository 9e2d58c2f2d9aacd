"""`gpulab compare` on real training programs in real child processes (tests/fixtures/numerics/): a custom op
wrong on one side is named with its line and pass; a statistic accumulated in bfloat16 is named before the Inf
it causes; a deterministic program agrees with itself; eager agrees with torch.compile; a command that does
not start, a run that crashes and two different programs get a verdict saying which and where. On a GPU:
float32 CPU against float32 CUDA agrees, and a nondeterministic op is named on a rerun; on the CPU, its stand-in
(matmuls accumulated in another order) agrees while a matmul 1e-3 wrong among them is named."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpulab.numerics import compare

FIX = Path(__file__).parent / "fixtures" / "numerics"
PY = sys.executable


def _line(fixture: str, text: str) -> int:
    lines = (FIX / fixture).read_text().splitlines()
    return next(n for n, ln in enumerate(lines, 1) if text in ln)


def _gpulab(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "gpulab", "compare", *argv], capture_output=True, text=True, timeout=600,
                          cwd=cwd)


def test_a_custom_op_wrong_on_one_side_is_named_with_its_line_and_pass_and_the_replay_says_who_is_right(tmp_path):
    js = tmp_path / "c.json"
    p = _gpulab("--json", str(js), "--out", str(tmp_path / "out"), "--stall", "120", "--vary", "impl=good,bad",
                "--", PY, str(FIX / "custom_op_train.py"), "--impl", "{impl}", "--steps", "3", cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    v = json.loads(js.read_text())
    fd = v["first_divergence"]
    assert v["status"] == "diverged", v["summary"]
    assert fd["op"] == "numfix.fused_silu.default", v["summary"]
    assert fd["call_site"].endswith(f"custom_op_train.py:{_line('custom_op_train.py', 'h = fused_silu')} in forward")
    assert fd["pass"] == 3                                  # the bad kernel runs from the first large batch
    assert fd["error"]["max_rel_err"] == pytest.approx(0.15, rel=0.01)
    assert fd["inputs"] and all(i["within_tolerance"] for i in fd["inputs"])
    assert v["replay"]["reference_right"] is True and v["replay"]["candidate_right"] is False
    assert "numfix.fused_silu.default" in p.stdout and "pass 3" in p.stdout and "candidate's kernel is wrong" in p.stdout


def test_a_custom_backward_wrong_on_small_gradients_is_named_at_its_line_not_at_rounding_after_it(tmp_path):
    # the wrong gradients are 1e-4 each: within assert_close's absolute atol, so the optimizer's ops that read
    # them (its sqrt of squared gradients of 1e-9) would seem to make the difference from agreeing inputs
    c = compare.run([PY, str(FIX / "custom_backward.py"), "--impl", "ref"],
                    [PY, str(FIX / "custom_backward.py"), "--impl", "fused"], tmp_path, stall_s=120, replay=False)
    assert c.status == "diverged", c.summary
    fd = c.first_divergence
    dx = _line("custom_backward.py", "# DX")
    assert (fd["op"], fd["call_site"], fd["run"]) == ("aten.mul.Tensor", f"{FIX / 'custom_backward.py'}:{dx} in "
                                                      "backward", "candidate"), c.summary
    assert fd["backward"] and fd["pass"] == 2, c.summary      # dy * g, then * s: the second multiply at that line
    assert "an op only the candidate runs" in c.summary and "aten.silu_backward.default" in c.summary, c.summary
    assert fd["seen_first_at"]["op"] == "aten.mm.default", fd


def test_b_a_statistic_accumulated_in_bfloat16_is_named_before_the_inf_it_causes(tmp_path):
    c = compare.run([PY, str(FIX / "stat_train.py"), "--stat-dtype", "float32"],
                    [PY, str(FIX / "stat_train.py"), "--stat-dtype", "bfloat16"], tmp_path, stall_s=120,
                    replay=False)
    assert c.status == "diverged", c.summary
    fd = c.first_divergence
    lines = {_line("stat_train.py", "total = total + seen"), _line("stat_train.py", "total_sq = total_sq + seen")}
    assert fd["op"] == "aten.add.Tensor" and int(fd["call_site"].split(":")[1].split()[0]) in lines, c.summary
    assert 1 < fd["pass"] < 40 and not fd["nan_inf"], c.summary       # long before the Inf of step 40
    assert fd["tolerance"]["dtypes"] == ["float32", "bfloat16"] and fd["tolerance"]["rtol"] == 1.6e-2
    assert "NaN/Inf" in fd["then"], fd["then"]                        # the Inf comes later, from it
    t = c.table
    assert t["first_divergence"].sum() == 1 and (t["excess"] > 1).any()


def test_c_a_deterministic_program_agrees_with_itself_bit_for_bit(tmp_path):
    cmd = f"{PY} {FIX / 'custom_op_train.py'} --steps 3"
    c = compare.run(cmd, cmd, tmp_path, stall_s=120)
    assert c.status == "agree", c.summary
    assert c.first_bitwise is None and "bitwise equal" in c.summary
    assert c.aligned["aligned"] == c.aligned["reference_ops"] > 50


def test_c_a_rerun_that_resumes_from_the_first_runs_checkpoint_is_said_to_take_another_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # the program saves and finds its checkpoint in its working folder, the caller's
    cmd = f"{PY} {FIX / 'resume_train.py'}"
    c = compare.run(cmd, cmd, tmp_path / "cmp", stall_s=120)
    assert c.status == "unaligned", c.summary
    load = _line("resume_train.py", "torch.load(CKPT)")   # the candidate's first op of its own: loading the state
    assert c.parted["candidate"]["call_site"] in {f"{FIX / 'resume_train.py'}:{n} in main" for n in (load, load + 1)}, \
        c.parted
    assert c.aligned["candidate_ops"] < c.aligned["reference_ops"]
    assert c.reference_wrote == ("ckpt.pt",) and "ckpt.pt appeared or changed in the working folder" in c.summary
    assert c.first_divergence is None and c.replay is None   # nothing is judged or replayed across unlike steps


def test_a_replay_that_does_not_reproduce_its_first_run_says_so_and_judges_nothing(tmp_path, monkeypatch):
    """A program that reads a counter it left in its folder: the replays start from yet another state, so their
    calls (a scale of 0.75 and 1.0, not the compared 0.25 and 0.5) must not be reported as the runs'."""
    monkeypatch.chdir(tmp_path)
    cmd = ["python", str(FIX / "run_counter.py")]   # a bare python: gpulab's own interpreter, as for watch
    c = compare.run(cmd, cmd, tmp_path / "cmp", stall_s=120)
    fd = c.first_divergence
    assert c.status == "diverged" and fd["op"] == "aten.mul.Tensor", c.summary
    assert fd["call_site"].endswith(f"run_counter.py:{_line('run_counter.py', 'loss = ')} in <module>")
    assert fd["pass"] == 1
    assert c.replay["available"] is False and c.replay["reproduced"] is False, c.replay
    assert "other values than their first runs" in c.summary and "0.75" not in c.summary, c.summary
    assert "count.txt" in c.summary                        # what the reference left where the candidate ran


def test_ops_found_to_be_rounding_are_replayed_in_one_run_per_side(tmp_path):
    """float32 against bfloat16 autocast: the first diverging ops are each right for their dtype; the ops named
    next if they are (up to ROUNDING_REPLAYS more) are kept by the same replay run, not one run pair each."""
    c = compare.run([PY, str(FIX / "autocast_lm.py"), "--steps", "1"],
                    [PY, str(FIX / "autocast_lm.py"), "--steps", "1", "--dtype", "bfloat16"], tmp_path, stall_s=120)
    assert c.status == "diverged", c.summary
    kept = sorted(p.name for p in (tmp_path / "reference.replay").glob("replay*.pt"))
    assert 3 <= len(kept) <= compare.ROUNDING_REPLAYS + 1, kept     # every planned op, in one run
    assert sorted(p.name for p in (tmp_path / "candidate.replay").glob("replay*.pt")) == kept
    assert sorted(p.name for p in tmp_path.glob("*.replay*")) == ["candidate.replay", "reference.replay"]   # one each
    # each op right for its dtype: no op computes a wrong number, the rounding grows
    assert "rounding" in c.summary and "both runs compute it right for their dtype" in c.summary, c.summary


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_ddp_job_is_compared_rank_by_rank_and_the_rank_whose_op_makes_the_difference_is_named(tmp_path, device):
    """torchrun, 2 ranks (gloo on the CPU, NCCL on two GPUs), DistributedSampler and DataLoader workers. A rerun
    agrees bit for bit on every rank (DDP's buckets hold uninitialised memory until backward fills them, and the
    all_reduce writes its result after it returns: neither is read as a difference). With rank 1's inputs scaled,
    rank 1 is named at its own line; rank 0 only receives the difference through the all_reduce."""
    if device == "cuda":
        import torch
        if torch.cuda.device_count() < 2:
            pytest.skip("NCCL needs two GPUs (one rank each)")
    job = ["-m", "torch.distributed.run", "--nproc_per_node", "2", str(FIX / "ddp_train.py"), "--steps", "2",
           "--device", device]
    same = compare.run([PY, *job], [PY, *job], tmp_path / "rerun", stall_s=120)
    assert same.status == "agree" and same.job["ranks"] == {"0": "agree", "1": "agree"}, same.summary
    assert "All 2 ranks agree" in same.summary and "bitwise equal" in same.summary
    bug = compare.run([PY, *job], [PY, *job, "--bug"], tmp_path / "bug", stall_s=120)
    assert bug.status == "diverged" and bug.job["rank"] == 1, bug.summary
    fd = bug.first_divergence
    assert bug.summary.startswith("On rank 1 of 2"), bug.summary
    assert (fd["op"], fd["run"]) == ("aten.mul.Tensor", "candidate"), bug.summary   # the scaling only it runs
    assert fd["call_site"].endswith(f"ddp_train.py:{_line('ddp_train.py', 'x = x * 1000.0')} in <module>"), fd
    assert bug.replay is None   # a job's collective peers cannot be replayed alone


def test_a_model_evaluated_in_training_mode_is_named_at_the_call_that_differs_not_called_rounding(tmp_path):
    """Batch norm at the evaluation computes right for training=True as the reference's does for False: the
    float64 replay finds both right, and the verdict says the two calls differ (it had said 'rounding' and gone on
    to name an op three lines later)."""
    c = compare.run([PY, str(FIX / "eval_mode.py")], [PY, str(FIX / "eval_mode.py"), "--bug"], tmp_path, stall_s=120)
    fd = c.first_divergence
    assert c.status == "diverged" and fd["op"] == "aten.native_batch_norm.default", c.summary
    assert fd["call_site"].endswith("eval_mode.py:18 in <module>") and fd["pass"] == 1, fd
    assert "training=False in the reference and True in the candidate" in c.summary, c.summary
    assert "rounding" not in c.summary.replace("not a kernel or rounding", "")


def test_d_eager_and_torch_compile_agree(tmp_path):
    c = compare.run([PY, str(FIX / "compiled_mlp.py")], [PY, str(FIX / "compiled_mlp.py"), "--compile"], tmp_path,
                    stall_s=240)
    assert c.status == "agree", c.summary
    assert c.aligned["candidate_ops"] < c.aligned["reference_ops"]   # the compiled region's inside is not seen
    assert "within tolerance" in c.summary


def test_e_a_command_that_does_not_start_gets_a_verdict_and_exit_127(tmp_path):
    js = tmp_path / "c.json"
    p = _gpulab("--json", str(js), "--out", str(tmp_path / "out"), f"{PY} {FIX / 'compiled_mlp.py'} --steps 1",
                "no-such-program-gpulab --x", cwd=tmp_path)
    assert p.returncode == 127, p.stderr
    v = json.loads(js.read_text())
    assert v["status"] == "failed" and "candidate command did not start" in v["summary"], v["summary"]
    assert "no-such-program-gpulab" in v["summary"] and "Traceback" not in p.stdout + p.stderr


def test_e_a_run_that_crashes_midway_says_which_where_and_how_far_they_agree(tmp_path):
    c = compare.run(f"{PY} {FIX / 'custom_op_train.py'} --steps 3",
                    f"{PY} {FIX / 'custom_op_train.py'} --steps 3 --crash-at 2", tmp_path, stall_s=120)
    assert c.status == "failed", c.summary
    assert c.runs[1].status == "error" and c.runs[0].status == "ok"
    assert "The candidate run exited with code 1" in c.summary and "the data loader failed at step 2" in c.summary
    assert "up to there the runs agree" in c.summary.lower(), c.summary
    assert 0 < c.runs[1].ops < c.runs[0].ops


def test_e_two_different_programs_cannot_be_aligned(tmp_path):
    c = compare.run(f"{PY} {FIX / 'custom_op_train.py'} --steps 2", f"{PY} {FIX / 'stat_train.py'} --steps 3",
                    tmp_path, stall_s=120)
    assert c.status == "unaligned", c.summary
    assert "cannot be aligned" in c.summary and c.parted is not None


def test_f_matmuls_accumulated_in_another_order_agree_and_the_largest_rounding_is_noted(tmp_path):
    """The CPU's stand-in for CPU against CUDA: the candidate's mm/bmm/addmm accumulate in float64 and round once
    (another valid float32 result): rounding, amplified by 32-term reductions and an optimizer's division, is
    not a divergence."""
    c = compare.run([PY, str(FIX / "layers_train.py")], [PY, str(FIX / "layers_train.py"), "--accumulate", "float64"],
                    tmp_path, stall_s=120)
    assert c.status == "agree", c.summary
    assert c.first_bitwise is not None and "largest rounding difference" in c.summary, c.summary
    assert not c.table["bitwise_equal"].all()


@pytest.fixture(scope="module")
def wrong_matmul(tmp_path_factory) -> tuple[compare.Comparison, dict, list]:
    """A matmul 1e-3 wrong among reordered ones, compared once for the two tests that read it (four real runs:
    each side, then each side's replay). Its replays run at once (the rule's cores lowered to this machine's),
    each replay run's span kept, in an empty working folder that nothing else writes to (a file written there
    would keep the replays apart)."""
    spans, said = {}, []
    run_side = compare.run_side

    def timed(side, *a, **kw):
        t0 = time.monotonic()
        r = run_side(side, *a, **kw)
        spans[kw.get("name") or side] = (t0, time.monotonic())
        return r
    base = tmp_path_factory.mktemp("wrong_matmul")
    (base / "cwd").mkdir()
    cmd = [PY, str(FIX / "layers_train.py"), "--steps", "1"]   # it diverges in step 1's forward
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compare, "run_side", timed)
        mp.setattr(compare, "SIDE_BY_SIDE_CORES", 1)
        mp.chdir(base / "cwd")
        c = compare.run(cmd, [*cmd, "--accumulate", "wrong"], base / "cmp", stall_s=120, log=said.append)
    return c, spans, said


def test_f_a_matmul_wrong_by_1e_3_among_reordered_ones_is_still_named(wrong_matmul):
    c, _, _ = wrong_matmul
    assert c.status == "diverged", c.summary
    fd = c.first_divergence
    line = _line("layers_train.py", "att = torch.softmax(q @ k")
    assert fd["op"] == "aten.bmm.default" and fd["call_site"].endswith(f"layers_train.py:{line} in forward"), c.summary
    assert fd["pass"] == 1 and not fd["backward"] and fd["error"]["max_rel_err"] == pytest.approx(1e-3, rel=0.05)
    assert c.replay["reference_right"] is True and c.replay["candidate_right"] is False, c.summary


def test_the_replays_run_at_once_on_spare_cores_with_the_same_verdict(wrong_matmul):
    """Both sides of a CPU program's replay at once: their runs overlap in time, and the verdict is the one the
    sequential replay gives (the kernel wrong on one side; test_a's custom op replays one side after the other
    on a machine of fewer than SIDE_BY_SIDE_CORES cores)."""
    c, spans, said = wrong_matmul
    assert c.status == "diverged" and c.first_divergence["op"] == "aten.bmm.default", c.summary
    assert c.replay["reference_right"] is True and c.replay["candidate_right"] is False, c.summary
    assert c.replay["reproduced"] is True and "other values than its first run" not in c.summary
    assert any("both sides at once" in s for s in said), said
    (a0, a1), (b0, b1) = spans["reference.replay"], spans["candidate.replay"]
    assert max(a0, b0) < min(a1, b1), spans                 # they overlapped


@pytest.mark.gpu
def test_float32_cpu_and_float32_cuda_agree_on_ordinary_layers(tmp_path):
    c = compare.run(f"{PY} {FIX / 'layers_train.py'} --device cpu", f"{PY} {FIX / 'layers_train.py'} --device cuda",
                    tmp_path, stall_s=120)
    assert c.status == "agree", c.summary


@pytest.mark.gpu
def test_a_nondeterministic_op_on_cuda_is_named_bitwise_on_a_rerun(tmp_path):
    cmd = f"{PY} {FIX / 'nondeterministic_scatter.py'} --device cuda"
    c = compare.run(cmd, cmd, tmp_path, stall_s=120)
    assert c.first_bitwise is not None and c.first_bitwise["op"].startswith("aten.index_add"), c.summary
    assert "not deterministic" in c.summary or c.status == "diverged"


@pytest.mark.parametrize("ref,cand,says", [
    ("{py} {fix}", "no-such-program-gpulab --x", "command not found: 'no-such-program-gpulab'"),
    ("{py} no_such_script.py", "{py} {fix}", "no such Python script: 'no_such_script.py'"),
])
def test_a_command_that_cannot_start_is_said_before_the_other_runs(tmp_path, ref, cand, says):
    """Checked before either side runs: a typo in the candidate does not cost a whole reference run first, and the
    side that can start is not run alone."""
    fix = FIX / "compiled_mlp.py"
    said = []
    c = compare.run(ref.format(py=PY, fix=fix), cand.format(py=PY, fix=fix), tmp_path / "out", log=said.append)
    assert c.status == "failed" and all(r.status == "not_started" for r in c.runs)
    assert c.summary.startswith(f"The {'candidate' if 'no-such-program' in cand else 'reference'} command did not "
                                f"start ({says}"), c.summary
    assert "not run: the other command cannot start" in c.summary and not any("running the" in s for s in said)
    assert not (tmp_path / "out" / "reference" / "output.txt").exists()
