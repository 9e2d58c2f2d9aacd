"""Errors a program's own call meets (classify.CALL_CLASSES): PyTorch refusing the arguments, memory running out,
a DataLoader worker dying. Each is the program's (or the platform's limits), named at the program's line, and no
fix scenario is tried on the strength of the op's name: a shape error raised in aten.addmm is no GEMM fault."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab import trace
from gpulab.fixes import answers, registry
from gpulab.hang import classify, collate, freedgraph, inplace, memtrend, owner, verdict

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tests" / "fixtures" / "calls" / "train_errors.py"
TB = ('Traceback (most recent call last):\n  File "/home/u/proj/train.py", line 40, in main\n    out = model(x)\n'
      '  File "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", line 134, in forward\n'
      '    return F.linear(input, self.weight, self.bias)\n')
CUDA_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "79.19 GiB of which 1.21 GiB is free. Including non-PyTorch memory, this process has 77.97 GiB memory in "
            "use. Of the allocated memory 75.11 GiB is allocated by PyTorch, and 2.34 GiB is reserved by PyTorch but "
            "unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
GEMM = {"name": "aten.addmm.default", "shapes": [[10], [8, 64], [63, 10]], "strides": [[1], [64, 1], [1, 63]],
        "dtypes": ["float32"] * 3, "contiguous": [True, True, False], "device": "cuda:0",
        "call_site": "/home/u/proj/train.py:40 in main"}


def _evidence(stderr, status="error", op=None, localized="raised"):
    return classify.Evidence(status=status, in_flight_op=op, stderr_tail=stderr, localized=localized if op else None)


@pytest.mark.parametrize("stderr,op,cls", [
    (TB + "RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x64 and 63x10)", GEMM, "refused_call"),
    (TB + "ValueError: Expected input batch_size (8) to match target batch_size (4).", None, "refused_call"),
    (TB + "TypeError: linear(): argument 'input' (position 1) must be Tensor, not list", None, "refused_call"),
    (TB + "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and "
     "cpu! (when checking argument for argument mat1 in method wrapper_CUDA_addmm)", GEMM, "refused_call"),
    ("Traceback (most recent call last):\n  File \"/home/u/train.py\", line 3, in <module>\n"
     "RuntimeError: expected m1 and m2 to have the same dtype, but got: c10::Half != float", GEMM, "refused_call"),
    (TB + "RuntimeError: false INTERNAL ASSERT FAILED at \"aten/src/ATen/x.cpp\":12, please report a bug to PyTorch.",
     GEMM, "gemm"),
    (TB + "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, ...)`", GEMM,
     "gemm"),
    (TB + CUDA_OOM, GEMM, "out_of_memory"),
    ("RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
     "tried to allocate 70368744177664 bytes. Error code 12 (Cannot allocate memory)", None, "out_of_memory"),
    # torch.compile meets the refusal while it traces with fake tensors (torch 2.13's words, a real run's)
    ('Traceback (most recent call last):\n  File "/home/u/train.py", line 8, in <module>\n'
     '  File "/venv/lib/python3.11/site-packages/torch/_dynamo/variables/builder.py", line 12, in wrap\n'
     "torch._dynamo.exc.TorchRuntimeError: RuntimeError when making fake tensor call\n"
     "  Explanation: Dynamo failed to run FX node with fake tensors: call_function <built-in function linear>(*("
     "FakeTensor(..., size=(8, 32), grad_fn=<GeluBackward0>), Parameter(FakeTensor(..., size=(4, 31), "
     "requires_grad=True))), **{}): got RuntimeError('a and b must have same reduction dim, but got [8, 32] X "
     "[31, 4].')\n", None, "refused_call"),
    ("RuntimeError: DataLoader worker (pid 565) is killed by signal: Killed. ", None, "worker_died"),
    ("RuntimeError: DataLoader worker (pid(s) 81, 82) exited unexpectedly", None, "worker_died"),
])
def test_an_error_at_the_programs_call_is_classed_by_what_it_says_before_the_ops_name(stderr, op, cls):
    assert classify.classify(_evidence(stderr, op=op)).cls == cls


def test_a_refusal_inside_dynamos_disable_wrappers_names_the_optimizers_method_not_the_wrapper():
    """torch.optim's methods run inside torch._dynamo.disable's wrappers (torch/_compile.py `inner`,
    eval_frame.py `_fn`): the words name load_state_dict, which the program called (they had said `_fn`)."""
    site = "/venv/lib/python3.11/site-packages/torch"
    tb = ('Traceback (most recent call last):\n  File "/home/u/train.py", line 17, in <module>\n'
          '    opt.load_state_dict(ck["opt"])\n'
          f'  File "{site}/_compile.py", line 54, in inner\n    return disable_fn(*args, **kwargs)\n'
          f'  File "{site}/_dynamo/eval_frame.py", line 1446, in _fn\n    return fn(*args, **kwargs)\n'
          f'  File "{site}/optim/optimizer.py", line 950, in load_state_dict\n    raise ValueError(\n'
          "ValueError: loaded state dict contains a parameter group that doesn't match the size of optimizer's group")
    assert classify.classify(_evidence(tb)).cls == "refused_call"
    who = owner.decide({"status": "error", "class": "refused_call", "stderr_tail": tb, "in_flight_op": None})
    assert who.kind == "program" and "train.py:17" in who.where, who
    assert "PyTorch's load_state_dict refused" in who.why and "_fn" not in who.why, who.why


INDUCTOR_DIV = (
    'Traceback (most recent call last):\n  File "/home/u/bucket.py", line 14, in <module>\n'
    '    print(step, buckets(pos, width).sum().item(), flush=True)\n'
    '  File "/venv/lib/python3.11/site-packages/torch/_dynamo/eval_frame.py", line 1446, in _fn\n'
    '    return fn(*args, **kwargs)\n  File "/home/u/bucket.py", line 5, in buckets\n    @torch.compile\n'
    '  File "/venv/lib/python3.11/site-packages/torch/_inductor/output_code.py", line 763, in __call__\n'
    '    return self.current_callable(inputs)\n'
    '  File "/tmp/torchinductor_u/dy/cdyede64cgykojxwue3kjxbuv67wkh74rwebyd4t35qn6rwxn44k.py", line 85, in call\n'
    '    cpp_fused_floor_divide_0(arg0_1, arg1_1, buf0)\n'
    'RuntimeError: inductor_cpu_throw_if_integer_div_error, /venv/lib/python3.11/site-packages/torch/include/torch/'
    'csrc/inductor/cpp_prefix.h:827, ZeroDivisionError\n')


@pytest.mark.parametrize("cache", ["/tmp/torchinductor_u", "/scratch/ind"])   # its default folder, or the user's
def test_an_integer_division_by_zero_in_compiled_code_is_the_programs_not_the_generated_files(cache):
    """The file that raised is one torch.compile wrote into its cache: PyTorch's, not the program's (the next step
    had said 'fix it there' at that file's line 85). The program's compiled function is the line, with why."""
    tb = INDUCTOR_DIV.replace("/tmp/torchinductor_u", cache)
    assert owner.origin(f"{cache}/dy/cdyede64cgykojxwue3kjxbuv67wkh74rwebyd4t35qn6rwxn44k.py") == ("library", "PyTorch")
    assert classify.classify(_evidence(tb)).cls == "refused_call"
    who = owner.decide({"status": "error", "class": "refused_call", "stderr_tail": tb, "in_flight_op": None})
    assert who.kind == "program" and who.where.startswith("u/bucket.py:5 in buckets"), who
    assert "the code torch.compile generated refused" in who.why and "a divisor the program passed holds 0" in who.why


def test_the_programs_own_exception_is_no_refusal():
    """A KeyError in the program's own code, or an exception PyTorch did not raise, is no refused call."""
    tb = 'Traceback (most recent call last):\n  File "/home/u/train.py", line 9, in main\n    x = batch["img"]\n'
    assert classify.classify(_evidence(tb + "KeyError: 'img'")).cls == "unknown"
    assert classify.classify(_evidence(tb + "RuntimeError: my own check failed")).cls == "unknown"


def test_out_of_memory_figures_are_read_and_said():
    oom = classify.out_of_memory(CUDA_OOM)
    assert {k: oom[k] for k in ("asked", "total", "free", "allocated", "reserved_unallocated")} == {
        "asked": "2.00 GiB", "total": "79.19 GiB", "free": "1.21 GiB", "allocated": "75.11 GiB",
        "reserved_unallocated": "2.34 GiB"}
    who = owner.decide({"status": "error", "class": "out_of_memory", "in_flight_op": GEMM, "stderr_tail": TB + CUDA_OOM})
    assert who.kind == "program" and who.where.startswith("proj/train.py:40 in main"), who
    assert "asking for 2.00 GiB; PyTorch held 75.11 GiB of 79.19 GiB, 1.21 GiB free, 2.34 GiB reserved" in who.why


@pytest.mark.parametrize("frames,kind,where,words", [
    (TB, "program", "proj/train.py:40 in main (calling aten.addmm.default)", "refused the arguments the program gave"),
    # a library's code made the call for the program: the program's line is where to look, the library named
    ('Traceback (most recent call last):\n  File "/home/u/proj/train.py", line 40, in main\n'
     '  File "/venv/lib/python3.11/site-packages/transformers/models/bert.py", line 88, in forward\n'
     '  File "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", line 134, in forward\n',
     "program", "proj/train.py:40 in main", "that transformers (models/bert.py:88 in forward) made"),
])
def test_a_refused_call_is_the_programs_at_its_own_line(frames, kind, where, words):
    stderr = frames + "RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x64 and 63x10)"
    who = owner.decide({"status": "error", "class": "refused_call", "in_flight_op": GEMM, "localized": "raised",
                        "stderr_tail": stderr})
    assert (who.kind, who.where) == (kind, where) and words in who.why, who


@pytest.mark.parametrize("signal,kind,words", [
    ("Killed", "platform", "out-of-memory killer"),
    ("Bus error", "platform", "/dev/shm"),
    ("Segmentation fault", "unknown", "num_workers=0"),
])
def test_a_dead_worker_is_the_hosts_limit_or_unknown_by_its_signal(signal, kind, words):
    stderr = f"RuntimeError: DataLoader worker (pid 565) is killed by signal: {signal}. "
    who = owner.decide({"status": "error", "class": "worker_died", "stderr_tail": stderr})
    assert who.kind == kind and words in who.why + who.program, who
    # with the worker's own op log read (its last op, still open): the same owner, and where the worker was
    last = {"name": "aten.normal_.default", "call_site": "data.py:40 in __getitem__",
            "process": "DataLoader worker 0 of main"}
    there = owner.decide({"status": "error", "class": "worker_died", "stderr_tail": stderr, "in_flight_op": last})
    assert there.kind == kind and there.where.endswith("(its op log: last in aten.normal_.default at data.py:40 in "
                                                       "__getitem__)"), there


def _suggested(verdict):
    return [m.fix for m in answers.match(registry.load().values(), verdict, {"gpu": "cuda", "device": "cuda"})]


def test_fixes_answer_an_error_at_the_call_only_by_its_class_or_words():
    refused = {"status": "error", "class": "refused_call", "in_flight_op": GEMM, "owner": {"kind": "program"},
               "stderr_tail": "RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x64 and 63x10)"}
    assert _suggested(refused) == []   # the transposed operand is seen, but no layout explains a shape error
    oom = {**refused, "class": "out_of_memory", "stderr_tail": CUDA_OOM}
    assert "alloc_expandable" in _suggested(oom)
    died = {"status": "error", "class": "worker_died", "owner": {"kind": "unknown"},
            "stderr_tail": "RuntimeError: DataLoader worker (pid 5) is killed by signal: Segmentation fault. "}
    assert {"dataloader_no_workers", "dataloader_spawn"} <= set(_suggested(died))
    killed = {**died, "owner": {"kind": "platform"},
              "stderr_tail": "RuntimeError: DataLoader worker (pid 5) is killed by signal: Killed. "}
    assert "dataloader_no_workers" in _suggested(killed) and "dataloader_spawn" not in _suggested(killed)


def _rec(seq, name, shape, site, depth=0):
    return {"seq": seq, "name": name, "args": [{"shape": shape}], "call_site": site, "depth": depth}


def test_the_in_place_op_that_broke_backward_is_read_from_the_op_log():
    msg = ("RuntimeError: one of the variables needed for gradient computation has been modified by an inplace "
           "operation: [torch.FloatTensor [16, 32]], which is output 0 of Sigmoid, is at version 1; expected version "
           "0 instead. Hint: ...")
    recs = [_rec(1, "aten.sigmoid.default", [16, 32], "t.py:5 in f"), _rec(2, "aten.sigmoid.default", [16, 32], "t.py:5 in f"),
            _rec(3, "aten.add_.Tensor", [4], "t.py:6 in f"), _rec(4, "aten.relu_.default", [16, 32], "t.py:7 in f"),
            _rec(5, "aten.clamp_min_.default", [16, 32], "t.py:7 in f", depth=1),
            _rec(6, "autograd::engine::evaluate_function: SigmoidBackward0", [16, 32], "t.py:9 in main")]
    got = inplace.find(msg, recs)
    assert (got["made_by"], got["made_at"]) == ("aten.sigmoid.default", "t.py:5 in f")
    assert got["changed_by"] == [{"op": "aten.relu_.default", "at": "t.py:7 in f"}]
    assert inplace.find(msg, recs[:3] + recs[5:]) is None   # no in-place op on that shape: nothing is claimed
    assert inplace.find("RuntimeError: something else", recs) is None


def _watch(case, tmp_path):
    out = tmp_path / case
    r = subprocess.run([sys.executable, "-m", "gpulab", "watch", "--quiet", "--status-every", "0", "--out", str(out),
                        "--", "python", str(PROGRAM), case], capture_output=True, text=True, timeout=240, cwd=ROOT)
    return r, json.loads((out / "verdict.json").read_text())


def _line(mark):
    return next(n for n, text in enumerate(PROGRAM.read_text().splitlines(), 1) if text.rstrip().endswith(mark))


@pytest.mark.parametrize("case,cls,kind,where,step", [
    ("shape", "refused_call", "program", "calls/train_errors.py:{SHAPE} in main (calling aten.addmm.default)",
     "mat1 and mat2 shapes cannot be multiplied (16x32 and 31x4)"),
    ("inplace", "refused_call", "program", "calls/train_errors.py:{INPLACE} in forward (calling aten.relu_.default)",
     "tensor that aten.sigmoid.default made at calls/train_errors.py:{SIGMOID} in forward"),
    ("oom", "out_of_memory", "program", "calls/train_errors.py:{OOM} in main (calling aten.empty.memory_format)",
     "memory ran out at the program's call asking for 4.00 PiB"),
    # PyTorch says "killed by signal: Killed" when its SIGCHLD handler sees the death first, else "exited
    # unexpectedly" (no signal known): the host's limit in the first case, unknown in the second
    ("ckpt", "refused_call", "program", "calls/train_errors.py:{CKPT} in main",
     "PyTorch's load_state_dict refused the arguments the program gave it (RuntimeError: Error(s) in loading "
     "state_dict for Sequential: size mismatch for 0.weight"),
    # an op that raised inside the program's try/except is not the failure: the program's own KeyError is
    ("caught", "unknown", "program", "calls/train_errors.py:{CAUGHT} in main", "KeyError: 'large'"),
    # raised at backward(), made where gradients were off: the call is named with what to look for before it
    ("nograd", "refused_call", "program", "calls/train_errors.py:{BACKWARD} in main (backward() of a tensor with no "
                                          "graph)", "computed with gradients off (inside torch.no_grad()"),
    # torch.load's weights_only default (2.6) refuses a numpy array in the checkpoint: the load line, and why now
    ("weights", "refused_call", "program", "calls/train_errors.py:{WEIGHTS} in main (torch.load, whose weights_only",
     "torch.load(..., weights_only=False)"),
    # raised in multiprocessing's pickling, below PyTorch's DataLoader: no op raised it (the .item() before it
    # had been named, as a sync), and the lambda is the program's to move
    ("spawn", "unknown", "program", "calls/train_errors.py:{LOADER} in main (starting the DataLoader's worker",
     "define it at module level"),
    # float64 samples from the third batch on: the model's line met two dtypes on its fifth addmm (two Linear layers
    # a step at that line); the input is to change, where it is made
    ("float64", "refused_call", "program", "calls/train_errors.py:{SHAPE} in main (a call that met tensors of two "
                                           "dtypes)", "it was the 5th call of aten.addmm.default from"),
    # a checkpoint of the DDP-wrapped model: every key with `module.` in front
    ("prefix", "refused_call", "program", "calls/train_errors.py:{PREFIX} in main (load_state_dict of keys saved",
     "consume_prefix_in_state_dict_if_present(state, 'module.')"),
    # torch.save into a folder that does not exist raises outside any op: the detach it ran at that line before is
    # not named (a recorder that marks raised ops marked none)
    ("save", "refused_call", "program", "calls/train_errors.py:{SAVE} in main",
     "PyTorch's save refused the arguments the program gave it (RuntimeError: Parent directory runs/no-such-folder "
     "does not exist."),
    # autograd refuses what the program's autograd.Function returned from backward, raised at loss.backward(): the
    # line to change is that backward, found in the program's sources by its class
    ("fngrads", "refused_call", "program", "calls/train_errors.py:{FNGRADS} (ScaledSigmoid.backward",
     "its backward returns 1 gradient(s) where forward takes 2 input(s)"),
    # the same for a gradient hook of the program's: the hook, not backward()'s line (nor "the 4th call" of
    # AccumulateGrad, which is the 4th parameter of one backward)
    ("hook", "refused_call", "program", "calls/train_errors.py:{HOOK} (clip_grad, a hook the program registered)",
     "a gradient hook returns None (to keep the gradient) or a tensor of the same shape"),
    ("worker", "worker_died", ("platform", "unknown"), "DataLoader worker (pid ", ("out-of-memory killer",
                                                                               "num_workers=0")),
])
def test_a_real_loop_ending_in_its_own_calls_error_is_named_at_its_line(case, cls, kind, where, step, tmp_path):
    marks = {"SHAPE": _line("# SHAPE"), "INPLACE": _line("# INPLACE"), "OOM": _line("# OOM: 4 PiB, past any address space"),
             "SIGMOID": _line("# INPLACE") - 1, "CKPT": _line("# CKPT"), "CAUGHT": _line("# CAUGHT"),
             "BACKWARD": _line("# BACKWARD"), "WEIGHTS": _line("# WEIGHTS"), "LOADER": _line("# LOADER"),
             "PREFIX": _line("# PREFIX"), "SAVE": _line("# SAVE"), "FNGRADS": _line("# FNGRADS"),
             "HOOK": _line("# HOOK")}
    r, v = _watch(case, tmp_path)
    assert r.returncode != 0 and v["class"] == cls, (v["class"], v["evidence"])
    if case == "save" and trace.read(tmp_path / case / "ops.log").raise_marks is False:
        # a build where no raise is seen (neither in flight nor by missing outputs): the last op at the line (the
        # detach torch.save ran) is named, and the verdict says it guessed
        assert "this PyTorch build's ops are not marked when they raise" in " ".join(v["notes"]), v["notes"]
        return
    where = where.format(**marks)
    if v["localized"] != "raised":   # the op is named where the recorder saw it raise (torch 2.11's did not, once)
        where = where.split(" (calling ")[0]
    if isinstance(kind, tuple):
        killed = "killed by signal: Killed" in v["stderr_tail"]
        kind, step = (kind[0], step[0]) if killed else (kind[1], step[1])
    assert v["owner"]["kind"] == kind and v["owner"]["where"].startswith(where), v["owner"]
    assert not (v.get("memory_trend") or {}).get("grew"), v["memory_trend"]   # one huge buffer is no leak
    told = r.stdout.split("next step: ", 1)[1] if "next step: " in r.stdout else v["owner"]["why"]
    assert step.format(**marks) in told, r.stdout
    assert not v["suggested"] or case == "worker", v["suggested"]   # nothing tried on the op's name alone
    if case == "float64":   # the meaning too: where the float64 came from
        assert "float64 comes from numpy arrays" in told, told
    if case in ("ckpt", "caught", "weights", "spawn", "prefix", "save"):
        assert v["in_flight_op"] is None, v["in_flight_op"]   # no op ended the program
    if case == "worker":   # the dead worker's own op log: the Dataset's line it last ran an op at
        assert v["culprit"].startswith("DataLoader worker") and "__getitem__" in v["owner"]["where"], v["owner"]
        assert classify.WORKER_PLACE_UNSEEN not in v["evidence"]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_an_index_past_the_table_inside_compiled_code_is_named_by_its_eager_rerun(device, tmp_path):
    """Token ids past the embedding's vocabulary under torch.compile: the generated kernel ends the process with
    no Python traceback (torch 2.13's CPU kernel aborts at its own bound check, 2.11's segfaults: no check; CUDA's
    device-asserts). The eager rerun names the op's line, the embedding's, called from the compiled call (it had
    been 'unknown': no rule; on CUDA torch.compile's)."""
    program = ROOT / "tests" / "fixtures" / "calls" / "compiled_oob.py"
    out = tmp_path / "w"
    r = subprocess.run([sys.executable, "-m", "gpulab", "watch", "--quiet", "--status-every", "0", "--out", str(out),
                        "--", "python", str(program), device], capture_output=True, text=True, timeout=300, cwd=ROOT)
    v = json.loads((out / "verdict.json").read_text())
    lines = program.read_text().splitlines()
    step, embed = (next(n for n, t in enumerate(lines, 1) if t.rstrip().endswith(mark)) for mark in ("# STEP", "# EMBED"))
    assert r.returncode != 0 and v["status"] in ("crash", "error"), v["evidence"]
    assert v["class"] in ("out_of_bounds", "device_assert"), (v["class"], v["evidence"])
    er = v["eager_rerun"]
    assert er["status"] == "error" and er["place"] == f"calls/compiled_oob.py:{embed} in forward", er
    assert er["called_from"][0] == f"calls/compiled_oob.py:{step} in main", er
    assert (out / er["stderr"]).is_file()
    assert v["owner"]["kind"] == "program", v["owner"]
    assert v["owner"]["where"].startswith(f"calls/compiled_oob.py:{embed} in forward"), v["owner"]
    assert f"compiled_oob.py:{step} in main" in v["owner"]["where"], v["owner"]


@pytest.mark.parametrize("case", ["keep", "level"])
def test_a_process_killed_by_sigkill_as_its_memory_climbed_is_the_hosts_out_of_memory_killer(case, tmp_path):
    """No traceback, no op in flight: only the climb of the recorder's memory samples says who sent the SIGKILL
    (the verdict had been 'unknown: no rule matched'). At level memory a SIGKILL says nothing of who sent it."""
    program = ROOT / "tests" / "fixtures" / "calls" / "host_oom.py"
    out = tmp_path / "w"
    r = subprocess.run([sys.executable, "-m", "gpulab", "watch", "--quiet", "--status-every", "0", "--out", str(out),
                        "--", "python", str(program), case], capture_output=True, text=True, timeout=240, cwd=ROOT)
    v = json.loads((out / "verdict.json").read_text())
    assert v["status"] == "crash" and "killed by SIGKILL" in " ".join(v["evidence"]), v["evidence"]
    if case == "level":
        assert v["class"] == "unknown" and v["owner"]["kind"] == "unknown", (v["class"], v["owner"])
        return
    assert v["class"] == "out_of_memory" and v["owner"]["kind"] == "program", (v["class"], v["owner"])
    assert "out-of-memory killer" in v["owner"]["why"] and "rose in every fifth of the run" in v["owner"]["why"]
    assert "keeps tensors alive across steps" in r.stdout.split("next step: ", 1)[1], r.stdout


def test_a_rank_killed_by_sigkill_as_its_memory_climbed_is_named_with_the_out_of_memory_killer(tmp_path):
    """torchrun's first observed failure is rank 1's exit code -9, and no rank left a traceback (its peer only lost
    its connection): the rank is named from torchrun's words, and its own op log's memory samples say who sent it
    (the verdict had been 'unknown', at torchrun's launch_agent)."""
    program = ROOT / "tests" / "fixtures" / "calls" / "ddp_host_oom.py"
    out = tmp_path / "w"
    r = subprocess.run([sys.executable, "-m", "gpulab", "watch", "--quiet", "--status-every", "0", "--out", str(out),
                        "--", "torchrun", "--standalone", "--nproc-per-node", "2", str(program)],
                       capture_output=True, text=True, timeout=240, cwd=ROOT,
                       env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"})
    v = json.loads((out / "verdict.json").read_text())
    assert v["status"] == "crash" and v["class"] == "out_of_memory" and v["culprit"] == "rank 1/2", \
        (v["status"], v["class"], v["evidence"])
    assert v["owner"]["kind"] == "program" and v["owner"]["where"].startswith("rank 1/2: "), v["owner"]
    assert "out-of-memory killer" in v["owner"]["why"] and "rose in every fifth of the run" in v["owner"]["why"]


def test_torchruns_first_observed_failure_by_a_signal_is_read_with_its_rank():
    said = ("Failures:\n[1]:\n  time      : 2026-11-30_01:52:33\n  host      : localhost\n  rank      : 0 (local_rank: "
            "0)\n  exitcode  : -15 (pid: 1851)  (SIGTERM)\n  error_file: <N/A>\n---\nRoot Cause (first observed "
            "failure):\n[0]:\n  time      : 2026-11-30_01:52:33\n  host      : localhost\n  rank      : 1 (local_rank: "
            "1)\n  exitcode  : -9 (pid: 1852)  (SIGKILL)\n  error_file: <N/A>\n")
    assert classify.root_signal(said) == (1, "SIGKILL")
    assert classify.root_signal(said.replace("-9 (pid: 1852)  (SIGKILL)", "1 (pid: 1852)")) is None   # an exception
    # torch 2.11 (an H200 run): no name after the exit code; the traceback line says the signal
    older = said.replace("-9 (pid: 1852)  (SIGKILL)\n  error_file: <N/A>\n", "-9 (pid: 1852)\n  error_file: <N/A>\n"
                         "  traceback : Signal 9 (SIGKILL) received by PID 1852\n")
    assert older != said and classify.root_signal(older) == (1, "SIGKILL")
    assert classify.root_signal(older.replace("-9 (pid: 1852)", "<N/A>")) == (1, "SIGKILL")   # the traceback alone


@pytest.mark.parametrize("case", ["tensor", "killed"])
def test_a_tensor_whose_sender_ended_before_it_was_received_is_named_at_the_programs_get(tmp_path, case):
    """torch.multiprocessing sends a tensor as a handle its sender serves: the parent joins the child, then get()s,
    and multiprocessing raises ConnectionRefusedError under PyTorch's rebuild_storage_fd. The program's get() is
    the line (its order of get and join), not 'unknown: no stack names the code'. A sender killed after its put()
    is said first: the error at get() only reports it."""
    program = ROOT / "tests" / "fixtures" / "calls" / "queue_join.py"
    out = tmp_path / "w"
    r = subprocess.run([sys.executable, "-m", "gpulab", "watch", "--quiet", "--status-every", "0", "--out", str(out),
                        "--", "python", str(program), case], capture_output=True, text=True, timeout=240, cwd=ROOT)
    v = json.loads((out / "verdict.json").read_text())
    get = next(n for n, t in enumerate(program.read_text().splitlines(), 1) if t.rstrip().endswith("# GET"))
    assert r.returncode != 0 and v["status"] == "error", v["evidence"]
    assert v["owner"]["kind"] == "program", v["owner"]
    assert v["owner"]["where"].startswith(f"calls/queue_join.py:{get} in "), v["owner"]
    assert "get() from the queue before join()ing" in v["owner"]["why"] and "rebuild_storage_fd" in v["owner"]["why"]
    killed = "had ended (killed or exited without a word)" in v["owner"]["why"]
    assert killed == (case == "killed"), v["owner"]["why"]


@pytest.mark.parametrize("tail,found", [
    ("  File \"/t/torch/multiprocessing/reductions.py\", line 538, in rebuild_storage_fd\n    fd = df.detach()\n"
     "ConnectionRefusedError: [Errno 111] Connection refused", "a file descriptor the sender serves"),
    ("  File \"/t/torch/multiprocessing/reductions.py\", line 520, in rebuild_storage_filename\n"
     "FileNotFoundError: [Errno 2] No such file or directory: '/torch_123_456'", "a shared-memory file"),
    ("  File \"/t/torch/multiprocessing/reductions.py\", line 538, in rebuild_storage_fd\n"
     "RuntimeError: unable to mmap 1024 bytes", None),             # another failure of the same rebuild
    ("  File \"/t/net.py\", line 3, in fetch\nConnectionRefusedError: [Errno 111] Connection refused", None),
    ("  File \"/t/torch/utils/data/dataloader.py\", line 1176, in __init__\n    w.start()\n  File \"/py/multiprocessing/"
     "reduction.py\", line 60, in dump\nAttributeError: Can't pickle local object 'main.<locals>.<lambda>'",
     "cannot be pickled"),
])
def test_a_shared_tensors_gone_sender_is_read_from_the_rebuild_and_the_error(tail, found):
    from gpulab.hang import sharing
    got = sharing.meaning("Traceback (most recent call last):\n" + tail)
    assert (got is None) if found is None else (found in got[1] and ("get() from the queue" in got[1]
                                                                     or "module level" in got[1]))


@pytest.mark.parametrize("state,words", [
    ("ended (killed or exited without a word)", "host's out-of-memory killer for one"),
    ("exited after an uncaught KeyError: 'label'", "had exited after an uncaught KeyError: 'label' before"),
    ("exited", None),   # a producer that ended well: the order of get() and join() is the whole story
])
def test_a_shared_tensors_sender_that_ended_badly_is_said_first(state, words):
    """The receiver's ConnectionResetError only reports that the producer is gone: how it ended (killed without a
    word, its own exception) is the failure to look at first."""
    from gpulab.hang import sharing
    procs = [{"role": "main (pid 1)", "kind": "main", "state": "exited"},
             {"role": "multiprocessing child (pid 7 of pid 1)", "kind": "process", "state": state}]
    got = sharing.sender_gone(procs)
    assert got is None if words is None else (words in got and got.startswith("multiprocessing child (pid 7")), got


def test_a_ddp_job_waiting_in_the_rendezvous_is_the_launch_not_pytorch():
    py = [("_create_c10d_store", "/v/site-packages/torch/distributed/rendezvous.py", "199"),
          ("init_process_group", "/v/site-packages/torch/distributed/distributed_c10d.py", "1892"),
          ("<module>", "/w/train.py", "9")]
    o = owner.rendezvous_wait(py)
    assert o.kind == "program" and o.where.startswith("w/train.py:9 in <module> (init_process_group") and \
        "torchrun" in o.why
    assert owner.rendezvous_wait(py[1:]) is None                                  # past the rendezvous
    assert owner.rendezvous_wait(py[:2]) is None                                  # no line of the program's
    assert owner.rendezvous_wait([("rendezvous", "/w/mylib.py", "3"), py[2]]) is None   # a rendezvous of its own


def test_torch_loads_weights_only_refusal_says_why_now_and_its_escapes_are_dropped():
    from gpulab.hang import refusals
    tail = ("_pickle.UnpicklingError: Weights only load failed. This file can still be loaded, \x1b[1mdo those "
            "steps only if you trust the source\x1b[0m.\n\tWeightsUnpickler error: Unsupported global: GLOBAL "
            "numpy._core.multiarray._reconstruct was not an allowed global by default.")
    at, said = refusals.meaning(tail)
    assert at.startswith("torch.load") and "add_safe_globals([numpy._core.multiarray._reconstruct])" in said
    kind, msg = classify.refused(tail)
    assert kind == "_pickle.UnpicklingError" and "\x1b" not in msg and "do those steps" in msg


def test_a_program_asking_for_cuda_where_pytorch_has_none_is_the_platforms_answer_at_its_line():
    tb = ("Traceback (most recent call last):\n  File \"/w/train.py\", line 2, in <module>\n    m.to('cuda')\n"
          "  File \"/v/site-packages/torch/cuda/__init__.py\", line 522, in _lazy_init\n"
          "    raise AssertionError(\"Torch not compiled with CUDA enabled\")\n"
          "AssertionError: Torch not compiled with CUDA enabled")
    o = owner.decide({"status": "error", "class": "unknown", "stderr_tail": tb, "in_flight_op": None})
    assert o.kind == "platform" and o.where.startswith("w/train.py:2 in <module> (asking for a GPU"), o
    assert "device='cpu'" in o.why


def test_an_error_raised_in_pytorchs_python_with_no_op_is_placed_there_and_its_owner_unknown():
    tb = ("Traceback (most recent call last):\n  File \"/w/train.py\", line 9, in main\n    load(x)\n"
          "  File \"/v/site-packages/torch/serialization.py\", line 800, in load\n    raise OSError('bad')\n"
          "OSError: bad")
    o = owner.decide({"status": "error", "class": "unknown", "stderr_tail": tb, "in_flight_op": None})
    assert o.kind == "unknown" and o.where == "PyTorch (torch/serialization.py:800 in load), called at w/train.py:9 in "\
        "main", o
    assert "not in the evidence" in o.why


COLLATE = ROOT / "tests" / "fixtures" / "calls" / "collate_sizes.py"


def test_what_a_refusal_means_is_read_from_pytorchs_own_message():
    from gpulab.hang import refusals
    at, said = refusals.meaning("RuntimeError: element 0 of tensors does not require grad and does not have a "
                                "grad_fn")
    assert at.startswith("backward()") and "torch.no_grad()" in said
    ddp = ("RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. "
           "This error indicates that your module has parameters that were not used in producing loss.\n"
           "[rank1]: Parameter indices which did not receive grad for rank 1: 4 5\n")
    assert "indices 4 5 of model.parameters() on rank 1" in refusals.meaning(ddp)[1]
    named = ddp + "Parameters which did not receive grad for rank 1: aux.bias, aux.weight\n"
    assert "aux.bias aux.weight on rank 1" in refusals.meaning(named)[1]
    assert refusals.meaning("RuntimeError: mat1 and mat2 shapes cannot be multiplied") is None
    # the reentrant checkpoint's own warning, before the refusal it leads to, names the call that cut the graph
    warned = ("/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py:238: UserWarning: None of the inputs have "
              "requires_grad=True. Gradients will be None\n  check_backward_validity(args)\nTraceback (most recent "
              "call last):\nRuntimeError: element 0 of tensors does not require grad and does not have a grad_fn")
    at, said = refusals.meaning(warned)
    assert "torch.utils.checkpoint warned" in at and "use_reentrant=False" in said, said
    at, said = refusals.meaning("RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central "
                                "directory. This is an internal miniz error.")
    assert at.startswith("torch.load of a file that is not a whole checkpoint") and "os.replace()" in said, said
    at, said = refusals.meaning("RuntimeError: ZeroDivisionError")
    assert at == "an integer division by zero" and "clamp(min=1)" in said


@pytest.mark.parametrize("message,words", [
    ("RuntimeError: mat1 and mat2 must have the same dtype, but got Double and Float", "float64 comes from numpy"),
    ("RuntimeError: expected m1 and m2 to have the same dtype, but got: double != float", "float64 comes from numpy"),
    ("RuntimeError: Input type (double) and bias type (float) should be the same", "float64 comes from numpy"),
    ("RuntimeError: Input type (torch.cuda.HalfTensor) and weight type (torch.cuda.FloatTensor) should be the same",
     "one operand is float16, the other float32: a model cast"),
    ("RuntimeError: expected scalar type Float but found BFloat16", "one operand is float32, the other bfloat16"),
])
def test_two_dtypes_in_one_call_say_where_the_odd_one_comes_from(message, words):
    from gpulab.hang import refusals
    at, said = refusals.meaning(message)
    assert at == "a call that met tensors of two dtypes" and words in said


@pytest.mark.parametrize("missing,unexpected,words", [
    ('"body.0.weight", "body.0.bias"', '"module.body.0.weight", "module.body.0.bias"', "model.module), or strip"),
    ('"_orig_mod.a.weight"', '"a.weight"', "load it into the unwrapped model (model._orig_mod)"),
    ('"b.weight"', '"a.weight"', None),                  # other names: no prefix explains them
    ('"a.weight", "b.weight"', '"module.a.weight"', None),   # a key the checkpoint lacks altogether
])
def test_state_dict_keys_that_differ_by_a_wrappers_prefix_name_the_wrapper(missing, unexpected, words):
    from gpulab.hang import refusals
    text = (f"RuntimeError: Error(s) in loading state_dict for Net:\n\tMissing key(s) in state_dict: {missing}. \n"
            f"\tUnexpected key(s) in state_dict: {unexpected}. ")
    got = refusals.meaning(text)
    assert (got is None) if words is None else (words in got[1]), got


@pytest.mark.parametrize("nth,words", [(1, "the first call of aten.mm.default from t.py:3 in f"),
                                       (2, "the 2nd call of aten.mm.default from t.py:3 in f: the 1 before"),
                                       (13, "the 13th call"), (23, "the 23rd call")])
def test_the_call_of_the_op_from_its_line_says_whether_the_line_ran_it_before(nth, words):
    from gpulab.hang import verdict
    recs = [{"seq": i, "name": "aten.mm.default" if i % 2 else "aten.add.Tensor", "call_site": "t.py:3 in f"}
            for i in range(1, 2 * nth + 1)]
    last_mm = recs[-2]
    assert verdict.line_pass(recs, last_mm) == nth and verdict.line_pass(recs, {"seq": 5, "name": "x"}) is None
    assert words in owner.pass_words(last_mm, nth)


@pytest.mark.parametrize("workers,where", [
    # in the main process the Dataset's ops carry the loop's line (they run inside its fetch): the loop is named
    (0, "calls/collate_sizes.py:{LOOP} in main"),
    # in a worker they carry the Dataset's own line, read from that worker's op log
    (2, "calls/collate_sizes.py:{TOKENS} in __getitem__"),
])
def test_samples_the_default_collate_cannot_stack_are_the_datasets_not_a_refused_call_at_the_loop(workers, where,
                                                                                                  tmp_path):
    """'stack expects each tensor to be equal size' raised in torch's collate.py: the Dataset's samples differ in
    size. In a worker, PyTorch raises it again in the main process as 'Caught RuntimeError in DataLoader worker
    process N': the worker's own op log names the op and the sizes (it was 'unknown')."""
    lines = COLLATE.read_text().splitlines()
    marks = {k: next(n for n, t in enumerate(lines, 1) if t.endswith(f"# {k}")) for k in ("LOOP", "TOKENS")}
    out = tmp_path / "w"
    r = subprocess.run([sys.executable, "-m", "gpulab", "watch", "--quiet", "--status-every", "0", "--out", str(out),
                        "--", "python", str(COLLATE), str(workers)], capture_output=True, text=True, timeout=240,
                       cwd=ROOT)
    v = json.loads((out / "verdict.json").read_text())
    assert r.returncode != 0 and v["class"] == "refused_call", (v["class"], v["evidence"])
    assert v["in_flight_op"]["name"].startswith("aten.stack"), v["in_flight_op"]
    assert v["collate"]["shapes"][:2] == [[10], [11]] and v["collate"]["samples"] == 8, v["collate"]
    if workers:
        assert v["culprit"] == v["in_flight_op"]["process"] == v["collate"]["worker"] == "DataLoader worker 1 of main"
    assert v["owner"]["kind"] == "program" and v["owner"]["where"].startswith(where.format(**marks)), v["owner"]
    assert "pad_sequence" in v["owner"]["why"] and "samples of different sizes" in v["owner"]["why"], v["owner"]
    assert not v["suggested"], v["suggested"]


def test_a_workers_own_exception_is_read_from_its_traceback_and_a_stdlib_site_is_no_programs():
    worker_tb = ('Traceback (most recent call last):\n  File "/p/train.py", line 21, in main\n'
                 '    for x in loader:\n'
                 'RuntimeError: Caught RuntimeError in DataLoader worker process 3.\n'
                 'Original Traceback (most recent call last):\n'
                 '  File "/v/site-packages/torch/utils/data/_utils/collate.py", line 275, in collate_tensor_fn\n'
                 '    return torch.stack(batch, 0, out=out)\n'
                 'RuntimeError: stack expects each tensor to be equal size, but got [3] at entry 0 and [4] at entry 1\n')
    got = classify.worker_raised(worker_tb)
    assert got["worker"] == 3 and got["traceback"].startswith("Traceback") and "collate.py" in got["traceback"]
    assert classify.call_class(_evidence(worker_tb))[0] == "refused_call"
    # the program's own exception in a worker is no refusal: its line is the owner (traceback_frames)
    own = worker_tb.replace("/v/site-packages/torch/utils/data/_utils/collate.py", "/p/data.py")
    assert classify.call_class(_evidence(own)) is None
    assert classify.worker_raised("DataLoader worker (pid 12) is killed by signal: Killed.") is None
    assert not owner.program_site("multiprocessing/process.py:108 in run")
    assert not owner.program_site("python3.11/runpy.py:88 in _run_code")
    assert owner.program_site("train.py:13 in __getitem__") and owner.program_site("test/data.py:3 in load")
    # a tail that begins inside a long traceback still has its frames
    assert owner.traceback_frames('  File "/p/train.py", line 9, in main\n    f()\nValueError: x')[0][1] == "/p/train.py"
    rec = {"seq": 9, "name": "aten.stack.default", "args": [{"value": "L8"}, {"shape": [3]}, {"shape": [4]}]}
    found = collate.find(worker_tb, [{"seq": 8, "name": "aten.randint.low", "call_site": "train.py:13 in get"}], rec,
                         mine=owner.program_site)
    assert found == {"op": "aten.stack.default", "shapes": [[3], [4]], "samples": 8, "made_at": "train.py:13 in get",
                     "worker": None}
    assert "[3] x [4], the first 2 of 8" in collate.words(found)
    assert collate.find(own, [], rec, mine=owner.program_site) is None   # not the default collate's


@pytest.mark.parametrize("marked", [True, False])
def test_the_op_a_worker_raised_in_is_the_one_its_last_line_calls_marked_raised_or_left_open(marked):
    """A worker goes on to its next batch after one fails, and the job's stop leaves an op open: the op the
    traceback's last line calls is chosen; where the recorder marks no raised op (torch 2.11's CUDA wheel), the
    op that raised is one that never ended."""
    from types import SimpleNamespace as R

    from gpulab.hang.watchdog import evidence
    tb = classify.worker_raised('Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most '
                                'recent call last):\n  File "/v/torch/utils/data/_utils/collate.py", line 275, in f\n'
                                '    return torch.stack(batch, 0, out=out)\nRuntimeError: stack expects\n')["traceback"]
    recs = [R(seq=1, name="aten.randint.low", raised=False, t_end=1.0, kind="op"),
            R(seq=2, name="aten.resize_.default", raised=False, t_end=2.0, kind="op"),
            R(seq=3, name="aten.stack.out", raised=marked, t_end=3.0 if marked else None, kind="op"),
            R(seq=4, name="aten.randint.low", raised=False, t_end=4.0, kind="op"),
            R(seq=5, name="aten.resize_.default", raised=marked, t_end=None, kind="op")]   # open at the stop
    assert evidence._raised_for(recs, tb).seq == 3


TWO = ROOT / "tests" / "fixtures" / "calls" / "two_backwards.py"


@pytest.mark.parametrize("case,owner_at,words", [
    # the state's line is the program's to change: its older node is what backward met
    ("carried", "calls/two_backwards.py:{STATE} in carried (making the TanhBackward0 node backward met again)",
     "a state carried across steps"),
    # under torch.compile backward meets the compiled region's one node: the region's call is the line
    ("compiled", "calls/two_backwards.py:{COMPILED_STATE} in compiled (making the CompiledFunctionBackward node "
                 "backward met again)", "the torch.compile'd region that made it ran"),
    # the generator's batch, shared by two losses: its line is among the candidates, the owner stays at the call
    ("shared", "calls/two_backwards.py:{G_BACKWARD} in shared", "calls/two_backwards.py:{FAKE} in shared"),
])
def test_a_backward_through_a_freed_graph_names_the_forward_line_not_retain_graph(case, owner_at, words, tmp_path):
    """autograd's 'backward through the graph a second time' suggests retain_graph=True; the op log says which
    forward line's node was met again, and whether that line ran since the backward() before (a carried state)
    or not (a tensor two losses share)."""
    lines = TWO.read_text().splitlines()
    marks = {"STATE": next(n for n, t in enumerate(lines, 1) if t.endswith("# STATE")),
             "COMPILED_STATE": next(n for n, t in enumerate(lines, 1) if t.endswith("# COMPILED_STATE")),
             "FAKE": next(n for n, t in enumerate(lines, 1) if t.endswith("# FAKE")),
             "G_BACKWARD": next(n for n, t in enumerate(lines, 1) if t.strip() == "g_loss.backward()")}
    out = tmp_path / case
    r = subprocess.run([sys.executable, "-m", "gpulab", "watch", "--quiet", "--status-every", "0", "--out", str(out),
                        "--", "python", str(TWO), case], capture_output=True, text=True, timeout=240, cwd=ROOT)
    v = json.loads((out / "verdict.json").read_text())
    assert r.returncode != 0 and v["class"] == "refused_call", (v["class"], v["evidence"])
    freed = v["freed_graph"]
    assert freed is not None and freed["backward_call"] == 2, v["evidence"]
    assert v["owner"]["kind"] == "program" and v["owner"]["where"] == owner_at.format(**marks), v["owner"]
    said = next(e for e in v["evidence"] if e.startswith("from the op log: backward()"))
    assert words.format(**marks) in said and "retain_graph=True would keep" in said, said


def test_the_freed_graph_reader_tells_a_carried_state_from_a_shared_tensor():
    rec = lambda seq, name, at: {"seq": seq, "name": name, "call_site": at}   # noqa: E731
    bwd = "autograd::engine::evaluate_function: "
    msg = "RuntimeError: Trying to backward through the graph a second time (or directly access ...)"
    carried = [rec(1, "aten.tanh.default", "t.py:5 in f"), rec(2, bwd + "TanhBackward0", "t.py:7 in f"),
               rec(3, "aten.tanh.default", "t.py:5 in f"), rec(4, bwd + "TanhBackward0", "t.py:7 in f"),
               rec(5, bwd + "TanhBackward0", "t.py:7 in f")]
    got = freedgraph.find(msg, carried, carried[-1])
    assert got["how"] == "carried" and got["made_at"] == [("t.py:5 in f", 2, 1)] and got["backward_call"] == 2, got
    # torch 2.11's CUDA wheels mark no engine node as raised (no in-flight op): the log's last node is the one met
    assert freedgraph.find(msg, carried, None) == got
    assert freedgraph.find(msg, [r for r in carried if "Backward" not in r["name"]], None) is None
    # made before the first backward(), not since: shared; a line that ran since makes fresh nodes and is left out
    shared = [rec(1, "aten.addmm.default", "g.py:3 in f"), rec(2, bwd + "AddmmBackward0", "g.py:4 in f"),
              rec(3, "aten.addmm.default", "g.py:5 in f"), rec(4, bwd + "AddmmBackward0", "g.py:6 in f"),
              rec(5, bwd + "AddmmBackward0", "g.py:6 in f")]
    got = freedgraph.find(msg, shared, shared[-1])
    assert got["how"] == "shared" and [m[0] for m in got["made_at"]] == ["g.py:3 in f"], got
    assert freedgraph.find("RuntimeError: other", carried, carried[-1]) is None
    assert freedgraph.find(msg, carried[:2], carried[1]) is None   # one backward() call: nothing to say
    # a compiled region's node runs its backward graph's ops inside it, at generated code's call site (torch 2.11's
    # CUDA wheel): still one backward() call
    region = "Torch-Compiled Region: 0/1"
    compiled = [rec(1, region, "t.py:5 in f"), rec(2, bwd + "CompiledFunctionBackward", "t.py:7 in f"),
                {**rec(3, "aten.mm.default", "generated.py:9 in call"), "depth": 1},
                rec(4, bwd + "torch::autograd::AccumulateGrad", "t.py:7 in f"),
                rec(5, region, "t.py:5 in f"), rec(6, bwd + "CompiledFunctionBackward", "t.py:7 in f"),
                {**rec(7, "aten.mm.default", "generated.py:9 in call"), "depth": 1},
                rec(8, bwd + "CompiledFunctionBackward", "t.py:7 in f")]
    got = freedgraph.find(msg, compiled, compiled[-1])
    assert got["backward_call"] == 2 and got["made_at"] == [("t.py:5 in f", 2, 1)] and got["how"] == "carried", got
    # a cold compile: AOTAutograd traces the joint graph through the engine at the forward's line, before its region
    traced = [rec(-3, bwd + "TanhBackward0", "t.py:5 in f"), {**rec(-2, "aten.mm.default", ""), "depth": 1},
              rec(-1, bwd + "AddmmBackward0", "t.py:5 in f")]
    got = freedgraph.find(msg, traced + compiled, compiled[-1])
    assert got["backward_call"] == 2 and got["made_at"] == [("t.py:5 in f", 2, 1)], got


def test_the_stack_that_raised_in_a_worker_is_told_by_its_unequal_samples_where_no_op_is_marked():
    shape = lambda *s: [{"shape": list(x)} for x in s]   # noqa: E731
    recs = [{"seq": 1, "name": "aten.stack.out", "args": [{"value": "L2"}, *shape([8], [8])]},
            {"seq": 2, "name": "aten.stack.out", "args": [{"value": "L2"}, *shape([9], [10])]},
            {"seq": 3, "name": "aten.stack.out", "args": [{"value": "L2"}, *shape([11], [9])]}]
    assert collate.unequal_stack(recs)["seq"] == 2
    assert collate.unequal_stack(recs[:1]) is None


def _samples(values, gpu=True):
    return [{"t": i * 0.1, "seq": i + 1, "allocated": v, "reserved": v if gpu else None} for i, v in enumerate(values)]


def test_memory_that_climbs_through_the_run_is_told_from_memory_that_stays_level():
    mib = 1 << 20
    rising = memtrend.trend(_samples([(100 + 10 * i) * mib for i in range(50)]))
    assert rising["grew"] and rising["what"] == "the memory PyTorch held on the GPU"
    assert "keeps tensors alive across steps" in memtrend.words(rising)
    level = memtrend.trend(_samples([(300 + (i % 7) * 5) * mib for i in range(50)], gpu=False))
    assert not level["grew"] and "no leak across steps" in memtrend.words(level)
    # a step that allocates and frees a large buffer each time is no leak however high its peaks
    saw = memtrend.trend(_samples([(100 if i % 5 else 900) * mib for i in range(50)]))
    assert not saw["grew"]
    assert memtrend.trend(_samples([mib] * 5)) is None   # too few samples to say
    # the optimizer's state made in the first steps, then level: no leak; a climb on a large base (a CUDA build's
    # resident memory) is one
    assert not memtrend.trend(_samples([100 * mib] * 10 + [300 * mib] * 40))["grew"]
    assert memtrend.trend(_samples([(550 + 3 * i) * mib for i in range(50)], gpu=False))["grew"]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_loop_that_keeps_every_steps_graph_runs_out_of_memory_and_the_climb_is_named(device, tmp_path):
    if device == "cuda":
        pytest.importorskip("torch")
        import torch
        if not torch.cuda.is_available():
            pytest.skip("no CUDA device")
    out = tmp_path / "w"
    leak = PROGRAM.parent / "leak_oom.py"
    r = subprocess.run([sys.executable, "-m", "gpulab", "watch", "--quiet", "--status-every", "0", "--out", str(out),
                        "--", "python", str(leak), "--device", device], capture_output=True, text=True, timeout=240,
                       cwd=ROOT)
    v = json.loads((out / "verdict.json").read_text())
    # memory runs out in the forward or the backward of the step, whichever allocates first past the limit
    lines = [n for n, t in enumerate(leak.read_text().splitlines(), 1) if t.rstrip().endswith(("# FORWARD", "# BACKWARD"))]
    assert r.returncode != 0 and v["class"] == "out_of_memory", (v["class"], v["evidence"])
    assert v["memory_trend"]["grew"], v["memory_trend"]
    assert v["owner"]["kind"] == "program", v["owner"]
    assert v["owner"]["where"].startswith(tuple(f"calls/leak_oom.py:{n} in <module>" for n in lines)), v["owner"]
    assert "where memory ran out" in v["owner"]["where"] and "keeps tensors alive across steps" in r.stdout, r.stdout


def test_the_op_that_raised_is_the_one_at_the_line_the_traceback_names():
    """Where the recorder does not mark an op that raises (or its log does not say), the op is the last one recorded,
    only if it was called from the line the traceback's innermost program frame names."""
    recs = [{"seq": 1, "name": "aten.linear.default", "call_site": "calls/train.py:46 in main", "t_end": 2.0},
            {"seq": 2, "name": "aten.addmm.default", "call_site": "calls/train.py:46 in main", "t_end": 2.0}]
    tb = ('Traceback (most recent call last):\n  File "/home/u/calls/train.py", line 46, in main\n'
          '  File "/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", line 134, in forward\n'
          'RuntimeError: mat1 and mat2 shapes cannot be multiplied (16x32 and 31x4)')
    assert verdict.raised_op(recs, tb)["name"] == "aten.addmm.default"
    assert verdict.raised_op(recs, tb.replace("line 46", "line 47")) is None   # raised elsewhere: no guess
    assert verdict.raised_op(recs[:1] + [{**recs[1], "t_end": None}], tb) is None
    # Python raised it (load_state_dict's error after its copies): no op did
    raised_here = tb.replace("in forward\n", "in load_state_dict\n    raise RuntimeError(\n")
    assert verdict.raised_op(recs, raised_here) is None
    # a marked op counts only where the traceback agrees: one raised and caught at another line does not
    marked = [recs[0], {**recs[1], "raised": True, "call_site": "calls/train.py:40 in main"}]
    assert verdict.raised_op(marked, tb) is None
    assert verdict.raised_op(marked, tb.replace("line 46", "line 40"))["name"] == "aten.addmm.default"
    # a GPU error is raised at the next sync, not by the op at that line
    assert verdict.raised_op(recs, tb + "\nRuntimeError: CUDA error: an illegal memory access was encountered") is None
    # raised in the standard library's code below the line (pickling a DataLoader's collate_fn for spawn workers)
    pickled = tb.replace('RuntimeError: mat1', '  File "/usr/lib/python3.12/multiprocessing/reduction.py", line 60, '
                         'in dump\n    ForkingPickler(file, protocol).dump(obj)\nRuntimeError: mat1')
    assert verdict.raised_op(recs, pickled) is None
    # a recorder that marks raised ops and marked none: no op raised (torch.save's file writer after its detach)
    assert verdict.raised_op(recs, tb, marks=True) is None
    assert verdict.raised_op(recs, tb, marks=False)["name"] == "aten.addmm.default"


RANK0_GONE = "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer"


def test_a_job_is_judged_by_the_rank_that_failed_on_its_own_not_by_the_peer_that_lost_it():
    stderr = ("[rank1]: Traceback (most recent call last):\n[rank1]:   File \"/home/u/ddp.py\", line 14, in <module>\n"
              "[rank1]:   File \"/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py\", line 134, in forward\n"
              "[rank1]: RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x15 and 16x32)\n"
              "[rank0]: Traceback (most recent call last):\n[rank0]:   File \"/home/u/ddp.py\", line 16, in <module>\n"
              f"{RANK0_GONE}\n")
    procs = [{"role": "rank 0/2", "kind": "rank", "state": f"exited after an uncaught {RANK0_GONE[9:]}"},
             {"role": "rank 1/2", "kind": "rank", "state": "exited after an uncaught [rank1]: RuntimeError: mat1 "
                                                           "and mat2 shapes cannot be multiplied (8x15 and 16x32)"},
             {"role": "launcher", "kind": "launcher", "state": "exited after an uncaught ChildFailedError: ..."}]
    role, said = classify.rank_error(procs, stderr)
    assert role == "rank 1/2" and said.endswith("(8x15 and 16x32)") and "line 14" in said and "[rank" not in said
    assert classify.rank_error(procs[:1], stderr) is None   # only a peer's death: no rank failed on its own
    assert classify.refused(RANK0_GONE) is None


def test_a_ddp_job_whose_one_rank_passes_a_bad_shape_names_that_rank_and_its_line(tmp_path):
    prog = PROGRAM.parent / "ddp_rank_error.py"
    out = tmp_path / "w"
    r = subprocess.run([sys.executable, "-m", "gpulab", "watch", "--quiet", "--status-every", "0", "--out", str(out),
                        "--", "torchrun", "--nproc-per-node", "2", str(prog)], capture_output=True, text=True,
                       timeout=240, cwd=ROOT)
    v = json.loads((out / "verdict.json").read_text())
    line = next(n for n, t in enumerate(prog.read_text().splitlines(), 1) if t.rstrip().endswith("# FORWARD"))
    assert r.returncode != 0 and (v["class"], v["culprit"]) == ("refused_call", "rank 1/2"), (v["class"], v["evidence"])
    assert v["owner"]["kind"] == "program" and v["owner"]["where"].startswith(f"calls/ddp_rank_error.py:{line}"), v["owner"]
    assert "mat1 and mat2 shapes cannot be multiplied (8x15 and 16x32)" in r.stdout.split("next step: ", 1)[1]


def test_a_job_that_failed_says_its_rank_failed_first_not_that_it_made_no_progress():
    base = {"status": "error", "phase": "ops", "class": "refused_call", "in_flight_op": None, "host_blocked_in": None,
            "last_completed_op": None, "ops_completed": 0, "signal": None, "exit_code": 1, "elapsed_s": 1.0,
            "stacks": {}, "evidence": [], "planted": None, "capture_s": {}, "command": [], "log": {},
            "culprit": "rank 1/2", "processes": [{"role": "rank 1/2"}]}
    assert verdict.job_where(verdict.Verdict.from_dict(base)) == "rank 1/2: failed first, on its own"
    assert verdict.job_where(verdict.Verdict.from_dict({**base, "status": "hang"})) == "rank 1/2: no progress"
