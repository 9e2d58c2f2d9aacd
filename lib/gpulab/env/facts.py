"""The fact schema, and the facts gathered without torch: host, environment variables, tools, ptrace.

These run in the parent (a torch import that deadlocks must not keep us from reporting the rest); every
external program runs as a gpulab.proc child with a deadline, and no probe raises: a failure is a fact.
"""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from gpulab import proc

# Documented fact keys (rules may only refer to these; dotted paths into the nested ones are allowed).
FACT_KEYS: dict[str, str] = {
    "gpulab_version": "gpulab package version",
    "collected_at": "UTC time the facts were collected",
    "python_version": "Python version of the interpreter running the workload",
    "python_executable": "path of that interpreter",
    "os": "operating system and kernel (platform.platform())",
    "os_release": "distribution (PRETTY_NAME of /etc/os-release)",
    "libc": "C library and version",
    "cpu_arch": "CPU architecture, normalized: x86_64 | aarch64 | ...",
    "cpu_model": "CPU model name",
    "cpu_count": "logical CPUs",
    "host_memory_gb": "host RAM in GB (1e9 bytes)",
    "in_container": "True when /.dockerenv or a container cgroup is seen",
    "nvidia_driver": "NVIDIA kernel driver version (/proc/driver/nvidia/version), or None",
    "rocm_install_version": "ROCm version of /opt/rocm (.info/version), or None",
    "torch_version": "torch.__version__",
    "torch_git": "torch.version.git_version",
    "torch_debug": "torch.version.debug",
    "cuda_version": "CUDA version torch was built with (torch.version.cuda), or None",
    "hip_version": "HIP version torch was built with (torch.version.hip), or None",
    "cudnn_version": "cuDNN version (MIOpen on ROCm) as torch reports it, or None",
    "nccl_version": "NCCL (RCCL) version torch links, or None",
    "cuda_driver_version": "CUDA driver API version (cuDriverGetVersion), e.g. 13000, or None",
    "cpu_capability": "the vectorized CPU kernels torch selected (torch.backends.cpu.get_cpu_capability())",
    "device_kind": "cuda | rocm | cpu: what the workload's device resolves to",
    "gpu_kind": "cuda | rocm | None: the GPU present, even when the workload runs on the CPU",
    "device_count": "GPUs torch sees",
    "device_name": "name of device 0 (or the CPU model)",
    "compute_capability": "CUDA compute capability 'major.minor' of device 0, or None",
    "gfx_arch": "ROCm gfx architecture of device 0 (gcnArchName without feature flags), or None",
    "device_memory_gb": "total memory of device 0 in GB (1e9 bytes), or None",
    "multiprocessors": "SMs / CUs of device 0",
    "unified_memory": "none | integrated | ats | hmm: whether the GPU shares or coherently maps host memory",
    "unified_memory_attrs": "raw driver attributes behind unified_memory",
    "arch_list": "architectures compiled into the torch wheel (torch.cuda.get_arch_list())",
    "arch_in_wheel": "sass | sass_family | ptx_only | missing | n/a: how device 0's arch is covered",
    "cuda_init_s": "seconds the first CUDA/HIP initialization took",
    "sdpa": "SDPA report: the call, enabled flags, per-backend usable/reasons/run, selected backend",
    "sdpa_selected": "backend PyTorch selects for the workload: flash | efficient | cudnn | math | ... | None",
    "sdpa_fused_usable": "fused backends usable for the workload's shapes, dtype and mask",
    "sdpa_hung": "backends whose real run on the workload hung (killed at the deadline)",
    "sdpa_failed": "backends whose real run on the workload raised or crashed",
    "env_vars": "environment variables that change GPU/PyTorch behaviour (only those set)",
    "tools": "investigation tools: py-spy, gdb, cuda-gdb, compute-sanitizer (path, version)",
    "native_stack_tools": "tools present that can take native stacks (py-spy, gdb)",
    "ptrace": "ptrace probe: sibling/descendant attach results, yama ptrace_scope, CAP_SYS_PTRACE",
    "ptrace_permitted": "True when a tool may attach to a sibling process (py-spy/gdb on the workload)",
    "ptrace_scope": "/proc/sys/kernel/yama/ptrace_scope, or None when Yama is absent",
    "torch_probe_status": "ok | hang | crash | error: how the torch/GPU probe child ended",
    "torch_probe_stuck_in": "stage the probe child was in when it hung or died, or None",
    "probe_stages": "per-stage status and seconds of the probe children",
    "workload": "the attention call the SDPA facts were computed for, as asked (device, dtype may be auto)",
    "errors": "probes that failed, with their error",
}
NESTED_FACTS = ("sdpa", "env_vars", "tools", "ptrace", "unified_memory_attrs", "workload", "probe_stages")

