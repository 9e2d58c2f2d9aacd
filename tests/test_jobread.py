"""Who a process of a job is, and what it waits in, from its <pid>.json and its Python frames; the tags of a
torch.distributed record. Pure functions, recorded inputs."""
from __future__ import annotations

import pytest

from gpulab.hang.jobs import jobread
from gpulab.trace import collectives

PY = "/usr/bin/python3"


@pytest.mark.parametrize("meta,metas,role,kind", [
    ({"pid": 11, "ppid": 10, "argv": [PY, "-c", "spawn_main()"], "rank": 1, "world": 4}, {}, "rank 1/4", "rank"),
    ({"pid": 11, "ppid": 10, "argv": [PY, "-u", "train.py"], "env": {"rank": "3", "world_size": "8"}}, {},
     "rank 3/8", "rank"),
    ({"pid": 12, "ppid": 11, "argv": [PY, "train.py"], "worker": 0, "env": {}},
     {11: {"pid": 11, "rank": 2, "world": 4}}, "DataLoader worker 0 of rank 2", "worker"),
    ({"pid": 12, "ppid": 10, "argv": [PY, "train.py"], "worker": 1}, {10: {"pid": 10, "root": True}},
     "DataLoader worker 1 of main", "worker"),
    ({"pid": 13, "ppid": 10, "argv": [PY, "-B", "-c", "from multiprocessing.resource_tracker import main;main(7)"]},
     {}, "multiprocessing resource tracker (pid 13)", "helper"),
    ({"pid": 14, "ppid": 1, "argv": [PY, "/venv/bin/torchrun", "--nproc-per-node", "2", "train.py"]}, {},
     "launcher (pid 14: python3 torchrun --nproc-per-node 2 train.py)", "launcher"),
    ({"pid": 15, "ppid": 1, "root": True, "argv": [PY, "-m", "gpulab.trace", "--log", "x", "--", "-m",
                                                   "torch.distributed.run", "t.py"]}, {},
     "launcher (pid 15: python3 -m torch.distributed.run t.py)", "launcher"),
    ({"pid": 16, "ppid": 1, "root": True, "argv": [PY, "-m", "gpulab.trace", "--", "train.py"]}, {},
     "main (pid 16)", "main"),
    ({"pid": 17, "ppid": 16, "argv": [PY, "tools/prep.py", "--fast"]}, {}, "pid 17: python3 prep.py --fast", "process"),
    ({"pid": 21, "ppid": 16, "argv": [PY, "-B", "-c", "from multiprocessing.spawn import spawn_main; spawn_main("
                                      "tracker_fd=9, pipe_handle=11)", "--multiprocessing-fork"]}, {},
     "multiprocessing child (pid 21 of pid 16)", "process"),
    # a rank's child inherits its RANK (Inductor's compile check, its compile workers): not a second rank 0
    ({"pid": 18, "ppid": 11, "argv": [PY, "-c", "from ctypes import cdll"], "env": {"rank": "0", "world_size": "2"}},
     {11: {"pid": 11, "rank": 0, "world": 2, "env": {"rank": "0", "world_size": "2"}}},
     "pid 18: python3 -c from ctypes import cdll (child of rank 0)", "process"),
    # a wrapper under torchrun that runs the training script: the script, which called init_process_group, is
    # the rank
    ({"pid": 19, "ppid": 14, "argv": [PY, "wrap.py"], "env": {"rank": "1", "world_size": "2"}},
     {20: {"pid": 20, "ppid": 19, "rank": 1, "world": 2}}, "pid 19: python3 wrap.py (launches rank 1)", "process"),
    # the rank itself, its child beside it in the folder
    ({"pid": 11, "ppid": 10, "argv": [PY, "train.py"], "rank": 0, "world": 2, "env": {"rank": "0"}},
     {18: {"pid": 18, "ppid": 11, "env": {"rank": "0"}}}, "rank 0/2", "rank"),
])
def test_roles(meta, metas, role, kind):
    assert jobread.role_of(meta, metas) == (role, kind)


