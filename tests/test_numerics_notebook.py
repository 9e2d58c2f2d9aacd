"""Notebook 05's comparison of the workload with itself (gpulab.numerics.variants), and the chain's wrong-numbers
verdict built from it (gpulab.chain.verdict): pure tests over commands and a hand-built metrics.json, and one
chain run (slow) of a program that draws its noise from an unseeded generator, on the CPU."""
from __future__ import annotations

import html
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab import report
from gpulab.chain.verdict import judge
from gpulab.numerics import variants
from gpulab.workloads import WorkloadConfig

ROOT = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures" / "numerics"
NOTEBOOKS = [{"name": n, "status": "ok"} for n in ("01_environment", "02_instrument", "05_oracle")]


def _flag(argv, name):
    return argv[argv.index(name) + 1]


# ------------------------------------------------------------------------------------------ commands

def test_builtin_rerun_runs_the_configured_workload_twice():
    v = variants.plan("rerun", WorkloadConfig(device="cpu", rung="step"), has_gpu=False)
    assert v.applies and v.reference == v.candidate and not v.ref_env and not v.cand_env
    assert v.reference[1:3] == ("-m", "gpulab.workloads") and _flag(v.reference, "--rung") == "step"


def test_builtin_eager_does_not_apply_and_says_why():
    v = variants.plan("eager", WorkloadConfig(device="cpu"), has_gpu=True)
    assert not v.applies and "no torch.compile option" in v.what and not v.reference


def test_builtin_device_needs_a_gpu_and_holds_the_dtype_fixed():
    assert not variants.plan("device", WorkloadConfig(device="cpu"), has_gpu=False).applies
    v = variants.plan("device", WorkloadConfig(device="cuda"), has_gpu=True)
    assert (_flag(v.reference, "--device"), _flag(v.candidate, "--device")) == ("cpu", "cuda")
    assert _flag(v.reference, "--dtype") == _flag(v.candidate, "--dtype") == "float32"


def test_builtin_dtype_is_float32_against_the_lower_dtype():
    v = variants.plan("dtype", WorkloadConfig(device="cpu"), has_gpu=False)
    assert (_flag(v.reference, "--dtype"), _flag(v.candidate, "--dtype")) == ("float32", "bfloat16")
    v = variants.plan("dtype", WorkloadConfig(device="cpu", dtype="float16"), has_gpu=False)
    assert _flag(v.candidate, "--dtype") == "float16"


def test_script_choices_change_only_the_environment_or_the_dtype_knob():
    cfg = WorkloadConfig(workload="script:train.py --steps 2", device="cpu")
    r = variants.plan("rerun", cfg, has_gpu=False)
    assert r.reference == r.candidate and r.reference[1:] == ("train.py", "--steps", "2")
    e = variants.plan("eager", cfg, has_gpu=False)
    assert e.reference == e.candidate and dict(e.ref_env) == {"TORCHDYNAMO_DISABLE": "1"} and not e.cand_env
    assert not variants.plan("device", cfg, has_gpu=False).applies
    d = variants.plan("device", cfg, has_gpu=True)
    assert dict(d.ref_env) == {"CUDA_VISIBLE_DEVICES": ""} and not d.cand_env
    no = variants.plan("dtype", cfg, has_gpu=False)
    assert not no.applies and "{dtype}" in no.what
    k = variants.plan("dtype", WorkloadConfig(workload="script:train.py --dtype {dtype}", device="cpu"),
                      has_gpu=False)
    assert k.applies and k.reference[-1] == "float32" and k.candidate[-1] == "bfloat16"


def test_a_bad_choice_names_it_and_the_valid_ones():
    with pytest.raises(ValueError, match=r"compare='fast'.*none, rerun, eager, device, dtype"):
        variants.plan("fast", WorkloadConfig(), has_gpu=False)


def test_none_adds_only_its_mode_and_keeps_the_oracle_headline_and_keys():
    oracle = {"candidates_checked": 3, "passed": 3, "failures": [], "applies": True}
    v = variants.plan("none", WorkloadConfig(), has_gpu=False)
    h, m = variants.fold("3 of 3 pass.", oracle, variants.metrics(v, None))
    assert h == "3 of 3 pass." and {k: m[k] for k in oracle} == oracle and m["compare"]["status"] == "none"


