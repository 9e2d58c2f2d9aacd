"""Why an op made the first NaN/Inf (gpulab.trace.nancause): the pure judgement on synthetic facts, and the
facts read from real tensors; the verdict's words and the fix advice that follow from it."""
from __future__ import annotations

import math

import pytest

from gpulab.trace import firstnan, nancause
from gpulab.trace.nancause import TensorFacts as T

INF = math.inf


def f32(**kw) -> T:
    return T("float32", (4, 4), **kw)


def out(nan: int = 0, posinf: int = 0, dtype: str = "float32", shape: tuple = (4, 4)) -> T:
    return T(dtype, shape, nan=nan, posinf=posinf)


CASES = [
    # op, inputs, output, kind, input, words that must appear
    ("aten.div.Tensor", [f32(min=-1.0, max=2.0), f32(min=0.0, max=3.0, zeros=16, nonpositive=16)], out(posinf=16),
     "zero_divisor", 1, "the divisor holds zeros (input 1: 16 zeros)"),
    ("aten.div.Tensor", [f32(zeros=8, nonpositive=8, min=0.0, max=1.0), f32(zeros=1, nonpositive=1, min=0.0, max=1.0)],
     out(nan=8), "zero_divisor", 1, "0/0 gives NaN"),
    ("aten.div.Scalar", [f32(min=1.0, max=2.0), nancause.scalar_facts(0.0)], out(posinf=16), "zero_divisor", 1,
     "the scalar 0 (input 1): 1 zero"),
    ("aten.reciprocal.default", [f32(zeros=2, nonpositive=2, min=0.0, max=1.0)], out(posinf=2), "zero_divisor", 0,
     "divisor holds zeros (input 0: 2 zeros)"),
    ("aten.remainder.Tensor", [f32(min=1.0, max=2.0), f32(zeros=3, nonpositive=3, min=0.0, max=1.0)], out(nan=3),
     "zero_divisor", 1, "3 zeros"),
    ("aten.rsqrt.default", [f32(zeros=1, nonpositive=1, min=0.0, max=1.0)], out(posinf=1), "zero_divisor", 0,
     "rsqrt of zero"),
    ("aten.log.default", [f32(nonpositive=3, zeros=1, min=-2.0, max=5.0)], out(nan=2), "log_domain", 0,
     "log of values <= 0 (input 0: 3 values <= 0, 1 zero, min -2)"),
    ("aten.log2.default", [f32(nonpositive=1, min=-1.0, max=5.0)], out(nan=1), "log_domain", 0, "log2 of values <= 0"),
    ("aten.log10.default", [f32(nonpositive=1, min=-1.0, max=5.0)], out(nan=1), "log_domain", 0, "log10"),
    ("aten.log1p.default", [f32(nonpositive=4, min=-3.0, max=5.0)], out(nan=1), "log_domain", 0,
     "log1p of values <= -1 (input 0: min -3)"),
    ("aten.sqrt.default", [f32(nonpositive=2, zeros=1, min=-0.5, max=1.0)], out(nan=1), "sqrt_domain", 0,
     "sqrt of negative values (input 0: 1 value < 0, min -0.5)"),
    ("aten.pow.Tensor_Scalar", [f32(nonpositive=2, min=-4.0, max=1.0), nancause.scalar_facts(0.5)], out(nan=2),
     "pow_domain", 0, "non-integer exponent"),
    ("aten.exp.default", [f32(min=0.0, max=95.0)], out(posinf=1), "overflow", 0,
     "exp of values up to 95 overflows float32 (above 88.72"),
    ("aten.exp.default", [f32(neginf=6, min=-3.0, max=400.0)], out(posinf=2), "overflow", 0,   # masked scores
     "exp of values up to 400 overflows float32"),                                            # too large
    ("aten.exp.default", [T("float16", (4,), min=0.0, max=12.0)], out(posinf=1, dtype="float16"), "overflow", 0,
     "overflows float16 (above 11.09"),
    ("aten.mul.Tensor", [f32(min=1.0, max=3e38), f32(min=1.0, max=10.0)], out(posinf=1), "overflow", 0,
     "mul overflows float32"),
    ("aten.mm.default", [T("float16", (8, 64), min=0.0, max=300.0), T("float16", (64, 8), min=1.0, max=1.0)],
     out(posinf=64, dtype="float16"), "matmul_overflow", None, "mm in float16 overflows its narrow range"),
    ("aten.addmm.default", [T("bfloat16", (8,), min=0.0, max=1.0), T("bfloat16", (8, 8), min=0.0, max=1e38),
                            T("bfloat16", (8, 8), min=0.0, max=1e38)], out(posinf=1, dtype="bfloat16"),
     "matmul_overflow", None, "addmm in bfloat16"),
    ("aten.baddbmm.default", [T("float16", (2, 4, 4), min=0.0, max=1.0), T("float16", (2, 4, 8), min=0.0, max=500.0),
                              T("float16", (2, 8, 4), min=0.0, max=500.0)], out(posinf=4, dtype="float16"),
     "matmul_overflow", None, "baddbmm in float16"),
    ("aten._to_copy.default", [f32(min=-1.0, max=70000.0)], out(posinf=3, dtype="float16"), "cast_overflow", 0,
     "casting float32 values up to 7e+04 to float16 (largest 6.55e+04)"),
    ("aten._softmax.default", [f32(neginf=8, min=0.0, max=1.0), None, None], out(nan=4), "softmax_masked_row", 0,
     "a row that is all -inf"),
    ("aten._log_softmax.default", [f32(neginf=4, min=0.0, max=1.0), None, None], out(nan=4), "softmax_masked_row", 0,
     "log_softmax"),
    ("aten.addmm.default", [f32(min=0.0, max=1.0), f32(nan=1, min=0.0, max=1.0), f32(min=0.0, max=1.0)], out(nan=4),
     "input_nan", 1, "input 1 already holds NaN (1 value): it was made earlier"),
    ("aten.add.Tensor", [f32(posinf=2, min=0.0, max=1.0), f32(min=0.0, max=1.0)], out(posinf=2), "input_inf", 0,
     "input 0 already holds +Inf (2 values)"),
    ("aten.fill_.Scalar", [None, nancause.scalar_facts(math.nan)], out(nan=16), "input_nan", 1,
     "input 1 is the number NaN"),
    ("aten.mul.Tensor", [f32(neginf=1, min=0.0, max=1.0), f32(zeros=4, nonpositive=4, min=0.0, max=0.0)], out(nan=1),
     "input_neginf", 0, "input 0 holds -Inf (1 value"),
    ("aten.add.Tensor", [f32(min=0.0, max=1.0), f32(min=0.0, max=1.0)], out(nan=1), "unknown", None,
     "no input holds NaN/Inf"),
    # a group of one element: Bessel's correction divides by N - 1 = 0
    ("aten.var.correction", [T("float32", (1, 1), min=0.5, max=0.5)], out(nan=1, shape=()), "variance_dof", 0,
     "var of 1 element per value: with the default correction (Bessel's, dividing by N - 1) that is 0/0"),
    ("aten.std.correction", [T("float32", (4, 1), min=0.5, max=2.0), None], out(nan=4, shape=(4,)), "variance_dof",
     0, "std of 1 element per value"),
    ("aten.var.correction", [T("float32", (8,), min=0.5, max=2.0)], out(nan=1, shape=()), "unknown", None,
     "no input holds NaN/Inf"),   # 8 elements: 0/0 is not what made it
    # a mean over no counted target: every target ignore_index (a batch of prompts whose answers were cut away)
    ("aten.nll_loss_forward.default", [T("float32", (64, 50), min=-6.0, max=-1.0),
                                       T("int64", (64,), min=-100.0, max=-100.0, nonpositive=64), None,
                                       nancause.scalar_facts(1), nancause.scalar_facts(-100)], out(nan=1, shape=()),
     "no_targets", 1, "every target is ignore_index (-100; input 1: 64 targets, all -100)"),
    ("aten.nll_loss2d_forward.default", [T("float32", (2, 5, 4, 4), min=-6.0, max=-1.0),
                                         T("int64", (2, 4, 4), min=0.0, max=3.0, zeros=4, nonpositive=4),
                                         T("float32", (5,), min=0.0, max=1.0, zeros=4, nonpositive=4),
                                         nancause.scalar_facts(1), nancause.scalar_facts(-100)], out(nan=1, shape=()),
     "no_targets", 1, "the counted targets' total weight is 0"),
    ("aten.nll_loss_forward.default", [T("float32", (64, 50), min=-6.0, max=-1.0, nan=2),
                                       T("int64", (64,), min=-100.0, max=-100.0, nonpositive=64), None,
                                       nancause.scalar_facts(1), nancause.scalar_facts(-100)], out(nan=1, shape=()),
     "input_nan", 0, "already holds NaN"),
    # a cosine that rounding pushed past 1
    ("aten.acos.default", [f32(min=-0.25, max=1.0000001)], out(nan=1), "unit_domain", 0,
     "acos of values outside [-1, 1] (input 0: min -0.25, max 1.0000001)"),
    ("aten.asin.default", [f32(min=-0.5, max=0.5)], out(nan=1), "unknown", None, "no input holds NaN/Inf"),
]


