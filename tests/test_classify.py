"""Classification is a pure function of evidence: every class, the seeds' four scenarios, real captures."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpulab.hang import capture, classify

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "evidence").glob("*.json"))


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_fixture_class_and_cited_facts(path):
    fx = _load(path)
    result = classify.classify(classify.Evidence.from_dict(fx["evidence"]))
    assert result.cls == fx["expect"], (fx["doc"], result.facts)
    for needle in fx["facts_contain"]:
        assert any(needle in fact for fact in result.facts), (needle, result.facts)


def test_every_class_has_a_fixture():
    covered = {_load(p)["expect"] for p in FIXTURES}
    assert covered == set(classify.CLASSES)


def test_seed_scenarios_present():
    names = {p.stem for p in FIXTURES}
    for seed in ("seed_cublas_stream_gpu_mode", "seed_softmax_reduction", "seed_layout_strided_bmm",
                 "seed_driver_page_fault_hang"):
        assert seed in names


def test_same_hang_gpu_mode_names_gemm_ops_mode_only_sync():
    """The sync line lies: with GPU progress the GEMM is named; without it only the sync is seen."""
    gpu = classify.classify(classify.Evidence.from_dict(_load(FIXTURES[0].parent / "seed_cublas_stream_gpu_mode.json")["evidence"]))
    ops = classify.classify(classify.Evidence.from_dict(_load(FIXTURES[0].parent / "seed_cublas_stream_ops_mode.json")["evidence"]))
    assert (gpu.cls, ops.cls) == ("gemm", "sync")


@pytest.mark.parametrize("name,kind", [
    ("aten.mm.default", "gemm"), ("aten.bmm.default", "gemm"), ("aten.addmm.default", "gemm"),
    ("aten._softmax.default", "softmax"), ("aten._scaled_dot_product_efficient_attention.default", "softmax"),
    ("mylib.flash_attn.default", "softmax"), ("aten.copy_.default", "layout"), ("aten.clone.default", "layout"),
    ("aten._local_scalar_dense.default", "sync"), ("torch.cuda.synchronize", "sync"),
    ("_c10d_functional.all_reduce.default", "collective"), ("aten.relu.default", None), (None, None),
])
def test_op_kind(name, kind):
    assert classify.op_kind(name) == kind


@pytest.mark.parametrize("shape,stride,bad", [
    ([64, 32], [32, 1], False), ([64, 32], [1, 64], False), ([2, 64, 64], [8192, 128, 2], True),
    ([64, 32], [0, 1], True), ([64, 1], [1, 1], False), ([4, 64, 32], [2048, 32, 1], False),
])
def test_layout_problems(shape, stride, bad):
    assert bool(classify.layout_problems({"shapes": [shape], "strides": [stride]})) is bad


def test_bad_status_is_named():
    with pytest.raises(ValueError, match="status 'stuck'.*hang"):
        classify.classify(classify.Evidence(status="stuck"))


@pytest.mark.parametrize("recorded,started,frames,phase", [
    (True, 0, (), "startup"), (True, 5, (), "ops"),
    (False, 0, ("pthread_mutex_lock (libc.so.6)", "_dl_init (ld.so)", "dlopen (libc.so.6)"), "startup"),
    (False, 0, ("pthread_mutex_lock (libc.so.6)", "ffi_call (libffi.so)"), "ops"),
])
def test_host_phase(recorded, started, frames, phase):
    threads = (capture.Thread("1", "MainThread", frames, True),)
    assert classify.host_phase(recorded, started, threads, ()) == phase


def test_parsers_pyspy_gdb_faulthandler():
    spy = 'Thread 11 (idle): "MainThread"\n    pthread_mutex_lock (libc.so.6)\n    <module> (x.py:3)\n'
    gdb = ('Thread 2 (Thread 0x7f (LWP 12) "w"):\n#0  0x1 in poll () from /lib/libc.so.6\n'
           'Thread 1 (Thread 0x7e (LWP 11) "python"):\n#0  ___pthread_mutex_lock (m=0x1) at x.c:3\n'
           '#1  0x00007f in ?? () from /lib/libcuda.so.1\n')
    fh = ('Thread 0x00007f01 (most recent call first):\n  File "/a.py", line 3 in worker\n\n'
          'Current thread 0x00007f00 (most recent call first):\n  File "/b.py", line 9 in main\n')
    (t,) = capture.parse_native(spy, 11)
    assert t.main and t.functions == ("pthread_mutex_lock", "<module>")
    th = capture.parse_native(gdb, 11)
    assert [x.tid for x in th] == ["12", "11"] and th[1].main and th[1].functions[0] == "___pthread_mutex_lock"
    assert th[1].frames[1] == "?? (libcuda.so.1)"
    py = capture.parse_python(fh)
    assert [x.functions for x in py] == [("worker",), ("main",)] and py[1].main
    assert capture.collapse(py)[1].endswith(": main")


def _rank(role="rank 1/2", **kw):
    row = {"role": role, "open_op": None, "collective": {"group": "default", "seq": 1, "done": True},
           "wait": None, "own_code": True}
    return {**row, **kw}


@pytest.mark.parametrize("cls,row,program", [
    ("collective_mismatch", _rank(), True),                       # by class
    ("worker_stuck", _rank(own_code=False), True),
    ("rank_stuck", _rank(), True),                                # busy in its own Python, nothing open
    ("rank_stuck", _rank(wait="lock"), True),                     # its own threads deadlock
    ("rank_stuck", _rank(own_code=False), False),                 # inside torch (or no stacks)
    ("rank_stuck", _rank(open_op="aten.mm.default at t.py:3"), False),   # an op that never returned
    ("rank_stuck", _rank(wait="cuda_sync"), False),
    ("rank_stuck", _rank(collective={"group": "default", "seq": 2, "done": False}), False),
    ("rank_stuck", _rank(role="rank 0/2"), False),                # the culprit's row is not there
    ("gemm", _rank(), False),
])
def test_a_failure_is_the_programs_own_only_where_its_evidence_says_so(cls, row, program):
    cause = classify.program_cause(cls, "rank 1/2", [row])
    assert (cause is not None) is program
    if cls == "rank_stuck" and program:
        assert "own code" in cause and "py-spy dump" in cause


DSA_FOOTER = "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"


@pytest.mark.parametrize("status,stderr,cls", [
    ("error", "RuntimeError: CUDA error: an illegal memory access was encountered\n" + DSA_FOOTER, "illegal_address"),
    # a Triton kernel's store 1 GiB past its tensor, one run of four on an H100 (the others: illegal memory access)
    ("error", "torch.AcceleratorError: CUDA error: operation not supported on global/shared address space\n"
              "Search for `cudaErrorInvalidAddressSpace' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
              "group__CUDART__TYPES.html for more information.\n" + DSA_FOOTER, "illegal_address"),
    ("error", "RuntimeError: CUDA error: misaligned address\n" + DSA_FOOTER, "misaligned_address"),
    ("error", "RuntimeError: CUDA error: an invalid program counter was encountered\n", "launch_failure"),
    ("error", "torch.AcceleratorError: CUDA error: device-side assert triggered\n" + DSA_FOOTER, "device_assert"),
    ("crash", "Memory access fault by GPU node-2 (Agent handle: 0x1) on address 0x7f. Reason: Page not present or "
              "supervisor privilege.\n", "gpu_page_fault"),
    ("error", "IndexError: index 12 is out of bounds for dimension 0 with size 10\n", "out_of_bounds"),
    ("error", "RuntimeError: CUDA error: unspecified launch failure\n", "launch_failure"),
    ("error", "RuntimeError: something else\n" + DSA_FOOTER, "unknown"),     # the footer alone is no assert
    ("hang", "RuntimeError: CUDA error: an illegal memory access was encountered\n", "unknown"),  # a hang's words
])
def test_memory_faults_are_read_from_the_programs_last_words(status, stderr, cls):
    got = classify.classify(classify.Evidence(status=status, stderr_tail=stderr))
    assert got.cls == cls, got.facts


STDERR_DIED = """step 3 loss 0.5
Exception in thread prefetch:
Traceback (most recent call last):
  File "/usr/lib/python3.11/threading.py", line 1045, in _bootstrap_inner
    self.run()
  File "/usr/lib/python3.11/threading.py", line 982, in run
    self._target(*self._args, **self._kwargs)
  File "/home/u/train.py", line 41, in fill
    batch = next(it)
