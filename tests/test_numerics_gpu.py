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


@pytest.mark.parametrize("tf32, op, passes, undo", [
    # the first step's three convolutions are passes 1-3 of the line; cuDNN picks TF32 kernels where they pay
    ("default", "aten.convolution.default", (1, 2, 3), "torch.backends.cudnn.allow_tf32 = False"),
    ("matmul", "aten.addmm.default", (1,), "torch.backends.cuda.matmul.allow_tf32 = False"),
])
def test_float32_on_the_cpu_against_cuda_names_tf32_where_a_kernel_runs_in_it_not_a_wrong_kernel(tmp_path, tf32, op,
                                                                                                passes, undo):
    """A CNN in float32, CPU against CUDA, as users compare devices: cuDNN's convolutions run in TF32 by PyTorch's
    default (and matmuls where the program asks for set_float32_matmul_precision('high')). The first such op
    differs past float32's tolerance; the verdict names that setting and how to turn it off, never a wrong
    kernel."""
    cmd = [PY, str(FIX / "conv_train.py"), "--tf32", tf32, "--device"]
    c = compare.run([*cmd, "cpu"], [*cmd, "cuda"], tmp_path, stall_s=120)
    assert c.status == "diverged", c.summary
    fd = c.first_divergence
    assert fd["op"] == op and fd["pass"] in passes and "conv_train.py" in fd["call_site"], c.summary
    rep = fd["replay"]
    assert rep["reference_right"] and rep["settings"]["candidate"]["precision"] == "tf32", rep
    assert "TF32 allowed" in c.summary and undo in c.summary and "kernel is wrong" not in c.summary, c.summary


def test_float32_on_the_cpu_and_on_cuda_with_tf32_off_agree(tmp_path):
    """No false divergence: the same CNN with TF32 off on CUDA agrees with the CPU within float32's tolerance."""
    cmd = [PY, str(FIX / "conv_train.py"), "--tf32", "off", "--device"]
    c = compare.run([*cmd, "cpu"], [*cmd, "cuda"], tmp_path, stall_s=120)
    assert c.status == "agree", c.summary


@pytest.mark.parametrize("tf32", ["off", "on"])
def test_a_gpt_in_float32_on_the_cpu_against_cuda_pairs_the_attention_kernels(tmp_path, tf32):
    """nanoGPT's shape, CPU against CUDA: the CPU runs attention as its flash kernel, CUDA as its efficient one;
    they are paired as one computation and agree. With TF32 on, as nanoGPT's train.py sets it, the first matmul
    that runs in TF32 is named, with the setting and how to turn it off."""
    cmd = [PY, str(FIX / "gpt_train.py"), "--tf32", tf32, "--device"]
    c = compare.run([*cmd, "cpu"], [*cmd, "cuda"], tmp_path, stall_s=120)
    paired = [r for r in c.rows if "scaled_dot_product" in str(r.get("op"))]
    if tf32 == "off":
        assert c.status == "agree", c.summary
        assert paired and all(r["comparable"] for r in paired), c.rows
        return
    assert c.status == "diverged", c.summary
    fd = c.first_divergence
    assert fd["op"] in ("aten.addmm.default", "aten.mm.default", "aten.bmm.default"), c.summary
    assert "TF32 allowed" in c.summary and "torch.backends.cuda.matmul.allow_tf32 = False" in c.summary, c.summary
