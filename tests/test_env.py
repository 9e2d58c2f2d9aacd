"""Environment facts on this CPU machine: real probes, real children, real deadlines."""
from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from importlib import metadata

import pytest

from gpulab import env as E
from gpulab.env import rules as R

SMALL = {"batch": 1, "heads": 2, "head_dim": 16, "text_tokens": 8, "image_tokens": 24, "device": "cpu",
         "rung": "step"}


@functools.lru_cache(maxsize=1)
def real_facts() -> dict:
    """One real collect() shared by this file and test_rules.py (it costs a torch import in a child)."""
    return E.collect(SMALL)


def test_collect_returns_documented_keys():
    f = real_facts()
    assert set(E.FACT_KEYS) <= set(f)
    json.dumps(f)  # JSON-able as is
    assert f["cpu_arch"] in ("x86_64", "aarch64")
    assert f["torch_version"] == metadata.version("torch")
    assert f["device_kind"] == "cpu" and f["gpu_kind"] is None and f["arch_in_wheel"] == "n/a"
    assert f["torch_probe_status"] == "ok" and f["errors"] == {}
    assert [s["stage"] for s in f["probe_stages"][:3]] == ["import_torch", "cuda_init", "sdpa_select"]
    assert f["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert f["host_memory_gb"] and f["host_memory_gb"] > 0.1


def test_sdpa_facts_on_cpu():
    f = real_facts()
    sdpa = f["sdpa"]
    assert sdpa["shape"] == [1, 2, 32, 16] and sdpa["dtype"] == "float32" and sdpa["requires_grad"]
    assert f["sdpa_selected"] in ("flash", "math")
    assert sdpa["cpu_path"].startswith(f["sdpa_selected"])
    for b in ("efficient", "cudnn"):
        assert not sdpa["backends"][b]["usable"] and "CUDA/ROCm-only" in sdpa["backends"][b]["reasons"][0]
    for b in ("flash", "math"):
        if sdpa["backends"][b]["usable"]:
            run = sdpa["backends"][b]["run"]
            assert run["status"] == "ok" and run["ms"] > 0 and run["nonfinite"] == 0 and run["with_backward"]
    table = E.sdpa_table(f)
    assert list(table["backend"]) == ["flash", "efficient", "cudnn", "math"]
    assert table["selected"].sum() == 1


def test_cpu_refusal_reasons_come_from_torch():
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 2, 8, 16)
    k = torch.randn(1, 2, 16, 8).transpose(-1, -2)  # last-dim stride != 1: the fused CPU kernel refuses
    usable, reasons = E._cpu_choice(torch, SDPBackend.FLASH_ATTENTION, (q, k, q, None), sdpa_kernel)
    assert usable is False
    assert any("stride" in r for r in reasons), reasons
    assert not any("Triggered internally" in r for r in reasons)


def test_ptrace_probe_gives_a_real_answer():
    p = real_facts()["ptrace"]
    assert isinstance(p["permitted"], bool), p
    assert p["sibling"]["ok"] is p["permitted"]
    if not p["permitted"]:
        assert p["sibling"]["errno"] in (1, 13)  # EPERM / EACCES
    spy = shutil.which("py-spy")
    if spy is None:
        pytest.skip("py-spy is not installed: no independent check")
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        import time
        time.sleep(0.3)
        code = subprocess.run([spy, "dump", "--pid", str(target.pid)], capture_output=True, timeout=20).returncode
    finally:
        target.kill()
        target.wait()
    assert (code == 0) is p["permitted"]  # py-spy agrees with the probe


def test_tools_and_env_vars():
    f = real_facts()
    assert set(f["tools"]) == set(E.TOOLS)
    for name, d in f["tools"].items():
        assert (d["path"] is None) is (shutil.which(name) is None and E._which(name) is None)
    gdb = f["tools"]["gdb"]
    if gdb["path"]:
        assert "GDB" in gdb["version"] or "gdb" in gdb["version"]
    assert E.env_vars({"CUDA_MODULE_LOADING": "LAZY", "HOME": "/x", "NCCL_DEBUG": "INFO", "HSA_X": "1"}) == \
        {"CUDA_MODULE_LOADING": "LAZY", "HSA_X": "1", "NCCL_DEBUG": "INFO"}


def test_main_writes_json(tmp_path, capsys):
    out = tmp_path / "sub" / "env.json"
    code = E.main(["--json", str(out), "--no-sdpa-run", "--batch", "1", "--heads", "1", "--head-dim", "8",
                   "--text-tokens", "4", "--image-tokens", "4", "--device", "cpu"])
    assert code == 0
    data = json.loads(out.read_text())
    assert set(data) == {"facts", "risks", "suggested_scenarios"}
    assert data["facts"]["sdpa"]["shape"] == [1, 1, 8, 8]
    assert "run" not in data["facts"]["sdpa"]["backends"]["math"]
    text = capsys.readouterr().out
    assert "Platform risks matched" in text and "SDPA backends" in text


def test_main_bad_value_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        E.main(["--dtype", "float8"])
    assert "float8" in capsys.readouterr().err


_DEADLOCK_C = r"""
#include <pthread.h>
static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
__attribute__((constructor)) static void init(void) { pthread_mutex_lock(&m); pthread_mutex_lock(&m); }
"""


