"""gpulab.hang.jobs.job on hand-built views: which process of a hung job is stuck, and why the others wait."""
from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from gpulab.hang.jobs import job
from gpulab.hang.jobs.job import Collective, ProcessView, analyse

SITE = "train.py:10"


def call(op: str, seq: int | None, done: bool = True, shapes: str = "f32[4]", site: str = SITE,
         group: str = "default", t: float | None = None, peer: int | None = None) -> Collective:
    t = float(seq or 0) if t is None else t
    return Collective(op, group, seq, shapes, site, done, peer, t, t + 0.1 if done else None)


def rank(r: int, world: int, *calls: Collective, **kw) -> ProcessView:
    return ProcessView(pid=100 + r, ppid=1, role=f"rank {r}/{world}", kind="rank", state=kw.pop("state", "running"),
                       rank=r, world=world, collectives=calls, **kw)


def worker(w: int, parent: ProcessView, **kw) -> ProcessView:
    return ProcessView(pid=200 + 10 * parent.rank + w, ppid=parent.pid, role=f"DataLoader worker {w} of rank "
                       f"{parent.rank}", kind="worker", state="running", worker=w, **kw)


def done_upto(n: int, **kw) -> list[Collective]:
    return [call("all_reduce", s, **kw) for s in range(1, n + 1)]


# ------------------------------------------------------------------------------------------ the cases

def skip_2() -> list[ProcessView]:
    """rank 1 went into a barrier of its own group instead of the second all_reduce."""
    return [rank(0, 2, *done_upto(1), call("all_reduce", 2, done=False)),
            rank(1, 2, *done_upto(1), call("barrier", 1, done=False, shapes="", site="train.py:40", group="1"))]


def skip_4() -> list[ProcessView]:
    """ranks 1 and 3 skip the third all_reduce: one sits in evaluate, of the other nothing is known."""
    return [rank(0, 4, *done_upto(2), call("all_reduce", 3, done=False)),
            rank(1, 4, *done_upto(2), frame="train.py:25 in evaluate"),
            rank(2, 4, *done_upto(2), call("all_reduce", 3, done=False)),
            rank(3, 4, *done_upto(2), last_progress_s=12.5)]


def op_tie() -> list[ProcessView]:
    return [rank(0, 2, *done_upto(1), call("all_reduce", 2, done=False)),
            rank(1, 2, *done_upto(1), call("barrier", 2, done=False, shapes="", site="train.py:12"))]


def op_majority() -> list[ProcessView]:
    return [rank(r, 3, call("all_reduce", 1, done=False)) for r in range(2)] + [
        rank(2, 3, call("barrier", 1, done=False, shapes="", site="train.py:12"))]


def shape_mismatch() -> list[ProcessView]:
    return [rank(r, 4, *done_upto(1), call("all_reduce", 2, done=False, shapes="f32[8]" if r == 2 else "f32[4]"))
            for r in range(4)]


def compute_stuck() -> list[ProcessView]:
    """rank 1 never recorded a collective: it is a member of 'default' because it is a rank."""
    return [rank(0, 2, call("all_reduce", 1, done=False)),
            rank(1, 2, open_op={"name": "aten.mm.default", "args": [], "call_site": "train.py:30"})]


def exited(state: str):
    def views() -> list[ProcessView]:
        return [rank(0, 3, *done_upto(1), call("all_reduce", 2, done=False)),
                rank(1, 3, *done_upto(1), call("all_reduce", 2, done=False)),
                rank(2, 3, *done_upto(1), state=state)]
    return views


def rank_waits_on_worker() -> list[ProcessView]:
    """rank 1 misses the collective because its own DataLoader worker is stuck: the rank is the culprit,
    and the evidence names the worker."""
    r0 = rank(0, 2, *done_upto(1), call("all_reduce", 2, done=False))
    r1 = rank(1, 2, *done_upto(1), wait="queue", frame="dataloader.py:1133 in _try_get_data")
    return [r0, r1, worker(0, r1, wait="lock", frame="worker.py:12 in __getitem__", last_progress_s=30.0)]


