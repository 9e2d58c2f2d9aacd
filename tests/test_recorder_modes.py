"""The op log's format v2 and the recorder's modes on the CPU: the string table, readers in another process
while a child writes (and after it is SIGKILLed), logs sized to what was recorded, `auto` behaving as
`ops` without CUDA, the native and the Python hot paths writing the same records, and the GPU-progress
bookkeeping decided from recorded inputs (counters and records written by hand, as a GPU would leave them)."""
from __future__ import annotations

import json
import mmap
import shutil
import os
import sys
import textwrap
from pathlib import Path
import time

import hotpaths
import pytest

from gpulab import proc, trace
from gpulab.hang import verdict
from gpulab.trace import gpu, native, ring
from gpulab.trace.run import _child_env


pytestmark = pytest.mark.usefixtures("native_hot_path")  # conftest: built once, as launchers do


def _du(path) -> int:
    return os.stat(path).st_blocks * 512


# ------------------------------------------------------------------------------------------ string table

def _mapped(tmp_path, string_capacity=4096):
    log = ring.create(tmp_path / "s.log", "ops", capacity=8, mem_capacity=4, string_capacity=string_capacity)
    fh = open(log, "r+b")
    mm = mmap.mmap(fh.fileno(), 0)
    lay = ring.Layout(ring.SLOT_SIZE, 8, 4, string_capacity)
    return fh, mm, lay


@pytest.mark.parametrize("texts", [[b"aten.mm.default"], [b"x" * 700, b"", "caf\u00e9 \u2192 ok".encode()],
                                   [f"T|float32|{i},4|4,1|cpu".encode() for i in range(40)]])
def test_string_table_round_trip(tmp_path, texts):
    fh, mm, lay = _mapped(tmp_path)
    w = ring.StringWriter(mm, lay.strings_off, lay.string_capacity)
    ids = [w.add(t) for t in texts]
    data = bytes(mm)
    mm.close()
    fh.close()
    read = ring._Strings(data, lay)
    assert [read(i) for i in ids] == [t.decode() for t in texts]
    assert len(set(ids)) == len(ids) and all(i % 8 == 0 and i >= 8 for i in ids)


def test_string_table_wraps_and_a_reader_sees_evicted_entries(tmp_path):
    fh, mm, lay = _mapped(tmp_path)
    w = ring.StringWriter(mm, lay.strings_off, lay.string_capacity)
    ids = [w.add(f"string number {i:04d} ".encode() * 3) for i in range(200)]   # ~70 B each: ~3.5 laps
    assert w.lap >= 3
    data = bytes(mm)
    mm.close()
    fh.close()
    read = ring._Strings(data, lay)
    got = [read(i) for i in ids]
    assert got[-1] == "string number 0199 " * 3 and got[0] == ring.EVICTED
    assert all(g != ring.EVICTED for g in got[-40:])
    assert all(g == ring.EVICTED or g == f"string number {i:04d} " * 3 for i, g in enumerate(got))


@pytest.mark.parametrize("path", hotpaths.PATHS)
def test_live_recording_survives_a_wrapping_string_table(tmp_path, path):
    import torch

    log = tmp_path / "wrap.log"
    x = torch.ones(3)
    with trace.Recorder(log, capacity=8192, string_capacity=4096, **hotpaths.kw(path)) as rec:
        for i in range(400):
            x = torch.clamp(x, max=2.0 + i * 1e-4)   # a new float each op: a new argument summary each op
    rec.close()
    assert rec.hot_path == hotpaths.expected(path)
    snap = trace.read(log)
    top = hotpaths.top(snap.records)   # the observer also records the dtype conversion inside each clamp
    assert len(top) == 400 and len(snap.records) == snap.started and snap.torn == 0
    last = top[-1]
    assert last.name == "aten.clamp.default" and last.args[2] == {"value": repr(2.0 + 399 * 1e-4)}
    assert all(r.name in ("aten.clamp.default", ring.EVICTED) for r in top)
    tail = top[-50:]   # the newest records' texts are copied forward at each wrap
    assert all(r.name == "aten.clamp.default" and r.call_site.startswith("tests/test_recorder_modes.py:")
               and r.thread.startswith("MainThread") and r.args[1]["value"] != ring.EVICTED for r in tail)



def test_the_observers_argument_cache_stays_bounded_when_every_op_has_new_arguments(tmp_path):
    """A learning rate that changes every step gives an op new arguments every step: over days the cache of
    argument summaries must retire old entries (freed one generation later), not keep every one."""
    import torch

    if native.load_observer() is None:
        pytest.skip("the observer is not built here (no C++ compiler or torch headers)")
    x = torch.ones(3)
    with trace.Recorder(tmp_path / "lr.log", capacity=4096, **hotpaths.kw("observer")) as rec:
        for i in range(40_000):
            x = torch.clamp(x, max=2.0 + i * 1e-6)
        st = rec._mode_obj.stats()
    assert st["misses"] >= 40_000
    assert st["signatures"] < 1 << 14 and st["signatures_retired"] <= 1 << 14, st


# ------------------------------------------------------------------------------------------ another process

WRITER = textwrap.dedent("""
    import os, sys, time, torch
    x = torch.empty(8)
    one = x.fill_(1.0)
    for i in range(int(sys.argv[1])):   # ops that run no op inside them: one record each on every hot path
        x = x + one
        x = x * one
        if i % 100 == 0:
            x = torch.sigmoid(x)
            time.sleep(0.005)   # paced (no op): the reader must see the log while it is written, whichever
                                # hot path writes it (the native one wrote all 12k ops between two reads)
        if i and i % 1000 == 0:   # and every 1000, until the reader has read once more (a loaded host)
            until = time.monotonic() + 60
            while os.path.getsize(sys.argv[3]) < i // 1000 and time.monotonic() < until:
                time.sleep(0.01)
    open(sys.argv[2], "w").close()
    time.sleep(600)   # stays alive until SIGKILLed
""")


