"""GPU progress per op without a host sync: after an op returns, the recorder enqueues on the op's stream a
marker that the GPU completes in stream order, and the log's GPU page (gpulab.trace.ring) says per stream
which op's marker completed last. After a stall, the first op on a stream above that stream's counter is
the op whose GPU work never completed, even when the host waits somewhere else (the sync line lies).

Mechanisms, best first (`choose` picks the first that works; the log's header names the one used):
  memop-ring    `cuStreamWriteValue64` (a stream memory op: ordered after the stream's earlier work) writes
                the op's seq straight into the log's GPU page, registered with `cuMemHostRegister
                (DEVICEMAP)`: the GPU itself keeps the crash-safe log current; no thread, no GIL, visible
                to the watchdog at once. One driver call per op.
  memop-pinned  the same write into pinned host memory, copied into the log every millisecond by the
                recorder's background thread (when the driver or kernel refuses to pin file pages).
  events        a CUDA event per op from a pre-allocated pool, recorded through the driver API, queried
                by a poller thread (when stream memory ops are not supported, as on many hosts whose
                nvidia module sets NVreg_EnableStreamMemOPs=0).

Who emits: with the C hot path (gpulab.trace.native) `end()` emits the marker itself and, for events, a
native thread polls each stream's own event ring without the GIL (newest first, else a binary search:
a stream completes in order); the Python trackers below then only set up (`native_spec`, `stream_pool`)
and clean up. Without it, the recorder's Python `after()` emits and its background thread polls.

libcuda is reached through ctypes (torch has loaded it already): nothing here is imported before CUDA is
in use, and without a driver `load()` returns None and the recorder stays in plain `ops` recording.
"""
from __future__ import annotations

import collections
import contextlib
import ctypes
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from gpulab.trace.ring import _OFF_NSTREAMS, GPU_PAGE_OFF, MAX_STREAMS, PAGE, STREAM_SIZE, _Q, _q

MECHANISMS = ("memop-ring", "memop-pinned", "events")
PREFERENCES = ("auto", *MECHANISMS)
PROBE_INDEX = MAX_STREAMS - 1          # the GPU page's last entry: scratch for the install-time check
EVENT_POOL = 8192                      # > the deepest launch queue: an event is never re-recorded while pending
STREAM_EVENT_POOL = 4096               # per stream, C hot path: a full ring skips markers, never reuses a pending one
NATIVE_MEMOP, NATIVE_EVENTS = 0, 1     # the C hot path's mechanism kinds (hotpath.c G_MEMOP, G_EVENTS)

CUDA_SUCCESS, CUDA_ERROR_NOT_READY, CUDA_ERROR_INVALID_CONTEXT = 0, 600, 201
CU_STREAM_CAPTURE_MODE_RELAXED = 2
ATTR_CAN_MAP_HOST_MEMORY = 19
ATTR_UNIFIED_ADDRESSING = 41
ATTR_CAN_USE_STREAM_MEM_OPS = 92
ATTR_CAN_USE_64_BIT_STREAM_MEM_OPS = 93
ATTR_HOST_REGISTER_SUPPORTED = 99
HOSTREGISTER_PORTABLE, HOSTREGISTER_DEVICEMAP = 1, 2
HOSTALLOC_PORTABLE, HOSTALLOC_DEVICEMAP = 1, 2
EVENT_DISABLE_TIMING = 2
STREAM_NON_BLOCKING = 1


class CudaError(RuntimeError):
    def __init__(self, call: str, code: int, name: str = ""):
        super().__init__(f"{call} failed: CUresult {code}{' ' + name if name else ''}")
        self.call, self.code = call, code


# ---------------------------------------------------------------------------------------------- driver

