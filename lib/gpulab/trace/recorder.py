"""The recorder: writes every op into the ring (gpulab.trace.ring) before it runs, from a RecordFunction
observer (gpulab.trace.observe: modes ops and auto, wherever it builds) or a TorchDispatchMode (the modes that
act after each op, sync and stats, and the fallback; what follows about the dispatch mode is about that path).

Modes: `ops` records each op; `sync` also synchronizes after each op on CUDA; `stats` also writes min/max/
mean and NaN/Inf counts of each output; `auto` records like `ops` until the program initializes CUDA and
from its first CUDA op on also tracks each op's GPU completion (gpulab.trace.gpu: a stream memory op
when the driver allows it, else pooled events); `gpu` is the same with the events mechanism.

What TorchDispatchMode sees of SDPA (checked on torch 2.13 CPU; the GPU script checks CUDA):
`F.scaled_dot_product_attention` is CompositeImplicitAutograd, so the dispatch mode never sees it nor
`aten._scaled_dot_product_attention_math`; it sees the fused kernel (`aten._scaled_dot_product_flash_
attention_for_cpu` on CPU, `aten._scaled_dot_product_{flash,efficient,cudnn}_attention` on CUDA) or, with
the math backend, only the decomposition (`aten.mul.Scalar`, `aten.bmm.default`, `aten._safe_softmax`
(masked) or `aten._softmax`, ...). The recorder therefore wraps `torch.nn.functional.scaled_dot_product_
attention` while installed and writes a composite record `aten.scaled_dot_product_attention.default`
(kind "composite") and, when `torch._fused_sdp_choice` says math, a nested `aten._scaled_dot_product_
attention_math.default`, around the decomposed records. Backward ops run by autograd's engine threads are
seen because autograd carries the dispatch-mode stack into its worker threads (the thread is recorded).
torch is imported when a recorder is installed, never at import. This module owns the log, the install and
the background sampler; the dispatch mode's per-op hot path is gpulab.trace.dispatch.
"""
from __future__ import annotations

import mmap
import os
import sys
import threading
import time
import weakref
from pathlib import Path

from gpulab.trace import gpu as gpu_mod  # ctypes only: CUDA is touched once the program uses it
from gpulab.trace import collectives, gpumarks, lazydynamo, observe, ring
from gpulab.trace.dispatch import make_mode
from gpulab.trace.prefault import Prefault
from gpulab.trace.ring import (_MEM, _OFF_MEMCOUNT, _OFF_STARTED, DEFAULT_CAPACITY, DEFAULT_MEM_CAPACITY,
                               DEFAULT_STRING_CAPACITY, GPU_PAGE_OFF, HEADER_SIZE, MEM_SIZE, PAGE, StringWriter,
                               _check_mode, _Q, create)

_GPU_POLL_S = 0.001
_MEM_FAST_FOR_S, _MEM_SLOW_S = 10.0, 0.1   # memory samples every mem_interval_s for 10 s, then every 0.1 s


