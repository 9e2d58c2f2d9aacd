"""Direct evidence decides what 04 tries: a fix whose declared evidence the verdict shows directly (the driver
call the host is stuck in, the op, its operands, the program's last words) is tried whoever owns the culprit.
The owner is inferred from frames (a program's line calls every op); a fix of what was seen can still change the
failure. Here the program registers its own kernel over aten.mm, which deadlocks on a transposed operand: the
owner is the program, and making the operand contiguous is exactly what removes the hang."""
from __future__ import annotations

import pytest

from chainrun import ended_chain
from gpulab.chain.verdict import judge
from gpulab.hang import owner

NOTEBOOKS = [{"name": n, "status": "ok"} for n in ("01_environment", "02_instrument", "03_bisect_hang",
                                                      "04_fix_scenarios", "05_oracle", "06_benchmark")]
LAUNCH_NATIVE = ('Thread 11 (active): "MainThread"\n    0x7f00 (libcuda.so.1)\n    cuLaunchKernel (libcuda.so.1)\n'
                 '    cudaLaunchKernel (libcudart.so.12)\n')
LAUNCH_PYTHON = ("Current thread 0x00007f00 (most recent call first):\n"
                 '  File "/home/u/gpu_lazy_loading_deadlock.py", line 47 in main\n')


def lazy_loading_metrics(fixed: bool) -> dict:
    """03's and 04's metrics for the lazy-loading deadlock, the owner decided from a hand-built verdict as 03's
    watchdog decides it (the host stuck in cuLaunchKernel, called from the program's line)."""
    who = owner.decide({"status": "hang", "class": "sync",
                        "in_flight_op": {"name": "aten.add_.Tensor", "device": "cuda:0",
                                         "call_site": "gpu_lazy_loading_deadlock.py:47 in main"},
                        "stacks": {"native": LAUNCH_NATIVE, "python": LAUNCH_PYTHON}}).to_dict()
    fixes = ({"recommendation": "module_loading_eager", "recommendation_runs": "0/3",
              "recommendation_apply": "export CUDA_MODULE_LOADING=EAGER", "baseline_failed": 3, "baseline_trials": 3}
             if fixed else {"tried": ["module_loading_eager"]})
    return {"03_bisect_hang": {"headline": "hang (sync) in aten.add_.Tensor",
                               "metrics": {"status": "hang", "class": "sync", "owner": who}},
            "04_fix_scenarios": {"metrics": fixes}}


def test_the_index_says_the_platform_meets_the_programs_code_and_both_ways_out():
    v = judge(NOTEBOOKS, lazy_loading_metrics(fixed=True))
    assert v.verdict == "hang"
    step = v.next_step
    assert step.startswith("module_loading_eager fixes it (0/3 failed, baseline 3/3)"), step
    assert "apply with: export CUDA_MODULE_LOADING=EAGER" in step
    assert "two kernels running at once" in step and "lazy loading" in step     # the platform's side and the program's
    assert "run it once first" in step and "gpu_lazy_loading_deadlock.py:47" in step
    assert "it is not PyTorch's, a library's or the platform's code" not in step


def test_when_nothing_tried_fixes_it_the_program_side_is_still_said():
    step = judge(NOTEBOOKS, lazy_loading_metrics(fixed=False)).next_step
    assert step.startswith("nothing tried fixes it (module_loading_eager)"), step
    assert "run it once first" in step and "CUDA_MODULE_LOADING" in step


@pytest.mark.slow
def test_the_chain_on_the_programs_own_gemm_kernel_ends_at_the_fix_that_removes_it(root, tmp_path):
    # 02 to 04: a hang's verdict and next step are 03's and 04's (01, 05, 06 cannot change them: chainrun)
    sc, m = ended_chain(root, tmp_path, "own_gemm_kernel.py", only=("02", "03", "04"))
    assert sc["verdict"] == "hang" and "aten.mm" in sc["evidence"], sc
    h = m["03_bisect_hang"]
    assert h["status"] == "hang" and h["owner"]["kind"] == "program", h.get("owner")
    assert "own_gemm_kernel.py" in h["owner"]["where"]
    assert "contiguous_gemm_inputs" in h["suggested"]
    f = m["04_fix_scenarios"]
    assert f["recommendation"] == "contiguous_gemm_inputs", f
    assert "contiguous_gemm_inputs fixes it" in sc["next_step"], sc["next_step"]
    assert "apply with: a = a.contiguous(); b = b.contiguous()" in sc["next_step"]
    # the program's kernel is the bug: the fix is said to work around it, with its place
    assert "program's own bug" in sc["next_step"] and "own_gemm_kernel.py" in sc["next_step"]
    index = (tmp_path / "latest" / "index.html").read_text()
    assert "contiguous_gemm_inputs fixes it" in index


def test_04s_own_next_step_says_what_the_fix_works_around():
    """04's sentence agrees with the index's: a fix of the program's own bug works around it (not an upstream
    report); where lazy loading meets the program's kernels, the program's own way out is said beside the fix."""
    from gpulab.fixes import verdict as fv
    base = fv.Observed("baseline", (), True, 3, 3)
    fixed = fv.Observed("module_loading_eager", ("module_loading_eager",), True, 3, 0)
    vs = [fv.judge(o, base)[0] for o in (base, fixed)]
    who = lazy_loading_metrics(True)["03_bisect_hang"]["metrics"]["owner"]
    rec, why = fv.recommend([base, fixed], vs, stall_s=5, apply_lines={fixed.name: "export CUDA_MODULE_LOADING=EAGER"},
                            owner=who)
    assert rec == "module_loading_eager" and "apply with: export CUDA_MODULE_LOADING=EAGER" in why
    assert "run it once first" in why and "upstream" not in why
    _, why = fv.recommend([base, fixed], vs, stall_s=5, in_program="the bug is in the program's own code, at k.py:3")
    assert "only works around the program's own bug: the bug is in the program's own code, at k.py:3" in why
    assert "upstream" not in why
    _, why = fv.recommend([base, fixed], vs, stall_s=5)
    assert "upstream" in why
