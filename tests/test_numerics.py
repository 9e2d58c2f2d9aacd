"""gpulab.numerics' pure parts on hand-built records: tolerances by dtype, two fingerprints compared, the
alignment, and the verdict naming the op that INTRODUCES a difference (not the first that shows it); plus
the recorder itself in this process (fingerprints with their producers), and `gpulab compare`'s bad options."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab.numerics import align, figures, judge, reduction, tolerance
from gpulab.numerics.commands import commands_of, parse_vary
from gpulab.args import BadInput


def rec(i, op, site="t.py:1 in f", npass=1, ins=(), value=1.0, n=4, dtype="float32", bwd=False, shape=None,
        nan=0, inf=0, out=0, k=1):
    sample = [value * (k + 1) for k in range(n)]
    return {"i": i, "op": op, "site": site, "pass": npass, "bwd": bwd, "out": out, "in": list(ins), "k": k,
            "dtype": dtype,
            "shape": shape or [n], "n": n, "device": "cpu", "sum": sum(sample), "asum": sum(abs(s) for s in sample),
            "amax": max(abs(s) for s in sample), "sample": sample, "ck": hash((value, dtype)) % 1000, "nan": nan,
            "inf": inf}


@pytest.mark.parametrize("dtypes, rtol, atol", [(("float32",), 1.3e-6, 1e-5), (("bfloat16",), 1.6e-2, 1e-5),
                                               (("float16",), 1e-3, 1e-5), (("float64",), 1e-7, 1e-7),
                                               (("float32", "bfloat16"), 1.6e-2, 1e-5)])
def test_tolerance_follows_assert_close_and_the_looser_dtype(dtypes, rtol, atol):
    t = tolerance.for_dtypes(*dtypes)
    assert (t.rtol, t.atol) == (rtol, atol)
    assert tolerance.for_dtypes("float32", rtol=0.1).rtol == 0.1
    with pytest.raises(ValueError, match="--rtol -1 is not valid"):
        tolerance.check(-1, None)


def test_figures_tell_bitwise_from_close_from_different():
    tol = tolerance.for_dtypes("float32")
    a = rec(0, "aten.mul.Tensor", value=1.0)
    assert figures.compare(a, dict(a), tol).bitwise
    close = rec(0, "aten.mul.Tensor", value=1.0 + 1e-7)
    f = figures.compare(a, close, tol)
    assert not f.bitwise and f.within, f
    far = rec(0, "aten.mul.Tensor", value=1.15)
    f = figures.compare(a, far, tol)
    assert not f.within and f.max_rel_err == pytest.approx(0.15, rel=1e-6) and f.excess > 1000
    assert not figures.compare(a, rec(0, "aten.mul.Tensor", nan=1), tol).within
    assert not figures.compare(a, rec(0, "aten.mul.Tensor", shape=[2, 2]), tol).comparable


def test_the_verdict_names_the_op_that_introduces_the_difference_not_the_first_that_shows_it():
    ref = [rec(0, "aten.randn.default", value=1.0), rec(1, "aten.mm.default", ins=[0], value=2.0),
           rec(2, "numfix.fused_silu.default", site="t.py:9 in forward", ins=[1], value=3.0),
           rec(3, "aten.add.Tensor", ins=[2], value=4.0), rec(4, "aten.sum.default", ins=[3], value=5.0)]
    cand = [dict(r) for r in ref]
    cand[2] = rec(2, "numfix.fused_silu.default", site="t.py:9 in forward", ins=[1], value=3.45)
    cand[3] = rec(3, "aten.add.Tensor", ins=[2], value=4.6)
    cand[4] = rec(4, "aten.sum.default", ins=[3], value=50.0)
    j = judge.judge(ref, cand)
    assert j.status == "diverged", j.sentence
    fd = j.first_divergence
    assert (fd["op"], fd["call_site"], fd["pass"]) == ("numfix.fused_silu.default", "t.py:9 in forward", 1)
    assert fd["inputs"][0]["within_tolerance"] and not fd["error"]["within_tolerance"]
    assert "grows" in fd["then"] and fd["trend"] == "grows", fd["then"]
    assert j.keep == ("numfix.fused_silu.default|t.py:9 in forward|1|0",) * 2


def _small_grads(grad_rel: float) -> tuple[list[dict], list[dict]]:
    """A weight, its gradient (values of 1e-6) off by grad_rel in the candidate, an optimizer's sqrt of it (1e-3)."""
    ref = [rec(0, "aten.randn.default", value=1.0),
           rec(1, "aten.mm.default", site="t.py:5 in step", ins=[0], value=1e-6, bwd=True),
           rec(2, "aten.sqrt.default", site="t.py:9 in step", ins=[1], value=1e-3)]
    cand = [dict(ref[0]), rec(1, "aten.mm.default", site="t.py:5 in step", ins=[0], value=1e-6 * (1 + grad_rel),
                              bwd=True),
            rec(2, "aten.sqrt.default", site="t.py:9 in step", ins=[1], value=1e-3 * (1 + grad_rel) ** 0.5)]
    return ref, cand


def test_an_op_wrong_on_values_smaller_than_atol_is_named_not_the_op_after_it_that_shows_it():
    # the gradient's difference (30%, 3e-7 at most) is within assert_close's atol of 1e-5; the sqrt after it is
    # beyond it, but its input does not agree at its own scale: the gradient's op made the difference
    j = judge.judge(*_small_grads(0.3))
    assert j.status == "diverged", j.sentence
    fd = j.first_divergence
    assert (fd["op"], fd["call_site"], fd["backward"]) == ("aten.mm.default", "t.py:5 in step", True), j.sentence
    assert fd["error"]["tolerance"]["atol_scaled_to"] == pytest.approx(2.5e-6)
    assert "its atol scaled to the values' mean magnitude 2.5e-06" in j.sentence, j.sentence


def test_rounding_on_small_values_is_not_named_and_what_agrees_still_agrees():
    j = judge.judge(*_small_grads(1e-6))          # float32 rounding of small values: within at any scale
    assert j.status == "agree", j.sentence
    ref, cand = _small_grads(0.3)
    cand[2] = dict(ref[2])                        # nothing beyond assert_close's tolerance: the runs agree by it
    assert judge.judge(ref, cand).status == "agree"


