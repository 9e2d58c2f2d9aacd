"""The crash-safe op recorder: real children, real SIGKILL, real blocking ops."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import hotpaths
import pytest

from gpulab import trace
from gpulab.trace import ring
from gpulab.trace import run as _run

BLOCKING_CHILD = textwrap.dedent("""
    import sys, time, torch

    @torch.library.custom_op("gpulabtest::block", mutates_args=())
    def block(x: torch.Tensor, marker: str) -> torch.Tensor:
        open(marker, "w").close()          # tell the parent we are inside the op
        while True:
            time.sleep(1)                  # never returns: killed by the parent

    x = torch.ones(4, 4)
    for _ in range(50):
        x = x * 1.0 + 0.5
    torch.ops.gpulabtest.block(x, sys.argv[1])
""")


pytestmark = pytest.mark.usefixtures("native_hot_path")  # conftest: built once, as launchers do


def _popen(cmd, path="observer"):
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(_run._child_env(), **hotpaths.env(path)))


def _kill(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.mark.parametrize("path", hotpaths.PATHS)
def test_sigkill_mid_op_keeps_records_including_the_in_flight_op(tmp_path, path):
    script, marker, log = tmp_path / "child.py", tmp_path / "inside", tmp_path / "ops.log"
    script.write_text(BLOCKING_CHILD)
    proc = _popen([sys.executable, "-m", "gpulab.trace", "--log", str(log), "--", str(script), str(marker)], path)
    try:
        deadline = time.time() + 60
        seen = []
        while not marker.exists():
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.time() < deadline, "child never reached the blocking op"
            if log.exists():
                seen.append(trace.progress(log).started)  # polled while the child writes
            time.sleep(0.05)
        prog = trace.progress(log)
    finally:
        _kill(proc)
    assert proc.returncode == -signal.SIGKILL
    snap = trace.read(log)
    assert snap.started == prog.started and snap.completed == snap.started - 1
    assert snap.started >= 101  # 50 x (mul, add) + the blocking op
    last = snap.records[-1]
    assert last.name == "gpulabtest.block.default" and last.t_end is None
    assert snap.in_flight() == (last,)
    assert last.args[0]["shape"] == [4, 4] and last.args[0]["dtype"] == "float32"
    assert "child.py:" in last.call_site and "<module>" in last.call_site
    assert [r.name for r in hotpaths.top(snap.records)[:2]] == ["aten.ones.default", "aten.mul.Tensor"]
    assert seen == sorted(seen)


def _record_inproc(tmp_path, fn, mode="ops", capacity=1024):
    log = tmp_path / f"{mode}.log"
    with trace.Recorder(log, mode, capacity=capacity) as rec:
        fn()
    rec.close()
    return trace.read(log)


def test_backward_ops_are_recorded(tmp_path):
    import torch

    def fn():
        w = torch.randn(8, 8, requires_grad=True)
        loss = torch.relu(torch.randn(4, 8) @ w).sum()
        loss.backward()
        assert w.grad is not None

    snap = _record_inproc(tmp_path, fn)
    names = [r.name for r in snap.records]
    assert "aten.threshold_backward.default" in names  # relu's backward, run by the autograd engine
    i_bwd = names.index("aten.threshold_backward.default")
    assert any(n == "aten.mm.default" for n in names[i_bwd:])  # matmul backward after it
    assert all(r.t_end is not None for r in snap.records)


@pytest.mark.parametrize("masked", [False, True])
def test_sdpa_math_composite_and_decomposition(tmp_path, masked):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 2, 8, 16)
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool).tril() if masked else None

    def fn():
        with sdpa_kernel(SDPBackend.MATH):
            F.scaled_dot_product_attention(q, q, q, attn_mask=mask)

    snap = _record_inproc(tmp_path, fn)
    names = [r.name for r in snap.records]
    top = names.index("aten.scaled_dot_product_attention.default")
    math = names.index("aten._scaled_dot_product_attention_math.default")
    assert snap.records[top].kind == "composite" and snap.records[math].depth == 1 and top < math
    inner = snap.records[math + 1:]
    assert sum(r.name == "aten.bmm.default" for r in inner) == 2
    assert any("softmax" in r.name for r in inner)
    assert all(r.depth >= 2 for r in inner) and any(r.depth == 2 for r in inner)   # deeper: what an op runs inside
    assert snap.records[top].t_end >= max(r.t_end for r in inner)
    assert F.scaled_dot_product_attention.__name__ == "scaled_dot_product_attention"
    assert not hasattr(F.scaled_dot_product_attention, "__wrapped__")  # uninstalled


@pytest.mark.parametrize("make_bad,bad_op", [
    (lambda x: x / (x - x), "aten.div.Tensor"),
    (lambda x: (x - 4).sqrt(), "aten.sqrt.default"),
    (lambda x: (x * 1e30) * 1e30, "aten.mul.Tensor"),
])
def test_stats_mode_flags_first_nonfinite_op(tmp_path, make_bad, bad_op):
    import torch

    def fn():
        x = torch.arange(1.0, 5.0)
        y = x * 2 + 1           # finite
        z = make_bad(y)
        (z + 1).sum()           # propagates, but is not the first

    snap = _record_inproc(tmp_path, fn, mode="stats")
    first = trace.first_nonfinite(snap)
    assert first is not None and first.name == bad_op, [(r.name, r.stats) for r in snap.records]
    before = [r for r in snap.records if r.seq < first.seq and r.stats]
    assert before and not any(r.stats["nonfinite"] for r in before)
    assert first.stats["nan"] + first.stats["inf"] > 0


def test_stats_mode_ignores_attention_mask_neg_inf(tmp_path):
    import torch
    import torch.nn.functional as F

    q = torch.randn(1, 2, 8, 16)
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool).tril()
    snap = _record_inproc(tmp_path, lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=mask), mode="stats")
    assert trace.first_nonfinite(snap) is None
    assert any(r.stats and r.stats["neginf"] > 0 for r in snap.records)  # the mask's -inf was seen, not flagged


@pytest.mark.parametrize("capacity,n_ops", [(16, 100), (7, 7), (64, 10)])
def test_ring_wraps_and_keeps_the_last_capacity_records(tmp_path, capacity, n_ops):
    import torch

    one = torch.ones(2)

    def fn():   # ops that run no op inside them: one record each on every hot path
        x = torch.empty(2)
        for _ in range(n_ops - 1):
            x = x + one

    snap = _record_inproc(tmp_path, fn, capacity=capacity)
    assert snap.started == n_ops and snap.capacity == capacity
    assert len(snap.records) == min(capacity, n_ops) and snap.dropped == max(0, n_ops - capacity)
    assert [r.seq for r in snap.records] == list(range(max(0, n_ops - capacity), n_ops))
    assert snap.torn == 0


@pytest.mark.parametrize("path", hotpaths.PATHS)
def test_torn_and_truncated_logs_are_tolerated(tmp_path, path):
    import torch

    one = torch.ones(3)

    def fn():
        x = torch.empty(3)
        for _ in range(9):
            x = x + one

    log = tmp_path / "ops.log"
    with trace.Recorder(log, capacity=32, **hotpaths.kw(path)) as rec:
        fn()
    rec.close()
    assert rec.hot_path == hotpaths.expected(path)
    lay = ring.layout_for("ops", 32, ring.DEFAULT_MEM_CAPACITY, ring.DEFAULT_STRING_CAPACITY)
    raw = bytearray(log.read_bytes())
    # a slot caught mid-write (commit marker -1), and garbage in another
    raw[lay.slot(9): lay.slot(9) + 8] = (-1).to_bytes(8, "little", signed=True)
    raw[lay.slot(5): lay.slot(5) + ring.SLOT_SIZE] = os.urandom(ring.SLOT_SIZE)
    torn = tmp_path / "torn.log"
    torn.write_bytes(bytes(raw))
    snap = trace.read(torn)
    assert [r.seq for r in snap.records] == [0, 1, 2, 3, 4, 6, 7, 8] and snap.torn == 2
    assert {r.name for r in snap.records} == {"aten.empty.memory_format", "aten.add.Tensor"}
    # cut off in the middle of slot 4: the first 4 records survive
    cut = tmp_path / "cut.log"
    cut.write_bytes(bytes(raw[: lay.slot(4) + 30]))
    assert [r.seq for r in trace.read(cut).records] == [0, 1, 2, 3]
    bad = tmp_path / "bad.log"
    bad.write_bytes(b"not a log at all")
    with pytest.raises(ValueError, match="not a gpulab trace log"):
        trace.read(bad)
    with pytest.raises(FileNotFoundError):
        trace.progress(tmp_path / "missing.log")


@pytest.mark.parametrize("body,rc,expect", [
    ("import sys; open(sys.argv[1], 'w').write(repr((__name__, sys.argv[1:], sys.path[0])))", 0, "argv"),
    ("import sys; sys.exit(3)", 3, None),
    ("raise KeyError('boom')", 1, "KeyError: 'boom'"),
])
def test_bootstrap_runs_script_as_python_would(tmp_path, body, rc, expect):
    script = tmp_path / "prog.py"
    script.write_text(body)
    out = tmp_path / "argv.txt"
    log = tmp_path / "x.log"
    p = subprocess.run([sys.executable, "-m", "gpulab.trace", "--log", str(log), "--", str(script), str(out), "-x"],
                       capture_output=True, text=True, timeout=120, env=_run._child_env(), start_new_session=True)
    assert p.returncode == rc, p.stderr
    if expect == "argv":
        name, argv, path0 = eval(out.read_text())
        assert (name, argv, path0) == ("__main__", [str(out), "-x"], str(tmp_path))
    elif expect:
        assert expect in p.stderr and "Traceback" in p.stderr
    assert trace.read(log).pid > 0


def test_bootstrap_usage_errors(tmp_path):
    p = subprocess.run([sys.executable, "-m", "gpulab.trace", "--log", str(tmp_path / "l"), "--mode", "fast",
                        "--", "x.py"], capture_output=True, text=True, timeout=60, env=_run._child_env())
    assert p.returncode == 2 and "invalid choice: 'fast'" in p.stderr
    with pytest.raises(ValueError, match="mode='fast' is not valid; choose one of ops, sync, gpu, stats, auto"):
        trace.Recorder(tmp_path / "l2", "fast")


def test_record_builtin_workload_and_exports(tmp_path):
    from gpulab.workloads import WorkloadConfig

    cfg = WorkloadConfig(rung="step", device="cpu", batch=1, heads=2, head_dim=8, text_tokens=4, image_tokens=8,
                         layers=1, lora_rank=2)
    rec = trace.record(cfg, mode="ops", out_dir=tmp_path, timeout_s=120)
    assert rec.ok, rec.stderr_tail
    snap = rec.snapshot
    assert snap.device == "cpu" and snap.started == snap.completed > 100 and not snap.in_flight()
    frame = trace.to_frame(snap)
    assert len(frame) == len(snap.records) and frame["dur_us"].ge(0).all()
    summ = trace.summary(frame)
    assert summ["count"].sum() == (frame["kind"] == "op").sum()
    assert "aten.addcdiv_.default" in set(summ["name"])  # AdamW ran under the recorder
    assert any("builtin_model.py" in s for s in frame["call_site"])
    path = trace.to_chrome_trace(snap, tmp_path / "trace.json")
    events = json.loads(path.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == len(snap.records)
    assert any(e["ph"] == "M" and e["name"] == "thread_name" for e in events)
    assert len(snap.memory) >= 1 and snap.memory[-1].allocated > 10 * 2**20  # RSS of a torch process


def test_record_timeout_kills_the_group_and_keeps_the_log(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text("import time, torch\nx = torch.ones(2) + 1\ntime.sleep(600)\n")
    t0 = time.time()
    # 20 s: under the recorder the two ops come after torch's import, which took over 8 s on CI's two cores
    # while the other test worker ran a chain (the log then held no op yet)
    rec = trace.record([sys.executable, str(script)], out_dir=tmp_path, timeout_s=20)
    assert rec.timed_out and rec.returncode is None and time.time() - t0 < 45
    assert [r.name for r in hotpaths.top(rec.snapshot.records)] == ["aten.ones.default", "aten.add.Tensor"]


def test_import_gpulab_trace_does_not_import_torch():
    p = subprocess.run([sys.executable, "-c", "import sys, gpulab.trace, gpulab.workloads; "
                        "print('torch' in sys.modules)"], capture_output=True, text=True, timeout=60,
                       env=_run._child_env())
    assert p.stdout.strip() == "False", p.stderr


def test_overhead_rows_are_computed_from_samples():
    from gpulab.trace.bench import rows

    r = {x.variant: x for x in rows({"none": [1.0, 1.0, 1.2], "passthrough": [1.1, 1.1], "ops": [1.15, 1.15]},
                                    ops=1000)}
    assert r["passthrough"].us_per_op == pytest.approx(100) and r["ops"].ratio == pytest.approx(1.5)
    with pytest.raises(ValueError, match="baseline='bare'"):
        rows({"none": [1.0]}, 10, baseline="bare")


def test_02_shows_the_busiest_process_when_the_program_is_a_launcher():
    from gpulab.trace import analysis

    rec = _run.Recording(None, None, 9, False, 12.0, "procs/7.log", ("torchrun",), "", "hang", 5.0, processes=2,
                         process_ops=900, shown="process 7 (rank 0)")
    headline, metrics = analysis.finding(rec, None, "step", "cpu", rec.log)
    assert "(in process 7 (rank 0))" in headline and "02 shows process 7 (rank 0)'s, the busiest" in headline
    assert metrics["processes"] == 2 and metrics["process_ops"] == 900
