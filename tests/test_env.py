"""Environment facts on this CPU machine: real probes, real children, real deadlines."""
from __future__ import annotations

import dataclasses
import functools
import json
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

from gpulab import env as E
from gpulab import proc
from gpulab.env import cli as C
from gpulab.env import facts as F
from gpulab.env import probe as P
from gpulab.env import rules as R
from gpulab.env.child import _cpu_choice
from gpulab.workloads import WorkloadConfig

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
    assert list(table.index) == ["flash", "efficient", "cudnn", "math"]  # indexed by backend for the report
    assert table["selected"].sum() == 1


def test_cpu_refusal_reasons_come_from_torch():
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 2, 8, 16)
    k = torch.randn(1, 2, 16, 8).transpose(-1, -2)  # last-dim stride != 1: the fused CPU kernel refuses
    usable, reasons = _cpu_choice(torch, SDPBackend.FLASH_ATTENTION, (q, k, q, None), sdpa_kernel)
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
    with proc.Child([sys.executable, "-c", "import time; time.sleep(30)"]) as target:
        time.sleep(0.3)
        code = proc.run([spy, "dump", "--pid", str(target.pid)], timeout_s=20, capture=True).returncode
    assert (code == 0) is p["permitted"]  # py-spy agrees with the probe


def test_tools_and_env_vars():
    f = real_facts()
    assert set(f["tools"]) == set(F.TOOLS)
    for name, d in f["tools"].items():
        assert (d["path"] is None) is (shutil.which(name) is None and F.which(name) is None)
    gdb = f["tools"]["gdb"]
    if gdb["path"]:
        assert "GDB" in gdb["version"] or "gdb" in gdb["version"]
    assert F.env_vars({"CUDA_MODULE_LOADING": "LAZY", "HOME": "/x", "NCCL_DEBUG": "INFO", "HSA_X": "1"}) == \
        {"CUDA_MODULE_LOADING": "LAZY", "HSA_X": "1", "NCCL_DEBUG": "INFO"}


@pytest.mark.parametrize("sep", ["_", "-"])  # the notebook's spelling, and the dashed alias
def test_main_writes_json(tmp_path, capsys, sep):
    out = tmp_path / "sub" / "env.json"
    code = E.main(["--json", str(out), "--no-sdpa-run", "--batch", "1", "--heads", "1", f"--head{sep}dim", "8",
                   f"--text{sep}tokens", "4", f"--image{sep}tokens", "4", "--device", "cpu"])
    assert code == 0
    data = json.loads(out.read_text())
    assert set(data) == {"facts", "risks", "suggested_scenarios"}
    assert data["facts"]["sdpa"]["shape"] == [1, 1, 8, 8]
    assert "run" not in data["facts"]["sdpa"]["backends"]["math"]
    text = capsys.readouterr().out
    assert "Platform risks matched" in text and "SDPA backends" in text


def _exit_code(argv: list[str]) -> int:
    """main's return value, or the code argparse exits with."""
    try:
        return E.main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize("argv,needle", [
    (["--dtype", "float8"], "float8"),
    (["--rung", "train"], "train"),
    (["--sdpa_backend", "xformers"], "xformers"),
    (["--batch", "0"], "batch=0"),
    (["--head_dim", "x"], "'x'"),
    (["--device", "tpu"], "device='tpu'"),
    (["--rules", "/nonexistent/risks.yaml"], "/nonexistent/risks.yaml"),
])
def test_main_bad_value_is_a_clear_error(capsys, argv, needle):
    assert _exit_code(argv) == 2
    out, err = capsys.readouterr()
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert out == ""  # nothing was probed


