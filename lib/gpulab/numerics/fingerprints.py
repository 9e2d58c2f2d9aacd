"""The fingerprints of one recorded run: figures queued on each output's device, written to a JSON-lines file a
block at a time (gpulab.numerics.record's mode calls `add` per floating output).

Why blocks: a host sync per op would stall the GPU's queue. On a GPU the figures come from one Triton pass per
output, launched for a batch of outputs at a time (gpulab.numerics.fused), into a fresh device block; at a
block's end it is folded, copied to pinned host memory without a sync, and a writer thread turns it into lines
(gpulab.numerics.lines) once the copy is done, while the program goes on: no sync at all. Without Triton, on
the CPU and for dtypes the kernel does not read, the figures are aten reductions written through views made
once per buffer (13 aten calls a record on CUDA, 14 on the CPU), and a block is written where it ends (small
blocks on the CPU, so a run that dies still leaves what it recorded).
"""
from __future__ import annotations

import os
import queue
import sys
import threading

import torch
from torch.utils._python_dispatch import _disable_current_modes

from gpulab.numerics import fused, lines

SAMPLE = fused.SAMPLE                  # elements of a fixed strided sample per output
NF = 3 + SAMPLE                        # float64 figures: sum, abs-sum, max-abs, sample
NI = 3                                 # int64 figures: bitwise checksum, NaN count, Inf count
CAP = 1024                             # rows of a GPU block: records per block with a GPU
CPU_BLOCK = 64                         # records per block while only the CPU has run ops (cheap to write out)

_DTYPES = {d: str(d)[6:] for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64)}
_INT_VIEW = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
             torch.bfloat16: torch.int16}


def _aten(t: torch.Tensor, f0, f1, f2, fs, i0, i1, i2, index) -> None:
    """t's figures by aten reductions, each written straight into its place (read in place, whatever the
    strides: no contiguous copy)."""
    x = t if t.dtype in _INT_VIEW else t.float()   # float8 and other narrow types: figures through float32
    dims = tuple(range(x.dim()))
    torch.sum(x, dims, dtype=torch.float64, out=f0)
    torch.linalg.vector_norm(x, 1, dtype=torch.float64, out=f1)                 # abs-sum, one kernel
    if x.device.type == "cpu":   # the CPU's inf-norm kernel is ten times slower than abs + amax
        f2.copy_(torch.amax(torch.abs(x)))
    else:
        torch.linalg.vector_norm(x, float("inf"), dtype=torch.float64, out=f2)  # max-abs, one kernel
    idx = index(x.numel(), x.device)
    (fs if idx.numel() == SAMPLE else fs[:idx.numel()]).copy_(torch.take(x, idx))
    if t.dtype in _INT_VIEW:
        torch.sum(x.view(_INT_VIEW[x.dtype]), dims, dtype=torch.int64, out=i0)
    else:
        i0.zero_()
    torch.sum(torch.isnan(x), dims, out=i1)
    torch.sum(torch.isinf(x), dims, out=i2)


class _AtenSink:
    """A device's figures by aten, in buffers kept for the whole run (rows reused block after block)."""

    def __init__(self, device: torch.device, index):
        self.key = str(device)
        self.f = torch.zeros(CAP, NF, dtype=torch.float64, device=device)
        self.i = torch.zeros(CAP, NI, dtype=torch.int64, device=device)
        self.index, self.row = index, 0
        # per row, the views each figure is written through (made once: a view is a dispatcher call)
        self.views = [(self.f[r], self.i[r], self.f[r, 0], self.f[r, 1], self.f[r, 2], self.f[r, 3:3 + SAMPLE],
                       self.i[r, 0], self.i[r, 1], self.i[r, 2]) for r in range(CAP)]

    def add(self, t: torch.Tensor) -> int:
        f, i, *places = self.views[self.row]
        if t.numel():
            _aten(t, *places, self.index)
        else:   # the row may hold an earlier block's figures
            f.zero_()
            i.zero_()
        self.row += 1
        return self.row - 1

    def take(self):
        """-> a callable giving this block's rows on the host (copied now: the rows are reused)."""
        f, i = self.f[:self.row].cpu().numpy().copy(), self.i[:self.row].cpu().tolist()
        self.row = 0
        return lambda: (f, i)

    def settle(self) -> None:
        """Nothing waits: aten's figures are queued as each output is made."""


