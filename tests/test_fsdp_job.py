"""An FSDP2 job as users write one (torchrun, torch.compile'd blocks, DataLoader workers, DCP checkpoints) under
`gpulab watch`: it runs as it runs without gpulab, and when one rank calls a collective the others never call,
the verdict names that rank, the call and its line. Real ranks in real processes (gloo on the CPU; NCCL with the
gpu marker on two GPUs)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FIX = Path(__file__).parent / "fixtures"
SCRIPT = FIX / "fsdp_compiled_train.py"
FAULT_LINE = next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "# FAULT" in line)
BACKENDS = ["gloo", pytest.param("nccl", marks=pytest.mark.gpu)]


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT),
            *args]


def _env(backend: str) -> dict | None:
    if backend == "gloo":
        return {**os.environ, "CUDA_VISIBLE_DEVICES": ""}   # the script takes NCCL wherever it sees a GPU
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    return None


def _watch(out: Path, argv: list[str], env, stall: int = 8) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpulab", "watch", "--stall", str(stall), "--quiet", "--out",
                           str(out), "--", *argv], capture_output=True, text=True, timeout=420, env=env)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rank_that_alone_calls_a_collective_is_named_with_its_line(tmp_path, backend):
    env = _env(backend)
    out = tmp_path / "w"
    r = _watch(out, _torchrun("--ckpt", str(tmp_path / "ckpt"), "--fault", "metric"), env)
    v = json.loads((out / "verdict.json").read_text())
    assert (v["status"], v["class"]) == ("hang", "skipped_collective"), (v["evidence"], r.stderr[-2000:])
    assert v["culprit"] == "rank 1/2", v["evidence"]
    assert v["in_flight_op"]["call_site"].endswith(f"fsdp_compiled_train.py:{FAULT_LINE} in main"), v["in_flight_op"]
    d = v["divergence"]
    # rank 0 in the next forward's FSDP all_gather (NCCL's is all_gather_into_tensor)
    assert d["op"] in ("all_gather", "all_gather_into_tensor") and d["mismatch"] == "op", d
    assert f"fsdp_compiled_train.py:{FAULT_LINE}" in v["owner"]["where"], v["owner"]
    assert any("calls all_reduce (f32[1]) at" in e and f"fsdp_compiled_train.py:{FAULT_LINE}" in e
               for e in v["evidence"]), v["evidence"]
    # the checkpoint's scatter before it (root and non-root hold different shapes) is not the divergence, and
    # Inductor's helper processes, which inherit RANK, are not ranks
    ranks = sorted(p["role"] for p in v["processes"] if p["kind"] == "rank")
    assert ranks == ["rank 0/2", "rank 1/2"], [(p["pid"], p["role"], p["kind"]) for p in v["processes"]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_job_under_gpulab_is_the_job_without_it(tmp_path, backend):
    """The same losses step by step and the same dynamo counters (graphs, captured calls), watched or not. On
    gloo the blocks run eager: compiling them twice more would cost the CPU suite a minute, and a compiled step's
    counters under the recorder are test_compiled's; the fault test above compiles on gloo, NCCL here does."""
    env = _env(backend)
    compiled = "0" if backend == "gloo" else "1"
    argv = _torchrun("--ckpt", str(tmp_path / "plain"), "--steps", "6", "--compile", compiled)
    plain = subprocess.run(argv, capture_output=True, text=True, timeout=420, env=env)
    assert plain.returncode == 0, plain.stderr[-3000:]
    watched = _watch(tmp_path / "w", _torchrun("--ckpt", str(tmp_path / "watched"), "--steps", "6", "--compile",
                                               compiled), env, stall=60)
    assert watched.returncode == 0, watched.stderr[-3000:]
    v = json.loads((tmp_path / "w" / "verdict.json").read_text())
    assert v["status"] == "ok", v["evidence"]

    def lines(text: str) -> list[str]:
        return [x for x in text.splitlines() if x.startswith(("step ", "dynamo "))]
    kept = (tmp_path / "w" / "stdout.txt").read_text()   # --quiet: the job's output is in the folder alone
    assert lines(plain.stdout) == lines(kept) and len(lines(plain.stdout)) == 7, (lines(plain.stdout), lines(kept))
    counters = json.loads(lines(plain.stdout)[-1].split(" ", 1)[1])
    assert (counters.get("unique_graphs", 0) >= 1) == (compiled == "1"), counters   # compiled where asked
