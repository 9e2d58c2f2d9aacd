"""compute-sanitizer's memcheck report read as a verdict needs it (pure, on report text in the formats the
tool prints: kernel+offset with and without source line, the older offset-file-line-kernel form, cuda-memcheck's
legacy form), and the bounded run says why it did not run where the tool is missing or the GPU is AMD's."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpulab.hang import memcheck

REPORTS = Path(__file__).parent / "fixtures" / "memcheck"


def _parse(name):
    return memcheck.parse((REPORTS / name).read_text())


@pytest.mark.parametrize("name,kernel,file,line,access,size,block,thread,address,problem,relation,distance,alloc_size", [
    ("oob_after_allocation.txt", "solver::count_literals(const solver::Cnf *)", None, None, "write", 4, "278,0,0",
     "0,0,0", "0x7fe71d810958", "out of bounds", "after", 85, 4),
    ("triton_read_with_line.txt", "matmul_kernel", "matmul_tri.py", 41, "read", 16, "0,0,0", "18,0,0",
     "0x74505bddcca0", "out of bounds", "after", 161, 1024),
    ("triton_old_style_before.txt", "fused_moe_kernel",
     "/opt/venv/lib/python3.12/site-packages/moelib/kernels/fused_moe.py", 171, "read", 16, "44,0,0", "96,0,0",
     "0x763995f8f000", "out of bounds", "before", 1241976832, 5033164800),
    ("inside_allocation_with_host_frames.txt", "copy_span(unsigned char *, int)", None, None, "write", 256, "0,0,0",
     "0,0,0", "0x147267fff80", "out of bounds", "inside", None, 20971520),
    ("misaligned_shared.txt", "tiledMul(const float *, const float *, float *, int, int, int, float, float)",
     "/home/user/gemm/src/pipeline_gemm.cu", 90, "read", 16, "0,0,0", "0,4,0", "0x10a8", "misaligned", None, None,
     None),
    ("cuda_memcheck_legacy.txt", "TrackParticles(Sim*, int, ParticleVault*, ParticleVault*)", None, None, "read", 8,
     "194,0,0", "127,0,0", "0x7f153e0002e8", "out of bounds", None, None, None),
])
def test_each_report_form_gives_kernel_place_thread_address_and_allocation(name, kernel, file, line, access, size,
                                                                          block, thread, address, problem, relation,
                                                                          distance, alloc_size):
    rep = _parse(name)
    assert rep.ran and len(rep.errors) == 1
    e = rep.errors[0]
    assert (e.kernel, e.file, e.line, e.access, e.size) == (kernel, file, line, access, size)
    assert (e.block, e.thread, e.address, e.problem) == (block, thread, address, problem)
    assert (e.relation, e.distance, e.allocation_size) == (relation, distance, alloc_size)
    text = e.sentence()
    assert address in text and f"block ({block})" in text


def test_the_api_error_and_the_summary_are_kept():
    rep = _parse("triton_read_with_line.txt")
    assert rep.error_count == 2
    assert rep.api_errors[0]["error"] == "cudaErrorIllegalAddress" and rep.api_errors[0]["api"] == "cudaDeviceSynchronize"
    assert "161 bytes after the nearest allocation" in rep.facts()[0]


def test_a_report_round_trips_through_the_verdict_json():
    rep = _parse("triton_read_with_line.txt")
    back = memcheck.from_dict(rep.to_dict())
    assert back.errors == rep.errors and back.to_dict()["errors"][0]["sentence"] == rep.errors[0].sentence()


def test_a_clean_report_has_no_error():
    rep = memcheck.parse("========= COMPUTE-SANITIZER\nhello\n========= ERROR SUMMARY: 0 errors\n")
    assert rep.ran and rep.errors == () and rep.error_count == 0


@pytest.mark.parametrize("signature,name", [
    ("oob_kernel(float *, long)", "oob_kernel"), ("void ns::detail::scatter<float>(float *, int)", "scatter"),
    ("_copy", "_copy"), (None, ""),
])
def test_kernel_name_is_the_name_a_source_defines(signature, name):
    assert memcheck.kernel_name(signature) == name


@pytest.mark.parametrize("cls,status,runs", [
    ("illegal_address", "error", True), ("misaligned_address", "crash", True), ("launch_failure", "error", True),
    ("device_assert", "error", False), ("illegal_address", "hang", False), ("gemm", "crash", False),
])
def test_memcheck_runs_only_for_the_faults_it_can_explain(cls, status, runs):
    assert memcheck.applies(cls, status) is runs


def test_on_rocm_it_says_there_is_no_memcheck(tmp_path):
    rep = memcheck.run([sys.executable, "-c", "pass"], tmp_path, rocm=True)
    assert not rep.available and not rep.ran and "ROCm" in rep.note and "AMD_LOG_LEVEL=4" in rep.note


def test_without_the_tool_it_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    if memcheck.tool() is not None:   # installed under /usr/local/cuda: nothing to show here
        pytest.skip("compute-sanitizer is installed under /usr/local/cuda on this machine")
    rep = memcheck.run([sys.executable, "-c", "pass"], tmp_path)
    assert not rep.ran and "not installed" in rep.note and rep.facts() == [f"memcheck: {rep.note}"]


# ------------------------------------------------------------------------------------ on a GPU: real faults

FIX = Path(__file__).parent / "fixtures"


def _watch(tmp_path, cmd, stall_s):
    from gpulab.fixes import suggest
    from gpulab.hang.watchdog import watch
    return watch.run(cmd, stall_s=stall_s, timeout_s=600, out_dir=tmp_path / "w", progress=print,
                     finish=suggest.with_suggestions)


@pytest.mark.gpu
@pytest.mark.parametrize("program,needs,stall_s,kernel,source", [
    ("gpu_triton_wild_store.py", "triton", 60.0, "_copy", "gpu_triton_wild_store.py"),
    ("gpu_extension_oob.py", "torch.utils.cpp_extension", 300.0, "oob_write", "oob_write"),
], ids=["triton kernel wild store", "cuda extension out of bounds"])
def test_the_programs_own_kernel_is_pinned_with_its_address(tmp_path, program, needs, stall_s, kernel, source):
    """class, the program's kernel and line, and (where compute-sanitizer is installed) the address, block,
    thread and the allocation it missed."""
    pytest.importorskip(needs)
    v = _watch(tmp_path, [sys.executable, str(FIX / program)], stall_s)
    print(json.dumps({k: v.to_dict()[k] for k in ("status", "class", "in_flight_op", "owner", "memcheck")},
                     indent=1, default=str))
    assert v.status == "error" and v.cls == "illegal_address", \
        "\n".join(v.evidence) + "\n--- the program's stderr, last 2000 chars ---\n" + v.stderr_tail
    assert v.owner["kind"] == "program", v.owner
    assert not v.suggested or all(s["fix"] != "cpu_fallback" for s in v.suggested)
    if memcheck.tool() is None:
        assert "not installed" in v.memcheck["note"]
        return
    assert v.memcheck["ran"] and v.memcheck["errors"], v.memcheck
    first = v.memcheck["errors"][0]
    assert kernel in first["kernel"] and first["address"] and first["block"] and first["thread"]
    # float32 elements; Triton may vectorize the store (on the H100 it wrote 8 bytes per thread)
    assert first["access"] == "write" and first["size"] in (4, 8, 16)
    assert kernel in v.owner["where"] or source in v.owner["where"]


@pytest.mark.gpu
def test_a_device_side_assert_from_the_programs_bad_index_names_the_kernel_and_the_line(tmp_path):
    v = _watch(tmp_path, [sys.executable, str(FIX / "bad_embedding_index.py"), "--device", "cuda"], 60.0)
    print(json.dumps({k: v.to_dict()[k] for k in ("status", "class", "in_flight_op", "owner", "evidence")},
                     indent=1, default=str))
    assert v.status == "error" and v.cls == "device_assert", v.evidence
    assert any("failed its check" in e and "block [" in e for e in v.evidence)
    assert v.owner["kind"] == "program" and "bad_embedding_index.py:20" in v.owner["where"]
    assert v.memcheck is None            # the assertion already names the kernel, block and thread