@pytest.mark.parametrize("factor,scaled", [(2.0 ** 24, True), (1000.0, False), (4.0, False)])
def test_a_loss_scalers_multiply_only_one_run_makes_is_said_to_be_one(factor, scaled):
    """float32 against float16 AMP: the AMP run's backward starts from the loss scale (GradScaler's 2^16 and up),
    where the float32 run's starts from ones."""
    site = "train.py:30 in main"
    ref = [rec(0, "aten.randn.default", value=1.0), rec(1, "aten.mm.default", ins=[0], value=2.0),
           rec(2, "aten.ones_like.default", site=site, ins=[1], value=1.0, bwd=True),
           rec(3, "aten.nll_loss_backward.default", site=site, ins=[2], value=0.5, bwd=True)]
    cand = [dict(ref[0]), dict(ref[1]), dict(ref[2]),
            rec(3, "aten.mul.Tensor", site=site, ins=[2], value=factor, bwd=True),
            rec(4, "aten.nll_loss_backward.default", site=site, ins=[3], value=0.5 * factor, bwd=True)]
    j = judge.judge(ref, cand)
    fd = j.first_divergence
    assert j.status == "diverged" and fd["op"] == "aten.mul.Tensor" and fd["run"] == "candidate", j.sentence
    assert ("loss_scale" in fd) is scaled and ("a loss scale" in j.sentence) is scaled, j.sentence
    if scaled:
        assert fd["loss_scale"] == 2.0 ** 24 and "times 2^24 exactly" in j.sentence
        assert "GradScaler(init_scale=1.0, growth_interval=10**9)" in j.sentence


def _attention(rel: float, k: int) -> tuple[list[dict], list[dict]]:
    """q, k (max-abs 3), their scores (a k-term bmm) off by rel in the candidate, the softmax that passes it on, and
    an output that agrees again."""
    ref = [rec(0, "aten.randn.default", value=0.75), rec(1, "aten.randn.default", site="t.py:2 in f", value=0.75),
           rec(2, "aten.bmm.default", site="t.py:3 in f", ins=[0, 1], value=2.3, k=k),
           rec(3, "aten._softmax.default", site="t.py:4 in f", ins=[2], value=0.2, k=16),
           rec(4, "aten.add.Tensor", site="t.py:5 in f", ins=[3], value=1.0)]
    cand = [dict(r) for r in ref]
    cand[2] = rec(2, "aten.bmm.default", site="t.py:3 in f", ins=[0, 1], value=2.3 * (1 + rel), k=k)
    cand[3] = rec(3, "aten._softmax.default", site="t.py:4 in f", ins=[2], value=0.2 * (1 + rel), k=16)
    return ref, cand


def test_a_reductions_rounding_within_its_allowance_is_not_a_divergence_and_what_it_passes_on_is_not_either():
    j = judge.judge(*_attention(4e-5, 32))     # 17x assert_close's tolerance, 0.4x a 32-term dot product's allowance
    assert j.status == "agree", j.sentence
    assert "largest rounding difference is at aten.bmm.default at t.py:3" in j.sentence, j.sentence
    assert j.rounding["excess"] > 10 and "32-term reduction" in j.rounding["why"]
    # the same difference from an elementwise op (K = 1) is held to assert_close's tolerance
    j = judge.judge(*_attention(4e-5, 1))
    assert j.status == "diverged" and j.first_divergence["op"] == "aten.bmm.default", j.sentence
    # and a matmul wrong by 1e-3 is beyond its allowance
    j = judge.judge(*_attention(1e-3, 32))
    assert j.status == "diverged" and j.first_divergence["op"] == "aten.bmm.default", j.sentence
    assert j.first_divergence["error"]["reduction_allowance"] > 0


def test_an_op_a_replay_found_right_on_both_sides_is_judged_past_and_rounding_that_grows_is_said():
    ref, cand = _attention(4e-5, 1)
    j = judge.judge(ref, cand)
    assert j.status == "diverged" and j.keep
    j = judge.judge(ref, cand, rounding=(j.keep[0],))
    assert j.status == "agree" and "replayed against float64" in j.sentence, j.sentence
    cand[4] = rec(4, "aten.add.Tensor", site="t.py:5 in f", ins=[3], value=1.01)   # it does not fade
    j = judge.judge(ref, cand, rounding=("aten.bmm.default|t.py:3 in f|1|0",))
    assert j.status == "diverged" and "rounding grows past the tolerance" in j.sentence, j.sentence
    assert j.first_divergence["op"] == "aten.bmm.default" and j.keep is None


@pytest.mark.parametrize("name, shapes, ints, out, k", [
    ("mm", [(8, 32), (32, 4)], [], (8, 4), 32), ("bmm", [(2, 8, 32), (2, 32, 4)], [], (2, 8, 4), 32),
    ("addmm", [(4,), (8, 32), (32, 4)], [], (8, 4), 32), ("linear", [(2, 8, 32), (4, 32)], [], (2, 8, 4), 32),
    ("_softmax", [(4, 16, 16)], [-1, False], (4, 16, 16), 16), ("native_layer_norm", [(4, 16, 32), (32,)], [[32]],
                                                                 (4, 16, 32), 32),
    ("sum", [(4, 16, 32)], [[1, 2]], (4,), 512), ("convolution", [(2, 3, 8, 8), (6, 3, 3, 3)], [], (2, 6, 6, 6), 27),
    ("mul", [(4, 4), (4, 4)], [], (4, 4), 1),
    ("_scaled_dot_product_flash_attention_for_cpu", [(1, 2, 16, 8), (1, 2, 16, 8), (1, 2, 16, 8)], [], (1, 2, 16, 8),
     24)])
def test_the_reduction_length_of_an_op_comes_from_its_shapes_and_arguments(name, shapes, ints, out, k):
    assert reduction.length(name, shapes, ints, out) == k
    got = reduction.allowance(f"aten.{name}.default", k, "float32", 1.3e-6, [3.0, 3.0], 5.0)
    assert (got > 0) == (k > 1)
    if name == "mm":   # K * max|a| * max|b| * (2 rtol + sqrt(K) eps)
        assert got == pytest.approx(32 * 9.0 * (2 * 1.3e-6 + 32 ** 0.5 * 2.0 ** -23))


def test_ops_only_one_side_runs_leave_gaps_and_the_runs_still_agree():
    ref = [rec(0, "aten.randn.default"), rec(1, "aten.mm.default", ins=[0], value=2.0),
           rec(2, "aten.relu.default", ins=[1], value=2.0)]
    cand = [rec(0, "aten.randn.default"), rec(1, "aten.addmm.default", ins=[0], value=2.0),   # another decomposition
            rec(2, "aten.mm.default", ins=[0], value=2.0), rec(3, "aten.relu.default", ins=[2], value=2.0)]
    j = judge.judge(ref, cand)
    assert j.status == "agree" and j.aligned == 3, j.sentence
    assert "1 op(s) run on one side only" in j.sentence and "bitwise equal" in j.sentence