def _rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Recorder:
    """Install with `with Recorder(log, mode):` (or `.install()`); one log per recorder.

    gpu_mechanism: None (the mode's default: `auto` picks the best, `gpu` uses events) or one of
    gpulab.trace.gpu.PREFERENCES to force one (the GPU check compares them). native=False keeps the
    pure-Python hot path even when the C one is built, observer=False the dispatch mode even where the observer is
    built (`hot_path` says which one runs: observer, native or python)."""

    def __init__(self, log: str | os.PathLike, mode: str = "ops", capacity: int = DEFAULT_CAPACITY,
                 mem_capacity: int = DEFAULT_MEM_CAPACITY, mem_interval_s: float = 0.02,
                 create_log: bool = True, gpu_mechanism: str | None = None,
                 string_capacity: int = DEFAULT_STRING_CAPACITY, native: bool = True, observer: bool = True):
        _check_mode(mode)
        self.log = Path(log)
        self.mode = mode
        self.gpu_mechanism = gpu_mechanism or ("events" if mode == "gpu" else "auto")
        self.native = native      # use the C hot path when it is built (gpulab.trace.native.ensure)
        self.observer = observer  # record from the RecordFunction observer when it is built (modes ops, auto, gpu)
        gpu_mod.check_preference(self.gpu_mechanism)
        if create_log or not self.log.exists():
            create(self.log, mode, capacity, mem_capacity, string_capacity=string_capacity)
        self._fh = open(self.log, "r+b")
        self._mm = mmap.mmap(self._fh.fileno(), 0)
        self.layout, _ = ring._header(self._mm, self.log)
        self.capacity, self.mem_capacity = self.layout.capacity, self.layout.mem_capacity
        self.strings = StringWriter(self._mm, self.layout.strings_off, self.layout.string_capacity,
                                    _Q.unpack_from(self._mm, ring._OFF_STRPOS)[0] or 8)
        self.prefault = Prefault(self._mm, self.layout, self._fh.fileno())
        self._step_prefault()
        self.disk_full = False    # the disk refused the log a page: recording stopped (see _stop_on_full_disk)
        self._mem_interval = mem_interval_s
        self._mode_obj = None
        self._installed = False
        self._marks_known = False
        self._closed = False
        self._bg: threading.Thread | None = None
        self._stop = threading.Event()
        self.tracker = None       # gpulab.trace.gpu.Tracker once GPU tracking started
        self.gpu_notes: tuple[str, ...] = ()  # why better GPU mechanisms were passed over
        self.hot_path = ""        # "observer", "native" or "python" once installed
        self.gpu_path = ""        # who emits the GPU markers once tracking started: "native" or "python"

    # the mode object is built lazily so that `import gpulab.trace` never imports torch
    def install(self) -> "Recorder":
        if self._installed:
            raise RuntimeError(f"recorder for {self.log} is already installed")
        if self._closed:
            raise RuntimeError(f"recorder for {self.log} is closed")
        import torch.nn.functional as F

        if self._mode_obj is None:
            self._mode_obj = observe.make(self)
            if self._mode_obj is not None:
                self.hot_path = "observer"
            else:
                self._mode_obj = make_mode(self)
        self._mode_obj.__enter__()
        if not self._marks_known:   # the dispatch mode marks every raise (its try/except); the observer may not
            probe = getattr(self._mode_obj, "raise_marks", None)
            ring.mark_raise_marks(self._mm, probe() if probe else True)
            self._marks_known = True
        self._orig_sdpa = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = self._mode_obj.sdpa_wrapper(self._orig_sdpa)
        self._restore_dist = collectives.install(self._mode_obj.call_wrapper, on_init=_note_dist)
        lazydynamo.keep_out(__package__)   # its callbacks run inside ops, in compiled frames too
        self._installed = True
        _INSTALLED.add(self)
        self._stop.clear()
        self._bg = threading.Thread(target=self._background, name="gpulab-trace-bg", daemon=True)
        self._bg.start()
        return self

    def uninstall(self) -> None:
        if not self._installed:
            return
        import torch.nn.functional as F

        F.scaled_dot_product_attention = self._orig_sdpa
        self._restore_dist()
        self._mode_obj.__exit__(None, None, None)
        self._installed = False
        _INSTALLED.discard(self)
        self._stop.set()
        if self._bg is not None:
            self._bg.join(timeout=2)
        if self.tracker is not None:
            self.tracker.drain(timeout_s=1.0)
        self._mode_obj.forget_frames()

    def close(self) -> None:
        """Uninstall, release the GPU mechanism and the mapping, and trim a log whose ring never wrapped.
        GPU markers still pending (a hung GPU) keep the mapping: the GPU must never write into freed memory."""
        if self._closed:
            return
        self.uninstall()
        self._closed = True
        gpu_idle = gpumarks.landed(self.tracker, self._mm)
        if self.tracker is not None and gpu_idle:
            self.tracker.close()
        if self._mode_obj is not None:
            self._mode_obj.release()  # its memoryviews of the mapping (an exported buffer blocks close)
        if not gpu_idle:
            return
        try:
            # the GPU page is written by the device (memop-ring) or another thread through its own mapping:
            # one store from here marks it dirty so that the kernel writes it back to the file before close
            self._mm[GPU_PAGE_OFF:GPU_PAGE_OFF + PAGE] = bytes(self._mm[GPU_PAGE_OFF:GPU_PAGE_OFF + PAGE])
            self._mm.close()
        except (BufferError, ValueError):
            pass
        self._fh.close()
        try:
            ring.trim(self.log)
        except (OSError, ValueError):
            pass

    def __enter__(self) -> "Recorder":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()

    def _step_prefault(self) -> None:
        mm, lay = self._mm, self.layout
        started = _Q.unpack_from(mm, _OFF_STARTED)[0]
        self.prefault.step({"slots": min(started, lay.capacity) * lay.slot_size,
                            "strings": self.strings.pos,
                            "memory": _Q.unpack_from(mm, _OFF_MEMCOUNT)[0] * MEM_SIZE})

    def _background(self) -> None:
        """Memory samples every mem_interval_s, pages prefaulted ahead of the writers, and GPU progress
        copied or polled (memop-pinned, events) every millisecond. Never a host sync."""
        next_mem = 0.0
        t_start = time.monotonic()
        while not self._stop.is_set():
            now = time.time()
            # each sample takes the GIL from the program (~0.1 ms): fine-grained while a short run is all there
            # is to see, then at _MEM_SLOW_S, which a job that runs for hours can leave on
            interval = self._mem_interval if time.monotonic() - t_start < _MEM_FAST_FOR_S else \
                max(self._mem_interval, _MEM_SLOW_S)
            if now >= next_mem:
                self._sample_memory(now)
                try:
                    self._step_prefault()
                except (ValueError, OSError):
                    pass
                if self.prefault.full and not self.disk_full:
                    self._stop_on_full_disk()
                next_mem = now + interval
            tracker = self.tracker
            if tracker is not None:
                try:
                    tracker.poll()
                except Exception:  # noqa: BLE001 - GPU progress is best effort, recording goes on
                    pass
            self._stop.wait(_GPU_POLL_S if tracker is not None and tracker.needs_poll else interval)
        self._sample_memory(time.time())

    def _stop_on_full_disk(self) -> None:
        """The disk (or a tmpfs's memory) is full: the next store into a page it never backed would kill the
        program with SIGBUS, so the observer stops writing; the program runs on unrecorded, and says why."""
        self.disk_full = True
        if isinstance(self._mode_obj, observe.ObserverMode):
            self._mode_obj.stop_writing()
            what = "recording stopped here so that the program is not killed (SIGBUS)"
        else:
            what = "the program may be killed (SIGBUS) at its next record: free space in that folder"
        started = _Q.unpack_from(self._mm, _OFF_STARTED)[0]
        ring.mark_stopped(self._mm, started)   # the header pages were backed at creation
        print(f"gpulab: no space left for the op log {self.log} after {started} ops: {what}", file=sys.stderr,
              flush=True)

    def _sample_memory(self, now: float) -> None:
        try:
            alloc, reserved = -1, -1
            import torch
            if torch.cuda.is_initialized():
                # one nested-dict call: memory_allocated() and memory_reserved() each flatten and sort every
                # allocator statistic (~0.1 ms under the GIL, twice per sample)
                st = torch.cuda.memory_stats_as_nested_dict()
                alloc, reserved = st["allocated_bytes"]["all"]["current"], st["reserved_bytes"]["all"]["current"]
            else:
                alloc = _rss_bytes()
            n = _Q.unpack_from(self._mm, _OFF_MEMCOUNT)[0]
            seq = _Q.unpack_from(self._mm, _OFF_STARTED)[0]
            _MEM.pack_into(self._mm, HEADER_SIZE + (n % self.mem_capacity) * MEM_SIZE, now, seq, alloc, reserved)
            _Q.pack_into(self._mm, _OFF_MEMCOUNT, n + 1)
        except Exception:  # noqa: BLE001 - the mmap was closed under us, CUDA is gone: memory is best effort
            pass