# Variables that change behaviour: exact names and prefixes.
ENV_EXACT = ("CUDA_MODULE_LOADING", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
             "CUDA_LAUNCH_BLOCKING", "PYTORCH_NO_CUDA_MEMORY_CACHING", "PYTORCH_NO_HIP_MEMORY_CACHING",
             "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "AMD_LOG_LEVEL",
             "AMD_SERIALIZE_KERNEL", "AMD_SERIALIZE_COPY", "CUBLAS_WORKSPACE_CONFIG", "OMP_NUM_THREADS",
             "LD_PRELOAD", "LD_LIBRARY_PATH", "CUDA_ENABLE_USER_TRIGGERED_COREDUMP",
             "CUDA_ENABLE_COREDUMP_ON_EXCEPTION", "CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_HOME")
ENV_PREFIXES = ("TORCH_", "PYTORCH_", "HSA_", "HIP_", "NCCL_", "CUDNN_", "CUBLAS", "TORCHINDUCTOR_", "MIOPEN_",
                "HIPBLASLT_", "ROCBLAS_", "TRITON_")

TOOLS = ("py-spy", "gdb", "cuda-gdb", "compute-sanitizer")
NATIVE_STACK_TOOLS = ("py-spy", "gdb")
TOOL_DIRS = ("/usr/local/cuda/bin", "/opt/cuda/bin")
TOOL_TIMEOUT_S = 20.0
PTRACE_TIMEOUT_S = 10.0


def _normalize_arch(machine: str) -> str:
    m = machine.lower()
    return {"arm64": "aarch64", "amd64": "x86_64", "x64": "x86_64"}.get(m, m)


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def host_facts() -> dict:
    """OS, CPU, memory, container, driver: read from /proc and /etc, so they exist even when torch hangs."""
    facts: dict[str, Any] = {}
    facts["python_version"] = platform.python_version()
    facts["python_executable"] = sys.executable
    facts["os"] = platform.platform()
    rel = _read("/etc/os-release") or ""
    m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', rel, re.M)
    facts["os_release"] = m.group(1) if m else None
    facts["libc"] = " ".join(platform.libc_ver()).strip() or None
    facts["cpu_arch"] = _normalize_arch(platform.machine())
    cpuinfo = _read("/proc/cpuinfo") or ""
    m = re.search(r"^(?:model name|Model|CPU part)\s*:\s*(.+)$", cpuinfo, re.M)
    facts["cpu_model"] = m.group(1).strip() if m else (platform.processor() or None)
    facts["cpu_count"] = os.cpu_count()
    meminfo = _read("/proc/meminfo") or ""
    m = re.search(r"^MemTotal:\s+(\d+) kB", meminfo, re.M)
    facts["host_memory_gb"] = round(int(m.group(1)) * 1024 / 1e9, 2) if m else None
    cgroup = _read("/proc/1/cgroup") or ""
    facts["in_container"] = (os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv")
                             or any(w in cgroup for w in ("docker", "kubepods", "containerd", "lxc")))
    drv = _read("/proc/driver/nvidia/version")
    m = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", drv or "")
    facts["nvidia_driver"] = m.group(1) if m else None
    rocm = _read("/opt/rocm/.info/version")
    facts["rocm_install_version"] = rocm.strip() if rocm else None
    return facts