def two_groups() -> list[ProcessView]:
    """'default' agrees on all four ranks; group '2,3' (members: the ranks with a call in it) diverges at its
    second call. Rank 0 and 1's group '0,1' has a single member with calls: nothing to compare."""
    base = done_upto(2)
    g23 = call("all_gather", 1, group="2,3", site="train.py:60", t=4.0)
    return [rank(0, 4, *base, call("all_gather", 1, group="0,1", done=False, t=6.0)), rank(1, 4, *base),
            rank(2, 4, *base, g23, call("all_gather", 2, done=False, group="2,3", site="train.py:60", t=5.0)),
            rank(3, 4, *base, g23, frame="train.py:71 in f")]


def rooted_then_op() -> list[ProcessView]:
    """a checkpoint's scatter (the root holds every rank's part: shapes differ by design), then rank 1 alone
    all_reduces a metric while rank 0 goes on to the next forward's all_gather."""
    return [rank(0, 2, *done_upto(1), call("scatter", 2, shapes="u8[2, 10532]", site="train.py:84"),
                 call("all_gather", 3, done=False, shapes="f32[69760]", site="train.py:74")),
            rank(1, 2, *done_upto(1), call("scatter", 2, shapes="", site="train.py:84"),
                 call("all_reduce", 3, done=False, shapes="f32[1]", site="train.py:80"))]


def rooted_in_flight() -> list[ProcessView]:
    """both ranks in the same gather, its root with every rank's buffer: the calls match."""
    return [rank(0, 2, *done_upto(1), call("gather", 2, done=False, shapes="f32[2, 4]")),
            rank(1, 2, *done_upto(1), call("gather", 2, done=False, shapes="f32[4]"))]


def two_diverge() -> list[ProcessView]:
    """both groups diverge; the one whose waiting call started first is reported."""
    return [rank(0, 2, call("broadcast", 1, done=False, group="late", t=9.0), call("all_reduce", 1, done=False, t=3.0)),
            rank(1, 2, call("broadcast", 1, group="late", t=1.0), call("broadcast", 2, group="late", done=False,
                                                                              t=8.0, site="train.py:80"))]


def p2p_diverge() -> list[ProcessView]:
    """send/recv carry no seq: rank 0's extra p2p records are not matched, its open recv is what it does."""
    return [rank(0, 2, *done_upto(1), call("send", None, peer=1, t=1.5), call("send", None, peer=1, t=1.6),
                 call("recv", None, done=False, peer=1, site="train.py:50", t=1.7)),
            rank(1, 2, *done_upto(1), call("recv", None, peer=0, t=1.5), call("all_reduce", 2, done=False))]


