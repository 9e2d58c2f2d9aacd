"""The recorder: a TorchDispatchMode that writes every op into the ring (gpulab.trace.ring) before it runs.

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

import itertools
import mmap
import os
import sys
import threading
import time
from pathlib import Path

from gpulab.trace.ring import (_COUNTERS, _MEM, _OFF_COMPLETED, _OFF_DEVICE, _OFF_FLAGS, _OFF_GPU,
                               _OFF_GPUDONE, _OFF_MEMCOUNT, _OFF_NONFINITE, _OFF_STARTED, _OFF_STATS,
                               _OFF_TEND, _SLOT, _STATIC, _STATS, _UNINITIALIZED, DEFAULT_CAPACITY,
                               DEFAULT_MEM_CAPACITY, F_NONFINITE, F_RAISED, F_STATS, HEADER_SIZE, MEM_SIZE,
                               SLOT_SIZE, _b, _check_mode, _d, _Q, _q, create)

_HERE = str(Path(__file__).resolve().parent)

def _rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14


def _prefault(mm: mmap.mmap) -> None:
    """Map every page of the log writable now, once, so that the hot path never takes a page fault.

    The first store to a page of a fresh (sparse) file mapping faults into the kernel (block allocation,
    page-cache page, page-table entry): ~5 us per 4 KiB page, i.e. ~0.7 us per op spread over the 8 slots
    of a page, until the ring has wrapped once. Populating costs the log's size in page cache up front
    (~8 ms per 8 MiB) instead. Kernels without MADV_POPULATE_WRITE: rewrite one byte per page (the log has
    no other writer yet)."""
    try:
        mm.madvise(_MADV_POPULATE_WRITE)
        return
    except (OSError, ValueError, AttributeError):
        pass
    try:
        for off in range(0, len(mm), mmap.PAGESIZE):
            mm[off] = mm[off]
    except (OSError, ValueError, IndexError):
        pass  # best effort: faults then happen on the hot path, as before


class Recorder:
    """Install with `with Recorder(log, mode):` (or `.install()`); one log per recorder."""

    def __init__(self, log: str | os.PathLike, mode: str = "ops", capacity: int = DEFAULT_CAPACITY,
                 mem_capacity: int = DEFAULT_MEM_CAPACITY, mem_interval_s: float = 0.02,
                 create_log: bool = True):
        _check_mode(mode)
        self.log = Path(log)
        self.mode = mode
        if create_log or not self.log.exists():
            create(self.log, mode, capacity, mem_capacity)
        self._fh = open(self.log, "r+b")
        self._mm = mmap.mmap(self._fh.fileno(), 0)
        _prefault(self._mm)
        _, _, _, self.capacity, self.mem_capacity, *_ = _STATIC.unpack_from(self._mm, 0)
        self._mem_interval = mem_interval_s
        self._mode_obj = None
        self._installed = False
        self._bg: threading.Thread | None = None
        self._stop = threading.Event()

    # the mode object is built lazily so that `import gpulab.trace` never imports torch
    def install(self) -> "Recorder":
        if self._installed:
            raise RuntimeError(f"recorder for {self.log} is already installed")
        import torch.nn.functional as F

        if self._mode_obj is None:
            self._mode_obj = _make_mode(self)
        self._mode_obj.__enter__()
        self._orig_sdpa = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = self._mode_obj.sdpa_wrapper(self._orig_sdpa)
        self._installed = True
        self._stop.clear()
        self._bg = threading.Thread(target=self._background, name="gpulab-trace-bg", daemon=True)
        self._bg.start()
        return self

    def uninstall(self) -> None:
        if not self._installed:
            return
        import torch.nn.functional as F

        F.scaled_dot_product_attention = self._orig_sdpa
        self._mode_obj.__exit__(None, None, None)
        self._installed = False
        self._stop.set()
        if self._bg is not None:
            self._bg.join(timeout=2)
        self._mode_obj.drain_events(wait=True)
        self._mode_obj.forget_frames()

    def close(self) -> None:
        self.uninstall()
        if self._mode_obj is not None:
            self._mode_obj.release()  # its memoryviews of the mapping (an exported buffer blocks close)
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass
        self._fh.close()

    def __enter__(self) -> "Recorder":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()

    def _background(self) -> None:
        """Memory samples every mem_interval_s; in gpu mode also polls CUDA events (never a host sync)."""
        mode = self._mode_obj
        poll = 0.001 if self.mode == "gpu" else self._mem_interval
        next_mem = 0.0
        while not self._stop.is_set():
            now = time.time()
            if now >= next_mem:
                self._sample_memory(now)
                next_mem = now + self._mem_interval
            if self.mode == "gpu":
                mode.drain_events(wait=False)
            self._stop.wait(poll)
        self._sample_memory(time.time())

    def _sample_memory(self, now: float) -> None:
        try:
            alloc, reserved = -1, -1
            import torch
            if torch.cuda.is_initialized():
                alloc, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
            else:
                alloc = _rss_bytes()
            n = _Q.unpack_from(self._mm, _OFF_MEMCOUNT)[0]
            seq = _Q.unpack_from(self._mm, _OFF_STARTED)[0]
            _MEM.pack_into(self._mm, HEADER_SIZE + (n % self.mem_capacity) * MEM_SIZE, now, seq, alloc, reserved)
            _Q.pack_into(self._mm, _OFF_MEMCOUNT, n + 1)
        except (ValueError, OSError, RuntimeError):
            pass  # the mmap was closed under us, or CUDA is gone: memory is best effort


def _dispatch_depth(torch, TorchDispatchMode) -> int:
    """sys._getframe(n) that is the op's caller inside a mode's __torch_dispatch__: torch wraps the method in
    dynamo-disable wrappers (2 frames on torch 2.13), counted once by dispatching a probe op into a probe
    mode built the same way; the probe raises before anything runs (no mode below it sees the op)."""
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
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    mm = rec._mm
    cap = rec.capacity
    slots = HEADER_SIZE + rec.mem_capacity * MEM_SIZE
    pack_slot = _SLOT.pack_into
    pack_q = _q.pack_into
    pack_Q = _Q.pack_into
    pack_d = _d.pack_into
    pack_b = _b.pack_into
    now = time.time
    get_ident = threading.get_ident
    getframe = sys._getframe
    Tensor = torch.Tensor
    torch_dir = str(Path(torch.__file__).resolve().parent)
    internal_dirs = (torch_dir, _HERE, os.path.dirname(threading.__file__) + os.sep + "threading")
    mode_name = rec.mode
    cuda = torch.cuda
    sync_mode = mode_name == "sync"
    gpu_mode = mode_name == "gpu"
    stats_mode = mode_name == "stats"
    from collections import deque

    seq_counter = itertools.count()
    done_counter = itertools.count(1)
    names: dict = {}
    # id(code) -> True (torch / the recorder / threading: skipped by the call-site walk) or, for user code,
    # a dict f_lasti -> call-site bytes (f_lasti is O(1); f_lineno decodes the line table on every read)
    codes: dict = {}
    keep: list = []
    reprs: dict = {}
    simple = (int, float, bool, type(None), str)
    tensors: dict = {}
    # whole-argument-list cache: flat key (per tensor: dtype, shape, stride, device; per scalar: type, value)
    # -> the encoded summary. Building the key is the unavoidable cost (4 attribute reads per tensor); a hit
    # skips the per-arg lookups, the join and the encode.
    arg_cache: dict = {}
    ARG_CACHE_MAX = 1 << 14
    tensor_cls = frozenset((Tensor, torch.nn.Parameter))
    # scalars whose text is repr(value) and that are hashable with value equality (floats: nonzero only)
    scalar_cls = frozenset((int, bool, type(None), str, torch.dtype, torch.device, torch.layout,
                            torch.memory_format))
    threads: dict = {}
    depths: dict = {}  # tid -> nesting depth, only set inside the SDPA wrapper (a TLS getattr costs ~0.7 us)
    events: deque = deque()
    events_lock = threading.Lock()
    state = {"nonfinite_set": False}
    device_unset = True

    def name_of(func) -> bytes:
        b = str(func).encode()[:63]
        names[id(func)] = b
        keep.append(func)
        return b

    def code_kind(code):
        """True for internal code, else the per-code dict of call sites (created here)."""
        fn = code.co_filename
        v = fn.startswith(internal_dirs) or fn.startswith("<frozen runpy") or fn.startswith("<frozen importlib")
        v = True if v else {}
        codes[id(code)] = v
        keep.append(code)  # ids stay valid: the code object cannot be freed and its id reused
        return v

    def site_text(f, d: dict) -> bytes:
        c = f.f_code
        line = f.f_lineno
        fn = c.co_filename
        parts = fn.split(os.sep)
        short = os.sep.join(parts[-2:]) if len(parts) > 2 else fn
        s = f"{short}:{line} in {c.co_name}".encode()[-135:]
        d[f.f_lasti] = s
        return s

    def call_site() -> bytes:
        """Innermost frame outside torch and the recorder; cached per (code, instruction): no inspect.stack()."""
        f = getframe(2)
        while f is not None:
            d = codes.get(id(f.f_code))
            if d is None:
                d = code_kind(f.f_code)
            if d is not True:
                return d.get(f.f_lasti) or site_text(f, d)
            f = f.f_back
        return b""

    def thread_name(tid: int) -> bytes:
        t = threading._active.get(tid)
        name = t.name if t is not None else "native"  # autograd engine workers are not Python threads
        b = name.encode()[:31]
        threads[tid] = b
        return b

    def tensor_text(t, key) -> str:
        s = "T|%s|%s|%s|%s" % (str(t.dtype).replace("torch.", ""), ",".join(map(str, t.shape)),
                               ",".join(map(str, t.stride())), t.device)
        tensors[key] = s
        return s

    def other_text(a) -> str:
        try:
            key = (type(a), a)
            s = reprs.get(key)
        except TypeError:  # unhashable (a list of ints): not cached
            key, s = None, None
        if s is None:
            s = repr(a)[:32].replace(";", ",").replace("|", "/")
            if key is not None and len(reprs) < 4096 and not (key[0] is float and not a):  # -0.0 == 0.0
                reprs[key] = s
        return s

    def args_text(args) -> bytes:
        """Compact text per arg; per-signature strings cached (the hot cost is reading shape/stride)."""
        nonlocal device_unset
        if device_unset:
            set_device(args)
        parts = []
        for a in args:
            ta = a.__class__
            if ta is Tensor or (ta not in simple and isinstance(a, Tensor)):
                k = (a.dtype, a.shape, a.stride(), a.device)
                parts.append(tensors.get(k) or tensor_text(a, k))
            elif (ta is list or ta is tuple) and a and isinstance(a[0], Tensor):
                parts.append(f"L{len(a)}")
                for x in a[:4]:
                    if isinstance(x, Tensor):
                        k = (x.dtype, x.shape, x.stride(), x.device)
                        parts.append(tensors.get(k) or tensor_text(x, k))
            else:
                parts.append(other_text(a))
        return ";".join(parts).encode()[:191]

    def args_bytes(args) -> bytes:
        """args_text(args), cached per argument signature. The flat key is unambiguous: a tensor adds 4
        items starting with a dtype instance, a scalar adds 2 starting with a class."""
        key = ()
        for a in args:
            ta = a.__class__
            if ta in tensor_cls:
                key += (a.dtype, a.shape, a.stride(), a.device)
            elif ta in scalar_cls or (ta is float and a):
                key += (ta, a)
            elif (ta is list or ta is tuple) and (not a or a[0].__class__ is int):  # int[] (sizes, dims)
                key += (ta, tuple(a))
            else:  # floats, lists of tensors, other objects: per-arg path
                return args_text(args)
        try:
            b = arg_cache.get(key)
        except TypeError:  # an unhashable item (a symbolic int)
            return args_text(args)
        if b is None:
            b = args_miss(args, key)
        return b

    def args_miss(args, key) -> bytes:
        b = args_text(args)
        if len(arg_cache) >= ARG_CACHE_MAX:
            arg_cache.clear()  # scalars that change every step (lr, bias corrections) must not fill it for good
        arg_cache[key] = b
        return b

    def set_device(args) -> None:
        nonlocal device_unset
        for a in args:
            if isinstance(a, Tensor):
                dev = a.device.type.encode()[:31]
                mm[_OFF_DEVICE:_OFF_DEVICE + 32] = dev.ljust(32, b"\0")
                device_unset = False
                return

    def compute_stats(out, off: int, seq: int) -> None:
        """min/max/mean and NaN/+Inf/-Inf counts of floating outputs. Only NaN or +Inf flag an op: -Inf is
        how attention masks are written (scalar_tensor(-inf), where(mask, 0, -inf)), not a fault."""
        ts = [out] if isinstance(out, Tensor) else [x for x in out if isinstance(x, Tensor)] \
            if isinstance(out, (list, tuple)) else []
        mn, mx, tot, cnt, nan, inf, ninf = float("inf"), float("-inf"), 0.0, 0, 0, 0, 0
        seen = False
        for t in ts:
            if not (t.is_floating_point() and t.numel() and t.device.type != "meta"):
                continue
            x = t.detach()
            n_nan = int(torch.isnan(x).sum())
            n_inf = int((x == float("inf")).sum())
            n_ninf = int((x == float("-inf")).sum())
            xf = x.float()
            lo, hi = torch.aminmax(xf)
            mn, mx = min(mn, float(lo)), max(mx, float(hi))
            tot += float(xf.sum()); cnt += x.numel()
            nan += n_nan; inf += n_inf; ninf += n_ninf
            seen = True
        if not seen:
            return
        bad = bool(nan or inf)
        _STATS.pack_into(mm, off + _OFF_STATS, mn, mx, tot / cnt if cnt else 0.0, nan, inf, ninf)
        pack_b(mm, off + _OFF_FLAGS, F_STATS | (F_NONFINITE if bad else 0))
        if bad and not state["nonfinite_set"]:
            state["nonfinite_set"] = True
            pack_q(mm, _OFF_NONFINITE, seq)

    def begin(name: bytes, args, kind: int, site: bytes) -> tuple[int, int]:
        seq = next(seq_counter)
        tid = get_ident()
        tn = threads.get(tid) or thread_name(tid)
        depth = depths.get(tid, 0)
        off = slots + (seq % cap) * SLOT_SIZE
        pack_slot(mm, off, -1, now(), 0.0, tid, 0 if gpu_mode and cuda.is_initialized() else -1, kind, 0, depth,
                  name, tn, site, args_bytes(args))
        pack_q(mm, off, seq)                 # commit marker last
        pack_Q(mm, _OFF_STARTED, seq + 1)
        return seq, off

    def end(seq: int, off: int, raised: bool) -> None:
        pack_d(mm, off + _OFF_TEND, now())
        if raised:
            pack_b(mm, off + _OFF_FLAGS, F_RAISED)
        pack_Q(mm, _OFF_COMPLETED, next(done_counter))

    plain = not (sync_mode or gpu_mode or stats_mode)
    # bound methods and module constants as closure cells: a cell read is cheaper than a global or attribute
    next_seq, next_done = seq_counter.__next__, done_counter.__next__
    names_get, codes_get, threads_get, cache_get = names.get, codes.get, threads.get, arg_cache.get
    Parameter = torch.nn.Parameter
    # single 8-byte fields are stored through typed memoryviews (an item store costs a third of a pack_into)
    mv_b = memoryview(mm)
    mv_q, mv_d = mv_b.cast("q"), mv_b.cast("d")
    slot_q = slots // 8                       # slot i's seq field is mv_q[slot_q + 64 * i]; t_end 2 items on
    slot_items = SLOT_SIZE // 8
    i_started, i_completed = _OFF_STARTED // 8, _OFF_COMPLETED // 8
    i_tend = _OFF_TEND // 8
    off_flags = _OFF_FLAGS
    skip = _dispatch_depth(torch, TorchDispatchMode)
    # (frame the op was called from, innermost user frame above it, that code's site dict): ops called from
    # the same live activation (every backward op: autograd's engine is called from one frame) skip the
    # walk. Holding the frames is what makes `is` sound (a live object's id is not reused).
    walk = (None, None, None)


    class _Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            # hot path: flat (a helper call costs ~0.1 us), closure cells only, every cache hit one dict lookup
            nonlocal walk
            seq = next_seq()
            tid = get_ident()
            i = seq % cap
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
            site = (d.get(u.f_lasti) or site_text(u, d)) if u is not None else b""
            # argument summary, cached per signature (see args_bytes; same logic, inlined)
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
                    ab = args_text(args)
                    break
            else:
                try:
                    ab = cache_get(key) or args_miss(args, key)
                except TypeError:  # an unhashable item (a symbolic int)
                    ab = args_text(args)
            iq = slot_q + i * slot_items
            pack_slot(mm, slots + i * SLOT_SIZE, -1, now(), 0.0, tid,
                      0 if gpu_mode and cuda.is_initialized() else -1, 0, 0, depths.get(tid, 0) if depths else 0,
                      names_get(id(func)) or name_of(func), threads_get(tid) or thread_name(tid), site, ab)
            mv_q[iq] = seq                   # commit marker last: a reader skips a half-written slot
            mv_q[i_started] = seq + 1
            try:
                out = func(*args, **(kwargs or {}))
            except BaseException:
                mv_d[iq + i_tend] = now()
                mv_b[slots + i * SLOT_SIZE + off_flags] = F_RAISED
                mv_q[i_completed] = next_done()
                raise
            if plain:
                pass
            elif sync_mode:
                if cuda.is_initialized():
                    cuda.synchronize()
            elif gpu_mode:
                if cuda.is_initialized():
                    ev = cuda.Event()
                    ev.record()
                    events.append((seq, slots + i * SLOT_SIZE, ev))
            elif stats_mode:
                # empty() holds garbage: NaNs there are not a fault
                if not names_get(id(func)).startswith(_UNINITIALIZED):
                    compute_stats(out, slots + i * SLOT_SIZE, seq)
            mv_d[iq + i_tend] = now()
            mv_q[i_completed] = next_done()
            return out

        def forget_frames(self) -> None:
            """Drop the cached frames (they keep their locals alive) once uninstalled."""
            nonlocal walk
            walk = (None, None, None)

        def release(self) -> None:
            self.forget_frames()
            for v in (mv_q, mv_d, mv_b):
                v.release()

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
                tid = get_ident()
                d0 = depths.get(tid, 0)
                depths[tid] = d0 + 1
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
                    if d0:
                        depths[tid] = d0
                    else:
                        depths.pop(tid, None)
                    if inner is not None:
                        end(*inner, raised)
                    end(seq, off, raised)
                return out
            scaled_dot_product_attention.__wrapped__ = orig
            return scaled_dot_product_attention

        def drain_events(self, wait: bool) -> None:
            """Mark GPU-complete ops in seq order; `wait` only at uninstall (never on the hot path)."""
            with events_lock:
                while events:
                    seq, off, ev = events[0]
                    if wait:
                        try:
                            ev.synchronize()
                        except RuntimeError:
                            return
                    elif not ev.query():
                        return
                    events.popleft()
                    pack_b(mm, off + _OFF_GPUDONE, 1)
                    pack_q(mm, _OFF_GPU, seq)

    return _Mode()