@pytest.mark.parametrize("case", ["folder", "parent_is_a_file", "parent_not_writable"])
def test_main_refuses_a_bad_json_path_before_probing(tmp_path, capsys, case):
    if case == "folder":
        target, named = tmp_path, tmp_path
    elif case == "parent_is_a_file":
        (tmp_path / "file").write_text("x")
        target = tmp_path / "file" / "env.json"
        named = target.parent
    else:  # /proc takes no new files, even from root (a chmod'ed folder would not stop root)
        target = Path("/proc/env.json")
        named = target.parent
    before = sorted(tmp_path.rglob("*"))
    t0 = time.monotonic()
    assert _exit_code(["--json", str(target)]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and repr(str(named)) in lines[0] and "Traceback" not in err, err
    assert out == "" and "[gpulab env]" not in err and time.monotonic() - t0 < 5  # no probe ran
    assert sorted(tmp_path.rglob("*")) == before and not target.is_file()


def test_command_bad_json_path_is_one_line_and_exit_2(tmp_path):
    """The real command (`python -m gpulab.env`): exit 2, one line, no traceback, nothing written."""
    r = proc.run([sys.executable, "-m", "gpulab.env", "--json", str(tmp_path)], timeout_s=60, capture=True)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and str(tmp_path) in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", list(C.WORKLOAD_FLAGS))
def test_help_names_flags_as_the_notebook_does_with_defaults_and_an_example(capsys, name):
    with pytest.raises(SystemExit) as exc:
        E.main(["--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    default = getattr(WorkloadConfig(), name)
    assert f"--{name} " in text
    assert "_" not in name or f"--{name.replace('_', '-')} " not in text  # the dashed alias stays hidden
    assert f"{C.WORKLOAD_FLAGS[name][0]} (default: {default})" in " ".join(text.split())
    assert "example: gpulab env --json" in text


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
    assert proc.run([gcc, "-shared", "-fPIC", "-o", str(lib), str(src), "-lpthread"], timeout_s=60).returncode == 0
    import os
    env = dict(os.environ, LD_PRELOAD=str(lib))
    f = E.collect(SMALL, run_sdpa=True, timeouts={"startup": 2.0}, probe_env=env)
    assert f["torch_probe_status"] == "hang" and f["torch_probe_stuck_in"] == "startup"
    assert f["torch_version"] is None and f["sdpa"] is None
    assert f["env_vars"]["LD_PRELOAD"] == str(lib)
    assert "probe:startup" in f["errors"]
    fired = {m.rule_id: m for m in R.evaluate(f, R.load_rules())}
    assert "library_load_deadlock" in fired
    assert set(fired["library_load_deadlock"].fixes) == {"module_loading_lazy", "module_loading_eager"}


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
        E.workload_config(params)
    assert needle in str(exc.value)


def test_workload_ignores_other_shared_keys():
    w = E.workload_config({"workload": "builtin", "layers": 2, "lora_rank": 8, "steps": 10, "batch": 3})
    assert w.batch == 3 and w.attention("cpu").seq_len == 80


def test_import_gpulab_env_does_not_import_torch():
    code = ("import sys, gpulab, gpulab.env, gpulab.env.rules, gpulab.env.child; gpulab.env.rules.load_rules(); "
            "print('torch' in sys.modules)")
    out = proc.run([sys.executable, "-c", code], timeout_s=60, capture=True)
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


@pytest.mark.parametrize("over", [{}, {"dtype": "bfloat16", "device": "cuda"}, {"text_tokens": 3}, {"rung": "sdpa"}])
@pytest.mark.parametrize("unmasked", [False, True])
def test_probe_spec_is_the_workloads_attention_call(over, unmasked):
    """The child is told exactly cfg.attention(...) (or its unmasked variant), with 'auto' left for the
    child to resolve once it knows the device."""
    cfg = WorkloadConfig(**over)
    spec = P.probe_spec(cfg, unmasked)
    call = cfg.attention(cfg.device)
    want = call.unmasked() if unmasked else call
    assert spec["call"] == {**dataclasses.asdict(want), "dtype": cfg.dtype}
    assert spec["device"] == cfg.device and spec["requires_grad"] is (cfg.rung in ("step", "steps"))
    json.dumps(spec)


@pytest.mark.parametrize("selected,usable,want", [
    ("math", ["flash", "math"], ["math", "flash"]),      # the selected one first, even math
    ("flash", ["flash", "math"], ["flash", "math"]),
    ("cudnn", ["flash", "efficient", "cudnn", "math"], ["cudnn", "flash", "efficient", "math"]),
    ("efficient", ["efficient"], ["efficient"]),
    ("error", ["math"], ["math"]),
])
def test_run_order_selected_first_then_fused_then_math(selected, usable, want):
    sdpa = {"selected": selected, "backends": {b: {"usable": b in usable} for b in P.REPORT_ORDER}}
    assert P.run_order(sdpa) == want


def test_unmasked_variant_runs_without_the_mask():
    f = E.collect(SMALL, unmasked=True, run_sdpa=False)
    assert f["torch_probe_status"] == "ok" and f["sdpa"]["mask"] is None
    assert f["sdpa"]["call"].endswith("no mask") and f["workload"]["call"]["mask"] == "none"
    assert real_facts()["sdpa"]["mask"].startswith("bool key-padding")
