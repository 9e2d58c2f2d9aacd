"""The first NaN/Inf of a real training program, as 02 finds it: the program recorded in stats mode in a child
(gpulab.trace.run.record, 02's rerun), the op, its line, its pass and its cause written beside the op log, and
02's finding and note built from them. The fixtures under tests/fixtures/nan/ are training loops as users
write them; the line is found by the mark the fixture puts on it."""
from __future__ import annotations

import sys
from pathlib import Path

import hotpaths
import pytest

from gpulab import report, trace
from gpulab.trace import analysis, firstnan
from gpulab.trace import run as trace_run

NAN = Path(__file__).parent / "fixtures" / "nan"

pytestmark = pytest.mark.usefixtures("native_hot_path")  # conftest: built once, as launchers do


def line_of(fixture: str, mark: str) -> str:
    """`nan/<fixture>:<line> in main`: the recorded call site of the line that carries `# MARK`."""
    lines = (NAN / fixture).read_text().splitlines()
    n = next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# {mark}"))
    return f"nan/{fixture}:{n} in main"


CASES = [
    # fixture, mark, op, pass, backward, cause kind, words in the cause, words in what to do
    ("div_std.py", "NORMALIZE", "aten.div.Tensor", 5, False, "zero_divisor",
     "the divisor holds zeros (input 1: 1 zero) and the dividend holds zeros too (0/0 gives NaN)",
     "the program's line: fix it there; keep the divisor away from 0"),
    ("log_returns.py", "LOGRET", "aten.log.default", 4, False, "log_domain",
     "log of values <= 0 (input 0: 4 values <= 0", "clamp the log's argument above 0"),
    ("exp_rate.py", "RATE", "aten.exp.default", 3, False, "overflow", "exp of values up to", "overflows float32"),
    ("nan_in_data.py", "LOAD", "aten.lift_fresh.default", 3, False, "input_nan",
     "input 0 already holds NaN (1 value): no earlier op made it: it came in with the data",
     "the data: the batch of pass 3 already holds it"),
    ("sqrt_backward.py", "DIST", "aten.div.Tensor", 4, True, "zero_divisor", "the divisor holds zeros",
     "sqrt has an infinite gradient at 0"),
    # the same gradient times a negative upstream gradient: -Inf, which PowBackward0's mul turns into NaN a node
    # later; the -Inf is the first, not a mask's
    ("pairwise_dist.py", "PAIRWISE", "aten.div.Tensor", 1, True, "zero_divisor", "the divisor holds zeros",
     "sqrt has an infinite gradient at 0"),
    ("matmul_fp16.py", "HIDDEN", "aten.addmm.default", 2, False, "matmul_overflow",
     "addmm in float16 overflows its narrow range (inputs finite", "run that matmul in float32"),
    # an overflow after the values grew step after step: the training diverges, the line only shows it
    ("lr_diverge.py", "LOSS", "aten.mse_loss.default", 21, False, "growth",
     "mse_loss's outputs grew pass after pass, from |x| up to", "lower the learning rate"),
    # the same within one forward pass: a recurrence whose weights grow what they multiply
    ("rnn_explode.py", "RNN", "aten.addmm.default", 52, False, "growth",
     "addmm's outputs grew pass after pass, from |x| up to", "a recurrence"),
    # the -Inf that mul turns into NaN is log's of an underflowed softmax, not a mask's
    ("softmax_log.py", "CE", "aten.mul.Tensor", 3, False, "log_domain",
     "input 1 holds -Inf that log made at {CE} (pass 3) from 9 zero(s)", "log_softmax"),
    # the same -Inf passed on by mean before the minus turns it into +Inf: still the log's
    ("log_mean.py", "NLL", "aten.neg.default", 3, False, "log_domain",
     "input 0 holds -Inf that log made at {NLL} (pass 3) from", "and neg turns it into +Inf"),
    # a group of one sample: the unbiased variance is 0/0
    ("group_var.py", "NORM", "aten.var.correction", 9, False, "variance_dof",
     "var of 1 element per value: with the default correction (Bessel's, dividing by N - 1) that is 0/0",
     "skip groups of fewer than 2 elements, or pass correction=0"),
]