CASES = [
    # id, views, cls, culprit, divergence fields (group, seq, op, waiting, missing, mismatch), instead, evidence
    ("skip_2ranks", skip_2, "rank_stuck", "rank 1/2", ("default", 2, "all_reduce", ("rank 0/2",), ("rank 1/2",), None),
     {"rank 1/2": "in barrier (group 1, seq 1) at train.py:40"},
     ["group default, seq 2: rank 0/2 waits in all_reduce (f32[4]) at train.py:10; rank 1/2 never called it: "
      "in barrier (group 1, seq 1) at train.py:40"]),
    ("skip_4ranks", skip_4, "rank_stuck", "rank 1/4",
     ("default", 3, "all_reduce", ("rank 0/4", "rank 2/4"), ("rank 1/4", "rank 3/4"), None),
     {"rank 1/4": "at train.py:25 in evaluate (no op open)",
      "rank 3/4": "unknown (no op open, no Python frame captured)"},
     ["group default, seq 3: rank 0/4, rank 2/4 wait in all_reduce (f32[4]) at train.py:10; rank 1/4 never called "
      "it: at train.py:25 in evaluate (no op open); rank 3/4 never called it: unknown",
      "group default: 2 earlier collective(s) matched on all 4 members",
      "rank 3/4: last call in group default: seq 2 all_reduce (f32[4]) at train.py:10, completed; "
      "no progress for 12.5 s before the stall", "rank 1/4: last call in group default: seq 2 all_reduce "
      "(f32[4]) at train.py:10, completed; last progress unknown"]),
    ("op_mismatch_tie", op_tie, "collective_mismatch", None, ("default", 2, "all_reduce", ("rank 0/2",), (), "op"),
     {"rank 1/2": "in barrier (group default, seq 2) at train.py:12"},
     ["group default, seq 2: the members call different ops: rank 0/2 calls all_reduce (f32[4]) at train.py:10, "
      "not completed; rank 1/2 calls barrier at train.py:12, not completed",
      "no call is the most common (1 vs 1 members): neither side is named the culprit"]),
    ("op_mismatch_majority", op_majority, "collective_mismatch", "rank 2/3",
     ("default", 1, "all_reduce", ("rank 0/3", "rank 1/3"), (), "op"),
     {"rank 2/3": "in barrier (group default, seq 1) at train.py:12"},
     ["rank 0/3, rank 1/3 call all_reduce (f32[4]) at train.py:10",
      "rank 2/3 differ(s) from the call of 2 of 3 members: all_reduce (f32[4]) at train.py:10"]),
    ("shape_mismatch", shape_mismatch, "collective_mismatch", "rank 2/4",
     ("default", 2, "all_reduce", ("rank 0/4", "rank 1/4", "rank 3/4"), (), "shape"),
     {"rank 2/4": "in all_reduce of f32[8] (group default, seq 2) at train.py:10"},
     ["group default, seq 2: the members call different shapes: rank 0/4, rank 1/4, rank 3/4 call all_reduce "
      "(f32[4]) at train.py:10, not completed; rank 2/4 calls all_reduce (f32[8]) at train.py:10, not completed"]),
    ("rooted_shapes_by_design", rooted_then_op, "collective_mismatch", None,
     ("default", 3, "all_gather", ("rank 0/2",), (), "op"),
     {"rank 1/2": "in all_reduce of f32[1] (group default, seq 3) at train.py:80"},
     ["group default, seq 3: the members call different ops: rank 0/2 calls all_gather (f32[69760]) at "
      "train.py:74, not completed; rank 1/2 calls all_reduce (f32[1]) at train.py:80, not completed"]),
    ("compute_op", compute_stuck, "rank_stuck", "rank 1/2",
     ("default", 1, "all_reduce", ("rank 0/2",), ("rank 1/2",), None),
     {"rank 1/2": "in aten.mm.default at train.py:30 (started, never completed)"},
     ["rank 1/2 never called it: in aten.mm.default at train.py:30 (started, never completed)",
      "rank 1/2: last call in group default: none recorded; last progress unknown"]),
    ("exited_1", exited("exited 1"), "rank_stuck", "rank 2/3",
     ("default", 2, "all_reduce", ("rank 0/3", "rank 1/3"), ("rank 2/3",), None), {"rank 2/3": "exited with code 1"},
     ["group default, seq 2: rank 0/3, rank 1/3 wait in all_reduce (f32[4]) at train.py:10; rank 2/3 never called "
      "it: exited with code 1"]),
    ("segfault", exited("killed by SIGSEGV"), "rank_stuck", "rank 2/3",
     ("default", 2, "all_reduce", ("rank 0/3", "rank 1/3"), ("rank 2/3",), None), {"rank 2/3": "killed by SIGSEGV"},
     ["rank 2/3 never called it: killed by SIGSEGV"]),
    ("rank_waits_on_its_worker", rank_waits_on_worker, "rank_stuck", "rank 1/2",
     ("default", 2, "all_reduce", ("rank 0/2",), ("rank 1/2",), None),
     {"rank 1/2": "waiting on a queue at dataloader.py:1133 in _try_get_data"},
     ["rank 1/2 waits for its DataLoader; DataLoader worker 0 of rank 1 (pid 210) is blocked on a lock at "
      "worker.py:12 in __getitem__, no progress for 30.0 s before the stall"]),
    ("second_group_diverges", two_groups, "rank_stuck", "rank 3/4",
     ("2,3", 2, "all_gather", ("rank 2/4",), ("rank 3/4",), None),
     {"rank 3/4": "at train.py:71 in f (no op open)"},
     ["group 2,3, seq 2: rank 2/4 waits in all_gather (f32[4]) at train.py:60; rank 3/4 never called it: "
      "at train.py:71 in f (no op open)"]),
    ("earliest_divergence_wins", two_diverge, "rank_stuck", "rank 1/2",
     ("default", 1, "all_reduce", ("rank 0/2",), ("rank 1/2",), None),
     {"rank 1/2": "in broadcast of f32[4] (group late, seq 2) at train.py:80"},
     ["rank 0/2 waits in all_reduce (f32[4]) at train.py:10; rank 1/2 never called it: in broadcast"]),
    ("p2p_not_matched", p2p_diverge, "rank_stuck", "rank 0/2",
     ("default", 2, "all_reduce", ("rank 1/2",), ("rank 0/2",), None),
     {"rank 0/2": "in recv of f32[4] (group default, peer rank 1) at train.py:50"},
     ["group default: 1 earlier collective(s) matched on all 2 members"]),
]


