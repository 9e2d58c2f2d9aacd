"""What the recorder writes about an op besides its times: interned texts (op names, call sites, thread names,
argument summaries) and their caches. A factory of closures, not a class: the dispatch mode's hot path reads
them as closure cells, the cheapest lookup Python has; it is built once per recorder, with torch imported.

The string table is a ring too: when it wraps, the texts of the newest records are copied forward
(`on_wrap`) and every cached id is dropped (`forget_strings`, then the recorder's `on_forget`)."""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from gpulab.trace import ring
from gpulab.trace.ring import _IDS, _OFF_DEVICE, _OFF_IDS, _OFF_STARTED, _Q, _UNINITIALIZED, _q

_HERE = str(Path(__file__).resolve().parent)
_PROGRAM = str(Path(__file__).resolve().parents[1] / "program.py")   # gpulab.program runs the target: not a call site
# ops that are neither views (OpOverload.is_view covers those) nor kernels: metadata and allocation only
_NO_GPU_WORK = frozenset((b"aten._unsafe_view.default", b"aten.empty.memory_format", b"aten.empty_strided.default",
                          b"aten.empty_like.default", b"aten.new_empty.default", b"aten.new_empty_strided.default"))
_WRAP_TAIL = 4096  # newest records whose texts survive a wrap of the string table
# code torch or Python made, not the user's: runpy and importlib, FX graph modules (`<eval_with_key>.N`),
# and Inductor's generated wrappers (under its cache folder, /tmp/torchinductor_<user> by default)
_GENERATED = ("<frozen runpy", "<frozen importlib", "<eval_with_key>")
_INDUCTOR = os.sep + "torchinductor_"
NO_GPU_WORK = _NO_GPU_WORK


def enqueues_no_gpu_work(func: Any, text: bytes) -> bool:
    """A view (its schema aliases an input without writing it) or an allocation: no kernel, so a GPU marker
    after it would only repeat the previous op's (a stream completes in order), and it can never be the op
    whose GPU work did not complete."""
    return bool(getattr(func, "is_view", False)) or text in _NO_GPU_WORK


def site_label(code: Any, line: int | None) -> str:
    """`file:line in function`, the file by its last two path parts: how every recorded call site reads."""
    parts = code.co_filename.split(os.sep)
    short = os.sep.join(parts[-2:]) if len(parts) > 2 else code.co_filename
    return f"{short}:{line} in {code.co_name}"