def test_the_next_step_names_the_logs_line_when_a_later_line_turns_its_minus_inf_into_inf(tmp_path):
    """The +Inf is first made by the subtraction on the line after the log: the evidence says so, and the line to
    change (clamp the log's argument) is the log's."""
    rec = trace_run.record([sys.executable, str(NAN / "log_scale.py")], mode="stats", out_dir=tmp_path,
                           name="stats", timeout_s=240, stall_s=60)
    assert rec.ok, rec.stderr_tail
    got = firstnan.read(rec.log)
    log_line, sub_line = line_of("log_scale.py", "LOGSPREAD"), line_of("log_scale.py", "CENTER")
    assert (got["op"], got["call_site"], got["pass"]) == ("aten.sub.Tensor", sub_line, 3), got
    assert got["cause"]["kind"] == "log_domain" and got["cause"]["at"] == log_line, got["cause"]
    assert firstnan.next_step(got).startswith(f"fix the program's line {log_line}: clamp the log's argument")


@pytest.mark.parametrize("fixture,mark,op,n,backward,kind,cause,todo", CASES, ids=[c[0] for c in CASES])
def test_02_names_the_first_nans_op_line_pass_and_cause(tmp_path, fixture, mark, op, n, backward, kind, cause, todo):
    rec = trace_run.record([sys.executable, str(NAN / fixture)], mode="stats", out_dir=tmp_path, name="stats",
                           timeout_s=240, stall_s=60)
    assert rec.ok, rec.stderr_tail
    first = trace.first_nonfinite(rec.snapshot)
    got = firstnan.read(rec.log)
    assert got is not None and first is not None, rec.stderr_tail
    assert (got["op"], got["seq"], first.name) == (op, first.seq, op), got
    assert got["call_site"] == line_of(fixture, mark), got
    assert got["pass"] == n and got["backward"] is backward, got
    assert firstnan.lasted(got), got["finite_after"]   # it spreads to the run's end: a fault
    cause = cause.replace("{" + mark + "}", line_of(fixture, mark))
    assert got["cause"]["kind"] == kind and cause in got["cause"]["words"], got["cause"]
    if backward:
        assert got["forward_op"] == "aten.sqrt.default" and got["backward_node"] == "SqrtBackward0", got
    # 02's finding (headline, metrics) and note say the same, from the same file
    headline, metrics = analysis.finding(rec, rec, None, "cpu", "ops.log", mode="ops")
    where = f"at {line_of(fixture, mark)} (pass {n})"
    assert where in headline and cause in headline and todo in headline, headline
    assert (metrics["first_nonfinite_op"], metrics["first_nonfinite_site"], metrics["first_nonfinite_pass"],
            metrics["first_nonfinite_cause_kind"]) == (op, line_of(fixture, mark), n, kind), metrics
    assert metrics["first_nonfinite_owner"] == "program"
    note = analysis.nonfinite_note(rec)
    assert "**Why:**" in note and report.esc(where) in note, note


def test_the_overflows_a_gradscaler_catches_are_no_fault_and_a_nan_it_does_not_catch_is_named(tmp_path):
    # float16 AMP as PyTorch's recipe writes it: the scaled gradients overflow (the scaler skips those steps and
    # halves its scale), clip_grad_norm_ reads the Inf gradients after unscale_; neither is the program's fault
    rec = trace_run.record([sys.executable, str(NAN / "amp_scaler.py")], mode="stats", out_dir=tmp_path / "ok",
                           name="stats", timeout_s=240, stall_s=60)
    assert rec.ok, rec.stderr_tail
    got = firstnan.read(rec.log)
    assert firstnan.caught(got) and got["caught"] >= 3 and got["backward"], got
    assert got["first_caught"]["pass"] == 1 and firstnan.next_step(got) == ""
    headline, metrics = analysis.finding(rec, rec, None, "cpu", "ops.log", mode="ops")
    assert "no NaN/Inf that the GradScaler did not catch" in headline and "not a fault" in headline, headline
    assert metrics["first_nonfinite_op"] is None and metrics["first_nonfinite_caught_by"] == "GradScaler", metrics
    assert "**No NaN/Inf that the GradScaler did not catch**" in analysis.nonfinite_note(rec)
    # a log of a zero in forward, at step 6: no scaler catches it, and the overflows it caught before are said
    bug = trace_run.record([sys.executable, str(NAN / "amp_scaler.py"), "--bug"], mode="stats",
                           out_dir=tmp_path / "bug", name="stats", timeout_s=240, stall_s=60)
    got = firstnan.read(bug.log)
    assert not firstnan.caught(got) and got["cause"]["kind"] == "log_domain", got
    assert f"log made at {line_of('amp_scaler.py', 'LOG')} (pass 6)" in got["cause"]["words"], got["cause"]
    assert "(before it, the GradScaler caught" in firstnan.sentence(got)
    assert firstnan.next_step(got).startswith(f"fix the program's line {line_of('amp_scaler.py', 'LOG')}")