@pytest.mark.parametrize("path", hotpaths.PATHS)
def test_reader_in_another_process_during_writing_and_after_sigkill(tmp_path, path):
    script, log, done, seen = tmp_path / "writer.py", tmp_path / "w.log", tmp_path / "done", tmp_path / "seen"
    script.write_text(WRITER)
    seen.write_bytes(b"")   # a byte per read: the writer waits for the reader every 1000 iterations
    cmd = [sys.executable, "-m", "gpulab.trace", "--log", str(log), "--capacity", "2048", "--", str(script),
           "6000", str(done), str(seen)]
    names = {"aten.empty.memory_format", "aten.fill_.Scalar", "aten.add.Tensor", "aten.mul.Tensor",
             "aten.sigmoid.default"}
    snaps = []
    with proc.Child(cmd, env=dict(_child_env(), **hotpaths.env(path)), stdout=tmp_path / "out.txt",
                    stderr=tmp_path / "err.txt") as child:
        deadline = time.time() + 120
        while not done.exists():
            assert child.poll() is None, (tmp_path / "err.txt").read_text()
            assert time.time() < deadline, "the writer never finished"
            if log.exists() and trace.progress(log).started > 0:
                snaps.append(trace.read(log))
                with open(seen, "ab") as fh:
                    fh.write(b".")
            time.sleep(0.01)
        child.stop()  # SIGKILL of the whole group
    assert len(snaps) >= 5
    for s in snaps:
        seqs = [r.seq for r in s.records]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        # slots the writer overwrote while the file was being read are detected (the oldest end of the
        # ring); inside the range at most the slot being written at that moment is missing
        assert len(set(range(seqs[0], seqs[-1] + 1)) - set(seqs)) <= 1
        assert s.torn == s.started - s.dropped - len(seqs)
        assert {r.name for r in s.records} <= names
        assert all(r.t_end is not None for r in s.records[:-1])
        assert all("writer.py:" in r.call_site for r in s.records)
    assert [s.started for s in snaps] == sorted(s.started for s in snaps)
    final = trace.read(log)
    assert final.started == final.completed == 2 + 6000 * 2 + 60 and final.torn == 0
    assert final.dropped == final.started - 2048 and len(final.records) == 2048
    assert final.records[-1].name == "aten.mul.Tensor"


# ------------------------------------------------------------------------------------------ log size

def _record_tiny(log, n_ops, **kw):
    import torch

    x = torch.ones(2)
    with trace.Recorder(log, **kw) as rec:
        y = x
        for _ in range(n_ops):
            y = y + x   # no op inside it: one record each on every hot path
    return rec


@pytest.mark.parametrize("n_ops,max_kib", [(300, 256), (100_000, 8 * 1024)])
def test_log_disk_usage_tracks_what_was_recorded(tmp_path, n_ops, max_kib):
    log = tmp_path / "size.log"
    rec = _record_tiny(log, n_ops)
    during = _du(log)
    rec.close()
    after = _du(log)
    lay = rec.layout
    assert os.path.getsize(log) == lay.used_size(n_ops) < lay.size  # trimmed at close: the ring never wrapped
    assert after <= max_kib * 1024 and during <= max_kib * 1024 + 1024 * 1024, (during, after)
    snap = trace.read(log)
    assert snap.started == len(snap.records) == n_ops and snap.torn == 0


def test_a_wrapped_ring_keeps_its_size_and_reads_back(tmp_path):
    log = tmp_path / "wrapped.log"
    rec = _record_tiny(log, 5000, capacity=1024)
    rec.close()
    assert os.path.getsize(log) == rec.layout.size          # nothing to trim once every slot was used
    snap = trace.read(log)
    assert len(snap.records) == 1024 and snap.records[-1].seq == 4999 and snap.torn == 0


# ------------------------------------------------------------------------------------------ modes on the CPU

def _program():
    import torch
    import torch.nn.functional as F

    w = torch.randn(8, 8, requires_grad=True)
    q = torch.randn(1, 2, 8, 16)
    loss = torch.relu(torch.randn(4, 8) @ w).sum() + F.scaled_dot_product_attention(q, q, q).sum()
    loss.backward()
    return float(loss.detach())


def _shape(snap):
    return [(r.name, r.kind, r.depth, [a.get("shape", a.get("value")) for a in r.args],
             r.call_site.split(":")[0]) for r in snap.records]


@pytest.mark.parametrize("mode", ["auto", "gpu"], ids=["mode_auto", "mode_events"])
def test_auto_and_gpu_modes_on_the_cpu_record_as_ops(tmp_path, mode):
    logs = {}
    for m in ("ops", mode):
        logs[m] = tmp_path / f"{m}.log"
        with trace.Recorder(logs[m], m) as rec:
            _program()
        rec.close()
    ops, other = trace.read(logs["ops"]), trace.read(logs[mode])
    assert _shape(ops) == _shape(other) and other.mode == mode
    assert other.gpu_mechanism == "" and other.streams == () and other.gpu_completed is None
    assert all(r.gpu_done is None and r.stream is None for r in other.records)
    assert trace.progress(logs[mode]) == trace.Progress(other.started, other.completed, None)


def test_native_and_python_hot_paths_write_the_same_records(tmp_path):
    if native.load() is None:
        pytest.skip(f"the native hot path is not built here: {native.ensure()[1]}")
    snaps = {}
    for flag in (True, False):
        log = tmp_path / f"{flag}.log"
        with trace.Recorder(log, "ops", native=flag, observer=False) as rec:
            _program()
        assert rec.hot_path == ("native" if flag else "python")
        rec.close()
        snaps[flag] = trace.read(log)
    a, b = snaps[True], snaps[False]
    assert [(r.name, r.args, r.call_site, r.kind, r.depth, r.thread.split(" (")[0]) for r in a.records] == \
           [(r.name, r.args, r.call_site, r.kind, r.depth, r.thread.split(" (")[0]) for r in b.records]
    assert len(a.records) >= 20 and any(r.kind == "composite" for r in a.records)


@pytest.mark.parametrize("path", hotpaths.PATHS)
def test_the_log_says_whether_a_raised_op_is_marked_and_the_probe_is_not_recorded(tmp_path, path):
    """A reader of a program's error needs to know whether 'no op marked raised' means that none raised: the
    recorder says so in the log, from one failing op of its own (never a record), and a real raise is marked."""
    import torch

    log = tmp_path / "ops.log"
    with trace.Recorder(log, "ops", **hotpaths.kw(path)) as rec:
        x = torch.ones(2, 3)
        try:
            torch.mm(x, x)
        except RuntimeError:
            pass
    assert rec.hot_path == hotpaths.expected(path)
    rec.close()
    snap = trace.read(log)
    top = hotpaths.top(snap.records)
    assert [(r.name, r.raised) for r in top[:1]] == [("aten.ones.default", False)] and top[1].name == "aten.mm.default"
    assert snap.raise_marks is top[1].raised, (path, snap.raise_marks)   # the probe says what a real raise gets
    assert snap.raise_marks or path == "observer"   # the dispatch mode's try/except sees every raise


@pytest.mark.parametrize("how", ["as_built", "outputs"])
def test_a_training_loop_marks_no_op_raised_but_the_one_that_raises(tmp_path, how):
    """Where a raise is not seen as the op ends (torch 2.11's CUDA wheels), an op is marked raised when it ends
    without outputs: never one of a training loop's own (autograd, SDPA, AdamW, a DataLoader), always the one that
    raised. `outputs` asks for that way here too (torch.compile'd regions checked by hand: none marked)."""
    prog = Path(__file__).parent / "fixtures" / "recorder" / "step_then_raise.py"
    line = next(n for n, t in enumerate(prog.read_text().splitlines(), 1) if t.endswith("# RAISES"))
    env = {"GPULAB_OBSERVER_RAISE": "outputs"} if how == "outputs" else {}
    rec = trace.record([sys.executable, str(prog), "nocompile"], mode="auto", out_dir=tmp_path, timeout_s=200,
                       env=env)
    assert rec.status == "ok" and rec.snapshot.raise_marks is True, (rec.status, rec.snapshot.raise_marks)
    assert [(r.name, r.call_site) for r in rec.snapshot.records if r.raised] == \
        [("aten.mm.default", f"recorder/step_then_raise.py:{line} in <module>")]


