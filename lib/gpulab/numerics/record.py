"""The recorder of `gpulab compare`, inside the compared child: a fingerprint of every floating output of every
op, with no change to the program (`install` is named by the parent in $GPULAB_PRELOAD and called by the
followed child once torch is imported: gpulab.trace.follow).

Why fingerprints and not tensors: two runs are compared after the fact, at the cost of a few reductions per
output. Why no host sync per op: the figures are written by kernels into a buffer on the op's device and
copied to the host once per block (a sync per block, not per op; at exit too), so GPU work stays queued as
it does without gpulab. Why a mode that ignores compile internals: torch.compile still compiles; its compiled
region is seen as the extern calls it makes, and its outputs are fingerprinted when an eager op first reads
them (an `<input>` record: what the recorder could not see being made).

Each record also says which earlier records made the op's inputs (the tensor's producer, valid while its
version counter is unchanged): the comparison names the op whose inputs agree and whose output does not.
Records go to $GPULAB_NUMERICS_DIR/<pid>.jsonl, a block at a time (small blocks on the CPU, so a run that
dies still leaves what it recorded up to its last block).

Cost (benchmarks/bench_fingerprint.py): per record the figures are reductions written straight into the row
through views made once per buffer, read in place whatever the output's strides (no contiguous copy): 13 aten
calls on CUDA, 14 on the CPU (its inf-norm is slow: abs + amax instead), where there were 24 with a full copy of
every non-contiguous output. Each record also carries its reduction length `k` (gpulab.numerics.reduction).
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

from gpulab.numerics import reduction, replay
from gpulab.numerics.names import ENV_DIR, ENV_KEEP, INPUT

SAMPLE = 32                            # elements of a fixed strided sample per output
NF = 3 + SAMPLE                        # float64 figures: sum, abs-sum, max-abs, sample
NI = 3                                 # int64 figures: bitwise checksum, NaN count, Inf count
CAP = 1024                             # rows of each device's buffer: records per block with a GPU
CPU_BLOCK = 64                         # records per block while only the CPU has run ops (cheap to write out)

_INT_VIEW = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
             torch.bfloat16: torch.int16}
# ops whose output holds the values of an input, as they are or only re-typed: no record of their own, their
# output's producer is that input's (a view, a copy, a cast: what legitimately differs between backends)
PASS_NAMES = {"_to_copy", "to", "clone", "copy", "copy_", "detach", "alias", "lift_fresh", "lift_fresh_copy",
              "contiguous", "_unsafe_view", "view", "reshape", "_reshape_alias", "t", "transpose", "permute",
              "expand", "squeeze", "unsqueeze", "select", "slice", "as_strided", "unfold", "_conj", "clone_",
              "view_as", "flatten", "narrow", "split", "split_with_sizes", "unbind", "chunk", "diagonal",
              "_to_dense", "detach_", "set_"}
SKIP_NAMES = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_", "zeros_like",
              "_local_scalar_dense", "record_stream", "_has_compatible_shallow_copy_type"}
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


class Fingerprints:
    """The device buffers of one run and their records' metadata, written out a block at a time."""

    def __init__(self, path: str, keep: str | None = None):
        self.path, self.keep = path, keep
        self.fh = open(path, "w", buffering=1 << 16)
        self.meta: list[list] = []            # per pending record: its fields, its device, its row
        self.bufs: dict[str, tuple[torch.Tensor, torch.Tensor, int]] = {}
        self.n = 0                             # records written or pending
        self.block = CPU_BLOCK
        self.samples: dict[tuple[int, str], torch.Tensor] = {}
        self.views: dict[str, list[tuple]] = {}
        self.lock = threading.RLock()
        self.kept = False
        self.failures = 0

    def _buffer(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
        key = str(device)
        got = self.bufs.get(key)
        if got is None:
            if device.type != "cpu":
                self.block = CAP   # a copy to the host is a sync: once per CAP records
            got = (torch.zeros(CAP, NF, dtype=torch.float64, device=device),
                   torch.zeros(CAP, NI, dtype=torch.int64, device=device), 0)
            self.bufs[key] = got
        return got

    def _index(self, n: int, device: torch.device) -> torch.Tensor:
        key = (n, str(device))
        idx = self.samples.get(key)
        if idx is None:
            k = min(SAMPLE, n)
            idx = torch.div(torch.arange(k, dtype=torch.int64) * n, k, rounding_mode="floor").to(device)
            if len(self.samples) > 4096:
                self.samples.clear()
            self.samples[key] = idx
        return idx

    def _views(self, device: torch.device, fbuf: torch.Tensor, ibuf: torch.Tensor) -> list[tuple]:
        """Per row of a device's buffers, the views each figure is written through (made once: a view is a
        dispatcher call, and a record would otherwise make eight)."""
        key = str(device)
        got = self.views.get(key)
        if got is None:
            got = self.views[key] = [(fbuf[r], ibuf[r], fbuf[r, 0], fbuf[r, 1], fbuf[r, 2], fbuf[r, 3:3 + SAMPLE],
                                      ibuf[r, 0], ibuf[r, 1], ibuf[r, 2]) for r in range(fbuf.shape[0])]
        return got

    def add(self, t: torch.Tensor, fields: list) -> int:
        """Queue the figures of t (kernels on its device, no sync) -> the record's index. Read in place, whatever
        its strides (no contiguous copy); each figure written by its reduction straight into the row."""
        fbuf, ibuf, row = self._buffer(t.device)
        f, i, f0, f1, f2, fs, i0, i1, i2 = self._views(t.device, fbuf, ibuf)[row]
        x = t if t.dtype in _INT_VIEW else t.float()   # float8 and other narrow types: figures through float32
        n = x.numel()
        if n:
            dims = tuple(range(x.dim()))
            torch.sum(x, dims, dtype=torch.float64, out=f0)
            torch.linalg.vector_norm(x, 1, dtype=torch.float64, out=f1)                 # abs-sum, one kernel
            if x.device.type == "cpu":   # the CPU's inf-norm kernel is ten times slower than abs + amax
                f2.copy_(torch.amax(torch.abs(x)))
            else:
                torch.linalg.vector_norm(x, float("inf"), dtype=torch.float64, out=f2)  # max-abs, one kernel
            idx = self._index(n, x.device)
            (fs if idx.numel() == SAMPLE else fs[:idx.numel()]).copy_(torch.take(x, idx))
            if t.dtype in _INT_VIEW:
                torch.sum(x.view(_INT_VIEW[x.dtype]), dims, dtype=torch.int64, out=i0)
            else:
                i0.zero_()
            torch.sum(torch.isnan(x), dims, out=i1)
            torch.sum(torch.isinf(x), dims, out=i2)
        else:   # the row may hold an earlier block's figures
            f.zero_()
            i.zero_()
        index = self.n
        self.n += 1
        dev = str(t.device)
        self.meta.append([index, *fields, str(t.dtype)[6:], list(t.shape), n, dev, row])
        self.bufs[dev] = (fbuf, ibuf, row + 1)
        if row + 1 >= fbuf.shape[0] or len(self.meta) >= self.block:
            self.flush()
        return index

    def flush(self) -> None:
        """Copy the queued figures to the host (one sync per device) and write their records."""
        with self.lock:
            if not self.meta:
                return
            host = {k: (f.cpu().tolist(), i.cpu().tolist()) for k, (f, i, row) in self.bufs.items() if row}
            lines = []
            for index, op, site, npass, bwd, out, ins, red, dtype, shape, n, dev, row in self.meta:
                f, i = host[dev][0][row], host[dev][1][row]
                k = min(SAMPLE, n)
                lines.append(json.dumps({"i": index, "op": op, "site": site, "pass": npass, "bwd": bwd, "out": out,
                                         "in": ins, "k": red, "dtype": dtype, "shape": shape, "n": n, "device": dev,
                                         "sum": f[0], "asum": f[1], "amax": f[2], "sample": f[3:3 + k],
                                         "ck": i[0], "nan": i[1], "inf": i[2]}))
            self.meta.clear()
            self.bufs = {k: (f, i, 0) for k, (f, i, _) in self.bufs.items()}
            try:
                self.fh.write("\n".join(lines) + "\n")
                self.fh.flush()
            except (OSError, ValueError):
                pass   # the folder is gone: the run is being stopped

    def close(self) -> None:
        self.flush()
        try:
            self.fh.close()
        except OSError:
            pass


def _floats(values) -> list[tuple[int, torch.Tensor]]:
    return [(k, v) for k, v in enumerate(values) if isinstance(v, torch.Tensor) and v.is_floating_point()]


def make_mode(fp: Fingerprints):
    """The dispatch mode that fingerprints every floating output (and every input no recorded op made)."""
    producer: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
    passes: dict[tuple, int] = {}
    codes: dict = {}
    names: dict = {}                     # op -> (its base name, its full name)
    current_node = torch._C._current_autograd_node

    def site(depth: int) -> str:
        f = sys._getframe(depth)
        while f is not None and not _user_code(f.f_code, codes):
            f = f.f_back
        if f is None:
            return "?"
        return f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}"

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
        """The record that made t's values, if t has not changed since. An in-place op's output is bumped
        once more after the mode returns (ADInplaceOrView sits above it): that bump is its own."""
        got = producer.get(t)
        if got is None:
            return None
        v = version(t)
        return got[0] if v == got[1] or v < 0 or (got[2] and v == got[1] + 1) else None

    def made(o: torch.Tensor, i: int, mutable: bool) -> None:
        producer[o] = (i, version(o), mutable)

    def source(t: torch.Tensor, where: str, bwd: bool) -> int:
        """The record that made t's values, an `<input>` record when none did (or t changed since)."""
        got = known(t)
        if got is not None:
            return got
        i = fp.add(t, [INPUT, where, count((INPUT, where, 0, bwd)), bwd, 0, [], 1])
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
            named = names.get(func)
            if named is None:
                text = str(func)
                schema = getattr(func, "_schema", None)
                named = names[func] = (getattr(func, "_opname", None) or (text.split(".") + [text])[1], text,
                                       bool(schema is not None and schema.is_mutable))
            name = named[0]
            if name in SKIP_NAMES:
                return func(*args, **kwargs)
            before = (replay.snapshot(args, kwargs) if fp.keep and not fp.kept and fp.keep.startswith(f"{func}|")
                      else None)
            pre = None
            if named[2] and name not in PASS_NAMES:   # an in-place op: its inputs as they are before it runs
                with fp.lock:
                    try:
                        pre = _inputs(tree_flatten((args, kwargs))[0])
                    except Exception:  # noqa: BLE001 - recorded after it runs instead
                        pre = None
            out = func(*args, **kwargs)
            with fp.lock:
                try:
                    _record(func, name, args, kwargs, out, before, pre)
                except Exception as exc:  # noqa: BLE001 - the program must run even when a record fails
                    fp.failures += 1
                    if fp.failures <= 5:
                        print(f"[gpulab compare] not recorded: {func}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return out

    def _inputs(flat) -> tuple[str, bool, list[int]]:
        where = site(3)
        bwd = current_node() is not None
        return where, bwd, [source(t, where, bwd) for _, t in _floats(flat) if t.numel()]

    def _record(func, name, args, kwargs, out, before, pre) -> None:
        outs = _floats(tree_flatten(out)[0])
        if not outs:
            return
        if pre is not None:
            where, bwd, ins = pre
        else:
            tin = _floats(tree_flatten((args, kwargs))[0])
            if name in PASS_NAMES and tin:
                src = tin[1][1] if name in ("copy_", "copy") and len(tin) > 1 else tin[0][1]
                got = known(src)
                if got is not None:
                    for _, o in outs:
                        made(o, got, names[func][2])
                    return
            where = site(2)
            bwd = current_node() is not None
            ins = [source(t, where, bwd) for _, t in tin if t.numel()]
        op = names[func][1]
        red = 1
        if name in _REDUCING:   # its reduction length: what the comparison allows its rounding (numerics.reduction)
            red = reduction.length(name, [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)],
                                   [a for a in args if isinstance(a, (int, list, tuple))], tuple(outs[0][1].shape))
        for k, o in outs:
            key = (op, where, k, bwd)
            npass = count(key)
            i = fp.add(o, [op, where, npass, bwd, k, ins, red])
            made(o, i, names[func][2])
            if fp.keep and not fp.kept and fp.keep == f"{op}|{where}|{npass}|{k}":
                fp.kept = True
                fp.flush()
                replay.keep(os.path.dirname(fp.path), func, args, kwargs, o, k, before)

    return NumericsMode


_state: dict[str, Any] = {"fp": None, "mode": None}


def install() -> None:
    """In the compared child: record from here on, into $GPULAB_NUMERICS_DIR/<pid>.jsonl."""
    folder = os.environ.get(ENV_DIR)
    if not folder or _state["fp"] is not None:
        return
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
        fp.meta.clear()
        fp.fh = open(os.devnull, "w")
