"""The one-pass CUDA fingerprint (gpulab.numerics.fused) against the aten figures it replaces, on the GPU: the
same sums, checksum, counts and sample for every dtype it reads, strided and empty outputs, NaN/Inf, a
tensor larger than one pass of all programs; and the same figures, bitwise, for the same values twice."""
from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")

from gpulab.numerics import fingerprints, fused, lines  # noqa: E402

pytestmark = pytest.mark.gpu


def _records(tensors, path, force_aten: bool):
    fp = fingerprints.Fingerprints(str(path))
    if force_aten:
        fp.sinks[torch.device("cuda:0")] = fingerprints._AtenSink(torch.device("cuda:0"), fp._index)
        fp.block = fingerprints.CAP
    for t in tensors:
        fp.add(t, ["op", "site", 1, False, 0, [], 1])
    fp.close()
    return [lines.decode(json.loads(line)) for line in path.read_text().splitlines()]


def _cases():
    g = torch.Generator(device="cuda").manual_seed(0)
    out = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        for n in (1, 7, 31, 32, 33, 1024, 1025, 300_001):
            out.append((torch.randn(n, device="cuda", generator=g) * 3).to(dtype))
        big = torch.randn(fused.PMAX * fused.BLOCK * 2 + 17, device="cuda", generator=g).to(dtype)
        out.append(big)
        out.append(torch.randn(64, 96, device="cuda", generator=g).to(dtype).t())           # strided
        bad = torch.randn(4097, device="cuda", generator=g).to(dtype)
        bad[[3, 100, 4000]] = float("nan")
        bad[[5, 4096]] = float("inf")
        bad[7] = -float("inf")
        out.append(bad)
        out.append(torch.empty(0, 5, device="cuda", dtype=dtype))
    out.append(torch.randn(300, device="cuda", generator=g).to(torch.float8_e4m3fn))     # the aten fallback
    return out


@pytest.mark.parametrize("alone", [False, True], ids=["batched", "each-launched-alone"])
def test_the_fused_figures_are_the_aten_figures(tmp_path, monkeypatch, alone):
    if fused.triton is None:
        pytest.skip("no Triton in this torch")
    if alone:   # every output over the batch's byte bound: one launch each, not held
        monkeypatch.setattr(fused, "BATCH_BYTES", 1)
    cases = _cases()
    got = _records(cases, tmp_path / "fused.jsonl", False)
    want = _records(cases, tmp_path / "aten.jsonl", True)
    assert len(got) == len(want) == len(cases)
    for t, g, w in zip(cases, got, want):
        what = f"{t.dtype} {tuple(t.shape)}"
        assert (g["ck"], g["nan"], g["inf"], g["n"]) == (w["ck"], w["nan"], w["inf"], w["n"]), what
        for key in ("sum", "asum", "amax"):
            a, b = g[key], w[key]
            if isinstance(a, float) and math.isnan(a):
                assert math.isnan(b), (what, key, a, b)
            else:
                assert a == pytest.approx(b, rel=1e-9, abs=1e-9), (what, key, a, b)
        assert g["sample"] == pytest.approx(w["sample"], rel=0, abs=0, nan_ok=True), what


def test_the_same_values_give_bitwise_the_same_figures_batched_or_alone(tmp_path, monkeypatch):
    if fused.triton is None:
        pytest.skip("no Triton in this torch")
    x = torch.randn(5_000_003, device="cuda", dtype=torch.bfloat16)
    a = _records([x, x * 1, x[1:]], tmp_path / "a.jsonl", False)     # x[1:]: not 16-byte aligned
    monkeypatch.setattr(fused, "BATCH_BYTES", 1)
    b = _records([x.clone(), x[1:].clone()], tmp_path / "b.jsonl", False)
    keys = ("sum", "asum", "amax", "ck", "nan", "inf", "sample")
    assert [a[0][k] for k in keys] == [a[1][k] for k in keys] == [b[0][k] for k in keys]
    assert [a[2][k] for k in keys] == [b[1][k] for k in keys]


def test_an_input_no_recorded_op_made_is_read_before_an_in_place_op_writes_it(tmp_path):
    """Its figures wait in a batch like an output's: the op must not run before they are read (DDP's bucket read
    as the all_reduce's input showed the all-reduced values)."""
    if fused.triton is None:
        pytest.skip("no Triton in this torch")
    from gpulab.numerics import record

    x = torch.ones(1000, device="cuda")         # made before recording: an <input> where first read
    fp = fingerprints.Fingerprints(str(tmp_path / "r.jsonl"))
    with record.make_mode(fp)():
        x.mul_(3)
    fp.close()
    rows = [lines.decode(json.loads(line)) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    got = {r["op"]: r["sum"] for r in rows}
    assert got == {"<input>": 1000.0, "aten.mul_.Tensor": 3000.0}, rows


def test_an_output_written_in_place_is_read_as_its_op_made_it(tmp_path):
    """Outputs wait in a batch; an op that writes in place first has them read."""
    if fused.triton is None:
        pytest.skip("no Triton in this torch")
    from gpulab.numerics import record

    fp = fingerprints.Fingerprints(str(tmp_path / "r.jsonl"))
    with record.make_mode(fp)():
        x = torch.ones(1000, device="cuda")
        y = x * 2                      # waits in a batch
        y.add_(1)                      # writes y in place: y's record must still say 2000
    fp.close()
    rows = [lines.decode(json.loads(line)) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    mul = [r for r in rows if r["op"] == "aten.mul.Tensor"][0]
    add = [r for r in rows if r["op"] == "aten.add_.Tensor"][0]
    assert (mul["sum"], add["sum"]) == (2000.0, 3000.0)
