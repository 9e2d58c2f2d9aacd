"""The verdict's GPU reasoning on observations taken on the H100 (stacks trimmed, paths made generic):
never the waiting op, and no claim beyond what GPU progress shows."""
from __future__ import annotations

import pytest

from gpulab.hang.verdict import Observation, driver_call, judge
from gpulab.hang import capture

# py-spy --native of a program whose Triton kernel spins forever inside a custom op: the host is stuck
# launching the next kernel (lazy module loading waits for the running one). H100, CUDA 13, driver 580.
LAUNCH_STUCK = """Process 723: python3 -m gpulab.trace --mode auto -- heldback_triton.py
Python v3.12.3 (python3.12)

Thread 723 (active): "MainThread"
    0x7f68da519b66 ([vdso])
    clock_gettime (libc.so.6)
    0x7f68abecc5c4 (libcuda.so.580.159.04)
    0x7f68abde00fc (libcuda.so.580.159.04)
    0x7f68abf5e007 (libcuda.so.580.159.04)
    cuLaunchKernel (libcuda.so.580.159.04)
    0x7f68d7c1376d (libcudart.so.13)
    cudaLaunchKernel (libcudart.so.13)
    at::native::copy_device_to_device (libtorch_cuda.so)
    at::native::copy_ (libtorch_cpu.so)
    triton_spin (heldback_triton.py:19)
    <module> (heldback_triton.py:28)
"""
SYNC_WAIT = LAUNCH_STUCK.replace("cuLaunchKernel", "cuStreamSynchronize").replace("cudaLaunchKernel",
                                                                                  "cudaStreamSynchronize")


def rec(seq, name, *, done=True, gpu_done=None, stream=None, site=None):
    return {"seq": seq, "name": name, "args": [], "t_start": float(seq), "t_end": float(seq) + 0.5 if done else None,
            "gpu_done": gpu_done, "stream": stream, "call_site": site or f"prog.py:{seq + 10} in <module>",
            "thread": "MainThread", "depth": 0}


def obs(records, native=LAUNCH_STUCK):
    return Observation(command=("python", "prog.py"), status="hang", exit_code=-9, elapsed_s=9.0, recorded=True,
                       records=tuple(records), ops_started=len(records), ops_completed=len(records) - 1,
                       native_text=native, pid=723, mode="auto")


def test_driver_call_is_the_innermost_named_api():
    threads = capture.parse_native(LAUNCH_STUCK, 723)
    assert driver_call(threads) == "cuLaunchKernel"
    assert driver_call(capture.parse_native(SYNC_WAIT, 723)) == "cuStreamSynchronize"
    assert driver_call(()) is None


def test_host_stuck_launching_inside_the_open_op_after_all_gpu_work_completed():
    records = [rec(i, "aten.mm.default", gpu_done=True, stream=0) for i in range(3)]
    records.append(rec(3, "mylib.spin.default", done=False))
    v = judge(obs(records))
    assert v.in_flight_op["name"] == "mylib.spin.default"
    assert v.localized == "driver"
    assert v.host_blocked_in["name"].startswith("cuLaunchKernel") and v.host_blocked_in["driver"]
    text = " ".join(v.evidence)
    assert "the GPU work of every earlier op completed" in text
    assert "lazy module loading" in text


def test_without_gpu_progress_the_open_op_is_host_localized_and_no_completion_is_claimed():
    records = [rec(i, "aten.mm.default") for i in range(3)] + [rec(3, "mylib.spin.default", done=False)]
    v = judge(obs(records))
    assert v.localized == "host"
    assert v.host_blocked_in["driver"]
    assert not any("every earlier op" in e for e in v.evidence)


@pytest.mark.parametrize("native", [LAUNCH_STUCK, SYNC_WAIT, ""])
def test_gpu_pending_names_the_first_unfinished_op_and_the_window_before_it(native):
    records = [rec(0, "aten.mm.default", gpu_done=True, stream=0, site="prog.py:8 in <module>"),
               rec(1, "aten._softmax.default", gpu_done=False, stream=0, site="prog.py:11 in <module>"),
               rec(2, "aten.add.Tensor", gpu_done=False, stream=0),
               rec(3, "aten.sum.default", done=False)]
    v = judge(obs(records, native))
    assert v.in_flight_op["name"] == "aten._softmax.default"   # never the op the host waits in
    assert v.host_blocked_in["name"] == "aten.sum.default"
    assert v.localized == "gpu_event"
    window = [e for e in v.evidence if e.startswith("the GPU finished aten.mm.default")]
    assert window and "prog.py:8" in window[0] and "prog.py:11" in window[0] and "outside PyTorch" in window[0]


@pytest.mark.parametrize("native,api,how", [(LAUNCH_STUCK, "cuLaunchKernel", "in the driver's cuLaunchKernel"),
                                            (SYNC_WAIT, "cuStreamSynchronize", "in the driver's cuStreamSynchronize"),
                                            ("", None, "a sync")])
def test_the_waiting_op_says_which_driver_call_it_waits_in(native, api, how):
    """Observed on the H100 (spin_then_sync drill): the host was in aten.sum's kernel launch, not a sync;
    the evidence must not call a launch a sync."""
    records = [rec(0, "aten.mm.default", gpu_done=False, stream=0), rec(1, "aten.sum.default", done=False)]
    v = judge(obs(records, native))
    assert v.in_flight_op["name"] == "aten.mm.default" and v.host_blocked_in["name"] == "aten.sum.default"
    assert v.host_blocked_in.get("api") == api
    assert any(e.startswith(f"host thread blocked in aten.sum.default ({how}, waiting behind") for e in v.evidence)
