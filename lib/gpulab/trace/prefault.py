"""Pages of the op log mapped writable just ahead of each region's write frontier, so that the recorder's hot
path never takes a page fault while the file only takes disk space for what was (nearly) recorded; and the
whole log reserved on disk once a process proves long-lived (its slot ring wraps), so that a job watched for
days holds a constant folder and a disk that fills later can never fault the program's own stores (SIGBUS)."""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os

from gpulab.trace.ring import HEADER_SIZE, MEM_SIZE, PAGE, Layout

_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14
# how far ahead of each region's write frontier pages are kept mapped writable at most (see Prefault)
# (slots: ~0.2 s of a busy eager step's records, the background thread's slowest poll being 0.1 s) ...
_AHEAD = {"slots": 1 << 20, "strings": 64 << 10, "memory": 16 << 10}
# ... and at least: ahead grows with what the region holds (a process that recorded little, a DataLoader worker
# of a short epoch, a launcher, keeps a small file; one that records fast reaches the full reach within its
# first megabyte)
_AHEAD_MIN = 64 << 10
# errors that say the disk (or memory, for a tmpfs) is full: a store into such a page would raise SIGBUS
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EFAULT, errno.ENOMEM, errno.EIO, errno.EDQUOT})


def _fallocate():
    """glibc's fallocate(2), never posix_fallocate: its emulation on file systems without fallocate writes
    zero bytes into blocks it reads as holes, which races with the recorder's own stores."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    fn.restype = ctypes.c_int
    return fn


_FALLOCATE = _fallocate()


def reserve(fd: int, size: int) -> int:
    """Allocate the file's blocks [0, size) without changing its data; 0 or the errno (EOPNOTSUPP where the
    file system cannot: the file stays sparse, as before)."""
    if _FALLOCATE is None:
        return errno.EOPNOTSUPP
    if _FALLOCATE(fd, 0, 0, size) == 0:
        return 0
    return ctypes.get_errno() or errno.EIO


class Prefault:
    """Keeps the pages just ahead of each region's write frontier mapped writable, so that the hot path
    never takes a page fault, while the file only takes disk space for what was (nearly) recorded.

    The first store to a page of a fresh sparse file mapping faults into the kernel (block allocation,
    page-cache page, page-table entry): ~5 us per 4 KiB page, i.e. ~0.1 us per op over a page's 64 slots.
    The recorder's background thread calls `step` every poll; MADV_POPULATE_WRITE maps a chunk in one
    call. Kernels without it: no prefault (faults then happen on the hot path, correct but slower).

    Once the slot ring wraps, the process is one that lives and records (a training loop, not a DataLoader
    worker of one epoch): the whole file is reserved at once (fallocate), so its folder stops growing as the
    string table and memory ring fill over hours. `full` turns true when the disk refused a page or the
    reservation: the recorder must stop writing, or the program's next store into an unbacked page is a
    SIGBUS that kills it."""

    def __init__(self, mm: mmap.mmap, lay: Layout, fd: int | None = None):
        self.mm, self.lay, self.fd = mm, lay, fd
        self.ok = True
        self.full = False
        self.reserved = False
        self.regions = {"memory": (lay.mem_off, lay.mem_capacity * MEM_SIZE),
                        "strings": (lay.strings_off, lay.string_capacity),
                        "slots": (lay.slots_off, lay.capacity * lay.slot_size)}
        self.end = {name: 0 for name in self.regions}
        self._populate(0, HEADER_SIZE)

    def _populate(self, start: int, end: int) -> None:
        start -= start % PAGE
        end = min(len(self.mm), -(-end // PAGE) * PAGE)
        if not self.ok or end <= start:
            return
        try:
            self.mm.madvise(_MADV_POPULATE_WRITE, start, end - start)
        except OSError as e:
            self.ok = False
            self.full = self.full or e.errno in FULL_ERRNOS
        except (ValueError, AttributeError):
            self.ok = False

    def step(self, frontiers: dict[str, int]) -> None:
        """frontiers: bytes written so far into each region (>= its size once a ring wrapped)."""
        for name, used in frontiers.items():
            off, size = self.regions[name]
            want = min(size, used + min(_AHEAD[name], max(_AHEAD_MIN, used)))
            if want > self.end[name]:
                self._populate(off + self.end[name], off + want)
                self.end[name] = want
        if not self.reserved and self.fd is not None and frontiers.get("slots", 0) >= self.regions["slots"][1]:
            self.reserved = True
            err = reserve(self.fd, len(self.mm))
            self.full = self.full or err in FULL_ERRNOS