@pytest.mark.parametrize("case,mark,op,kind,alloc", [
    ("accum", "ACCUM", "aten.add_.Tensor", "uninitialized", "ALLOC"),
    ("read", "READ", "aten.mul.Tensor", "uninitialized", "BUF"),
    ("view", "DIV", "aten.div.Tensor", "zero_divisor", None),
])
def test_an_empty_buffers_old_bytes_are_the_allocations_line_or_no_fault(tmp_path, case, mark, op, kind, alloc):
    """NaN bytes in memory an empty() allocated: read before written, the line to change is the allocation (not
    "it came in with the data"); written through views first (DDP's buckets), the views of it are no first NaN."""
    rec = trace_run.record([sys.executable, str(NAN / "empty_buffer.py"), case], mode="stats", out_dir=tmp_path,
                           name="stats", timeout_s=240, stall_s=60)
    assert rec.ok, rec.stderr_tail
    got = firstnan.read(rec.log)
    assert got is not None, rec.stderr_tail
    assert (got["op"], got["call_site"], got["pass"], got["cause"]["kind"]) == (op, line_of("empty_buffer.py", mark),
                                                                                  1 if kind != "zero_divisor" else 3,
                                                                                  kind), got
    if alloc:
        alloc = line_of("empty_buffer.py", alloc)
        assert got["cause"]["at"] == alloc and f"empty allocated at {alloc} (pass 1)" in got["cause"]["words"], got
        assert firstnan.next_step(got).startswith(f"fix the program's line {alloc}: if nothing should have written "
                                                  f"it yet, allocate with torch.zeros"), firstnan.next_step(got)


def test_an_empty_buffer_a_collective_filled_is_not_called_uninitialized(tmp_path):
    """c10d's ops write into their tensors with no mark of it in their schema (broadcast into an empty buffer, as
    FSDP all-gathers into one): what such a buffer holds then came from another rank, not from old bytes."""
    import numpy as np
    import torch
    import torch.distributed as dist

    log = tmp_path / "stats.log"
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with trace.Recorder(log, "stats", capacity=4096) as rec:
            buf = torch.empty(8)
            buf.numpy()[:] = np.nan   # as the rank that broadcasts would have sent (no op here made it)
            dist.broadcast(buf, 0)
            (buf * 2).sum()
        rec.close()
    finally:
        dist.destroy_process_group()
    got = firstnan.read(log)
    assert got is not None and got["op"] == "aten.mul.Tensor", got
    assert got["cause"]["kind"] == "input_nan" and "came in with the data" in got["cause"]["words"], got["cause"]


def test_nan_that_the_program_cleans_and_never_spreads_is_said_not_to_last_and_asks_for_no_change(tmp_path):
    """Missing values as NaN, turned into values and a mask before the model: the NaN made in every batch is
    named, with words that it did not last (the run's last ops are finite), and no next step."""
    rec = trace_run.record([sys.executable, str(NAN / "missing_values.py")], mode="stats", out_dir=tmp_path,
                           name="stats", timeout_s=240, stall_s=60)
    assert rec.ok, rec.stderr_tail
    got = firstnan.read(rec.log)
    assert got["call_site"] == line_of("missing_values.py", "MISSING").replace("main", "batch"), got
    assert got["finite_after"] >= firstnan.LASTED_OPS and not firstnan.lasted(got), got["finite_after"]
    assert got["weights_finite"] and "weights_nan" not in got, got   # every optimizer update after it finite
    said = firstnan.sentence(got)
    assert "it did not last: the run's last" in said and "every update of the weights after it was finite" in said
    assert firstnan.next_step(got) == ""
    _, metrics = analysis.finding(rec, rec, None, "cpu", "ops.log", mode="ops")
    assert metrics["first_nonfinite_lasted"] is False and metrics["first_nonfinite_next"] == "", metrics


