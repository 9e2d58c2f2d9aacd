"""The recorder's default hot path: a RecordFunction observer (gpulab.trace.native's observer.cpp) that writes
every op the dispatcher runs into the log, instead of a TorchDispatchMode.

Why: a dispatch mode costs ~5-10 us of Python per op (a real GPU step slowed by half) and, while it is active,
dynamo compiles nothing; the observer costs well under a microsecond per op, leaves torch.compile, CUDA graphs
and autocast as they are, and sees what compiled code runs: its compiled regions, its aten, extern and custom ops, and (gpulab.trace.kernels)
each Triton kernel it launches, by name. The records are the dispatch mode's (gpulab.trace.texts writes the
texts on each cache miss), so every reader of the log is unchanged; SDPA needs no wrapper (the dispatcher's own
`aten.scaled_dot_product_attention` is recorded, with the backend's op nested inside it).

This object has the dispatch mode's duck type for gpulab.trace.recorder: __enter__/__exit__, call_wrapper,
sdpa_wrapper, forget_frames, release, leave_fork.
"""
from __future__ import annotations

import ctypes
import functools
import os
from typing import Any, Callable

from gpulab.trace import gpumarks, graphs, kernels, native, texts
from gpulab.trace.ring import _OFF_COMPLETED, _OFF_DEVICE, _OFF_STARTED

_TRACK = {"ops": 0, "auto": 4, "gpu": 4}   # observer.cpp: 0 plain, 4 GPU markers from the first CUDA op on
MODES = tuple(_TRACK)


class ObserverMode:
    """One recorder's observer over its log (see the module docstring)."""

    def __init__(self, rec: Any, mod: Any, torch: Any, name_kernels: bool):
        mm, lay = rec._mm, rec.layout
        self._torch = torch
        self._kernels = name_kernels
        self._undo_kernels: Callable[[], None] | None = None
        self._undo_graphs: Callable[[], None] | None = None
        self._obs = None

        def forget() -> None:
            if self._obs is not None:
                self._obs.forget()

        t = texts.op_texts(mm, lay, rec.strings, torch, forget)
        self._t = t

        # the native side emits every marker: gpumarks' Python marker (and the log views it writes through) is
        # never used here, so it gets none
        start_gpu, _ = gpumarks.gpu_marks(rec, torch, self, t.intern, lambda on: None, None, None)

        def on_cuda() -> None:
            """The first op on a CUDA tensor ended: pick the GPU mechanism (it calls gpu_start on success)."""
            start_gpu()
            self._native_capture_check(rec)

        self._obs = mod.Observer(mm, lay.slots_off, lay.capacity, lay.slot_size, _OFF_STARTED, _OFF_COMPLETED,
                                 _OFF_DEVICE, t.intern, t.thread_name, t.code_kind, t.site_at, on_cuda,
                                 tuple(texts.NO_GPU_WORK), _TRACK[rec.mode])
        self.begin, self.end = self._obs.begin, self._obs.end

    # --------------------------------------------------------------------------- GPU (gpulab.trace.gpumarks)
    def gpu_start(self, *args, **kw) -> None:
        self._obs.gpu_start(*args, **kw)

    def gpu_stop(self) -> None:
        self._obs.gpu_stop()

    def gpu_pending(self) -> int:
        return self._obs.gpu_pending()

    def gpu_state(self):
        return self._obs.gpu_state()

    def _native_capture_check(self, rec: Any) -> None:
        """The observer asks the driver whether a stream is capturing a CUDA graph (no Python per op)."""
        tracker = rec.tracker
        fn = getattr(getattr(tracker, "drv", None), "fn", {}).get("cuStreamIsCapturing")
        if fn is not None:
            self._obs.set_capturing(ctypes.cast(fn, ctypes.c_void_p).value or 0)

    def stats(self) -> dict:
        return self._obs.stats()

    # --------------------------------------------------------------------------- the recorder's interface
    def __enter__(self) -> "ObserverMode":
        self._obs.install()
        if self._kernels:
            self._undo_kernels = kernels.install(self._obs, self._t.intern, self._t.gen)
        self._undo_graphs = graphs.install(self._obs, self._t)
        return self

    def __exit__(self, *exc) -> None:
        self._obs.remove()
        for undo in (self._undo_kernels, self._undo_graphs):
            if undo is not None:
                undo()
        self._undo_kernels = self._undo_graphs = None

    def call_wrapper(self, orig: Callable, name: bytes, describe: Callable) -> Callable:
        """A Python-level call (a torch.distributed collective) as one composite record around what the
        dispatcher runs inside it (see gpulab.trace.dispatch's)."""
        t, begin, end = self._t, self.begin, self.end

        def wrapper(*args, **kwargs):
            what = describe(args, kwargs)
            if what is None:
                return orig(*args, **kwargs)
            seq = begin(t.intern(name), t.call_site(), t.args_slow(what)[0], 1)
            raised = True
            try:
                out = orig(*args, **kwargs)
                raised = False
            finally:
                end(seq, raised)
            return out
        return functools.update_wrapper(wrapper, orig)

    def sdpa_wrapper(self, orig: Callable) -> Callable:
        return orig   # the dispatcher's aten.scaled_dot_product_attention is recorded as it runs

    def forget_frames(self) -> None:
        pass

    def raise_marks(self) -> bool | None:
        """Whether an op that raises is marked so (F_RAISED), from one op that fails, unrecorded. torch 2.11's
        CUDA wheels end an op's record with no exception in flight: there the observer asks for every op's
        outputs, which an op that raised never has (GPULAB_OBSERVER_RAISE=outputs asks for them anywhere, =seen
        never: their cost is measured against it). None or False: a reader cannot tell 'no op raised' from
        'unmarked', and says so."""
        torch = self._torch

        def fail() -> None:
            try:
                torch.empty(-1, device="cpu")   # never the default device: CUDA starts when the program says
            except RuntimeError:
                pass
        how = os.environ.get("GPULAB_OBSERVER_RAISE", "")   # "outputs": ask anywhere; "seen": never ask
        if how == "outputs":
            self._obs.mark_by_outputs()
        seen = self._obs.probe(fail)
        if seen is False and how != "seen":
            self._obs.mark_by_outputs()
            seen = self._obs.probe(fail)
        return seen

    def release(self) -> None:
        self._obs.release()

    def leave_fork(self) -> None:
        self.stop_writing()

    def stop_writing(self) -> None:
        """Never write into the log again (a forked child's copy of it, a log the disk cannot back)."""
        self._obs.leave()


def make(rec: Any) -> ObserverMode | None:
    """The observer for this recorder, or None (not built, turned off, or a mode that needs Python per op)."""
    if rec.mode not in _TRACK or not rec.native or not getattr(rec, "observer", True):
        return None
    mod = native.load_observer()
    if mod is None:
        return None
    import torch

    try:
        return ObserverMode(rec, mod, torch, kernels.wanted())
    except (TypeError, ValueError, BufferError, RuntimeError):
        return None
