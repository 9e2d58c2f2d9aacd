"""The seeds' motivating scenarios as a GPU regression suite, through the whole chain as a user runs it (`gpulab
run` on the fixture, smoke-sized), each asserting what the user reads: run.json's verdict and next step and the
index's text. A scenario whose platform or tool this machine lacks is skipped with the reason; the rules of the
platform-risk scenario fire on the real facts of the machine the test runs on, never on facts written in.

    .venv/bin/python -m pytest tests/test_seeds_gpu.py -q -p no:randomly     (on a GPU host)
"""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chainrun import every_notebook_ended

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

FIX = Path(__file__).parent / "fixtures"
# small and quick on a GPU: one trial per rung (each failure waits out its stall window), 01's suggestions and the
# evidence's fixes first, no cost rounds. The window is long enough for CUDA_MODULE_LOADING=EAGER's start-up
# (native work in the driver holds a hang off for a few windows only).
SMALL = {"device": "cuda", "repeats": 1, "stall_s": 20.0, "fix_budget_s": 60.0, "cost_rounds": 0,
         "oracle_cases": "quick", "max_time_s": 0.3, "seq_lens": [128]}


def _cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - no torch, no GPU
        return False


def _has(module: str) -> bool:
    try:
        __import__(module)
        return True
    except Exception:  # noqa: BLE001 - a module that cannot import is absent
        return False


def _rocm() -> bool:
    import torch
    return bool(getattr(torch.version, "hip", None))


def needs(*, triton: bool = False, nvidia: bool = False, tools: tuple[str, ...] = ()) -> None:
    """Skip, with the reason, where this machine cannot run the scenario."""
    if not _cuda():
        pytest.skip("needs a CUDA or ROCm GPU")
    if nvidia and _rocm():
        pytest.skip("needs an NVIDIA GPU (the scenario is CUDA's: lazy module loading, nvcc)")
    if triton and not _has("triton"):
        pytest.skip("needs Triton (the fixture's kernel is a @triton.jit function)")
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool} on PATH")


def gpu_chain(root: Path, out: Path, workload: str, env: dict | None = None, **params) -> tuple[dict, dict, str]:
    """`gpulab run` on the workload, smoke-sized on the GPU -> (its scenario in run.json, each notebook's
    metrics, the index's text), after checking that every notebook ran to its end."""
    out.mkdir(parents=True, exist_ok=True)
    over = out / "seed.yaml"
    over.write_text(json.dumps({**SMALL, **params}))     # JSON is YAML
    res = subprocess.run([sys.executable, "-m", "gpulab", "run", "--params", "params/smoke.yaml", "--params", str(over),
                          "--out", str(out), "-p", f"workload={workload}", "--notebook-timeout", "900"],
                         cwd=root, capture_output=True, text=True, timeout=3000, env=env)
    index = out / "latest" / "index.html"
    assert index.exists(), res.stderr[-3000:]
    run = json.loads((out / "latest" / "run.json").read_text())
    metrics = {k: v["metrics"] for k, v in
               json.loads((out / "latest" / "baseline" / "metrics.json").read_text()).items()}
    every_notebook_ended(run, metrics)
    return run["scenarios"][0], metrics, index.read_text()


