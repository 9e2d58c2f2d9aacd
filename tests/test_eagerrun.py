"""The eager rerun of a crash inside compiled code: reading its end (pure, on stderr as PyTorch writes it), when it
applies, and whose bug its end makes the crash. The real run is test_call_errors' compiled_oob case."""
import pytest

from gpulab.hang import eagerrun, owner

PROG = "/home/u/proj/train.py"
TORCH = "/opt/venv/lib/python3.11/site-packages/torch"
EAGER_CPU = f"""Traceback (most recent call last):
  File "{PROG}", line 47, in <module>
    main()
  File "{PROG}", line 38, in main
    logits = step_fn(batch[:, :-1])
  File "{TORCH}/nn/modules/module.py", line 1789, in _call_impl
    return forward_call(*args, **kwargs)
  File "{PROG}", line 21, in forward
    return self.head(torch.tanh(self.emb(ids)))
  File "{TORCH}/nn/modules/sparse.py", line 189, in forward
    return F.embedding(
  File "{TORCH}/nn/functional.py", line 2615, in embedding
    return torch.embedding(weight, input, padding_idx, scale_grad_by_freq, sparse)
IndexError: index out of range in self
"""
EAGER_CUDA = f"""/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1553: indexSelectSmallIndex: block: [0,0,0], thread: [64,0,0] Assertion `srcIndex < srcSelectDimSize` failed.
Traceback (most recent call last):
  File "{PROG}", line 38, in main
    logits = step_fn(batch[:, :-1])
  File "{PROG}", line 21, in forward
    return self.head(torch.tanh(self.emb(ids)))
  File "{TORCH}/nn/functional.py", line 2615, in embedding
    return torch.embedding(weight, input, padding_idx, scale_grad_by_freq, sparse)
torch.AcceleratorError: CUDA error: device-side assert triggered
"""


@pytest.mark.parametrize("text, cls", [(EAGER_CPU, "out_of_bounds"), (EAGER_CUDA, "device_assert")])
def test_the_eager_end_names_the_programs_line_and_the_ops_error(text, cls):
    r = eagerrun.read(text, 1, False, 6.0)
    assert (r.status, r.cls, r.place) == ("error", cls, "proj/train.py:21 in forward"), r
    assert r.called_from[0] == "proj/train.py:38 in main"
    assert "index out of range" in r.said or "srcIndex < srcSelectDimSize" in r.said, r.said
    fact = r.facts("Torch-Compiled Region: 0/0")[0]
    assert "at proj/train.py:21 in forward, called from proj/train.py:38 in main" in fact, fact


def test_an_eager_run_that_ends_well_or_is_stopped_says_so():
    assert eagerrun.read("", 0, False, 3.0).facts("R")[0].endswith("eager, the same program does not fail")
    stopped = eagerrun.read("", None, True, 90.0, 90.0)
    assert stopped.status == "timeout" and "90 s deadline" in stopped.facts("R")[0]
    assert eagerrun.read("Segmentation fault\n", -11, False).status == "crash"


CRASH = {"status": "crash", "class": None, "in_flight_op": {"name": "aten.mm.default"},
         "open_ops": [{"name": "Torch-Compiled Region: 0/0"}, {"name": "aten.mm.default"}]}


@pytest.mark.parametrize("change, env, applies", [
    ({}, {}, True),                                           # a segfault inside a region: no class
    ({"class": "illegal_address"}, {}, True),
    ({"class": "refused_call"}, {}, False),                   # raised at the program's call: its line is known
    ({"status": "hang"}, {}, False),
    ({"planted": "crash:aten.mm"}, {}, False),                # a self-test's fault is the recorder's to plant
    ({}, {"TORCHDYNAMO_DISABLE": "1"}, False),                # eager already
    ({"open_ops": [], "in_flight_op": {"name": "triton_poi_fused_add_0"}}, {}, True),
    ({"open_ops": []}, {}, False),                            # no compiled code in flight
])
def test_the_rerun_is_for_a_crash_inside_compiled_code_that_names_no_op(change, env, applies):
    assert eagerrun.applies({**CRASH, **change}, env) is applies


def _verdict(rerun):
    return {**CRASH, "in_flight_op": {"name": "Torch-Compiled Region: 0/0", "call_site": "proj/train.py:38 in main"},
            "eager_rerun": rerun.to_dict()}


def test_the_owner_is_the_programs_line_the_eager_run_failed_at():
    who = owner.decide(_verdict(eagerrun.read(EAGER_CPU, 1, False)), {})
    assert who.kind == "program" and who.where.startswith("proj/train.py:21 in forward"), who
    assert "proj/train.py:38 in main" in who.where and "index out of range in self" in who.why, who


def test_a_crash_that_eager_does_not_make_is_torch_compiles():
    who = owner.decide(_verdict(eagerrun.read("", 0, False)), {})
    assert who.kind == "library" and "torch.compile's generated code" in who.where, who
    assert "torch.compiler.disable" in who.program, who


def test_an_eager_run_that_was_stopped_decides_nothing():
    assert owner.eager_owner(_verdict(eagerrun.read("", None, True))) is None


def test_a_triton_kernels_failed_index_check_is_the_programs_at_its_launch():
    """CUDA, no rerun: Inductor's device assert names the bound; the launch's line is the program's call."""
    v = {"status": "crash", "class": "device_assert",
         "in_flight_op": {"name": "triton_poi_fused_embedding_tanh_0", "call_site": "proj/train.py:38 in main"},
         "stderr_tail": "/tmp/torchinductor_u/ab/cab.py:25: triton_poi_fused_embedding_tanh_0: block: [0,0,0], "
                        "thread: [0,0,0] Assertion `index out of bounds: 0 <= tmp2 < 64` failed."}
    who = owner.decide(v, {})
    assert who.kind == "program" and who.where.startswith("proj/train.py:38 in main"), who
    assert "a table of 64 rows" in who.why, who