def test_the_observer_records_every_op_the_dispatch_mode_sees_in_order(tmp_path):
    """The observer sees each op where the dispatcher is entered, so it also records what an op runs inside it
    (one level deeper) and the ops of composites the dispatch mode only sees decomposed; every record of the
    dispatch mode is among its records, in the same order, with the same name, arguments and call site."""
    if native.load_observer() is None:
        pytest.skip(f"the observer is not built here: {native.ensure_observer()[1]}")
    snaps = {}
    for path in ("observer", "native"):
        log = tmp_path / f"{path}.log"
        with trace.Recorder(log, "ops", **hotpaths.kw(path)) as rec:
            _program()
        assert rec.hot_path == hotpaths.expected(path)
        rec.close()
        snaps[path] = trace.read(log)
    def key(r):   # the dispatch mode's SDPA record shows its wrapper's arguments, not the dispatcher's
        args = None if r.name == "aten.scaled_dot_product_attention.default" else r.args
        return r.name, args, r.call_site, r.thread.split(" (")[0]

    obs = [key(r) for r in snaps["observer"].records]
    # the dispatch mode's own backend query for its SDPA record is not the program's
    mode = [key(r) for r in snaps["native"].records if r.name != "aten._fused_sdp_choice.default"]
    j, missing = 0, []
    for k in mode:
        hit = next((i for i in range(j, len(obs)) if obs[i] == k), None)
        if hit is None:
            missing.append(k[0])
        else:
            j = hit + 1
    # autograd's detach of a tensor it saves for backward is a redispatch below the dispatcher's entry (it
    # reaches a dispatch mode, not RecordFunction), and a view run inside another op (backward's t() inside its
    # autograd node) is that op's metadata: the op around it is recorded
    import torch

    def is_view(name):
        ns, op, overload = name.split(".")
        return bool(getattr(getattr(getattr(torch.ops, ns), op), overload).is_view)

    assert all(n == "aten.detach.default" or is_view(n) for n in missing) and len(missing) < len(mode) // 3, missing
    assert len(obs) > len(mode) and any(r.kind == "composite" and r.depth == 0 for r in snaps["observer"].records)
    sdpa = [r for r in snaps["observer"].records if r.name == "aten.scaled_dot_product_attention.default"]
    assert len(sdpa) == 1 and sdpa[0].kind == "composite"   # seen as the dispatcher runs it, with no wrapper


@pytest.mark.parametrize("kw,msg", [({"mode": "fast"}, "choose one of ops, sync, gpu, stats, auto"),
                                    ({"gpu_mechanism": "magic"}, "choose one of auto, memop-ring, memop-pinned, events")])
def test_bad_recorder_arguments_name_the_choices(tmp_path, kw, msg):
    with pytest.raises(ValueError, match=msg):
        trace.Recorder(tmp_path / "x.log", **kw)