def _env(**over: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_MODULE_LOADING"}   # the platform's default: LAZY
    env.update(over)
    return env


# Run side by side (xdist, `--dist loadgroup`), these three take turns on one worker: two leave a kernel spinning on
# the GPU until their run is stopped, and the third's 06 times kernels, which a spinning neighbour starves
# (its benchmark then ran out of time).
SPINS_OR_TIMES = pytest.mark.xdist_group("gpu_spins_or_times")


@SPINS_OR_TIMES
def test_the_lazy_loading_deadlock_is_answered_by_eager_loading_and_the_programs_own_way_out(root, tmp_path):
    """Kernel A spins until kernel B, launched for the first time on another stream, sets a flag: lazy loading
    makes B's first launch wait for A. The host is stuck in cuLaunchKernel, from the program's own line: 04
    tries module_loading_eager (the driver call is direct evidence, whoever's line it is) and it fixes it."""
    needs(triton=True, nvidia=True)
    sc, m, index = gpu_chain(root, tmp_path, f"script:{FIX / 'gpu_lazy_loading_deadlock.py'}", _env())
    assert sc["verdict"] == "hang", sc
    assert m["04_fix_scenarios"]["recommendation"] == "module_loading_eager", m["04_fix_scenarios"]
    step = sc["next_step"]
    assert step.startswith("module_loading_eager fixes it"), step
    assert "apply with: export CUDA_MODULE_LOADING=EAGER" in step
    # both sides: the platform's lazy loading, and what the program relies on (and can change itself)
    assert "two kernels running at once" in step and "run it once first" in step, step
    assert "module_loading_eager fixes it" in index


@SPINS_OR_TIMES
def test_a_gpu_gemm_that_hangs_on_a_transposed_operand_is_answered_by_contiguous_inputs(root, tmp_path):
    """aten::mm's CUDA kernel, replaced by the program, queues a kernel that never ends on a transposed operand;
    the host waits in the next sync. 04 tries contiguous_gemm_inputs (the operands are direct evidence)."""
    needs()
    sc, m, index = gpu_chain(root, tmp_path, f"script:{FIX / 'gpu_transposed_gemm.py'}")
    assert sc["verdict"] == "hang" and "aten.mm" in sc["evidence"], sc
    assert m["04_fix_scenarios"]["recommendation"] == "contiguous_gemm_inputs", m["04_fix_scenarios"]
    assert sc["next_step"].startswith("contiguous_gemm_inputs fixes it"), sc["next_step"]
    assert "apply with: a = a.contiguous(); b = b.contiguous()" in sc["next_step"]
    assert "contiguous_gemm_inputs fixes it" in index


@pytest.mark.parametrize("fixture,kernel,needs_of", [
    ("gpu_extension_oob.py", "oob_write", dict(nvidia=True, tools=("nvcc", "compute-sanitizer"))),
    ("gpu_triton_wild_store.py", "_copy", dict(triton=True, nvidia=True, tools=("compute-sanitizer",))),
], ids=["CUDA extension", "Triton kernel"])
def test_a_device_memory_fault_names_memchecks_kernel_and_line_and_the_programs_fix(root, tmp_path, fixture, kernel,
                                                                                   needs_of):
    """The program's own kernel writes far past its tensor; the error surfaces at a later sync. memcheck names
    the kernel and its source line, which are the program's: the next step is the program's fix, not upstream."""
    needs(**needs_of)
    sc, m, index = gpu_chain(root, tmp_path, f"script:{FIX / fixture}", stall_s=60.0)
    assert sc["verdict"] in ("error", "crash"), sc
    owner = m["03_bisect_hang"].get("owner") or {}
    assert owner.get("kind") == "program" and kernel in owner.get("where", ""), owner
    # memcheck's source line: the fixture's own for Triton, the extension's generated cuda.cu for load_inline
    line = re.search(r"[\w.-]+\.(py|cu|cuh|cpp):\d+", owner["where"])
    assert line, owner
    step = sc["next_step"]
    assert "program's own" in step and kernel in step and line.group(0) in step, step
    assert "upstream" not in step
    assert kernel in index


@SPINS_OR_TIMES
def test_a_custom_attention_kernel_with_wrong_numbers_is_named_by_05_and_never_crowned_by_06(root, tmp_path):
    """A new kernel that is fast because it skips half the keys: 05 names it as failing the oracle, and 06,
    which times only what 05 found correct, does not crown it."""
    needs()
    name = "gpu_custom_attention:attention"
    lib = str(Path(root) / "lib")
    env = _env(PYTHONPATH=os.pathsep.join(p for p in (str(FIX), lib, os.environ.get("PYTHONPATH")) if p))
    sc, m, index = gpu_chain(root, tmp_path, "builtin", env, candidates=["math", "flash", "efficient", name])
    assert name in m["05_oracle"]["failures"], m["05_oracle"]
    assert "math" not in m["05_oracle"]["failures"]
    assert m["06_benchmark"]["champion"] not in (None, name), m["06_benchmark"]
    assert name in index                              # 05's headline names it
    assert name not in sc["next_step"], sc            # nothing tells the user to adopt it


def _platform_rules() -> tuple[str, tuple[str, ...]]:
    """(what this platform is, the risk rules of env/risks.yaml it must trigger) for a GB10-class unified-memory
    GPU or an RDNA1/RDNA2 card on ROCm; skipped elsewhere."""
    import torch
    props = torch.cuda.get_device_properties(0)
    arch = str(getattr(props, "gcnArchName", "") or "")
    if _rocm() and arch.startswith(("gfx101", "gfx103")):
        return f"{props.name} ({arch}) on ROCm", ("rdna_rocm_memory_faults",)
    if platform.machine() == "aarch64" and torch.cuda.get_device_capability(0)[0] == 12 and \
            getattr(props, "is_integrated", False):
        return f"{props.name} (aarch64, sm_12x, unified memory)", ("blackwell_aarch64_unified_sdpa",
                                                                   "unified_memory_oom_hang")
    pytest.skip(f"needs a GB10-class GPU (aarch64, sm_12x, unified memory) or an RDNA1/RDNA2 card on ROCm; this is "
                f"{props.name} on {platform.machine()}: the rules fire on a platform's real facts only")


def test_a_platform_risk_is_named_by_01_and_its_safe_setting_tried_by_04(root, tmp_path):
    """On a platform with a known risk (GB10 unified memory, ROCm on RDNA1/2), 01 names the rule from the
    platform's facts and 04 runs the fix the rule suggests on the workload, with its cost."""
    needs()
    what, rules = _platform_rules()
    from gpulab.env import rules as R
    suggested = {f for r in R.load_rules() if r.id in rules for f in r.fixes}
    sc, m, index = gpu_chain(root, tmp_path, "builtin", scenarios="auto")
    env = m["01_environment"]
    assert set(rules) <= set(env["risk_ids"]), (what, env["risk_ids"])
    ran = {n for n, s in (m["04_fix_scenarios"].get("scenarios") or {}).items() if (s or {}).get("trials")}
    assert ran & suggested, (what, ran, suggested)
    assert any(r in index for r in rules)
