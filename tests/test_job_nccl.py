"""gpulab.hang.jobs.jobread + gpulab.hang.jobs.job on what gpulab watch captured of four training jobs hung on two H100s with
NCCL (tests/fixtures/jobs/nccl_training_hangs.json; the programs: tests/fixtures/train_job.py). NCCL returns from
a collective at launch: the host blocks later, elsewhere (a torch.save, a .item(), the next collective), ranks
issue collectives past the first one that can never complete, and a rank's barrier (an all_reduce of one element)
pairs with the others' gradient all_reduce of the same number, completes on its side and lets it go on. The
first collective of each rank that never completed judges the job, not where its host is now."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from gpulab.hang.jobs import job, jobread
from gpulab.trace.ring import OpRecord

FIXTURES = Path(__file__).parent / "fixtures"
DATA = json.loads((FIXTURES / "jobs" / "nccl_training_hangs.json").read_text())


def _records(rows: list) -> list[OpRecord]:
    threads = {"MainThread": "MainThread (1)", "native": "native (2)"}
    return [OpRecord(seq=seq, name=name, args=list(args), call_site=site, thread=threads[thread], t_start=t0,
                     t_end=t1, gpu_done=gpu, stats=None, depth=depth)
            for seq, name, thread, depth, t0, t1, gpu, site, args in rows]


def views_of(case: str, tmp_path: Path, ask: bool = True) -> list[job.ProcessView]:
    """The ranks' views, as jobread.views makes them from the job's folder (here: what the folder held).
    ask=False: as if no rank had answered (each one holding the GIL)."""
    left, pythons, seen = {}, {}, {}
    for r in DATA["cases"][case]["ranks"]:
        records = _records(r["records"])
        meta = {"pid": r["pid"], "ppid": 1, "argv": ["python3", str(FIXTURES / "train_job.py")], "rank": r["rank"],
                "world": r["world"], "backend": "nccl"}
        snap = SimpleNamespace(records=records, completed=sum(x.t_end is not None for x in records), dropped=0)
        left[r["pid"]] = jobread.Left(meta, None, snap, r["answer"] if ask else None)
        pythons[r["pid"]] = r["stack"].replace("{FIXTURES}", str(FIXTURES))
        seen[r["pid"]] = {"state": "running", "last_progress_s": r["last_progress_s"]}
    return jobread.views(tmp_path, pythons, seen=seen, left=left)


def row(f: job.JobFinding, role: str) -> dict:
    return next(p for p in f.processes if p["role"] == role)


# id, class, the seq that never completes on rank 0, its op, rank 1's collective in the table (seq, op, done)
CASES = [
    ("ddp_uneven_torchrun", "uneven_inputs", 9, "all_reduce", (9, "barrier", True)),
    ("ddp_nan_spawn", "skipped_collective", 9, "all_reduce", (9, "barrier", True)),
    ("funcol_nan_torchrun", "skipped_collective", 13, "all_reduce", (13, "barrier", True)),
    ("fsdp_uneven_spawn", "uneven_inputs", 19, "all_gather_into_tensor", (18, "reduce_scatter_tensor", True)),
]


@pytest.mark.parametrize("case, cls, seq, op, left", CASES, ids=[c[0] for c in CASES])
def test_the_first_collective_that_never_completed_judges_the_job(tmp_path, case, cls, seq, op, left):
    f = job.analyse(views_of(case, tmp_path))
    d = f.divergence
    assert (f.cls, f.culprit) == (cls, "rank 1/2"), f.evidence
    assert (d.group, d.seq, d.op, d.waiting, d.missing) == ("default", seq, op, ("rank 0/2",), ("rank 1/2",))
    r0, r1 = row(f, "rank 0/2")["collective"], row(f, "rank 1/2")["collective"]
    assert (r0["seq"], r0["op"], r0["done"]) == (seq, op, False)   # the table and the verdict agree
    assert (r1["seq"], r1["op"], r1["done"]) == left
    paired = left[0] == seq   # rank 1's barrier took the number of rank 0's all_reduce
    assert set(d.paired) == ({"rank 1/2"} if paired else set())
    assert (r1.get("paired_with") == "all_reduce of rank 0/2") == paired
    if paired:
        assert any(f"called their different collectives as the same number {seq}" in e and "rank 1/2 completed" in e
                   for e in f.evidence), f.evidence
    word = "fewer steps" if cls == "uneven_inputs" and case.startswith("ddp") else "as many steps" \
        if cls == "skipped_collective" else "either way it left the loop"
    assert any(word in e for e in f.evidence), f.evidence


def test_a_rank_holding_the_gil_is_numbered_from_its_op_log(tmp_path):
    """DDP, uneven inputs: rank 0 is in torch.save's storage.cpu(), which holds the GIL, and answered nothing;
    its gradient all_reduce is numbered by counting the c10d ops its op log holds from its first record, and its
    GPU work there never completed (the NCCL record inside it is pending)."""
    views = {v.role: v for v in views_of("ddp_uneven_torchrun", tmp_path)}
    calls = [c for c in views["rank 0/2"].collectives if c.group == "default"]
    assert [(c.seq, c.op) for c in calls] == [(1, "all_gather"), (2, "broadcast"), (3, "broadcast"),
                                              (4, "all_reduce"), (5, "broadcast"), (6, "broadcast"),
                                              (7, "all_reduce"), (8, "all_reduce"), (9, "all_reduce")]
    assert [c.done for c in calls] == [True] * 8 + [False]
    assert all(c.counted and c.by_torch for c in calls[3:])
    # DDP's reducer runs on the autograd engine's thread: the line is the main thread's, loss.backward()
    assert calls[-1].call_site == "fixtures/train_job.py:68 in train"
    assert [(c.seq, c.op, c.done) for c in views["rank 1/2"].collectives][-1] == (9, "barrier", True)


@pytest.mark.parametrize("case", ["ddp_uneven_torchrun", "ddp_nan_spawn", "funcol_nan_torchrun", "fsdp_uneven_spawn"])
def test_the_op_logs_alone_give_the_same_finding(tmp_path, case):
    """No rank answered (each held the GIL): the op logs' counts, anchored at the numbers the program's own
    torch.distributed calls carry, give the finding the flight recorder gives."""
    asked, alone = job.analyse(views_of(case, tmp_path)), job.analyse(views_of(case, tmp_path, ask=False))
    assert (alone.cls, alone.culprit, alone.divergence.seq) == (asked.cls, asked.culprit, asked.divergence.seq)


def test_a_function_called_from_the_loop_is_placed_in_it(tmp_path):
    """Functional collectives: average_gradients() issues the all_reduce (line 47) from the loop (line 70); rank
    0's host has left both for the barrier after the loop, so only the source says where it was issued from."""
    views = {v.role: v for v in views_of("funcol_nan_torchrun", tmp_path)}
    assert views["rank 0/2"].callers["fixtures/train_job.py:47"] == "fixtures/train_job.py:70"
    f = job.analyse(list(views.values()))
    assert any("from fixtures/train_job.py:47 (called from fixtures/train_job.py:70)" in e for e in f.evidence)