def env_vars(environ: dict | None = None) -> dict:
    """Only the variables that change GPU/PyTorch behaviour, and only those set."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in sorted(environ)
            if k in ENV_EXACT or any(k.startswith(p) for p in ENV_PREFIXES)}


def _run_bounded(argv: list[str], timeout_s: float) -> tuple[int | None, str]:
    """Run a short command as a gpulab.proc child; (exit code or None on overrun, stdout+stderr). Never raises."""
    try:
        r = proc.run(argv, timeout_s=timeout_s, capture=True)
    except OSError as exc:
        return None, f"{type(exc).__name__}: {exc}"
    text = r.stdout + r.stderr
    if r.timed_out:
        return None, f"timed out after {timeout_s:g} s; output so far: {text[-500:]}"
    return r.returncode, text


def which(tool: str) -> str | None:
    """Like shutil.which, also looking in this interpreter's bin (a venv not on PATH) and the CUDA bins."""
    found = shutil.which(tool)
    if found:
        return found
    extra = [str(Path(sys.executable).parent)] + list(TOOL_DIRS)
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        extra.insert(0, str(Path(home) / "bin"))
    return shutil.which(tool, path=os.pathsep.join(extra))


def tools(timeout_s: float = TOOL_TIMEOUT_S) -> dict:
    """Path and version of each investigation tool, or why it is unavailable."""
    out = {}
    for tool in TOOLS:
        path = which(tool)
        if not path:
            out[tool] = {"path": None, "version": None, "error": "not found on PATH"}
            continue
        code, text = _run_bounded([path, "--version"], timeout_s)
        # cuda-gdb/compute-sanitizer print banners; keep the first line with a version number
        version = next((l.strip() for l in text.splitlines() if re.search(r"\d+\.\d+", l)), None)
        out[tool] = {"path": path, "version": version,
                     "error": None if code == 0 else (text.strip()[-300:] or f"exit {code}")}
    return out


_PTRACE_PROBER = r"""
import ctypes, json, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long
PTRACE_ATTACH, PTRACE_DETACH = 16, 17
def attach(pid):
    r = libc.ptrace(PTRACE_ATTACH, pid, None, None)
    if r != 0:
        e = ctypes.get_errno()
        return {"ok": False, "errno": e, "error": os.strerror(e)}
    try:
        os.waitpid(pid, 0x40000000)  # __WALL: wait for the attach stop
    except ChildProcessError:
        pass
    libc.ptrace(PTRACE_DETACH, pid, None, None)
    return {"ok": True, "errno": 0, "error": None}
res = {"sibling": attach(int(sys.argv[1]))}
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
try:
    res["descendant"] = attach(child)
finally:
    os.kill(child, 9)
    os.waitpid(child, 0)
print(json.dumps(res))
"""


def ptrace_probe(timeout_s: float = PTRACE_TIMEOUT_S) -> dict:
    """Try a real PTRACE_ATTACH, as py-spy/gdb would: from one child to its sibling (the watchdog's case)
    and to its own child. Reports Yama's ptrace_scope and CAP_SYS_PTRACE so the fix can be named."""
    scope_txt = _read("/proc/sys/kernel/yama/ptrace_scope")
    status = _read("/proc/self/status") or ""
    m = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", status, re.M)
    cap = bool(int(m.group(1), 16) & (1 << 19)) if m else None
    res: dict[str, Any] = {"ptrace_scope": int(scope_txt) if scope_txt and scope_txt.strip().isdigit() else None,
                           "cap_sys_ptrace": cap, "sibling": None, "descendant": None, "permitted": None,
                           "error": None}
    if not sys.platform.startswith("linux"):
        res["error"] = f"ptrace probe is Linux-only (platform {sys.platform})"
        return res
    try:
        with proc.Child([sys.executable, "-c", "import time; time.sleep(60)"], label="ptrace-target") as target:
            code, text = _run_bounded([sys.executable, "-c", _PTRACE_PROBER, str(target.pid)], timeout_s)
        try:
            got = json.loads(text.strip().splitlines()[-1])
            res["sibling"], res["descendant"] = got.get("sibling"), got.get("descendant")
            res["permitted"] = bool(res["sibling"] and res["sibling"].get("ok"))
        except (ValueError, IndexError):
            res["error"] = f"prober exited {code}: {text.strip()[-300:]}"
    except Exception as exc:  # noqa: BLE001 - a probe never raises
        res["error"] = f"{type(exc).__name__}: {exc}"
    return res


def derived(facts: dict) -> dict:
    """Facts the rules read directly, lifted out of the nested probe results."""
    p = facts.get("ptrace") or {}
    tl = facts.get("tools") or {}
    return {"ptrace_permitted": p.get("permitted"), "ptrace_scope": p.get("ptrace_scope"),
            "native_stack_tools": [k for k in NATIVE_STACK_TOOLS if (tl.get(k) or {}).get("path")]}
