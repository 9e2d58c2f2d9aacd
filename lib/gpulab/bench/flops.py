"""Work counts and peaks: turn a median time into TFLOP/s, GB/s and % of what the device can do.

A latency alone does not say whether a kernel is good; 23 TFLOP/s on an H100 (989 peak) does. Peaks come
from vendor datasheets (sources inline); on a device not in the table, a measured large matmul stands in for
the peak (the "roof" of the roofline model), and the figure says which one it used.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpulab.bench.measure import measure

MODES = ("fwd", "bwd", "fwd_bwd")
_MODE_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}  # backward = 2.5x forward (FlashAttention's count)
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


def _mode(mode: str) -> float:
    if mode not in _MODE_FACTOR:
        raise ValueError(f"mode={mode!r} is not valid; choose one of {', '.join(MODES)}")
    return _MODE_FACTOR[mode]


def attention_flops(batch: int, heads: int, seq_q: int, seq_k: int, head_dim: int, *, causal: bool = False,
                    mode: str = "fwd") -> float:
    """4*B*H*Sq*Sk*D forward (two matmuls), half when causal, x2.5 for backward, x3.5 for both."""
    for name, v in (("batch", batch), ("heads", heads), ("seq_q", seq_q), ("seq_k", seq_k), ("head_dim", head_dim)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive integer")
    f = 4.0 * batch * heads * seq_q * seq_k * head_dim
    if causal:
        f /= 2
    return f * _mode(mode)


def attention_bytes(batch: int, heads: int, seq_q: int, seq_k: int, head_dim: int, *, dtype: str = "bfloat16",
                    mode: str = "fwd") -> float:
    """Least HBM traffic of a fused kernel: read Q, K, V, write O (backward: also dO, write dQ, dK, dV)."""
    e = dtype_bytes(dtype)
    q = batch * heads * seq_q * head_dim
    kv = batch * heads * seq_k * head_dim
    fwd = e * (2 * q + 2 * kv)
    bwd = e * (3 * q + 2 * kv) + e * (q + 2 * kv)  # read q, o, do, k, v; write dq, dk, dv
    _mode(mode)  # validates
    return float({"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd + bwd}[mode])


def matmul_flops(m: int, n: int, k: int) -> float:
    return 2.0 * m * n * k


def matmul_bytes(m: int, n: int, k: int, *, dtype: str = "bfloat16") -> float:
    return float(dtype_bytes(dtype) * (m * k + k * n + m * n))


def dtype_bytes(dtype: str) -> int:
    name = str(dtype).replace("torch.", "")
    if name not in DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r} is not known; choose one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12 if ms and ms > 0 else float("nan")


def gbs(nbytes: float, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9 if ms and ms > 0 else float("nan")


# ------------------------------------------------------------------------------------------- peaks


@dataclass(frozen=True)
class Peak:
    """Dense (no sparsity) tensor-core peak for bf16/fp16, plain fp32 peak, and memory bandwidth."""

    name: str
    pattern: str                   # regex on torch.cuda.get_device_name()
    bf16_tflops: float | None
    fp32_tflops: float | None
    mem_gbs: float | None
    source: str


# Order matters: the first pattern that matches wins (PCIe/NVL before the SXM default, L40S before L4).
PEAKS: tuple[Peak, ...] = (
    Peak("H100 PCIe", r"H100.*PCIe", 756.0, 51.0, 2000.0, "NVIDIA H100 datasheet (PCIe column, dense)"),
    Peak("H100 NVL", r"H100.*NVL", 835.0, 60.0, 3900.0, "NVIDIA H100 datasheet (NVL column, dense)"),
    Peak("H100 SXM", r"H100", 989.0, 67.0, 3350.0, "NVIDIA H100 datasheet (SXM5: 989.4 dense bf16, 3.35 TB/s)"),
    Peak("H200", r"H200", 989.0, 67.0, 4800.0, "NVIDIA H200 datasheet (SXM: 989 dense bf16, 4.8 TB/s)"),
    Peak("A100 PCIe", r"A100.*PCIe", 312.0, 19.5, 1935.0, "NVIDIA A100 datasheet (80GB PCIe)"),
    Peak("A100 SXM", r"A100", 312.0, 19.5, 2039.0, "NVIDIA A100 datasheet (80GB SXM: 312 dense bf16, 2.04 TB/s)"),
    Peak("L40S", r"L40S", 362.0, 91.6, 864.0, "NVIDIA L40S datasheet (dense bf16)"),
    Peak("L4", r"\bL4\b", 121.0, 30.3, 300.0, "NVIDIA L4 datasheet (121 dense bf16 = 242 sparse / 2, 300 GB/s)"),
    Peak("B200", r"B200", 2250.0, None, 8000.0, "NVIDIA HGX B200 spec (2.25 PF dense bf16 per GPU, 8 TB/s)"),
    Peak("GB10 (DGX Spark)", r"GB10", None, None, 273.0,
         "NVIDIA DGX Spark spec: 273 GB/s LPDDR5x; only FP4 sparse (1 PF) published, so bf16 is measured"),
    Peak("MI300X", r"MI300X", 1307.4, 163.4, 5300.0, "AMD Instinct MI300X datasheet (dense bf16, 5.3 TB/s)"),
)


def peak_for(device_name: str) -> Peak | None:
    for p in PEAKS:
        if re.search(p.pattern, device_name or "", re.IGNORECASE):
            return p
    return None


@dataclass(frozen=True)
class Roof:
    """What the figures are measured against, and where that number came from."""

    device_name: str
    dtype: str
    tflops: float | None
    mem_gbs: float | None
    source: str                    # "table: ..." or "measured: ..."


def table_roof(device_name: str, dtype: str) -> Roof | None:
    """The datasheet roof for this device and dtype, or None when the table does not know it."""
    p = peak_for(device_name)
    if p is None:
        return None
    dt = str(dtype).replace("torch.", "")
    peak = p.bf16_tflops if dt in ("bfloat16", "float16") else p.fp32_tflops if dt == "float32" else None
    if peak is None:
        return None
    return Roof(device_name, dt, peak, p.mem_gbs, f"table: {p.name} ({p.source})")


def measured_roof(device: str, dtype: str, *, size: int | None = None, max_time_s: float = 1.0) -> Roof:
    """A large matmul's TFLOP/s stands in for the peak on a device the table does not know."""
    import torch
    dt = str(dtype).replace("torch.", "")
    cuda = str(device).startswith("cuda")
    n = size or (8192 if cuda else 1024)
    a = torch.randn(n, n, device=device, dtype=getattr(torch, dt))
    b = torch.randn(n, n, device=device, dtype=getattr(torch, dt))
    m = measure(lambda: torch.mm(a, b), name=f"mm{n}", device=device, max_time_s=max_time_s,
                      min_time_s=min(0.1, max_time_s / 4))
    name = torch.cuda.get_device_name(torch.device(device)) if cuda else "cpu"
    p = peak_for(name) if cuda else None
    del a, b
    return Roof(name, dt, tflops(matmul_flops(n, n, n), m.median_ms), p.mem_gbs if p else None,
                f"measured: {n}^3 {dt} matmul, median {m.median_ms:.3f} ms")