@pytest.mark.parametrize("frame,frames,open_op,wait", [
    (None, (), {"name": "dist.all_reduce"}, "collective"),
    (None, (), {"name": "aten._local_scalar_dense.default"}, "cuda_sync"),
    ("ds.py:12 in __getitem__: `LOCK.acquire()`", ("__getitem__ (ds.py:12)",), None, "lock"),
    ("ds.py:12 in __getitem__: `with self.lock:`", ("__getitem__ (ds.py:12)",), None, "lock"),
    ("k.py:3 in deadlock: `libc.pthread_mutex_lock(m)`", ("deadlock (k.py:3)",), None, "lock"),
    ("selectors.py:415 in select", ("select (selectors.py:415)", "wait (/py/multiprocessing/connection.py:947)",
                                    "poll (/py/multiprocessing/connection.py:257)", "get (/py/multiprocessing/queues.py:113)",
                                    "_try_get_data (/t/utils/data/dataloader.py:1133)"), None, "queue"),
    ("selectors.py:415 in select", ("select (selectors.py:415)", "wait (/py/multiprocessing/connection.py:947)",
                                    "join (/t/multiprocessing/spawn.py:118)"), None, "children"),
    ("subprocess.py:2004 in _try_wait", ("_try_wait (/py/subprocess.py:2004)", "_wait (/py/subprocess.py:2046)"), None,
     "children"),
    ("train.py:40 in step: `loss = model(x)`", ("step (train.py:40)",), None, None),
    # a child that has returned from its target and, exiting, joins its Queue's feeder thread
    ("threading.py:1139 in _wait_for_tstate_lock: `if lock.acquire(block, timeout):`",
     ("_wait_for_tstate_lock (/py/threading.py:1139)", "join (/py/threading.py:1119)",
      "_finalize_join (/py/multiprocessing/queues.py:199)", "__call__ (/py/multiprocessing/util.py:224)"), None,
     "queue_flush"),
])
def test_waits(frame, frames, open_op, wait):
    assert jobread.wait_of(frame, frames, open_op) == wait


def test_collective_tags_read_back():
    args = [{"shape": [4], "dtype": "float32"}, {"value": "g=default"}, {"value": "seq=12"}, {"value": "async"}]
    assert collectives.parse(args) == {"group": "default", "seq": 12, "peer": None, "async": True}
    assert collectives.parse([{"value": "g=3"}, {"value": "peer=1"}])["peer"] == 1
    assert jobread.shapes_text(args) == "f32[4]"
    assert repr(collectives.Tag("seq=3")) == "seq=3"   # the op log keeps repr(): no quotes


def test_every_call_kind_is_known():
    assert set(collectives.CALLS.values()) == {"collective", "p2p", "group"}
    assert {"all_reduce", "barrier", "send", "recv", "all_gather_object", "new_group"} <= set(collectives.CALLS)


def test_a_frame_is_quoted_without_its_comment(tmp_path):
    f = tmp_path / "ds.py"
    f.write_text("x = 1\n        with LOG_LOCK:      # held by the parent's thread\n")
    assert jobread.source_line(str(f), 2) == "with LOG_LOCK:"
    assert jobread.source_line(str(f), 1) == "x = 1"


def _rec(seq, name, depth=0, t_end=1.0, gpu_done=None, args=(), kind="op", thread="MainThread"):
    from gpulab.trace.ring import OpRecord

    return OpRecord(seq=seq, name=name, args=list(args), call_site="nccl_job.py:40", thread=thread,
                    t_start=float(seq), t_end=t_end, gpu_done=gpu_done, stats=None, kind=kind, depth=depth)


AR = [{"shape": [1048576], "dtype": "float32"}, {"value": "g=default"}]


def _nccl_rank(second_gpu_done):
    """A rank's log as two H100s recorded it: NCCL's all_reduce returns at launch; the GPU state of the
    c10d op inside it is what says whether the collective ran."""
    return [_rec(0, "aten.ones.default", gpu_done=True),
            _rec(1, "dist.all_reduce", args=AR + [{"value": "seq=1"}], kind="composite"),
            _rec(2, "c10d.allreduce_.default", depth=1, gpu_done=True),
            _rec(3, "dist.all_reduce", args=AR + [{"value": "seq=2"}], kind="composite"),
            _rec(4, "c10d.allreduce_.default", depth=1, gpu_done=second_gpu_done),
            _rec(5, "aten.mul.Tensor", t_end=None)]


@pytest.mark.parametrize("gpu_done,done", [(False, False), (True, True), (None, True)])
def test_an_nccl_collective_is_done_when_its_gpu_work_is(gpu_done, done):
    calls = jobread.collectives_of(_nccl_rank(gpu_done))
    assert [(c.seq, c.done) for c in calls] == [(1, True), (2, done)]


