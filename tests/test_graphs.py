"""CUDA graph replays recorded as one record each, named for the place the graph was captured."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpulab import trace
from gpulab.hang.watchdog import watch
from gpulab.trace import native
from gpulab.trace.run import _child_env

FIXTURE = Path(__file__).parent / "fixtures" / "gpu_graph_spin.py"


def test_a_replay_is_one_record_named_for_its_capture_site(tmp_path, monkeypatch):
    """On the CPU torch has no CUDA graphs: a stand-in with CUDAGraph's two methods takes its place (what the
    wrapper does is the same), and a replay that raises is closed as raised."""
    import torch

    if native.load_observer() is None:
        pytest.skip("the observer is not built here (no C++ compiler or torch headers)")

    class Graph:   # capture_begin and replay, as torch.cuda.CUDAGraph has them
        def capture_begin(self, *args, **kwargs):
            self.captured = True

        def replay(self):
            if getattr(self, "fail", False):
                raise RuntimeError("replay failed")
            torch.ones(2).add_(1)   # an op the replay runs (a real replay runs none through the dispatcher)

    class Stream:
        cuda_stream, device_index = 0, 0

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
    with trace.Recorder(tmp_path / "g.log", "ops") as rec:
        g = Graph()
        g.capture_begin()   # the line the name must carry
        g.replay()
        g.fail = True
        with pytest.raises(RuntimeError):
            g.replay()
    assert Graph.replay.__name__ == "replay" and not hasattr(Graph.replay, "__gpulab_graphs__")   # undone
    assert rec.hot_path == "observer"
    recs = [r for r in trace.read(tmp_path / "g.log").records if r.name.startswith("cuda graph replay")]
    line = Path(__file__).read_text().splitlines().index("        g.capture_begin()   # the line the name must carry") + 1
    assert [r.name for r in recs] == [f"cuda graph replay (captured at tests/test_graphs.py:{line} in "
                                      f"test_a_replay_is_one_record_named_for_its_capture_site)"] * 2, recs
    assert [r.raised for r in recs] == [False, True]
    assert all(r.call_site.startswith("tests/test_graphs.py:") for r in recs)
    assert recs[0].kind == "composite"   # what ran inside it is nested


@pytest.mark.gpu
def test_replays_on_the_gpu_are_records_whose_completion_is_tracked(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    log = tmp_path / "ops.log"
    p = subprocess.run([sys.executable, "-m", "gpulab.trace", "--log", str(log), "--", str(FIXTURE), "--replays", "3"],
                       capture_output=True, text=True, timeout=300, env=_child_env())
    assert p.returncode == 0, p.stderr
    recs = [r for r in trace.read(log).records if r.name.startswith("cuda graph replay")]
    assert len(recs) == 3 and all("gpu_graph_spin.py" in r.name and r.gpu_done for r in recs), recs


@pytest.mark.gpu
def test_a_replay_that_never_completes_is_named_with_its_capture_site(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    v = watch.run([sys.executable, str(FIXTURE), "--hang"], stall_s=6, timeout_s=300, out_dir=tmp_path / "w")
    assert v.status == "hang", v.evidence
    op = v.in_flight_op
    assert op["name"].startswith("cuda graph replay (captured at ") and "gpu_graph_spin.py" in op["name"], \
        (op, v.evidence)
    assert op["gpu_done"] is False and "gpu_graph_spin.py" in op["call_site"], op
