"""The platform facts behind notebook 01 and `gpulab env`: what this machine is, measured, not assumed.

Facts are one JSON-able dict (keys documented in `FACT_KEYS`) that `gpulab.rules.evaluate` matches
against known platform problems. Everything that touches torch or the GPU runs in a child process in its
own process group, one stage at a time with a deadline per stage: a CUDA library that deadlocks while
loading, or an attention kernel that spins forever, becomes a fact (`torch_probe_status: hang`,
`sdpa_hung: [math]`) instead of a hung notebook. No probe raises; a failing probe records its error.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from gpulab import proc
from gpulab.workloads import sdpa_backend_enum

# ----------------------------------------------------------------------------------------------------
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
    "sdpa": "SDPA report: enabled flags, per-backend usable/reasons/run, selected backend, workload",
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
    "workload": "the attention workload the SDPA facts were computed for",
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
TOOL_DIRS = ("/usr/local/cuda/bin", "/opt/cuda/bin")

WORKLOAD_KEYS = ("batch", "heads", "head_dim", "text_tokens", "image_tokens", "dtype", "device", "rung",
                 "sdpa_backend", "padding_mask")
# Shared workload parameters that do not change the attention call: accepted and ignored.
WORKLOAD_IGNORED = ("workload", "layers", "lora_rank", "steps", "out_dir", "interactive")
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
RUNG_CHOICES = ("sdpa", "forward", "step", "steps")
BACKEND_CHOICES = ("auto", "math", "flash", "efficient", "cudnn")
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")
FUSED_BACKENDS = ("flash", "efficient", "cudnn")

# Deadlines per probe stage (seconds). A CUDA init on a big node or a first cuDNN call may take a while;
# anything past these is treated as stuck.
STAGE_TIMEOUT_S = {"startup": 120.0, "import_torch": 180.0, "cuda_init": 180.0, "sdpa_select": 90.0,
                   "sdpa_run": 90.0}
TOOL_TIMEOUT_S = 20.0
PTRACE_TIMEOUT_S = 10.0
_LINE = "GPULAB_PROBE "


@dataclass(frozen=True)
class AttnWorkload:
    """The attention call the SDPA facts are computed for: joint attention over text+image tokens with
    the boolean key-padding mask of gpulab.workloads (the last quarter of the text tokens are padding)."""
    batch: int = 2
    heads: int = 4
    head_dim: int = 32
    text_tokens: int = 16
    image_tokens: int = 64
    dtype: str = "auto"
    device: str = "auto"
    rung: str = "forward"
    sdpa_backend: str = "auto"
    padding_mask: bool = True  # False: no mask (what flash accepts), for comparisons

    def __post_init__(self):
        for name in ("batch", "heads", "head_dim", "text_tokens", "image_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < (0 if name == "text_tokens" else 1):
                raise ValueError(f"workload {name}={v!r} is not valid; it must be a positive integer")
        if not isinstance(self.padding_mask, bool):
            raise ValueError(f"workload padding_mask={self.padding_mask!r} is not valid; use true or false")
        if self.text_tokens + self.image_tokens < 1:
            raise ValueError("workload text_tokens + image_tokens must be at least 1")
        for name, choices in (("dtype", DTYPE_CHOICES), ("rung", RUNG_CHOICES),
                              ("sdpa_backend", BACKEND_CHOICES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"workload {name}={getattr(self, name)!r} is not valid; choose one of "
                                 f"{', '.join(choices)}")
        if str(self.device).split(":", 1)[0] not in ("auto", "cpu", "cuda"):
            raise ValueError(f"workload device={self.device!r} is not valid; choose one of auto, cpu, cuda "
                             f"(or cuda:N)")

    @classmethod
    def from_dict(cls, params: dict | None) -> "AttnWorkload":
        """Accepts the notebooks' shared workload parameters; an unknown key is an error."""
        params = dict(params or {})
        unknown = sorted(k for k in params if k not in WORKLOAD_KEYS and k not in WORKLOAD_IGNORED)
        if unknown:
            raise ValueError(f"unknown workload key(s) {unknown}; valid keys: {', '.join(WORKLOAD_KEYS)} "
                             f"(ignored: {', '.join(WORKLOAD_IGNORED)})")
        return cls(**{k: v for k, v in params.items() if k in WORKLOAD_KEYS})

    @property
    def seq_len(self) -> int:
        return self.text_tokens + self.image_tokens

    @property
    def needs_grad(self) -> bool:
        return self.rung in ("step", "steps")


# ----------------------------------------------------------------------------------------------------
# Host facts (no torch in this process).

def _normalize_arch(machine: str) -> str:
    m = machine.lower()
    return {"arm64": "aarch64", "amd64": "x86_64", "x64": "x86_64"}.get(m, m)


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _host_facts() -> dict:
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


def _run_bounded(argv: list[str], timeout_s: float, env: dict | None = None) -> tuple[int | None, str]:
    """Run a short command as a gpulab.proc child; (exit code or None on overrun, stdout+stderr). Never raises."""
    try:
        r = proc.run(argv, timeout_s=timeout_s, env=env, capture=True)
    except OSError as exc:
        return None, f"{type(exc).__name__}: {exc}"
    text = r.stdout + r.stderr
    if r.timed_out:
        return None, f"timed out after {timeout_s:g} s; output so far: {text[-500:]}"
    return r.returncode, text