@pytest.mark.parametrize("name, make, cls, culprit, div, instead, evidence", CASES, ids=[c[0] for c in CASES])
def test_divergence(name, make, cls, culprit, div, instead, evidence):
    f = analyse(make())
    assert (f.cls, f.culprit) == (cls, culprit)
    d = f.divergence
    assert (d.group, d.seq, d.op, d.waiting, d.missing, d.mismatch) == div
    assert d.instead == instead
    for sentence in evidence:
        assert any(sentence in e for e in f.evidence), (sentence, f.evidence)


def test_earliest_divergence_marks_its_start():
    # 'late' diverges at seq 2 (waiting call at t=8), 'default' at seq 1 (t=3): default is reported
    assert analyse(two_diverge()).divergence.t_start == 3.0


def test_worker_stuck_under_a_waiting_rank():
    r0 = rank(0, 1, *done_upto(2), wait="queue", frame="dataloader.py:1133 in _try_get_data")
    idle = worker(0, r0, wait="queue", frame="worker.py:300 in _worker_loop")
    locked = worker(1, r0, wait="lock", frame="worker.py:12 in __getitem__", last_progress_s=30.0)
    launcher = ProcessView(pid=50, ppid=1, role="pid 50: torchrun", kind="launcher", state="running")
    f = analyse([locked, launcher, idle, r0])
    assert (f.cls, f.culprit, f.divergence) == ("worker_stuck", "DataLoader worker 1 of rank 0", None)
    assert f.evidence[:2] == (
        "rank 0/1 waits for data: waiting on a queue at dataloader.py:1133 in _try_get_data",
        "DataLoader worker 1 of rank 0 (pid 201) is running, no progress for 30.0 s before the stall: blocked on a "
        "lock at worker.py:12 in __getitem__")
    assert [p["role"] for p in f.processes] == ["rank 0/1", "DataLoader worker 0 of rank 0",
                                                "DataLoader worker 1 of rank 0", "pid 50: torchrun"]


def test_worker_not_blamed_when_nobody_waits_for_it():
    r0 = rank(0, 1, frame="train.py:5 in main")
    f = analyse([r0, worker(0, r0, wait="lock", frame="worker.py:12 in __getitem__")])
    assert (f.cls, f.culprit) == (None, None)


