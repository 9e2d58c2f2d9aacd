"""The recorder: a TorchDispatchMode that writes every op into the ring (gpulab.trace.ring) before it runs.

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
torch is imported when a recorder is installed, never at import.
"""
from __future__ import annotations

import functools
import mmap
import os
import sys
import threading
import time
import weakref
from pathlib import Path

from gpulab.trace import gpu as gpu_mod  # ctypes only: CUDA is touched once the program uses it
from gpulab.trace import collectives, gpumarks, lazydynamo, native, opstats, ring, texts
from gpulab.trace.prefault import Prefault
from gpulab.trace.ring import (_MEM, _OFF_COMPLETED, _OFF_FLAGS, _OFF_MEMCOUNT, _OFF_STARTED, _OFF_TEND, _SLOT,
                               DEFAULT_CAPACITY, DEFAULT_MEM_CAPACITY, DEFAULT_STRING_CAPACITY, F_RAISED,
                               GPU_PAGE_OFF, HEADER_SIZE, MEM_SIZE, PAGE, Layout, StringWriter, _check_mode, _Q, _q,
                               create)

_TRACK_PLAIN, _TRACK_GPU, _TRACK_SYNC, _TRACK_STATS, _TRACK_WAIT_CUDA = 0, 1, 2, 3, 4
_GPU_POLL_S = 0.001


def _rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Recorder:
    """Install with `with Recorder(log, mode):` (or `.install()`); one log per recorder.

    gpu_mechanism: None (the mode's default: `auto` picks the best, `gpu` uses events) or one of
    gpulab.trace.gpu.PREFERENCES to force one (the GPU check compares them). native=False keeps the
    pure-Python hot path even when the C one is built (`hot_path` says which one runs)."""

    def __init__(self, log: str | os.PathLike, mode: str = "ops", capacity: int = DEFAULT_CAPACITY,
                 mem_capacity: int = DEFAULT_MEM_CAPACITY, mem_interval_s: float = 0.02,
                 create_log: bool = True, gpu_mechanism: str | None = None,
                 string_capacity: int = DEFAULT_STRING_CAPACITY, native: bool = True):
        _check_mode(mode)
        self.log = Path(log)
        self.mode = mode
        self.gpu_mechanism = gpu_mechanism or ("events" if mode == "gpu" else "auto")
        self.native = native      # use the C hot path when it is built (gpulab.trace.native.ensure)
        gpu_mod.check_preference(self.gpu_mechanism)
        if create_log or not self.log.exists():
            create(self.log, mode, capacity, mem_capacity, string_capacity=string_capacity)
        self._fh = open(self.log, "r+b")
        self._mm = mmap.mmap(self._fh.fileno(), 0)
        self.layout, _ = ring._header(self._mm, self.log)
        self.capacity, self.mem_capacity = self.layout.capacity, self.layout.mem_capacity
        self.strings = StringWriter(self._mm, self.layout.strings_off, self.layout.string_capacity,
                                    _Q.unpack_from(self._mm, ring._OFF_STRPOS)[0] or 8)
        self.prefault = Prefault(self._mm, self.layout)
        self._step_prefault()
        self._mem_interval = mem_interval_s
        self._mode_obj = None
        self._installed = False
        self._closed = False
        self._bg: threading.Thread | None = None
        self._stop = threading.Event()
        self.tracker = None       # gpulab.trace.gpu.Tracker once GPU tracking started
        self.gpu_notes: tuple[str, ...] = ()  # why better GPU mechanisms were passed over
        self.hot_path = ""        # "native" or "python" once installed
        self.gpu_path = ""        # who emits the GPU markers once tracking started: "native" or "python"

    # the mode object is built lazily so that `import gpulab.trace` never imports torch
    def install(self) -> "Recorder":
        if self._installed:
            raise RuntimeError(f"recorder for {self.log} is already installed")
        if self._closed:
            raise RuntimeError(f"recorder for {self.log} is closed")
        import torch.nn.functional as F

        if self._mode_obj is None:
            self._mode_obj = _make_mode(self)
        self._mode_obj.__enter__()
        self._orig_sdpa = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = self._mode_obj.sdpa_wrapper(self._orig_sdpa)
        self._restore_dist = collectives.install(self._mode_obj.call_wrapper, on_init=_note_dist)
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
        while not self._stop.is_set():
            now = time.time()
            if now >= next_mem:
                self._sample_memory(now)
                try:
                    self._step_prefault()
                except (ValueError, OSError):
                    pass
                next_mem = now + self._mem_interval
            tracker = self.tracker
            if tracker is not None:
                try:
                    tracker.poll()
                except Exception:  # noqa: BLE001 - GPU progress is best effort, recording goes on
                    pass
            self._stop.wait(_GPU_POLL_S if tracker is not None and tracker.needs_poll else
                            min(self._mem_interval, 0.02))
        self._sample_memory(time.time())

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