def _which(tool: str) -> str | None:
    found = shutil.which(tool)
    if found:
        return found
    bin_dir = Path(sys.executable).parent  # a venv's py-spy when the venv is not on PATH
    extra = [str(bin_dir)] + list(TOOL_DIRS)
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        extra.insert(0, str(Path(home) / "bin"))
    return shutil.which(tool, path=os.pathsep.join(extra))


def tools(timeout_s: float = TOOL_TIMEOUT_S) -> dict:
    """Path and version of each investigation tool, or why it is unavailable."""
    out = {}
    for tool in TOOLS:
        path = _which(tool)
        if not path:
            out[tool] = {"path": None, "version": None, "error": "not found on PATH"}
            continue
        code, text = _run_bounded([path, "--version"], timeout_s)
        lines = [l.strip() for l in text.splitlines() if l.strip()]
        version = None
        for l in lines:  # cuda-gdb/compute-sanitizer print banners; keep the line with a version number
            if re.search(r"\d+\.\d+", l):
                version = l
                break
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
    target = None
    try:
        target = proc.spawn([sys.executable, "-c", "import time; time.sleep(60)"], label="ptrace-target")
        code, text = _run_bounded([sys.executable, "-c", _PTRACE_PROBER, str(target.pid)], timeout_s)
        try:
            got = json.loads(text.strip().splitlines()[-1])
            res["sibling"], res["descendant"] = got.get("sibling"), got.get("descendant")
            res["permitted"] = bool(res["sibling"] and res["sibling"].get("ok"))
        except (ValueError, IndexError):
            res["error"] = f"prober exited {code}: {text.strip()[-300:]}"
    except Exception as exc:  # noqa: BLE001 - a probe never raises
        res["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if target is not None:
            target.stop()
    return res


# ----------------------------------------------------------------------------------------------------
# The torch/GPU probe: a child process that reports stage by stage on stdout.

class _Probe:
    """Child side. Each stage prints a start line before it runs, so a hang names its stage."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.w = AttnWorkload.from_dict(spec.get("workload"))

    def emit(self, **msg):
        sys.stdout.write(_LINE + json.dumps(msg, default=str) + "\n")
        sys.stdout.flush()

    def stage(self, name, fn):
        self.emit(stage=name, event="start", t=time.time())
        t0 = time.perf_counter()
        try:
            facts = fn() or {}
            self.emit(stage=name, event="done", s=round(time.perf_counter() - t0, 4), facts=facts)
            return True
        except Exception as exc:  # noqa: BLE001 - reported to the parent as the stage's error
            self.emit(stage=name, event="error", s=round(time.perf_counter() - t0, 4),
                      error=f"{type(exc).__name__}: {exc}"[:2000])
            return False

    def run(self):
        try:
            self._run()
        finally:
            self.emit(event="end")

    def _run(self):
        stages = self.spec.get("stages") or ["import_torch", "cuda_init", "sdpa_select", "sdpa_run"]
        self.tensors, self.sdpa = None, None
        if not self.stage("import_torch", self.import_torch):
            return
        if not self.stage("cuda_init", self.cuda_init):
            return
        if "sdpa_select" in stages:
            self.stage("sdpa_select", self.sdpa_select)
        if "sdpa_run" in stages:
            order = self.spec.get("run_backends")
            if order is None:
                order = run_order(self.sdpa) if self.sdpa else []
            for b in order:
                self.stage(f"sdpa_run:{b}", lambda b=b: self.sdpa_run(b))

    # -- stages ----------------------------------------------------------------------------------
    def import_torch(self):
        import torch  # noqa: F401  (the stage measures exactly this)

        self.torch = torch
        f = {"torch_version": torch.__version__, "torch_git": getattr(torch.version, "git_version", None),
             "torch_debug": bool(getattr(torch.version, "debug", False)),
             "cuda_version": torch.version.cuda, "hip_version": getattr(torch.version, "hip", None)}
        try:
            f["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        except Exception as exc:  # noqa: BLE001
            f["cpu_capability"] = f"error: {exc}"
        return f

    def _device(self):
        torch = self.torch
        dev = self.w.device
        if dev.startswith("auto"):
            dev = "cuda" if torch.cuda.is_available() else "cpu"
        elif dev.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(f"device={self.w.device!r} asked for but torch.cuda.is_available() is False")
        self.device = dev
        dt = self.w.dtype
        if dt == "auto":
            dt = "bfloat16" if dev.startswith("cuda") else "float32"
        self.dtype_name = dt
        self.dtype = getattr(torch, dt)

    def cuda_init(self):
        torch = self.torch
        f: dict[str, Any] = {}
        t0 = time.perf_counter()
        avail = torch.cuda.is_available()
        f["device_count"] = torch.cuda.device_count() if avail else 0
        self._device()
        if avail:
            torch.cuda.init()
            torch.zeros(1, device="cuda")  # a real context and allocation, as the workload will do
            torch.cuda.synchronize()
        f["cuda_init_s"] = round(time.perf_counter() - t0, 4)
        rocm = bool(getattr(torch.version, "hip", None))
        f["gpu_kind"] = ("rocm" if rocm else "cuda") if avail else None
        f["device_kind"] = f["gpu_kind"] if self.device.startswith("cuda") else "cpu"
        try:
            f["cudnn_version"] = torch.backends.cudnn.version() if avail else None
        except Exception as exc:  # noqa: BLE001
            f["cudnn_version"] = f"error: {exc}"
        try:
            v = torch.cuda.nccl.version() if avail else None
            f["nccl_version"] = ".".join(map(str, v)) if isinstance(v, tuple) else v
        except Exception as exc:  # noqa: BLE001
            f["nccl_version"] = f"error: {exc}"
        f["arch_list"] = list(torch.cuda.get_arch_list()) if avail else []
        if not avail:
            f.update(device_name=None, compute_capability=None, gfx_arch=None, device_memory_gb=None,
                     multiprocessors=None, unified_memory="none", unified_memory_attrs={},
                     arch_in_wheel="n/a", cuda_driver_version=None)
            return f
        idx = torch.device(self.device).index or 0
        props = torch.cuda.get_device_properties(idx)
        f["device_name"] = props.name
        f["device_memory_gb"] = round(props.total_memory / 1e9, 2)
        f["multiprocessors"] = props.multi_processor_count
        integrated = bool(getattr(props, "is_integrated", False))
        if rocm:
            gcn = getattr(props, "gcnArchName", "") or ""
            f["gfx_arch"] = gcn.split(":", 1)[0] or None
            f["compute_capability"] = None
            f["arch_in_wheel"] = classify_arch(None, f["gfx_arch"], f["arch_list"])
            f["unified_memory_attrs"] = {"is_integrated": integrated}
            f["unified_memory"] = "integrated" if integrated else "none"
            f["cuda_driver_version"] = None
        else:
            cc = f"{props.major}.{props.minor}"
            f["compute_capability"] = cc
            f["gfx_arch"] = None
            f["arch_in_wheel"] = classify_arch(cc, None, f["arch_list"])
            attrs, drv = _cuda_driver_attrs(idx)
            attrs.setdefault("is_integrated", integrated)
            f["unified_memory_attrs"] = attrs
            f["unified_memory"] = classify_unified(attrs)
            f["cuda_driver_version"] = drv
        return f

    def _tensors(self):
        """q, k, v laid out as gpulab.workloads makes them ((B, n, H, D) projections viewed as
        (B, H, n, D)) and its mask: the last quarter of each sample's text tokens are padding."""
        if self.tensors is None:
            torch, w = self.torch, self.w
            g = torch.Generator(device="cpu").manual_seed(0)
            shape = (w.batch, w.seq_len, w.heads, w.head_dim)
            q, k, v = (torch.randn(shape, generator=g).to(self.device, self.dtype).transpose(1, 2)
                       for _ in range(3))
            mask = None
            if w.padding_mask:
                valid = torch.ones(w.batch, w.seq_len, dtype=torch.bool)
                pad = w.text_tokens // 4
                if pad:
                    valid[:, w.text_tokens - pad:w.text_tokens] = False
                mask = valid[:, None, None, :].expand(w.batch, 1, w.seq_len, w.seq_len).contiguous().to(self.device)
            if w.needs_grad:
                for t in (q, k, v):
                    t.requires_grad_(True)
            self.tensors = (q, k, v, mask)
        return self.tensors

    def sdpa_select(self):
        torch = self.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if not hasattr(self, "device"):
            self._device()
        q, k, v, mask = self._tensors()
        cb = torch.backends.cuda
        enabled = {"flash": cb.flash_sdp_enabled(), "efficient": cb.mem_efficient_sdp_enabled(),
                   "cudnn": cb.cudnn_sdp_enabled() if hasattr(cb, "cudnn_sdp_enabled") else False,
                   "math": cb.math_sdp_enabled()}
        on_gpu = self.device.startswith("cuda")
        backends: dict[str, dict] = {}
        enum = {b: sdpa_backend_enum(b) for b in SDPA_BACKENDS}
        for b in SDPA_BACKENDS:
            usable, reasons, how = None, [], ""
            if b == "math":
                usable, how = True, "always applies (the reference decomposition)"
            elif on_gpu:
                fn = {"flash": getattr(cb, "can_use_flash_attention", None),
                      "efficient": getattr(cb, "can_use_efficient_attention", None),
                      "cudnn": getattr(cb, "can_use_cudnn_attention", None)}[b]
                if fn is None:
                    usable, reasons = False, [f"torch {torch.__version__} has no can_use_{b}_attention"]
                else:
                    params = _sdpa_params(cb, q, k, v, mask)
                    usable, reasons, exc = _capture_reasons(lambda: bool(fn(params, True)))
                    if exc is not None:
                        usable, reasons = False, reasons + [f"{type(exc).__name__}: {exc}"]
                how = f"torch.backends.cuda.can_use_{b}_attention(debug=True)"
            elif b == "flash":  # the CPU's fused flash kernel
                usable, reasons = _cpu_choice(torch, enum[b], (q, k, v, mask), sdpa_kernel)
                how = "torch._fused_sdp_choice restricted to FLASH_ATTENTION (CPU flash kernel)"
            else:
                usable, reasons = False, [f"{b} is a CUDA/ROCm-only backend; the device is {self.device}"]
                how = "not available on CPU"
            backends[b] = {"enabled": bool(enabled[b]), "usable": bool(usable), "reasons": reasons,
                           "checked_with": how}
        sel, warns, exc = _capture_reasons(lambda: _fused_choice(torch, q, k, v, mask))
        if exc is not None:  # "No available kernel" is a fact too
            selected, warns = "error", warns + [f"{type(exc).__name__}: {exc}"]
        else:
            selected = SDPBackend(sel).name
            selected = {"FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "efficient",
                        "CUDNN_ATTENTION": "cudnn", "MATH": "math"}.get(selected, selected.lower())
        fused_usable = [b for b in FUSED_BACKENDS if backends[b]["usable"] and backends[b]["enabled"]]
        if self.device == "cpu":
            cpu_path = (f"{selected}: " + ("the fused CPU flash kernel (torch's CPU flash attention)"
                                           if selected == "flash" else "the math decomposition"))
        else:
            cpu_path = None
        sdpa = {"device": self.device, "dtype": self.dtype_name, "requires_grad": self.w.needs_grad,
                "shape": [self.w.batch, self.w.heads, self.w.seq_len, self.w.head_dim],
                "mask": f"bool key-padding {list(mask.shape)}" if mask is not None else None, "is_causal": False,
                "enabled": enabled, "backends": backends, "selected": selected, "selection_notes": warns,
                "requested": self.w.sdpa_backend, "cpu_path": cpu_path}
        self.sdpa = sdpa
        return {"sdpa": sdpa, "sdpa_selected": selected, "sdpa_fused_usable": fused_usable}

    def sdpa_run(self, backend):
        """Run the workload's attention once with one backend forced, synchronized, and time it."""
        torch = self.torch
        import torch.nn.functional as F
        from torch.nn.attention import sdpa_kernel

        if not hasattr(self, "device"):
            self._device()
        q, k, v, mask = self._tensors()
        enum = sdpa_backend_enum(backend)
        use_mask = mask
        sync = torch.cuda.synchronize if self.device.startswith("cuda") else (lambda: None)
        times = []
        nonfinite = None
        for _ in range(7):  # 2 warm-up calls, then 5 timed
            for t in (q, k, v):
                t.grad = None
            t0 = time.perf_counter()
            with sdpa_kernel([enum]):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=use_mask)
                if self.w.needs_grad:
                    out.float().sum().backward()
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
            nonfinite = int((~torch.isfinite(out.detach())).sum().item())
        timed = sorted(times[2:])
        return {"backend": backend, "first_ms": round(times[0], 4), "ms": round(timed[len(timed) // 2], 4),
                "min_ms": round(timed[0], 4),
                "nonfinite": nonfinite, "mask_used": use_mask is not None,
                "with_backward": self.w.needs_grad}


def _sdpa_params(cb, q, k, v, mask):
    try:
        return cb.SDPAParams(q, k, v, mask, 0.0, False, False)
    except TypeError:  # torch < 2.5: no enable_gqa
        return cb.SDPAParams(q, k, v, mask, 0.0, False)


def _fused_choice(torch, q, k, v, mask):
    try:
        return torch._fused_sdp_choice(q, k, v, mask, 0.0, False, scale=None, enable_gqa=False)
    except TypeError:
        return torch._fused_sdp_choice(q, k, v, mask, 0.0, False)


_C10_WARN = re.compile(r"^\[?W\d{4}\s[^\]]*\]\s*(?:Warning:\s*)?")  # c10 / glog warning prefix
_TRIGGERED = re.compile(r"\s*\((?:Triggered internally at|function )[^)]*\)\s*$")


def _clean_reason(text: str) -> str:
    return _TRIGGERED.sub("", _C10_WARN.sub("", text.strip())).strip()


def _capture_reasons(fn):
    """Call fn; collect torch's debug warnings whether they come as Python warnings or on fd 2.
    Returns (result, reasons, exception): a refusal that ends in "No available kernel" keeps its reasons."""
    import tempfile
    import warnings

    reasons: list[str] = []
    result, error = None, None
    with tempfile.TemporaryFile(mode="w+b") as tmp, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - handed back with the reasons
            error = exc
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            err = tmp.read().decode(errors="replace")
    for w in caught:
        reasons.append(_clean_reason(str(w.message)))
    for line in err.splitlines():
        if line.strip():
            reasons.append(_clean_reason(line))
    return result, [r for r in reasons if r and not r.endswith("not used because:")], error


def _cpu_choice(torch, enum, tensors, sdpa_kernel):
    q, k, v, mask = tensors
    with sdpa_kernel([enum]):
        got, reasons, exc = _capture_reasons(lambda: _fused_choice(torch, q, k, v, mask))
    if exc is not None:
        return False, reasons or [_clean_reason(f"{type(exc).__name__}: {exc}")]
    return int(got) == int(enum.value), reasons


def _cuda_driver_attrs(ordinal: int) -> tuple[dict, int | None]:
    """Unified-memory attributes straight from the driver (torch does not expose them)."""
    attrs: dict[str, Any] = {}
    names = {"integrated": 18, "concurrent_managed_access": 89, "pageable_memory_access": 88,
             "pageable_uses_host_page_tables": 100}
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return {"error": f"libcuda.so.1: {exc}"}, None
    dev, ver = ctypes.c_int(), ctypes.c_int()
    lib.cuInit(0)
    drv = ver.value if lib.cuDriverGetVersion(ctypes.byref(ver)) == 0 else None
    if lib.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
        return {"error": "cuDeviceGet failed"}, drv
    for key, num in names.items():
        val = ctypes.c_int()
        rc = lib.cuDeviceGetAttribute(ctypes.byref(val), num, dev)
        attrs[key] = int(val.value) if rc == 0 else None
    return attrs, drv


def classify_unified(attrs: dict) -> str:
    """integrated (one physical memory, GB10/Jetson) > ats (hardware-coherent host page tables, Grace)
    > hmm (software-managed pageable access) > none."""
    if attrs.get("integrated") or attrs.get("is_integrated"):
        return "integrated"
    if attrs.get("pageable_uses_host_page_tables"):
        return "ats"
    if attrs.get("pageable_memory_access"):
        return "hmm"
    return "none"


def classify_arch(compute_capability: str | None, gfx_arch: str | None, arch_list: list[str]) -> str:
    """How the wheel covers the device: exact SASS, a binary-compatible SASS of the same major (lower or
    equal minor, not an arch-specific 'a' build), only PTX that the driver must JIT, or nothing."""
    if gfx_arch:
        return "sass" if gfx_arch in arch_list else "missing"
    if not compute_capability:
        return "n/a"
    try:
        major, minor = (int(x) for x in compute_capability.split(".")[:2])
    except ValueError:
        return "n/a"
    dev = major * 10 + minor
    sass, ptx = [], []
    for a in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+)([a-z]?)", a)
        if not m:
            continue
        num, suffix = int(m.group(2)), m.group(3)
        (sass if m.group(1) == "sm" else ptx).append((num, suffix))
    if (dev, "") in sass or (dev, "a") in sass or (dev, "f") in sass:
        return "sass"
    if any(n // 10 == major and n <= dev and s == "" for n, s in sass):
        return "sass_family"
    if any(n <= dev and s == "" for n, s in ptx):
        return "ptx_only"
    return "missing"


# ----------------------------------------------------------------------------------------------------
# Parent side: run probe children with per-stage deadlines.

@dataclass(frozen=True)
class StageResult:
    """One stage of a probe child: ok, error, hang (killed at the deadline) or crash (child died)."""
    stage: str
    status: str
    seconds: float | None
    error: str | None = None


class _LineReader:
    """Complete lines of a file another process is appending to (the probe's stdout)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.buf = path, 0, b""

    def next_line(self, final: bool = False) -> str | None:
        if b"\n" not in self.buf:
            try:
                with open(self.path, "rb") as fh:
                    fh.seek(self.offset)
                    chunk = fh.read()
            except OSError:
                chunk = b""
            self.offset += len(chunk)
            self.buf += chunk
        if b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            return line.decode("utf-8", "replace")
        if final and self.buf:
            line, self.buf = self.buf, b""
            return line.decode("utf-8", "replace")
        return None


def _tail_text(path: Path, chars: int = 800) -> str:
    try:
        return path.read_bytes()[-chars:].decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _probe_child(spec: dict, timeouts: dict, env: dict | None,
                 progress: bool = False) -> tuple[list[StageResult], dict, str]:
    """Run `python -m gpulab.env --probe SPEC`, enforcing each stage's deadline; returns the stages,
    the facts they reported, and the child's stderr tail."""
    argv = [sys.executable, "-m", "gpulab.env", "--probe", json.dumps(spec)]
    child_env = dict(os.environ if env is None else env)
    pkg_root = str(Path(__file__).resolve().parents[1])
    child_env["PYTHONPATH"] = pkg_root + (os.pathsep + child_env["PYTHONPATH"] if child_env.get("PYTHONPATH") else "")
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    results: list[StageResult] = []
    facts: dict = {}
    tmp = tempfile.TemporaryDirectory(prefix="gpulab-probe-")
    out_path, err_path = Path(tmp.name) / "stdout", Path(tmp.name) / "stderr"
    try:
        child = proc.spawn(argv, stdout=out_path, stderr=err_path, env=child_env, label="env-probe")
    except OSError as exc:
        tmp.cleanup()
        return [StageResult("startup", "error", None, f"{type(exc).__name__}: {exc}")], facts, ""
    lines = _LineReader(out_path)
    current, started = "startup", time.monotonic()
    try:
        while True:
            limit = timeouts.get(current, timeouts.get(current.split(":", 1)[0], 120.0))
            if time.monotonic() - started > limit:
                results.append(StageResult(current, "hang", round(time.monotonic() - started, 3),
                                           f"no progress for {limit:g} s; killed the probe's process group"))
                break
            line = lines.next_line()
            if line is None:
                if child.wait(timeout=0.05) is None:
                    continue
                line = lines.next_line(final=True)
                if line is None:  # the child exited and every line was read
                    code = child.returncode
                    if current == "exit" and code not in (0, None):
                        results.append(StageResult("exit", "crash" if code < 0 else "error", None,
                                                   f"the probe child ended with code {code} after its last stage"))
                    elif current != "exit":
                        status = "crash" if code is not None and code < 0 else "error"
                        why = (f"killed by signal {-code}" if status == "crash" else f"exited with code {code}")
                        tail = _tail_text(err_path)
                        results.append(StageResult(current, status, round(time.monotonic() - started, 3),
                                                   f"{why} during {current}" + (f": {tail}" if tail else "")))
                    break
            if not line.startswith(_LINE):
                continue
            try:
                msg = json.loads(line[len(_LINE):])
            except ValueError:
                continue
            if msg.get("event") == "end":
                current, started = "exit", time.monotonic()
            elif msg.get("event") == "start":
                current, started = msg["stage"], time.monotonic()
                if progress:
                    print(f"[gpulab env] {current} ...", file=sys.stderr, flush=True)
            elif msg.get("event") in ("done", "error"):
                took = msg.get("s")
                if took is not None and took > limit:  # it overran while we were not looking: a hang all the same
                    results.append(StageResult(current, "hang", round(took, 3),
                                               f"no progress for {limit:g} s; killed the probe's process group"))
                    break
                ok = msg["event"] == "done"
                results.append(StageResult(msg["stage"], "ok" if ok else "error", msg.get("s"), msg.get("error")))
                if ok:
                    f = msg.get("facts") or {}
                    if msg["stage"].startswith("sdpa_run:"):
                        facts.setdefault("_runs", {})[f.get("backend", msg["stage"].split(":", 1)[1])] = f
                    else:
                        facts.update(f)
                current, started = "between_stages", time.monotonic()
    finally:
        child.stop()
        err_tail = _tail_text(err_path, 40 * 200)
        tmp.cleanup()
    return results, facts, err_tail


def run_order(sdpa: dict) -> list[str]:
    """Backends to run for real: the usable ones, the selected one first, math last (math is the one
    that has hung on new platforms, so it must not keep the others from being measured)."""
    sel = sdpa.get("selected")
    todo = [b for b in SDPA_BACKENDS if sdpa["backends"][b]["usable"]]
    return sorted(todo, key=lambda b: (b != sel, b == "math"))


def _probe_torch(w: AttnWorkload, run_sdpa: bool, timeouts: dict, env: dict | None,
                 progress: bool = False) -> tuple[dict, list[dict]]:
    """One child normally does everything; a run that hangs or crashes is killed and the backends after
    it get a fresh child, so one bad kernel costs only its own row."""
    facts: dict[str, Any] = {}
    stages = ["import_torch", "cuda_init", "sdpa_select"] + (["sdpa_run"] if run_sdpa else [])
    res, got, _ = _probe_child({"workload": asdict(w), "stages": stages}, timeouts, env, progress)
    results = list(res)
    runs: dict[str, dict] = dict(got.pop("_runs", {}))
    facts.update(got)
    setup = [r for r in res if not r.stage.startswith("sdpa_run:") and r.stage != "exit"]
    first_bad = next((r for r in setup if r.status != "ok"), None)
    facts["torch_probe_status"] = first_bad.status if first_bad else "ok"
    facts["torch_probe_stuck_in"] = first_bad.stage if first_bad else None
    hung, failed = [], []
    sdpa = facts.get("sdpa")
    if run_sdpa and sdpa:
        order = run_order(sdpa)
        while True:
            for r in res:
                if r.stage.startswith("sdpa_run:"):
                    b = r.stage.split(":", 1)[1]
                    if r.status == "hang":
                        hung.append(b)
                    elif r.status in ("error", "crash"):
                        failed.append(b)
                    if r.status != "ok":
                        runs[b] = {"backend": b, "status": r.status, "error": r.error}
            todo = [b for b in order if b not in runs]
            if not todo:
                break
            if not any(r.stage.startswith("sdpa_run:") for r in res):
                for b in todo:  # the child died before any run: say so once, do not loop
                    runs[b] = {"backend": b, "status": "not_run", "error": res[-1].error if res else None}
                break
            spec = {"workload": asdict(w), "stages": ["import_torch", "cuda_init", "sdpa_run"], "run_backends": todo}
            res, got, _ = _probe_child(spec, timeouts, env, progress)
            results += [r for r in res if r.stage.startswith("sdpa_run") or r.status != "ok"]
            runs.update(got.get("_runs", {}))
        for b, r in runs.items():
            r.setdefault("status", "ok")
            sdpa["backends"][b]["run"] = r
    facts["sdpa_hung"] = hung
    facts["sdpa_failed"] = failed
    return facts, [asdict(s) for s in results]


def collect(workload: dict | None = None, *, run_sdpa: bool = True, timeouts: dict | None = None,
            probe_env: dict | None = None, progress: bool = False) -> dict:
    """Gather the platform facts (see FACT_KEYS). Never raises on a failing probe; it records the error.

    `probe_env` replaces the environment of the torch/GPU probe child (e.g. to compare
    CUDA_MODULE_LOADING=LAZY and EAGER); `timeouts` overrides STAGE_TIMEOUT_S per stage kind
    ("sdpa_run") or per stage ("sdpa_run:math"); `progress` prints a line per probe stage on stderr."""
    from gpulab import __version__

    w = AttnWorkload.from_dict(workload)
    t = dict(STAGE_TIMEOUT_S)
    t.update(timeouts or {})
    t.setdefault("between_stages", t["sdpa_select"])
    t.setdefault("exit", 30.0)
    facts: dict[str, Any] = {"gpulab_version": __version__,
                             "collected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    errors: dict[str, str] = {}
    for name, fn in (("host", _host_facts), ("env_vars", lambda: {"env_vars": env_vars(probe_env)}),
                     ("tools", lambda: {"tools": tools()}), ("ptrace", lambda: {"ptrace": ptrace_probe()}),
                     ("torch", lambda: _torch_facts(w, run_sdpa, t, probe_env, progress))):
        try:
            facts.update(fn())
        except Exception as exc:  # noqa: BLE001 - a probe never raises
            errors[name] = f"{type(exc).__name__}: {exc}"
    p = facts.get("ptrace") or {}
    facts["ptrace_permitted"] = p.get("permitted")
    facts["ptrace_scope"] = p.get("ptrace_scope")
    tl = facts.get("tools") or {}
    facts["native_stack_tools"] = [k for k in ("py-spy", "gdb") if (tl.get(k) or {}).get("path")]
    if facts.get("device_kind") in (None, "cpu") and facts.get("torch_probe_status") == "ok":
        facts["device_name"] = facts.get("device_name") or facts.get("cpu_model")
    for k in FACT_KEYS:
        facts.setdefault(k, None)
    for st in facts.get("probe_stages") or []:
        if st["status"] != "ok":
            errors[f"probe:{st['stage']}"] = f"{st['status']}: {st['error']}"
    facts["errors"] = errors
    return facts


def _torch_facts(w, run_sdpa, timeouts, env, progress=False):
    facts, stages = _probe_torch(w, run_sdpa, timeouts, env, progress)
    facts.pop("_runs", None)
    facts["probe_stages"] = stages
    facts["workload"] = asdict(w)
    return facts


# ----------------------------------------------------------------------------------------------------
# Tables and report (pure: facts in, text/DataFrames out).

SUMMARY_KEYS = ("cpu_arch", "cpu_model", "host_memory_gb", "os_release", "python_version", "torch_version",
                "torch_git", "cuda_version", "hip_version", "cudnn_version", "nccl_version",
                "cuda_driver_version", "nvidia_driver", "device_kind", "device_name", "compute_capability",
                "gfx_arch", "device_memory_gb", "unified_memory", "arch_list", "arch_in_wheel", "cuda_init_s",
                "cpu_capability", "sdpa_selected", "sdpa_fused_usable", "sdpa_hung", "sdpa_failed",
                "ptrace_permitted", "ptrace_scope", "native_stack_tools", "torch_probe_status",
                "torch_probe_stuck_in", "in_container")


def _short(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v)) if v else "(none)"
    if isinstance(v, dict):
        return json.dumps(v, default=str)
    return "" if v is None else str(v)


def facts_rows(facts: dict, keys=SUMMARY_KEYS) -> list[tuple[str, str, str]]:
    return [(k, _short(facts.get(k)), FACT_KEYS.get(k, "")) for k in keys]


def facts_table(facts: dict, keys=SUMMARY_KEYS):
    import pandas as pd

    return pd.DataFrame(facts_rows(facts, keys), columns=["fact", "value", "meaning"])


def sdpa_rows(facts: dict) -> list[dict]:
    sdpa = facts.get("sdpa") or {}
    rows = []
    for b in SDPA_BACKENDS:
        info = (sdpa.get("backends") or {}).get(b)
        if info is None:
            continue
        run = info.get("run") or {}
        rows.append({"backend": b, "enabled": info.get("enabled"), "usable": info.get("usable"),
                     "selected": sdpa.get("selected") == b,
                     "run": run.get("status", "not run" if info.get("usable") else "not usable"),
                     "ms": run.get("ms"), "reason": "; ".join(info.get("reasons") or []) or
                     ("" if info.get("usable") else "refused (no reason given)")})
    return rows


def sdpa_table(facts: dict):
    import pandas as pd

    return pd.DataFrame(sdpa_rows(facts), columns=["backend", "enabled", "usable", "selected", "run", "ms",
                                                   "reason"])


def env_table(facts: dict):
    import pandas as pd

    rows = [(k, v) for k, v in (facts.get("env_vars") or {}).items()]
    tl = facts.get("tools") or {}
    rows += [(f"tool:{k}", (f"{d.get('path')} ({d.get('version')})" if d.get("path") else d.get("error")))
             for k, d in tl.items()]
    p = facts.get("ptrace") or {}
    rows.append(("ptrace", f"permitted={p.get('permitted')} scope={p.get('ptrace_scope')} "
                           f"cap_sys_ptrace={p.get('cap_sys_ptrace')} sibling={_short(p.get('sibling'))}"))
    return pd.DataFrame(rows, columns=["name", "value"])


def plot_sdpa(facts: dict, ax=None):
    """Measured time of each SDPA backend on the workload (hung/failed ones marked), so the reader sees
    which implementations actually run here and what they cost."""
    import matplotlib.pyplot as plt

    rows = sdpa_rows(facts)
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 2.6))
    names = [r["backend"] for r in rows]
    vals = [r["ms"] if isinstance(r["ms"], (int, float)) else 0.0 for r in rows]
    colors = ["tab:green" if r["run"] == "ok" else "tab:red" if r["run"] in ("hang", "crash", "error")
              else "tab:gray" for r in rows]
    ax.barh(names, vals, color=colors)
    for i, r in enumerate(rows):
        label = f"{r['ms']:.3g} ms" if isinstance(r["ms"], (int, float)) else r["run"]
        if r["selected"]:
            label += "  (selected)"
        ax.text(vals[i], i, " " + label, va="center", fontsize=8)
    sdpa = facts.get("sdpa") or {}
    ax.set_xlabel("ms per call (median of 5 after 2 warm-ups" + (", with backward)" if sdpa.get("requires_grad") else ")"))
    ax.set_title(f"SDPA on {facts.get('device_name') or sdpa.get('device')}: shape {sdpa.get('shape')}, "
                 f"{sdpa.get('dtype')}", fontsize=9)
    ax.set_xlim(0, max(vals + [1e-3]) * 1.5)
    ax.invert_yaxis()
    return ax