@pytest.mark.parametrize("op,inputs,output,kind,index,words", CASES, ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_cause_names_the_input_that_explains_it(op, inputs, output, kind, index, words):
    c = nancause.cause(op, inputs, output)
    assert (c.kind, c.input) == (kind, index), c
    assert words in c.words, c.words
    assert c.kind in nancause.KINDS


def test_a_first_nan_whose_input_already_holds_one_came_with_the_data():
    c = nancause.cause("aten.lift_fresh.default", [f32(nan=1, min=0.0, max=1.0)], out(nan=1), first=True)
    assert c.kind == "input_nan" and "no earlier op made it: it came in with the data" in c.words
    assert c.earlier


@pytest.mark.parametrize("op,base", [("aten.div.Tensor", "div"), ("aten.div_.Tensor", "div"),
                                     ("aten._to_copy.default", "to_copy"), ("aten._softmax.default", "softmax"),
                                     ("torch.exp", "exp"), ("exp", "exp"), ("aten.log1p.default", "log1p"),
                                     ("aten._foreach_sqrt.default", "sqrt")])
def test_base_name(op, base):
    assert nancause.base_name(op) == base


def test_a_division_with_no_zero_divisor_is_not_blamed_on_it():
    c = nancause.cause("aten.div.Tensor", [f32(min=1.0, max=2.0), f32(min=0.5, max=1.0)], out(nan=1))
    assert c.kind == "unknown" and "the divisor holds no zero" in c.words


def test_facts_read_from_real_tensors_give_the_same_causes():
    import torch

    x = torch.tensor([[1.0, 0.0], [2.0, -3.0]])
    fx = nancause.facts_of(x)
    assert (fx.zeros, fx.nonpositive, fx.min, fx.max, fx.shape, fx.dtype) == (1, 2, -3.0, 2.0, (2, 2), "float32")
    one = torch.ones(2, 2)
    assert nancause.cause("aten.div.Tensor", [nancause.facts_of(one), fx], nancause.facts_of(one / x)).kind \
        == "zero_divisor"
    assert nancause.cause("aten.log.default", [fx], nancause.facts_of(x.log())).kind == "log_domain"
    big = torch.full((4, 64), 3000.0, dtype=torch.float16)
    w = torch.ones(64, 4, dtype=torch.float16)
    y = big @ w            # CPU float16 matmuls overflow to Inf as GPU ones do
    assert torch.isinf(y).all()
    c = nancause.cause("aten.mm.default", [nancause.facts_of(big), nancause.facts_of(w)], nancause.facts_of(y))
    assert c.kind == "matmul_overflow"
    # causal attention scores scaled far too much, masked with -inf: exp overflows on the large ones
    s = torch.tensor([[300.0, 1.0], [2.0, 150.0]]).masked_fill(torch.tensor([[False, True], [False, False]]),
                                                                 float("-inf"))
    assert nancause.cause("aten.exp.default", [nancause.facts_of(s)], nancause.facts_of(s.exp())).kind == "overflow"
    n = nancause.facts_of(torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0]))
    assert (n.nan, n.posinf, n.neginf, n.min, n.max) == (1, 1, 1, 1.0, 1.0)
    assert nancause.facts_of("text") is None and nancause.facts_of(None) is None
    assert nancause.facts_of(2).scalar == 2.0
    assert nancause.TensorFacts.from_dict(fx.to_dict()) == fx
    # a foreach op's list of tensors is one input: the optimizer's sqrt of a negative second moment
    sq = [torch.tensor([1.0, 4.0]), torch.tensor([-1.0, 0.0])]
    fl = nancause.facts_of(sq)
    assert (fl.shape, fl.zeros, fl.nonpositive, fl.min, fl.max) == ((4,), 1, 2, -1.0, 4.0)
    assert nancause.cause("aten._foreach_sqrt.default", [fl], nancause.facts_of(torch._foreach_sqrt(sq)[1])).kind \
        == "sqrt_domain"