_P, _U64, _U32, _I = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint, ctypes.c_int
_SIGNATURES = {  # name (first found wins) -> argtypes
    ("cuInit",): [_U32],
    ("cuDeviceGet",): [ctypes.POINTER(_I), _I],
    ("cuDeviceGetCount",): [ctypes.POINTER(_I)],
    ("cuDeviceGetAttribute",): [ctypes.POINTER(_I), _I, _I],
    ("cuDriverGetVersion",): [ctypes.POINTER(_I)],
    ("cuCtxGetCurrent",): [ctypes.POINTER(_P)],
    ("cuCtxSetCurrent",): [_P],
    ("cuCtxPushCurrent_v2", "cuCtxPushCurrent"): [_P],
    ("cuCtxPopCurrent_v2", "cuCtxPopCurrent"): [ctypes.POINTER(_P)],
    ("cuDevicePrimaryCtxRetain",): [ctypes.POINTER(_P), _I],
    ("cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"): [_I],
    ("cuMemHostRegister_v2", "cuMemHostRegister"): [_P, ctypes.c_size_t, _U32],
    ("cuMemHostUnregister",): [_P],
    ("cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer"): [ctypes.POINTER(_U64), _P, _U32],
    ("cuMemHostAlloc",): [ctypes.POINTER(_P), ctypes.c_size_t, _U32],
    ("cuMemFreeHost",): [_P],
    ("cuStreamWriteValue64_v2", "cuStreamWriteValue64"): [_P, _U64, _U64, _U32],
    ("cuStreamCreate",): [ctypes.POINTER(_P), _U32],
    ("cuStreamQuery",): [_P],
    ("cuStreamIsCapturing",): [_P, ctypes.POINTER(_I)],
    ("cuThreadExchangeStreamCaptureMode",): [ctypes.POINTER(_I)],
    ("cuStreamDestroy_v2", "cuStreamDestroy"): [_P],
    ("cuEventCreate",): [ctypes.POINTER(_P), _U32],
    ("cuEventRecord",): [_P, _P],
    ("cuEventQuery",): [_P],
    ("cuEventDestroy_v2", "cuEventDestroy"): [_P],
    ("cuGetErrorName",): [_I, ctypes.POINTER(ctypes.c_char_p)],
}


class Driver:
    """The few libcuda entry points the trackers use, by their CUDA 12 names (older names as fallback)."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self.fn: dict[str, Callable[..., int]] = {}
        for names, argtypes in _SIGNATURES.items():
            for n in names:
                f = getattr(lib, n, None)
                if f is not None:
                    f.argtypes, f.restype = argtypes, ctypes.c_int
                    self.fn[names[0]] = f
                    break

    def has(self, name: str) -> bool:
        return name in self.fn

    def error_name(self, code: int) -> str:
        s = ctypes.c_char_p()
        if self.has("cuGetErrorName") and self.fn["cuGetErrorName"](code, ctypes.byref(s)) == 0 and s.value:
            return s.value.decode()
        return ""

    def __call__(self, name: str, *args) -> None:
        if name not in self.fn:
            raise CudaError(name, -1, "not exported by this libcuda")
        code = self.fn[name](*args)
        if code != CUDA_SUCCESS:
            raise CudaError(name, code, self.error_name(code))

    def attribute(self, attr: int, device: int) -> int | None:
        v, d = _I(), _I()
        try:
            self("cuDeviceGet", ctypes.byref(d), device)
            self("cuDeviceGetAttribute", ctypes.byref(v), attr, d.value)
        except CudaError:
            return None
        return v.value

    def primary_context(self, device: int) -> int:
        ctx, d = _P(), _I()
        self("cuDeviceGet", ctypes.byref(d), device)
        self("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), d.value)
        return ctx.value or 0


def load() -> Driver | None:
    """libcuda, or None on a machine without the NVIDIA driver (then nothing GPU-side is attempted)."""
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        drv = Driver(lib)
        try:
            drv("cuInit", 0)
        except CudaError:
            return None
        return drv
    return None


@dataclass(frozen=True)
class Support:
    """What the driver says it can do (reported by the GPU check; `choose` still verifies by doing)."""
    driver_version: int | None
    devices: int
    stream_mem_ops: bool | None          # cuStreamWriteValue64 exported and the 64-bit attribute set
    host_register: bool | None
    unified_addressing: bool | None
    attributes: dict

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def support(drv: Driver | None, device: int = 0) -> Support:
    if drv is None:
        return Support(None, 0, None, None, None, {})
    ver, n = _I(), _I()
    try:
        drv("cuDriverGetVersion", ctypes.byref(ver))
        drv("cuDeviceGetCount", ctypes.byref(n))
    except CudaError:
        return Support(None, 0, None, None, None, {})
    attrs = {name: drv.attribute(a, device) for name, a in (
        ("can_map_host_memory", ATTR_CAN_MAP_HOST_MEMORY), ("unified_addressing", ATTR_UNIFIED_ADDRESSING),
        ("can_use_stream_mem_ops", ATTR_CAN_USE_STREAM_MEM_OPS),
        ("can_use_64_bit_stream_mem_ops", ATTR_CAN_USE_64_BIT_STREAM_MEM_OPS),
        ("host_register_supported", ATTR_HOST_REGISTER_SUPPORTED))}
    mem_ops = drv.has("cuStreamWriteValue64_v2") and bool(attrs["can_use_64_bit_stream_mem_ops"]) if n.value else None
    return Support(ver.value, n.value, mem_ops, bool(attrs["host_register_supported"]) if n.value else None,
                   bool(attrs["unified_addressing"]) if n.value else None, attrs)


# ---------------------------------------------------------------------------------------------- trackers

class Tracker:
    """Enqueues one completion marker per op and makes the GPU page of the log say what completed.

    `emit(stream_handle, target, seq, flags) -> CUresult` is called on the hot path (for the memops it is
    the ctypes function itself: no Python frame in between); `target(index)` gives the per-stream value
    passed as `target`; `poll()` runs on the recorder's background thread; `close()` at uninstall."""
    mechanism = ""
    needs_poll = False
    emit: Callable[..., int]

    def __init__(self, drv: Driver, buf):
        self.drv, self.buf = drv, buf
        self.contexts: dict[int, int] = {}   # device -> primary context
        self.native = None                   # the C hot path once it emits the markers (attach)

    def target(self, index: int, device: int):
        raise NotImplementedError

    def native_spec(self) -> tuple[int, tuple[int, int, int, int, int]]:
        """(kind, addresses of (emit, query, cuCtxSetCurrent, cuCtxPushCurrent, cuCtxPopCurrent)) for
        the C hot path's gpu_start."""
        raise NotImplementedError

    def address(self, name: str) -> int:
        """A driver entry point's address for the C hot path (0: this driver has none)."""
        fn = self.drv.fn.get(name)
        return ctypes.cast(fn, ctypes.c_void_p).value or 0 if fn is not None else 0

    def _addresses(self, emit: str, query: str | None) -> tuple[int, int, int, int, int]:
        return tuple(self.address(n) if n else 0
                     for n in (emit, query, "cuCtxSetCurrent", "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2"))

    def attach(self, hot) -> None:
        """The C hot path emits the markers from now on (and polls events on its own thread)."""
        self.native = hot

    def poll(self) -> None:
        pass

    def drain(self, timeout_s: float = 1.0) -> None:
        """At uninstall: give pending markers a moment to land (never blocks longer than timeout_s)."""
        self.poll()

    def close(self) -> None:
        pass