def test_gpu_work_of_another_thread_or_after_the_call_is_not_the_calls():
    recs = _nccl_rank(True)[:5] + [_rec(5, "aten.mul.Tensor", gpu_done=False),
                                   _rec(6, "aten.add.Tensor", depth=2, gpu_done=False, thread="pt_autograd_0")]
    assert [c.done for c in jobread.collectives_of(recs)] == [True, True]


def test_a_rank_stuck_before_an_nccl_collective_is_named():
    """The H100 case end to end: rank 1's host never left its op (a launch behind a kernel that never ends),
    rank 0 returned from all_reduce seq 2 but its GPU waits for rank 1."""
    from gpulab.hang.jobs.job import ProcessView, analyse

    r0 = ProcessView(pid=10, ppid=1, role="rank 0/2", kind="rank", state="running", rank=0, world=2,
                     collectives=jobread.collectives_of(_nccl_rank(False)))
    r1_recs = _nccl_rank(True)[:3] + [_rec(3, "gpulab_test.spin.default", t_end=None)]
    r1 = ProcessView(pid=11, ppid=1, role="rank 1/2", kind="rank", state="running", rank=1, world=2,
                     collectives=jobread.collectives_of(r1_recs), open_op=jobread._open_op(r1_recs))
    f = analyse([r0, r1])
    assert (f.cls, f.culprit, f.divergence.seq, f.divergence.waiting) == ("rank_stuck", "rank 1/2", 2, ("rank 0/2",))
    assert "gpulab_test.spin.default" in f.divergence.instead["rank 1/2"]


def _dump(*frames: tuple[str, str, int]) -> str:
    """A faulthandler dump of one thread, innermost frame first: (file, func, line) each."""
    return "Thread 0x00007f0000000001 (most recent call first):\n" + "".join(
        f'  File "{f}", line {n} in {fn}\n' for f, fn, n in frames)


def test_a_rank_stopped_in_the_stdlib_is_placed_at_its_own_line(tmp_path):
    import re as re_module

    own = tmp_path / "train.py"
    own.write_text("import re\n\ndef main():\n    m = re.match(PATTERN, text)   # catastrophic backtracking\n")
    stdlib = re_module.__file__
    mf = jobread.main_frame(_dump((stdlib, "match", 166), (str(own), "main", 4), (str(own), "<module>", 9)))
    assert mf.where.startswith(f"{tmp_path.name}/train.py:4 in main: `m = re.match(PATTERN, text)`, inside re/")
    assert mf.where.endswith(":166 in match") and mf.inner.startswith("re/__init__.py:166 in match")
    assert len(mf.frames) == 3 and mf.own_code   # the standard library on the program's behalf


def test_a_rank_stopped_in_torch_is_not_in_its_own_code(tmp_path):
    own = tmp_path / "train.py"
    own.write_text("torch.cuda.synchronize()\n")
    mf = jobread.main_frame(_dump(("/venv/lib/python3.11/site-packages/torch/cuda/__init__.py", "synchronize", 1040),
                                  (str(own), "main", 1)))
    assert mf.where.startswith(f"{tmp_path.name}/train.py:1 in main: `torch.cuda.synchronize()`, inside cuda/__init__.py:1040 in synchronize")
    assert not mf.own_code


@pytest.mark.parametrize("where", ["own", "library only"])
def test_a_frame_in_the_programs_own_code_or_only_in_libraries_is_named_as_it_is(tmp_path, where):
    own = tmp_path / "ds.py"
    own.write_text("x = 1\nLOCK.acquire()\n")
    lib = "/usr/lib/python3.11/threading.py" if where == "library only" else str(own)
    mf = jobread.main_frame(_dump((lib, "wait", 2)))
    assert mf.where == mf.inner and mf.where.startswith(
        "python3.11/threading.py:2 in wait" if lib != str(own) else f"{tmp_path.name}/ds.py:2 in wait: `LOCK.acquire()`")
    assert mf.own_code == (where == "own")


# ------------------------------------------------------------------------------------ numbered by PyTorch

def rec(seq, name, t, site="train.py:30 in train", end=True, args=(), depth=0):
    from gpulab.trace.ring import OpRecord

    return OpRecord(seq=seq, name=name, args=list(args), call_site=site, thread="MainThread (1)", t_start=t,
                    t_end=t + 0.01 if end else None, gpu_done=None, stats=None, kind="op", depth=depth, raised=False,
                    stream=None)


def fr(seq, op="gloo:all_reduce", retired=True, t=0.0, group="default", sizes=((36,),)):
    return {"group": group, "seq": seq, "p2p": False, "op": collectives.fr_op(op), "sizes": [list(s) for s in sizes],
            "dtypes": ["Float"] * len(sizes), "retired": retired, "created": t, "frames": []}