def _rec(**kw) -> dict:
    base = {"seq": 9, "op": "aten.div.Tensor", "call_site": "nan/train.py:23 in main", "file": "/home/u/train.py",
            "pass": 5, "backward": False, "output": {"nan": 8, "dtype": "float32"},
            "cause": {"kind": "zero_divisor", "words": "the divisor holds zeros (input 1: 16 zeros)", "input": 1}}
    return {**base, **kw}


def test_the_sentence_names_op_line_pass_cause_and_whose_code():
    s = firstnan.sentence(_rec())
    assert s.startswith("NaN first made by aten.div.Tensor at nan/train.py:23 in main (pass 5): the divisor holds "
                        "zeros (input 1: 16 zeros) — the program's line: fix it there"), s
    lib = firstnan.sentence(_rec(file="/usr/lib/python3/site-packages/transformers/models/x.py"))
    assert "transformers's code at that line" in lib and "report it to transformers" in lib
    bwd = firstnan.sentence(_rec(backward=True, backward_node="SqrtBackward0", forward_op="aten.sqrt.default"))
    assert "in backward (SqrtBackward0), the gradient of aten.sqrt.default at nan/train.py:23 in main (pass 5)" in bwd
    assert "sqrt has an infinite gradient at 0" in bwd
    # a feature masked out for a whole batch: std is 0 there, and its gradient 0/0
    std = firstnan.next_step(_rec(backward=True, backward_node="StdBackward0", forward_op="aten.std.correction"))
    assert "std's gradient where it is 0 (a constant or masked-out feature) is 0/0: use sqrt(var + eps)" in std, std
    # torch.linalg.vector_norm (torch.norm's op) of two equal points; acos of a cosine of exactly 1
    norm = firstnan.next_step(_rec(backward=True, forward_op="aten.linalg_vector_norm.default"))
    assert "a norm's gradient at 0 (a vector minus itself: two equal points) is 0/0" in norm, norm
    acos = firstnan.next_step(_rec(backward=True, forward_op="aten.acos.default"))
    assert "acos has an infinite gradient at -1 and 1" in acos, acos
    # a backward op that only passes on what its input brought (-Inf times 0): the forward function's gradient is
    # not what made it, so its remedy is not given
    passed = firstnan.next_step(_rec(backward=True, backward_node="PowBackward0", forward_op="aten.pow.Tensor_Scalar",
                                     op="aten.mul.Tensor", cause={"kind": "input_neginf", "input": 0,
                                                                  "words": "input 0 holds -Inf"}))
    assert "fractional power" not in passed, passed
    # a -Inf gradient is named as such
    neg = firstnan.sentence(_rec(backward=True, backward_node="SqrtBackward0", forward_op="aten.sqrt.default",
                                 output={"neginf": 16, "dtype": "float32"}))
    assert neg.startswith("-Inf first made by aten.div.Tensor in backward (SqrtBackward0)"), neg


