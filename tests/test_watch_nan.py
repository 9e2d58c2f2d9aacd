"""`gpulab watch --mode stats` on a real training loop whose loss turns NaN (a per-row std that is 0 in one
batch): the verdict names the first NaN's op, line, pass and cause and the next step says where to fix it;
`gpulab run --from` that capture answers wrong_numbers with the same line, without running the loop again. In
the default mode nothing reads the outputs, and the verdict says nothing of NaN."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOOP = ROOT / "tests" / "fixtures" / "nan" / "div_std.py"
# `gpulab run --from` on the device the CPU programs ran on: cpu resolves without torch, while auto on a GPU host has the runner
# ask torch in a child (a torch import, ~3 CPU-s)
CPU = ("-p", "device=cpu")


def _gpulab(args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpulab", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def test_watch_in_stats_mode_names_the_first_nan_and_the_chain_reads_it_from_the_capture(tmp_path):
    cap = tmp_path / "cap"
    r = _gpulab(["watch", "--mode", "stats", "--quiet", "--status-every", "0", "--out", str(cap), "--",
                 "python", str(LOOP)], timeout=180)
    assert r.returncode == 0, r.stderr            # the loop itself ends well: its numbers are what is wrong
    v = json.loads((cap / "verdict.json").read_text())
    nan = v["first_nonfinite"]
    assert (nan["op"], nan["call_site"], nan["pass"]) == ("aten.div.Tensor", "nan/div_std.py:21 in main", 5), nan
    assert "divisor holds zeros" in nan["cause"]
    assert any(e.startswith("first NaN/Inf: NaN first made by aten.div.Tensor at nan/div_std.py:21") for e in
               v["evidence"]), v["evidence"]
    assert "next step: fix the program's line nan/div_std.py:21 in main" in r.stdout, r.stdout

    out = tmp_path / "o"
    r = _gpulab(["run", "--from", str(cap), "--only", "02", "--out", str(out), *CPU], timeout=300)
    assert r.returncode == 0 and "verdict: baseline wrong_numbers" in r.stderr, r.stderr
    run = json.loads(((out / "latest").resolve() / "run.json").read_text())
    sc = run["scenarios"][0]
    assert "aten.div.Tensor at nan/div_std.py:21 in main (pass 5)" in json.dumps(sc), sc


def test_a_nan_made_in_a_dataloader_worker_is_named_there_with_the_worker(tmp_path):
    """The Dataset's per-sample standardization divides by a zero std inside DataLoader worker 0: the worker's op
    and line are named (not the main process, where the NaN only arrives with the batch), and the sentence says
    whose passes the pass counts."""
    cap = tmp_path / "cap"
    r = _gpulab(["watch", "--mode", "stats", "--quiet", "--status-every", "0", "--out", str(cap), "--",
                 "python", str(LOOP.parent / "worker_std.py")], timeout=180)
    assert r.returncode == 0, r.stderr
    nan = json.loads((cap / "verdict.json").read_text())["first_nonfinite"]
    lines = (LOOP.parent / "worker_std.py").read_text().splitlines()
    line = next(n for n, text in enumerate(lines, 1) if text.endswith("# STANDARDIZE"))
    assert (nan["op"], nan["call_site"], nan["worker"]) == ("aten.div.Tensor",
                                                            f"nan/worker_std.py:{line} in __getitem__", 0), nan
    assert nan["pass"] == 22 and "divisor holds zeros" in nan["cause"], nan
    assert nan["sentence"].startswith("DataLoader worker 0 of 2 (its passes count that worker's calls): "), nan
    # the chain on that capture: the worker's line, not the main process's unpickling of the batch it received
    # (which had read as "python's code at multiprocessing/queues.py ... report it to python")
    out = tmp_path / "o"
    r = _gpulab(["run", "--from", str(cap), "--only", "02", "--out", str(out), *CPU], timeout=300)
    assert r.returncode == 0 and "verdict: baseline wrong_numbers" in r.stderr, r.stderr
    sc = json.loads(next(out.glob("*/run.json")).read_text())["scenarios"][0]
    assert sc["next_step"].startswith(f"fix the program's line nan/worker_std.py:{line} in __getitem__"), sc["next_step"]


def test_watch_in_its_default_mode_reads_no_values_but_points_at_the_nan_the_program_printed(tmp_path):
    """The default mode computes nothing of the outputs (no first NaN), yet a run that ended well while printing
    'loss nan' is not left reading as healthy: the line is quoted and stats mode is the next step."""
    r = _gpulab(["watch", "--quiet", "--status-every", "0", "--out", str(tmp_path / "cap"), "--",
                 "python", str(LOOP)], timeout=180)
    v = json.loads((tmp_path / "cap" / "verdict.json").read_text())
    assert r.returncode == 0 and v["status"] == "ok" and v["first_nonfinite"] is None
    assert v["printed_nonfinite"] == "step 5 loss nan", v["printed_nonfinite"]
    assert any(e.startswith("the program printed a NaN or an infinity ('step 5 loss nan')") for e in v["evidence"])
    assert "next step: find where the NaN/Inf the program printed starts: rerun it as `gpulab watch --mode stats" \
        in r.stdout, r.stdout


def test_a_nan_made_inside_a_compiled_graph_is_not_blamed_on_the_data_and_eager_names_its_op(tmp_path):
    """The recorder does not see inside torch.compile'd graphs: the first op to read their NaN is not where it
    was made, and the data is not to blame either. The verdict says so and how to tell; run eager as it says,
    the op itself (the log at its line) is named."""
    loop = ROOT / "tests" / "fixtures" / "nan" / "compiled_log.py"
    r = _gpulab(["watch", "--mode", "stats", "--quiet", "--status-every", "0", "--out", str(tmp_path / "c"), "--",
                 "python", str(loop)], timeout=300)
    nan = json.loads((tmp_path / "c" / "verdict.json").read_text())["first_nonfinite"]
    assert nan["op"] == "aten.mean.default" and "made inside a torch.compile'd graph" in nan["cause"], nan
    assert nan["next_step"].startswith("run it eager (TORCHDYNAMO_DISABLE=1)"), nan
    assert "the data: the batch" not in nan["sentence"] and "check the data where it is loaded" not in r.stdout, r.stdout

    env = {**os.environ, "TORCHDYNAMO_DISABLE": "1"}
    p = subprocess.run([sys.executable, "-m", "gpulab", "watch", "--mode", "stats", "--quiet", "--status-every", "0",
                        "--out", str(tmp_path / "e"), "--", "python", str(loop)], capture_output=True, text=True,
                       timeout=300, cwd=ROOT, env=env)
    eager = json.loads((tmp_path / "e" / "verdict.json").read_text())["first_nonfinite"]
    line = next(n for n, text in enumerate(loop.read_text().splitlines(), 1) if "torch.log(h)" in text)
    assert eager["op"] == "aten.log.default" and eager["call_site"].endswith(f"compiled_log.py:{line} in forward"), (
        eager, p.stderr)
    assert "log" in eager["cause"] and "<= 0" in eager["cause"], eager


def test_in_a_ddp_job_the_rank_whose_op_made_the_nan_is_named_not_the_rank_it_reached(tmp_path):
    """Under torchrun each rank records; rank 0's first NaN came through DDP's all-reduce (no op of rank 0 made
    it), rank 1's was made by its division. Watch and the chain on the capture name rank 1's line and pass."""
    job = ROOT / "tests" / "fixtures" / "nan" / "ddp_div.py"
    cap = tmp_path / "cap"
    r = _gpulab(["watch", "--mode", "stats", "--quiet", "--status-every", "0", "--out", str(cap), "--",
                 sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(job)],
                timeout=300)
    assert r.returncode == 0, r.stderr
    nan = json.loads((cap / "verdict.json").read_text())["first_nonfinite"]
    line = next(n for n, text in enumerate(job.read_text().splitlines(), 1) if "x = x / scale" in text)
    assert (nan["rank"], nan["op"], nan["call_site"], nan["pass"]) == (1, "aten.div.Tensor",
                                                                      f"nan/ddp_div.py:{line} in main", 3), nan
    assert "divisor holds zeros" in nan["cause"]

    out = tmp_path / "o"
    r = _gpulab(["run", "--from", str(cap), "--only", "02", "--out", str(out), *CPU], timeout=300)
    sc = json.loads(((out / "latest").resolve() / "run.json").read_text())["scenarios"][0]
    assert sc["verdict"] == "wrong_numbers" and f"aten.div.Tensor at nan/ddp_div.py:{line} in main (pass 3)" in \
        sc["evidence"], sc["evidence"]


def test_02_on_a_torchrun_job_names_the_rank_whose_op_made_the_nan(tmp_path, monkeypatch):
    """The chain's own stats-mode run of a launched job: 02 reads the rank where an op made the NaN, not the
    busiest rank (rank 0, where the all-reduce brought it and no op made it)."""
    from chainrun import chain

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    job = ROOT / "tests" / "fixtures" / "nan" / "ddp_div.py"
    res, run, _ = chain(ROOT, tmp_path, f"torchrun --standalone --nproc-per-node 2 {job}", only=("02",))
    sc = run["scenarios"][0]
    line = next(n for n, text in enumerate(job.read_text().splitlines(), 1) if "x = x / scale" in text)
    assert sc["verdict"] == "wrong_numbers" and f"aten.div.Tensor at nan/ddp_div.py:{line} in main (pass 3)" in \
        sc["evidence"], (sc["evidence"], res.stderr[-2000:])
