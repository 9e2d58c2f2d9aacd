"""The recorder of `gpulab compare`, inside the compared child: a fingerprint of every floating output of every
op, with no change to the program (`install` is named by the parent in $GPULAB_PRELOAD and called by the
followed child once torch is imported: gpulab.trace.follow).

Why fingerprints and not tensors: two runs are compared after the fact, at the cost of one read of each output
(gpulab.numerics.fingerprints: queued on the op's device, written a block at a time, no host sync per op). Why a
mode that ignores compile internals: torch.compile still compiles; its compiled region is seen as the extern
calls it makes, and its outputs are fingerprinted when an eager op first reads them (an `<input>` record: what
the recorder could not see being made).

Each record also says which earlier records made the op's inputs (the tensor's producer, valid while its
version counter is unchanged): the comparison names the op whose inputs agree and whose output does not, and
carries its reduction length `k` (gpulab.numerics.reduction). Records go to $GPULAB_NUMERICS_DIR/<pid>.jsonl.
Per op the mode's own Python is kept short (a flat walk of the arguments, names cached per op): on a GPU it runs
while the queued kernels do.
"""
from __future__ import annotations

import atexit
import os
import sys
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpulab.numerics import reduction, replay
from gpulab.numerics.fingerprints import Fingerprints
from gpulab.numerics.names import ENV_DIR, ENV_KEEP, INPUT, collective
from gpulab.trace import lazydynamo

# ops whose output holds the values of an input, as they are or only re-typed: no record of their own, their
# output's producer is that input's (a view, a copy, a cast: what legitimately differs between backends)
PASS_NAMES = {"_to_copy", "to", "clone", "copy", "copy_", "detach", "alias", "lift_fresh", "lift_fresh_copy",
              "contiguous", "_unsafe_view", "view", "reshape", "_reshape_alias", "t", "transpose", "permute",
              "expand", "squeeze", "unsqueeze", "select", "slice", "as_strided", "unfold", "_conj", "clone_",
              "view_as", "flatten", "narrow", "split", "split_with_sizes", "unbind", "chunk", "diagonal",
              "_to_dense", "detach_", "set_"}
SKIP_NAMES = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_", "zeros_like",
              "_local_scalar_dense", "record_stream", "_has_compatible_shallow_copy_type"}
_EMPTY = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
UNINIT = -1   # the producer of memory no op has written yet (empty's): its views are not recorded, its readers'
#               inputs name no record (DDP's gradient buckets hold another run's garbage until backward fills them)
_REDUCING = reduction.DOT | reduction.SUM | reduction.NORMALIZED
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_GPULAB_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _user_code(code, cache: dict) -> bool:
    hit = cache.get(code)
    if hit is None:
        f = code.co_filename
        hit = not (f.startswith(_TORCH_DIR) or f.startswith(_GPULAB_DIR) or f.startswith("<")
                   or "torchinductor" in f or "/torch/" in f or "/functorch/" in f)
        cache[code] = hit
    return hit


def _flat(obj, into: list) -> list:
    """The tensors in nested lists, tuples and dicts, in order, into `into` (pytree's general walk cost more
    than the rest of a record's Python)."""
    for v in (obj.values() if isinstance(obj, dict) else obj):
        if isinstance(v, torch.Tensor):
            into.append(v)
        elif isinstance(v, (list, tuple, dict)):
            _flat(v, into)
    return into


def _outs(out) -> list[tuple[int, torch.Tensor]]:
    """An op's floating outputs with their index among its tensor outputs (most ops return one tensor)."""
    if isinstance(out, torch.Tensor):
        return [(0, out)] if out.is_floating_point() else []
    if not isinstance(out, (list, tuple, dict)):
        return []
    return [(k, v) for k, v in enumerate(_flat(out, [])) if v.is_floating_point()]


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):   # a tensor with no storage (a subclass, a meta tensor)
        return -1


def _ins(args: tuple, kwargs: dict, written: frozenset = frozenset()) -> list[torch.Tensor]:
    """An op's floating inputs, in order (its args, then its kwargs but its `out=` ones: what an out= tensor held
    before is no input; DDP's bucket holds the last step's all-reduced gradients when mul.out writes the new)."""
    got = _flat(args, [])
    if kwargs:
        _flat({k: v for k, v in kwargs.items() if k not in written} if written else kwargs, got)
    return [v for v in got if v.is_floating_point()]


