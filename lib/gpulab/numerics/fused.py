"""A CUDA output's fingerprint in one pass (Triton), for gpulab.numerics.fingerprints.

Why: the figures through aten read each output about seven times (four reductions, two masks, a sample), cast
narrow types to float32 first and cost a dozen launches; on a GPT-2-small step that was 12.9x. Here one kernel
reads each output once in its own dtype and writes, per program, the partial sum, abs-sum, max-abs, bitwise
checksum and NaN/Inf counts, plus the strided sample; at a block's end one more kernel folds each row's
partials. Why batches: a launch from Python costs more than the op it follows (about 33 us a Triton launch on
the H100 host against 13 us an aten one), so outputs wait in a batch of their dtype (at most BATCH of them,
BATCH_BYTES in all) and one launch reads them all through a table of their addresses. A batch is launched
before any op that writes in place (record's mode calls `Batches.settle`) and at a block's end, so what it
reads is what the op made; an output over BATCH_BYTES is read by a launch of its own, not held.

Why partials and not atomics: the figures must be bitwise the same on a rerun of the same data (a rerun's first
bitwise difference is read from them). The number of programs reading an output depends only on its element
count, and every sum runs in a fixed order, so the same values give the same figures, batched or not.

The figures mean what the aten path's mean (fingerprints._aten): sums in float64 of the values as float32
(float64 ones as they are), the checksum the int64 sum of the elements' bits as signed integers of their
width, max-abs over the non-NaN values (the line turns it to NaN where NaNs were counted, as torch's norm does).
"""
from __future__ import annotations

import torch

try:   # Triton ships with PyTorch's CUDA builds; without it the recorder uses its aten path
    import triton
    import triton.language as tl
except ImportError:   # pragma: no cover - this CPU machine's torch has no Triton
    triton = None

BLOCK = 1024                         # elements per program per iteration
PMAX = 512                           # programs per output at most: partial rows per record
SAMPLE = 32
BATCH = 32                           # outputs per launch at most
BATCH_BYTES = 256 << 20              # bytes of outputs a batch holds at most (they stay alive until it runs)
RING = 4096                          # batch tables in pinned host memory, reused in turn
_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3}


def usable(t: torch.Tensor) -> bool:
    """Whether a CUDA tensor's figures can come from the kernel: a float of a width it reads, on the current
    device."""
    return t.dtype in _CODE and triton is not None and t.device.index == torch.cuda.current_device()