def device_roof(device: str, dtype: str, *, measure_if_unknown: bool = True, max_time_s: float = 1.0) -> Roof:
    """Table roof when the device is known, else a measured matmul (or an empty roof when told not to)."""
    import torch
    dt = str(dtype).replace("torch.", "")
    cuda = str(device).startswith("cuda")
    name = torch.cuda.get_device_name(torch.device(device)) if cuda else "cpu"
    roof = table_roof(name, dt) if cuda else None
    if roof is not None:
        return roof
    if measure_if_unknown:
        return measured_roof(device, dt, max_time_s=max_time_s)
    p = peak_for(name) if cuda else None
    return Roof(name, dt, None, p.mem_gbs if p else None, "unknown: not in the peaks table, not measured")


def figures(flops: float, nbytes: float, ms: float, roof: Roof | None) -> dict[str, Any]:
    """TFLOP/s, GB/s, % of the roof and which roof bounds the kernel (roofline: intensity vs ridge)."""
    tf, bw = tflops(flops, ms), gbs(nbytes, ms)
    out: dict[str, Any] = {"tflops": tf, "gbs": bw, "pct_peak": float("nan"), "pct_bw": float("nan"),
                           "intensity": flops / nbytes if nbytes else float("nan"), "bound": "unknown"}
    if roof is None:
        return out
    if roof.tflops:
        out["pct_peak"] = 100.0 * tf / roof.tflops
    if roof.mem_gbs:
        out["pct_bw"] = 100.0 * bw / roof.mem_gbs
    if roof.tflops and roof.mem_gbs and nbytes:
        ridge = roof.tflops * 1e12 / (roof.mem_gbs * 1e9)  # FLOP per byte where the two roofs meet
        out["bound"] = "memory" if out["intensity"] < ridge else "compute"
    return out