# ------------------------------------------------------------------------------------------ the verdict

def _compared(tmp_path: Path, **fd_extra) -> dict:
    """metrics.json as 05 writes it after a rerun of unseeded_noise.py diverged (hand-built), read back."""
    v = variants.plan("rerun", WorkloadConfig(workload="script:unseeded_noise.py"), has_gpu=False)
    fd = {"op": "aten.randn.generator", "call_site": "/p/unseeded_noise.py:25 in main", "pass": 1,
          "backward": False, "error": {"excess": 2.7e5, "max_rel_err": 1.1e3}, "nan_inf": False, "run": "reference",
          **fd_extra}
    replay = fd.pop("replay", {"words": "neither run is within its dtype's tolerance", "reference_right": False,
                               "candidate_right": False})
    cmp = {"status": "diverged", "summary": "The runs diverge at aten.randn.generator ...", "first_divergence": fd,
           "replay": replay, "first_bitwise_difference": None}
    h, m = variants.fold("05 does not apply.", {"applies": False, "reason": "no attention"}, variants.metrics(v, cmp))
    report.record(tmp_path, "05_oracle", h, **m)
    report.record(tmp_path, "02_instrument", "recorded", ops=50)
    return report.load_metrics(tmp_path)


def test_a_diverged_rerun_is_wrong_numbers_with_the_op_line_pass_and_the_programs_line_to_fix(tmp_path):
    v = judge(NOTEBOOKS, _compared(tmp_path))
    assert v.verdict == "wrong_numbers"
    assert "aten.randn.generator at unseeded_noise.py:25 in main (pass 1)" in v.evidence and "rerun" in v.evidence
    assert v.next_step.startswith("fix the program's line unseeded_noise.py:25 in main") and "seed" in v.next_step


def test_a_wrong_candidate_kernel_is_named_from_the_float64_replay(tmp_path):
    metrics = _compared(tmp_path, replay={"words": "the candidate's kernel is wrong (x)", "reference_right": True,
                                          "candidate_right": False})
    v = judge(NOTEBOOKS, metrics)
    assert v.next_step.startswith("the candidate's kernel is wrong: replay against float64 says")


def test_a_nan_divergence_carries_its_cause(tmp_path):
    v = judge(NOTEBOOKS, _compared(tmp_path, nan_inf=True, cause="log of a value <= 0 (min -0.5)"))
    assert "by NaN/Inf: log of a value <= 0" in v.evidence
    assert v.next_step == "fix the program's line unseeded_noise.py:25 in main: log of a value <= 0 (min -0.5)"


def test_an_op_with_no_recorded_call_site_is_named_without_a_made_up_line(tmp_path):
    v = judge(NOTEBOOKS, _compared(tmp_path, call_site=None, replay={"words": "both right", "reference_right": True,
                                                                     "candidate_right": True}))
    assert "aten.randn.generator (pass 1, its call site not recorded)" in v.evidence and "?" not in v.evidence
    assert v.next_step.startswith("fix the program's call that runs aten.randn.generator: the same command gives")


def test_runs_that_agree_leave_the_verdict_healthy_and_a_hang_still_comes_first(tmp_path):
    v = variants.plan("rerun", WorkloadConfig(workload="script:x.py"), has_gpu=False)
    agree = variants.metrics(v, {"status": "agree", "summary": "The runs agree."})
    h, m = variants.fold("ok.", {"applies": True}, agree)
    assert judge(NOTEBOOKS, {"05_oracle": {"headline": h, "metrics": m}}).verdict == "healthy"
    metrics = _compared(tmp_path)
    metrics["03_bisect_hang"] = {"headline": "hangs in aten.mm", "metrics": {"status": "hang", "class": "gemm"}}
    assert judge(NOTEBOOKS, metrics).verdict == "hang"