def test_fp32_softmax_is_advised_only_where_a_softmax_can_answer_it():
    from gpulab.fixes import suggest

    div = {"first_nonfinite_op": "aten.div.Tensor", "first_nonfinite_cause_kind": "zero_divisor"}
    assert suggest.for_nan(div) == ()
    masked = {"first_nonfinite_op": "aten._softmax.default", "first_nonfinite_cause_kind": "softmax_masked_row"}
    assert suggest.for_nan(masked) == ()   # fp32 makes the same 0/0
    soft = {"first_nonfinite_op": "aten._softmax.default", "first_nonfinite_cause_kind": "overflow"}
    assert suggest.for_nan(soft) == ("fp32_softmax",)
    scores = {"first_nonfinite_op": "aten.bmm.default", "first_nonfinite_cause_kind": "matmul_overflow",
              "first_nonfinite_dtype": "float16", "first_nonfinite_into_softmax": True}
    assert suggest.for_nan(scores) == ("fp32_softmax",)
    assert suggest.for_nan({**scores, "first_nonfinite_into_softmax": False}) == ()
    assert suggest.for_nan({**scores, "first_nonfinite_dtype": "float32"}) == ()


def test_the_wrong_numbers_verdict_reads_like_a_hangs():
    from gpulab.chain import verdict

    m = {"first_nonfinite_op": "aten.div.Tensor", "first_nonfinite_cause_kind": "zero_divisor",
         **{k: v for k, v in firstnan.metrics(None).items()}}
    rec = _rec()
    m.update({"first_nonfinite_where": firstnan.where(rec), "first_nonfinite_cause": rec["cause"]["words"],
              "first_nonfinite_made": "NaN", "first_nonfinite_next": firstnan.next_step(rec)})
    nbs = [{"name": n, "status": "ok"} for n in ("01_environment", "02_instrument")]
    v = verdict.judge(nbs, {"02_instrument": {"metrics": m}})
    assert v.verdict == "wrong_numbers"
    assert v.evidence.startswith("the workload first makes NaN in aten.div.Tensor at nan/train.py:23 in main "
                                 "(pass 5): the divisor holds zeros"), v.evidence
    assert v.next_step.startswith("fix the program's line nan/train.py:23 in main: keep the divisor away from 0")
    assert "softmax" not in v.next_step
    # the same NaN made but cleaned, the run's last ops finite: no wrong numbers
    kept = dict(m, first_nonfinite_lasted=False)
    assert verdict.judge(nbs, {"02_instrument": {"metrics": kept}}).verdict == "healthy"


