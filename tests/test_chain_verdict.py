"""The index's per-scenario verdict (pure): what the team lead reads first must follow from what ran."""
from __future__ import annotations

import pytest

from gpulab.chain import verdict
from gpulab.chain.verdict import NOT_APPLICABLE, judge

NOTEBOOKS = ("01_environment", "02_instrument", "03_bisect_hang", "04_fix_scenarios", "05_oracle", "06_benchmark")


def ok(names=NOTEBOOKS):
    return [{"name": n, "status": "ok"} for n in names]


def metrics(hang_status="ok", selected="flash", champion="sdpa_flash", mine=1.0, best=1.0, drill=False):
    return {"01_environment": {"metrics": {"sdpa_selected": selected}},
            "03_bisect_hang": {"headline": "no hang in 6 runs", "metrics": {"status": hang_status, "drill": drill}},
            "06_benchmark": {"metrics": {"champion": champion,
                                         "candidates": {f"sdpa_{selected}": {"median_ms": mine},
                                                        champion: {"median_ms": best}}}}}


def test_every_verdict_is_declared():
    assert set(verdict.VERDICTS) >= {"healthy", "hang", "crash", "error", "wrong_numbers", "slow", "failed",
                                     "interrupted", "not_applicable"}


def test_a_healthy_baseline_says_nothing_to_fix():
    v = judge(ok(), metrics())
    assert v.verdict == "healthy" and v.next_step == "nothing to fix on this platform"


@pytest.mark.parametrize("status, kind", [("error", "error"), ("hang", "hang"), ("timeout", "hang"), ("crash", "crash")])
def test_a_run_of_02_alone_that_did_not_finish_is_never_called_healthy(status, kind):
    """`gpulab run --only 02` on a failing workload: no 03 to judge it, and 02 saw it fail."""
    head = f"the workload did not finish: {status} after 557 ops"
    v = judge(ok(["02_instrument"]), {"02_instrument": {"headline": head, "metrics": {"status": status}}})
    assert (v.verdict, v.evidence) == (kind, head) and "--only 03,04" in v.next_step
    healthy = judge(ok(["02_instrument"]), {"02_instrument": {"headline": "557 ops", "metrics": {"status": "ok"}}})
    assert healthy.verdict == "healthy"


def test_a_scenario_whose_fix_cannot_apply_is_not_an_error():
    nbs = [{"name": n, "status": NOT_APPLICABLE, "error": "sdpa_backend_cudnn needs an NVIDIA GPU"} for n in NOTEBOOKS]
    v = judge(nbs, {}, "sdpa_backend_cudnn")
    assert v.verdict == "not_applicable" and "needs an NVIDIA GPU" in v.evidence


@pytest.mark.parametrize("champion,scenario_named", [("sdpa_cudnn", True), ("tiled", False)])
def test_slow_names_a_fix_scenario_only_where_one_exists(champion, scenario_named):
    v = judge(ok(), metrics(selected="math", champion=champion, mine=3.0, best=1.0))
    assert v.verdict == "slow"
    name = champion.removeprefix("sdpa_")
    assert (f"scenario sdpa_backend_{name}" in v.next_step) is scenario_named
    if not scenario_named:
        assert "not a PyTorch SDPA backend" in v.next_step


@pytest.mark.parametrize("fixes,names_backend", [((), True), (("decomposed_attention",), False),
                                                  (("fp32_softmax",), True)])
def test_slow_under_a_fix_that_replaces_sdpa_does_not_name_a_backend(fixes, names_backend):
    """Seen in a CPU --scenario all run: with decomposed_attention 06's sdpa_* rows time the plain attention the
    fix installed, so "runs on flash" would be a false finding; the verdict says what ran instead."""
    v = judge(ok(), metrics(selected="flash", champion="tiled", mine=1.5, best=1.0), "s", fixes)
    assert v.verdict == "slow"
    assert ("runs on flash" in v.evidence) is names_backend
    if not names_backend:
        assert "decomposed_attention" in v.evidence and "04's cost column" in v.next_step


@pytest.mark.parametrize("cls,in_program,says", [
    ("collective_mismatch", None, "make every rank call the same collectives"),
    ("worker_stuck", None, "blocks in the dataset's own code"),
    ("rank_stuck", None, "upstream report"),
    ("rank_stuck", "a rank runs the program's own code", "a rank runs the program's own code"),
])
def test_nothing_fixes_it_points_a_program_side_failure_at_the_program(cls, in_program, says):
    m = metrics(hang_status="hang")
    m["03_bisect_hang"]["metrics"].update({"class": cls, "in_program": in_program})
    m["04_fix_scenarios"] = {"metrics": {"tried": ["dataloader_spawn"], "not_tried": []}}
    v = judge(ok(), m)
    assert v.verdict == "hang" and v.next_step.startswith("nothing tried fixes it (dataloader_spawn)") and says in v.next_step


@pytest.mark.parametrize("in_program,says,not_says", [
    (None, "run the fix matrix", "own code"),
    ("a rank runs the program's own code", "a rank runs the program's own code (no fix was tried", "upstream"),
])
def test_without_04_a_program_side_failure_still_points_at_the_program(in_program, says, not_says):
    """Seen on the user path (`gpulab run --only 01,02,03` on a rank stuck in its own re.match): with 03 naming
    the program's own line, the index said to attach the bundle to an upstream report."""
    m = metrics(hang_status="hang")
    m["03_bisect_hang"]["metrics"].update({"class": "rank_stuck", "in_program": in_program})
    m.pop("04_fix_scenarios", None)
    v = judge(ok(), m)
    assert v.verdict == "hang" and says in v.next_step and not_says not in v.next_step


