"""Building blocks of the fix modules in patches/: dispatch-level op rewrites, SDPA backend switches, plain
attention in place of SDPA, a GPU memory cap. Each returns the `apply` function a Fix declares.

torch is imported inside the functions that run in the child: the registry loads patches/ in processes
that must not import torch (the runner, `gpulab run`'s parent, the trace bootstrap before its log exists).
"""
from __future__ import annotations

import math
import os
from typing import Any, Callable, Iterable, Mapping


_ACTIVE: list[Any] = []   # entered dispatch modes live as long as the process
_SDPA_SWITCH = {"math": "enable_math_sdp", "flash": "enable_flash_sdp", "efficient": "enable_mem_efficient_sdp",
                "cudnn": "enable_cudnn_sdp"}
Handler = Callable[[Any, tuple, dict], Any]     # (op, args, kwargs) -> result; it calls op itself


def op_rewrite(ops: Iterable[str], handler: Handler) -> Callable[[], None]:
    """apply(): a TorchDispatchMode that hands the listed aten ops (by packet name: 'mm', '_softmax') to
    `handler` and lets every other op through. Installed below the recorder, so the op log shows the
    program's own op and the handler's extra ops are not recorded as the program's."""
    wanted = frozenset(ops)

    def apply() -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        class Rewrite(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func.namespace == "aten" and func.__name__.split(".")[0] in wanted:
                    return handler(func, args, kwargs)
                return func(*args, **kwargs)

        mode = Rewrite()
        mode.__enter__()
        _ACTIVE.append(mode)
    return apply


def _tensors(args: Iterable[Any]) -> list:
    import torch

    return [a for a in args if isinstance(a, torch.Tensor)]


def synchronized(func, args: tuple, kwargs: dict) -> Any:
    """Wait for all queued GPU work before and after the op: stream-ordering bugs cannot straddle it."""
    import torch

    on_gpu = any(t.is_cuda for t in _tensors(args))
    if on_gpu:
        torch.cuda.synchronize()
    out = func(*args, **kwargs)
    if on_gpu:
        torch.cuda.synchronize()
    return out


def contiguous(func, args: tuple, kwargs: dict) -> Any:
    """Strided or transposed tensor operands copied to a dense row-major layout first."""
    import torch

    fixed = tuple(a.contiguous() if isinstance(a, torch.Tensor) and not a.is_contiguous() else a for a in args)
    return func(*fixed, **kwargs)


def _reduced(t: Any) -> bool:
    import torch

    return isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16)


def fp32_softmax(func, args: tuple, kwargs: dict) -> Any:
    """softmax / log-softmax (and their backward) of bf16/fp16 tensors computed in float32, cast back."""
    import torch

    if not _reduced(args[0]):
        return func(*args, **kwargs)
    dtype = args[0].dtype
    name = func.__name__.split(".")[0]
    if name == "_softmax_backward_data":   # (grad, output, dim, input_dtype)
        grad, out, dim, input_dtype = args
        return func(grad.float(), out.float(), dim, torch.float32).to(input_dtype)
    if name in ("_softmax", "_log_softmax"):   # (self, dim, half_to_float)
        return func(args[0].float(), args[1], False).to(torch.float32 if args[2] else dtype)
    want = (args[2] if len(args) > 2 else kwargs.get("dtype")) or dtype   # _safe_softmax(self, dim, dtype=None)
    return func(args[0].float(), args[1]).to(want)


def sdpa_backends(enabled: Mapping[str, bool]) -> Callable[[], None]:
    """apply(): switch SDPA backends on or off process-wide (gpulab names: math, flash, efficient, cudnn);
    a workload's own sdpa_kernel(...) block still overrides this inside the block."""
    bad = [b for b in enabled if b not in _SDPA_SWITCH]
    if bad:
        raise ValueError(f"SDPA backend(s) {bad} are not valid; choose from {', '.join(_SDPA_SWITCH)}")

    def apply() -> None:
        import torch

        for name, on in enabled.items():
            switch = getattr(torch.backends.cuda, _SDPA_SWITCH[name], None)
            if switch is not None:
                switch(on)
    return apply


def only_sdpa_backend(name: str) -> Callable[[], None]:
    return sdpa_backends({b: b == name for b in _SDPA_SWITCH})


def plain_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                    scale: float | None = None, enable_gqa: bool = False):
    """scaled_dot_product_attention written out in plain PyTorch ops (scores and softmax in float32); a
    row whose keys are all masked gives zeros, as SDPA's math backend does."""
    import torch

    if enable_gqa and key.size(-3) != query.size(-3):
        rep = query.size(-3) // key.size(-3)
        key, value = key.repeat_interleave(rep, -3), value.repeat_interleave(rep, -3)
    scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    scores = (query.float() @ key.float().transpose(-2, -1)) * scale
    if is_causal:
        keep = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        scores = (scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool
                  else scores + attn_mask.float())
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    if dropout_p > 0:
        weights = torch.nn.functional.dropout(weights, dropout_p, training=True)
    return (weights @ value.float()).to(query.dtype)


def replace_sdpa() -> None:
    """apply(): torch.nn.functional.scaled_dot_product_attention becomes plain_attention (programs that
    import the name after this point get it too)."""
    import torch.nn.functional as F

    F.scaled_dot_product_attention = plain_attention


def cap_gpu_memory() -> None:
    """apply(): each GPU's caching allocator capped at $GPULAB_MEMORY_FRACTION of its memory, so an
    over-allocation raises OOM instead of paging the shared memory of a unified-memory host."""
    import torch

    if torch.cuda.is_available():
        fraction = float(os.environ.get("GPULAB_MEMORY_FRACTION", "0.8"))
        for i in range(torch.cuda.device_count()):
            torch.cuda.set_per_process_memory_fraction(fraction, i)


def dataloader_defaults(**changes: Any) -> Callable[[], None]:
    """apply(): every DataLoader the program builds with worker processes gets these arguments instead
    (num_workers=0, multiprocessing_context='spawn'); a loader without workers is left as it is."""
    def apply() -> None:
        import functools

        from torch.utils.data import DataLoader

        init = DataLoader.__init__
        if getattr(init, "__gpulab_fix__", False):
            return

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            if kwargs.get("num_workers", args[6] if len(args) > 6 else 0):
                kwargs.update(changes)
                if len(args) > 6 and "num_workers" in changes:
                    args = args[:6] + (changes["num_workers"],) + args[7:]
                    kwargs.pop("num_workers")
                if not kwargs.get("num_workers", 1):
                    kwargs.pop("multiprocessing_context", None)
                    kwargs.pop("prefetch_factor", None)
                    kwargs.pop("persistent_workers", None)
            init(self, *args, **kwargs)
        __init__.__gpulab_fix__ = True
        DataLoader.__init__ = __init__
    return apply