_INSTALLED: "weakref.WeakSet[Recorder]" = weakref.WeakSet()


# Told, in order, when the program has called init_process_group: gpulab.trace.follow adds its note of the
# process's rank when it is imported (it imports this module, never the reverse).
ON_DIST_INIT: list = []


def _note_dist(dist) -> None:
    for hook in ON_DIST_INIT:
        hook(dist)


def _leave_forked_child() -> None:
    """In a child made by fork() (a DataLoader worker): stop recording there. The child inherits the
    dispatch-mode stack and the shared mapping, and its copy of the counters would write slots over the
    parent's; its ops are the parent's data loading, not the workload's."""
    for rec in list(_INSTALLED):
        if isinstance(rec._mode_obj, observe.ObserverMode):
            rec._mode_obj.leave_fork()
        try:
            import torch.nn.functional as F
            from torch.utils._python_dispatch import _get_current_dispatch_mode_stack, _pop_mode, _push_mode

            stack = _get_current_dispatch_mode_stack()
            if rec._mode_obj in stack:
                popped = [_pop_mode() for _ in range(len(stack))]
                for m in reversed(popped):
                    if m is not rec._mode_obj:
                        _push_mode(m)
            F.scaled_dot_product_attention = rec._orig_sdpa
            rec._restore_dist()
        except Exception:  # noqa: BLE001 - a child that cannot be cleaned up still must run
            pass
        rec._installed = False
        rec._closed = True   # never close the parent's mapping or GPU registration from here
        rec.tracker = None
    _INSTALLED.clear()


os.register_at_fork(after_in_child=_leave_forked_child)