def test_native_build_failure_is_reported_and_remembered(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", "false")
    path, why = native.ensure()
    assert path is None and "false failed" in why
    assert native.artifact().with_suffix(native.artifact().suffix + ".failed").exists()   # not retried
    monkeypatch.setenv("CC", "cc")
    assert native.ensure()[0] is None and native.load() is None
    monkeypatch.setenv("GPULAB_TRACE_NATIVE", "0")
    assert native.ensure() == (None, "turned off by GPULAB_TRACE_NATIVE=0")


# ------------------------------------------------------------------------------------------ GPU bookkeeping

S = ring.StreamProgress


@pytest.mark.parametrize("completed,streams,want", [
    (10, (), None),                                               # no GPU tracking
    (10, (S(0, 0, 0, 9, 9),), 10),                                # caught up: as far as the host
    (10, (S(0, 0, 0, 3, 9),), 4),                                 # one stream behind after op 3
    (10, (S(0, 0, 0, 9, 9), S(1, 7, 0, 5, 8)), 6),                # the side stream is behind
    (10, (S(0, 0, 0, 2, 9), S(1, 7, 0, 5, 8)), 3),                # the earliest pending stream wins
])
def test_gpu_completed_from_counters(completed, streams, want):
    assert ring.gpu_completed(completed, streams) == want


@pytest.mark.parametrize("seq,stream,returned,want", [
    (3, 0, True, True), (4, 0, True, False), (4, 0, False, None), (4, None, True, None), (2, 1, True, False),
    (1, 1, True, True), (9, 5, True, None)])
def test_gpu_done_per_record(seq, stream, returned, want):
    streams = (S(0, 0, 0, 3, 6), S(1, 7, 0, 1, 4))
    assert ring.gpu_done(seq, stream, returned, streams) is want


def _log_by_hand(path, ops, streams):
    """A log as the recorder and the GPU would leave it: ops = [(name, returned, stream index or -1[, depth, kind,
    marker value])], streams = [(done, enqueued)]."""
    cap, strcap = 64, 4096
    ring.create(path, "auto", capacity=cap, mem_capacity=4, string_capacity=strcap)
    lay = ring.Layout(ring.SLOT_SIZE, cap, 4, strcap)
    with open(path, "r+b") as fh:
        mm = mmap.mmap(fh.fileno(), 0)
        w = ring.StringWriter(mm, lay.strings_off, strcap)
        for i, (done, enq) in enumerate(streams):
            off = ring.add_stream(mm, i, 0x7000 + i, 0)
            ring._STREAM.pack_into(mm, off, done, enq, 0x7000 + i, 0, 1)
        thread = w.add(b"MainThread (1)")
        for seq, (name, returned, stream, *nested) in enumerate(ops):
            depth, kind, mark = nested or (0, 0, None)
            ring._SLOT.pack_into(mm, lay.slot(seq), seq, 1.0 + seq, 2.0 + seq if returned else 0.0,
                                 w.add(name.encode()), 0, 0, thread, stream, depth, kind,
                                 0 if mark is None else ring.F_MARK)
            if mark is not None:
                ring._MARK.pack_into(mm, lay.slot(seq) + ring._OFF_MARK, mark)
        ring._COUNTERS.pack_into(mm, ring.COUNTERS_OFF, len(ops), sum(op[1] for op in ops), 0 if streams else -1,
                                 -1, 0, len(streams), w.pos, 0)
        mm.close()
    return path


SPIN_AFTER_MM3 = [("aten.mm.default", True, 0), ("aten.mm.default", True, 0), ("aten.mm.default", True, 0),
                  ("aten._softmax.default", True, 0), ("aten.add.Tensor", True, 0), ("aten.mm.default", True, 0),
                  ("aten.sum.default", True, 0), ("aten._local_scalar_dense.default", False, 0)]


@pytest.mark.parametrize("ops,streams,culprit,blocked,gpu_completed", [
    # the GPU finished op 2 (the 3rd matmul), then spun: op 3 is the first whose work never completed
    (SPIN_AFTER_MM3, [(2, 6)], 3, 7, 3),
    # a side stream (1) stuck after its op 2; the default stream (0) is caught up
    ([("aten.mm.default", True, 0), ("aten.mm.default", True, 1), ("aten.add.Tensor", True, 1),
      ("aten.mul.Tensor", True, 0), ("aten._local_scalar_dense.default", False, 0)], [(3, 3), (1, 2)], 2, 4, 2),
    # a CPU op and a raised op are not tracked (stream -1): never the culprit
    ([("aten.mm.default", True, 0), ("aten.add.Tensor", True, -1), ("aten.div.Tensor", True, -1),
      ("aten.mm.default", True, 0), ("aten.sum.default", False, 0)], [(0, 3)], 3, 4, 1),
    # everything completed: the host is stuck in an op of its own (no GPU culprit)
    ([("aten.mm.default", True, 0), ("gpulab.block.default", False, -1)], [(0, 0)], 1, None, 1),
])
def test_culprit_and_host_blocked_from_recorded_counters(tmp_path, ops, streams, culprit, blocked, gpu_completed):
    log = _log_by_hand(tmp_path / "hand.log", ops, streams)
    snap = trace.read(log)
    assert len(snap.records) == len(ops) and snap.gpu_completed == gpu_completed
    assert trace.progress(log).gpu_completed == gpu_completed
    inflight, host, _open = verdict.localize(snap.records)
    assert inflight.seq == culprit
    assert (host.seq if host else None) == blocked
    d = verdict.op_dict(inflight)
    assert d["stream"] == snap.records[culprit].stream and d["gpu_done"] == snap.records[culprit].gpu_done


class _RecordedDriver:
    """Answers the event calls from a script of which events completed, as a driver would."""

    def __init__(self):
        self.completed: set[int] = set()
        self.next = 100
        self.fn = {"cuEventRecord": lambda ev, handle: 0,
                   "cuEventQuery": lambda ev: 0 if ev in self.completed else gpu.CUDA_ERROR_NOT_READY,
                   "cuCtxSetCurrent": lambda ctx: 0}

    def __call__(self, name, *args):
        if name == "cuEventCreate":
            args[0]._obj.value = self.next
            self.next += 1

    def error_name(self, code):
        return ""


def test_event_poller_marks_each_stream_in_order(tmp_path):
    log = ring.create(tmp_path / "ev.log", "gpu", capacity=16, mem_capacity=4, string_capacity=4096)
    with open(log, "r+b") as fh:
        mm = mmap.mmap(fh.fileno(), 0)
        drv = _RecordedDriver()
        tr = gpu.EventTracker(drv, mm, {}, pool=8)
        targets = {i: tr.target(i, 0) for i in range(2)}
        for i in range(2):
            ring.add_stream(mm, i, 0x10 + i, 0)
        ring._Q.pack_into(mm, ring._OFF_NSTREAMS, 2)
        plan = [(0, 0), (1, 0), (2, 1), (3, 0), (4, 1)]                  # (seq, stream)
        events = {}
        for seq, s in plan:
            assert tr.emit(0x10 + s, targets[s], seq, 0) == 0
            events[seq] = targets[s][2][-1][1]
        drv.completed |= {events[0], events[1], events[2]}                # not 3 (stream 0) nor 4 (stream 1)
        tr.poll()
        done = [ring._STREAM.unpack_from(mm, ring.GPU_PAGE_OFF + i * ring.STREAM_SIZE)[0] for i in range(2)]
        assert done == [1, 2]
        drv.completed.add(events[4])
        tr.poll()
        assert ring._STREAM.unpack_from(mm, ring.GPU_PAGE_OFF + ring.STREAM_SIZE)[0] == 4
        assert len(targets[0][2]) == 1 and not targets[1][2]             # only seq 3 still pending
        tr.pools.clear()
        mm.close()


def test_gpu_mechanism_choice_is_validated_and_no_driver_means_none(tmp_path, monkeypatch):
    import torch

    with pytest.raises(ValueError, match="choose one of auto, memop-ring, memop-pinned, events"):
        gpu.choose(None, None, "fastest")
    monkeypatch.setattr(gpu, "load", lambda: None)   # no NVIDIA driver: nothing is attempted, recording goes on
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 0x5000, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    log = tmp_path / "nodrv.log"
    with trace.Recorder(log, "auto", observer=False) as rec:
        monkeypatch.setattr(torch.cuda, "_initialized", True)
        torch.zeros(2)
    monkeypatch.setattr(torch.cuda, "_initialized", False)
    rec.close()
    snap = trace.read(log)
    assert snap.gpu_mechanism == "none: libcuda not loadable" and snap.records[0].stream is None


@pytest.mark.parametrize("path", hotpaths.PATHS)
def test_a_forked_child_records_nothing_into_the_parents_log(tmp_path, path):
    import torch

    log = tmp_path / "fork.log"
    with trace.Recorder(log, **hotpaths.kw(path)) as rec:   # ops that run no op inside them (one record each)
        x = torch.empty(4)
        x = x + x
        pid = os.fork()
        if pid == 0:  # a DataLoader-style worker: ops of its own, then exit without cleanup
            try:
                for _ in range(50):
                    torch.ones(3).mul(2)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert trace.progress(log) == trace.Progress(2, 2, None)   # the child's 100 ops are not in the log
        x = x * x
    rec.close()
    assert rec.hot_path == hotpaths.expected(path)
    names = [r.name for r in trace.read(log).records]
    assert names == ["aten.empty.memory_format", "aten.add.Tensor", "aten.mul.Tensor"]


# ------------------------------------------------------------------------------------------ GPU mechanisms

# A stand-in for libcuda with the entry points gpulab.trace.gpu uses, whose "GPU" completes a stream
# memory op at once (a write to the address); it checks the ctypes plumbing and the choice and fallback
# logic on a machine without a GPU. The real driver is verified by benchmarks/gpu_recorder_check.py.
FAKE_CUDA = r"""
#include <stdint.h>
#include <stdlib.h>
typedef int R;
static intptr_t next = 1;
R cuInit(unsigned f) { return 0; }
R cuDriverGetVersion(int *v) { *v = 13000; return 0; }
R cuDeviceGetCount(int *n) { *n = 1; return 0; }
R cuDeviceGet(int *d, int o) { *d = o; return 0; }
R cuDeviceGetAttribute(int *v, int a, int d) { *v = getenv("FAKE_NO_MEMOPS") && a == 93 ? 0 : 1; return 0; }
R cuCtxGetCurrent(void **c) { *c = (void *)0x100; return 0; }
static int query_error = 0;   /* fake_query_error(201): queries fail until a context is set again */
void fake_query_error(int code) { query_error = code; }
R cuCtxSetCurrent(void *c) { if (query_error == 201) query_error = 0; return 0; }
R cuCtxPushCurrent_v2(void *c) { return 0; }
R cuCtxPopCurrent_v2(void **c) { return 0; }
R cuDevicePrimaryCtxRetain(void **c, int d) { *c = (void *)0x100; return 0; }
R cuDevicePrimaryCtxRelease_v2(int d) { return 0; }
R cuMemHostRegister_v2(void *p, size_t n, unsigned f) { return getenv("FAKE_NO_REGISTER") ? 1 : 0; }
R cuMemHostUnregister(void *p) { return 0; }
R cuMemHostGetDevicePointer_v2(uint64_t *d, void *p, unsigned f) { *d = (uint64_t)p; return 0; }
R cuMemHostAlloc(void **p, size_t n, unsigned f) { *p = aligned_alloc(4096, n); return 0; }
R cuMemFreeHost(void *p) { free(p); return 0; }
R cuStreamWriteValue64_v2(void *s, uint64_t a, uint64_t v, unsigned f) { *(volatile uint64_t *)a = v; return 0; }
R cuStreamCreate(void **s, unsigned f) { *s = (void *)(0x1000 + next++); return 0; }
R cuStreamQuery(void *s) { return 0; }
R cuStreamDestroy_v2(void *s) { return 0; }
/* events: each record takes a ticket; the "GPU" completes the tickets below `limit` (fake_set_limit), so a
   test can leave a kernel unfinished and everything queued behind it */
#define FAKE_EVENTS (1 << 16)
static long tickets[FAKE_EVENTS], issued = 0, limit = 1L << 62;
void fake_set_limit(long n) { limit = n; }
long fake_issued(void) { return issued; }
R cuEventCreate(void **e, unsigned f) { *e = (void *)(0x2000 + next++); return 0; }
static int refuse = 0;
void fake_refuse(int code) { refuse = code; }
R cuEventRecord(void *e, void *s) {
    if (refuse) return refuse;
    tickets[((intptr_t)e - 0x2000) % FAKE_EVENTS] = issued++;
    return 0;
}
/* a CUDA graph capture in global mode in some thread (fake_capture(1)): an event query from a thread not in
   relaxed capture mode fails with 900 and invalidates that capture, as the driver does */
static __thread int capture_mode = 0;
static int capture_underway = 0, invalidated = 0;
void fake_capture(int on) { capture_underway = on; }
int fake_invalidated(void) { return invalidated; }
int fake_thread_mode(void) { return capture_mode; }
R cuThreadExchangeStreamCaptureMode(int *m) { int old = capture_mode; capture_mode = *m; *m = old; return 0; }
R cuEventQuery(void *e) {
    if (capture_underway && capture_mode != 2) { invalidated = 1; return 900; }
    if (query_error) return query_error;
    return tickets[((intptr_t)e - 0x2000) % FAKE_EVENTS] < limit ? 0 : 600; }
R cuEventDestroy_v2(void *e) { return 0; }
R cuGetErrorName(int c, const char **s) { *s = "CUDA_ERROR_FAKE"; return 0; }
"""


@pytest.fixture
def fake_driver(tmp_path):
    import ctypes
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler for the stand-in driver")
    src, lib = tmp_path / "fakecuda.c", tmp_path / "libfakecuda.so"
    src.write_text(FAKE_CUDA)
    r = proc.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], timeout_s=60, capture=True)
    assert r.returncode == 0, r.stderr
    drv = gpu.Driver(ctypes.CDLL(str(lib)))
    drv("cuInit", 0)
    drv.lib.fake_set_limit.argtypes, drv.lib.fake_issued.restype = [ctypes.c_long], ctypes.c_long
    return drv


