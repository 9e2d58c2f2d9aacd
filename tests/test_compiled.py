"""Recording leaves torch.compile as it is: a compiled step compiles the same graphs and computes the same loss
under the recorder as without it, and a hang inside compiled code names the op, the compiled region around it
and the program's line (real child processes; Inductor compiles for the CPU here)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab import trace
from gpulab.hang.watchdog import watch
from gpulab.trace.run import _child_env

FIXTURE = Path(__file__).parent / "fixtures" / "compiled_step.py"


def _last_json(text: str) -> dict:
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


@pytest.fixture(scope="module")
def plain():
    p = subprocess.run([sys.executable, str(FIXTURE)], capture_output=True, text=True, timeout=300, env=_child_env())
    assert p.returncode == 0, p.stderr
    return _last_json(p.stdout)


def test_a_compiled_step_compiles_and_computes_the_same_under_the_recorder(tmp_path, plain):
    log = tmp_path / "ops.log"
    p = subprocess.run([sys.executable, "-m", "gpulab.trace", "--log", str(log), "--", str(FIXTURE)],
                       capture_output=True, text=True, timeout=300, env=_child_env())
    assert p.returncode == 0, p.stderr
    got = _last_json(p.stdout)
    assert got == plain   # dynamo's counters (frames too: the recorder's own code is never a frame to convert), loss
    assert got["graphs"] >= 1
    names = [r.name for r in trace.read(log).records]
    regions = [n for n in names if n.startswith("Torch-Compiled Region")]
    assert len(regions) >= 3 and "compiledstep.exchange.default" in names   # each step ran compiled code


def test_a_hang_inside_compiled_code_names_the_op_the_region_and_the_line(tmp_path, plain):
    v = watch.run([sys.executable, str(FIXTURE), "--hang"], stall_s=4, timeout_s=240, out_dir=tmp_path / "w")
    assert v.status == "hang", v.evidence
    op = v.in_flight_op
    assert op["name"] == "compiledstep.exchange.default" and "compiled_step.py" in op["call_site"], op
    inside = [e for e in v.evidence if " ran inside " in e]
    assert inside and "Torch-Compiled Region" in inside[0] and "compiled by torch.compile" in inside[0], v.evidence


@pytest.mark.gpu
def test_compiled_step_on_the_gpu_compiles_the_same_under_the_recorder(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    runs = {}
    for how, pre in (("plain", []), ("recorded", ["-m", "gpulab.trace", "--log", str(tmp_path / "ops.log"), "--"])):
        p = subprocess.run([sys.executable, *pre, str(FIXTURE), "--device", "cuda"], capture_output=True, text=True,
                           timeout=600, env=_child_env())
        assert p.returncode == 0, p.stderr
        runs[how] = _last_json(p.stdout)
    assert runs["plain"] == runs["recorded"]
    snap = trace.read(tmp_path / "ops.log")
    assert snap.device == "cuda"   # the model is built on the CPU first, then moved: the log names where it computes
    kernels = [r for r in snap.records if r.name.startswith("triton_")]   # Inductor's, named and tracked
    # forward kernels at the program's line (backward's run on autograd's device thread: no Python caller)
    assert kernels and any(r.gpu_done for r in kernels) and any("compiled_step.py" in r.call_site for r in kernels), \
        [(r.name, r.call_site) for r in snap.records][-40:]


@pytest.mark.gpu
def test_a_triton_kernel_that_never_completes_inside_compiled_code_is_named_with_the_line(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    v = watch.run([sys.executable, str(Path(__file__).parent / "fixtures" / "gpu_compiled_spin.py")], stall_s=10,
                  timeout_s=400, out_dir=tmp_path / "w")
    assert v.status == "hang", v.evidence
    op = v.in_flight_op
    assert "smooth_kernel" in op["name"] and op["gpu_done"] is False, (op, v.evidence)
    assert "gpu_compiled_spin.py" in op["call_site"], op
    assert v.owner["kind"] == "program" and "smooth_kernel" in v.owner["where"], v.owner   # the program's kernel
    assert v.time_to_verdict_s is None or v.time_to_verdict_s < 10 + 10
