"""Child side of the torch/GPU probe: `python -m gpulab.env.child SPEC` (SPEC from probe.probe_spec).

Each stage prints a start line before it runs, so a hang names its stage; torch is imported inside the
`import_torch` stage, since that import is itself one of the things measured (and one that can hang).
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import sys
import tempfile
import time
import warnings
from typing import Any

from gpulab.env.classify import classify_arch, classify_unified
from gpulab.env.probe import LINE, REPORT_ORDER, SETUP_STAGES, run_order
from gpulab.workloads import FUSED_BACKENDS, AttentionCall, backend_name, resolve_dtype, sdpa_backend_enum

WARMUP_CALLS, TIMED_CALLS = 2, 5


class _Probe:
    """Runs the stages a spec asks for and reports each on stdout."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.requires_grad = bool(spec.get("requires_grad"))
        self.tensors, self.sdpa, self.device = None, None, None

    def emit(self, **msg):
        sys.stdout.write(LINE + json.dumps(msg, default=str) + "\n")
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
        stages = self.spec.get("stages") or [*SETUP_STAGES, "sdpa_run"]
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
        import torch  # the stage measures exactly this import

        self.torch = torch
        f = {"torch_version": torch.__version__, "torch_git": getattr(torch.version, "git_version", None),
             "torch_debug": bool(getattr(torch.version, "debug", False)),
             "cuda_version": torch.version.cuda, "hip_version": getattr(torch.version, "hip", None)}
        try:
            f["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        except Exception as exc:  # noqa: BLE001
            f["cpu_capability"] = f"error: {exc}"
        return f

    def _resolve(self):
        """The device and the attention call with its dtype resolved (what 'auto' means here)."""
        asked = str(self.spec.get("device", "auto"))
        avail = self.torch.cuda.is_available()
        if asked.startswith("cuda") and not avail:
            raise RuntimeError(f"device={asked!r} asked for but torch.cuda.is_available() is False")
        self.device = ("cuda" if avail else "cpu") if asked.startswith("auto") else asked
        raw = self.spec["call"]
        self.call = AttentionCall(**{**raw, "dtype": resolve_dtype(raw["dtype"], self.device)})

    def cuda_init(self):
        torch = self.torch
        f: dict[str, Any] = {}
        t0 = time.perf_counter()
        avail = torch.cuda.is_available()
        f["device_count"] = torch.cuda.device_count() if avail else 0
        self._resolve()
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
        """q, k, v and the mask exactly as the workload's AttentionCall makes them."""
        if self.device is None:
            self._resolve()
        if self.tensors is None:
            self.tensors = self.call.inputs(self.device, seed=0, requires_grad=self.requires_grad)
        return self.tensors

    def sdpa_select(self):
        torch = self.torch
        from torch.nn.attention import sdpa_kernel

        q, k, v, mask = self._tensors()
        cb = torch.backends.cuda
        enabled = {"flash": cb.flash_sdp_enabled(), "efficient": cb.mem_efficient_sdp_enabled(),
                   "cudnn": cb.cudnn_sdp_enabled() if hasattr(cb, "cudnn_sdp_enabled") else False,
                   "math": cb.math_sdp_enabled()}
        on_gpu = self.device.startswith("cuda")
        backends: dict[str, dict] = {}
        for b in REPORT_ORDER:
            usable, reasons, how = None, [], ""
            if b not in FUSED_BACKENDS:
                usable, how = True, "always applies (the reference decomposition)"
            elif on_gpu:
                fn = getattr(cb, f"can_use_{b}_attention", None)
                if fn is None:
                    usable, reasons = False, [f"torch {torch.__version__} has no can_use_{b}_attention"]
                else:
                    params = _sdpa_params(cb, q, k, v, mask, self.call.causal)
                    usable, reasons, exc = _capture_reasons(lambda: bool(fn(params, True)))
                    if exc is not None:
                        usable, reasons = False, reasons + [f"{type(exc).__name__}: {exc}"]
                how = f"torch.backends.cuda.can_use_{b}_attention(debug=True)"
            elif b == "flash":  # the CPU's fused flash kernel
                usable, reasons = _cpu_choice(torch, sdpa_backend_enum(b), (q, k, v, mask), sdpa_kernel)
                how = "torch._fused_sdp_choice restricted to FLASH_ATTENTION (CPU flash kernel)"
            else:
                usable, reasons = False, [f"{b} is a CUDA/ROCm-only backend; the device is {self.device}"]
                how = "not available on CPU"
            backends[b] = {"enabled": bool(enabled[b]), "usable": bool(usable), "reasons": reasons,
                           "checked_with": how}
        sel, warns, exc = _capture_reasons(lambda: _fused_choice(torch, q, k, v, mask, self.call.causal))
        if exc is not None:  # "No available kernel" is a fact too
            selected, warns = "error", warns + [f"{type(exc).__name__}: {exc}"]
        else:
            selected = backend_name(sel)
        fused_usable = [b for b in FUSED_BACKENDS if backends[b]["usable"] and backends[b]["enabled"]]
        cpu_path = None
        if self.device == "cpu":
            cpu_path = (f"{selected}: " + ("the fused CPU flash kernel (torch's CPU flash attention)"
                                           if selected == "flash" else "the math decomposition"))
        c = self.call
        sdpa = {"device": self.device, "dtype": c.dtype, "requires_grad": self.requires_grad,
                "shape": [c.batch, c.heads, c.seq_len, c.head_dim], "call": c.describe(),
                "mask": f"bool key-padding {list(mask.shape)}" if mask is not None else None, "is_causal": c.causal,
                "enabled": enabled, "backends": backends, "selected": selected, "selection_notes": warns,
                "requested": self.spec.get("sdpa_backend"), "cpu_path": cpu_path}
        self.sdpa = sdpa
        return {"sdpa": sdpa, "sdpa_selected": selected, "sdpa_fused_usable": fused_usable}

    def sdpa_run(self, backend):
        """Run the workload's attention with one backend forced, synchronized, and time it."""
        torch = self.torch
        import torch.nn.functional as F
        from torch.nn.attention import sdpa_kernel

        q, k, v, mask = self._tensors()
        enum = sdpa_backend_enum(backend)
        sync = torch.cuda.synchronize if self.device.startswith("cuda") else (lambda: None)
        times = []
        nonfinite = None
        for _ in range(WARMUP_CALLS + TIMED_CALLS):
            for t in (q, k, v):
                t.grad = None
            t0 = time.perf_counter()
            with sdpa_kernel([enum]):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.call.causal)
                if self.requires_grad:
                    out.float().sum().backward()
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
            nonfinite = int((~torch.isfinite(out.detach())).sum().item())
        timed = sorted(times[WARMUP_CALLS:])
        return {"backend": backend, "first_ms": round(times[0], 4), "ms": round(timed[len(timed) // 2], 4),
                "min_ms": round(timed[0], 4), "nonfinite": nonfinite, "mask_used": mask is not None,
                "with_backward": self.requires_grad}


def _sdpa_params(cb, q, k, v, mask, causal=False):
    try:
        return cb.SDPAParams(q, k, v, mask, 0.0, causal, False)
    except TypeError:  # torch < 2.5: no enable_gqa
        return cb.SDPAParams(q, k, v, mask, 0.0, causal)


def _fused_choice(torch, q, k, v, mask, causal=False):
    try:
        return torch._fused_sdp_choice(q, k, v, mask, 0.0, causal, scale=None, enable_gqa=False)
    except TypeError:
        return torch._fused_sdp_choice(q, k, v, mask, 0.0, causal)


_C10_WARN = re.compile(r"^\[?W\d{4}\s[^\]]*\]\s*(?:Warning:\s*)?")  # c10 / glog warning prefix
_TRIGGERED = re.compile(r"\s*\((?:Triggered internally at|function )[^)]*\)\s*$")


def _clean_reason(text: str) -> str:
    return _TRIGGERED.sub("", _C10_WARN.sub("", text.strip())).strip()


def _capture_reasons(fn):
    """Call fn; collect torch's debug warnings whether they come as Python warnings or on fd 2.
    Returns (result, reasons, exception): a refusal that ends in "No available kernel" keeps its reasons."""
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
    """Whether the CPU picks `enum` for these tensors, with torch's own reasons when it does not."""
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m gpulab.env.child SPEC_JSON (started by gpulab.env.probe)", file=sys.stderr)
        return 2
    _Probe(json.loads(argv[0])).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
