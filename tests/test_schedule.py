"""Which of a scenario's notebooks run side by side (gpulab.chain.runner.schedule), read from the shipped
notebooks' metadata: each after the notebooks whose products it reads, a timed one alone."""
from __future__ import annotations

import pytest

from conftest import ROOT
from gpulab.chain import runner

NOTEBOOKS = sorted((ROOT / "notebooks").glob("0*.ipynb"))
METAS = {p.stem: runner._meta(p) for p in NOTEBOOKS}
TIMED = {n for n, m in METAS.items() if m.get("timed")}


def _starts(program: bool) -> list[list[str]]:
    """The groups that start together when every running notebook ends before the next decision."""
    after = runner.waits_for(METAS, program)
    pending, done, groups = sorted(METAS), set(), []
    while pending:
        group = runner.schedule(pending, set(), done, after, TIMED)
        assert group, f"nothing can start: {pending} wait for {[after[n] for n in pending]}"
        groups.append(group)
        pending = [n for n in pending if n not in group]
        done |= set(group)
    return groups


def test_the_timed_notebooks_are_the_ones_that_measure_time():
    # 02 records and checks; the recorder's cost, which it used to time, is timed in 06; 04 times fixes, when
    # it has one to time (its metadata names the function that says, once 01 and 03 ended)
    assert TIMED == {"04_fix_scenarios", "06_benchmark"}
    assert METAS["06_benchmark"]["timed"] is True
    assert METAS["04_fix_scenarios"]["timed"] == "gpulab.fixes.scenarios:times_anything"


@pytest.mark.parametrize("program", [False, True])
def test_the_chain_starts_what_times_nothing_side_by_side_then_each_timed_notebook_alone(program):
    # (here every notebook ends before the next decision; in a run 03 starts as soon as 02 ends, while 05 runs)
    assert _starts(program) == ([["01_environment", "02_instrument", "05_oracle"], ["06_benchmark"],
                                 ["03_bisect_hang"], ["04_fix_scenarios"]] if not program else
                                [["01_environment", "02_instrument"], ["03_bisect_hang", "05_oracle"],
                                 ["04_fix_scenarios"], ["06_benchmark"]])


@pytest.mark.parametrize("program, waits", [(False, set()), (True, {"02_instrument"})])
def test_the_oracle_reads_the_recorded_attention_only_of_a_users_program(program, waits):
    assert runner.waits_for(METAS, program)["05_oracle"] == waits


@pytest.mark.parametrize("pending, running, done, expect", [
    (["04_fix_scenarios", "06_benchmark"], {"05_oracle"}, {"03_bisect_hang"}, []),   # a ready timed one holds back
    (["06_benchmark"], set(), {"02_instrument", "05_oracle"}, ["06_benchmark"]),
    (["06_benchmark"], set(), {"05_oracle"}, []),                                   # it reads 02's status too
    (["01_environment"], {"06_benchmark"}, {"02_instrument", "05_oracle"}, []),      # nothing beside a timed one
    (["03_bisect_hang", "05_oracle"], {"01_environment"}, {"02_instrument"}, ["03_bisect_hang", "05_oracle"]),
    (["04_fix_scenarios"], set(), set(), []),                                      # its input not done yet
])
def test_a_step_of_the_schedule(pending, running, done, expect):
    after = runner.waits_for(METAS, False)
    assert runner.schedule(pending, running, done, after, TIMED) == expect


def test_a_notebook_outside_the_run_is_not_waited_for():
    """`--only 03 04`: 03's input from 02 is in an earlier run's folder or nowhere; it does not block."""
    metas = {n: m for n, m in METAS.items() if n[:2] in ("03", "04")}
    assert runner.waits_for(metas, True) == {"03_bisect_hang": set(), "04_fix_scenarios": {"03_bisect_hang"}}


@pytest.mark.parametrize("m03, suggested, values, times", [
    ({"status": "ok"}, [], {}, False),                                    # healthy, nothing suggested: baseline alone
    ({"status": "ok", "ladder": "failed"}, [], {}, True),                 # its ladder says otherwise: not decided here
    ({"status": "ok"}, ["omp_single_thread"], {}, True),                  # 01's suggestion is tried, and timed
    ({"status": "hang", "class": "deadlock", "in_flight_op": "aten.mm.default"}, [], {}, True),
    ({"status": "ok"}, [], {"fault": "deadlock:aten.mm@3"}, True),        # a planted fault: 04 climbs its own
    ({"status": "ok"}, [], {"scenarios": "baseline,contiguous_gemm_inputs"}, True),   # named: timed against it
    ({"status": "ok"}, [], {"scenarios": "baseline"}, False),
    ({"status": "hang"}, ["omp_single_thread"], {"cost_rounds": 0}, False),    # no cost rounds: nothing timed
    (None, [], {}, True),                                                 # 03 did not run here: not known
])
def test_04_times_something_unless_auto_leaves_the_baseline_alone(tmp_path, m03, suggested, values, times):
    from gpulab import report
    from gpulab.fixes import scenarios

    if m03 is not None:
        m03 = dict(m03)
        status = m03.pop("status")
        lad = m03.pop("ladder", "passed" if status == "ok" else "failed")
        report.record(tmp_path, "03_bisect_hang", "h", status=status, **m03)
        passes = 3 if lad == "passed" else 2
        (tmp_path / "ladder").mkdir()
        report.write_json(tmp_path / "ladder" / "ladder.json",   # as LadderResult.to_dict writes it
                          {"rungs": [{"name": "forward", "trials": 3, "counts": {"pass": passes}}],
                           "interrupted": False, "first_failing_rung": None if passes == 3 else "forward"})
    report.write_json(tmp_path / "suggested_scenarios.json", {"scenarios": suggested})
    assert scenarios.times_anything(tmp_path, {"scenarios": "auto", "fault": "none", "cost_rounds": 3, **values}) \
        is times