def format_report(facts: dict, matches: list, suggested: list[str]) -> str:
    lines = ["gpulab env: platform facts", ""]
    for k, v, _ in facts_rows(facts):
        lines.append(f"  {k:<22} {v}")
    lines += ["", "SDPA backends for the workload "
              f"{(facts.get('sdpa') or {}).get('shape')} {(facts.get('sdpa') or {}).get('dtype')}:"]
    for r in sdpa_rows(facts):
        ms = f"{r['ms']:.3g} ms" if isinstance(r["ms"], (int, float)) else ""
        lines.append(f"  {r['backend']:<10} enabled={str(r['enabled']):<5} usable={str(r['usable']):<5} "
                     f"{'SELECTED ' if r['selected'] else ''}run={r['run']} {ms}".rstrip())
        if r["reason"]:
            lines.append(f"{'':14}{r['reason'][:300]}")
    ev = facts.get("env_vars") or {}
    lines += ["", "Environment variables that change behaviour: " + (", ".join(f"{k}={v}" for k, v in ev.items())
                                                                       or "(none set)")]
    tl = facts.get("tools") or {}
    lines.append("Tools: " + ", ".join(f"{k}={'yes' if d.get('path') else 'no'}" for k, d in tl.items())
                 + f", ptrace={facts.get('ptrace_permitted')}")
    lines += ["", f"Platform risks matched: {len(matches)}"]
    for m in matches:
        lines.append(f"  [{m.severity}] {m.rule_id}: {m.title}")
        lines.append(f"      because: {'; '.join(m.matched)}")
        lines.append(f"      risk: {m.risk}")
        if m.advice:
            lines.append(f"      advice: {m.advice}")
        lines.append(f"      source: {m.source}")
    lines.append("Suggested fix scenarios: " + (", ".join(suggested) if suggested else "(none)"))
    if facts.get("errors"):
        lines += ["", "Probe errors: " + "; ".join(f"{k}: {v}" for k, v in facts["errors"].items())]
    return "\n".join(lines)