def _note_dist(dist) -> None:
    from gpulab.trace import follow  # follow imports this module

    follow.note_dist(dist)


def _leave_forked_child() -> None:
    """In a child made by fork() (a DataLoader worker): stop recording there. The child inherits the
    dispatch-mode stack and the shared mapping, and its copy of the counters would write slots over the
    parent's; its ops are the parent's data loading, not the workload's."""
    for rec in list(_INSTALLED):
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


def _dispatch_depth(torch, TorchDispatchMode) -> int:
    """sys._getframe(n) that is the op's caller inside a mode's __torch_dispatch__: torch wraps the method in
    dynamo-disable wrappers (2 frames on torch 2.13) once torch._dynamo is imported (gpulab.trace.lazydynamo),
    counted by dispatching a probe op into a probe mode built the same way; the probe raises before anything
    runs (no mode below it sees the op)."""
    class _Found(Exception):
        pass

    class _Probe(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            f, n = sys._getframe(1), 1
            while f is not None and f is not caller:
                f, n = f.f_back, n + 1
            raise _Found(n if f is not None else 1)

    caller = sys._getframe(0)
    try:
        with _Probe():
            torch.empty(0)
    except _Found as e:
        return e.args[0]
    except Exception:  # noqa: BLE001 - fall back to walking from the wrappers (correct, slower)
        pass
    finally:
        caller = None
    return 1


def _make_mode(rec: Recorder):
    """Build the TorchDispatchMode subclass (torch is imported here, not at module import)."""
    import itertools

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    mm = rec._mm
    lay = rec.layout
    cap, slot_size, slots = lay.capacity, lay.slot_size, lay.slots_off
    strings = rec.strings
    pack_slot = _SLOT.pack_into
    pack_q = _q.pack_into
    now = time.time
    get_ident = threading.get_ident
    getframe = sys._getframe
    Tensor = torch.Tensor
    mode_name = rec.mode
    cuda = torch.cuda
    cuda_mod = sys.modules["torch.cuda"]
    track = {"ops": _TRACK_PLAIN, "sync": _TRACK_SYNC, "stats": _TRACK_STATS}.get(mode_name, _TRACK_WAIT_CUDA)

    depths: dict = {}  # tid -> nesting depth, only set inside the SDPA wrapper (a TLS getattr costs ~0.7 us)
    walk = (None, None, None)

    def forget_walk() -> None:
        """The string table wrapped (gpulab.trace.texts): the hot paths' cached ids are stale too."""
        nonlocal walk
        walk = (None, None, None)
        if hot is not None:
            hot.forget()

    t = texts.op_texts(mm, lay, strings, torch, forget_walk)
    names, codes, threads, arg_cache, scalar_cls = t.names, t.codes, t.threads, t.arg_cache, t.scalar_cls
    uninitialized, state, gen, intern = t.uninitialized, t.state, t.gen, t.intern
    name_of, code_kind, site_text, call_site, thread_name = t.name_of, t.code_kind, t.site_text, t.call_site, t.thread_name
    args_slow, args_miss = t.args_slow, t.args_miss

    compute_stats = opstats.stats_writer(mm, torch, state)

    # ------------------------------------------------------------------ counters and views
    # bound methods and module constants as closure cells: a cell read is cheaper than a global or attribute
    names_get, codes_get, threads_get, cache_get = names.get, codes.get, threads.get, arg_cache.get
    Parameter = torch.nn.Parameter
    # single fields are stored through typed memoryviews (an item store costs a third of a pack_into)
    mv_b = memoryview(mm)
    mv_q, mv_d, mv_h = mv_b.cast("q"), mv_b.cast("d"), mv_b.cast("h")
    i_started, i_completed = _OFF_STARTED // 8, _OFF_COMPLETED // 8
    i_tend = _OFF_TEND // 8
    off_flags = _OFF_FLAGS
    WAIT = _TRACK_WAIT_CUDA
    def dynamo_imported() -> None:
        """The mode's method is wrapped from now on (gpulab.trace.lazydynamo): the caller is deeper."""
        nonlocal skip
        skip = _dispatch_depth(torch, TorchDispatchMode)
        if hot is not None:
            hot.set_skip(skip)

    lazydynamo.on_import(dynamo_imported)   # deferred (the bootstrap's --dynamo lazy): the probe and the mode unwrapped
    skip = _dispatch_depth(torch, TorchDispatchMode)
    hot = _native_hot(rec, mm, lay, skip, dict(
        tensor_type=Tensor, parameter_type=Parameter, scalar_types=scalar_cls, names=names, threads=threads,
        codes=codes, cache=arg_cache, depths=depths, on_name=name_of, on_thread=thread_name, on_code=code_kind,
        on_site=site_text, on_args=args_slow, on_miss=args_miss))
    if hot is not None:  # one seq and completion count for both paths (composite records use them)
        next_seq, next_done = hot.next_seq, hot.next_done
    else:
        next_seq, next_done = itertools.count().__next__, itertools.count(1).__next__

    # ------------------------------------------------------------------ GPU progress (auto and gpu modes)
    def track_gpu(on: bool) -> None:
        """gpulab.trace.gpumarks switches the hot paths' `track` cell (started, handed to C, stopped)."""
        nonlocal track
        track = _TRACK_GPU if on else _TRACK_PLAIN

    start_gpu, gpu_mark = gpumarks.gpu_marks(rec, torch, hot, intern, track_gpu, mv_q, mv_h)

    # ------------------------------------------------------------------ after the op (modes beyond ops)
    def after(token: int, func, out) -> None:
        """GPU marker, sync or stats for the op `token` (seq << 8 | device + 2) that just returned."""
        if track == _TRACK_WAIT_CUDA and cuda_mod._initialized:
            start_gpu()
        seq, dev = token >> 8, (token & 255) - 2
        if track == _TRACK_GPU:
            if dev != -1:  # -1: no CUDA tensor, no marker
                gpu_mark(seq, dev)
        elif track == _TRACK_SYNC:
            if cuda_mod._initialized:
                cuda.synchronize()
        elif track == _TRACK_STATS:
            if id(func) not in uninitialized:  # empty() holds garbage: NaNs there are not a fault
                compute_stats(out, slots + (seq % cap) * slot_size, seq)

    # ------------------------------------------------------------------ composite records (SDPA)
    def begin(name: bytes, args, kind: int, site: int) -> tuple[int, int]:
        seq = next_seq()
        tid = get_ident()
        off = slots + (seq % cap) * slot_size
        aid = args_slow(args)[0]
        pack_slot(mm, off, -1, now(), 0.0, intern(name), site, aid, threads.get(tid) or thread_name(tid), -1,
                  depths.get(tid, 0), kind, 0)
        pack_q(mm, off, seq)                 # commit marker last
        mv_q[i_started] = seq + 1
        return seq, off

    def end(seq: int, off: int, raised: bool) -> None:
        mv_d[(off >> 3) + i_tend] = now()
        if raised:
            mm[off + _OFF_FLAGS] = F_RAISED
        mv_q[i_completed] = next_done()

    def deeper() -> tuple[int, int]:
        """Ops dispatched inside a composite record are one level deeper (the thread's depth before)."""
        tid = get_ident()
        d0 = depths.get(tid, 0)
        depths[tid] = d0 + 1
        return tid, d0

    def back(tid: int, d0: int) -> None:
        if d0:
            depths[tid] = d0
        else:
            depths.pop(tid, None)

    class _Base(TorchDispatchMode):
        def forget_frames(self) -> None:
            """Drop the cached frames (they keep their locals alive) once uninstalled."""
            nonlocal walk
            walk = (None, None, None)
            if hot is not None:
                hot.forget()

        def release(self) -> None:
            self.forget_frames()
            if hot is not None:
                hot.release()
            for v in (mv_q, mv_d, mv_h, mv_b):
                v.release()

        def call_wrapper(self, orig, name: bytes, describe):
            """A Python-level call (a torch.distributed collective) as one composite record around what the
            dispatcher runs inside it: its wait is inside the record, so an open record is a call that never
            returned. describe(args, kwargs) gives the record's arguments, or None to run it unrecorded."""
            def wrapper(*args, **kwargs):
                what = describe(args, kwargs)
                if what is None:
                    return orig(*args, **kwargs)
                seq, off = begin(name, what, 1, call_site())
                tid, d0 = deeper()
                raised = True
                try:
                    out = orig(*args, **kwargs)
                    raised = False
                finally:
                    back(tid, d0)
                    end(seq, off, raised)
                return out
            return functools.update_wrapper(wrapper, orig)

        def sdpa_wrapper(self, orig):
            def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                             scale=None, enable_gqa=False):
                """Recorder's wrapper: records the composite SDPA call around what the dispatcher runs."""
                kw = {"attn_mask": attn_mask, "dropout_p": dropout_p, "is_causal": is_causal, "scale": scale}
                if enable_gqa:
                    kw["enable_gqa"] = enable_gqa
                site = call_site()
                seq, off = begin(b"aten.scaled_dot_product_attention.default", (query, key, value, attn_mask),
                                 1, site)
                math = False
                try:
                    math = int(torch._fused_sdp_choice(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                                       is_causal=is_causal, scale=scale,
                                                       enable_gqa=enable_gqa)) == 0
                except Exception:  # noqa: BLE001 - the choice is informative only
                    pass
                tid, d0 = deeper()
                inner = None
                raised = True
                try:
                    if math:
                        inner = begin(b"aten._scaled_dot_product_attention_math.default",
                                      (query, key, value, attn_mask), 1, site)
                        depths[tid] = d0 + 2
                    out = orig(query, key, value, **kw)
                    raised = False
                finally:
                    back(tid, d0)
                    if inner is not None:
                        end(*inner, raised)
                    end(seq, off, raised)
                return out
            scaled_dot_product_attention.__wrapped__ = orig
            return scaled_dot_product_attention

    class _PyMode(_Base):
        """The pure-Python hot path (no compiler needed)."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            # flat (a helper call costs ~0.1 us), closure cells only, every cache hit one dict lookup
            nonlocal walk
            seq = next_seq()
            tid = get_ident()
            g = gen[0]
            # call site: innermost frame outside torch and the recorder, cached per (code, instruction)
            try:
                f = getframe(skip)
            except ValueError:  # a native thread (autograd engine worker): no Python caller
                f = None
            c = walk
            if f is c[0]:
                u, d = c[1], c[2]
            else:
                u, d = f, None
                while u is not None:
                    d = codes_get(id(u.f_code))
                    if d is None:
                        d = code_kind(u.f_code)
                    if d is not True:
                        break
                    u = u.f_back
                walk = (f, u, d)
            site = (d.get(u.f_lasti) or site_text(u, d)) if u is not None else 0
            # argument summary, cached per signature
            key = ()
            for a in args:
                ta = a.__class__
                if ta is Tensor or ta is Parameter:
                    key += (a.dtype, a.shape, a.stride(), a.device)
                elif ta in scalar_cls or (ta is float and a):  # not 0.0: -0.0 == 0.0, their reprs differ
                    key += (ta, a)
                elif (ta is list or ta is tuple) and (not a or a[0].__class__ is int):
                    key += (ta, tuple(a))
                else:
                    sig = args_slow(args)
                    break
            else:
                try:
                    sig = cache_get(key) or args_miss(args, key)
                except TypeError:  # an unhashable item (a symbolic int)
                    sig = args_slow(args)
            name = names_get(id(func)) or name_of(func)
            thread = threads_get(tid) or thread_name(tid)
            if gen[0] != g:  # the string table wrapped while this op's texts were looked up: look up again
                name, thread, sig = name_of(func), thread_name(tid), args_slow(args)
                site = site_text(u, {}) if u is not None else 0
            off = slots + (seq % cap) * slot_size
            pack_slot(mm, off, -1, now(), 0.0, name, site, sig[0], thread, -1, depths.get(tid, 0) if depths else 0,
                      0, 0)
            iq = off >> 3
            mv_q[iq] = seq                   # commit marker last: a reader skips a half-written slot
            mv_q[i_started] = seq + 1
            try:
                out = func(*args, **(kwargs or {}))
            except BaseException:
                mv_d[iq + i_tend] = now()
                mv_b[off + off_flags] = F_RAISED
                mv_q[i_completed] = next_done()
                raise
            if track and (track != WAIT or cuda_mod._initialized):
                after(seq << 8 | (sig[1] + 2), func, out)
            mv_d[iq + i_tend] = now()
            mv_q[i_completed] = next_done()
            return out

    rec.hot_path = "python" if hot is None else "native"
    if hot is None:
        return _PyMode()
    hot_begin, hot_end, hot_fail = hot.begin, hot.end, hot.fail

    class _NativeMode(_Base):
        """The same records, written by gpulab.trace.native (one C call before the op, one after)."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            token = hot_begin(func, args)
            try:
                out = func(*args, **(kwargs or {}))
            except BaseException:
                hot_fail(token)
                raise
            if track and (track != WAIT or cuda_mod._initialized):
                after(token, func, out)
            hot_end(token)
            return out

    return _NativeMode()


def _native_hot(rec: Recorder, mm, lay: Layout, skip: int, hooks: dict):
    """The C hot path over this log, or None (not built, turned off, or refused by the recorder)."""
    if not rec.native:
        return None
    mod = native.load()
    if mod is None:
        return None
    try:
        return mod.Hot(mm, lay.slots_off, lay.capacity, lay.slot_size, _OFF_STARTED, _OFF_COMPLETED, skip, **hooks)
    except (TypeError, ValueError, BufferError):
        return None