@pytest.mark.parametrize("env,preference,want,passed_over", [
    ({}, "auto", "memop-ring", 0),
    ({"FAKE_NO_REGISTER": "1"}, "auto", "memop-pinned", 1),        # the file page cannot be registered
    ({"FAKE_NO_MEMOPS": "1"}, "auto", "events", 2),                # no 64-bit stream memory ops
    ({}, "events", "events", 0),
])
def test_mechanism_choice_and_marker_bookkeeping(tmp_path, fake_driver, monkeypatch, env, preference, want,
                                                 passed_over):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    log = ring.create(tmp_path / "g.log", "auto", capacity=16, mem_capacity=4, string_capacity=4096)
    with open(log, "r+b") as fh:
        mm = mmap.mmap(fh.fileno(), 0)
        tracker, notes = gpu.choose(fake_driver, mm, preference, 0)
        assert tracker.mechanism == want and len(notes) == passed_over, notes
        off = ring.add_stream(mm, 0, 0x1234, 0)
        ring._Q.pack_into(mm, ring._OFF_GPU_SINCE, 0)
        target = tracker.target(0, 0)
        for seq in (0, 1, 2):
            assert tracker.emit(0x1234, target, seq, 0) == 0
            ring._q.pack_into(mm, off + 8, seq)         # enqueued, as the recorder writes it
        tracker.drain(timeout_s=1.0)
        done, enq = ring._STREAM.unpack_from(mm, off)[:2]
        assert (done, enq) == (2, 2)
        tracker.close()
        mm.close()
    assert trace.progress(log).gpu_completed == 0  # caught up: as far as the host (no op recorded here)


@pytest.mark.parametrize("native_path", [True, False])
def test_auto_mode_gpu_path_with_a_stand_in_driver(tmp_path, fake_driver, monkeypatch, native_path):
    """The recorder's GPU-marker path end to end, CUDA's stream and device queries stood in: the ops
    without tensor arguments (factories) count as ops on the current CUDA device; CPU-tensor ops are
    never tracked."""
    import torch

    _stand_in_cuda(monkeypatch, fake_driver)
    log = tmp_path / "auto.log"
    with trace.Recorder(log, "auto", native=native_path, observer=False) as rec:
        x = torch.ones(3) + 1                            # before "CUDA": plain ops
        monkeypatch.setattr(torch.cuda, "_initialized", True)
        y = torch.zeros(2)                               # a factory: tracked on device 0's current stream
        z = x * 2                                        # CPU tensors: not tracked
        w = torch.full((2,), 1.0)                        # tracked
    monkeypatch.setattr(torch.cuda, "_initialized", False)
    rec.close()
    snap = trace.read(log)
    got = [(r.name, r.stream, r.gpu_done) for r in snap.records]
    assert got == [("aten.ones.default", None, None), ("aten.add.Tensor", None, None),
                   ("aten.zeros.default", 0, True), ("aten.mul.Tensor", None, None),
                   ("aten.full.default", 0, True)]
    assert snap.gpu_mechanism == "memop-ring" and len(snap.streams) == 1
    assert rec.gpu_path == ("native" if native_path else "python")
    assert (snap.streams[0].handle, snap.streams[0].done, snap.streams[0].enqueued) == (0x5000, 4, 4)
    assert snap.gpu_completed == snap.completed == 5
    assert os.path.getsize(log) == rec.layout.used_size(5)   # every marker landed: closed and trimmed