def _dtype_compared(tmp_path: Path, trend: str, **fd_extra) -> dict:
    """metrics.json after 05's float32-against-bfloat16 comparison diverged at a layer norm (hand-built)."""
    v = variants.plan("dtype", WorkloadConfig(), has_gpu=False)
    fd = {"op": "aten.native_layer_norm.default", "call_site": "/p/model.py:40 in forward", "pass": 3,
          "backward": False, "error": {"excess": 3.2, "max_rel_err": 0.05}, "nan_inf": False, "run": "candidate",
          "trend": trend, "then": f"it then {trend} (...)", **fd_extra}
    cmp = {"status": "diverged", "summary": "The runs diverge at aten.native_layer_norm.default ...",
           "first_divergence": fd, "replay": {"words": "both runs compute it right", "reference_right": True,
                                              "candidate_right": True}}
    h, m = variants.fold("3 of 3 pass.", {"applies": True, "failures": []}, variants.metrics(v, cmp))
    report.record(tmp_path, "05_oracle", h, **m)
    return report.load_metrics(tmp_path)


def test_a_dtype_difference_both_runs_compute_right_and_that_fades_is_rounding_not_wrong_numbers(tmp_path):
    m = _dtype_compared(tmp_path, "fades")
    assert judge(NOTEBOOKS, m).verdict == "healthy"
    assert m["05_oracle"]["headline"].startswith("3 of 3 pass") and "not a wrong number" in m["05_oracle"]["headline"]


@pytest.mark.parametrize("trend, extra", [
    ("grows", {}),          # a bf16 statistic
    ("stays", {}),
    ("fades", {"nan_inf": True}),
    ("fades", {"candidate_right": False}),
])
def test_a_dtype_difference_that_lasts_or_that_a_kernel_gets_wrong_is_still_wrong_numbers(tmp_path, trend, extra):
    m = _dtype_compared(tmp_path, trend, **extra)
    if "candidate_right" in extra:
        m["05_oracle"]["metrics"]["compare"]["first_divergence"]["candidate_right"] = False
    v = judge(NOTEBOOKS, m)
    assert v.verdict == "wrong_numbers" and "aten.native_layer_norm.default at model.py:40 in forward" in v.evidence


# ------------------------------------------------------------------------------------------ the chain

@pytest.mark.slow
def test_chain_names_an_unseeded_generator_as_wrong_numbers_from_a_rerun(tmp_path):
    out = tmp_path / "runs"
    res = subprocess.run([sys.executable, "-m", "gpulab", "run", "--params", "params/smoke.yaml", "--out", str(out),
                          "--only", "05", "-p", f"workload=script:{FIX / 'unseeded_noise.py'}",
                          "-p", "compare=rerun", "-p", "candidates=[math]", "--notebook-timeout", "400"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    run = json.loads((out / "latest" / "run.json").read_text())
    sc = run["scenarios"][0]
    assert [n["status"] for n in sc["notebooks"]] == ["ok"], (sc["notebooks"], res.stderr[-3000:])
    assert sc["verdict"] == "wrong_numbers", sc
    assert "aten.randn.generator at unseeded_noise.py:" in sc["evidence"] and "(pass 1)" in sc["evidence"]
    line = next(i for i, t in enumerate((FIX / "unseeded_noise.py").read_text().splitlines(), 1) if "# NOISE" in t)
    assert sc["next_step"].startswith(f"fix the program's line unseeded_noise.py:{line} in main"), sc["next_step"]
    m = json.loads((out / "latest" / "baseline" / "metrics.json").read_text())["05_oracle"]["metrics"]
    assert m["compare"]["status"] == "diverged" and m["compare"]["first_divergence"]["call_site"].endswith(
        f"unseeded_noise.py:{line} in main")
    index = html.unescape((out / "latest" / "index.html").read_text())
    assert "WRONG NUMBERS" in index and sc["evidence"] in index and sc["next_step"] in index


@pytest.mark.gpu
def test_the_builtin_workload_on_cpu_against_cuda_runs_both_sides_and_names_any_divergence(tmp_path):
    from gpulab.numerics import compare

    v = variants.plan("device", WorkloadConfig(device="cuda", rung="forward"), has_gpu=True)
    c = compare.run(v.reference, v.candidate, tmp_path, ref_env=dict(v.ref_env), cand_env=dict(v.cand_env),
                    timeout_s=600)
    assert [r.status for r in c.runs] == ["ok", "ok"], c.summary
    assert c.status in ("agree", "diverged", "unaligned"), c.summary   # unaligned: cuda dispatches other SDPA ops
    assert c.status != "diverged" or (c.first_divergence["op"] and c.first_divergence["call_site"])
    assert c.status != "unaligned" or c.parted