@pytest.mark.parametrize("case,op,kind,node,safe", [
    ("div", "aten.div.Tensor", "zero_divisor", "DivBackward0", "divide by torch.where(mask, divisor, 1)"),
    ("sqrt", "aten.sqrt.default", "sqrt_domain", "SqrtBackward0", "take the sqrt of torch.where(mask, x, 1)"),
])
def test_a_where_that_selects_a_nan_away_names_the_where_gradient_trap(tmp_path, case, op, kind, node, safe):
    """torch.where(mask, a / b, 0): the division's Inf is selected away in forward, and its gradient is still
    0 * Inf = NaN. The record names the where that hid it, and the fix is a safe input, not 'skip those rows'
    (the program already does)."""
    rec = trace_run.record([sys.executable, str(NAN / "where_grad.py"), case], mode="stats", out_dir=tmp_path,
                           name="stats", timeout_s=240, stall_s=60)
    assert rec.ok, rec.stderr_tail
    got = firstnan.read(rec.log)
    line = line_of("where_grad.py", case.upper())
    assert (got["op"], got["call_site"], got["pass"], got["cause"]["kind"]) == (op, line, 1, kind), got
    assert got["selected_by"] == {"op": "aten.where.self", "call_site": line, "pass": 1, "backward_nan": node}, got
    step = firstnan.next_step(got)
    assert "the where-gradient trap" in step and safe in step and "skip the rows" not in step, step
    assert got["weights_nan"]["op"] == "aten.add_.Tensor" and firstnan.lasted(got), got   # SGD wrote it


def test_a_where_without_autograd_is_no_trap(tmp_path):
    """The same division under torch.no_grad: nothing flows back through it, so no where is named."""
    rec = trace_run.record([sys.executable, str(NAN / "where_grad.py"), "nograd"], mode="stats", out_dir=tmp_path,
                           name="stats", timeout_s=240, stall_s=60)
    got = firstnan.read(rec.log)
    assert got["op"] == "aten.div.Tensor" and "selected_by" not in got, got
    assert "the where-gradient trap" not in firstnan.sentence(got)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_batch_whose_every_target_is_ignored_is_named_as_a_mean_over_no_target(tmp_path, device):
    """cross_entropy with ignore_index over a batch of prompts only: nll_loss's 0/0 named with its target (not 'no
    known way'), and the NaN said not to last because its gradient is 0, not because the program cleaned it."""
    rec = trace_run.record([sys.executable, str(NAN / "no_targets.py"), device], mode="stats", out_dir=tmp_path,
                           name="stats", timeout_s=240, stall_s=60)
    assert rec.ok, rec.stderr_tail
    got = firstnan.read(rec.log)
    assert (got["op"], got["call_site"], got["pass"], got["cause"]["kind"]) == (
        "aten.nll_loss_forward.default", line_of("no_targets.py", "LOSS"), 4, "no_targets"), got
    said = firstnan.sentence(got)
    assert "every target is ignore_index (-100; input 1: 64 targets, all -100)" in said, said
    assert "skip a batch with no target to learn" in said and "a gradient of 0" in said, said
    assert not firstnan.lasted(got) and firstnan.next_step(got) == ""


def test_a_run_resumed_from_a_checkpoint_that_holds_nan_names_the_checkpoint_not_its_data_or_code(tmp_path):
    """The first run diverged and saved NaN weights; the resumed run's first NaN is made by no op of its own: it
    is the checkpoint's, read by torch.load at the program's line (not "the batch of pass 1", not a line to fix)."""
    import subprocess

    ckpt = tmp_path / "run1.pt"
    subprocess.run([sys.executable, str(NAN / "resume_nan.py"), "--save", str(ckpt)], check=True, timeout=120,
                   capture_output=True)
    rec = trace_run.record([sys.executable, str(NAN / "resume_nan.py"), "--resume", str(ckpt)], mode="stats",
                           out_dir=tmp_path / "o", name="stats", timeout_s=240, stall_s=60)
    assert rec.ok, rec.stderr_tail
    got = firstnan.read(rec.log)
    load = line_of("resume_nan.py", "LOAD")
    assert (got["call_site"], got["pass"], got["loaded_by"], got["cause"]["kind"]) == (load, 1, "torch.load",
                                                                                       "input_nan"), got
    assert "what torch.load read from a file, which already holds NaN" in got["cause"]["words"], got["cause"]
    assert firstnan.next_step(got).startswith(f"the checkpoint that torch.load reads at {load} already holds NaN: "
                                              f"resume from an earlier checkpoint"), firstnan.next_step(got)
    assert "the checkpoint, not this run's code" in firstnan.sentence(got), firstnan.sentence(got)