@pytest.mark.parametrize("op,inputs", [
    ("aten.mm.default", [T("float32", (4, 8), min=-1.0, max=1.0), T("float32", (8, 4), min=-1.0, max=1.0)]),
    ("aten.exp.default", [f32(min=-1.0, max=1.0)]),
    ("aten.mul.Tensor", [f32(min=-1.0, max=1.0), f32(min=-1.0, max=1.0)]),
])
def test_nan_from_small_finite_inputs_is_no_overflow(op, inputs):
    """A NaN written into an op's output (a planted fault, a broken kernel) is not blamed on a range the
    operands never came near."""
    c = nancause.cause(op, inputs, out(nan=3))
    assert c.kind == "unknown", c


def test_a_matmul_nan_is_an_overflow_where_the_operands_allow_one():
    a = T("float16", (4, 64), min=-3000.0, max=3000.0)
    c = nancause.cause("aten.mm.default", [a, a], out(nan=3, dtype="float16"))
    assert c.kind == "matmul_overflow", c


def test_nan_from_the_data_points_at_the_data_and_a_nan_the_program_passes_at_its_line():
    data = _rec(op="aten.lift_fresh.default", inputs=[{"scalar": None, "nan": 1}],
                cause={"kind": "input_nan", "input": 0, "words": "input 0 already holds NaN (1 value): no earlier "
                                                                  "op made it: it came in with the data"})
    assert firstnan.whose(data) == "the data: the batch of pass 5 already holds it; check it where it is loaded"
    assert firstnan.next_step(data).startswith("check the data where it is loaded: the batch of pass 5")
    passed = _rec(op="aten.fill_.Scalar", inputs=[None, {"scalar": float("nan"), "nan": 1}],
                  cause={"kind": "input_nan", "input": 1, "words": "input 1 is the number NaN: the program passed it"})
    assert firstnan.whose(passed).startswith("the program's line: fix it there")


def test_a_first_nan_read_after_compiled_code_ran_is_never_blamed_on_the_data_alone():
    """torch.compile'd code runs unrecorded: an input NaN no recorded op made may have been made in its graph.
    The verdict says both, and how to tell them apart (an eager run recorded the same way)."""
    c = nancause.cause("aten.mean.default", [f32(nan=4, min=-1.0, max=1.0)], out(nan=1), first=True, compiled=True)
    assert c.kind == "input_nan" and "made inside a torch.compile'd graph" in c.words and "data" in c.words
    rec = _rec(op="aten.mean.default", inputs=[{"scalar": None, "nan": 4}], compiled=True,
               cause={"kind": "input_nan", "input": 0, "words": c.words})
    assert firstnan.whose(rec).startswith("a torch.compile'd graph or the data, unknown which")
    step = firstnan.next_step(rec)
    assert step.startswith("run it eager (TORCHDYNAMO_DISABLE=1) under `gpulab watch --mode stats`")
    assert "check the data" not in firstnan.whose(rec) and "check the data" in step   # second, if eager says so
    plain = _rec(op="aten.mean.default", inputs=[{"scalar": None, "nan": 4}], compiled=False,
                 cause={"kind": "input_nan", "input": 0, "words": "w"})
    assert firstnan.whose(plain).startswith("the data")