def test_calls_that_differ_and_never_complete_on_either_side_stay_a_mismatch():
    """Pairing needs one side done: two ranks each waiting in a different call is the plain mismatch, and a
    tie names nobody."""
    a = job.Collective("all_reduce", "default", 2, "f32[4]", "t.py:1", False, None, 2.0)
    b = job.Collective("barrier", "default", 2, "", "t.py:9", False, None, 2.0)
    done = job.Collective("all_reduce", "default", 1, "f32[4]", "t.py:1", True, None, 1.0, 1.1)
    views = [job.ProcessView(pid=10 + r, ppid=1, role=f"rank {r}/2", kind="rank", state="running", rank=r, world=2,
                             collectives=(done, c)) for r, c in enumerate((a, b))]
    f = job.analyse(views)
    assert (f.cls, f.culprit, f.divergence.paired, f.divergence.missing) == ("collective_mismatch", None, {}, ())
    paired = [dataclasses.replace(v, collectives=(done, dataclasses.replace(b, done=True, t_end=2.1)))
              if v.rank == 1 else v for v in views]
    f = job.analyse(paired)   # the same, but rank 1's barrier completed: NCCL paired them; who is wrong is unknown
    assert (f.cls, f.culprit, f.divergence.missing) == ("collective_mismatch", None, ("rank 1/2",))
    assert any("which side's call is out of place the calls alone do not tell" in e for e in f.evidence)


def test_a_launcher_that_only_waits_is_never_the_finding(tmp_path):
    """The job's processes agree (nothing cross-process explains the stall) and the process the watchdog started
    is torchrun's agent: where it sleeps is no evidence of the job, and the verdict does not say it is."""
    from gpulab.hang.watchdog import evidence
    from gpulab.hang.verdict import Verdict

    done = job.Collective("all_reduce", "default", 1, "f32[4]", "t.py:1", True, None, 1.0, 1.1)
    ranks = [job.ProcessView(pid=11 + r, ppid=10, role=f"rank {r}/2", kind="rank", state="running", rank=r, world=2,
                             collectives=(done,), ops_completed=50) for r in range(2)]
    agent = job.ProcessView(pid=10, ppid=1, role="launcher (pid 10: torchrun t.py)", kind="launcher",
                            state="running", supervises=True, frame="server/api.py:908 in _invoke_run")
    views = ranks + [agent]
    finding = job.analyse(views)
    assert finding.cls is None
    v = Verdict(status="hang", phase="startup", cls="unknown", in_flight_op=None,
                host_blocked_in={"name": "_invoke_run (Python frame, not a recorded op)"}, last_completed_op=None,
                ops_completed=0, signal=None, exit_code=-9, elapsed_s=20.0, stacks={},
                evidence=("status hang, phase startup", "no recorded op was open: the host thread is in _invoke_run",
                          "no rule matched the evidence",
                          "the watchdog stopped the whole process tree after the capture; exit code -9"),
                planted=None, capture_s={}, command=("torchrun", "t.py"), log={})
    out = evidence.with_job(v, tmp_path, 10, views, finding, {})
    assert (out.cls, out.phase, out.host_blocked_in) == ("unknown", "ops", None)
    assert not any("_invoke_run" in e or e.startswith("status ") for e in out.evidence), out.evidence
    assert "the watchdog stopped the whole process tree after the capture; exit code -9" in out.evidence
    assert any("all 2 members called seq 1 to 1 alike" in e for e in out.evidence)