@pytest.mark.parametrize("op,none", [("view.default", True), ("t.default", True), ("split.Tensor", True),
                                     ("expand.default", True), ("_unsafe_view.default", True),
                                     ("empty.memory_format", True), ("add_.Tensor", False), ("copy_.default", False),
                                     ("mm.default", False), ("index_put_.default", False), ("clone.default", False)])
def test_views_and_allocations_enqueue_no_gpu_work(op, none):
    import torch

    from gpulab.trace import texts
    name, overload = op.split(".")
    func = getattr(getattr(torch.ops.aten, name), overload)
    assert texts.enqueues_no_gpu_work(func, str(func).encode()) is none


@pytest.mark.parametrize("native_path", [True, False])
def test_ops_without_gpu_work_get_no_marker(tmp_path, fake_driver, monkeypatch, native_path):
    """An allocation after CUDA is up gets no marker (its event would only repeat the op before); the ops
    around it still do, on both hot paths."""
    import torch

    _stand_in_cuda(monkeypatch, fake_driver)
    log = tmp_path / "nomark.log"
    with trace.Recorder(log, "auto", native=native_path, observer=False) as rec:
        torch.ones(1)
        monkeypatch.setattr(torch.cuda, "_initialized", True)
        torch.empty(2)
        torch.zeros(2)
        torch.empty_strided((2,), (1,))
        torch.full((2,), 1.0)
    monkeypatch.setattr(torch.cuda, "_initialized", False)
    rec.close()
    got = [(r.name, r.stream) for r in trace.read(log).records]
    assert got == [("aten.ones.default", None), ("aten.empty.memory_format", None), ("aten.zeros.default", 0),
                   ("aten.empty_strided.default", None), ("aten.full.default", 0)]
    assert rec.gpu_path == ("native" if native_path else "python")


def test_a_failing_gpu_path_stops_tracking_and_never_breaks_the_program(tmp_path, fake_driver, monkeypatch):
    import torch

    monkeypatch.setattr(gpu, "load", lambda: fake_driver)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 0x5000, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)

    def capturing():  # as the CPU build's stub does (stood in, so that a CUDA build fails the same way)
        raise RuntimeError("Tried to instantiate dummy base class _cuda_isCurrentStreamCapturing")

    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", capturing, raising=False)
    log = tmp_path / "fail.log"
    with trace.Recorder(log, "auto", observer=False) as rec:
        monkeypatch.setattr(torch.cuda, "_initialized", True)
        a = torch.zeros(2)          # the stream-capture query raises: tracking stops, the program goes on
        b = torch.ones(2)
    monkeypatch.setattr(torch.cuda, "_initialized", False)
    rec.close()
    snap = trace.read(log)
    assert [r.name for r in snap.records] == ["aten.zeros.default", "aten.ones.default"]
    assert snap.gpu_mechanism.startswith("stopped: RuntimeError") and (a + b).sum() == 2


def _stand_in_cuda(monkeypatch, fake_driver, streams=lambda dev: 0x5000 + dev):
    import torch

    monkeypatch.setattr(gpu, "load", lambda: fake_driver)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", streams, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: False, raising=False)


def _wait_for(cond, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.005)
    return cond()


@pytest.mark.parametrize("native_path", [True, False])
@pytest.mark.parametrize("stuck_at", [0, 2, 5])
def test_events_name_the_op_whose_gpu_work_never_completed(tmp_path, fake_driver, monkeypatch, native_path, stuck_at):
    """Events mechanism (a driver without stream memory ops, as on the H100 host): the GPU stops after the
    `stuck_at`-th marker; while the ops stay pending, the log names exactly that op as the first one whose
    GPU work is not done, on both hot paths (the C one polls on its own thread, by binary search)."""
    import torch

    monkeypatch.setenv("FAKE_NO_MEMOPS", "1")
    _stand_in_cuda(monkeypatch, fake_driver)
    fake_driver.lib.fake_set_limit(fake_driver.lib.fake_issued() + stuck_at)
    log = tmp_path / "ev.log"
    rec = trace.Recorder(log, "auto", native=native_path, observer=False).install()
    try:
        monkeypatch.setattr(torch.cuda, "_initialized", True)
        for _ in range(8):
            torch.zeros(2)
        assert rec.gpu_path == ("native" if native_path else "python") and rec.tracker.mechanism == "events"
        first = ring._Q.unpack_from(rec._mm, ring._OFF_GPU_SINCE)[0]   # the first tracked op's seq

        def caught_up():
            s = trace.read(log)
            return s.streams and s.streams[0].done == (first + stuck_at - 1 if stuck_at else -1)
        assert _wait_for(caught_up)
        snap = trace.read(log)
        pending = [r.seq for r in snap.records if r.gpu_done is False]
        assert pending == list(range(first + stuck_at, first + 8))
        assert snap.gpu_completed == first + stuck_at
        fake_driver.lib.fake_set_limit(1 << 62)                        # the GPU moves on
        assert _wait_for(lambda: trace.read(log).streams[0].done == first + 7)
    finally:
        fake_driver.lib.fake_refuse(0)
        rec.uninstall()
        monkeypatch.setattr(torch.cuda, "_initialized", False)
        rec.close()
    assert trace.read(log).gpu_completed == trace.read(log).completed