def test_a_rerun_names_the_first_op_that_differs_bitwise_even_within_tolerance():
    ref = [rec(0, "aten.randn.default"), rec(1, "aten.index_add.default", ins=[0], value=2.0)]
    cand = [rec(0, "aten.randn.default"), rec(1, "aten.index_add.default", ins=[0], value=2.0 + 1e-9)]
    j = judge.judge(ref, cand, same_command=True)
    assert j.status == "agree"
    assert j.first_bitwise["op"] == "aten.index_add.default"
    assert "not deterministic" in j.sentence and "aten.index_add.default" in j.sentence


def _resumed_rerun():
    """A training loop of two steps; on its rerun it loads what the first run saved and runs one step only."""
    step = lambda i, npass, v: [rec(i, "aten.embedding.default", site="t.py:9 in forward", npass=npass, value=v),  # noqa: E731
                                rec(i + 1, "aten.mm.default", site="t.py:10 in forward", npass=npass, ins=[i],
                                    value=v)]
    ref = [rec(0, "aten.randn.default"), *step(1, 1, 1.0), *step(3, 2, 2.0)]
    cand = [rec(0, "aten.randn.default"), rec(1, "aten.set_.source_Storage", site="t.py:4 in main"),
            *step(2, 1, 2.0)]   # its first step starts from the saved state: the reference's second step's numbers
    return ref, cand


def test_a_rerun_that_takes_another_path_before_any_number_differs_is_not_compared():
    ref, cand = _resumed_rerun()
    j = judge.judge(ref, cand, same_command=True)
    assert j.status == "unaligned", j.sentence
    assert j.parted["candidate"]["op"] == "aten.set_.source_Storage" and j.parted["candidate"]["call_site"] == "t.py:4 in main"
    assert "do not run the same ops (5 against 4)" in j.sentence and "checkpoint" in j.sentence
    # two different commands may run other ops (a cast, another decomposition): those still compare
    assert judge.judge(ref, cand).status != "unaligned"


def test_a_difference_that_comes_in_through_a_collective_is_another_ranks():
    ref = [rec(0, "aten.randn.default"), rec(1, "c10d.allreduce_.default", site="t.py:9 in main", value=2.0),
           rec(2, "aten.mul.Tensor", site="t.py:10 in main", ins=[1], value=2.0),
           rec(3, "aten.add.Tensor", site="t.py:11 in main", ins=[], value=1.0)]
    cand = [rec(0, "aten.randn.default"), rec(1, "c10d.allreduce_.default", site="t.py:9 in main", value=3.0),
            rec(2, "aten.mul.Tensor", site="t.py:10 in main", ins=[1], value=3.0),
            rec(3, "aten.add.Tensor", site="t.py:11 in main", ins=[], value=5.0)]   # a later op of its own
    j = judge.judge(ref, cand)
    assert j.status == "diverged" and j.first_divergence["from_other_rank"], j.sentence
    assert j.first_divergence["op"] == "c10d.allreduce_.default" and "another rank's data" in j.sentence
    assert j.keep is None   # never replayed alone


def test_a_rerun_whose_paths_part_after_a_nondeterministic_op_keeps_that_ops_verdict():
    ref = [rec(0, "aten.randn.default"), rec(1, "aten.index_add.default", ins=[0], value=2.0),
           rec(2, "aten.relu.default", site="t.py:7 in f", ins=[1], value=2.0)]
    cand = [rec(0, "aten.randn.default"), rec(1, "aten.index_add.default", ins=[0], value=2.0 + 1e-9),
            rec(2, "aten.abs.default", site="t.py:8 in f", ins=[1], value=2.0)]   # a branch on that value
    j = judge.judge(ref, cand, same_command=True)
    assert j.status != "unaligned" and j.first_bitwise["op"] == "aten.index_add.default", j.sentence


def test_what_the_reference_wrote_in_the_working_folder_is_found_and_said(tmp_path):
    from gpulab.numerics import workdir
    (tmp_path / "data.txt").write_text("x")
    (tmp_path / "out").mkdir()
    before = workdir.snapshot(tmp_path, skip=(tmp_path / "out",))
    (tmp_path / "ckpt.pt").write_bytes(b"1")
    (tmp_path / "out" / "record.jsonl").write_text("{}")   # the comparison's own folder is not the program's doing
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "m.pyc").write_bytes(b"")
    with open(tmp_path / "gpulab.log", "w") as mine:   # this process's own output, redirected there
        mine.write("[gpulab compare] running")
        mine.flush()
        after = workdir.snapshot(tmp_path, skip=(tmp_path / "out",))
        assert workdir.written(before, after, root=tmp_path) == ["ckpt.pt"]
    assert "ckpt.pt appeared or changed in the working folder" in workdir.words(["ckpt.pt"])
    assert workdir.words([]) == "" and workdir.written(None, after) == []
    many = {f"f{i}": (i, 1) for i in range(9)}
    assert "f0, f1, f2, f3, f4 and 4 more" in workdir.words(sorted(many))


def test_a_difference_made_where_the_recorder_sees_no_op_is_named_as_that_region():
    ref = [rec(0, "aten.randn.default"), rec(1, "aten.gelu.default", site="m.py:5 in forward", ins=[0], value=2.0),
           rec(2, "aten.mse_loss.default", site="t.py:20 in main", ins=[1], value=3.0)]
    cand = [rec(0, "aten.randn.default"), rec(1, "<input>", site="t.py:20 in main", value=2.5),
            rec(2, "aten.mse_loss.default", site="t.py:20 in main", ins=[1], value=3.6)]
    j = judge.judge(ref, cand)
    assert j.status == "diverged"
    fd = j.first_divergence
    assert fd["op"] in ("<input>", "aten.gelu.default") and fd["seen_first_at"]["op"] == "aten.mse_loss.default"


@pytest.mark.parametrize("side", ["candidate", "reference"])
def test_an_op_only_one_side_runs_on_the_values_the_other_reads_unchanged_made_the_difference(side):
    """A batch scaled on one side only (x = x * 1000 under a flag): the other side reads the loaded batch where
    its first op does (an `<input>` record there); the scaling op was fed those same values, so it is named, at
    its own line, not an unseen region at the next line."""
    plain = [rec(0, "aten.randn.default", site="t.py:10 in main"),
             rec(1, "<input>", site="t.py:30 in main", value=2.0),
             rec(2, "aten.addmm.default", site="t.py:30 in main", ins=[0, 1], value=3.0),
             rec(3, "aten.mse_loss.default", site="t.py:31 in main", ins=[2], value=4.0)]
    scaled = [rec(0, "aten.randn.default", site="t.py:10 in main"),
              rec(1, "<input>", site="t.py:29 in main", value=2.0),
              rec(2, "aten.mul.Tensor", site="t.py:29 in main", ins=[1], value=2000.0),
              rec(3, "aten.addmm.default", site="t.py:30 in main", ins=[0, 2], value=3000.0),
              rec(4, "aten.mse_loss.default", site="t.py:31 in main", ins=[3], value=4000.0)]
    j = judge.judge(plain, scaled) if side == "candidate" else judge.judge(scaled, plain)
    fd = j.first_divergence
    assert (j.status, fd["op"], fd["call_site"], fd["run"]) == ("diverged", "aten.mul.Tensor", "t.py:29 in main", side)
    assert f"an op only the {side} runs" in j.sentence and "input agrees" in j.sentence, j.sentence
    assert "another backend's kernel" not in j.sentence, j.sentence   # what the other run reads is no pair
    assert fd["seen_first_at"]["op"] == "aten.addmm.default"


