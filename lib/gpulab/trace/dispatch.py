"""The recorder's dispatch mode: the per-op hot path that writes each op's record into the ring before the op
runs and completes it after (gpulab.trace.recorder owns the log, the background sampler and the install;
this module only builds the TorchDispatchMode subclass for one recorder). Two hot paths write the same
records: the C one (gpulab.trace.native, when built) and a pure-Python one; both take the op's caller from
sys._getframe(skip), skip counted by a probe (more frames once torch._dynamo wraps the method:
gpulab.trace.lazydynamo).
"""
from __future__ import annotations

import functools
import sys
import threading
import time

from gpulab.trace import gpumarks, lazydynamo, native, opstats, texts
from gpulab.trace.ring import _OFF_COMPLETED, _OFF_FLAGS, _OFF_STARTED, _OFF_TEND, _SLOT, F_RAISED, Layout, _q

_TRACK_PLAIN, _TRACK_GPU, _TRACK_SYNC, _TRACK_STATS, _TRACK_WAIT_CUDA = 0, 1, 2, 3, 4


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


def make_mode(rec):
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
    uninitialized, no_gpu_work, state, gen, intern = t.uninitialized, t.no_gpu_work, t.state, t.gen, t.intern
    name_of, code_kind, site_text, call_site, thread_name = t.name_of, t.code_kind, t.site_text, t.call_site, t.thread_name
    args_slow, args_miss = t.args_slow, t.args_miss

    compute_stats = opstats.stats_writer(mm, torch, state)
    # stats mode: each op's line and pass, for the first NaN's record beside the log
    nan_watch = (opstats.first_nan_watch(torch, t, rec.log)
                 if mode_name == "stats" and getattr(rec, "log", None) is not None else None)

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
        on_site=site_text, on_args=args_slow, on_miss=args_miss, nomark=no_gpu_work))
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
    def after(token: int, func, out, args=()) -> None:
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
            if nan_watch is not None:
                nan_watch.note(func)
            if id(func) in uninitialized:  # empty() holds garbage: NaNs there are not a fault
                if nan_watch is not None:
                    nan_watch.allocated(func, out)
            elif nan_watch is None or not nan_watch.unwritten(func, args, out):   # nor in a view of it
                if compute_stats(out, slots + (seq % cap) * slot_size, seq) and nan_watch is not None:
                    if nan_watch.first(func, args, out, seq):   # what a GradScaler caught, passed on
                        state["nonfinite_set"] = False
                elif nan_watch is not None:
                    if state.get("neginf"):
                        nan_watch.made_neginf(func, args, out)
                    nan_watch.seen(state.get("amax"))
                    nan_watch.selected(func, args, state.get("amax"), state.get("bad"))
                    if nan_watch.scaler_check(func, args):   # caught by a GradScaler: watch for the next one
                        state["nonfinite_set"] = False
                if nan_watch is not None:   # the first NaN's own op may write the weights too
                    nan_watch.updated_weights(func, args)

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
        @classmethod
        def ignore_compile_internals(cls) -> bool:
            """Off while dynamo traces and Inductor compiles, on while the compiled code runs: without this,
            dynamo compiles nothing while the mode is active and the program would run eager under gpulab."""
            return True

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
                after(seq << 8 | ((-1 if func in no_gpu_work else sig[1]) + 2), func, out, args)
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
                after(token, func, out, args)
            hot_end(token)
            return out

    return _NativeMode()


def _native_hot(rec, mm, lay: Layout, skip: int, hooks: dict):
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