def test_of_a_jobs_processes_the_one_where_an_op_made_the_nan_is_chosen(tmp_path):
    """A rank whose NaN came in from outside (another rank's, through a collective) wrote its record first;
    the rank whose op made it is still the one named; among equals, the first written."""
    import os
    import time

    outside = _rec(op="aten.as_strided.default", cause={"kind": "input_nan", "input": 0, "words": "w"},
                   inputs=[{"scalar": None, "nan": 9}])
    made = _rec()
    firstnan.write(tmp_path / "0.log", outside)
    firstnan.write(tmp_path / "1.log", made)
    old = time.time() - 60
    os.utime(firstnan.path(tmp_path / "0.log"), (old, old))
    log, rec = firstnan.first_of_job([tmp_path / "0.log", tmp_path / "1.log", tmp_path / "2.log"])
    assert log.name == "1.log" and rec["op"] == "aten.div.Tensor"
    firstnan.write(tmp_path / "3.log", made)
    os.utime(firstnan.path(tmp_path / "3.log"), (old, old))
    assert firstnan.first_of_job([tmp_path / "1.log", tmp_path / "3.log"])[0].name == "3.log"
    assert firstnan.first_of_job([tmp_path / "2.log"]) is None


@pytest.mark.parametrize("history, kind", [
    ({"first_pass": 1, "first": 1e4, "last_pass": 20, "last": 1e35}, "growth"),   # ran away over 20 passes
    ({"first_pass": 1, "first": 1e4, "last_pass": 2, "last": 1e35}, "overflow"),  # two passes: one op's own
    ({"first_pass": 1, "first": 1e30, "last_pass": 20, "last": 2e30}, "overflow"),  # large all along
    (None, "overflow"),
])
def test_an_overflow_after_values_grew_pass_after_pass_is_the_runs_divergence(history, kind):
    why = nancause.Cause("overflow", "mse_loss's result exceeds float32's range", None)
    got = nancause.grown(why, "aten.mse_loss.default", "float32", history)
    assert got.kind == kind, got
    if kind == "growth":
        assert "from |x| up to 1e+04 at pass 1 to 1e+35 at pass 20" in got.words and "a training that diverges" in got.words, got
    zero = nancause.Cause("zero_divisor", "the divisor holds zeros", 1)
    assert nancause.grown(zero, "aten.div.Tensor", "float32", history) == zero   # other causes stand


def test_a_tensor_made_of_a_storage_that_holds_nan_came_in_with_the_data():
    """The main process unpickles a DataLoader worker's batch with set_ on a shared-memory storage: the NaN was
    made elsewhere, never by set_ (it had read as 'set made NaN ... in no known way', blamed on Python's queues)."""
    got = nancause.cause("aten.set_.source_Storage_storage_offset", [None, None, T("scalar", scalar=0.0)],
                         T("float32", (8, 32), nan=32), first=True)
    assert got.kind == "input_nan" and got.input is None, got
    assert "a storage that already holds NaN" in got.words and "DataLoader worker's batch" in got.words, got


def test_the_process_whose_op_made_the_nan_is_shown_not_the_one_it_reached(tmp_path):
    root, worker, other = tmp_path / "ops.log", tmp_path / "procs" / "12.log", tmp_path / "procs" / "13.log"
    worker.parent.mkdir()
    came = {"op": "aten.set_.source_Storage_storage_offset", "cause": {"kind": "input_nan", "input": None},
            "inputs": []}
    made = {"op": "aten.div.Tensor", "cause": {"kind": "zero_divisor", "input": 1}, "inputs": []}
    firstnan.write(root, came)
    firstnan.write(worker, made)
    assert firstnan.made_elsewhere(root, [root, worker, other]) == worker
    firstnan.write(root, made)   # the root made its own: it is shown
    assert firstnan.made_elsewhere(root, [root, worker, other]) is None


def test_values_that_grow_until_float16_overflows_say_its_narrow_range():
    why = nancause.Cause("matmul_overflow", "addmm in float16 overflows its narrow range", None)
    got = nancause.grown(why, "aten.addmm.default", "float16",
                         {"first_pass": 1, "first": 3.0, "last_pass": 30, "last": 6.0e4})
    assert got.kind == "growth" and "float16's largest value is 6.55e+04; bfloat16 has float32's range" in got.words, got


