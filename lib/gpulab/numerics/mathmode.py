"""The reduced precision a float32 matrix multiplication or convolution is allowed to run in: TF32 (10 of float32's
23 mantissa bits) or bfloat16 (7). PyTorch allows TF32 for convolutions on CUDA by default, and a program that calls
torch.set_float32_matmul_precision('high') allows it for matmuls (on CUDA, and on CPUs whose oneDNN has it): such
a run differs from a float32 one past float32's tolerance at its first such op, with no kernel wrong. The replay
reads the setting in the child when the op runs (a program may change it at any time), and holds the op's error
against what that precision gives, so the verdict names the setting instead of calling the kernel wrong.

The bound: a product of two inputs each rounded to p mantissa bits is off by at most about 2^-p of its size, so
an output is within `SLACK * 2^-p * sum(|a| * |b|)` of float64; the op run on |inputs| in float64 gives that sum
(matmuls and convolutions, forward and backward, are sums of products with positive coefficients).
"""
from __future__ import annotations

from typing import Any

from gpulab.numerics.reduction import base_name

BITS = {"tf32": 10, "bf16": 7}
NAMES = {"tf32": "TF32", "bf16": "bfloat16"}
SLACK = 2.5   # two rounded factors (2 x 2^-p when truncated), float32 accumulation, the final rounding
GEMMS = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "_addmm_activation"})
CONVS = frozenset({"convolution", "_convolution", "convolution_backward", "cudnn_convolution",
                   "cudnn_convolution_transpose", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                   "conv_transpose2d", "conv_transpose3d", "mkldnn_convolution"})


def family(op: str) -> str | None:
    """'matmul', 'conv' or None, for an op's name ('aten.mm.default')."""
    name = base_name(op)
    return "matmul" if name in GEMMS else "conv" if name in CONVS else None


def _precision(*objs, legacy=None) -> str:
    """The first set fp32_precision of objs ('ieee', 'tf32', 'bf16'; 'none' defers to the next), else the legacy
    allow_tf32 flag of legacy (which raises where the new and the legacy API were mixed: then 'ieee')."""
    for obj in objs:
        got = str(getattr(obj, "fp32_precision", "none") or "none")
        if got != "none":
            return got
    if legacy is not None:
        try:
            return "tf32" if getattr(legacy, "allow_tf32", False) else "ieee"
        except RuntimeError:
            return "ieee"
    return "ieee"


def read(func, tensors) -> dict | None:
    """In the child, as the op runs: the reduced precision it is allowed ({'precision', 'family', 'device',
    'setting', 'undo'}), or None (float32 at full precision, another dtype, an op that has no such mode)."""
    import torch

    kind = family(str(func))
    floats = [t for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if kind is None or not floats or any(t.dtype != torch.float32 for t in floats):
        return None
    b, dev = torch.backends, floats[0].device.type
    if dev == "cuda" and kind == "matmul":
        prec = _precision(b.cuda.matmul, legacy=b.cuda.matmul)
        how = ("torch.backends.cuda.matmul.allow_tf32 is True (torch.set_float32_matmul_precision('high') sets it "
               "too)",
               "torch.backends.cuda.matmul.allow_tf32 = False, or torch.set_float32_matmul_precision('highest')")
    elif dev == "cuda":
        prec = _precision(getattr(b.cudnn, "conv", None), b.cudnn, legacy=b.cudnn)
        how = ("torch.backends.cudnn.allow_tf32 is True (PyTorch's default for convolutions on CUDA)",
               "torch.backends.cudnn.allow_tf32 = False")
    elif dev == "cpu" and hasattr(b, "mkldnn"):
        sub = "matmul" if kind == "matmul" else "conv"
        prec = _precision(getattr(b.mkldnn, sub, None), b.mkldnn)
        how = (f"torch.backends.mkldnn.{sub}.fp32_precision is '{prec}'"
               + (" (torch.set_float32_matmul_precision sets it)" if sub == "matmul" else ""),
               f"torch.backends.mkldnn.{sub}.fp32_precision = 'ieee'"
               + (", or torch.set_float32_matmul_precision('highest')" if sub == "matmul" else ""))
    else:
        return None
    if prec not in BITS:
        return None
    return {"precision": prec, "family": kind, "device": dev, "setting": how[0], "undo": how[1]}


def magnitude(func, args64, kwargs64, out_index: int):
    """sum(|a| * |b|) per output element: the op run on the absolute values of its float64 inputs."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_map

    absd = tree_map(lambda v: v.abs() if isinstance(v, torch.Tensor) and v.is_floating_point() else
                    (abs(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v), (args64, kwargs64))
    got = [t for t in tree_flatten(func(*absd[0], **absd[1]))[0] if isinstance(t, torch.Tensor)]
    return got[out_index] if out_index < len(got) else got[0]


def within(got, f64, mag, mode: dict, atol: float) -> tuple[bool, float]:
    """Whether got is within what mode's precision gives, and its worst error as a fraction of sum(|a|*|b|)."""
    import torch

    g, r, m = (t.detach().to(torch.float64).reshape(-1) for t in (got, f64, mag))
    if not (g.shape == r.shape == m.shape):
        return False, float("inf")
    fin = torch.isfinite(g) & torch.isfinite(r)
    if bool((torch.isfinite(g) != torch.isfinite(r)).any()):
        return False, float("inf")
    err = (g - r)[fin].abs()
    scale = m[fin]
    frac = float((err / scale.clamp_min(1e-300)).max()) if err.numel() else 0.0
    ok = bool((err <= SLACK * 2.0 ** -BITS[mode["precision"]] * scale + atol).all())
    return ok, frac


def words(side: str, mode: dict, frac: float | None) -> str:
    """'the candidate ran this convolution with TF32 allowed (...)', with what it does to the error."""
    name = NAMES[mode["precision"]]
    what = "matrix multiplication" if mode["family"] == "matmul" else "convolution"
    head = (f"the {side} ran this {what} with {name} allowed: {mode['setting']}; {name} keeps "
            f"{BITS[mode['precision']]} of float32's 23 mantissa bits")
    undo = f"to compare at float32 precision, set {mode['undo']} in the {side}"
    if frac is None:   # not replayed: the likely cause, not a proven one
        return (f"{head}, which alone differs past float32's tolerance: the likely cause (not replayed, a wrong kernel "
                f"is not ruled out); {undo}")
    return (f"{head} (its worst error {frac:.2g} of the sum of |products|, within the "
            f"{SLACK * 2.0 ** -BITS[mode['precision']]:.2g} that {name} gives), so the difference is what that "
            f"setting gives, with no kernel error beyond it; {undo}")