def op_texts(mm: Any, lay: Any, strings: Any, torch: Any, on_forget: Callable[[], None]) -> SimpleNamespace:
    """The text side of one recorder over mapping `mm` of layout `lay` (see the module docstring)."""
    cap = lay.capacity
    getframe = sys._getframe
    Tensor = torch.Tensor
    torch_dir = str(Path(torch.__file__).resolve().parent)
    internal_dirs = (torch_dir, _HERE, os.path.dirname(threading.__file__) + os.sep + "threading", _PROGRAM)
    inductor_dir = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or ""

    # string ids, interned once. names: id(op) -> id; codes: id(code) -> True (torch / the recorder /
    # threading: skipped by the call-site walk) or, for user code, a dict f_lasti -> site id (f_lasti is
    # O(1); f_lineno decodes the line table on every read); threads: tid -> id; texts: text -> id.
    names: dict = {}
    codes: dict = {}
    threads: dict = {}
    texts: dict = {}
    keep: list = []
    reprs: dict = {}
    tensors: dict = {}
    simple = (int, float, bool, type(None), str)
    # whole-argument-list cache: flat key (per tensor: dtype, shape, stride, device; per scalar: type, value)
    # -> (string id of the summary, device: CUDA index, -1 no CUDA tensor, -2 no tensor). Building the key
    # is the unavoidable cost (4 attribute reads per tensor); a hit skips everything else.
    arg_cache: dict = {}
    ARG_CACHE_MAX = 1 << 14
    # scalars whose text is repr(value) and that are hashable with value equality (floats: nonzero only)
    scalar_cls = frozenset((int, bool, type(None), str, torch.dtype, torch.device, torch.layout,
                            torch.memory_format))
    uninitialized: set = set()  # ids of ops whose output holds garbage (empty()): NaNs there are not a fault
    no_gpu_work: set = set()    # ops that enqueue no GPU work (views, allocations): they need no GPU marker
    state = {"nonfinite_set": False, "device_unset": True}
    lock = threading.RLock()
    gen = [0]  # bumped when the string table wraps: ids looked up before are stale

    def forget_strings() -> None:
        """The string table wrapped: cached ids may be overwritten from now on, so intern again."""
        for d in (names, codes, threads, texts, arg_cache):
            d.clear()
        gen[0] += 1
        on_forget()

    def intern(text: bytes) -> int:
        with lock:
            sid = texts.get(text)
            if sid is None:
                sid = texts[text] = strings.add(text)
            return sid

    def on_wrap() -> None:
        """The string table starts a new lap and will overwrite its oldest texts: copy forward the texts of
        the newest records (up to half the table) and point their slots at the copies, so that a wrap never
        costs the tail of the log its names; older records may show evicted texts."""
        started = _Q.unpack_from(mm, _OFF_STARTED)[0]
        seqs = range(max(0, started - min(cap, _WRAP_TAIL)), started)
        keep_texts: dict = {}
        budget = lay.string_capacity // 2
        for seq in reversed(seqs):  # newest first: they matter most when the budget runs out
            off = lay.slot(seq)
            if _q.unpack_from(mm, off)[0] != seq:
                continue
            for p in _IDS.unpack_from(mm, off + _OFF_IDS):
                if p and p not in keep_texts and budget > 0:
                    text = ring.string_at(mm, lay, p)
                    if text is not None:
                        keep_texts[p] = text
                        budget -= len(text) + 16
        notes = _Q.unpack_from(mm, ring._OFF_GPU_NOTES)[0]
        notes_text = ring.string_at(mm, lay, notes) if notes else None
        forget_strings()
        moved = {p: strings.add(t) for p, t in keep_texts.items()}
        texts.update({t: moved[p] for p, t in keep_texts.items()})
        for seq in seqs:
            off = lay.slot(seq)
            if _q.unpack_from(mm, off)[0] == seq:
                _IDS.pack_into(mm, off + _OFF_IDS, *(moved.get(p, p) for p in _IDS.unpack_from(mm, off + _OFF_IDS)))
        if notes_text is not None:
            _Q.pack_into(mm, ring._OFF_GPU_NOTES, strings.add(notes_text))

    strings.on_wrap = on_wrap

    def name_of(func) -> int:
        text = str(func).encode()
        sid = intern(text)
        names[id(func)] = sid
        if text.startswith(_UNINITIALIZED):
            uninitialized.add(id(func))
        if enqueues_no_gpu_work(func, text):
            no_gpu_work.add(func)
        keep.append(func)
        return sid

    def code_kind(code):
        """True for internal code, else the per-code dict of call sites (created here). Code that torch
        generates (Inductor's wrapper modules, FX graph code) is internal: the call site is the user's frame
        that called the compiled code."""
        fn = code.co_filename
        v = (fn.startswith(internal_dirs) or fn.startswith(_GENERATED) or _INDUCTOR in fn
             or (inductor_dir and fn.startswith(inductor_dir)))
        v = True if v else {}
        codes[id(code)] = v
        keep.append(code)  # ids stay valid: the code object cannot be freed and its id reused
        return v

    def site_at(code, line: int | None) -> int:
        """The string id of `file:line in function` (the observer reads the line itself, without the GIL)."""
        return intern(site_label(code, line).encode()[-255:])

    def site_text(f, d: dict, lasti: int | None = None) -> int:
        """The site's string id, cached in the code's dict under f_lasti (or the native path's key)."""
        sid = site_at(f.f_code, f.f_lineno)
        d[f.f_lasti if lasti is None else lasti] = sid
        return sid

    def call_site() -> int:
        """Innermost frame outside torch and the recorder; cached per (code, instruction): no inspect.stack()."""
        f = getframe(2)
        while f is not None:
            d = codes.get(id(f.f_code))
            if d is None:
                d = code_kind(f.f_code)
            if d is not True:
                return d.get(f.f_lasti) or site_text(f, d)
            f = f.f_back
        return 0

    def thread_name(tid: int) -> int:
        t = threading._active.get(tid)
        name = t.name if t is not None else "native"  # autograd engine workers are not Python threads
        sid = intern(f"{name[:63]} ({tid})".encode())
        threads[tid] = sid
        return sid

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

    def device_of(t, dev: int) -> int:
        if dev >= 0:
            return dev
        d = t.device
        return (d.index or 0) if d.type == "cuda" else -1

    def args_slow(args) -> tuple[int, int]:
        """(string id of the argument summary, device; see arg_cache): per-arg text, cached per tensor."""
        if state["device_unset"]:
            set_device(args)
        parts, dev = [], -2
        for a in args:
            ta = a.__class__
            if ta is Tensor or (ta not in simple and isinstance(a, Tensor)):
                k = (a.dtype, a.shape, a.stride(), a.device)
                parts.append(tensors.get(k) or tensor_text(a, k))
                dev = device_of(a, dev)
            elif (ta is list or ta is tuple) and a and isinstance(a[0], Tensor):
                parts.append(f"L{len(a)}")
                for j, x in enumerate(a):
                    if isinstance(x, Tensor):
                        if j < 4:
                            k = (x.dtype, x.shape, x.stride(), x.device)
                            parts.append(tensors.get(k) or tensor_text(x, k))
                        dev = device_of(x, dev)
                        if j >= 4 and dev >= 0:
                            break
            else:
                parts.append(other_text(a))
        return intern(";".join(parts).encode()[:1023]), dev

    def args_miss(args, key) -> tuple[int, int]:
        v = args_slow(args)
        if len(arg_cache) >= ARG_CACHE_MAX:
            arg_cache.clear()  # scalars that change every step (lr, bias corrections) must not fill it for good
        arg_cache[key] = v
        return v

    def set_device(args) -> None:
        # the device the program computes on: cpu until an accelerator's tensor is seen (a CUDA program's first
        # ops are often on the CPU: a seed, indices, a batch before .to())
        for a in args:
            if isinstance(a, Tensor) and a.device.type != "meta":
                dev = a.device.type.encode()[:31]
                mm[_OFF_DEVICE:_OFF_DEVICE + 32] = dev.ljust(32, b"\0")
                if a.device.type != "cpu":
                    state["device_unset"] = False
                    return

    return SimpleNamespace(names=names, codes=codes, threads=threads, arg_cache=arg_cache, scalar_cls=scalar_cls,
                           uninitialized=uninitialized, no_gpu_work=no_gpu_work, state=state, gen=gen, intern=intern,
                           name_of=name_of,
                           code_kind=code_kind, site_text=site_text, site_at=site_at, call_site=call_site, thread_name=thread_name,
                           args_slow=args_slow, args_miss=args_miss)