PROGRAM = {"kind": "program", "where": "prog.py:19 in bad_gather (the custom op holdout.bad_gather.default)",
           "why": "a crash (SIGSEGV) inside holdout.bad_gather.default, the program's own custom op"}
LIBRARY = {"kind": "library", "where": "aten.addmm.default (PyTorch), called at model.py:42",
           "why": "the failure is inside PyTorch's own aten.addmm.default on inputs it accepted"}
PLATFORM = {"kind": "platform", "where": "NVRM: Xid 79, GPU has fallen off the bus",
            "why": "the driver reported a hardware or driver fault"}


@pytest.mark.parametrize("with_04", [True, False], ids=["04 ran", "04 not run"])
@pytest.mark.parametrize("who,says,not_says", [
    (PROGRAM, "prog.py:19 in bad_gather", "upstream"),
    (LIBRARY, "upstream report for aten.addmm.default (PyTorch)", "program's own code"),
    (PLATFORM, "apply the fix registry's settings", "upstream"),
])
def test_the_next_step_follows_whose_code_it_is(who, says, not_says, with_04):
    m = metrics(hang_status="crash")
    cause = f"the bug is in the program's own code, at {who['where']}: {who['why']}" if who is PROGRAM else None
    m["03_bisect_hang"]["metrics"].update({"class": "unknown", "owner": who, "in_program": cause})
    if with_04:
        m["04_fix_scenarios"] = {"metrics": {"tried": [], "not_tried": [], "skipped": {"sdpa_backend_math": "..."}}}
    else:
        m.pop("04_fix_scenarios", None)
    v = judge(ok(), m)
    assert v.verdict == "crash" and says in v.next_step and not_says not in v.next_step
    assert ("04 ruled out 1 by the evidence" in v.next_step) is with_04


def test_a_workaround_for_the_programs_own_bug_still_points_at_the_program():
    m = metrics(hang_status="hang")
    m["03_bisect_hang"]["metrics"].update({"class": "worker_stuck", "owner": PROGRAM})
    m["04_fix_scenarios"] = {"metrics": {"recommendation": "dataloader_no_workers", "recommendation_runs": "0/3"}}
    v = judge(ok(), m)
    assert v.next_step.startswith("dataloader_no_workers fixes it") and "program's own bug" in v.next_step
    assert "upstream" not in v.next_step


def test_the_index_says_what_the_fix_working_means_and_the_other_fixes():
    m = metrics(hang_status="hang")
    m["03_bisect_hang"]["metrics"].update({"class": "worker_stuck", "owner": PROGRAM})
    m["04_fix_scenarios"] = {"metrics": {
        "recommendation": "dataloader_spawn", "recommendation_runs": "0/3",
        "recommendation_apply": "DataLoader(..., multiprocessing_context='spawn')",
        "recommendation_means": "so the worker blocks on something it inherited from the parent at fork",
        "also_fixes": "also fixes it: dataloader_no_workers (0/3 failed; about 18 s a run against 50 s)"}}
    v = judge(ok(), m)
    assert v.next_step.startswith("dataloader_spawn fixes it (0/3 failed): so the worker blocks on something it "
                                  "inherited from the parent at fork; apply with: DataLoader(..., "
                                  "multiprocessing_context='spawn'); also fixes it: dataloader_no_workers")
    assert "program's own bug" in v.next_step


def test_a_stuck_child_the_platform_explains_is_not_sent_to_read_its_queue():
    """A child forked after OpenMP ran waits in OpenMP's pool: 03's owner is the platform meeting the program, with
    the program's way out (spawn); the class's own words for a stuck child (read the Queue before join) are not the
    next step."""
    m = metrics(hang_status="hang")
    forked = {"kind": "platform", "where": "OpenMP (libgomp), in pid 7: python prog.py",
              "why": "pid 7 was forked from a process that had already run parallel CPU work",
              "program": "start the child processes with spawn or forkserver"}
    m["03_bisect_hang"]["metrics"].update({"class": "child_stuck", "owner": forked, "in_program": None})
    m["04_fix_scenarios"] = {"metrics": {"tried": [], "not_tried": [], "skipped": {"dataloader_spawn": "..."}}}
    v = judge(ok(), m)
    assert "the platform's behaviour meets the program's code" in v.next_step, v.next_step
    assert "start the child processes with spawn" in v.next_step and "Queue" not in v.next_step, v.next_step


@pytest.mark.parametrize("inst, says", [
    ({"first_nonfinite_op": "aten.nll_loss_forward.default", "first_nonfinite_lasted": False,
      "first_nonfinite_made": "NaN", "first_nonfinite_where": "aten.nll_loss_forward.default at t.py:9 (pass 4)",
      "first_nonfinite_cause": "every target is ignore_index"},
     "02: NaN made in aten.nll_loss_forward.default at t.py:9 (pass 4) (every target is ignore_index) did not last"),
    ({"first_nonfinite_caught_by": "GradScaler", "first_nonfinite_sentence": "an overflow the GradScaler caught"},
     "02: an overflow the GradScaler caught"),
    ({}, None),
])
def test_a_healthy_run_that_made_a_passing_nan_names_it_in_the_evidence(inst, says):
    """Healthy stays healthy, but a reader who saw NaN in the run's log finds where it came from at the top."""
    m = {**metrics(), "02_instrument": {"metrics": inst}}
    v = judge(ok(), m)
    assert v.verdict == "healthy" and v.next_step == "nothing to fix on this platform", v
    assert (says in v.evidence) if says else ("02:" not in v.evidence), v.evidence