def report(workload: dict | None = None, *, rules_path=None, run_sdpa: bool = True) -> dict:
    """Facts + matched risks + suggested scenarios in one JSON-able dict (what env.json holds)."""
    from gpulab.env import rules as rules_mod

    facts = collect(workload, run_sdpa=run_sdpa)
    rules = rules_mod.load_rules(rules_path)
    matches = rules_mod.evaluate(facts, rules)
    return {"facts": facts, "risks": [asdict(m) for m in matches],
            "suggested_scenarios": rules_mod.suggested_scenarios(matches)}


def headline(facts: dict, matches: list) -> str:
    """One line for the index: the platform, the SDPA path it takes, and how many known risks apply."""
    dev = facts.get("device_name") or facts.get("device_kind") or "unknown device"
    where = f"{dev} ({facts.get('compute_capability') or facts.get('gfx_arch') or facts.get('cpu_arch')})"
    sdpa = facts.get("sdpa_selected") or "n/a"
    hung = facts.get("sdpa_hung") or []
    parts = [f"{where}, torch {facts.get('torch_version')}: SDPA selects {sdpa}"]
    if hung:
        parts.append(f"{', '.join(hung)} hung")
    if facts.get("torch_probe_status") not in (None, "ok"):
        parts.append(f"probe {facts['torch_probe_status']} in {facts.get('torch_probe_stuck_in')}")
    high = [m.rule_id for m in matches if m.severity == "high"]
    parts.append(f"{len(matches)} known risk(s)" + (f", high: {', '.join(high)}" if high else ""))
    return "; ".join(parts)


