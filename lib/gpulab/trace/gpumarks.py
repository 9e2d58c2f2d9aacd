"""GPU progress markers (modes `auto` and `gpu`): picking the mechanism, giving each stream its log entry,
retrying or stopping on driver errors. Apart from the recorder because it is a state machine of its own over
the driver (gpulab.trace.gpu) that both hot paths share. Closures, not a class, as in gpulab.trace.texts: the
Python hot path calls `mark` per op, and the recorder's `track` stays its cell, switched via `track_gpu`."""
from __future__ import annotations

import ctypes
from typing import Any, Callable

from gpulab.trace import gpu as gpu_mod  # ctypes only: CUDA is touched once the program uses it
from gpulab.trace import ring
from gpulab.trace.ring import (_OFF_GPU_SINCE, _OFF_MECHANISM, _OFF_STARTED, _OFF_STREAM, GPU_PAGE_OFF, MAX_STREAMS,
                               STREAM_SIZE, _Q, _q)


def gpu_marks(rec: Any, torch: Any, hot: Any, intern: Callable[[bytes], int], track_gpu: Callable[[bool], None],
              mv_q: memoryview, mv_h: memoryview) -> tuple[Callable[[], None], Callable[[int, int], None]]:
    """(start, mark): start() on the first op after CUDA initialized, mark(seq, dev) after each op while the
    Python path tracks (dev: the op's CUDA device, -2 for no tensor: the current one). mv_q/mv_h: the
    recorder's views of the log (it releases them)."""
    mm = rec._mm
    lay = rec.layout
    cap, slot_size, slots = lay.capacity, lay.slot_size, lay.slots_off
    pack_q = _q.pack_into
    h_stream = _OFF_STREAM // 2
    # stream key (handle << 6 | device) -> [index, word index of its `enqueued` field, target, emit, device]
    streams: dict = {}
    streams_get = streams.get
    entries: list = []
    gstate = {"tracker": None, "driver": None, "first_device": None, "contexts": {}, "errors": 0, "multi": False}
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    current_device = getattr(torch._C, "_cuda_getDevice", None)
    capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: False)

    def header_text(off: int, text: str) -> None:
        mm[off:off + 32] = text.encode()[:31].ljust(32, b"\0")

    def start_gpu() -> None:
        """First op after CUDA initialized: pick the mechanism (gpulab.trace.gpu.choose) or stay plain."""
        track_gpu(False)
        if raw_stream is None or current_device is None:
            header_text(_OFF_MECHANISM, "none: torch without CUDA")
            return
        drv = gpu_mod.load()
        if drv is None:
            header_text(_OFF_MECHANISM, "none: libcuda not loadable")
            return
        dev = current_device()
        try:
            tracker, notes = gpu_mod.choose(drv, mm, rec.gpu_mechanism, dev)
        except Exception as exc:  # noqa: BLE001 - recording must go on without GPU progress
            tracker, notes = None, [f"{type(exc).__name__}: {exc}"]
        rec.gpu_notes = tuple(notes)
        if notes:
            _Q.pack_into(mm, ring._OFF_GPU_NOTES, intern("; ".join(notes).encode()))
        if tracker is None:  # the 32-byte header field says none; the log's notes say why
            header_text(_OFF_MECHANISM, "none")
            return
        gstate.update(tracker=tracker, driver=drv, first_device=dev, contexts=tracker.contexts)
        header_text(_OFF_MECHANISM, tracker.mechanism)
        pack_q(mm, _OFF_GPU_SINCE, _Q.unpack_from(mm, _OFF_STARTED)[0] - 1)
        rec.tracker = tracker
        rec.gpu_path = "python"
        track_gpu(True)
        if hot is not None and start_native(tracker, dev):
            track_gpu(False)   # hot.end() marks each op; nothing left for the Python side to do

    def start_native(tracker, dev: int) -> bool:
        """Hand the markers to the C hot path (one call less per op, events polled without the GIL)."""
        kind, fns = tracker.native_spec()

        def on_stream(d: int, handle: int):
            claimed = claim_stream(d, handle)
            if claimed is None:
                return None
            n, _ = claimed
            target = tracker.target(n, d) if kind == gpu_mod.NATIVE_MEMOP else 0
            return n, context_of(d), target, tracker.stream_pool(d) if kind == gpu_mod.NATIVE_EVENTS else ()

        try:
            hot.gpu_start(kind, fns, raw_stream, current_device, capturing, on_stream, stop_gpu, GPU_PAGE_OFF,
                          STREAM_SIZE, gstate["contexts"].get(dev) or 0, mechanism_off=_OFF_MECHANISM,
                          capture_mode=tracker.address("cuThreadExchangeStreamCaptureMode"))
        except (TypeError, ValueError, OSError, RuntimeError) as exc:
            rec.gpu_notes += (f"native markers: {exc}",)
            _Q.pack_into(mm, ring._OFF_GPU_NOTES, intern("; ".join(rec.gpu_notes).encode()))
            return False
        tracker.attach(hot)
        rec.gpu_path = "native"
        return True

    def context_of(dev: int) -> int:
        ctxs = gstate["contexts"]
        if dev not in ctxs:
            ctxs[dev] = gstate["driver"].primary_context(dev)
        return ctxs[dev]

    def on_context(emit, ctx: int):
        """emit with the device's context pushed: once a second device is in use, stream handle 0 (the
        legacy default stream) would otherwise mean the current context's, maybe another device's."""
        drv = gstate["driver"]
        push, pop = drv.fn["cuCtxPushCurrent_v2"], drv.fn["cuCtxPopCurrent_v2"]
        popped = ctypes.c_void_p()
        ref = ctypes.byref(popped)

        def emit_on(handle, target, seq, flags):
            push(ctx)
            try:
                return emit(handle, target, seq, flags)
            finally:
                pop(ref)
        return emit_on

    def claim_stream(dev: int, handle: int) -> tuple[int, int] | None:
        """The next GPU progress entry of the log for (device, stream): (index, its offset), or None when
        the page is full (the stream's ops go untracked). Both hot paths claim through here."""
        if len(entries) >= MAX_STREAMS - 1:
            return None
        n = len(entries)
        if dev != gstate["first_device"]:
            context_of(dev)   # before the tracker makes anything of that device's
            gstate["multi"] = True
        off = ring.add_stream(mm, n, handle, dev)
        entries.append([n, (off + 8) >> 3, None, None, dev])
        return n, off

    def new_stream(dev: int, handle: int):
        """Python hot path: claim an entry and give it the tracker's target and emit; None when full."""
        key = handle << 6 | dev
        claimed = claim_stream(dev, handle)
        if claimed is None:
            streams[key] = None
            return None
        tracker = gstate["tracker"]
        entry = entries[claimed[0]]
        entry[2:4] = [tracker.target(claimed[0], dev), tracker.emit]
        streams[key] = entry
        if gstate["multi"]:
            try:
                for e in entries:
                    e[3] = on_context(tracker.emit, context_of(e[4]))
            except gpu_mod.CudaError:
                pass
        return entry

    def stop_gpu(why: str) -> None:
        """GPU progress tracking failed: record on as plain ops, and say why in the log's header."""
        track_gpu(False)
        header_text(_OFF_MECHANISM, f"stopped: {why}")
        _Q.pack_into(mm, ring._OFF_GPU_NOTES, intern(f"{'; '.join(rec.gpu_notes)}; stopped: {why}".lstrip("; ").encode()))

    def gpu_retry(code: int, handle: int, entry, seq: int) -> int:
        """A marker the driver refused: a thread without a current context gets the device's primary
        context and one retry; other errors are counted, and tracking stops after 100 of them."""
        drv = gstate["driver"]
        if code == gpu_mod.CUDA_ERROR_INVALID_CONTEXT:
            try:
                drv.fn["cuCtxSetCurrent"](context_of(entry[4]))
                code = entry[3](handle, entry[2], seq, 0)
            except gpu_mod.CudaError:
                pass
        if code:
            gstate["errors"] += 1
            if gstate["errors"] >= 100:
                stop_gpu(f"CUresult {code} {drv.error_name(code)}")
        return code

    def mark(seq: int, dev: int) -> None:
        """Completion marker on the op's stream, after its work (never a host sync)."""
        try:
            if capturing():
                return
            if dev < 0:
                dev = current_device()
            h = raw_stream(dev)
            e = streams_get(h << 6 | dev, 0)
            if e == 0:
                e = new_stream(dev, h)
            if e is None:
                return
            code = e[3](h, e[2], seq, 0)
            if code:
                code = gpu_retry(code, h, e, seq)
        except Exception as exc:  # noqa: BLE001 - recording must never break the program
            stop_gpu(f"{type(exc).__name__}: {exc}")
            return
        if not code:
            mv_q[e[1]] = seq
            mv_h[((slots + (seq % cap) * slot_size) >> 1) + h_stream] = e[0]

    return start_gpu, mark


def landed(tracker: Any, mm: Any) -> bool:
    """Every stream's newest marker has landed (or GPU tracking never started): until then the GPU may still
    write into the log's mapping, so the recorder must not free it."""
    if tracker is None:
        return True
    tracker.poll()
    n = _Q.unpack_from(mm, ring._OFF_NSTREAMS)[0]
    return not any(s.pending for s in ring._streams(mm, n))
