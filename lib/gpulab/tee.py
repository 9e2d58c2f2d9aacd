"""A watched job's output: shown live where gpulab's own output goes (the terminal, a scheduler's log), and
kept as a bounded tail on disk, whatever the job prints over days.

Why a pipe and two threads: the job writes into a pipe that one thread always drains (so the job never
blocks on it), appending to the tail file and queueing the bytes for a second thread that writes them to the
terminal. A terminal slower than the job (a paused tty, a slow log collector) fills that queue; past its
bound new bytes are dropped from the terminal only, and a line says how many. The tail file is two segments
of `keep` bytes each (the current one and the one before it), joined into one file of the last `keep`
bytes when the job ends.
"""
from __future__ import annotations

import collections
import contextlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path

KEEP_BYTES = 256 << 10      # the tail kept on disk per stream (a few thousand lines: the terminal got it all)
QUEUE_BYTES = 1 << 20       # bytes waiting for a slow terminal before new ones are dropped from it
CHUNK = 1 << 16


@dataclass(frozen=True)
class Kept:
    """What one stream's tail file holds at the end."""
    path: str
    written: int       # bytes the job wrote in all
    kept: int          # bytes in the tail file
    not_shown: int     # bytes the terminal never got (it was slower than the job)


class Tee:
    """One output stream of a job: `fd` is the write end to hand to the child (closed here once it started)."""

    def __init__(self, path: str | os.PathLike, echo_fd: int | None, keep: int = KEEP_BYTES,
                 queue_bytes: int = QUEUE_BYTES, name: str = "out"):
        if keep <= 0:
            raise ValueError(f"keep={keep!r} must be > 0 bytes")
        self.path = Path(path)
        self.prev = self.path.with_name(self.path.stem + ".prev" + self.path.suffix)
        self.keep, self.queue_bytes, self.echo_fd = keep, queue_bytes, echo_fd
        self.written = self.not_shown = self._queued = self._dropped_since = 0
        self._r, self.fd = os.pipe()
        self.prev.unlink(missing_ok=True)
        self._file = open(self.path, "wb")
        self._seg = 0
        self._queue: collections.deque[bytes] = collections.deque()
        self._cv = threading.Condition()
        self._eof = False
        self._pump = threading.Thread(target=self._drain, name=f"gpulab-tee-{name}", daemon=True)
        self._echo = threading.Thread(target=self._show, name=f"gpulab-tee-{name}-echo", daemon=True)
        self._pump.start()
        if echo_fd is not None:
            self._echo.start()

    def started(self) -> None:
        """The child holds its own copy of the write end now: drop ours, so the pipe ends with the job."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # -- the pump: never blocks on the terminal
    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self._r, CHUNK)
            except OSError:
                data = b""
            if not data:
                break
            self.written += len(data)
            self._store(data)
            if self.echo_fd is not None:
                with self._cv:
                    if self._queued + len(data) <= self.queue_bytes:
                        self._queue.append(data)
                        self._queued += len(data)
                    else:
                        self.not_shown += len(data)
                        self._dropped_since += len(data)
                    self._cv.notify()
        with self._cv:
            self._eof = True
            self._cv.notify()

    def _store(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            if self._seg + len(data) > self.keep and self._seg:
                self._file.close()
                os.replace(self.path, self.prev)
                self._file = open(self.path, "wb")
                self._seg = 0
            self._file.write(data)
            self._file.flush()
            self._seg += len(data)

    # -- the terminal: may block, costs only its own thread
    def _show(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._eof:
                    self._cv.wait()
                if not self._queue:
                    return
                data = self._queue.popleft()
                self._queued -= len(data)
                dropped, self._dropped_since = self._dropped_since, 0
            with contextlib.suppress(OSError):
                _write_all(self.echo_fd, data)
                if dropped:
                    _write_all(self.echo_fd, f"\n[gpulab watch: {dropped} bytes of the job's output not shown here "
                             f"(the terminal was slower than the job); the last ones are in {self.path.name}]\n"
                             .encode())

    def close(self, wait_s: float = 5.0) -> Kept:
        """After the job and everything holding the pipe ended: drain, join the tail into one file."""
        self.started()
        self._pump.join(wait_s)
        if self.echo_fd is not None:
            self._echo.join(min(wait_s, 2.0))   # a terminal that never takes its bytes is not waited for
        with contextlib.suppress(OSError):
            os.close(self._r)
        with contextlib.suppress(OSError):
            self._file.close()
        kept = join_tail(self.path, self.prev, self.keep, self.written)
        return Kept(str(self.path), self.written, kept, self.not_shown)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def join_tail(path: Path, prev: Path, keep: int, written: int) -> int:
    """The last `keep` bytes of prev + path into path (a first line says how much came before); -> its size."""
    if not prev.exists():
        return path.stat().st_size if path.exists() else 0
    cur = path.read_bytes() if path.exists() else b""
    need = max(0, keep - len(cur))
    with open(prev, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - need))
        old = fh.read()
    body = old + cur
    head = f"[gpulab watch: the job wrote {written} bytes here; the first {written - len(body)} are not kept]\n"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(head.encode() + body)
    os.replace(tmp, path)
    prev.unlink(missing_ok=True)
    return path.stat().st_size