def save_products(out_dir, facts: dict, matches: list) -> dict:
    """env.json (facts + risks) and suggested_scenarios.json (read by notebook 04) in out_dir."""
    from gpulab.env import rules as rules_mod
    from gpulab.report import product, write_json

    sug = rules_mod.scenarios_product(matches)
    paths = {"env": write_json(product(out_dir, "env.json"),
                               {"facts": facts, "risks": [asdict(m) for m in matches],
                                "suggested_scenarios": sug["scenarios"]}),
             "suggested_scenarios": write_json(product(out_dir, "suggested_scenarios.json"), sug)}
    return paths


# ----------------------------------------------------------------------------------------------------
# CLI

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpulab env", description="The environment report and platform risks "
                                "(notebook 01): facts, SDPA backends for the workload, matched risks, fixes.")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="write facts + risks as JSON")
    p.add_argument("--rules", type=Path, default=None, metavar="FILE", help="risk rules YAML (default: bundled)")
    p.add_argument("--no-sdpa-run", action="store_true", help="only select SDPA backends; do not run them")
    d = AttnWorkload()
    p.add_argument("--no-mask", dest="padding_mask", action="store_false", help="no padding mask")
    for f in fields(AttnWorkload):
        if f.name == "padding_mask":
            continue
        kw: dict[str, Any] = {"default": getattr(d, f.name), "type": int if f.type in ("int", int) else str}
        if f.name in ("dtype", "rung", "sdpa_backend"):
            kw["choices"] = {"dtype": DTYPE_CHOICES, "rung": RUNG_CHOICES, "sdpa_backend": BACKEND_CHOICES}[f.name]
        p.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, **kw)
    p.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    """`gpulab env [--json FILE]`: prints the report; exit 0 when the report was produced."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.probe is not None:
        _Probe(json.loads(args.probe)).run()
        return 0
    from gpulab.env import rules as rules_mod
    from gpulab.report import write_json

    try:
        workload = {f.name: getattr(args, f.name) for f in fields(AttnWorkload)}
        rules = rules_mod.load_rules(args.rules)
        facts = collect(workload, run_sdpa=not args.no_sdpa_run, progress=True)
    except (ValueError, rules_mod.RuleError) as exc:
        print(f"gpulab env: {exc}", file=sys.stderr)
        return 2
    matches = rules_mod.evaluate(facts, rules)
    suggested = rules_mod.suggested_scenarios(matches)
    print(format_report(facts, matches, suggested))
    if args.json:
        write_json(args.json, {"facts": facts, "risks": [asdict(m) for m in matches],
                               "suggested_scenarios": suggested})
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
