"""The op vocabulary: what kind of work an op name is (gemm, softmax, layout, sync, collective) and what its
operands' layouts say. The recorder's analysis reads it to summarise a log, the watchdog's classifier to name a
failure class: it lives with the recorder, below both. Pure: names and plain dicts in, words out."""
from __future__ import annotations

from typing import Any, Mapping

_GEMM = {"mm", "bmm", "addmm", "addbmm", "baddbmm", "matmul", "linear", "_scaled_mm", "_int_mm", "addmv", "mv",
         "dot", "vdot", "einsum", "tensordot", "_addmm_activation", "_grouped_mm", "_scaled_grouped_mm"}
_SOFTMAX_WORDS = ("softmax", "attention", "attn", "logsumexp", "sdpa")
_LAYOUT = {"copy_", "clone", "contiguous", "_to_copy", "as_strided", "as_strided_", "as_strided_scatter", "cat",
           "stack", "_copy_from", "_copy_from_and_resize", "transpose_copy", "permute_copy", "t_copy"}
_SYNC_OPS = {"_local_scalar_dense", "item", "synchronize", "nonzero", "masked_select", "unique", "_unique2",
             "is_nonzero", "equal", "allclose"}
_COLLECTIVE_WORDS = ("c10d", "nccl", "all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter",
                     "broadcast_", "barrier", "all_to_all", "alltoall", "_functional_collectives", "gloo")


def op_base(name: str | None) -> str:
    """'aten.bmm.default' -> 'bmm'; 'mylib::flash_attn' -> 'flash_attn'; 'torch.cuda.synchronize' -> 'synchronize'."""
    if not name:
        return ""
    parts = str(name).replace("::", ".").split(".")
    if parts[0] == "torch" or len(parts) == 1:
        return parts[-1]
    return parts[1]


def op_kind(name: str | None) -> str | None:
    """gemm | softmax | layout | sync | collective for an op name, or None."""
    base = op_base(name)
    low = str(name or "").lower()
    if not base:
        return None
    if any(w in low for w in _COLLECTIVE_WORDS):
        return "collective"
    if base in _GEMM:
        return "gemm"
    if any(w in base.lower() for w in _SOFTMAX_WORDS):
        return "softmax"
    if base in _SYNC_OPS:
        return "sync"
    if base in _LAYOUT:
        return "layout"
    return None


def describe_op(op: Mapping[str, Any] | None) -> str:
    if not op:
        return "none"
    shapes = op.get("shapes")
    txt = str(op.get("name"))
    if shapes:
        txt += " shapes " + " x ".join(str(list(s)) for s in shapes)
    if op.get("strides"):
        txt += " strides " + " x ".join(str(list(s)) for s in op["strides"])
    if op.get("device"):
        txt += f" on {op['device']}"
    if op.get("call_site"):
        txt += f" at {op['call_site']}"
    return txt


def layout_problems(op: Mapping[str, Any]) -> list[str]:
    """Trailing 2-D blocks that are neither row- nor column-major, or broadcast (stride 0)."""
    out = []
    for i, (shape, stride) in enumerate(zip(op.get("shapes") or (), op.get("strides") or ())):
        if shape is None or stride is None or len(shape) < 2 or len(stride) < 2:
            continue
        if 0 in shape:
            continue
        s1, s0 = stride[-1], stride[-2]
        if (s1 == 1 and s0 >= max(1, shape[-1])) or (s0 == 1 and s1 >= max(1, shape[-2])):
            continue
        if shape[-1] == 1 or shape[-2] == 1:
            continue
        out.append(f"arg {i} shape {list(shape)} has strides {list(stride)}: neither row- nor column-major")
    return out


def transposed_args(op: Mapping[str, Any]) -> list[int]:
    res = []
    for i, (shape, stride) in enumerate(zip(op.get("shapes") or (), op.get("strides") or ())):
        if shape and stride and len(shape) >= 2 and stride[-2] == 1 and stride[-1] != 1 and shape[-2] > 1:
            res.append(i)
    return res


def noncontiguous_args(op: Mapping[str, Any]) -> list[int]:
    return [i for i, c in enumerate(op.get("contiguous") or ()) if c is False]