StopIteration
Exception in thread Thread-2 (log):
Traceback (most recent call last):
  File "/home/u/train.py", line 17, in log
    raise ValueError(f"bad loss {x}")
ValueError: bad loss nan
Traceback (most recent call last):
  File "/home/u/other.py", line 3, in <module>
KeyError: 'x'
"""


def test_threads_that_died_are_read_from_pythons_report_with_their_error_and_innermost_frame():
    got = classify.dead_threads(STDERR_DIED)
    assert [(d["thread"], d["error"], d["file"], d["line"], d["func"]) for d in got] == [
        ("prefetch", "StopIteration", "/home/u/train.py", 41, "fill"),
        ("Thread-2 (log)", "ValueError: bad loss nan", "/home/u/train.py", 17, "log")]
    assert classify.dead_threads("Traceback (most recent call last):\nKeyError: 'x'\n") == []
    facts = classify.classify(classify.Evidence(status="hang", stderr_tail=STDERR_DIED)).facts
    assert "before the hang, thread prefetch died: StopIteration at /home/u/train.py:41 in fill" in facts[1], facts
    ok = classify.classify(classify.Evidence(status="ok", stderr_tail=STDERR_DIED)).facts
    assert not any("died" in f for f in ok)   # said only where something waits


_WAITS = """Thread 7802 (idle): "MainThread"
    0x7f802c8a3f16 (libc.so.6)
    PyThread_acquire_lock_timed (libpython3.11.so.1.0)
    lock_PyThread_acquire_lock (libpython3.11.so.1.0)
    Samples.__getitem__ (train.py:23)
    _worker_loop (torch/utils/data/_utils/worker.py:374)