def test_library_constructor_deadlock_is_observed(tmp_path):
    """A shared library whose constructor deadlocks (the static-init hang class) is preloaded into the
    probe child: the probe must report a hang at startup, kill it, and the rule must fire."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is needed to build the deadlocking library")
    src, lib = tmp_path / "dl.c", tmp_path / "libdeadlock.so"
    src.write_text(_DEADLOCK_C)
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(lib), str(src), "-lpthread"], check=True, timeout=60)
    import os
    env = dict(os.environ, LD_PRELOAD=str(lib))
    f = E.collect(SMALL, run_sdpa=True, timeouts={"startup": 2.0}, probe_env=env)
    assert f["torch_probe_status"] == "hang" and f["torch_probe_stuck_in"] == "startup"
    assert f["torch_version"] is None and f["sdpa"] is None
    assert f["env_vars"]["LD_PRELOAD"] == str(lib)
    assert "probe:startup" in f["errors"]
    fired = {m.rule_id: m for m in R.evaluate(f, R.load_rules())}
    assert "library_load_deadlock" in fired
    assert set(fired["library_load_deadlock"].fixes) == {"cuda_module_loading_lazy", "cuda_module_loading_eager"}


@pytest.mark.parametrize("cc,arch_list,want", [
    ("9.0", ["sm_80", "sm_90", "compute_90"], "sass"),
    ("9.0", ["sm_80", "sm_90a"], "sass"),
    ("12.1", ["sm_80", "sm_90", "sm_100", "sm_120", "compute_120"], "sass_family"),
    ("12.1", ["sm_80", "sm_90", "sm_120a"], "missing"),         # arch-specific cubins are not portable
    ("12.1", ["sm_80", "sm_90", "compute_90"], "ptx_only"),
    ("12.1", ["sm_80", "sm_90"], "missing"),
    ("8.6", ["sm_80", "sm_90"], "sass_family"),
    ("7.5", ["sm_80", "sm_90", "compute_90"], "missing"),       # PTX newer than the device cannot JIT
    (None, [], "n/a"),
])
def test_classify_arch_cuda(cc, arch_list, want):
    assert E.classify_arch(cc, None, arch_list) == want


@pytest.mark.parametrize("gfx,want", [("gfx1030", "sass"), ("gfx1031", "missing")])
def test_classify_arch_rocm(gfx, want):
    assert E.classify_arch(None, gfx, ["gfx90a", "gfx1030", "gfx1100"]) == want


@pytest.mark.parametrize("attrs,want", [
    ({"integrated": 1, "pageable_memory_access": 1, "pageable_uses_host_page_tables": 1}, "integrated"),
    ({"integrated": 0, "pageable_memory_access": 1, "pageable_uses_host_page_tables": 1}, "ats"),
    ({"integrated": 0, "pageable_memory_access": 1, "pageable_uses_host_page_tables": 0}, "hmm"),
    ({"integrated": 0, "pageable_memory_access": 0, "pageable_uses_host_page_tables": 0}, "none"),
    ({"is_integrated": True}, "integrated"),
])
def test_classify_unified(attrs, want):
    assert E.classify_unified(attrs) == want


@pytest.mark.parametrize("params,needle", [
    ({"dtype": "float8"}, "dtype='float8'"),
    ({"rung": "train"}, "rung='train'"),
    ({"sdpa_backend": "xformers"}, "sdpa_backend='xformers'"),
    ({"device": "tpu"}, "device='tpu'"),
    ({"batch": 0}, "batch=0"),
    ({"heads": "4"}, "heads='4'"),
    ({"colour": 1}, "unknown workload key"),
])
def test_workload_errors(params, needle):
    with pytest.raises(ValueError) as exc:
        E.AttnWorkload.from_dict(params)
    assert needle in str(exc.value)


def test_workload_ignores_other_shared_keys():
    w = E.AttnWorkload.from_dict({"workload": "builtin", "layers": 2, "lora_rank": 8, "steps": 10, "batch": 3})
    assert w.batch == 3 and w.seq_len == 80


def test_import_gpulab_env_does_not_import_torch():
    code = "import sys, gpulab, gpulab.env, gpulab.env.rules; gpulab.env.rules.load_rules(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_sdpa_run_past_its_deadline_is_killed_and_the_others_still_run():
    """The selected backend's run gets a deadline far shorter than the kernel (7 calls with backward):
    its child must be killed as a hang, and the remaining backend measured in a fresh child."""
    f = E.collect(dict(SMALL, rung="step"), timeouts={"sdpa_run:flash": 0.0005})
    if f["sdpa_selected"] != "flash":
        pytest.skip(f"this torch selects {f['sdpa_selected']} on CPU, not the fused flash kernel")
    assert f["sdpa_hung"] == ["flash"] and f["torch_probe_status"] == "ok"
    runs = {b: i.get("run") for b, i in f["sdpa"]["backends"].items()}
    assert runs["flash"]["status"] == "hang"
    assert runs["math"]["status"] == "ok" and runs["math"]["ms"] > 0
    assert [s["stage"] for s in f["probe_stages"] if s["stage"].startswith("sdpa_run")] == \
        ["sdpa_run:flash", "sdpa_run:math"]
    fired = {m.rule_id for m in R.evaluate(f, R.load_rules())}
    assert "sdpa_backend_hangs" in fired