def test_healthy_job_has_no_finding():
    f = analyse([rank(r, 2, *done_upto(3)) for r in range(2)])
    assert (f.cls, f.culprit, f.divergence) == (None, None, None)
    assert f.evidence == ("group default: all 2 members called seq 1 to 3 alike and all completed",)


def test_all_members_in_the_same_open_call_is_not_a_divergence():
    f = analyse([rank(r, 2, *done_upto(1), call("all_reduce", 2, done=False)) for r in range(2)])
    assert (f.cls, f.divergence) == (None, None)
    assert f.evidence == ("group default, seq 2: all 2 members are in all_reduce (f32[4]) at train.py:10, 2 not "
                          "completed: the calls match, so no member is missing from it",)


def test_a_rooted_call_in_flight_with_its_root_holding_more_is_not_a_divergence():
    f = analyse(rooted_in_flight())
    assert (f.cls, f.divergence) == (None, None)
    assert "all 2 members are in gather" in f.evidence[0]


def test_p2p_records_alone_never_diverge():
    f = analyse([rank(0, 2, *done_upto(1), call("send", None, peer=1), call("send", None, peer=1), *done_upto(2)[1:]),
                 rank(1, 2, *done_upto(1), call("recv", None, peer=0), *done_upto(2)[1:])])
    assert (f.cls, f.divergence) == (None, None)


def test_missing_rank_view_is_said_to_be_unknown():
    f = analyse([rank(0, 3, call("all_reduce", 1, done=False)), rank(1, 3)])
    assert f.evidence[-1] == ("world size 3, but no view of rank(s) 2: their state is unknown (on other nodes? "
                              "`gpulab merge` the watch folders of every node)")


def test_process_rows_and_json():
    f = analyse(skip_2())
    row = f.processes[1]
    assert row == {"role": "rank 1/2", "pid": 101, "node": "", "kind": "rank", "state": "running", "open_op": None,
                   "collective": {"group": "1", "seq": 1, "op": "barrier", "shapes": "", "done": False},
                   "last_progress_s": None, "wait": None, "frame": None, "own_code": False,
                   "log": None}
    assert analyse(compute_stuck()).processes[1]["open_op"] == "aten.mm.default at train.py:30"
    d = json.loads(json.dumps(f.to_dict()))
    assert d["class"] == "rank_stuck"
    assert d["divergence"]["missing"] == ["rank 1/2"]
    assert d["divergence"]["instead"] == {"rank 1/2": "in barrier (group 1, seq 1) at train.py:40"}


def test_job_module_is_pure():
    """gpulab.hang.jobs.job runs in a watched child and in the notebook: standard library only (its parts, split by
    concern, import only each other)."""
    parts = {"gpulab.hang.jobs.job", "gpulab.hang.jobs.jobfacts", "gpulab.hang.jobs.jobgroup", "gpulab.hang.jobs.jobloop",
             "gpulab.hang.jobs.jobwords"}
    for part in sorted(parts):
        tree = ast.parse(Path(job.__file__).with_name(part.rsplit(".", 1)[1] + ".py").read_text())
        mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        mods |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert {m.split(".")[0] for m in mods - parts} <= {"__future__", "math", "collections", "dataclasses",
                                                           "typing"}, part


# ------------------------------------------------------------------------------------------ the view

def test_timeline_and_table(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from gpulab.hang.jobs import jobview

    views = rank_waits_on_worker()
    f = analyse(views)
    fig = jobview.plot_timeline(views, f)
    try:
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.get_yticklabels()] == [v.role for v in views]
        assert any(t.get_text() == "group default seq 2: all_reduce" for t in ax.texts)
        fig.savefig(tmp_path / "timeline.png")
    finally:
        plt.close(fig)
    assert (tmp_path / "timeline.png").stat().st_size > 1000
    table = jobview.process_table(f)
    assert list(table.index) == [v.role for v in views]
    assert table.loc["rank 0/2", "collective"] == "all_reduce f32[4] (default, seq 2, OPEN)"
    assert table.loc["DataLoader worker 0 of rank 1", "waits in"] == "lock"


