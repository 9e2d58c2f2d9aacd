"""CUDA graph replays as records. A replay launches a whole captured graph with no op crossing the dispatcher,
so without a record of its own a kernel that never completes inside it would be blamed on the next recorded op
(or on none). Each replay is one record named for the place its graph was captured, `cuda graph replay
(captured at train.py:42 in step)`, at the line that replays it, with a GPU completion marker after it on the
replaying stream: the verdict can then say the work that never completed was the graph's, and where it came
from. The capture site is read when `CUDAGraph.capture_begin` runs (torch.cuda.graph,
make_graphed_callables and Inductor's CUDA graph trees all call it). Ops are not recorded while a stream
captures (the observer asks the driver), so what a capture ran is not in the log: the replay stands for it.
"""
from __future__ import annotations

import sys
import weakref
from typing import Any, Callable

from gpulab.trace import texts


def _user_site(t: Any, depth: int) -> str:
    """The innermost frame outside torch and the recorder (the recorder's code_kind decides)."""
    f = sys._getframe(depth)
    while f is not None:
        kind = t.codes.get(id(f.f_code))
        if kind is None:
            kind = t.code_kind(f.f_code)
        if kind is not True:
            return texts.site_label(f.f_code, f.f_lineno)
        f = f.f_back
    return "an unknown place"


def install(obs: Any, t: Any) -> Callable[[], None]:
    """Wrap torch.cuda.CUDAGraph's capture_begin and replay (only where torch has CUDA graphs); -> undo."""
    try:
        import torch

        cls = torch.cuda.CUDAGraph
        orig_begin, orig_replay = cls.capture_begin, cls.replay
    except (ImportError, AttributeError):
        return lambda: None
    if getattr(orig_replay, "__gpulab_graphs__", False):
        return lambda: None
    sites: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
    names: dict[str, tuple[int, int]] = {}   # capture site -> (string table generation, name's id)

    def capture_begin(self, *args, **kwargs):
        try:
            sites[self] = _user_site(t, 2)
        except TypeError:   # not weak-referenceable: the replay says the place is unknown
            pass
        return orig_begin(self, *args, **kwargs)

    def replay(self, *args, **kwargs):
        site = sites.get(self, "an unknown place")
        cached = names.get(site)
        if cached is None or cached[0] != t.gen[0]:
            cached = names[site] = (t.gen[0], t.intern(f"cuda graph replay (captured at {site})".encode()[:255]))
        seq = obs.kernel_begin(cached[1])
        try:
            out = orig_replay(self, *args, **kwargs)
        except BaseException:
            obs.kernel_end(seq, 0, -1, True)
            raise
        stream = torch.cuda.current_stream()
        obs.kernel_end(seq, stream.cuda_stream, stream.device_index, False)
        return out

    capture_begin.__wrapped__, replay.__wrapped__ = orig_begin, orig_replay
    replay.__gpulab_graphs__ = True
    cls.capture_begin, cls.replay = capture_begin, replay

    def undo() -> None:
        if cls.replay is replay:
            cls.capture_begin, cls.replay = orig_begin, orig_replay
    return undo
