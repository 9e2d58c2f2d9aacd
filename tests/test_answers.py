"""One vocabulary from evidence to fix: every evidence signature a fix declares is shown by a verdict that
has that evidence, the "try" sentence names only what `auto` runs first, and the matcher ranks the most
specific evidence first."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpulab.fixes import answers, registry, scenarios, suggest

EVIDENCE = Path(__file__).parent / "fixtures" / "evidence"
CPU = {"device": "cpu", "gpu": None, "cudnn": False, "torch": "2.x", "sdpa_mask": None}
CUDA = {"device": "cuda", "gpu": "cuda", "cudnn": True, "torch": "2.x", "sdpa_mask": None}
ROCM = {"device": "cuda", "gpu": "rocm", "cudnn": False, "torch": "2.x", "sdpa_mask": None}


def op(name, shapes=((8, 16), (16, 32)), strides=None, dtype="torch.float32", device="cuda:0", contiguous=None):
    strides = strides or [[s[-1], 1] if len(s) == 2 else [] for s in shapes]
    return {"name": name, "shapes": [list(s) for s in shapes], "strides": [list(s) for s in strides],
            "dtypes": [dtype] * len(shapes), "device": device,
            "contiguous": list(contiguous) if contiguous else [True] * len(shapes), "call_site": "train.py:12"}


def v(status="hang", phase="ops", cls="unknown", in_flight=None, api=None, native="", stderr=""):
    return {"status": status, "phase": phase, "class": cls, "in_flight_op": in_flight, "driver_call": api,
            "host_blocked_in": {"name": "x", "api": api} if api else None, "stacks": {"native": native},
            "stderr_tail": stderr}


# (fix, the Answer's words, a verdict that shows that evidence, the platform)
EXAMPLES = [
    ("dataloader_spawn", "a DataLoader worker is blocked while its loader waits for data", v(cls="worker_stuck"), CPU),
    ("dataloader_no_workers", "a DataLoader worker is blocked while its loader waits for data", v(cls="worker_stuck"),
     CPU),
    ("dataloader_no_workers", "a DataLoader worker died without a traceback",
     v(status="error", cls="worker_died", stderr="RuntimeError: DataLoader worker (pid 7) is killed by signal: Killed."),
     CPU),
    ("dataloader_spawn", "a DataLoader worker's native code crashed (a library that is not fork-safe)",
     v(status="error", cls="worker_died",
       stderr="RuntimeError: DataLoader worker (pid 7) is killed by signal: Segmentation fault."), CPU),
    ("alloc_expandable", "the GPU ran out of memory (enough may be free in pieces the allocator cannot join)",
     v(status="error", cls="out_of_memory", in_flight=op("aten.empty.memory_format"),
       stderr="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."), CUDA),
    ("sync_gemm", "a GEMM's GPU work never completed (stream ordering)", v(cls="gemm", in_flight=op("aten.mm.default")), CUDA),
    ("sync_gemm", "the host waits in a sync behind a GEMM",
     v(cls="sync", in_flight=op("aten.bmm.default", shapes=((2, 8, 16), (2, 16, 8)), device=None)), CUDA),
    ("fp32_softmax", "a reduced-precision softmax in flight",
     v(cls="softmax", in_flight=op("aten._softmax.default", shapes=((4, 64),), dtype="torch.bfloat16")), CUDA),
    ("contiguous_gemm_inputs", "a GEMM with a transposed or non-contiguous operand in flight",
     v(cls="host_lock", in_flight=op("aten.mm.default", strides=((16, 1), (1, 16)), device="cpu")), CPU),
    ("contiguous_gemm_inputs", "an operand layout no kernel expects",
     v(cls="layout", in_flight=op("aten.clone.default", shapes=((8, 8),))), CUDA),
    ("alloc_async", "allocator calls in flight on the GPU", v(in_flight=op("aten.empty.memory_format", shapes=())), CUDA),
    ("alloc_async", "the host is stuck in a driver memory call", v(cls="sync", api="cuMemAlloc_v2"), CUDA),
    ("alloc_expandable", "allocator calls in flight on the GPU",
     v(in_flight=op("aten.empty_strided.default", shapes=())), CUDA),
    ("alloc_expandable", "the host is stuck in a driver memory call", v(cls="sync", api="cuMemCreate"), CUDA),
    ("alloc_no_caching", "allocator calls in flight on the GPU", v(in_flight=op("aten.zeros.default", shapes=())), CUDA),
    ("alloc_no_caching", "a GPU memory access fault (a buffer reused too early)",
     v(status="crash", stderr="CUDA error: an illegal address was encountered"), CUDA),
    ("memory_fraction_cap", "allocator calls in flight on the GPU", v(in_flight=op("aten.empty.memory_format", shapes=())), CUDA),
    ("memory_fraction_cap", "the host is stuck in a driver memory call", v(cls="sync", api="cudaMallocManaged"), CUDA),
    ("module_loading_eager", "the host is stuck in a driver module-load or kernel-launch call",
     v(cls="sync", in_flight=op("aten.sum.default", shapes=((4, 4),)), api="cuLaunchKernel"), CUDA),
    ("module_loading_eager", "a hang in library loading at start-up", v(phase="startup", cls="library_load"), CUDA),
    ("module_loading_eager", "a hang at start-up, before the first op", v(phase="startup", cls="unknown"), CUDA),
    ("module_loading_lazy", "the host is stuck in a driver module-load call", v(cls="sync", api="cuModuleLoadData"), CUDA),
    ("module_loading_lazy", "a hang in library loading at start-up", v(phase="startup", cls="library_load"), CUDA),
    ("module_loading_lazy", "a hang at start-up, before the first op", v(status="timeout", phase="startup"), CUDA),
    ("launch_blocking", "the host waits in a sync behind GPU work that never completed",
     v(cls="sync", in_flight=op("aten.add.Tensor", shapes=((4,),))), CUDA),
    ("launch_blocking", "GPU work that never completed, launched outside the dispatcher",
     v(cls="unknown", in_flight=op("aten.mul.Tensor", shapes=((4,),))), CUDA),
    *[(f"sdpa_backend_{b}", "an SDPA backend's kernel in flight",
       v(cls="softmax", in_flight=op("aten._scaled_dot_product_efficient_attention.default",
                                     shapes=((2, 4, 64, 32),) * 3, dtype="torch.bfloat16")), CUDA)
      for b in ("math", "flash", "efficient", "cudnn")],
    ("sdpa_math_off", "the math SDPA backend (or its softmax) in flight",
     v(in_flight=op("aten._scaled_dot_product_attention_math.default", shapes=((2, 4, 64, 32),) * 3)), CUDA),
    ("sdpa_math_off", "a reduced-precision softmax in flight",
     v(cls="softmax", in_flight=op("aten._softmax.default", shapes=((4, 64),), dtype="torch.float16")), CUDA),
    ("decomposed_attention", "an SDPA backend's kernel in flight",
     v(in_flight=op("aten._scaled_dot_product_flash_attention_for_cpu.default", shapes=((1, 2, 32, 16),) * 3,
                    device="cpu")), CPU),
    ("decomposed_attention", "a softmax reduction in flight", v(in_flight=op("aten._softmax.default", shapes=((4, 8),),
                                                                             device="cpu")), CPU),
    ("rocm_safe", "a GPU memory access fault on ROCm",
     v(status="crash", stderr="Memory access fault by GPU node-1 on address 0x7f. Reason: Page not present"), ROCM),
    ("rocm_safe", "a GPU hang on ROCm", v(cls="sync"), ROCM),
    ("cpu_fallback", "a GPU memory access fault", v(status="crash", stderr="Memory access fault by GPU node-1"), ROCM),
    ("omp_single_thread", "host threads parked in a CPU thread pool",
     v(cls="host_lock", native="#0 futex_wait\n#1 gomp_team_barrier_wait_end (libgomp.so.1)"), CPU),
    ("omp_single_thread", "a deadlock on a host lock", v(cls="host_lock"), CPU),
]


def test_every_declared_signature_has_an_example():
    declared = {(n, a.because) for n, f in registry.load().items() for a in f.answers}
    assert declared == {(fx, because) for fx, because, _, _ in EXAMPLES}
    assert all(f.answers for f in registry.load().values()), "every fix says what evidence it answers"


@pytest.mark.parametrize("fix,because,verdict,platform", EXAMPLES,
                         ids=[f"{e[0]}-{i}" for i, e in enumerate(EXAMPLES)])
def test_each_signature_is_matched_on_a_verdict_that_shows_it(fix, because, verdict, platform):
    got = {m.fix: m for m in answers.suggest(registry.load().values(), verdict, platform)}
    assert fix in got, f"{fix} not suggested for {verdict}"
    assert got[fix].because == because or any(a.because == because and answers.holds(a, answers.facts(verdict, platform))
                                              for a in registry.get(fix).answers)


def test_nothing_is_suggested_for_a_run_that_passed_or_a_fix_that_cannot_apply():
    assert answers.suggest(registry.load().values(), {"status": "ok"}, CUDA) == ()
    cpu_gemm = v(cls="gemm", in_flight=op("aten.mm.default", device="cpu"))
    assert "sync_gemm" not in {m.fix for m in answers.suggest(registry.load().values(), cpu_gemm, CPU)}


def test_the_most_specific_evidence_comes_first():
    transposed = v(cls="host_lock", in_flight=op("aten.mm.default", strides=((16, 1), (1, 16)), device="cpu"))
    got = [m.fix for m in answers.suggest(registry.load().values(), transposed, CPU)]
    assert got[0] == "contiguous_gemm_inputs" and "omp_single_thread" in got


def test_an_answer_without_a_condition_is_refused():
    with pytest.raises(ValueError, match="no condition"):
        answers.Answer("anything at all")


def _verdict_fixtures():
    for path in sorted(EVIDENCE.glob("*.json")):
        data = json.loads(path.read_text())
        yield path.stem, {**data["evidence"], "class": data.get("expect")}


@pytest.mark.parametrize("platform", [CPU, CUDA, ROCM], ids=["cpu", "cuda", "rocm"])
@pytest.mark.parametrize("name,verdict", list(_verdict_fixtures()), ids=[n for n, _ in _verdict_fixtures()])
def test_what_a_verdict_says_to_try_is_exactly_what_auto_runs_first(name, verdict, platform):
    said = suggest.for_verdict(verdict, platform_facts=platform)
    text = suggest.sentence(said)
    named = {n for n in registry.names() if re.search(rf"\b{n}\b", text)}
    plan = scenarios.stages(scenarios.Pointers(), [verdict], platform, (), ["baseline"])
    first = {s.name for st, scs in plan if st == "evidence" for s in scs}
    assert named == {s["fix"] for s in said} and named <= first and first == named


def test_a_host_stuck_in_a_launch_points_at_module_loading_before_launch_blocking():
    got = [m.fix for m in answers.suggest(registry.load().values(), v(cls="sync", api="cuLaunchKernel"), CUDA)]
    assert got[:2] == ["module_loading_eager", "launch_blocking"]


SEGFAULT_IN_OWN_OP = {**v(status="crash", cls="unknown", in_flight=op("holdout.bad_gather.default", device="cpu")),
                      "owner": {"kind": "program", "where": "prog.py:19 in bad_gather", "why": "a ctypes call"}}


# The two shapes: the program's line launched the op, or the program registered the kernel, so the owner
# is the program; yet what the verdict shows directly (the launch the host is stuck in, the transposed operand)
# is what the fix changes.
LAZY_LOADING = {**v(cls="sync", in_flight=op("aten.bitwise_or_.Tensor", shapes=((1,), (1,)), dtype="torch.int32"),
                    api="cuLaunchKernel"),
                "owner": {"kind": "program", "where": "lazy.py:23 in main", "why": "a hang (sync) in the program's code"}}
OWN_GEMM_KERNEL = {**v(cls="host_lock", in_flight=op("aten.mm.default", strides=((16, 1), (1, 16)), device="cpu")),
                   "owner": {"kind": "program", "where": "own_gemm_kernel.py:17 in deadlock (inside aten.mm.default)",
                             "why": "a hang (host_lock) in a ctypes call from the program's code"}}


@pytest.mark.parametrize("verdict,platform,fix,fact,coarse", [
    (LAZY_LOADING, CUDA, "module_loading_eager", "driver_call=cuLaunchKernel", "launch_blocking"),
    (OWN_GEMM_KERNEL, CPU, "contiguous_gemm_inputs", "operands=transposed", "omp_single_thread"),
], ids=["host stuck in a launch from the program's line", "the program's own kernel over aten.mm"])
def test_direct_evidence_is_tried_whoever_owns_the_culprit(verdict, platform, fix, fact, coarse):
    said = suggest.for_verdict(verdict, platform_facts=platform)
    assert said and said[0]["fix"] == fix and fact in said[0]["facts"], said
    got = scenarios.plan(scenarios.Pointers(), [verdict], platform, ("sync",), ["baseline"])
    first = dict(got.stages).get("evidence") or ()
    assert fix in {s.name for s in first}, got
    assert fix not in {t["scenario"] for t in got.skipped}
    # what rests on coarser facts only (a class) is still ruled out by the owner, with why
    skipped = {t["scenario"]: t["why"] for t in got.skipped}
    assert "owner=program" in skipped[coarse], skipped
    assert "apply with:" in suggest.sentence(said)


# A fault whose owner memcheck observed: the faulting access is in the program's own kernel (its source named).
# The program's last words say a fault happened, memcheck says whose code made it: no platform setting answers it.
OWN_KERNEL_FAULT = {**v(status="error", cls="illegal_address", stderr="CUDA error: an illegal memory access was encountered"),
                    "owner": {"kind": "program", "where": "kernel oob_write (ext.cu:12)",
                              "why": "compute-sanitizer found the faulting access in kernel oob_write"},
                    "memcheck": {"errors": [{"kernel": "oob_write", "file": "/work/ext.cu", "line": 12}]}}


def test_an_observed_owner_outranks_the_programs_last_words():
    assert "cpu_fallback" not in {s["fix"] for s in suggest.for_verdict(OWN_KERNEL_FAULT, platform_facts=CUDA)}
    assert answers.ruled_out(registry.get("cpu_fallback"), [OWN_KERNEL_FAULT], CUDA) is not None
    inferred = {k: v_ for k, v_ in OWN_KERNEL_FAULT.items() if k != "memcheck"}   # the owner read from frames only
    assert "cpu_fallback" in {s["fix"] for s in suggest.for_verdict(inferred, platform_facts=CUDA)}
    assert answers.brief(OWN_KERNEL_FAULT).get("owner_seen") is True


def test_a_segfault_in_the_programs_op_gets_no_sdpa_or_dataloader_scenario():
    got = scenarios.plan(scenarios.Pointers(), [SEGFAULT_IN_OWN_OP], CPU, ("unknown",), ["baseline"])
    assert got.stages == ()
    skipped = {t["scenario"]: t["why"] for t in got.skipped}
    usable = {n for n, f in registry.load().items() if f.applies(CPU)}
    assert set(skipped) == usable - {"baseline"}
    assert "owner=program" in skipped["sdpa_backend_math"] and "cls=unknown" in skipped["dataloader_spawn"]
    assert suggest.for_verdict(SEGFAULT_IN_OWN_OP, platform_facts=CPU) == ()   # nothing to try, nothing said


@pytest.mark.parametrize("verdict,fix,out", [
    (v(cls="host_lock"), "omp_single_thread", False),                          # its own evidence
    (v(cls="host_lock", in_flight=op("aten.mm.default", device="cpu")), "sdpa_backend_math", True),  # op is a GEMM
    (v(cls="sync", in_flight=op("aten._local_scalar_dense.default", shapes=((),))), "sdpa_backend_math", False),
    (v(status="crash", cls="gpu_page_fault", stderr="Memory access fault by GPU node-1"), "rocm_safe", False),
    (v(status="crash", cls="gpu_page_fault"), "launch_blocking", True),        # answers a hang, class unknown/sync
    ({**v(cls="worker_stuck"), "owner": {"kind": "program"}}, "dataloader_no_workers", False),
    ({**v(cls="host_lock"), "owner": {"kind": "program"}}, "omp_single_thread", True),
    ({"status": "ok"}, "omp_single_thread", False),                           # nothing failed: nothing ruled out
    (LAZY_LOADING, "module_loading_eager", False),                            # the driver call, whoever's line
    (OWN_GEMM_KERNEL, "contiguous_gemm_inputs", False),                       # the operands, whoever's kernel
    (OWN_GEMM_KERNEL, "omp_single_thread", True),                             # a class alone: the owner decides
    ({**v(cls="sync"), "owner": {"kind": "program"}}, "alloc_async", True),   # its driver call was not seen
])
def test_what_the_evidence_rules_out(verdict, fix, out):
    assert (answers.ruled_out(registry.get(fix), [verdict], ROCM if "rocm" in fix else CUDA) is not None) is out


def test_asking_for_all_still_runs_all():
    picked, is_auto = scenarios.parse("all")
    assert not is_auto and {s.name for s in picked} == {"baseline", *registry.names()}