def test_finding_md_escapes():
    from gpulab.hang.jobs import jobview

    md = jobview.finding_md(analyse(skip_2()))
    assert md.startswith("**Job finding:** rank\\_stuck; **culprit:** rank 1/2. group default, seq 2:")
    assert "f32\\[4\\]" in md and md.count("[") == md.count("\\[")
    assert jobview.finding_md(analyse([rank(0, 1)])).startswith("**Job finding:** no cross-process finding; "
                                                                "**culprit:** none named.")


# ------------------------------------------------------------------------------------ training loops

LOOP = {"train.py:30": (25, 33), "train.py:31": (25, 33), "train.py:28": (25, 33), "train.py:40": (39, 41),
        "train.py:45": None}
SCOPE = dict.fromkeys(LOOP, (20, 50))


def grad(seq: int, done: bool = True, t: float | None = None) -> Collective:
    """DDP's gradient all_reduce: numbered by the flight recorder, issued inside `loss.backward()` at line 30."""
    t = float(seq) if t is None else t
    return Collective("all_reduce", "default", seq, "f32[36]", "train.py:30 in train", done, None, t,
                      t + 0.1 if done else None, "flight recorder")


def loop_rank(r: int, calls, stack, line_ops, **kw) -> ProcessView:
    return rank(r, 2, *calls, stack=stack, loops={k: LOOP[k] for k in stack}, scopes={k: SCOPE[k] for k in stack},
                line_ops=line_ops, **kw)


def waiting_rank(steps: int = 4) -> ProcessView:
    """rank 0 ran `steps` forwards (line 27: 5 ops each) and waits in the gradient all_reduce of the last."""
    return loop_rank(0, [grad(s) for s in range(1, steps)] + [grad(steps, done=False)], ("train.py:30",),
                     {"train.py:27": 5 * steps, "train.py:30": steps, "train.py:32": steps - 1})


def left_rank(forwards: int, *, calls: int = 3, line_ops: bool = True, **kw) -> ProcessView:
    """rank 1, past the loop's end at line 40 (a sleep loop waiting for a checkpoint) after `calls` all_reduces."""
    kw.setdefault("frame", "train.py:40 in train: `time.sleep(0.2)`")
    return loop_rank(1, [grad(s) for s in range(1, calls + 1)], ("train.py:40",),
                     {"train.py:27": 5 * forwards, "train.py:30": calls, "train.py:32": calls} if line_ops else None,
                     place="train.py:40", own_code=True, **kw)


