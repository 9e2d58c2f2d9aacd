"""`gpulab compare` on the GPU, as a user runs it: a CUDA kernel (Triton) wrong against its CPU kernel, named
with its line and pass and judged wrong by the float64 replay; a statistic accumulated in bfloat16 on CUDA named
at its accumulation; eager against torch.compile on CUDA (Inductor's Triton kernels) agreeing. Each run is a real
child recorded by the fingerprint recorder's CUDA path (gpulab.numerics.fused)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpulab.numerics import compare

pytestmark = pytest.mark.gpu

FIX = Path(__file__).parent / "fixtures" / "numerics"
PY = sys.executable


def _line(fixture: str, text: str) -> int:
    lines = (FIX / fixture).read_text().splitlines()
    return next(n for n, ln in enumerate(lines, 1) if text in ln)


def test_a_triton_kernel_wrong_against_its_cpu_kernel_is_named_from_the_command_line(tmp_path):
    """The user's path: one command with --vary, its JSON and its exit code."""
    t0 = time.monotonic()
    p = subprocess.run([PY, "-m", "gpulab", "compare", "--json", str(tmp_path / "c.json"), "--out",
                        str(tmp_path / "o"), "--vary", "device=cpu,cuda", "--", PY,
                        str(FIX / "triton_silu_train.py"), "--device", "{device}"], capture_output=True, text=True,
                       timeout=600, cwd=tmp_path)
    took = time.monotonic() - t0
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    got = json.loads((tmp_path / "c.json").read_text())
    fd = got["first_divergence"]
    line = _line("triton_silu_train.py", "h = silu(model_in(x))")
    assert got["status"] == "diverged" and fd["op"] == "tritonfix.silu.default", got["summary"]
    assert fd["call_site"].endswith(f"triton_silu_train.py:{line} in main") and fd["pass"] == 1, fd
    assert fd["error"]["max_rel_err"] == pytest.approx(0.15, rel=0.05), fd["error"]
    rep = got.get("replay") or fd.get("replay") or {}
    assert rep.get("reference_right") is True and rep.get("candidate_right") is False, rep
    print(f"gpulab compare cpu against cuda: {took:.1f} s")


def test_a_statistic_accumulated_in_bfloat16_on_cuda_is_named_at_its_accumulation(tmp_path):
    cmd = [PY, str(FIX / "stat_train.py"), "--device", "cuda", "--stat-dtype"]
    c = compare.run([*cmd, "float32"], [*cmd, "bfloat16"], tmp_path, stall_s=120, replay=False)
    assert c.status == "diverged", c.summary
    fd = c.first_divergence
    lines = {_line("stat_train.py", "total = total + seen"), _line("stat_train.py", "total_sq = total_sq + seen")}
    assert fd["op"] == "aten.add.Tensor" and int(fd["call_site"].split(":")[1].split()[0]) in lines, c.summary
    assert 1 < fd["pass"] < 40 and not fd["nan_inf"], c.summary


def test_eager_and_torch_compile_on_cuda_agree(tmp_path):
    cmd = [PY, str(FIX / "compiled_mlp.py"), "--device", "cuda"]
    c = compare.run(cmd, [*cmd, "--compile"], tmp_path, stall_s=240)
    assert c.status == "agree", c.summary
    assert c.aligned["aligned"] > 0 and "within tolerance" in c.summary, c.aligned