def _address(buf) -> int:
    """Host address of a writable buffer (the log's mmap); the ctypes view is dropped at once so that the
    mmap can still be closed."""
    view = ctypes.c_char.from_buffer(buf)
    try:
        return ctypes.addressof(view)
    finally:
        del view


class MemopTracker(Tracker):
    """cuStreamWriteValue64 of the op's seq into a host-mapped word per stream."""
    mechanism = "memop-ring"

    def __init__(self, drv: Driver, buf, pinned: bool):
        super().__init__(drv, buf)
        self.emit = drv.fn["cuStreamWriteValue64_v2"]
        self.pinned = pinned
        self.host = 0          # registered (ring) or allocated (pinned) host address of the entries
        self.dev_ptr = 0
        if pinned:
            self.mechanism = "memop-pinned"
            self.needs_poll = True
            p = _P()
            drv("cuMemHostAlloc", ctypes.byref(p), PAGE, HOSTALLOC_PORTABLE | HOSTALLOC_DEVICEMAP)
            self.host = p.value
            ctypes.memset(self.host, 0xFF, PAGE)   # every done = -1
            self.words = (ctypes.c_int64 * (PAGE // 8)).from_address(self.host)
        else:
            self.host = _address(buf) + GPU_PAGE_OFF
            drv("cuMemHostRegister_v2", ctypes.c_void_p(self.host), PAGE,
                HOSTREGISTER_PORTABLE | HOSTREGISTER_DEVICEMAP)
        d = _U64()
        try:
            drv("cuMemHostGetDevicePointer_v2", ctypes.byref(d), ctypes.c_void_p(self.host), 0)
        except CudaError:
            self.close()
            raise
        self.dev_ptr = d.value
        self.seen = [-1] * MAX_STREAMS

    def native_spec(self):
        return NATIVE_MEMOP, self._addresses("cuStreamWriteValue64_v2", None)

    def target(self, index: int, device: int = 0) -> int:
        """Device address of stream `index`'s done word (the entry's first field)."""
        return self.dev_ptr + index * STREAM_SIZE

    def poll(self) -> None:
        """memop-pinned: copy each stream's done word into the log (a plain read of pinned memory)."""
        if not self.pinned:
            return
        words, seen, buf = self.words, self.seen, self.buf
        for i in range(min(_Q.unpack_from(buf, _OFF_NSTREAMS)[0], MAX_STREAMS)):
            v = words[i * (STREAM_SIZE // 8)]
            if v != seen[i]:
                seen[i] = v
                buf[GPU_PAGE_OFF + i * STREAM_SIZE:GPU_PAGE_OFF + i * STREAM_SIZE + 8] = v.to_bytes(8, "little",
                                                                                                    signed=True)

    def read(self, index: int) -> int:
        """The done word of entry `index` as the GPU left it."""
        if self.pinned:
            return self.words[index * (STREAM_SIZE // 8)]
        return _q.unpack_from(self.buf, GPU_PAGE_OFF + index * STREAM_SIZE)[0]

    def close(self) -> None:
        host, self.host = self.host, 0
        if not host:
            return
        try:
            if self.pinned:
                self.poll()
                self.words = None
                self.drv("cuMemFreeHost", ctypes.c_void_p(host))
            else:
                self.drv("cuMemHostUnregister", ctypes.c_void_p(host))
        except CudaError:
            pass


@contextlib.contextmanager
def relaxed_capture_mode(drv: Driver) -> Iterator[None]:
    """The calling thread in relaxed stream-capture mode meanwhile, then as it was: an event query from a thread
    in the default global mode invalidates a CUDA graph capture running in any other thread (as PyTorch's NCCL
    watchdog knows), and a poll may run on the program's own thread (drain), whose mode stays its own. The
    trackers never query an event recorded in a capture."""
    fn = drv.fn.get("cuThreadExchangeStreamCaptureMode")
    mode = _I(CU_STREAM_CAPTURE_MODE_RELAXED)
    swapped = fn is not None and fn(ctypes.byref(mode)) == CUDA_SUCCESS
    try:
        yield
    finally:
        if swapped:
            fn(ctypes.byref(mode))   # mode now holds the thread's own


class EventTracker(Tracker):
    """A pooled CUDA event per op (driver API: no torch.cuda.Event objects on the hot path)."""
    mechanism = "events"
    needs_poll = True

    def __init__(self, drv: Driver, buf, contexts: dict, pool: int = EVENT_POOL):
        super().__init__(drv, buf)
        self.contexts = contexts          # events belong to a context
        self.pools: dict[int, list[int]] = {}
        self.next: dict[int, int] = {}
        self.pool = pool
        self.queues: dict[int, collections.deque] = {}
        self.devices: dict[int, int] = {}
        self.lock = threading.Lock()
        self.record = drv.fn["cuEventRecord"]
        self.query = drv.fn["cuEventQuery"]
        self.stream_pools: list[tuple[int, list[int]]] = []   # (device, events) made for the C hot path

    def native_spec(self):
        return NATIVE_EVENTS, self._addresses("cuEventRecord", "cuEventQuery")

    def attach(self, hot) -> None:
        super().attach(hot)
        self.needs_poll = False   # the C poller thread keeps the page current

    def _create(self, device: int, n: int) -> list[int]:
        """n events of the device's context (events belong to a context)."""
        ctx = self.contexts.get(device)
        if ctx:
            self.drv("cuCtxPushCurrent_v2", _P(ctx))
        evs: list[int] = []
        try:
            for _ in range(n):
                e = _P()
                self.drv("cuEventCreate", ctypes.byref(e), EVENT_DISABLE_TIMING)
                evs.append(e.value)
        except CudaError:
            self._destroy(evs)
            raise
        finally:
            if ctx:
                self.drv("cuCtxPopCurrent_v2", ctypes.byref(_P()))
        return evs

    def _destroy(self, evs: list[int]) -> None:
        for e in evs:
            try:
                self.drv("cuEventDestroy_v2", _P(e))
            except CudaError:
                pass

    def stream_pool(self, device: int, n: int | None = None) -> list[int]:
        """A stream's own events for the C hot path (its ring never re-records a pending one)."""
        evs = self._create(device, n or STREAM_EVENT_POOL)
        self.stream_pools.append((device, evs))
        return evs

    def _events(self, device: int) -> list[int]:
        """The device's pool, made on first use in the device's context (events belong to a context)."""
        evs = self.pools.get(device)
        if evs is None:
            evs = self.pools[device] = self._create(device, self.pool)
            self.next[device] = 0
        return evs

    def target(self, index: int, device: int = 0) -> tuple:
        self._events(device)
        q = self.queues[index] = collections.deque()
        self.devices[index] = device
        return (index, device, q)

    def emit(self, handle, target, seq, flags=0) -> int:
        index, device, q = target
        evs = self.pools[device]
        k = self.next[device]
        self.next[device] = (k + 1) % self.pool
        ev = evs[k]
        code = self.record(ev, handle)
        if code == CUDA_SUCCESS:
            q.append((seq, ev))
        return code

    def poll(self) -> None:
        """Newest completed event per stream, in order (a stream completes its work in order)."""
        with relaxed_capture_mode(self.drv):
            self._poll()

    def _poll(self) -> None:
        buf, query = self.buf, self.query
        for index, q in list(self.queues.items()):
            done = None
            with self.lock:
                while q:
                    seq, ev = q[0]
                    code = query(ev)
                    if code == CUDA_ERROR_NOT_READY:
                        break
                    if code == CUDA_ERROR_INVALID_CONTEXT:
                        ctx = self.contexts.get(self.devices.get(index, 0))
                        if ctx:
                            self.drv.fn["cuCtxSetCurrent"](ctx)
                        break
                    q.popleft()
                    if code == CUDA_SUCCESS:
                        done = seq
            if done is not None:
                off = GPU_PAGE_OFF + index * STREAM_SIZE
                buf[off:off + 8] = done.to_bytes(8, "little", signed=True)

    def drain(self, timeout_s: float = 1.0) -> None:
        deadline = time.monotonic() + timeout_s
        while (any(self.queues.values()) or (self.native is not None and self.native.gpu_pending())) \
                and time.monotonic() < deadline:
            self.poll()
            time.sleep(0.001)

    def close(self) -> None:
        if self.native is not None:
            self.native.gpu_stop()   # before its events are destroyed
        self.poll()
        for evs in [*self.pools.values(), *(evs for _, evs in self.stream_pools)]:
            self._destroy(evs)
        self.pools.clear()
        self.stream_pools.clear()


# ---------------------------------------------------------------------------------------------- choosing

def _verify_memop(drv: Driver, tracker: MemopTracker, timeout_s: float = 1.0) -> None:
    """Write a value with the tracker on a private non-blocking stream and see it land in the log: the
    driver can accept the registration and still not deliver (a page it could not really pin). Waits
    only on its own stream, never on the program's work."""
    s = _P()
    drv("cuStreamCreate", ctypes.byref(s), STREAM_NON_BLOCKING)
    try:
        value = 0x6770756C6162  # "gpulab"
        code = tracker.emit(s.value, tracker.target(PROBE_INDEX), value, 0)
        if code != CUDA_SUCCESS:
            raise CudaError("cuStreamWriteValue64", code, drv.error_name(code))
        deadline = time.monotonic() + timeout_s
        while True:
            if tracker.read(PROBE_INDEX) == value:
                return
            if time.monotonic() > deadline:
                raise CudaError("stream memop check", -2, f"value not seen in {timeout_s:g} s")
            time.sleep(0.001)
    finally:
        drv.fn["cuStreamDestroy_v2"](s)


def check_preference(name: str) -> None:
    if name not in PREFERENCES:
        raise ValueError(f"gpu_mechanism={name!r} is not valid; choose one of {', '.join(PREFERENCES)}")


def choose(drv: Driver, buf, preference: str = "auto", device: int = 0) -> tuple[Tracker | None, list[str]]:
    """The first mechanism (in MECHANISMS order, or only `preference`) that installs and verifies on
    `device`; -> (tracker or None, why each earlier one was passed over). Needs a current context (called
    from the thread that just ran a CUDA op)."""
    check_preference(preference)
    order = MECHANISMS if preference == "auto" else (preference,)
    notes: list[str] = []
    contexts = {}
    try:
        contexts[device] = drv.primary_context(device)
    except CudaError as exc:
        notes.append(f"primary context: {exc}")
    for mech in order:
        tracker = None
        try:
            if mech.startswith("memop"):
                if not drv.has("cuStreamWriteValue64_v2"):
                    raise CudaError("cuStreamWriteValue64", -1, "not exported by this libcuda")
                if drv.attribute(ATTR_CAN_USE_64_BIT_STREAM_MEM_OPS, device) == 0:
                    raise CudaError("cuDeviceGetAttribute", -1, "CAN_USE_64_BIT_STREAM_MEM_OPS is 0")
                tracker = MemopTracker(drv, buf, pinned=mech == "memop-pinned")
                _verify_memop(drv, tracker)
            else:
                tracker = EventTracker(drv, buf, contexts)
                tracker._destroy(tracker._create(device, 1))   # events can be made here (pools come on use)
            tracker.contexts = contexts
            return tracker, notes
        except (CudaError, OSError, ValueError) as exc:
            notes.append(f"{mech}: {exc}")
            if tracker is not None:
                tracker.close()
    return None, notes