def test_an_input_that_is_an_empty_buffers_memory_is_the_allocations_line_not_the_datas():
    alloc = {"op": "aten.empty.memory_format", "call_site": "train.py:12 in step", "pass": 2}
    came = nancause.cause("aten.mul.Tensor", [f32(nan=4), T("scalar", scalar=0.5)], out(nan=4), first=True)
    got = nancause.uninitialized(came, "aten.mul.Tensor", alloc)
    assert (got.kind, got.input, got.at, got.earlier) == ("uninitialized", 0, "train.py:12 in step", False), got
    assert "empty allocated at train.py:12 in step (pass 2), and no PyTorch op wrote it before mul read it" in got.words
    assert "a Triton or CUDA kernel launched directly" in got.words   # what the recorder cannot see may have
    # an update in place (add_) reads the memory it writes: its cause was unknown, the argument it wrote says why
    unknown = nancause.cause("aten.add_.Tensor", [None, f32(min=0.0, max=1.0)], out(nan=4), first=True)
    assert nancause.uninitialized(unknown, "aten.add_.Tensor", alloc, written=0).kind == "uninitialized"
    assert nancause.uninitialized(unknown, "aten.add_.Tensor", alloc) == unknown   # nothing written: it stands
    own = nancause.cause("aten.div.Tensor", [f32(min=1.0, max=2.0), f32(zeros=2, min=0.0, max=0.0)], out(posinf=2))
    assert nancause.uninitialized(own, "aten.div.Tensor", alloc) == own   # the op's own cause stands


def test_a_nan_that_torch_load_read_is_the_checkpoints():
    came = nancause.cause("aten.set_.source_Storage_storage_offset", [None, None, T("scalar", scalar=0.0)],
                          T("float32", (16,), nan=1), first=True)
    got = nancause.loaded(came, "aten.set_.source_Storage_storage_offset", "torch.load")
    assert got.kind == "input_nan" and got.earlier and "what torch.load read from a file" in got.words, got
    own = nancause.cause("aten.div.Tensor", [f32(min=1.0, max=2.0), f32(zeros=2, min=0.0, max=0.0)], out(posinf=2))
    assert nancause.loaded(own, "aten.div.Tensor", "torch.load") == own
    rec = {"op": "aten.set_.source_Storage_storage_offset", "call_site": "train.py:9 in main", "pass": 1,
           "cause": got.to_dict(), "inputs": [None, None, None], "loaded_by": "torch.load", "compiled": True,
           "output": {"nan": 1}}
    # compiled code ran before it: still the checkpoint's (no eager rerun can tell more)
    assert not firstnan.hidden_by_compile(rec)
    assert firstnan.next_step(rec).startswith("the checkpoint that torch.load reads at train.py:9 in main")


@pytest.mark.parametrize("rec,lasted", [
    ({}, True),                                                          # nothing said: it lasted
    ({"finite_after": firstnan.LASTED_OPS}, False),                      # the run's last ops finite
    ({"finite_after": 3}, True),
    ({"finite_after": 3, "weights_finite": {"op": "aten.add_.Tensor"}}, True),    # a NaN loss, finite weights
    ({"finite_after": 500, "weights_finite": {"op": "aten.add_.Tensor"},
      "weights_nan": {"op": "aten.add_.Tensor"}}, True),                 # it reached them after all
    ({"finite_after": 500, "lasted_in": "1234.log"}, True),              # another process's NaN lasted
])
def test_a_nan_lasts_where_it_reaches_the_weights_or_the_run_keeps_making_it(rec, lasted):
    assert firstnan.lasted(rec) is lasted


def test_the_where_gradient_trap_is_said_only_where_backward_made_nan_at_that_op():
    rec = {"op": "aten.div.Tensor", "call_site": "t.py:5 in f", "pass": 1, "file": "/home/u/t.py",
           "output": {"nan": 0, "posinf": 3}, "cause": {"kind": "zero_divisor", "words": "the divisor holds zeros"},
           "selected_by": {"op": "aten.where.self", "call_site": "t.py:5 in f", "pass": 1}}
    assert "where-gradient trap" not in firstnan.next_step(rec)          # the where did its job
    assert "keep the divisor away from 0" in firstnan.next_step(rec)
    trapped = {**rec, "selected_by": {**rec["selected_by"], "backward_nan": "DivBackward0"}}
    step = firstnan.next_step(trapped)
    assert "where-gradient trap: DivBackward0 made NaN/Inf" in step and "torch.where(mask, divisor, 1)" in step, step
