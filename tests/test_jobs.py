"""Many processes, one verdict: real jobs (gloo ranks by mp.spawn and torchrun, DataLoader workers by fork
and spawn, a Python subprocess, two "nodes" on one host, NCCL ranks on two GPUs) under the watchdog. Every
process of the job is recorded with no change to it; the verdict names the process, the group, the
collective and its sequence number; nothing is left running (conftest checks every test)."""
from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
from pathlib import Path

import pytest

from gpulab import proc
from gpulab.hang import classify, owner
from gpulab.hang.jobs import merge
from gpulab.hang.watchdog import watch

FIX = Path(__file__).parent / "fixtures"
DIST, NCCL, TRAIN = str(FIX / "dist_job.py"), str(FIX / "nccl_job.py"), str(FIX / "train_job.py")
STALL = 3.0


def watched(tmp_path: Path, *command: str, name: str = "w", stall: float = STALL):
    """As `gpulab watch` runs it: the verdict with the fixes it points at."""
    from gpulab.fixes import suggest

    return watch.run(list(command), stall_s=stall, timeout_s=120, out_dir=tmp_path / name, progress=lambda m: None,
                     finish=suggest.with_suggestions)


def roles(v) -> dict[str, dict]:
    return {p["role"]: p for p in v.processes}


@pytest.mark.parametrize("world", [2, 3])
def test_a_rank_that_skips_a_collective_is_named_with_both_calls(tmp_path, world):
    """2: a tie, one call against the other; 3: two ranks in all_reduce outnumber the one in the barrier (the
    smallest majority: each rank is one more process importing torch)."""
    v = watched(tmp_path, sys.executable, DIST, "skip", "--world", str(world))
    assert (v.status, v.cls, v.phase) == ("hang", "collective_mismatch", "ops")
    d = v.divergence
    assert (d["group"], d["seq"], d["mismatch"]) == ("default", 2, "op")
    bad = f"rank {world - 1}/{world}"
    assert "barrier" in d["instead"][bad] and "dist_job.py:" in d["instead"][bad]
    if world > 2:   # the majority calls all_reduce: the one rank in the barrier is the culprit
        assert v.culprit == bad and v.in_flight_op["name"] == "dist.barrier"
    p = roles(v)
    assert {f"rank {r}/{world}" for r in range(world)} <= set(p)
    assert p[f"rank 0/{world}"]["collective"] == {
        "group": "default", "seq": 2, "op": "all_reduce", "shapes": "f32[4]", "done": False}
    assert any(r["kind"] == "main" for r in v.processes)
    # every process's evidence is in the folder: its op log, its stacks
    out = Path(v.log["dir"])
    for row in v.processes:
        if row["kind"] == "rank":
            assert (out / "procs" / row["log"]).stat().st_size < 1 << 20   # cut to what was recorded
            assert "in all_reduce" in (out / row["stacks"]["python"]).read_text() or \
                "in barrier" in (out / row["stacks"]["python"]).read_text()   # its own stacks, at the stall


def test_a_shape_mismatch_of_the_same_collective(tmp_path):
    v = watched(tmp_path, sys.executable, DIST, "shape")
    assert v.cls == "collective_mismatch" and v.divergence["mismatch"] == "shape"
    assert any("f32[8]" in e for e in v.evidence) and any("f32[4]" in e for e in v.evidence)


def test_a_rank_stuck_in_a_deadlocked_op_while_the_others_wait_in_all_reduce(tmp_path):
    v = watched(tmp_path, sys.executable, DIST, "stuck", "--world", "3")
    assert (v.status, v.cls, v.culprit) == ("hang", "rank_stuck", "rank 2/3")
    assert v.divergence["missing"] == ["rank 2/3"] and v.divergence["op"] == "all_reduce"
    assert set(v.divergence["waiting"]) == {"rank 0/3", "rank 1/3"}
    assert v.in_flight_op["name"] == "aten.mm.default" and v.in_flight_op["process"] == "rank 2/3"
    assert roles(v)["rank 2/3"]["wait"] == "lock"   # its frame: pthread_mutex_lock in the fixture's kernel