def test_a_full_event_ring_skips_markers_and_never_reuses_a_pending_event(tmp_path, fake_driver, monkeypatch):
    """C hot path: a stream's events form a ring; when the GPU is a whole ring behind, later ops go without
    a marker (untracked) instead of re-recording an event that is still pending, so a stuck op is still the
    first pending one and no marker is ever reported complete too early."""
    if native.load() is None:
        pytest.skip("the native hot path is not built here")
    import torch

    monkeypatch.setenv("FAKE_NO_MEMOPS", "1")
    monkeypatch.setattr(gpu, "STREAM_EVENT_POOL", 4)
    _stand_in_cuda(monkeypatch, fake_driver)
    fake_driver.lib.fake_set_limit(fake_driver.lib.fake_issued() + 1)  # only the first marker completes
    log = tmp_path / "full.log"
    rec = trace.Recorder(log, "auto", observer=False).install()
    try:
        monkeypatch.setattr(torch.cuda, "_initialized", True)
        for _ in range(10):
            torch.zeros(2)
        assert rec.gpu_path == "native"
        first = ring._Q.unpack_from(rec._mm, ring._OFF_GPU_SINCE)[0]
        assert _wait_for(lambda: trace.read(log).streams[0].done == first)
        # the ring holds 4: the op that completed frees one place (op 5 may get it, depending on the poll)
        snap = trace.read(log)
        tracked = [r.seq - first for r in snap.records if r.stream is not None]
        assert tracked[:4] == [0, 1, 2, 3] and len(tracked) <= 5
        assert [r.seq - first for r in snap.records if r.gpu_done is False][0] == 1
    finally:
        rec.uninstall()
        monkeypatch.setattr(torch.cuda, "_initialized", False)
        fake_driver.lib.fake_set_limit(1 << 62)
        rec.close()


def test_native_markers_follow_each_stream_and_stop_after_refusals(tmp_path, fake_driver, monkeypatch):
    """Two streams get two page entries, each op counted on its own; a driver that refuses every marker
    stops GPU tracking after 100 refusals, says why in the log, and the program runs on."""
    if native.load() is None:
        pytest.skip("the native hot path is not built here")
    import torch

    monkeypatch.setenv("FAKE_NO_MEMOPS", "1")
    which = {"s": 0x7000}
    _stand_in_cuda(monkeypatch, fake_driver, streams=lambda dev: which["s"])
    log = tmp_path / "two.log"
    rec = trace.Recorder(log, "auto", observer=False).install()
    try:
        monkeypatch.setattr(torch.cuda, "_initialized", True)
        for i in range(6):
            which["s"] = 0x7000 if i % 3 else 0x7100
            torch.zeros(2)
        assert _wait_for(lambda: len(trace.read(log).streams) == 2 and not any(s.pending for s in trace.read(log).streams))
        snap = trace.read(log)
        assert sorted(s.handle for s in snap.streams) == [0x7000, 0x7100]
        by_stream = {s.handle: s for s in snap.streams}
        assert by_stream[0x7100].enqueued < by_stream[0x7000].enqueued
        fake_driver.lib.fake_refuse(999)
        for _ in range(120):
            torch.zeros(2)
        assert rec.tracker.native.gpu_state()["disabled"] == 1
        snap = trace.read(log)
        assert snap.gpu_mechanism == "stopped: CUresult 999" and len(snap.records) == 126
        assert all(r.stream is None for r in snap.records[6:])
    finally:
        fake_driver.lib.fake_refuse(0)
        rec.uninstall()
        monkeypatch.setattr(torch.cuda, "_initialized", False)
        rec.close()


@pytest.mark.parametrize("code,stops", [(201, False), (999, True)])
def test_the_native_poller_recovers_a_lost_context_and_stops_on_other_query_errors(tmp_path, fake_driver, monkeypatch,
                                                                                   code, stops):
    """A poller that cannot query would leave every op pending, and the verdict would name a false culprit:
    a lost context is set again and polling goes on; any other error stops tracking and says so."""
    import torch

    if native.load() is None:
        pytest.skip("the native hot path is not built here")
    monkeypatch.setenv("FAKE_NO_MEMOPS", "1")
    _stand_in_cuda(monkeypatch, fake_driver)
    log = tmp_path / "q.log"
    rec = trace.Recorder(log, "auto", observer=False).install()
    try:
        monkeypatch.setattr(torch.cuda, "_initialized", True)
        torch.zeros(2)
        fake_driver.lib.fake_query_error(code)
        for _ in range(3):
            torch.zeros(2)
        if stops:
            assert _wait_for(lambda: trace.read(log).gpu_mechanism == f"stopped: query CUresult {code}")
            assert rec.tracker.native.gpu_state()["disabled"] == 1
        else:
            first = ring._Q.unpack_from(rec._mm, ring._OFF_GPU_SINCE)[0]
            assert _wait_for(lambda: trace.read(log).streams[0].done == first + 3)
            assert trace.read(log).gpu_mechanism == "events"
    finally:
        fake_driver.lib.fake_query_error(0)
        rec.uninstall()
        monkeypatch.setattr(torch.cuda, "_initialized", False)
        rec.close()


@pytest.mark.parametrize("native_path", [True, False])
def test_polling_never_breaks_a_cuda_graph_capture_in_another_thread(tmp_path, fake_driver, monkeypatch, native_path):
    """torch.cuda.graph captures in global mode by default: an event query from any thread not in relaxed
    mode invalidates the capture, and the program's capture_end fails (seen on the H100: the poller's
    cuEventQuery returned 900). The polling thread is relaxed, so the capture survives and tracking goes on."""
    import torch

    if native_path and native.load() is None:
        pytest.skip("the native hot path is not built here")
    monkeypatch.setenv("FAKE_NO_MEMOPS", "1")
    _stand_in_cuda(monkeypatch, fake_driver)
    log = tmp_path / "cap.log"
    rec = trace.Recorder(log, "auto", observer=False, native=native_path).install()
    try:
        monkeypatch.setattr(torch.cuda, "_initialized", True)
        torch.zeros(2)
        first = ring._Q.unpack_from(rec._mm, ring._OFF_GPU_SINCE)[0]
        fake_driver.lib.fake_capture(1)   # a capture begins in another thread; this thread's ops go on
        for _ in range(3):
            torch.zeros(2)
        assert _wait_for(lambda: trace.read(log).streams[0].done == first + 3)
        assert trace.read(log).gpu_mechanism == "events" and not fake_driver.lib.fake_invalidated()
    finally:
        fake_driver.lib.fake_capture(0)
        rec.uninstall()   # its last poll runs on this, the program's, thread
        monkeypatch.setattr(torch.cuda, "_initialized", False)
        rec.close()
    assert fake_driver.lib.fake_thread_mode() == 0   # whose capture mode is its own again


def test_a_hot_path_whose_arguments_do_not_parse_owns_nothing():
    """Found in review: a failed parse released references the object never took (a later crash)."""
    mod = native.load()
    if mod is None:
        pytest.skip("the native hot path is not built here")
    probe = object()
    before = sys.getrefcount(probe)
    for _ in range(20):
        with pytest.raises(TypeError):
            mod.Hot(bytearray(1 << 16), 4096, 4, 64, 8, 16, 1, probe)   # most arguments missing
    assert sys.getrefcount(probe) == before


def _marked_log(path, done):
    """A composite (seq 0) whose op (seq 1) ran first on the GPU: the op's marker carries 1, the composite's own
    marker, enqueued after it, 2 (the observer's marker values rise in the order markers are enqueued)."""
    ops = [("aten.sum.dim_IntList", True, 0, 0, 1, 2), ("aten.fill_.Scalar", True, 0, 1, 0, 1)]
    return trace.read(_log_by_hand(path, ops, [(done, 2)]))