def test_different_programs_cannot_be_aligned_and_the_verdict_says_where_they_part():
    ref = [rec(i, "aten.mm.default", site=f"a.py:{i} in f") for i in range(6)]
    cand = [rec(i, "aten.conv2d.default", site=f"b.py:{i} in g") for i in range(6)]
    j = judge.judge(ref, cand)
    assert j.status == "unaligned"
    assert "cannot be aligned" in j.sentence and "aten.mm.default" in j.sentence and "aten.conv2d.default" in j.sentence


def test_alignment_falls_back_to_the_op_sequence_when_no_call_site_matches():
    ref = [rec(i, f"aten.op{i}.default", site=f"a.py:{i} in f") for i in range(5)]
    cand = [rec(i, f"aten.op{i}.default", site=f"copy_of_a.py:{i} in f") for i in range(5)]
    al = align.align(ref, cand)
    assert al.by == "op sequence" and len(al.pairs) == 5


def test_the_recorder_fingerprints_outputs_with_their_producers(tmp_path):
    torch = pytest.importorskip("torch")
    from gpulab.numerics import lines, record

    fp = record.Fingerprints(str(tmp_path / "r.jsonl"))
    with record.make_mode(fp)():
        x = torch.randn(8, 16)
        y = x.t().contiguous() * 2           # a view and a copy: no records of their own
        z = y.to(torch.bfloat16).sum()
        y.add_(1)                            # in place: reads y as record 1 made it
        v = y * 3                            # reads y as the add_ made it
        w = torch.tensor([1.0, float("nan"), float("inf")]) + 1
    fp.close()
    rows = [lines.decode(json.loads(line)) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    ops = [r["op"] for r in rows]
    assert ops[:5] == ["aten.randn.default", "aten.mul.Tensor", "aten.sum.default", "aten.add_.Tensor",
                       "aten.mul.Tensor"], ops
    assert rows[1]["in"] == [0] and rows[2]["in"] == [1]                      # producers through view, copy and cast
    assert rows[3]["in"] == [1] and rows[4]["in"] == [3] and v is not None
    assert rows[0]["sum"] == pytest.approx(float(x.double().sum()))
    assert rows[0]["amax"] == pytest.approx(float(x.abs().max()))
    assert rows[0]["sample"] == [float(v) for v in x.flatten()[::4]]      # the strided sample, exactly
    assert rows[2]["dtype"] == "bfloat16" and rows[0]["site"].endswith("in test_the_recorder_fingerprints_outputs_with_their_producers")
    last = rows[-1]
    assert (last["nan"], last["inf"]) == (1, 1) and z is not None and w is not None


def test_vary_and_two_command_forms_are_parsed_and_bad_input_is_named():
    assert parse_vary("impl=good,bad") == ("impl", "good", "bad")
    ref, cand, re, ce = commands_of([], ["python", "t.py", "--impl", "{impl}"], ["impl=good,bad"])
    assert ref[-1] == "good" and cand[-1] == "bad" and re == ce == {}
    ref, cand, re, ce = commands_of([], ["python", "t.py"], ["env.FLAG=0,1"])
    assert re == {"FLAG": "0"} and ce == {"FLAG": "1"}
    for pos, cmd, vary, msg in [(["python a.py"], None, [], "give two commands"),
                                ([], ["python", "t.py", "{x}"], ["impl=a,b"], "impl"),
                                ([], ["python", "t.py"], ["impl=a"], "KEY=REF,CAND"),
                                ([], ["python", "t.py"], [], "needs --vary")]:
        with pytest.raises(BadInput, match=msg):
            commands_of(pos, cmd, vary)


@pytest.mark.parametrize("argv, words", [
    (["compare", "python a.py"], "give two commands"),
    (["compare", "--vary", "impl=good", "--", "python", "t.py", "{impl}"], "KEY=REF,CAND"),
    (["compare", "--rtol", "-1", "python a.py", "python b.py"], "--rtol"),
    (["compare", "--rtol", "x", "python a.py", "python b.py"], "--rtol"),
    (["compare", "--stall", "0", "python a.py", "python b.py"], "--stall"),
])
def test_bad_options_exit_2_with_one_line(argv, words, tmp_path):
    p = subprocess.run([sys.executable, "-m", "gpulab", *argv], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], p.stderr
    assert not list(tmp_path.iterdir())   # nothing run, nothing written


def test_a_run_that_recorded_no_op_cannot_be_compared_and_says_so():
    j = judge.judge([], [rec(0, "aten.mm.default")])
    assert j.status == "unaligned" and "the reference run recorded no PyTorch op" in j.sentence



def test_the_replay_says_which_run_is_right_and_the_cause_of_a_nan_or_inf(tmp_path):
    torch = pytest.importorskip("torch")
    from gpulab.numerics import replay
    from gpulab.numerics.names import REPLAY

    x, good, zero = torch.tensor([1.0, 2.0]), torch.tensor([2.0, 4.0]), torch.tensor([2.0, 0.0])
    for side, (den, out) in {"ref": (good, x / good), "cand": (zero, x / zero)}.items():
        (tmp_path / side).mkdir()
        torch.save({"op": "aten.div.Tensor", "note": "", "inputs": [x, den], "output": out,
                    "f64": x.double() / den.double()}, tmp_path / side / REPLAY)
    got = replay.judge(tmp_path / "ref", tmp_path / "cand")
    assert got["reference_right"] and got["candidate_right"], got
    assert "both runs compute it right" in got["words"]
    assert got["cause"] and "zero" in got["cause"], got["cause"]
    wrong = {"op": "numfix.fused_silu.default", "note": "", "inputs": [x], "output": x * 1.15, "f64": x.double()}
    torch.save(wrong, tmp_path / "cand" / REPLAY)
    got = replay.judge(tmp_path / "ref", tmp_path / "cand")
    assert got["reference_right"] and not got["candidate_right"] and "candidate's kernel is wrong" in got["words"]


@pytest.mark.parametrize("op, args, kwargs, other, words", [
    ("gelu", "x", {"approximate": "none"}, {"approximate": "tanh"},
     "approximate='none' in the reference and 'tanh' in the candidate"),
    ("native_batch_norm", "bn", {}, {}, "training=False in the reference and True in the candidate"),
])
def test_a_replay_whose_two_calls_differ_in_a_plain_argument_says_so_not_rounding(tmp_path, op, args, kwargs, other,
                                                                                   words):
    """Each side computes right what it was called with: a model left in training mode for evaluation (batch norm
    called with training=True), another GELU: the difference is the call, never 'rounding'."""
    torch = pytest.importorskip("torch")
    from gpulab.numerics import replay

    x = torch.randn(4, 3, 5, generator=torch.Generator().manual_seed(0))
    func = getattr(torch.ops.aten, op).default
    for side, train in (("ref", False), ("cand", True)):
        (tmp_path / side).mkdir()
        if args == "bn":
            a = (x, torch.ones(3), torch.zeros(3), torch.zeros(3), torch.ones(3), train, 0.1, 1e-5)
            kw = {}
        else:
            a, kw = (x,), (kwargs if side == "ref" else other)
        out = func(*a, **kw)
        out = out[0] if isinstance(out, tuple) else out
        replay.keep(str(tmp_path / side), func, a, kw, out, 0, [t.clone() for t in a if isinstance(t, torch.Tensor)],
                    last=False)
    got = replay.judge(tmp_path / "ref", tmp_path / "cand")
    assert got["reference_right"] and got["candidate_right"], got
    assert words in got["words"] and "not a kernel or rounding" in got["words"], got["words"]
    assert got["arguments"] and "rounding of its inputs" not in got["words"]


def _tf32(t):
    """t rounded to TF32 (10 mantissa bits, to nearest): what a TF32 kernel reads of a float32 input."""
    import torch
    return ((t.contiguous().view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)


@pytest.mark.parametrize("op, scale, right", [
    ("mm", 1.0, True), ("conv2d", 1.0, True),    # a TF32 kernel's result: the setting is named, no kernel blamed
    ("mm", 1.01, False),                          # 1% off: more than TF32 gives, the kernel is wrong
])
def test_a_float32_op_run_with_tf32_allowed_is_named_as_that_setting_not_a_wrong_kernel(tmp_path, op, scale, right):
    """float32 CPU against float32 CUDA: cuDNN's convolutions run in TF32 by PyTorch's default, matmuls where the
    program asked for set_float32_matmul_precision('high'). Such an op is off past float32's tolerance with no
    kernel wrong: the replay holds it against what TF32 gives and names the setting and how to turn it off. Here
    the CPU's oneDNN setting stands for CUDA's (the same rule), the candidate's output is computed on TF32-rounded
    inputs, as a TF32 kernel computes it."""
    torch = pytest.importorskip("torch")
    from gpulab.numerics import replay

    g = torch.Generator().manual_seed(0)
    a = (torch.randn(64, 256, generator=g), torch.randn(256, 48, generator=g)) if op == "mm" else (
        torch.randn(2, 8, 12, 12, generator=g), torch.randn(6, 8, 3, 3, generator=g))
    func = getattr(torch.ops.aten, op).default
    mk = torch.backends.mkldnn
    sub = mk.matmul if op == "mm" else mk.conv
    before = sub.fp32_precision
    try:
        for side in ("ref", "cand"):
            (tmp_path / side).mkdir()
            sub.fp32_precision = "ieee" if side == "ref" else "tf32"
            out = func(*a) if side == "ref" else (func(*(_tf32(t) for t in a)).double() * scale).float()
            replay.keep(str(tmp_path / side), func, a, {}, out, 0, [t.clone() for t in a], last=False)
    finally:
        sub.fp32_precision = before
    got = replay.judge(tmp_path / "ref", tmp_path / "cand")
    assert got["reference_right"] and not got["candidate_right"], got
    assert got["candidate_vs_float64"]["max_rel_err"] > 1e-4   # past float32's tolerance: it does diverge
    if right:
        assert "TF32 allowed" in got["words"] and "with no kernel error beyond it" in got["words"], got["words"]
        assert f"torch.backends.mkldnn.{'matmul' if op == 'mm' else 'conv'}.fp32_precision = 'ieee'" in got["words"]
        assert got["settings"]["candidate"]["precision"] == "tf32" and "reference" not in got["settings"]
    else:
        assert "candidate's kernel is wrong" in got["words"] and "settings" not in got, got["words"]
        assert "TF32 was allowed, but its error" in got["words"], got["words"]


def test_an_op_too_large_to_replay_still_names_the_tf32_setting_it_ran_with(tmp_path):
    """A GPT-sized matmul keeps no tensors (a replay is evidence, not a second run): the setting, read as it ran,
    is still said, as what the difference may be."""
    torch = pytest.importorskip("torch")
    from gpulab.numerics import replay

    a = (torch.randn(4, 8), torch.randn(8, 3))
    func, mk = torch.ops.aten.mm.default, torch.backends.mkldnn.matmul
    before = mk.fp32_precision
    try:
        for side in ("ref", "cand"):
            (tmp_path / side).mkdir()
            mk.fp32_precision = "ieee" if side == "ref" else "tf32"
            replay.keep(str(tmp_path / side), func, a, {}, func(*a), 0, None, last=False)
    finally:
        mk.fp32_precision = before
    got = replay.judge(tmp_path / "ref", tmp_path / "cand")
    assert not got["available"] and "too large to keep" in got["words"], got
    assert "the candidate ran this matrix multiplication with TF32 allowed" in got["words"], got["words"]
    assert "the likely cause" in got["words"] and "no kernel error beyond it" not in got["words"], got["words"]
    assert got["settings"]["candidate"]["precision"] == "tf32" and "reference" not in got["settings"], got


@pytest.mark.parametrize("wrong", [False, True])
def test_one_attention_run_by_two_backends_kernels_is_paired_and_named_with_both(wrong):
    """CPU runs SDPA as its flash kernel, CUDA as its efficient one: one computation, paired by its output (the
    log-sum-exp each also gives is shaped otherwise: left unpaired, not 'the runs part'). A wrong CUDA attention is
    named with both kernels; a right one agrees."""
    cpu, cuda = "aten._scaled_dot_product_flash_attention_for_cpu.default", "aten._scaled_dot_product_efficient_attention.default"
    site = "gpt.py:40 in forward"

    def run(op, value, lse_shape):
        return [rec(0, "aten.randn.default", value=1.0), rec(1, "aten.mm.default", ins=[0], value=2.0),
                rec(2, op, site=site, ins=[1, 1, 1], value=value, k=16), rec(3, op, site=site, ins=[1, 1, 1],
                                                                           out=1, shape=lse_shape, value=9.0),
                rec(4, "aten.mm.default", ins=[2], value=4.0 * value / 3.0)]
    ref, cand = run(cpu, 3.0, [2, 4]), run(cuda, 3.3 if wrong else 3.0, [2, 32])
    j = judge.judge(ref, cand)
    if not wrong:
        assert j.status == "agree" and j.aligned == 4, j.sentence   # the log-sum-exps are not paired
        return
    assert j.status == "diverged" and j.first_divergence["op"] == cpu, j.sentence
    assert f"which the candidate runs as {cuda} (another backend's kernel for the same call)" in j.sentence
    assert j.keep == (f"{cpu}|{site}|1|0", f"{cuda}|{site}|1|0")   # each side replays its own kernel


def test_a_backends_own_kernel_is_replayed_on_the_cpus_kernel_for_the_same_call(tmp_path):
    """cuDNN's batch norm has no CPU kernel: its float64 replay is native_batch_norm on the same arguments; the two
    calls' arguments are compared by the names they share (eps and epsilon are not 'the calls differ')."""
    torch = pytest.importorskip("torch")
    from gpulab.numerics import replay

    x = torch.randn(4, 3, 5, generator=torch.Generator().manual_seed(0))
    a = (x, torch.ones(3), torch.zeros(3), torch.zeros(3), torch.ones(3), True, 0.1, 1e-5)
    out = torch.ops.aten.native_batch_norm.default(*a)[0]
    for side, func in (("ref", torch.ops.aten.native_batch_norm.default), ("cand", torch.ops.aten.cudnn_batch_norm.default)):
        (tmp_path / side).mkdir()
        replay.keep(str(tmp_path / side), func, a, {}, out * (1.01 if side == "cand" else 1.0), 0,
                    [t.clone() for t in a if isinstance(t, torch.Tensor)], last=False)
    got = replay.judge(tmp_path / "ref", tmp_path / "cand")
    assert got["available"] and "arguments" not in got, got
    assert got["reference_right"] and not got["candidate_right"] and "candidate's kernel is wrong" in got["words"]


def test_a_random_draw_that_differs_is_named_as_the_generators_state_and_not_replayed():
    """Its numbers come from the generator, not from inputs: replayed against float64 it is meaningless ('neither
    run is right'), and 'it reads no earlier output' says nothing of why."""
    ref = [rec(0, "aten.mm.default", value=1.0), rec(1, "aten.randn.default", site="t.py:18 in main", value=2.0),
           rec(2, "aten.add.Tensor", site="t.py:19 in main", ins=[0, 1], value=3.0)]
    cand = [rec(0, "aten.mm.default", value=1.0), rec(1, "aten.randn.default", site="t.py:18 in main", value=2.5),
            rec(2, "aten.add.Tensor", site="t.py:19 in main", ins=[0, 1], value=3.5)]
    j = judge.judge(ref, cand)
    assert j.first_divergence["op"] == "aten.randn.default" and j.keep is None
    assert "random generators are in different states" in j.sentence, j.sentence


def _eager_and_compiled(cand_draws: bool) -> tuple[list[dict], list[dict]]:
    """Eager: dropout's bernoulli_ and the linear layer; compiled: the region's logits (an `<input>` where the loss
    reads them), with (fallback_random) or without its own native_dropout; then a cast of a bool mask (accuracy)."""
    ref = [rec(0, "aten.randn.default"), rec(1, "aten.bernoulli_.float", site="m.py:29 in forward", value=0.5),
           rec(2, "aten.addmm.default", site="m.py:29 in forward", ins=[0, 1], value=2.0),
           rec(3, "aten._log_softmax.default", site="t.py:49 in main", ins=[2], value=3.0),
           rec(4, "aten._to_copy.default", site="t.py:56 in main", value=1.0)]
    cand = [rec(0, "aten.randn.default"), rec(1, "<input>", site="t.py:49 in main", value=2.5),
            rec(2, "aten._log_softmax.default", site="t.py:49 in main", ins=[1], value=3.5),
            rec(3, "aten._to_copy.default", site="t.py:56 in main", value=0.0)]
    if cand_draws:
        cand.insert(1, rec(9, "aten.native_dropout.default", site="m.py:26 in forward", ins=[0], value=0.7))
    return ref, cand


def test_random_numbers_only_the_eager_run_draws_are_named_before_what_they_change():
    """torch.compile draws dropout's random numbers inside its own kernels: the eager run's bernoulli_ is the first
    difference, and the verdict says how to make the two draw alike; a later cast of a bool mask (which reads no
    float the recorder fingerprints) is not the maker."""
    j = judge.judge(*_eager_and_compiled(cand_draws=False))
    fd = j.first_divergence
    assert (fd["op"], fd["run"], fd.get("random_draw")) == ("aten.bernoulli_.float", "reference", True), j.sentence
    assert "fallback_random = True" in j.sentence and "aten._log_softmax.default" in j.sentence


def test_when_both_runs_draw_random_numbers_neither_is_said_to_draw_alone():
    j = judge.judge(*_eager_and_compiled(cand_draws=True))
    assert not j.first_divergence.get("random_draw") and "only the" not in j.sentence, j.sentence
    assert j.first_divergence["seen_first_at"]["op"] == "aten._log_softmax.default"


def test_the_same_call_on_two_devices_is_not_called_different():
    torch = pytest.importorskip("torch")
    from gpulab.numerics import replay

    func = torch.ops.aten.randn.default
    a = replay.arguments(func, ([2, 3],), {"dtype": torch.float32, "device": torch.device("cpu"), "pin_memory": False})
    b = replay.arguments(func, ([2, 3],), {"dtype": torch.bfloat16, "device": "cuda", "pin_memory": True})
    assert a == b == {"size": "[2, 3]"}


def test_an_output_of_another_shape_after_the_divergence_is_not_called_nan():
    """Batch norm's saved statistics are empty outside training: of another shape, not NaN/Inf."""
    ref = [rec(0, "aten.randn.default"), rec(1, "aten.bn.default", ins=[0], value=2.0),
           rec(2, "aten.bn.default", ins=[0], shape=[0], out=1), rec(3, "aten.relu.default", ins=[1], value=2.0)]
    cand = [rec(0, "aten.randn.default"), rec(1, "aten.bn.default", ins=[0], value=3.0),
            rec(2, "aten.bn.default", ins=[0], shape=[16], out=1), rec(3, "aten.relu.default", ins=[1], value=3.0)]
    j = judge.judge(ref, cand)
    assert j.first_divergence["op"] == "aten.bn.default" and "NaN" not in j.sentence, j.sentence


def test_a_record_line_is_json_and_reads_back_exactly():
    import struct

    from gpulab.numerics import lines

    sample = [0.1, -3.5e-8, float("nan"), 1.0 / 3]
    text = lines.line(7, "aten.mm.default", 'a "quoted" path.py:3 in f', 2, True, 0, [5, 6], 64, "bfloat16",
                      [2, 3], 6, "cuda:0", [float("inf"), 1.5, float("nan")], struct.pack("<4d", *sample), [-12, 1, 2])
    r = lines.decode(json.loads(text))
    assert (r["i"], r["op"], r["site"], r["pass"], r["bwd"], r["in"], r["k"], r["shape"], r["ck"], r["nan"]) == \
        (7, "aten.mm.default", 'a "quoted" path.py:3 in f', 2, True, [5, 6], 64, [2, 3], -12, 1)
    assert r["sum"] == float("inf") and math.isnan(r["amax"]) and r["asum"] == 1.5
    assert r["sample"][:2] == sample[:2] and math.isnan(r["sample"][2]) and r["sample"][3] == 1.0 / 3
    assert "s64" not in r


def test_an_out_tensor_is_no_input_of_the_op_that_writes_it(tmp_path):
    """What out= held before is overwritten, never read: recorded as an input it would be a difference no op made
    (DDP's mul.out writes each step's gradients into a bucket holding the last step's all-reduced ones)."""
    torch = pytest.importorskip("torch")
    from gpulab.numerics import lines, record

    stale = torch.full((4,), 7.0)
    fp = record.Fingerprints(str(tmp_path / "r.jsonl"))
    with record.make_mode(fp)():
        a = torch.ones(4)
        torch.mul(a, 2.0, out=stale)
    fp.close()
    rows = [lines.decode(json.loads(line)) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r["op"] for r in rows] == ["aten.ones.default", "aten.mul.out"], rows
    assert rows[1]["in"] == [0] and rows[1]["sum"] == 8.0


def test_a_forked_child_records_nothing_and_frees_nothing_of_its_parent(tmp_path):
    """A DataLoader worker forked from a recorded process: its ops pass through (their records would go nowhere),
    and the parent's buffers stay alive there (on a GPU, a CUDA free in a forked child aborts the worker)."""
    torch = pytest.importorskip("torch")
    import gc
    import weakref
    from gpulab.numerics import record

    fp = record.Fingerprints(str(tmp_path / "r.jsonl"))
    with record.make_mode(fp)():
        x = torch.randn(8) * 2
        recorded, sink = fp.n, weakref.ref(next(iter(fp.sinks.values())))
        fp.forked()                          # what the at-fork hook does in the child
        y = (x + 1).sum()
        gc.collect()
        assert fp.n == recorded and not fp.meta and y is not None
        assert sink() is not None            # kept, never freed in the child
    fp.close()


def test_a_run_whose_only_block_is_written_at_exit_by_the_writer_thread_keeps_its_records(tmp_path):
    """A GPU run's blocks go through a writer thread; a short run's only block is written at interpreter exit,
    when Python starts no new thread: the thread started with the first GPU record writes it (here forced on
    the CPU), and the child exits without closing anything itself."""
    out = tmp_path / "r.jsonl"
    code = (f"import atexit, sys; sys.path.insert(0, {str(Path(__file__).parents[1] / 'lib')!r})\n"
            "import torch\n"
            "from gpulab.numerics import fingerprints, record\n"
            f"fp = fingerprints.Fingerprints({str(out)!r}, background=True)\n"
            "atexit.register(fp.close)\n"
            "record.make_mode(fp)().__enter__()\n"
            "x = torch.randn(10)\n"
            "y = (x * 2).sum()\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "not written" not in p.stderr, p.stderr
    ops = [json.loads(line)["op"] for line in out.read_text().splitlines()]
    assert ops == ["aten.randn.default", "aten.mul.Tensor", "aten.sum.default"], (ops, p.stderr)


def test_closing_while_the_mode_is_still_on_records_none_of_the_recorders_own_ops(tmp_path):
    """At exit the recorder's mode is still on when its last block is written: the copies and kernels of that
    write must not be recorded (on CUDA they were batched while the batch was being launched)."""
    torch = pytest.importorskip("torch")
    from gpulab.numerics import lines, record

    fp = record.Fingerprints(str(tmp_path / "r.jsonl"))
    mode = record.make_mode(fp)()
    mode.__enter__()
    try:
        y = torch.randn(6) * 2
        fp.close()                          # as atexit does, the mode on
    finally:
        mode.__exit__(None, None, None)
    rows = [lines.decode(json.loads(line)) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r["op"] for r in rows] == ["aten.randn.default", "aten.mul.Tensor"] and y is not None
    assert fp.n == 2


@pytest.mark.parametrize("tail, said", [
    ("step 0\n[rank0]: RuntimeError: DataLoader worker (pid(s) 902) exited unexpectedly\nE1127 api.py:986] failed\n"
     "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n====\nRoot Cause\n  rank : 0\n====\n",
     "[rank0]: RuntimeError: DataLoader worker (pid(s) 902) exited unexpectedly"),
    ("Traceback (most recent call last):\n  File \"t.py\", line 3\ntorch.OutOfMemoryError: CUDA out of memory\n",
     "torch.OutOfMemoryError: CUDA out of memory"),
    ("step 1 loss 2.0\n\n", "step 1 loss 2.0"),
    ("Killed\n-----\n", "Killed"),
    ("", ""),
    # a tail that lost its traceback's header, an exception named without Error, dynamo's prose after it
    ("    return forward_call(*args)\n  File \"/t/eval_frame.py\", line 1177, in compile_wrapper\n"
     "    raise e.with_traceback(\ntorch._dynamo.exc.Unsupported: Data-dependent branching\n  Explanation: x\n\n"
     "from user code:\n   File \"/u/train.py\", line 11, in forward\n    if h.mean() > 0.1:\n\n"
     "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace\n",
     "torch._dynamo.exc.Unsupported: Data-dependent branching"),
    ("  File \"/usr/lib/python3.11/bdb.py\", line 115, in dispatch_line\n    if self.quitting: raise BdbQuit\n"
     "bdb.BdbQuit\n", "bdb.BdbQuit"),
])
def test_a_failed_runs_last_words_are_its_error_not_a_launchers_closing_rule(tail, said):
    """torchrun ends a failed job with its own summary: '=' rules and a ChildFailedError that only repeats that a
    rank failed; a compare of such a job said 'exited with code 1: ====...'."""
    from gpulab import lastwords

    assert lastwords.of(tail) == said


@pytest.mark.parametrize("text,line", [
    ("step 0 loss 0.42\nstep 1 loss nan\nstep 2 loss nan\n", "step 1 loss nan"),
    ("val loss=-inf\n", "val loss=-inf"),
    ("tensor(nan, grad_fn=<MeanBackward0>)\n", "tensor(nan, grad_fn=<MeanBackward0>)"),
    ("grad norm Inf\n", "grad norm Inf"),
    # words that hold one are not numbers
    ("info: inference ok\nw-nan False\nnan-free batch\nlr infinite\n", ""),
    ("step 9 loss 0.013\n", ""),
])
def test_the_nan_a_program_prints_is_found_as_a_number_not_inside_a_word(text, line):
    """A run that ended well while printing 'loss nan' is pointed at stats mode (gpulab watch's default mode
    reads no values)."""
    from gpulab import lastwords

    assert lastwords.nonfinite(text) == line


def test_a_bitwise_difference_where_the_reference_holds_zero_is_said_as_an_absolute_error():
    """A gradient element that is 0 in one run and 1e-9 in the other is within tolerance: 'max relative error inf'
    would read as a blow-up in a verdict that says the runs agree."""
    ref = [rec(0, "aten.randn.default", value=1.0), rec(1, "aten.mm.default", ins=[0], value=0.0)]
    cand = [dict(ref[0]), rec(1, "aten.mm.default", ins=[0], value=1e-9)]
    j = judge.judge(ref, cand)
    assert j.status == "agree" and "max absolute error 4e-09, where the reference holds 0" in j.sentence, j.sentence
    assert "inf" not in j.sentence


def test_an_op_only_one_run_runs_is_not_called_another_backends_kernel_of_what_the_other_run_runs_there():
    """A refactor that drops `/ ACC` from a loss: the reference's backward divides, the candidate's starts from
    ones_like. The reference's op is named at its line, and the candidate's is not said to be the same call."""
    site = "train.py:14 in main"
    ref = [rec(0, "aten.randn.default", value=1.0), rec(1, "aten.mm.default", ins=[0], value=2.0),
           rec(2, "aten.div.Tensor", site=site, ins=[1], value=0.25, bwd=True),
           rec(3, "aten.nll_loss_backward.default", site=site, ins=[2], value=0.5, bwd=True)]
    cand = [dict(ref[0]), dict(ref[1]), rec(2, "aten.ones_like.default", site=site, ins=[1], value=1.0, bwd=True),
            rec(3, "aten.nll_loss_backward.default", site=site, ins=[2], value=2.0, bwd=True)]
    j = judge.judge(ref, cand)
    assert j.status == "diverged" and j.first_divergence["op"] == "aten.div.Tensor", j.sentence
    assert "an op only the reference runs" in j.sentence and "another backend's kernel" not in j.sentence, j.sentence


def test_a_run_of_one_op_at_one_line_interrupted_on_one_side_is_paired_by_occurrence():
    """An optimizer's add_ per parameter, which the other run interrupts with an op of its own (a clone where its
    momentum buffer starts): matched as the longest common block, the first update was paired with the third and
    a false divergence named (eager against torch.compile of a CNN with SGD momentum). Paired by pass, they agree."""
    site = "train.py:46 in main"

    def run(interrupt: bool):
        recs, i = [rec(0, "aten.randn.default", value=1.0)], 1
        for k in range(1, 7):
            if interrupt and k == 3:
                recs.append(rec(i, "aten.clone.default", site=site, ins=[0], value=0.5))
                i += 1
            recs.append(rec(i, "aten.add_.Tensor", site=site, npass=k, ins=[0], value=10.0 * k))
            i += 1
        return recs
    ref, cand = run(False), run(True)
    ro, co = align.ops(ref), align.ops(cand)
    pairs = align.align(ro, co).pairs
    assert all(ro[a]["pass"] == co[b]["pass"] for a, b in pairs), [(ro[a]["pass"], co[b]["pass"]) for a, b in pairs]
    j = judge.judge(ref, cand)
    assert j.status == "agree" and j.aligned == 7, j.sentence


def _run(*devices: str):
    from gpulab.numerics import compare
    return compare.Run("reference", ("python",), (), "ok", 0, 1.0, "", tuple({"device": d} for d in devices))


@pytest.mark.parametrize("devices, wrote, cores, together", [
    ((("cpu",), ("cuda:0",)), [], 16, True),             # CPU against CUDA: they share no device
    ((("cpu",), ("cpu",)), [], 16, True),
    ((("cuda:0",), ("cpu", "cuda:0")), [], 16, False),   # both on a GPU: a program sized for it may not fit twice
    ((("cpu",), ("cuda:0",)), ["ckpt.pt"], 16, False),   # a file the runs write: one side could read the other's
    ((("cpu",), ("cuda:0",)), None, 16, False),          # what they wrote is not known (too many files)
    ((("cpu",), ("cuda:0",)), [], 2, False),             # no spare cores
])
def test_the_two_replays_run_at_once_only_where_they_cannot_meet(devices, wrote, cores, together):
    from gpulab.numerics import compare
    assert compare.side_by_side([_run(*d) for d in devices], wrote, cores) is together


def _rec(op: str, npass: int, total: float, ck: int) -> dict:
    return {"op": op, "site": "train.py:9 in step", "pass": npass, "out": 0, "dtype": "float32", "shape": [4], "n": 4,
            "sum": total, "asum": abs(total), "amax": abs(total) / 4, "ck": ck, "nan": 0, "inf": 0,
            "sample": [total / 4] * 4}


@pytest.mark.parametrize("again, apart, expect", [
    ([_rec("aten.mm.default", 3, 8.0, 1)], 1.0, True),                 # the same bits
    ([_rec("aten.mm.default", 3, 8.0 * (1 + 1e-7), 2)], 1.0, True),    # the last bits (a GPU's atomics)
    ([_rec("aten.mm.default", 3, 8.0 * (1 + 1e-4), 2)], 1e3, True),    # far closer than the two runs are
    ([_rec("aten.mm.default", 3, 8.0 * (1 + 1e-4), 2)], 1.0, False),   # as far as the two runs are apart
    ([_rec("aten.mm.default", 3, 9.0, 3)], 1e3, False),                # other values: another path, or other data
    ([_rec("aten.mm.default", 2, 8.0, 1)], 1.0, None),                 # the replay never made that record
])
def test_a_replay_run_is_checked_against_its_first_run_at_the_kept_op(again, apart, expect):
    from gpulab.numerics import compare
    first = [_rec("aten.mm.default", 2, 1.0, 9), _rec("aten.mm.default", 3, 8.0, 1)]
    assert compare.reproduced(first, again, "aten.mm.default|train.py:9 in step|3|0", apart=apart) is expect
