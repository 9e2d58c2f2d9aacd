"""The op log's file format: a memory-mapped ring written by the recorder, read by anyone, any time.

Why a mmap ring and not a log file: a hang or a SIGKILL must not lose the op that never finished, and a
flush per op costs ~40 us. Writes into a shared file mapping are plain memory stores; the page cache makes
them visible to a reader in another process at once and keeps them when the writer dies.

File layout (little endian):
  [0, 4096)            header: static fields, then counters at COUNTERS_OFF (started, completed,
                       gpu_completed, first_nonfinite, mem_count) - `progress()` reads only these.
  [4096, +32*memcap)   memory samples ring (t, seq, allocated/RSS bytes, reserved bytes)
  [..., +512*cap)      op slots ring, slot = seq % capacity; a slot's seq field is written last (commit
                       marker: -1 while being written), so a torn or overwritten slot is detected and skipped.
"""
from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"GPLTRC01"
VERSION = 1
HEADER_SIZE = 4096
SLOT_SIZE = 512
MEM_SIZE = 32
MODES = ("ops", "sync", "gpu", "stats")
DEFAULT_CAPACITY = 1 << 16
DEFAULT_MEM_CAPACITY = 1 << 14

_STATIC = struct.Struct("<8sIIQQqd16s32s")          # magic version slot cap memcap pid t0 mode device
COUNTERS_OFF = 256
_COUNTERS = struct.Struct("<QQqqQ")                 # started completed gpu_completed first_nonfinite mem_count
_Q = struct.Struct("<Q")
_q = struct.Struct("<q")
_d = struct.Struct("<d")
_b = struct.Struct("<b")
_OFF_STARTED, _OFF_COMPLETED, _OFF_GPU, _OFF_NONFINITE, _OFF_MEMCOUNT = (COUNTERS_OFF + 8 * i for i in range(5))
_MEM = struct.Struct("<dqqq")                       # t seq allocated reserved
# seq t_start t_end tid gpu_done kind flags pad depth | name thread site args | stats (only if flags & F_STATS)
_SLOT = struct.Struct("<qddQbbbxi 64s32s136s192s")
_STATS = struct.Struct("<dddqqq")                   # min max mean nan +inf -inf
_OFF_STATS = _SLOT.size
assert _SLOT.size + _STATS.size == SLOT_SIZE, _SLOT.size
_OFF_DEVICE = 64  # the 32s device field of _STATIC
_OFF_TEND, _OFF_GPUDONE, _OFF_FLAGS = 16, 32, 34
F_STATS, F_RAISED, F_NONFINITE = 1, 2, 4
KINDS = ("op", "composite")
_UNINITIALIZED = (b"aten.empty", b"aten.new_empty", b"aten.empty_like", b"aten.empty_strided", b"aten.resize_")



# ---------------------------------------------------------------------------------------------- results

@dataclass(frozen=True)
class Progress:
    started: int
    completed: int
    gpu_completed: int | None


@dataclass(frozen=True)
class OpRecord:
    seq: int
    name: str
    args: list
    call_site: str
    thread: str
    t_start: float
    t_end: float | None
    gpu_done: bool | None
    stats: dict | None
    kind: str = "op"
    depth: int = 0
    raised: bool = False

    @property
    def in_flight(self) -> bool:
        return self.t_end is None


@dataclass(frozen=True)
class MemSample:
    t: float
    seq: int
    allocated: int
    reserved: int | None


@dataclass(frozen=True)
class Snapshot:
    records: tuple[OpRecord, ...]
    started: int
    completed: int
    gpu_completed: int | None
    mode: str
    pid: int
    device: str
    capacity: int
    dropped: int
    t0: float = 0.0
    first_nonfinite: int | None = None
    memory: tuple[MemSample, ...] = ()
    torn: int = 0  # slots skipped because they were being written (or cut off) when read

    def in_flight(self) -> tuple[OpRecord, ...]:
        """Ops whose host call started and never returned (innermost last)."""
        return tuple(r for r in self.records if r.t_end is None)

    def by_seq(self, seq: int) -> OpRecord | None:
        for r in self.records:
            if r.seq == seq:
                return r
        return None


# ---------------------------------------------------------------------------------------------- file

def create(path: str | os.PathLike, mode: str = "ops", capacity: int = DEFAULT_CAPACITY,
           mem_capacity: int = DEFAULT_MEM_CAPACITY, device: str = "unknown") -> Path:
    """Make a fresh pre-sized log atomically (rename), so a reader never sees a half-written header."""
    _check_mode(mode)
    if capacity < 1 or mem_capacity < 1:
        raise ValueError(f"capacity={capacity} and mem_capacity={mem_capacity} must be >= 1")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    size = HEADER_SIZE + mem_capacity * MEM_SIZE + capacity * SLOT_SIZE
    with open(tmp, "wb") as fh:
        fh.truncate(size)  # sparse: pages cost memory only once written
        fh.write(_STATIC.pack(MAGIC, VERSION, SLOT_SIZE, capacity, mem_capacity, os.getpid(), time.time(),
                              mode.encode(), device.encode()))
        fh.seek(COUNTERS_OFF)
        fh.write(_COUNTERS.pack(0, 0, -1, -1, 0))
    os.replace(tmp, path)
    return path


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not valid; choose one of {', '.join(MODES)}")


