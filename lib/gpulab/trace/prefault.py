"""Pages of the op log mapped writable just ahead of each region's write frontier, so that the recorder's hot
path never takes a page fault while the file only takes disk space for what was (nearly) recorded."""
from __future__ import annotations

import mmap

from gpulab.trace.ring import HEADER_SIZE, MEM_SIZE, PAGE, Layout

_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14
# how far ahead of each region's write frontier pages are kept mapped writable at most (see Prefault)
# (slots: ~0.2 s of a busy eager step's records, the background thread's slowest poll being 0.1 s) ...
_AHEAD = {"slots": 1 << 20, "strings": 64 << 10, "memory": 16 << 10}
# ... and at least: ahead grows with what the region holds (a process that recorded little, a DataLoader worker
# of a short epoch, a launcher, keeps a small file; one that records fast reaches the full reach within its
# first megabyte)
_AHEAD_MIN = 64 << 10


class Prefault:
    """Keeps the pages just ahead of each region's write frontier mapped writable, so that the hot path
    never takes a page fault, while the file only takes disk space for what was (nearly) recorded.

    The first store to a page of a fresh sparse file mapping faults into the kernel (block allocation,
    page-cache page, page-table entry): ~5 us per 4 KiB page, i.e. ~0.1 us per op over a page's 64 slots.
    The recorder's background thread calls `step` every poll; MADV_POPULATE_WRITE maps a chunk in one
    call. Kernels without it: no prefault (faults then happen on the hot path, correct but slower)."""

    def __init__(self, mm: mmap.mmap, lay: Layout):
        self.mm, self.lay = mm, lay
        self.ok = True
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
        except (OSError, ValueError, AttributeError):
            self.ok = False

    def step(self, frontiers: dict[str, int]) -> None:
        """frontiers: bytes written so far into each region (>= its size once a ring wrapped)."""
        for name, used in frontiers.items():
            off, size = self.regions[name]
            want = min(size, used + min(_AHEAD[name], max(_AHEAD_MIN, used)))
            if want > self.end[name]:
                self._populate(off + self.end[name], off + want)
                self.end[name] = want