@pytest.mark.parametrize("path", ["native", "python"])
def test_both_dispatch_hot_paths_keep_the_line_and_pass(tmp_path, path):
    """In process, on the C and the Python hot path alike: the divisor with zeros in the third call."""
    import torch

    log = tmp_path / "stats.log"

    def step(x: torch.Tensor) -> torch.Tensor:
        return x / x.std(1, keepdim=True)   # the line

    with trace.Recorder(log, "stats", capacity=4096, **hotpaths.kw(path)) as rec:
        for i in range(4):
            x = torch.randn(4, 3)
            if i == 2:
                x[1] = 7.0
            step(x)
    rec.close()
    got = firstnan.read(log)
    assert got is not None and got["op"] == "aten.div.Tensor", got
    here = step.__code__
    assert got["call_site"] == f"tests/test_nan_cause_recorded.py:{here.co_firstlineno + 1} in step", got
    assert got["pass"] == 3 and got["cause"]["kind"] == "zero_divisor", got
    assert got["file"] == here.co_filename


@pytest.mark.gpu
def test_fp16_matmul_overflow_on_the_gpu(tmp_path):
    """The same half-precision MLP on CUDA: the first Inf is the GPU addmm, named with its line and cause."""
    rec = trace_run.record([sys.executable, str(NAN / "matmul_fp16.py"), "cuda"], mode="stats", out_dir=tmp_path,
                           name="stats", timeout_s=240, stall_s=60)
    assert rec.ok, rec.stderr_tail
    got = firstnan.read(rec.log)
    assert got is not None, rec.stderr_tail
    assert got["op"] in ("aten.addmm.default", "aten.mm.default"), got
    assert got["call_site"] == line_of("matmul_fp16.py", "HIDDEN") and got["pass"] == 2, got
    assert got["cause"]["kind"] == "matmul_overflow" and "float16" in got["cause"]["words"], got


@pytest.mark.gpu
def test_a_log_made_minus_inf_on_the_gpu_is_named_as_the_logs(tmp_path):
    """The hand-written cross entropy on CUDA: stats mode remembers the GPU log whose output holds -Inf (its
    figures are read without a sync per op), so the NaN it turns into is put down to that log, not a mask."""
    rec = trace_run.record([sys.executable, str(NAN / "softmax_log.py"), "cuda"], mode="stats", out_dir=tmp_path,
                           name="stats", timeout_s=240, stall_s=60)
    assert rec.ok, rec.stderr_tail
    got = firstnan.read(rec.log)
    assert got is not None, rec.stderr_tail
    assert got["op"] == "aten.mul.Tensor" and got["call_site"] == line_of("softmax_log.py", "CE"), got
    assert got["pass"] == 3 and got["cause"]["kind"] == "log_domain", got
    assert f"-Inf that log made at {line_of('softmax_log.py', 'CE')} (pass 3)" in got["cause"]["words"], got


@pytest.mark.gpu
def test_a_diverging_training_on_the_gpu_is_named_as_values_that_grew_not_the_overflowing_line(tmp_path):
    """The learning rate too high, on CUDA: the overflow at mse_loss is put down to its outputs' growth pass after
    pass, and the next step is the training's, not the line's."""
    rec = trace_run.record([sys.executable, str(NAN / "lr_diverge.py"), "cuda"], mode="stats", out_dir=tmp_path,
                           name="stats", timeout_s=240, stall_s=60)
    assert rec.ok, rec.stderr_tail
    got = firstnan.read(rec.log)
    assert got is not None and got["op"] == "aten.mse_loss.default", got
    assert got["call_site"] == line_of("lr_diverge.py", "LOSS") and got["cause"]["kind"] == "growth", got
    assert got["history"]["first_pass"] == 1 and got["history"]["last_pass"] == got["pass"] - 1, got
    assert "lower the learning rate" in firstnan.next_step(got), firstnan.next_step(got)


def test_02_shows_the_dataloader_worker_whose_op_made_the_nan_not_the_main_process_it_reached(tmp_path):
    """The Dataset's standardization makes NaN inside a DataLoader worker; the main process only unpickles the
    batch. 02's stats recording shows the worker's ops and its first NaN (the line in __getitem__), never the main
    process's unpickling (which had read as "python's code at multiprocessing/queues.py ... report it to python")."""
    rec = trace_run.record([sys.executable, str(NAN / "worker_std.py")], mode="stats", out_dir=tmp_path, name="stats",
                           timeout_s=240, stall_s=60)
    assert rec.ok, rec.stderr_tail
    got = firstnan.read(rec.log)
    assert got is not None and got["op"] == "aten.div.Tensor", got
    assert got["call_site"] == line_of("worker_std.py", "STANDARDIZE").replace("in main", "in __getitem__"), got
    assert "DataLoader worker 0" in rec.shown, rec.shown
    headline, metrics = analysis.finding(rec, rec, None, "cpu", "ops.log", mode="ops")
    assert metrics["first_nonfinite_owner"] == "program" and "__getitem__" in headline, headline
