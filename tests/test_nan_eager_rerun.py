"""02's eager rerun: when the stats-mode run's first NaN/Inf came out of torch.compile'd code (the recorder does
not see inside a graph), 02 runs the same program once more with TORCHDYNAMO_DISABLE=1 and names the op there;
where eager makes none, the compiled code is named, not the data. Real compiled programs in real children."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpulab.trace import analysis, firstnan
from gpulab.trace import run as trace_run

LOG = Path(__file__).parent / "fixtures" / "nan" / "compiled_log.py"


def _line(script: Path, text: str) -> int:
    return next(n for n, ln in enumerate(script.read_text().splitlines(), 1) if text in ln)


def _stats(tmp_path: Path, *args: str):
    """02's stats check of compiled_log.py as the chain makes it: a stats-mode run, then stats_recording's
    judgement."""
    cmd = [sys.executable, str(LOG), *args]
    first = trace_run.record(cmd, mode="stats", out_dir=tmp_path, name="stats", timeout_s=240, stall_s=60)
    assert first.ok, first.stderr_tail
    assert firstnan.hidden_by_compile(firstnan.read(first.log)), firstnan.read(first.log)
    return first, trace_run.stats_recording(first, cmd, out_dir=tmp_path, ran=first, timeout_s=240, stall_s=60)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_nan_made_inside_a_compiled_graph_is_named_by_the_eager_rerun(tmp_path, device):
    """On CUDA the graph is Inductor's Triton kernels, on the CPU its C++ ones: the recorder sees neither."""
    first, (rec, note) = _stats(tmp_path, "--device", device)
    assert rec is not first and Path(rec.log).name == "stats_eager.log" and note == firstnan.EAGER_NOTE
    got = firstnan.read(rec.log)
    assert got["op"] == "aten.log.default" and got["rerun"] == "eager"
    assert got["call_site"].endswith(f"compiled_log.py:{_line(LOG, 'torch.log(h)')} in forward")
    _, m = analysis.finding(first, rec, None, "cpu", "ops.log", mode="stats")
    assert "in the eager rerun, TORCHDYNAMO_DISABLE=1" in m["first_nonfinite_where"]
    assert m["first_nonfinite_owner"] == "program" and m["first_nonfinite_next"].startswith(
        f"fix the program's line nan/compiled_log.py:{_line(LOG, 'torch.log(h)')} in forward")


def test_a_nan_only_the_compiled_program_makes_is_torch_compiles_not_the_datas(tmp_path):
    first, (rec, note) = _stats(tmp_path, "--only-compiled")
    assert rec is first and "made no NaN/Inf: the compiled code makes it, not the data" in note
    got = firstnan.read(rec.log)
    assert got["eager"] == "clean" and not firstnan.hidden_by_compile(got)
    assert firstnan.whose(got).startswith("torch.compile's code")
    step = firstnan.next_step(got)
    assert step.startswith("compare the program eager against compiled op by op") and "check the data" not in step
    assert (tmp_path / "stats_eager.log").exists()   # the eager run's own log is kept beside it


@pytest.mark.parametrize("rec,hidden", [
    ({"op": "aten.mean.default", "compiled": True, "cause": {"kind": "input_nan", "input": 0}, "inputs": [{}]}, True),
    ({"op": "aten.mean.default", "compiled": True, "cause": {"kind": "input_nan", "input": 0}, "inputs": [{}],
      "eager": "clean"}, False),
    ({"op": "aten.mean.default", "compiled": False, "cause": {"kind": "input_nan", "input": 0}, "inputs": [{}]}, False),
    ({"op": "aten.log.default", "compiled": True, "cause": {"kind": "log_domain"}}, False),
    (None, False),
])
def test_only_a_nan_the_recorder_could_not_see_made_asks_for_the_eager_rerun(rec, hidden):
    """A NaN an op the recorder saw made is named already; one from the data in an eager program is the
    data's; one already rerun eager is not rerun again."""
    assert firstnan.hidden_by_compile(rec) is hidden