class _FusedSink:
    """A CUDA device's figures by gpulab.numerics.fused, in a fresh block per CAP records; its rows reach the
    host by a copy that nothing waits for until the writer reads them."""

    def __init__(self, device: torch.device, index):
        self.device, self.index, self.key = device, index, str(device)
        self.pf, self.pi = fused.partials(device, CAP)
        self.batches = fused.Batches(device)
        self._fresh()

    def _fresh(self) -> None:
        self.f = torch.zeros(CAP, NF, dtype=torch.float64, device=self.device)
        self.i = torch.zeros(CAP, NI, dtype=torch.int64, device=self.device)
        self.row = 0

    def add(self, t: torch.Tensor) -> int:
        r = self.row
        if t.numel():
            if fused.usable(t):
                self.batches.add(t, r, self.pf, self.pi, self.f)
            else:   # a dtype or device the kernel does not read: aten figures into the row's first partials
                _aten(t, self.pf[r, 0, 0], self.pf[r, 0, 1], self.pf[r, 0, 2], self.f[r, 3:3 + SAMPLE],
                      self.pi[r, 0, 0], self.pi[r, 0, 1], self.pi[r, 0, 2], self.index)
        self.row += 1
        return r

    def settle(self) -> None:
        """Read the outputs still waiting (before an op may write over one of them)."""
        if self.batches.pending:
            self.batches.settle(self.pf, self.pi, self.f)

    def take(self):
        rows = self.row
        with torch.cuda.device(self.device):
            self.settle()
            fused.fold(self.pf, self.pi, self.f, self.i, rows)
            hf = torch.empty(rows, NF, dtype=torch.float64, pin_memory=True)
            hi = torch.empty(rows, NI, dtype=torch.int64, pin_memory=True)
            hf.copy_(self.f[:rows], non_blocking=True)
            hi.copy_(self.i[:rows], non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        self._fresh()

        def host():
            done.synchronize()
            return hf.numpy(), hi.tolist()
        return host


def _lines(meta: list, host: dict) -> str:
    out = []
    for index, op, site, npass, bwd, o, ins, red, dtype, shape, n, dev, row in meta:
        f, i = host[dev][0][row], host[dev][1][row]
        if i[1]:   # as torch's norm: NaN max-abs where the output holds one
            f = f.copy()
            f[2] = float("nan")
        out.append(lines.line(index, op, site, npass, bwd, o, ins, red, dtype, shape, n, dev, f[:3].tolist(),
                              f[3:3 + min(SAMPLE, n)].tobytes(), i))
    return "\n".join(out) + "\n"


class Fingerprints:
    """The device buffers of one run and their records' metadata, written out a block at a time."""

    def __init__(self, path: str, keep: str | None = None, background: bool = False):
        self.path = path
        # the records whose inputs a replay keeps ("op|site|pass|out" lines, in the parent's order) and their ops
        self.keep: tuple[str, ...] = tuple(k for k in (keep or "").split("\n") if k)
        self.keep_ops = frozenset(k.split("|", 1)[0] for k in self.keep)
        self.fh = open(path, "w", buffering=1 << 16)
        self.meta: list[list] = []            # per pending record: its fields, its device, its row
        self.sinks: dict[torch.device, _AtenSink | _FusedSink] = {}   # each names itself in the lines (.key)
        self.n = 0                             # records written or pending
        self.block = CPU_BLOCK
        self.samples: dict[tuple[int, str], torch.Tensor] = {}
        self.lock = threading.RLock()
        self.kept: set[str] = set()
        self.failures = 0
        self.off = False                        # a fork() child records nothing
        self.writer: queue.Queue | None = None   # a thread writes the lines once a GPU records
        self.thread: threading.Thread | None = None
        self.unwritten = 0                         # blocks that could not be written (said once on stderr)
        if background:
            self._start_writer()

    def mark_kept(self, key: str) -> tuple[int, bool] | None:
        """A record a replay asked for has been made: its place among them and whether it is the last; None when
        it was not asked for or is kept already. The ops still pending are the ones whose inputs are copied."""
        if key not in self.keep or key in self.kept:
            return None
        self.kept.add(key)
        self.keep_ops = frozenset(k.split("|", 1)[0] for k in self.keep if k not in self.kept)
        return self.keep.index(key), len(self.kept) == len(self.keep)

    def _sink(self, device: torch.device):
        got = self.sinks.get(device)
        if got is None:
            if device.type != "cpu":
                self.block = CAP   # a GPU block is written once per CAP records
            got = self.sinks[device] = (_FusedSink if device.type == "cuda" and fused.triton is not None
                                        else _AtenSink)(device, self._index)
            if isinstance(got, _FusedSink):
                self._start_writer()
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

    def add(self, t: torch.Tensor, fields: list) -> int:
        """Queue the figures of t (kernels on its device, no sync) -> the record's index."""
        sink = self._sink(t.device)
        row = sink.add(t)
        index = self.n
        self.n += 1
        dtype = _DTYPES.get(t.dtype) or str(t.dtype)[6:]
        self.meta.append([index, *fields, dtype, list(t.shape), t.numel(), sink.key, row])
        if sink.row >= CAP or len(self.meta) >= self.block:
            self.flush()
        return index

    def settle(self) -> None:
        """Before an op that writes in place: every output waiting for its figures is read now."""
        for s in self.sinks.values():
            s.settle()

    def flush(self) -> None:
        """Hand the queued block to be written: by the writer thread once a GPU records, else at once."""
        with self.lock:
            if not self.meta:
                return
            meta, self.meta = self.meta, []
            hosts = {s.key: s.take() for s in self.sinks.values() if s.row}
            if self.thread is not None and self.thread.is_alive():
                self.writer.put((meta, hosts))
            else:
                self._write(meta, hosts)

    def _write(self, meta: list, hosts: dict) -> None:
        try:
            self.fh.write(_lines(meta, {k: h() for k, h in hosts.items()}))
            self.fh.flush()
        except (OSError, ValueError):
            pass   # the folder is gone: the run is being stopped
        except Exception as exc:  # noqa: BLE001 - the program runs on; the comparison then says what is missing
            self.unwritten += 1
            if self.unwritten == 1:
                print(f"[gpulab compare] fingerprints not written: {type(exc).__name__}: {exc}", file=sys.stderr)

    def _start_writer(self) -> None:
        """The writer thread, started with the first GPU record and never later: Python refuses a new thread at
        interpreter shutdown, which is when a short run's only block is written."""
        if self.thread is not None:
            return
        writer = queue.Queue()
        thread = threading.Thread(target=self._drain, args=(writer,), name="gpulab-fingerprints", daemon=True)
        try:
            thread.start()
        except RuntimeError:   # at shutdown already: blocks are written where they end
            return
        self.writer, self.thread = writer, thread

    def _drain(self, writer: queue.Queue) -> None:
        while True:
            item = writer.get()
            if item is None:
                return
            self._write(*item)

    def close(self) -> None:
        """The last block written. Its copies and kernels run with every dispatch mode off: at exit the
        recorder's own mode is still on, and would record (and batch) the recorder's own ops."""
        with _disable_current_modes():
            self.flush()
        if self.thread is not None:
            self.writer.put(None)
            self.thread.join()
            self.thread = self.writer = None
        try:
            self.fh.close()
        except OSError:
            pass

    def forked(self) -> None:
        """In a fork() child (a DataLoader worker): off, nothing written, no writer thread. The parent's device
        buffers are kept and never freed: freeing CUDA memory is a CUDA call, which aborts a child forked from a
        process that used CUDA (a worker of an NCCL rank died of SIGABRT)."""
        self.off = True
        self.orphaned = (self.meta, self.sinks, self.samples)
        self.meta, self.sinks, self.samples = [], {}, {}
        self.writer = self.thread = None
        self.fh = open(os.devnull, "w")
