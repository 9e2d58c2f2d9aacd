"""The op log's file format: a memory-mapped ring written by the recorder, read by anyone, any time.

Why a mmap ring and not a log file: a hang or a SIGKILL must not lose the op that never finished, and a
flush per op costs ~40 us. Writes into a shared file mapping are plain memory stores; the page cache makes
them visible to a reader in another process at once and keeps them when the writer dies.

Why a string table: op names, thread names, call sites and argument summaries repeat, so each distinct
text is written once and a slot holds four 32-bit ids: the hot path stores ~48 bytes (one cache line)
instead of ~420 bytes of text per op.

File layout (little endian; all regions sized at creation, the file is sparse):
  [0, 4096)           header: static fields, then counters at COUNTERS_OFF (started, completed, ...).
  [4096, 8192)        GPU progress: one 32-byte entry per CUDA stream (done, enqueued, handle, device,
                      valid). `done` is the seq of the newest op whose GPU work completed on that stream; on
                      CUDA the GPU itself writes it (a stream memory op into this page, registered with the
                      driver) or a background thread copies it here. `progress()` reads only these 2 pages.
  [8192, +32*memcap)  memory samples ring (t, seq, allocated/RSS bytes, reserved bytes)
  [.., +strcap)       string table: an entry at position p (its id) lives at offset p % strcap: (p, length)
                      then the UTF-8 text; its header is written last (commit), and a wrapped table
                      overwrites old entries, which a reader detects (p differs) and shows as evicted.
  [.., +slot*cap)     op slots, slot = seq % capacity; a slot's seq field is written last (commit marker: -1
                      while being written), so a torn or overwritten slot is detected and skipped.

The slots come last so a log whose ring never wrapped is trimmed at close to what was recorded; a reader
takes any file shorter than the header says (trimmed, or cut off) and reports the missing slots as torn.
Once its writer has ended, `shrink` also cuts the memory ring and the string table to their used extent
(the header says the new sizes), so a copy or an upload of a finished log carries only what was recorded.
"""
from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

MAGIC = b"GPLTRC02"
VERSION = 2
PAGE = 4096
GPU_PAGE_OFF = PAGE
HEADER_SIZE = 2 * PAGE
SLOT_SIZE = 64
STATS_SLOT_SIZE = 128
MEM_SIZE = 32
MODES = ("ops", "sync", "gpu", "stats", "auto")
DEFAULT_CAPACITY = 1 << 17
DEFAULT_MEM_CAPACITY = 1 << 14
DEFAULT_STRING_CAPACITY = 1 << 22

# magic version slot_size capacity mem_capacity string_capacity pid t0 mode device gpu_mechanism
_STATIC = struct.Struct("<8sIIQQQqd16s32s32s")
_OFF_DEVICE = 72
_OFF_MECHANISM = 104
COUNTERS_OFF = 256
# started completed gpu_since first_nonfinite mem_count n_streams string_pos gpu_notes (a string id: why
# better GPU mechanisms were passed over)
_COUNTERS = struct.Struct("<QQqqQQQQ")
(_OFF_STARTED, _OFF_COMPLETED, _OFF_GPU_SINCE, _OFF_NONFINITE, _OFF_MEMCOUNT, _OFF_NSTREAMS,
 _OFF_STRPOS, _OFF_GPU_NOTES) = (COUNTERS_OFF + 8 * i for i in range(8))