def test_flight_recorder_numbers_what_pytorch_issues_and_joins_the_python_calls():
    """DDP's gradient all_reduce (c10d records inside `loss.backward()`, no Python call) is numbered by counting
    the op log's collectives from the barrier's number, and joined with the flight recorder's entry of that
    number: one collective, done only when both say so, with the line that issued it and the op log's shapes."""
    t36 = [{"shape": [36], "dtype": "float32"}]
    records = [rec(1, "c10d.allreduce_.default", 10.0, args=t36), rec(2, "c10d.allreduce_.default", 20.0, args=t36),
               rec(3, "dist.barrier", 30.0, site="train.py:44 in train", end=True,
                   args=[{"value": "g=default"}, {"value": "seq=3"}])]
    answer = {"fr": [fr(1, t=10.0), fr(2, retired=False, t=20.0), fr(3, "gloo:barrier", retired=False, t=30.0,
                                                                          sizes=())]}
    got = jobread.collectives_of(records, answer)
    assert [(c.op, c.seq, c.done, c.source) for c in got] == [
        ("all_reduce", 1, True, "op log + flight recorder"), ("all_reduce", 2, False, "op log + flight recorder"),
        ("barrier", 3, False, "op log + flight recorder")]
    assert got[1].call_site == "train.py:30 in train" and got[1].shapes == "f32[36]" and got[1].counted
    alone = jobread.collectives_of(records)   # not asked: the op log alone, counted from the barrier's number
    assert [(c.op, c.seq, c.done, c.source) for c in alone] == [
        ("all_reduce", 1, True, "op log"), ("all_reduce", 2, True, "op log"), ("barrier", 3, True, "op log")]
    only_fr = jobread.collectives_of(records[:2], {"fr": answer["fr"][:2]})   # no numbered call: the recorder's
    assert [(c.seq, c.done) for c in only_fr] == [(1, True), (2, False)]


@pytest.mark.parametrize("name,family", [("c10d.allreduce_.default", "allreduce"), ("gloo:all_reduce", "allreduce"),
                                         ("_c10d_functional.all_reduce.default", "allreduce"),
                                         ("c10d._allgather_base_.default", "allgather"),
                                         ("nccl:reduce_scatter", "reducescatter"), ("aten.mm.default", None)])
def test_collective_families(name, family):
    assert jobread._family(name) == family


def test_loops_and_functions_of_a_source(tmp_path):
    src = tmp_path / "train.py"
    src.write_text("def train(batches):\n"          # 1
                   "    for x in batches:\n"        # 2
                   "        y = x + 1\n"            # 3
                   "        while y:\n"             # 4
                   "            y -= 1\n"           # 5
                   "    return y\n"                 # 6
                   "print(train([1]))\n")           # 7
    assert jobread._spans(str(src), 3) == ((2, 5), (1, 6))
    assert jobread._spans(str(src), 5) == ((4, 5), (1, 6))
    assert jobread._spans(str(src), 6) == (None, (1, 6))
    assert jobread._spans(str(src), 7) == (None, (1, 8))   # module level: the whole file
    assert jobread._spans(str(tmp_path / "gone.py"), 3) == (None, None)


def test_supervisors_are_launchers_and_the_ancestors_of_ranks():
    from gpulab.trace import follow

    metas = {10: {"pid": 10, "ppid": 1, "root": True, "argv": ["bash", "run.sh"]},
             11: {"pid": 11, "ppid": 10, "argv": [PY, "-m", "torch.distributed.run", "t.py"]},
             12: {"pid": 12, "ppid": 11, "argv": [PY, "t.py"], "env": {"rank": "0"}},
             13: {"pid": 13, "ppid": 12, "argv": [PY, "t.py"], "worker": 0},          # a rank's DataLoader worker
             20: {"pid": 20, "ppid": 1, "argv": [PY, "spawner.py"]},                  # mp.spawn's parent
             21: {"pid": 21, "ppid": 20, "argv": [PY, "-c", "spawn_main()"], "rank": 1}}
    assert follow.supervisors(metas, root=10) == {10, 11, 20}
    assert follow.supervisors(metas, root=10, alive=lambda pid: pid != 21) == {10, 11}
    assert follow.is_launcher({"argv": [PY, "/venv/bin/torchrun", "t.py"]}) and not follow.is_launcher(metas[12])