LOOP_CASES = [
    # id, views, class, culprit, sentences the evidence holds
    ("uneven_inputs", lambda: [waiting_rank(), left_rank(3)], "uneven_inputs", "rank 1/2",
     ["rank 0/2 waits in all_reduce (group default, seq 4), the collective their loop at train.py:25-33 issues "
      "every step from train.py:30 (issued inside that call by PyTorch, as DDP's gradient all_reduce is in backward)",
      "rank 1/2 left that loop: it is at train.py:40 in train: `time.sleep(0.2)`, past its end, after seq 3",
      "ran fewer steps of the loop than rank 0/2"]),
    # seen: torchrun, 2 DataLoader workers a rank; the loop's header issued its iterator's ops once, as many on both
    ("dataloader_header_issues_its_ops_once", lambda: [
        dataclasses.replace(v, line_ops={**v.line_ops, "train.py:25": 10}) for v in (waiting_rank(), left_rank(3))],
     "uneven_inputs", "rank 1/2", ["ran fewer steps of the loop than rank 0/2"]),
    ("nan_guard_skipped_a_step", lambda: [waiting_rank(), left_rank(4)], "skipped_collective", "rank 1/2",
     ["rank 1/2 left that loop", "ran as many steps of the loop as rank 0/2", "skipped the collective in a step it ran"]),
    ("records_lost_cannot_tell", lambda: [waiting_rank(), left_rank(3, line_ops=False)], "uneven_inputs", "rank 1/2",
     ["the op logs do not tell whether rank 1/2 ran out of data (uneven inputs) or skipped a step"]),
    ("left_and_exited", lambda: [waiting_rank(), left_rank(3, state="exited 0")], "uneven_inputs", "rank 1/2",
     ["rank 1/2 left that loop: it is exited with code 0, past its end"]),
    ("barrier_in_a_branch", lambda: [waiting_rank(), loop_rank(
        1, [grad(s) for s in range(1, 4)] + [Collective("barrier", "default", 4, "", "train.py:31 in train", False,
                                                        None, 4.0)],
        ("train.py:31",), {"train.py:27": 20}, place="train.py:31")], "skipped_collective", "rank 1/2",
     ["rank 1/2 is in barrier at train.py:31, inside the same loop: a collective in a branch the others did not take"]),
    ("barrier_after_the_loop", lambda: [waiting_rank(), loop_rank(
        1, [grad(s) for s in range(1, 4)] + [Collective("barrier", "default", 4, "", "train.py:45 in train", False,
                                                        None, 4.0)],
        ("train.py:45",), {"train.py:27": 20, "train.py:30": 3}, place="train.py:45")], "skipped_collective",
     "rank 1/2", ["rank 1/2 left that loop: it is at train.py:45, past its end", "ran as many steps"]),
]


@pytest.mark.parametrize("name, make, cls, culprit, sentences", LOOP_CASES, ids=[c[0] for c in LOOP_CASES])
def test_training_loop_shapes(name, make, cls, culprit, sentences):
    f = analyse(make())
    assert (f.cls, f.culprit) == (cls, culprit), f.evidence
    assert (f.divergence.group, f.divergence.seq, f.divergence.op) == ("default", 4, "all_reduce")
    for sentence in sentences:
        assert any(sentence in e for e in f.evidence), (sentence, f.evidence)
    assert not any("neither side is named" in e for e in f.evidence)   # the verdict names who it blames
    rows = {p["role"]: p for p in f.processes}   # the table says what the verdict says
    assert rows["rank 0/2"]["collective"] == {"group": "default", "seq": 4, "op": "all_reduce", "shapes": "f32[36]",
                                              "done": False}


@pytest.mark.parametrize("change", ["no_source", "stuck_inside_the_loop", "first_call_of_its_line"])
def test_not_a_loop_shape_keeps_the_plain_finding(change):
    """Without the source, a rank stuck in its own code inside the loop, or a waiting call whose line never
    issued a matched collective before: no claim about the loop, the plain divergence stays."""
    r0, r1 = waiting_rank(), left_rank(3)
    if change == "no_source":
        r0 = dataclasses.replace(r0, loops={}, scopes={})
    elif change == "stuck_inside_the_loop":
        r1 = dataclasses.replace(r1, stack=("train.py:28",), place="train.py:28", loops={"train.py:28": (25, 33)},
                                 scopes={"train.py:28": (20, 50)})
    else:
        r0 = dataclasses.replace(r0, collectives=r0.collectives[-1:])
        r1 = dataclasses.replace(r1, collectives=())
    f = analyse([r0, r1])
    assert (f.cls, f.culprit) == ("rank_stuck", "rank 1/2"), f.evidence


def test_the_program_is_told_what_to_change():
    from gpulab.hang import classify

    assert "join()" in classify.program_cause("uneven_inputs") and "drop_last=True" in classify.program_cause(
        "uneven_inputs")
    assert "dist.all_reduce(flag" in classify.program_cause("skipped_collective")


def test_the_job_classes_are_the_vocabularys():
    from gpulab.hang import classify

    assert job.CLASSES == classify.JOB_CLASSES and set(job.CLASSES) <= set(classify.ALL_CLASSES)