def test_torchrun_ranks_are_followed_and_the_launcher_is_named(tmp_path):
    port = _free_port()
    v = watched(tmp_path, sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-port", str(port), DIST, "stuck")
    assert (v.cls, v.culprit) == ("rank_stuck", "rank 1/2")
    kinds = {r["kind"] for r in v.processes}
    assert {"rank", "launcher"} <= kinds


def test_a_rank_that_dies_of_a_signal_is_the_jobs_crash_named_from_its_own_faulthandler(tmp_path):
    """torchrun exits 1 and prints the rank's signal; the rank's own faulthandler file says where it died: the job
    crashed there (it was 'error, unknown: no op was in flight and no stack names the code')."""
    line = next(n for n, t in enumerate(Path(DIST).read_text().splitlines(), 1) if t.endswith("# SEGV"))
    v = watched(tmp_path, sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-port", str(_free_port()), DIST, "segv")
    assert (v.status, v.signal, v.culprit) == ("crash", "SIGSEGV", "rank 1/2"), v.evidence
    assert v.evidence[0].startswith("rank 1/2 died of SIGSEGV in string_at"), v.evidence
    assert v.owner["kind"] == "program" and v.owner["where"] == f"fixtures/dist_job.py:{line} in rank_main", v.owner
    assert "ctypes" in v.owner["why"], v.owner
    # every view of the job says how the rank ended: the headline too, not "ended without a word"
    assert roles(v)["rank 1/2"]["state"] == "died of SIGSEGV"
    from gpulab.hang import verdict
    assert "rank 1/2: died of SIGSEGV" in verdict.headline(v), verdict.headline(v)


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_dataloader_worker_blocked_in_getitem(tmp_path, start):
    script = FIX / "loader_selflock.py"
    v = watched(tmp_path, sys.executable, str(script), start)
    assert (v.status, v.cls) == ("hang", "worker_stuck")
    assert v.culprit.startswith("DataLoader worker ") and v.culprit.endswith(" of main")
    worker = roles(v)[v.culprit]
    assert worker["wait"] == "lock" and "loader_selflock.py" in worker["frame"]
    assert any("dataloader_spawn" in s["fix"] for s in v.suggested)


def test_a_worker_that_inherited_a_held_lock_at_fork_is_fixed_by_spawn(tmp_path):
    from gpulab.fixes import commands

    rc = commands.main(["--scenario", "auto", "--repeats", "1", "--stall", str(STALL), "--json", str(tmp_path / "f.json"),
                        "--out", str(tmp_path / "fx"), "--", sys.executable, DIST, "loader", "--start", "fork"])
    res = json.loads((tmp_path / "f.json").read_text())
    got = {s["name"]: s["verdict"] for s in res["scenarios"]}
    assert rc == 0 and got["baseline"] == "baseline" and got["dataloader_spawn"] == "fixes"
    assert res["recommendation"] == "dataloader_spawn"


def test_a_python_subprocess_that_hangs(tmp_path):
    v = watched(tmp_path, sys.executable, DIST, "child")
    assert (v.status, v.cls) == ("hang", "child_stuck")   # no DataLoader here: none of its fixes is offered
    assert not any("dataloader" in s["fix"] for s in v.suggested), v.suggested
    assert v.culprit.startswith("pid ") and re.search(r"python[\d.]* -c", v.culprit), v.culprit
    assert roles(v)[next(r for r in roles(v) if r.startswith("main"))]["wait"] == "children"


def test_children_joined_before_their_queue_is_read_are_named_at_the_join(tmp_path):
    """Each child waits, as it exits, until the numpy arrays it put on a multiprocessing Queue are read; the parent
    waits in join(): the join is the line to change, not the child's frame in threading.py, and no DataLoader fix
    is offered to a program without one."""
    program = FIX / "calls" / "queue_join.py"
    v = watched(tmp_path, sys.executable, str(program), "array")
    join = next(n for n, t in enumerate(program.read_text().splitlines(), 1) if t.rstrip().endswith("# JOIN"))
    assert (v.status, v.cls) == ("hang", "child_stuck"), (v.cls, v.evidence)
    assert roles(v)[v.culprit]["wait"] == "queue_flush", roles(v)[v.culprit]
    assert v.owner["kind"] == "program" and f"queue_join.py:{join} in main" in v.owner["where"].split(" (")[0], v.owner
    assert "get() everything from the queue before join()" in v.owner["why"] and not v.suggested, v.suggested


def test_a_child_blocked_writing_into_a_pipe_its_parent_reads_only_after_wait_is_named_at_the_wait(tmp_path):
    """subprocess.Popen(..., stdout=PIPE) then wait() before reading (Python's documented deadlock): the child sits
    in write() once the pipe is full. The wait is the line to change, with communicate() (it had been 'unknown':
    the child's frame is no code of the program's)."""
    program = FIX / "calls" / "pipe_wait.py"
    v = watched(tmp_path, sys.executable, str(program))
    wait = next(n for n, t in enumerate(program.read_text().splitlines(), 1) if "# WAIT" in t)
    assert (v.status, v.cls) == ("hang", "child_stuck"), (v.cls, v.evidence)
    assert roles(v)[v.culprit]["writing"] is True, roles(v)[v.culprit]
    assert v.owner["kind"] == "program" and v.owner["where"].startswith(f"calls/pipe_wait.py:{wait} in manifest"), \
        v.owner
    assert "proc.communicate()" in v.owner["why"] and "is blocked in write()" in v.owner["why"], v.owner


def test_workers_out_of_file_descriptors_are_the_open_file_limit_with_the_programs_way_out(tmp_path):
    """Batches of many small tensors under a low open-file limit: each is shared as a file descriptor, a worker's
    queue thread prints 'Too many open files' and the loader waits forever. Not 'the dataset's own code': the
    limit, with the sharing strategy, the limit and fewer tensors a batch as the program's way out."""
    v = watched(tmp_path, sys.executable, str(FIX / "calls" / "fd_limit.py"))
    assert (v.status, v.cls) == ("hang", "worker_stuck"), (v.cls, v.evidence)
    assert v.owner["kind"] == "platform" and v.owner["where"].startswith("the open-file limit"), v.owner
    assert "set_sharing_strategy('file_system')" in v.owner["program"], v.owner


def test_a_ddp_script_started_alone_waits_in_the_rendezvous_and_its_launch_is_named(tmp_path, monkeypatch):
    """`python train.py` where torchrun was meant: rank 0's TCPStore waits for a world of 2 that never comes. The
    program's init_process_group line and its launch are named, not 'the fault is in PyTorch'."""
    program = FIX / "calls" / "dist_alone.py"
    monkeypatch.setenv("GPULAB_TEST_PORT", str(_free_port()))
    v = watched(tmp_path, sys.executable, str(program))
    init = next(n for n, t in enumerate(program.read_text().splitlines(), 1) if t.rstrip().endswith("# INIT"))
    assert v.status == "hang" and v.owner["kind"] == "program", (v.owner, v.evidence)
    assert v.owner["where"].startswith(f"calls/dist_alone.py:{init} in <module> (init_process_group"), v.owner
    assert "torchrun --nproc-per-node N" in v.owner["why"] and "WORLD_SIZE" in v.owner["why"]


def test_a_job_that_passes_is_ok_and_keeps_small_logs(tmp_path):
    v = watched(tmp_path, sys.executable, DIST, "ok")
    assert v.status == "ok" and v.processes == ()
    logs = list((Path(v.log["dir"]) / "procs").glob("*.log"))
    assert len(logs) >= 2 and all(p.stat().st_size < 1 << 20 for p in logs)


def test_two_nodes_each_watched_where_it_runs_and_merged(tmp_path, capsys):
    port, verdicts = _free_port(), {}

    def node(i: int) -> None:
        verdicts[i] = watched(tmp_path, sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                              "--node-rank", str(i), "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
                              "--master-port", str(port), DIST, "stuck", name=f"node{i}", stall=4.0)
    threads = [threading.Thread(target=node, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(v.status == "hang" for v in verdicts.values()), {i: (v.status, v.evidence) for i, v in verdicts.items()}
    assert any("gpulab merge" in e for e in verdicts[0].evidence)   # a node alone sees half the world
    rc = merge.main(["--json", str(tmp_path / "job.json"), str(tmp_path / "node0"), str(tmp_path / "node1")])
    assert rc == 3
    job = json.loads((tmp_path / "job.json").read_text())
    assert (job["class"], job["culprit"]) == ("rank_stuck", "rank 1/2")
    assert job["divergence"]["waiting"] == ["rank 0/2"] and job["divergence"]["seq"] == 2
    assert len({p["node"] for p in job["processes"]}) == 2


def test_merge_refuses_a_folder_without_processes(tmp_path, capsys):
    assert merge.main([str(tmp_path)]) == 2
    assert "no followed processes" in capsys.readouterr().err


def _line_of(text: str, path: str = TRAIN) -> int:
    return next(i for i, line in enumerate(Path(path).read_text().splitlines(), 1) if text in line)


def train_command(tmp_path: Path, launch: str, scenario: str, wrap: str, *extra: str) -> list[str]:
    cmd = [TRAIN, scenario, "--wrap", wrap, "--folder", str(tmp_path), *extra]
    if launch == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *cmd]
    return [sys.executable, *cmd]


def assert_training_verdict(v, cls: str, where: str, program: str, stall: float = STALL) -> None:
    """The rank that left or skipped and its line, the collective and its number, the class, what to change,
    the ranks found within the stall window + 5 s of their last progress; the launcher named nowhere. The capture's
    own time (goal: quiet + capture within the window + 5 s) is a figure of benchmarks/bench_job_verdict.py, measured
    there, not timed here under a loaded CI."""

    assert (v.status, v.cls, v.culprit) == ("hang", cls, "rank 1/2"), v.evidence
    p = roles(v)
    d, left = v.divergence, p["rank 1/2"]["collective"]
    assert d["group"] == "default" and d["waiting"] == ["rank 0/2"] and left["done"] == (d["missing"] != [])
    # numbered alike on both ranks: the one that went on called the next number, unless NCCL paired its next call
    # (a barrier is an all_reduce) with the collective the others wait in, which then completed on its side only
    assert d["seq"] == left["seq"] + (1 if left["done"] and not left.get("paired_with") else 0), (d, left)
    assert p["rank 0/2"]["collective"]["seq"] == d["seq"] and not p["rank 0/2"]["collective"]["done"]
    assert f"train_job.py:{_line_of(where)}" in (p["rank 1/2"]["frame"] or ""), p["rank 1/2"]
    assert program in classify.program_cause(v.cls, v.culprit, v.processes)
    quiet = min(r["last_progress_s"] for r in v.processes if r["kind"] == "rank")
    assert quiet <= stall + 5, (quiet, v.capture_s)
    assert not any("_invoke_run" in e or "select" in e.split(":")[0] for e in v.evidence), v.evidence


@pytest.mark.parametrize("launch,scenario,wrap,cls,where,program", [
    ("torchrun", "uneven", "ddp", "uneven_inputs", "time.sleep(0.2)", "model.join()"),
    ("spawn", "nan", "none", "skipped_collective", "# everyone's checkpoint barrier", "dist.all_reduce(flag"),
    ("spawn", "barrier", "ddp", "skipped_collective", "# a checkpoint barrier only this rank", "dist.all_reduce(flag"),
    ("spawn", "uneven", "ddp", "uneven_inputs", "time.sleep(0.2)", "model.join()"),
], ids=["ddp_uneven_torchrun", "funcol_nan_guard_spawn", "ddp_barrier_in_a_branch_spawn", "ddp_uneven_spawn"])
def test_training_hangs_named_by_rank_collective_and_line(tmp_path, launch, scenario, wrap, cls, where, program):
    """Real training loops: DDP's gradient all_reduce (issued in backward, numbered by the flight recorder), the
    functional collectives' all_reduce + wait_tensor, a checkpoint barrier only one rank reaches."""
    v = watched(tmp_path, *train_command(tmp_path, launch, scenario, wrap))
    assert v.divergence["op"] == "all_reduce"
    assert_training_verdict(v, cls, where, program)


@pytest.mark.gpu
@pytest.mark.parametrize("launch,scenario,wrap,cls,where,program", [
    # NCCL returns at launch and matches calls by order alone: rank 1's barrier pairs with rank 0's pending gradient
    # all_reduce and completes on its side, so rank 1 goes further than on gloo (seen on two H100s): to
    # destroy_process_group once rank 0's torch.save has made the file it polls for, or to that poll
    ("torchrun", "uneven", "ddp", "uneven_inputs", "dist.destroy_process_group()", "model.join()"),
    ("spawn", "nan", "ddp", "skipped_collective", "time.sleep(0.2)", "dist.all_reduce(flag"),
    ("torchrun", "nan", "none", "skipped_collective", "time.sleep(0.2)", "dist.all_reduce(flag"),
    ("spawn", "uneven", "fsdp", "uneven_inputs", "time.sleep(0.2)", "model.join()"),
], ids=["ddp_uneven_torchrun", "ddp_nan_spawn", "funcol_nan_torchrun", "fsdp_uneven_spawn"])
def test_training_hangs_on_two_gpus_with_nccl(tmp_path, launch, scenario, wrap, cls, where, program):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("NCCL needs two GPUs (one rank each)")
    v = watched(tmp_path, *train_command(tmp_path, launch, scenario, wrap, "--backend", "nccl"), stall=5.0)
    assert_training_verdict(v, cls, where, program, stall=5.0)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["nccl", "gloo"])
@pytest.mark.parametrize("scenario,cls", [("skip", "collective_mismatch"), ("spin", "rank_stuck")])
def test_ranks_on_gpus(tmp_path, scenario, cls, backend):
    import torch

    if backend == "nccl" and torch.cuda.device_count() < 2:
        pytest.skip("NCCL needs two GPUs (one rank each)")
    v = watched(tmp_path, sys.executable, NCCL, scenario, "--world", "2", "--backend", backend, stall=5.0)
    assert v.status == "hang" and v.cls == cls, v.evidence
    assert v.divergence["seq"] == 2 and v.divergence["group"] == "default"
    if scenario == "spin":
        assert v.culprit == "rank 1/2" and "never completed" in v.divergence["instead"]["rank 1/2"]


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port




@pytest.mark.parametrize("workload,head", [
    ("script:torchrun --standalone --nproc-per-node 2 train.py --lr 1", ["-m", "torch.distributed.run", "--standalone"]),
    ("script:-m torch.distributed.run --nproc-per-node 2 train.py", ["-m", "torch.distributed.run", "--nproc-per-node"]),
    ("script:train.py --lr 1", ["train.py", "--lr"]),
])
def test_a_launched_job_as_the_chains_workload(workload, head):
    """`workload=script:torchrun ...` runs the launcher under the interpreter that has gpulab (its console script
    is torch.distributed.run), so the watchdog records it and follows its ranks."""
    from gpulab import workloads

    argv = workloads.command(workloads.WorkloadConfig(workload=workload))
    assert argv[1:1 + len(head)] == head


def test_a_compiled_ddp_job_with_dataloader_workers_names_the_rank_not_a_worker(tmp_path):
    """Training code as it is written (torchrun, DDP over torch.compile, forked DataLoader workers, a checkpoint
    barrier): a worker answers with its rank's collectives copied at fork, and was named as the member that never
    called the next one. The rank that left the loop is the culprit, at its barrier."""
    script = Path(__file__).parent / "fixtures" / "ddp_loader_uneven.py"
    v = watched(tmp_path, sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                str(script), str(tmp_path), stall=8.0)
    assert v.status == "hang" and v.culprit == "rank 1/2", v.evidence
    # rank 1 ran 6 steps, rank 0 is in its 7th: the DataLoader's header line issued as many ops on both (its
    # iterator starts once) and was once read as "as many steps" (skipped_collective, the wrong remedy)
    assert v.cls == "uneven_inputs", v.evidence
    assert "model.join()" in classify.program_cause(v.cls, v.culprit, v.processes)
    d = v.divergence
    assert (d["op"], d["waiting"]) == ("all_reduce", ["rank 0/2"]) and d["seq"] > 1, d
    assert not any("worker" in w for w in (*d["waiting"], *d["missing"], *d.get("instead", {}))), d
    assert "ddp_loader_uneven.py:31" in (roles(v)["rank 1/2"]["frame"] or "")
    assert not any(p["collective"] for p in v.processes if p["kind"] == "worker")


def test_a_worker_forked_while_a_thread_held_a_lock_waits_for_it_alone_and_spawn_is_the_way_out(tmp_path):
    """A metrics thread holds the lock the Dataset takes when the DataLoader forks its workers: each worker waits
    at that line for a lock no thread of it can release. The worker's native stack (a lock acquire under the
    program's frame, no other thread of its own) and its start by fork say so; spawn ends the same program."""
    program = str(FIX / "fork_lock.py")
    v = watched(tmp_path, sys.executable, program)
    assert (v.status, v.cls) == ("hang", "worker_stuck"), (v.cls, v.evidence)
    worker = roles(v)[v.culprit]
    assert worker.get("started_by") == "fork" and worker.get("lock_alone") is True, worker
    line = next(n for n, t in enumerate(Path(program).read_text().splitlines(), 1) if t.endswith("# LOCK"))
    assert f"fork_lock.py:{line}" in v.owner["where"] and "fork() copies the lock, held" in v.owner["why"], v.owner
    step = classify.program_cause(v.cls, v.culprit, v.processes, v.owner)
    assert "no thread of it can release" in step and "multiprocessing_context='spawn'" in step, step
    done = proc.run([sys.executable, program, "--context", "spawn"], timeout_s=120, capture=True)
    assert done.ok and "done" in done.stdout, done.stderr[-2000:]


def test_a_rank_forked_while_a_thread_held_a_lock_is_named_as_the_fork_not_as_a_skipped_collective(tmp_path):
    """Ranks started by fork while the parent's thread held a lock: the rank that takes it waits alone at that
    line, outside any collective; its start by fork and its native stack make it the fork's, as a worker's."""
    program = str(FIX / "fork_ranks.py")
    v = watched(tmp_path, sys.executable, program)
    assert (v.status, v.cls, v.culprit) == ("hang", "rank_stuck", "rank 1/2"), (v.cls, v.evidence)
    rank = roles(v)["rank 1/2"]
    assert rank.get("started_by") == "fork" and rank.get("lock_alone") is True, rank
    line = next(n for n, t in enumerate(Path(program).read_text().splitlines(), 1) if t.endswith("# LOCK"))
    assert f"fork_ranks.py:{line}" in v.owner["where"] and "fork() copies the lock, held" in v.owner["why"], v.owner
    assert "start_method='spawn'" in v.owner["why"], v.owner
    done = proc.run([sys.executable, program, "--start", "spawn"], timeout_s=120, capture=True)
    assert done.ok and "done" in done.stdout, done.stderr[-2000:]


def test_children_forked_after_openmp_ran_are_the_platform_meeting_the_program_not_a_queue_to_read(tmp_path):
    """A parent that ran parallel CPU work on OpenMP's pool forks children whose first matmul waits in that pool
    for threads fork did not copy: the child's native stack in libgomp, its start by fork, say so; the next step is
    spawn (which ends the same program here), not the Queue advice a stuck child otherwise gets."""
    program = str(FIX / "fork_after_openmp.py")
    v = watched(tmp_path, sys.executable, program)
    assert (v.status, v.cls) == ("hang", "child_stuck"), (v.cls, v.evidence)
    child = roles(v)[v.culprit]
    assert child.get("started_by") == "fork" and "OpenMP" in str(child.get("native_lib")), child
    assert v.owner["kind"] == "platform" and "not fork-safe" in v.owner["why"], v.owner
    assert "get_context('spawn')" in v.owner["program"], v.owner
    step = classify.program_cause(v.cls, v.culprit, v.processes, v.owner) or owner.next_step(v.owner)
    assert "spawn" in step and "Queue" not in step, step
    done = proc.run([sys.executable, program, "--start", "spawn"], timeout_s=60, capture=True)
    assert done.ok and "done" in done.stdout, done.stderr[-2000:]