def make_mode(fp: Fingerprints):
    """The dispatch mode that fingerprints every floating output (and every input no recorded op made)."""
    # id(tensor) -> (a weak reference to it, its record, its version then, made in place): a tensor's producer,
    # valid while the reference still points at it (torch's WeakTensorKeyDictionary cost several times more)
    producer: dict[int, tuple] = {}
    grown = 0                            # producers set since the last sweep of the dead ones
    passes: dict[tuple, int] = {}
    landed: dict[int, tuple] = {}        # storage -> (a collective's output, its fields): where its result lands
    codes: dict = {}
    # id(op) -> (its base name, its full name, mutable, its out= arguments, collective): ops live as long as torch
    names: dict = {}
    current_node = torch._C._current_autograd_node

    lines: dict[tuple, str] = {}         # (code, line) -> its call site's text

    def site(depth: int) -> str:
        f = sys._getframe(depth)
        get = codes.get
        while f is not None:
            code = f.f_code
            hit = get(code)
            if hit is None:
                hit = _user_code(code, codes)
            if hit:
                key = (code, f.f_lineno)
                text = lines.get(key)
                if text is None:
                    text = lines[key] = f"{code.co_filename}:{key[1]} in {code.co_name}"
                return text
            f = f.f_back
        return "?"

    def count(key: tuple) -> int:
        n = passes.get(key, 0) + 1
        passes[key] = n
        return n

    def version(t: torch.Tensor) -> int:
        try:
            return t._version
        except RuntimeError:   # an inference-mode tensor keeps no version counter
            return -1

    def known(t: torch.Tensor) -> int | None:
        """The record that made t's values, if t has not changed since (UNINIT: no op wrote them yet). An in-place
        op's output is bumped once more after the mode returns (ADInplaceOrView sits above it): that bump is its
        own."""
        got = producer.get(id(t))
        if got is None or got[0]() is not t:
            return None
        v = version(t)
        return got[1] if v == got[2] or v < 0 or (got[3] and v == got[2] + 1) else None

    def made(o: torch.Tensor, i: int, mutable: bool) -> None:
        nonlocal grown
        producer[id(o)] = (weakref.ref(o), i, version(o), mutable)
        grown += 1
        if grown >= 1 << 16:   # forget the tensors gone since
            grown = 0
            for key in [k for k, v in producer.items() if v[0]() is None]:
                del producer[key]

    def source(t: torch.Tensor, where: str, bwd: bool) -> int:
        """The record that made t's values, an `<input>` record when none did (or t changed since)."""
        got = known(t)
        if got is not None:
            return got
        # the first read of a collective's buffer (it or a view: DDP's bucket), now that its result has arrived, is
        # its record; once: a later write into that buffer would read as its result
        into = landed.pop(_storage(t), None) if landed else None
        if into is not None and into[0]() is not None:
            fields = into[1]
        else:
            fields = (INPUT, where, count((INPUT, where, 0, bwd)), bwd, 0)
        i = fp.add(t, [*fields, [], 1])
        made(t, i, False)
        return i

    class NumericsMode(TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls) -> bool:
            """Off while dynamo traces and Inductor compiles, on while compiled code runs: torch.compile still
            compiles under the recorder (as gpulab.trace.dispatch's mode)."""
            return True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if fp.off:
                return func(*args, **kwargs)
            named = names.get(id(func))   # by id: an op's own __hash__ is a Python call
            if named is None:
                text = str(func)
                schema = getattr(func, "_schema", None)
                # c10d's collectives write their tensors in place without saying so in their schemas
                group = collective(text)
                named = names[id(func)] = (getattr(func, "_opname", None) or (text.split(".") + [text])[1], text,
                                       bool(schema is not None and schema.is_mutable) or group,
                                       frozenset(a.name for a in getattr(schema, "arguments", ()) if a.is_out), group)
            name = named[0]
            if name in SKIP_NAMES:
                out = func(*args, **kwargs)
                if name in _EMPTY:
                    with fp.lock:
                        for _, o in _outs(out):
                            made(o, UNINIT, False)
                return out
            before = replay.snapshot(args, kwargs) if fp.keep and named[1] in fp.keep_ops else None
            pre = None
            if named[2]:   # an op that writes in place: the outputs waiting for their figures are read first
                with fp.lock:
                    fp.settle()
                    if name not in PASS_NAMES:   # and its inputs as they are before it runs
                        n = fp.n
                        try:
                            pre = _inputs(_ins(args, kwargs, named[3]))
                        except Exception:  # noqa: BLE001 - recorded after it runs instead
                            pre = None
                        if fp.n != n:   # inputs no recorded op made: read now, before the op writes over them
                            fp.settle()
            out = func(*args, **kwargs)
            with fp.lock:
                try:
                    _record(func, named, args, kwargs, out, before, pre)
                except Exception as exc:  # noqa: BLE001 - the program must run even when a record fails
                    fp.failures += 1
                    if fp.failures <= 5:
                        print(f"[gpulab compare] not recorded: {func}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return out

    def _inputs(tin: list) -> tuple[str, bool, list[int]]:
        where = site(3)
        bwd = current_node() is not None
        return where, bwd, [source(t, where, bwd) for t in tin if t.numel()]

    def _record(func, named, args, kwargs, out, before, pre) -> None:
        outs = _outs(out)
        name = named[0]
        if not outs:
            return
        if name == "set_":   # another storage (loaded, or a DataLoader worker's batch received in whatever order the
            for _, o in outs:  # workers finish): its values are recorded where the program reads them, in its order
                producer.pop(id(o), None)
            return
        if pre is not None:
            where, bwd, ins = pre
        else:
            tin = _ins(args, kwargs, named[3])
            if name in PASS_NAMES and tin:
                src = tin[1] if name in ("copy_", "copy") and len(tin) > 1 else tin[0]
                got = known(src)
                if got is not None:
                    for _, o in outs:
                        made(o, got, named[2])
                    return
            where = site(2)
            bwd = current_node() is not None
            ins = [source(t, where, bwd) for t in tin if t.numel()]
        op = named[1]
        red = 1
        if name in _REDUCING:   # its reduction length: what the comparison allows its rounding (numerics.reduction)
            red = reduction.length(name, [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)],
                                   [a for a in args if isinstance(a, (int, list, tuple))], tuple(outs[0][1].shape))
        group = named[4]
        for k, o in outs:
            key = (op, where, k, bwd)
            npass = count(key)
            if group:   # its work may still be running when it returns (gloo, NCCL): read when first read
                producer.pop(id(o), None)
                if _storage(o) != -1:
                    landed[_storage(o)] = (weakref.ref(o), (op, where, npass, bwd, k))
                continue
            i = fp.add(o, [op, where, npass, bwd, k, ins, red])
            made(o, i, named[2])
            kept = fp.mark_kept(f"{op}|{where}|{npass}|{k}") if fp.keep else None
            if kept is not None:
                if kept[1]:
                    fp.flush()
                replay.keep(os.path.dirname(fp.path), func, args, kwargs, o, k, before, *kept)

    return NumericsMode


_state: dict[str, Any] = {"fp": None, "mode": None}


def install() -> None:
    """In the compared child: record from here on, into $GPULAB_NUMERICS_DIR/<pid>.jsonl."""
    folder = os.environ.get(ENV_DIR)
    if not folder or _state["fp"] is not None:
        return
    # the mode's class made unwrapped until the program imports torch._dynamo, as the op recorder's: its first op
    # would otherwise import dynamo for the wrapper (~2 CPU-s of each compared run); the site walk skips the
    # wrapper's frames, being by code object
    lazydynamo.defer()
    fp = Fingerprints(os.path.join(folder, f"{os.getpid()}.jsonl"), os.environ.get(ENV_KEEP) or None)
    mode = make_mode(fp)()
    mode.__enter__()
    _state.update(fp=fp, mode=mode)
    atexit.register(fp.close)
    os.register_at_fork(after_in_child=_forked)


def _forked() -> None:
    """A fork() child (a DataLoader worker) records nothing: its parent's records are the run's."""
    fp = _state.get("fp")
    if fp is not None:
        fp.forked()