@pytest.mark.parametrize("done,want", [(1, (False, True)), (2, (True, True)), (0, (False, False))])
def test_a_composites_marker_after_its_ops_decides_its_completion(tmp_path, done, want):
    """The composite's own GPU work ran after its op's: with only the op's marker landed, the op is done and the
    composite is not, and it is the culprit (its own kernel never completed), never the op that finished."""
    snap = _marked_log(tmp_path / "m.log", done)
    assert (snap.records[0].gpu_done, snap.records[1].gpu_done) == want
    inflight, _, _ = verdict.localize(snap.records)
    expected = {1: "aten.sum.dim_IntList", 0: "aten.fill_.Scalar", 2: None}[done]   # 0: the op inside, first
    assert (inflight.name if inflight is not None else None) == expected


@pytest.mark.parametrize("path", hotpaths.PATHS)
def test_a_forked_child_records_into_a_log_of_its_own(tmp_path, path):
    """A DataLoader worker made by fork() is recorded into its own log (gpulab.trace.follow does this), once per
    op: the observer it inherited, inactive, gives way to the child's."""
    import torch

    parent_log, child_log = tmp_path / "parent.log", tmp_path / "child.log"
    one = torch.ones(4)
    with trace.Recorder(parent_log, **hotpaths.kw(path)) as rec:
        x = torch.empty(4)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                with trace.Recorder(child_log, **hotpaths.kw(path)) as child:
                    torch.empty(3).add_(one[:3])
                child.close()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        x = x + one
    rec.close()
    assert os.WEXITSTATUS(status) == 0
    assert [r.name for r in trace.read(child_log).records] == ["aten.empty.memory_format", "aten.slice.Tensor",
                                                               "aten.add_.Tensor"]
    assert [r.name for r in trace.read(parent_log).records] == ["aten.empty.memory_format", "aten.add.Tensor"]


@pytest.mark.parametrize("used,want_kb", [(0, 64), (100 << 10, 200), (3 << 20, 4096)])
def test_prefault_reach_grows_with_what_the_log_holds(tmp_path, used, want_kb):
    """A process that recorded little (a DataLoader worker of a short epoch, a launcher) keeps a small file; one
    that records fast prefaults a full megabyte ahead (no page fault on its hot path)."""
    from gpulab.trace.prefault import Prefault

    log = ring.create(tmp_path / "p.log", "ops")
    with open(log, "r+b") as fh:
        mm = mmap.mmap(fh.fileno(), 0)
        pf = Prefault(mm, ring._header(mm, log)[0])
        pf.step({"slots": used})
        assert pf.end["slots"] == want_kb << 10
        assert os.stat(log).st_blocks * 512 < (want_kb + 512) << 10 or not pf.ok   # the file takes what was mapped
        mm.close()


def test_a_long_lived_log_is_reserved_once_its_ring_wraps(tmp_path):
    """A process whose slot ring wrapped lives and records: its whole log is taken on disk at once, so a watch
    folder stops growing while the string table and the memory ring fill over hours."""
    import torch

    log = tmp_path / "r.log"
    with trace.Recorder(log, "ops", capacity=512) as rec:
        x = torch.zeros(4)
        for _ in range(20):   # a few records each (the scalar's conversion is recorded too)
            x = x + 1
        rec._step_prefault()
        assert not rec.prefault.reserved
        before = os.stat(log).st_blocks * 512
        for _ in range(600):
            x = x + 1
        rec._step_prefault()
        assert rec.prefault.reserved and not rec.prefault.full
        assert before < rec.layout.size // 2 <= rec.layout.size <= os.stat(log).st_blocks * 512
    rec.close()
    assert "aten.add.Tensor" in {r.name for r in trace.read(log).records[-10:]}   # the log reads as before


@pytest.mark.parametrize("err", [28, 14])   # ENOSPC (the reservation), EFAULT (a page the disk refused)
def test_prefault_says_full_when_the_disk_refuses(tmp_path, monkeypatch, err):
    from gpulab.trace import prefault

    log = ring.create(tmp_path / "p.log", "ops", capacity=64)
    with open(log, "r+b") as fh:
        mm = mmap.mmap(fh.fileno(), 0)
        pf = prefault.Prefault(mm, ring._header(mm, log)[0], fh.fileno())
        if err == 28:
            monkeypatch.setattr(prefault, "reserve", lambda fd, size: err)
            pf.step({"slots": 64 * 64})
        else:
            class Refusing:
                def __len__(self):
                    return len(mm)

                def madvise(self, *a):
                    raise OSError(err, os.strerror(err))
            pf.mm = Refusing()
            pf.step({"slots": 4096})
        assert pf.full
        mm.close()


FILLER = textwrap.dedent("""
    import sys, time, torch
    x = torch.zeros(4, device=sys.argv[1])
    for i in range(60000):
        x = x + 1
        if i % 5000 == 0:
            time.sleep(0.15)   # the recorder's background thread gets its turns
    print("survived", int(x[0]))
""")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_full_disk_stops_recording_and_never_kills_the_program(tmp_path, device):
    """`gpulab watch` with its folder on a 2 MB tmpfs (a user namespace mounts it, no root needed): once the
    disk refuses the op log a page, the recorder stops writing and says so; the program runs to its end, the
    watch ends with its code and a verdict that says the log ends early. Before, the program's next record was
    a SIGBUS that killed it, and the watch then died writing the shrunk log."""
    small, script = tmp_path / "small", tmp_path / "filler.py"
    small.mkdir()
    script.write_text(FILLER)
    unshare = shutil.which("unshare")
    probe = proc.run([unshare, "-rm", "sh", "-c", f"mount -t tmpfs -o size=2m tmpfs {small}"], timeout_s=30,
                     capture=True) if unshare else None
    if probe is None or probe.returncode != 0:
        pytest.skip("no unprivileged user namespace to mount a small tmpfs in")
    inner = (f"mount -t tmpfs -o size=2m tmpfs {small} && {sys.executable} -m gpulab watch --stall 60 --quiet "
             f"--out {small}/w -- python {script} {device}; echo watch-exit=$?; cat {small}/w/stdout.txt; echo; "
             f"cat {small}/w/verdict.json")
    r = proc.run([unshare, "-rm", "sh", "-c", inner], timeout_s=180, capture=True, env=_child_env())
    out = r.stdout
    assert "watch-exit=0" in out, out[-2000:] + r.stderr[-2000:]
    assert "survived 60000" in out   # the program ran to its end
    v = json.loads(out[out.index("{", out.index("survived 60000")):])
    assert v["status"] == "ok" and v["exit_code"] == 0
    assert any(e.startswith("recording stopped after") and "no space left" in e for e in v["evidence"]), v