# after the counters: 1 + the count of ops recorded when the recorder stopped writing for good (0: it never did;
# the disk refused the log a page, see gpulab.trace.prefault), so a reader can say the log ends early and why
_OFF_STOPPED = COUNTERS_OFF + _COUNTERS.size
# after it: whether the recorder marks an op that raises (0 not known: an older log; 1 yes; 2 no), so a reader
# of a program's error knows whether 'no op marked' means that no op raised
_OFF_RAISE_MARKS = _OFF_STOPPED + 8
_Q = struct.Struct("<Q")
_q = struct.Struct("<q")
_MEM = struct.Struct("<dqqq")                       # t seq allocated reserved
# seq t_start t_end | name site args thread (string ids) | stream depth kind flags
_SLOT = struct.Struct("<qddIIIIhbbB")
_OFF_TEND, _OFF_IDS, _OFF_STREAM, _OFF_FLAGS = 16, 24, 40, 44
_IDS = struct.Struct("<IIII")                       # the slot's string ids: name site args thread
_STATS = struct.Struct("<dddqqq")                   # min max mean nan +inf -inf
_OFF_STATS = SLOT_SIZE
assert _SLOT.size <= SLOT_SIZE and SLOT_SIZE + _STATS.size <= STATS_SLOT_SIZE
# one GPU progress entry per stream: done (GPU-written seq) enqueued (host) handle device valid
_STREAM = struct.Struct("<qqQii")
STREAM_SIZE = 32
MAX_STREAMS = PAGE // STREAM_SIZE
_STR_HEAD = struct.Struct("<II")                    # position (mod 2**32), length
F_STATS, F_RAISED, F_NONFINITE, F_MARK = 1, 2, 4, 8
# F_MARK: the slot holds its GPU marker's value at _OFF_MARK (the observer: a composite's seq comes before its
# ops' but its marker after theirs, so a record is done when its stream's done value reaches that marker's)
_OFF_MARK = 48
_MARK = struct.Struct("<q")
KINDS = ("op", "composite")
_UNINITIALIZED = (b"aten.empty", b"aten.new_empty", b"aten.empty_like", b"aten.empty_strided", b"aten.resize_")
EVICTED = "<evicted from the string table>"


# ---------------------------------------------------------------------------------------------- results

@dataclass(frozen=True)
class Progress:
    started: int
    completed: int
    gpu_completed: int | None   # ops before the first whose GPU work is not known complete (None: untracked)


@dataclass(frozen=True)
class StreamProgress:
    """One CUDA stream's GPU progress: `done` is the seq of the newest op known complete on the GPU."""
    index: int
    handle: int
    device: int
    done: int
    enqueued: int

    @property
    def pending(self) -> bool:
        return self.done < self.enqueued


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
    stream: int | None = None   # index into Snapshot.streams when the op's GPU work was tracked

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
    streams: tuple[StreamProgress, ...] = ()
    gpu_mechanism: str = ""   # how GPU progress was tracked ("" when it never was)
    gpu_notes: str = ""       # why better mechanisms were passed over
    stopped_at: int | None = None   # recording stopped for good after this many ops (the disk was full)
    raise_marks: bool | None = None   # an op that raises is marked so (None: not known)

    def in_flight(self) -> tuple[OpRecord, ...]:
        """Ops whose host call started and never returned (innermost last)."""
        return tuple(r for r in self.records if r.t_end is None)

    def by_seq(self, seq: int) -> OpRecord | None:
        for r in self.records:
            if r.seq == seq:
                return r
        return None


# ---------------------------------------------------------------------------------------------- geometry