Thread 7803 (idle): "gpulab-beat"
    clock_nanosleep (libc.so.6)
    _loop (gpulab/beat.py:119)
    Thread.run (threading.py:982)
"""
_OTHER = """Thread 7810 (idle): "Thread-1 (reporter)"
    clock_nanosleep (libc.so.6)
    reporter (train.py:13)
    Thread.run (threading.py:982)
"""
_POOL = """Thread 7811 (idle)
    do_futex_wait (libc.so.6)
    gomp_thread_start (libgomp.so.1)
"""


@pytest.mark.parametrize("text,alone", [
    (_WAITS, True),                                        # the worker's main thread, gpulab's beat beside it
    (_WAITS + _POOL, True),                                # a native pool runs no Python
    (_WAITS + _OTHER, False),                              # a thread of the program's own could release it
    (_WAITS.replace("PyThread_acquire_lock_timed", "time_sleep").replace("lock_PyThread_acquire_lock",
                                                                         "pysleep"), False),   # no lock wait
    (_WAITS.replace("Samples.__getitem__ (train.py:23)", "Event.wait (threading.py:629)"), False),   # an Event
    ("Thread 1 (LWP 7802):\n#0 __futex_abstimed_wait_common64 ()\n#1 PyThread_acquire_lock_timed ()\n"
     "#2 lock_PyThread_acquire_lock ()\n#3 _PyEval_EvalFrameDefault ()\n", False),   # gdb: no Python frames to see
])
def test_a_lock_no_thread_of_the_process_can_release(text, alone):
    assert classify.lock_alone(capture.parse_native(text, 7802)) is alone


def test_a_job_kept_running_has_its_python_stacks_read_paused_not_dumped_by_a_signal(tmp_path):
    """Under --on-stall keep the job must outlive the capture: its stacks come from py-spy (the process paused),
    not from faulthandler's SIGUSR1 dump, which walks running threads' frames and can crash the job; py-spy's dump
    reads as faulthandler's does (the main thread, the program's frames with their full paths)."""
    import subprocess
    import sys
    import time

    if capture.find_tool("py-spy") is None:
        pytest.skip("py-spy is not installed")
    prog = tmp_path / "ckpt.py"
    prog.write_text("import time\n\ndef save_checkpoint():\n    time.sleep(60)\n\nsave_checkpoint()\n")
    fh = tmp_path / "fh.txt"
    fh.write_text("")   # a faulthandler file that a SIGUSR1 would write into (this child has none: it would die)
    p = subprocess.Popen([sys.executable, str(prog)])
    try:
        time.sleep(1.0)
        got = capture.python_stacks(p.pid, fh, paused=True)
        assert got.ok and got.tool == "py-spy" and p.poll() is None, (got, p.poll())
        main = classify.main_thread(capture.parse_python(got.text))
        assert main is not None and main.frames[0] == f"save_checkpoint ({prog}:4)", main
    finally:
        p.kill()
        p.wait()
