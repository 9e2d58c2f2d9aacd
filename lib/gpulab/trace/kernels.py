"""Kernels that compiled code launches outside the dispatcher, as records: Inductor's Triton launches (its
CachingAutotuner.run), each named as Inductor names it (triton_poi_fused_mul_silu_2, or a user's @triton.jit
kernel by its function name), at the program's line, with its GPU completion marker on the launch's stream.

Why a wrapper: the RecordFunction Inductor opens around a launch (_RecordFunctionFast) exists only while
PyTorch's profiler runs, so the observer would otherwise see a compiled graph's extern and custom ops but not
its kernels, and a kernel that never completes would be blamed on the next recorded op. The wrapper costs one
Python call and two C calls per launch; it changes nothing the launch does (the fast launcher path stays).
GPULAB_TRACE_KERNELS=0 leaves launches unwrapped.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

from gpulab.trace.lazydynamo import _AfterImport

MODULE = "torch._inductor.runtime.triton_heuristics"


def wanted() -> bool:
    return os.environ.get("GPULAB_TRACE_KERNELS", "1") not in ("0", "false", "no", "off")


def _device_index(meta: dict) -> int:
    dev = meta.get("device")
    idx = getattr(dev, "index", dev)
    return idx if isinstance(idx, int) and idx >= 0 else 0


def wrap_run(orig: Callable, begin: Callable, end: Callable, about: Callable[[Any], tuple[int, int]]) -> Callable:
    """CachingAutotuner.run recorded: begin(name) before the launch, end(seq, stream, device, raised) after.
    about(tuner) -> (name's string id, device), cached on the tuner: one lookup per launch."""
    def run(self, *args, stream, **kwargs):
        sid, dev = about(self)
        seq = begin(sid)
        try:
            out = orig(self, *args, stream=stream, **kwargs)
        except BaseException:
            end(seq, stream or 0, -1, True)
            raise
        end(seq, stream or 0, dev, False)
        return out
    run.__wrapped__ = orig
    run.__gpulab_kernels__ = True
    return run


def install(obs: Any, intern: Callable[[bytes], int], gen: list) -> Callable[[], None]:
    """Wrap CachingAutotuner.run now, or when Inductor's runtime is imported; -> undo."""
    state: dict = {"cls": None, "orig": None, "finder": None}

    def about(tuner) -> tuple[int, int]:
        cached = tuner.__dict__.get("_gpulab_name")
        if cached is not None and cached[0] == gen[0]:   # the string table did not wrap since
            return cached[1]
        meta = getattr(tuner, "inductor_meta", None) or {}
        fn = getattr(tuner, "fn", None)
        name = meta.get("kernel_name") or getattr(fn, "__name__", None) or "triton kernel"
        got = (intern(str(name).encode()[:255]), _device_index(getattr(tuner, "triton_meta", None) or {}))
        tuner.__dict__["_gpulab_name"] = (gen[0], got)
        return got

    def patch(mod=None) -> None:
        mod = mod or sys.modules.get(MODULE)
        cls = getattr(mod, "CachingAutotuner", None)
        run = getattr(cls, "run", None)
        if run is None or getattr(run, "__gpulab_kernels__", False):
            return
        state.update(cls=cls, orig=run)
        cls.run = wrap_run(run, obs.kernel_begin, obs.kernel_end, about)

    if MODULE in sys.modules:
        patch()
    else:
        finder = _AfterImport(MODULE, lambda: patch())
        state["finder"] = finder
        sys.meta_path.insert(0, finder)

    def undo() -> None:
        if state["cls"] is not None:
            state["cls"].run = state["orig"]
        if state["finder"] in sys.meta_path:
            sys.meta_path.remove(state["finder"])
    return undo