def partials(device: torch.device, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The zeroed partial buffers of `rows` records: float64 (sum, abs-sum, max-abs) and int64 (checksum, NaN,
    Inf) per program."""
    return (torch.zeros(rows, PMAX, 3, dtype=torch.float64, device=device),
            torch.zeros(rows, PMAX, 3, dtype=torch.int64, device=device))


if triton is not None:
    @triton.jit
    def _one(x_ptr, n, pid, row, pf_ptr, pi_ptr, fbuf_ptr, nf, PMAX: tl.constexpr, BLOCK: tl.constexpr,
             CODE: tl.constexpr, SAMPLE: tl.constexpr):
        """Program pid's share of one output: its partials into (row, pid), the sample by program 0."""
        nprog = tl.minimum((n + BLOCK - 1) // BLOCK, PMAX)
        if pid < nprog:
            lane = tl.arange(0, BLOCK)
            s = tl.zeros([BLOCK], dtype=tl.float64)
            a = tl.zeros([BLOCK], dtype=tl.float64)
            m = tl.zeros([BLOCK], dtype=tl.float64)
            ck = tl.zeros([BLOCK], dtype=tl.int64)
            nn = tl.zeros([BLOCK], dtype=tl.int32)
            ni = tl.zeros([BLOCK], dtype=tl.int32)
            for start in range(pid * BLOCK, n, nprog * BLOCK):
                offs = start.to(tl.int64) + lane
                raw = tl.load(x_ptr + offs, mask=offs < n, other=0)
                if CODE == 3:
                    v = raw
                    bits = raw.to(tl.int64, bitcast=True)
                elif CODE == 0:
                    v = raw.to(tl.float64)
                    bits = raw.to(tl.int32, bitcast=True).to(tl.int64)
                else:
                    v = raw.to(tl.float32).to(tl.float64)
                    bits = raw.to(tl.int16, bitcast=True).to(tl.int64)
                av = tl.abs(v)
                isnan = v != v
                s += v
                a += av
                m = tl.maximum(m, tl.where(isnan, 0.0, av))
                ck += bits
                nn += isnan.to(tl.int32)
                ni += (av == float("inf")).to(tl.int32)
            base = (row * PMAX + pid) * 3
            tl.store(pf_ptr + base, tl.sum(s, axis=0))
            tl.store(pf_ptr + base + 1, tl.sum(a, axis=0))
            tl.store(pf_ptr + base + 2, tl.max(m, axis=0))
            tl.store(pi_ptr + base, tl.sum(ck, axis=0))
            tl.store(pi_ptr + base + 1, tl.sum(nn.to(tl.int64), axis=0))
            tl.store(pi_ptr + base + 2, tl.sum(ni.to(tl.int64), axis=0))
            if pid == 0:   # the strided sample: element floor(j * n / k), j < k = min(SAMPLE, n), as aten's path
                j = tl.arange(0, SAMPLE)
                k = tl.minimum(n, SAMPLE)
                idx = (j.to(tl.int64) * n) // tl.maximum(k, 1)
                sv = tl.load(x_ptr + idx, mask=j < k, other=0)
                if CODE == 3:
                    sv64 = sv
                else:
                    sv64 = sv.to(tl.float32).to(tl.float64)
                tl.store(fbuf_ptr + row * nf + 3 + j, sv64, mask=j < k)

    @triton.jit
    def _figures(x_ptr, n, row, pf_ptr, pi_ptr, fbuf_ptr, nf, PMAX: tl.constexpr, BLOCK: tl.constexpr,
                 CODE: tl.constexpr, SAMPLE: tl.constexpr):
        _one(x_ptr, n, tl.program_id(0), row, pf_ptr, pi_ptr, fbuf_ptr, nf, PMAX, BLOCK, CODE, SAMPLE)

    @triton.jit
    def _figures_many(table_ptr, width, pf_ptr, pi_ptr, fbuf_ptr, nf, PMAX: tl.constexpr, BLOCK: tl.constexpr,
                      CODE: tl.constexpr, ALIGNED: tl.constexpr, SAMPLE: tl.constexpr):
        """Grid (programs, outputs): output b's address, element count and row are the table's column b."""
        b = tl.program_id(1)
        addr = tl.load(table_ptr + b)
        n = tl.load(table_ptr + width + b)
        row = tl.load(table_ptr + 2 * width + b)
        if CODE == 0:
            x_ptr = addr.to(tl.pointer_type(tl.float32))
        elif CODE == 1:
            x_ptr = addr.to(tl.pointer_type(tl.float16))
        elif CODE == 2:
            x_ptr = addr.to(tl.pointer_type(tl.bfloat16))
        else:
            x_ptr = addr.to(tl.pointer_type(tl.float64))
        if ALIGNED:   # 16-byte aligned (as the allocator's blocks are): vector loads
            x_ptr = tl.multiple_of(x_ptr, 16)
        _one(x_ptr, n, tl.program_id(0), row, pf_ptr, pi_ptr, fbuf_ptr, nf, PMAX, BLOCK, CODE, SAMPLE)

    @triton.jit
    def _fold(pf_ptr, pi_ptr, fbuf_ptr, ibuf_ptr, nf, ni_, PMAX: tl.constexpr):
        """One program per row: its partials summed (max for max-abs) in a fixed order, then zeroed for the
        next block."""
        row = tl.program_id(0)
        base = (row * PMAX + tl.arange(0, PMAX)) * 3
        tl.store(fbuf_ptr + row * nf, tl.sum(tl.load(pf_ptr + base), axis=0))
        tl.store(fbuf_ptr + row * nf + 1, tl.sum(tl.load(pf_ptr + base + 1), axis=0))
        tl.store(fbuf_ptr + row * nf + 2, tl.max(tl.load(pf_ptr + base + 2), axis=0))
        tl.store(ibuf_ptr + row * ni_, tl.sum(tl.load(pi_ptr + base), axis=0))
        tl.store(ibuf_ptr + row * ni_ + 1, tl.sum(tl.load(pi_ptr + base + 1), axis=0))
        tl.store(ibuf_ptr + row * ni_ + 2, tl.sum(tl.load(pi_ptr + base + 2), axis=0))
        zf = tl.zeros([PMAX], dtype=tl.float64)
        zi = tl.zeros([PMAX], dtype=tl.int64)
        for c in range(3):
            tl.store(pf_ptr + base + c, zf)
            tl.store(pi_ptr + base + c, zi)


def _programs(n: int) -> int:
    return min((n + BLOCK - 1) // BLOCK, PMAX)


class Batches:
    """A CUDA device's outputs waiting for their figures, one batch per dtype and alignment, and the pinned
    tables that carry a batch's addresses to the device."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pending: dict[tuple, tuple[list, list]] = {}   # (dtype, 16-byte aligned) -> (tensors, their rows)
        self.bytes = 0
        self.host = torch.zeros(RING, 3, BATCH, dtype=torch.int64).pin_memory()
        self.table = self.host.numpy()                      # the same memory, written without a dispatcher call
        self.dev = torch.zeros(RING, 3, BATCH, dtype=torch.int64, device=device)
        self.slot = 0
        self.half: list = [None, None]   # per half of the ring, the event after its last copy: done before reuse

    def add(self, t: torch.Tensor, row: int, pf: torch.Tensor, pi: torch.Tensor, fbuf: torch.Tensor) -> None:
        x = t if t.is_contiguous() else t.contiguous()   # a strided output is read through a dense copy (rare)
        n = x.numel()
        size = n * x.element_size()
        aligned = x.data_ptr() % 16 == 0
        if size >= BATCH_BYTES:
            _figures[(_programs(n),)](x, n, row, pf, pi, fbuf, fbuf.shape[1], PMAX=PMAX, BLOCK=BLOCK,
                                      CODE=_CODE[x.dtype], SAMPLE=SAMPLE, num_warps=4)
            return
        key = (x.dtype, aligned)
        got = self.pending.get(key)
        if got is None:
            got = self.pending[key] = ([], [])
        got[0].append(x)
        got[1].append(row)
        self.bytes += size
        if len(got[0]) >= BATCH or self.bytes >= BATCH_BYTES:
            self.settle(pf, pi, fbuf)

    def settle(self, pf: torch.Tensor, pi: torch.Tensor, fbuf: torch.Tensor) -> None:
        """Launch every waiting batch (one launch each) and let their outputs go."""
        for (dtype, aligned), (xs, rows) in self.pending.items():
            if xs:
                self._launch(dtype, aligned, xs, rows, pf, pi, fbuf)
        self.pending.clear()
        self.bytes = 0

    def _turn(self) -> int:
        """The next table slot; entering a half of the ring waits for that half's copies of the last turn
        (RING/2 launches ago: done) and marks the other half's."""
        if self.slot in (0, RING // 2):
            h = 0 if self.slot == 0 else 1
            if self.half[h] is not None:
                self.half[h].synchronize()
            ev = torch.cuda.Event()
            ev.record()
            self.half[1 - h] = ev
        s = self.slot
        self.slot = (s + 1) % RING
        return s

    def _launch(self, dtype, aligned, xs, rows, pf, pi, fbuf) -> None:
        k, s = len(xs), self._turn()
        table = self.table[s]
        table[0, :k] = [x.data_ptr() for x in xs]
        table[1, :k] = [x.numel() for x in xs]
        table[2, :k] = rows
        dev = self.dev[s]
        dev.copy_(self.host[s], non_blocking=True)
        grid = (max(_programs(x.numel()) for x in xs), k)
        _figures_many[grid](dev, BATCH, pf, pi, fbuf, fbuf.shape[1], PMAX=PMAX, BLOCK=BLOCK, CODE=_CODE[dtype],
                            ALIGNED=aligned, SAMPLE=SAMPLE, num_warps=4)


def fold(pf: torch.Tensor, pi: torch.Tensor, fbuf: torch.Tensor, ibuf: torch.Tensor, rows: int) -> None:
    """Queue the fold of rows [0, rows): figures into fbuf/ibuf columns 0-2, partials zeroed."""
    if rows:
        _fold[(rows,)](pf, pi, fbuf, ibuf, fbuf.shape[1], ibuf.shape[1], PMAX=PMAX, num_warps=4)