def progress(path: str | os.PathLike) -> Progress:
    """Counters only (one pread of 40 bytes): cheap enough to poll 10x/s from the watchdog."""
    fd = os.open(path, os.O_RDONLY)
    try:
        raw = os.pread(fd, _COUNTERS.size, COUNTERS_OFF)
    finally:
        os.close(fd)
    if len(raw) < _COUNTERS.size:
        return Progress(0, 0, None)
    started, completed, gpu, _nf, _mc = _COUNTERS.unpack(raw)
    return Progress(started, completed, None if gpu < 0 else gpu)


def _cstr(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode("utf-8", "replace")


def _contiguous(shape: list[int], stride: list[int]) -> bool:
    expected = 1
    for size, st in zip(reversed(shape), reversed(stride)):
        if size != 1 and st != expected:
            return False
        expected *= size
    return True


def parse_args(text: str) -> list:
    """Decode the compact per-op argument summary written by the recorder."""
    out: list = []
    for item in text.split(";") if text else ():
        if item.startswith("T|"):
            parts = item.split("|")
            if len(parts) < 5:
                out.append({"truncated": item})
                continue
            try:
                shape = [int(x) for x in parts[2].split(",") if x]
                stride = [int(x) for x in parts[3].split(",") if x]
            except ValueError:
                out.append({"truncated": item})
                continue
            out.append({"shape": shape, "dtype": parts[1], "stride": stride,
                        "contiguous": _contiguous(shape, stride), "device": parts[4]})
        else:
            out.append({"value": item})
    return out


def _unpack_record(raw: bytes, expected: int) -> OpRecord | None:
    seq, t0, t1, tid, gpu_done, kind, flags, depth, name, tname, site, args = _SLOT.unpack_from(raw, 0)
    if seq != expected:
        return None
    stats = None
    if flags & F_STATS:
        mn, mx, mean, nan, inf, ninf = _STATS.unpack_from(raw, _OFF_STATS)
        stats = {"min": mn, "max": mx, "mean": mean, "nan": nan, "inf": inf, "neginf": ninf,
                 "nonfinite": bool(flags & F_NONFINITE)}
    return OpRecord(seq=seq, name=_cstr(name), args=parse_args(_cstr(args)), call_site=_cstr(site),
                    thread=f"{_cstr(tname)} ({tid})", t_start=t0, t_end=t1 if t1 > 0 else None,
                    gpu_done=None if gpu_done < 0 else bool(gpu_done), stats=stats,
                    kind=KINDS[kind] if 0 <= kind < len(KINDS) else str(kind), depth=depth,
                    raised=bool(flags & F_RAISED))


def read(path: str | os.PathLike) -> Snapshot:
    """Everything in the ring. Safe while another process writes and after it was SIGKILLed."""
    data = Path(path).read_bytes()
    if len(data) < COUNTERS_OFF + _COUNTERS.size or data[:8] != MAGIC:
        raise ValueError(f"{path} is not a gpulab trace log (size {len(data)}, magic {data[:8]!r}; "
                         f"expected magic {MAGIC!r})")
    magic, version, slot, cap, memcap, pid, t0, mode, device = _STATIC.unpack_from(data, 0)
    if version != VERSION or slot != SLOT_SIZE or cap < 1:
        raise ValueError(f"{path}: unsupported trace log version={version} slot={slot} capacity={cap}")
    started, completed, gpu, nonfinite, memcount = _COUNTERS.unpack_from(data, COUNTERS_OFF)
    slots_off = HEADER_SIZE + memcap * MEM_SIZE
    records, torn = [], 0
    first = max(0, started - cap)
    for seq in range(first, started):
        off = slots_off + (seq % cap) * SLOT_SIZE
        if off + SLOT_SIZE > len(data):
            torn += 1
            continue
        rec = _unpack_record(data[off:off + SLOT_SIZE], seq)
        if rec is None:
            torn += 1
        else:
            records.append(rec)
    mem = []
    for i in range(max(0, memcount - memcap), memcount):
        off = HEADER_SIZE + (i % memcap) * MEM_SIZE
        t, seq, alloc, reserved = _MEM.unpack_from(data, off)
        if t > 0:
            mem.append(MemSample(t, seq, alloc, None if reserved < 0 else reserved))
    return Snapshot(records=tuple(records), started=started, completed=completed,
                    gpu_completed=None if gpu < 0 else gpu, mode=_cstr(mode), pid=pid, device=_cstr(device),
                    capacity=cap, dropped=first, t0=t0, first_nonfinite=None if nonfinite < 0 else nonfinite,
                    memory=tuple(mem), torn=torn)



def read_device(path: str | os.PathLike) -> str:
    """The device the recorder saw first ('cpu', 'cuda', 'unknown'): one read of the header."""
    fd = os.open(path, os.O_RDONLY)
    try:
        raw = os.pread(fd, _STATIC.size, 0)
    finally:
        os.close(fd)
    if len(raw) < _STATIC.size or raw[:8] != MAGIC:
        raise ValueError(f"{path} is not a gpulab trace log")
    return _cstr(_STATIC.unpack(raw)[-1])