@dataclass(frozen=True)
class Layout:
    """Where each region starts, from the static header."""
    slot_size: int
    capacity: int
    mem_capacity: int
    string_capacity: int

    @property
    def mem_off(self) -> int:
        return HEADER_SIZE

    @property
    def strings_off(self) -> int:
        return HEADER_SIZE + self.mem_capacity * MEM_SIZE

    @property
    def slots_off(self) -> int:
        return self.strings_off + self.string_capacity

    @property
    def size(self) -> int:
        return self.slots_off + self.capacity * self.slot_size

    def slot(self, seq: int) -> int:
        return self.slots_off + (seq % self.capacity) * self.slot_size

    def used_size(self, started: int) -> int:
        """File size that holds everything recorded while the ring has not wrapped (page-rounded)."""
        end = self.slots_off + min(started, self.capacity) * self.slot_size
        return min(self.size, -(-end // PAGE) * PAGE)


def layout_for(mode: str, capacity: int, mem_capacity: int, string_capacity: int) -> Layout:
    return Layout(STATS_SLOT_SIZE if mode == "stats" else SLOT_SIZE, capacity, mem_capacity, string_capacity)


# ---------------------------------------------------------------------------------------------- writing

def create(path: str | os.PathLike, mode: str = "ops", capacity: int = DEFAULT_CAPACITY,
           mem_capacity: int = DEFAULT_MEM_CAPACITY, device: str = "unknown",
           string_capacity: int = DEFAULT_STRING_CAPACITY) -> Path:
    """Make a fresh log atomically (rename), so a reader never sees a half-written header. The file is
    sparse: a page takes disk space only once the recorder prefaults or writes it."""
    _check_mode(mode)
    if capacity < 1 or mem_capacity < 1:
        raise ValueError(f"capacity={capacity} and mem_capacity={mem_capacity} must be >= 1")
    if string_capacity < PAGE or string_capacity % 8:
        raise ValueError(f"string_capacity={string_capacity} must be a multiple of 8 and >= {PAGE}")
    lay = layout_for(mode, capacity, mem_capacity, string_capacity)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.truncate(lay.size)
        fh.write(_STATIC.pack(MAGIC, VERSION, lay.slot_size, capacity, mem_capacity, string_capacity, os.getpid(),
                              time.time(), mode.encode(), device.encode(), b""))
        fh.seek(COUNTERS_OFF)
        fh.write(_COUNTERS.pack(0, 0, -1, -1, 0, 0, 8, 0))
    os.replace(tmp, path)
    return path


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not valid; choose one of {', '.join(MODES)}")


class StringWriter:
    """Appends texts to the string table of a mapped log and hands back their ids (positions).

    Not thread-safe by itself: the recorder serializes calls (a miss is rare: a new op, site, thread or
    signature). `on_wrap`, if set, is called once before the first entry of a new lap is written: from
    there on the oldest texts are overwritten, and the recorder copies forward those its newest records
    use (it may call `add` itself; those entries start the new lap)."""

    def __init__(self, buf, strings_off: int, capacity: int, pos: int = 8, on_wrap=None):
        self.buf, self.off, self.cap, self.pos = buf, strings_off, capacity, pos
        self.start_lap = pos // capacity
        self.on_wrap = on_wrap

    def add(self, text: bytes) -> int:
        """Write text; -> its id. The entry's header goes last, so a reader never accepts a partial text."""
        n = min(len(text), self.cap // 4)
        need = _STR_HEAD.size + ((n + 7) & ~7)
        at = self.pos % self.cap
        if at + need > self.cap:            # no entry straddles the end: skip to the next lap
            self.pos += self.cap - at
            at = 0
        p = self.pos
        if p >= 1 << 32:
            raise OverflowError("string table position passed 2**32")
        if p // self.cap != self.start_lap:
            self.start_lap = p // self.cap
            if self.on_wrap is not None:
                self.on_wrap()
                return self.add(text)       # after what on_wrap copied forward
        self.buf[self.off + at + 8:self.off + at + 8 + n] = text[:n]
        _STR_HEAD.pack_into(self.buf, self.off + at, p, n)
        self.pos = p + need
        _Q.pack_into(self.buf, _OFF_STRPOS, self.pos)
        return p

    @property
    def lap(self) -> int:
        return self.pos // self.cap


def string_at(buf, lay: "Layout", p: int) -> bytes | None:
    """The text with id p, or None when it was evicted (overwritten by a later lap) or is cut off."""
    off = lay.strings_off + p % lay.string_capacity
    if off + _STR_HEAD.size > len(buf):
        return None
    pos, n = _STR_HEAD.unpack_from(buf, off)
    if pos != p or off + 8 + n > len(buf):
        return None
    return bytes(buf[off + 8:off + 8 + n])


def add_stream(buf, index: int, handle: int, device: int) -> int:
    """Claim GPU progress entry `index` for a stream; -> the entry's offset in the file."""
    off = GPU_PAGE_OFF + index * STREAM_SIZE
    _STREAM.pack_into(buf, off, -1, -1, handle, device, 0)
    _STREAM.pack_into(buf, off, -1, -1, handle, device, 1)
    _Q.pack_into(buf, _OFF_NSTREAMS, index + 1)
    return off


# ---------------------------------------------------------------------------------------------- GPU progress

def gpu_completed(completed: int, streams: Sequence[StreamProgress]) -> int | None:
    """Pure: one number that says how far the GPU got, comparable to `completed` (a count of ops).

    No stream tracked -> None. Every stream caught up with what the host enqueued -> `completed` (the GPU
    is not behind). Else the smallest `done + 1` over streams with pending work: the ops before the
    earliest one whose GPU work is not known complete. It changes exactly when the GPU advances."""
    if not streams:
        return None
    pending = [s.done + 1 for s in streams if s.pending]
    return min(pending) if pending else completed


def gpu_done(seq: int, stream: int | None, host_returned: bool, streams: Sequence[StreamProgress]) -> bool | None:
    """Pure: did op `seq`'s GPU work complete? None when not tracked (a CPU op, before CUDA, a raised op)
    or while the host is still inside the op (its completion marker is enqueued when the call returns).
    `seq` is the record's marker value where the slot has one (F_MARK), else its seq."""
    if stream is None or not 0 <= stream < len(streams) or not host_returned:
        return None
    return seq <= streams[stream].done


def _streams(data: bytes, n: int) -> tuple[StreamProgress, ...]:
    out = []
    for i in range(min(n, MAX_STREAMS)):
        done, enq, handle, device, valid = _STREAM.unpack_from(data, GPU_PAGE_OFF + i * STREAM_SIZE)
        if valid == 1:
            out.append(StreamProgress(i, handle, device, done, enq))
        else:  # being claimed: nothing recorded on it yet
            out.append(StreamProgress(i, handle, device, -1, -1))
    return tuple(out)


# ---------------------------------------------------------------------------------------------- reading

def progress(path: str | os.PathLike) -> Progress:
    """Counters and GPU progress only (one pread of 8 KiB): cheap enough to poll 10x/s from the watchdog."""
    fd = os.open(path, os.O_RDONLY)
    try:
        raw = os.pread(fd, HEADER_SIZE, 0)
    finally:
        os.close(fd)
    if len(raw) < COUNTERS_OFF + _COUNTERS.size:
        return Progress(0, 0, None)
    started, completed, since, _nf, _mc, nstreams, _sp, _gn = _COUNTERS.unpack_from(raw, COUNTERS_OFF)
    streams = _streams(raw, nstreams) if since >= 0 and len(raw) >= HEADER_SIZE else ()
    return Progress(started, completed, gpu_completed(completed, streams))


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


class _Strings:
    """Resolves string ids of one read (cached: a few hundred distinct texts serve every record)."""

    def __init__(self, data: bytes, lay: Layout):
        self.data, self.lay, self.cache = data, lay, {0: ""}

    def __call__(self, p: int) -> str:
        s = self.cache.get(p)
        if s is None:
            s = self.cache[p] = self._load(p)
        return s

    def _load(self, p: int) -> str:
        text = string_at(self.data, self.lay, p)
        return EVICTED if text is None else text.decode("utf-8", "replace")


def _unpack_record(data: bytes, off: int, expected: int, text: _Strings, streams) -> OpRecord | None:
    seq, t0, t1, name, site, args, thread, stream, depth, kind, flags = _SLOT.unpack_from(data, off)
    if seq != expected:
        return None
    mark = _MARK.unpack_from(data, off + _OFF_MARK)[0] if flags & F_MARK else seq
    stats = None
    if flags & F_STATS:
        mn, mx, mean, nan, inf, ninf = _STATS.unpack_from(data, off + _OFF_STATS)
        stats = {"min": mn, "max": mx, "mean": mean, "nan": nan, "inf": inf, "neginf": ninf,
                 "nonfinite": bool(flags & F_NONFINITE)}
    t_end = t1 if t1 > 0 else None
    sidx = stream if stream >= 0 else None
    return OpRecord(seq=seq, name=text(name), args=parse_args(text(args)), call_site=text(site),
                    thread=text(thread), t_start=t0, t_end=t_end,
                    gpu_done=gpu_done(mark, sidx, t_end is not None, streams), stats=stats,
                    kind=KINDS[kind] if 0 <= kind < len(KINDS) else str(kind), depth=depth,
                    raised=bool(flags & F_RAISED), stream=sidx)


def _header(data: bytes, path) -> tuple[Layout, tuple]:
    if len(data) < COUNTERS_OFF + _COUNTERS.size or data[:8] != MAGIC:
        raise ValueError(f"{path} is not a gpulab trace log (size {len(data)}, magic {data[:8]!r}; "
                         f"expected magic {MAGIC!r})")
    static = _STATIC.unpack_from(data, 0)
    _, version, slot, cap, memcap, strcap, *_ = static
    if version != VERSION or slot not in (SLOT_SIZE, STATS_SLOT_SIZE) or cap < 1 or strcap < PAGE:
        raise ValueError(f"{path}: unsupported trace log version={version} slot={slot} capacity={cap}")
    return Layout(slot, cap, memcap, strcap), static


def read(path: str | os.PathLike) -> Snapshot:
    """Everything in the ring. Safe while another process writes, after it was SIGKILLed, and on a file
    trimmed at close or cut short."""
    data = Path(path).read_bytes()
    lay, static = _header(data, path)
    *_, pid, t0, mode, device, mechanism = static
    started, completed, since, nonfinite, memcount, nstreams, _sp, notes = _COUNTERS.unpack_from(data, COUNTERS_OFF)
    streams = _streams(data, nstreams) if since >= 0 and len(data) >= HEADER_SIZE else ()
    text = _Strings(data, lay)
    records, torn = [], 0
    first = max(0, started - lay.capacity)
    for seq in range(first, started):
        off = lay.slot(seq)
        rec = _unpack_record(data, off, seq, text, streams) if off + lay.slot_size <= len(data) else None
        if rec is None:
            torn += 1
        else:
            records.append(rec)
    mem = []
    for i in range(max(0, memcount - lay.mem_capacity), memcount):
        off = HEADER_SIZE + (i % lay.mem_capacity) * MEM_SIZE
        if off + MEM_SIZE > len(data):
            continue
        t, seq, alloc, reserved = _MEM.unpack_from(data, off)
        if t > 0:
            mem.append(MemSample(t, seq, alloc, None if reserved < 0 else reserved))
    return Snapshot(records=tuple(records), started=started, completed=completed,
                    gpu_completed=gpu_completed(completed, streams), mode=_cstr(mode), pid=pid,
                    device=_cstr(device), capacity=lay.capacity, dropped=first, t0=t0,
                    first_nonfinite=None if nonfinite < 0 else nonfinite, memory=tuple(mem), torn=torn,
                    streams=streams, gpu_mechanism=_cstr(mechanism), gpu_notes=text(notes) if notes > 0 else "",
                    stopped_at=stopped_at(data), raise_marks=raise_marks(data))


def stopped_at(buf) -> int | None:
    """How many ops were recorded when the recorder stopped writing for good, or None (it never did)."""
    if len(buf) < _OFF_STOPPED + 8:
        return None
    v = _Q.unpack_from(buf, _OFF_STOPPED)[0]
    return v - 1 if v else None


def mark_stopped(buf, started: int) -> None:
    _Q.pack_into(buf, _OFF_STOPPED, started + 1)


def raise_marks(buf) -> bool | None:
    """Whether the recorder marks an op that raises (None: not known)."""
    if len(buf) < _OFF_RAISE_MARKS + 8:
        return None
    return {1: True, 2: False}.get(_Q.unpack_from(buf, _OFF_RAISE_MARKS)[0])


def mark_raise_marks(buf, marks: bool | None) -> None:
    _Q.pack_into(buf, _OFF_RAISE_MARKS, {True: 1, False: 2}.get(marks, 0))


def read_device(path: str | os.PathLike) -> str:
    """The device the recorder saw first ('cpu', 'cuda', 'unknown'): one read of the header."""
    fd = os.open(path, os.O_RDONLY)
    try:
        raw = os.pread(fd, _STATIC.size, 0)
    finally:
        os.close(fd)
    if len(raw) < _STATIC.size or raw[:8] != MAGIC:
        raise ValueError(f"{path} is not a gpulab trace log")
    return _cstr(_STATIC.unpack(raw)[9])


def trim(path: str | os.PathLike) -> int:
    """Cut a closed log whose ring never wrapped down to what was recorded; -> the new size."""
    with open(path, "r+b") as fh:
        head = fh.read(COUNTERS_OFF + _COUNTERS.size)
        lay, _ = _header(head, path)
        started = _COUNTERS.unpack_from(head, COUNTERS_OFF)[0]
        size = lay.used_size(started)
        if size < os.fstat(fh.fileno()).st_size:
            fh.truncate(size)
        return size


@dataclass(frozen=True)
class Shrunk:
    """What `shrink` did to one log: apparent sizes before and after, and the regions kept whole."""
    path: str
    before: int
    after: int
    kept_whole: tuple[str, ...] = ()   # "ops", "memory", "strings": regions that wrapped (all their bytes count)


def shrink(path: str | os.PathLike) -> Shrunk:
    """Rewrite a finished log (its writer has ended) with each region cut to what was recorded; -> Shrunk.

    Why: the regions are sized at creation for the worst case (a 4 MiB string table, 16384 memory samples),
    and a finished log is mostly empty. The file is sparse on disk, but a copy or an upload expands it, so
    the team receives every empty byte. A region that never wrapped holds its entries at offset = id, so it
    keeps every id when its capacity is cut to its used extent; a region that wrapped is kept whole (its
    entries sit at id % capacity). The op ring's capacity stays as recorded (`Snapshot.capacity`); only its
    unwritten tail is left out, as `trim` (the writer's own cut at close, ops only) does; a writer that was
    killed never trims, so the parent that ran it shrinks. `read` gives the same Snapshot before and after. Written to
    a temporary file and renamed, so a reader sees the old file or the new one, never half of it.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        head = fh.read(HEADER_SIZE)
        before = os.fstat(fh.fileno()).st_size
        lay, static = _header(head, path)
        if len(head) < HEADER_SIZE:
            return Shrunk(str(path), before, before)
        started, *_c, memcount, _ns, strpos, _gn = _COUNTERS.unpack_from(head, COUNTERS_OFF)
        wrapped = {"ops": started > lay.capacity, "memory": memcount > lay.mem_capacity,
                   "strings": strpos > lay.string_capacity}
        kept = tuple(k for k, w in wrapped.items() if w)
        memcap = lay.mem_capacity if wrapped["memory"] else max(1, memcount)
        strcap = lay.string_capacity if wrapped["strings"] else min(lay.string_capacity, max(PAGE, -(-strpos // 8) * 8))
        new = Layout(lay.slot_size, lay.capacity, memcap, strcap)
        n_slots = min(started, lay.capacity)
        size = new.slots_off + n_slots * lay.slot_size
        if size >= before:
            return Shrunk(str(path), before, before, kept)
        fh.seek(lay.mem_off)
        mem = fh.read(memcap * MEM_SIZE)
        fh.seek(lay.strings_off)
        strings = fh.read(strcap)
        fh.seek(lay.slots_off)
        slots = fh.read(n_slots * lay.slot_size)
    magic, version, slot, cap, _mc, _sc, *rest = static
    header = bytearray(head)
    _STATIC.pack_into(header, 0, magic, version, slot, cap, memcap, strcap, *rest)
    # a region cut short on disk (a log trimmed or cut off) stays short only at the end: pad the others
    body = (bytes(header) + mem.ljust(memcap * MEM_SIZE, b"\0") + strings.ljust(strcap, b"\0") + slots)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.shrink")
    try:
        with open(tmp, "wb") as out:
            out.write(body)
        os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return Shrunk(str(path), before, len(body), kept)
