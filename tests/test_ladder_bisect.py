"""The ladder, the bisection, op replay and the bundle on real hangs in real child processes.

Every hang is a real native deadlock in a watched child; the intermittent one fails on every 4th launch
(a known fraction, counted in a file) so a test of a rate cannot flake. Stall windows are short.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gpulab import trace
from gpulab.hang.investigation import bisect, bundle, ladder, repro
from gpulab.hang import verdict
from gpulab.hang.watchdog import watch
from gpulab.workloads import WorkloadConfig

FIX = Path(__file__).parent / "fixtures"
HANG = FIX / "threshold_hang.py"
LIB = str(Path(__file__).resolve().parents[1] / "lib")
STALL = 1.0


def gpulab(args, timeout=300):
    return subprocess.run([sys.executable, "-m", "gpulab", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": LIB})


# ------------------------------------------------------------------------------------ pure parts

@pytest.mark.parametrize("k,n,lo,hi", [(0, 10, 0.0, 0.2775), (5, 20, 0.1119, 0.4687), (10, 10, 0.7225, 1.0),
                                       (1, 1, 0.2065, 1.0)])
def test_wilson_interval(k, n, lo, hi):
    got = ladder.wilson(k, n)
    assert got == pytest.approx((lo, hi), abs=1e-3)


@pytest.mark.parametrize("rate,n", [(0.3, 9), (0.02, 149), (0.5, 5), (1.0, 1)])
def test_trials_to_detect_matches_the_anchor_figures(rate, n):
    assert ladder.trials_to_detect(rate) == n


MB = 1 << 20


@pytest.mark.parametrize("series,leak", [
    ([100 * MB, 120 * MB] + [120 * MB] * 8, False),               # first step allocates state, then flat
    ([100 * MB + i * 8 * MB for i in range(10)], True),            # 8 MiB more every step
    ([100 * MB + (i % 2) * 4 * MB for i in range(10)], False),     # oscillates, no trend
    ([1000 * MB + i * 200_000 for i in range(10)], False),         # 0.2 MB/step: allocator noise
])
def test_memory_growth_leak_flag(series, leak):
    g = ladder.memory_growth([{"allocated": v} for v in series])
    assert g["leak"] is leak and g["series"]["allocated"]["leak"] is leak


def test_memory_growth_needs_three_steps():
    assert ladder.memory_growth([{"rss": 1}, {"rss": 2}]) is None


@pytest.mark.parametrize("threshold,lo,hi", [(65, 1, 128), (1, 1, 128), (128, 1, 128), (7, 3, 1000), (2, 1, 2)])
def test_search_int_finds_the_threshold_within_the_probe_budget(threshold, lo, hi):
    probes = []

    def fails(v):
        probes.append(v)
        return v >= threshold

    assert bisect.search_int(bisect.IntDim("n", hi, lo), fails) == max(threshold, lo)
    assert len(probes) <= math.ceil(math.log2(hi - lo + 1)) + 2


@pytest.mark.parametrize("spec,msg", [("seq=3:5", "SMALLEST 5 is above FAILING 3"), ("seq=3", "NAME=FAILING:SMALLEST"),
                                      ("seq=a:1", "must be integers"), ("=3:1", "NAME=FAILING:SMALLEST")])
def test_space_spec_errors(spec, msg):
    with pytest.raises(bisect.BisectError, match=msg):
        bisect.parse_space(spec)


@pytest.mark.parametrize("spec,msg", [("dtype=bf16", "NAME=FAILING:ALT1,ALT2"), ("dtype=bf16:bf16", "also listed"),
                                      ("dtype=bf16:", "NAME=FAILING:ALT1,ALT2")])
def test_choice_spec_errors(spec, msg):
    with pytest.raises(bisect.BisectError, match=msg):
        bisect.parse_choice(spec)


def test_check_names_missing_and_unbound_placeholders():
    with pytest.raises(bisect.BisectError, match="seq do not appear in the command"):
        bisect.check(["x", "{n}"], [bisect.IntDim("seq", 2, 1), bisect.IntDim("n", 2, 1)], [])
    with pytest.raises(bisect.BisectError, match=r"\{heads\} in the command have no --space"):
        bisect.check(["x", "{n}", "{heads}"], [bisect.IntDim("n", 2, 1)], [])
    argv, env = bisect.instantiate(["x", "--n={n}"], {"n": 5, "env.CUDA_MODULE_LOADING": "LAZY"})
    assert argv == ["x", "--n=5"] and env == {"CUDA_MODULE_LOADING": "LAZY"}


# ------------------------------------------------------------------------------------ real runs

def test_ladder_finds_an_intermittent_hang_with_an_interval_holding_the_true_rate(tmp_path):
    counter = tmp_path / "launches"
    rungs = [ladder.Rung("small", (sys.executable, str(HANG), "--seq", "16", "--every", "4", "--counter", str(counter))),
             ladder.Rung("big", (sys.executable, str(HANG), "--seq", "80", "--every", "4", "--counter", str(counter)))]
    counter.write_text("0")
    res = ladder.run(rungs, repeats=16, jobs=2, stall_s=STALL, timeout_s=60, out_dir=tmp_path / "l", record=False, stacks=False,
                     progress=lambda m: None)
    small, big = res.rungs
    assert small.counts["pass"] == 16 and not small.failed
    assert big.counts == {"pass": 12, "hang": 4, "crash": 0, "error": 0, "timeout": 0}  # every 4th launch
    assert big.fail_rate_ci[0] < 0.25 < big.fail_rate_ci[1]
    assert res.first_failing_rung == "big" and big.first_failure["status"] == "hang"
    saved = json.loads((tmp_path / "l" / "ladder.json").read_text())
    assert saved["first_failing_rung"] == "big" and len(saved["rungs"]) == 2


def _exits(name: str, code: int) -> ladder.Rung:
    return ladder.Rung(name, (sys.executable, "-c", f"import sys; sys.exit({code})"))


@pytest.mark.parametrize("codes, ran, first_failing", [
    ((0, 0, 0), ["top"], None),                     # the top passed every trial: the rungs below are covered
    ((0, 1, 1), ["low", "mid", "top"], "mid"),      # it failed: the rungs below climb to the smallest that fails
    ((1, 0, 1), ["low", "top"], "low"),
])
def test_top_first_runs_the_rungs_below_only_when_the_top_fails(tmp_path, codes, ran, first_failing):
    from gpulab.fixes.matrix import MatrixConfig, reusable

    rungs = [_exits(n, c) for n, c in zip(("low", "mid", "top"), codes)]
    res = ladder.run(rungs, repeats=2, jobs=2, stall_s=5.0, timeout_s=60, out_dir=tmp_path / "l", record=False,
                     stacks=False, progress=lambda m: None, stop_at_first_failure=True, top_first=True)
    assert [r.name for r in res.rungs] == ran and res.first_failing_rung == first_failing
    assert sorted({p.name.split("-")[0] for p in (tmp_path / "l").glob("*-0*")}) == sorted(ran)
    saved = ladder.LadderResult.from_dict(json.loads((tmp_path / "l" / "ladder.json").read_text()))
    assert [r.name for r in saved.rungs] == ran and saved.covered == res.covered == (() if first_failing else ("low", "mid"))
    rows = ladder.table_rows(res)
    assert [r["rung"] for r in rows] == [*res.covered, *ran]
    # 04's baseline takes 03's ladder as what it would have climbed itself: bottom up to the first failure
    prior = reusable(res.to_dict(), rungs, MatrixConfig(repeats=2, stall_s=5.0, timeout_s=60))
    assert prior is not None and [r.name for r in prior.rungs] == (["top"] if first_failing is None else
                                                                   ran[:ran.index(first_failing) + 1])
    assert reusable(res.to_dict(), rungs[1:], MatrixConfig(repeats=2, stall_s=5.0, timeout_s=60)) is None


def test_ladder_cli_exit_codes(tmp_path):
    ok = gpulab(["ladder", "--json", str(tmp_path / "ok.json"), "--out", str(tmp_path / "l1"), "--repeats", "2", "--no-record",
                 "--rung", f"a={sys.executable} {HANG} --seq 3", "--rung", f"b={sys.executable} {HANG} --seq 4"])
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "ok.json").read_text())["first_failing_rung"] is None
    bad = gpulab(["ladder", "--json", str(tmp_path / "bad.json"), "--out", str(tmp_path / "l2"), "--repeats", "1",
                  "--no-record", "--stall", "1",
                  "--", sys.executable, str(HANG), "--seq", "99"])
    assert bad.returncode == 1 and json.loads((tmp_path / "bad.json").read_text())["first_failing_rung"] == "command"


@pytest.mark.parametrize("args,code,needle", [
    (["--rung", "oops"], 2, "is not NAME=COMMAND"),
    (["--rung", "a=true", "--rung", "a=true"], 2, "given twice"),
    (["--repeats", "0", "--", "true"], 2, "--repeats 0 is not valid"),
    (["--", "no-such-program-xyz"], 127, "command not found"),
])
def test_ladder_cli_bad_input(tmp_path, args, code, needle):
    r = gpulab(["ladder", "--json", str(tmp_path / "l.json"), "--out", str(tmp_path / "l"), *args])
    assert r.returncode == code and needle in r.stderr and not (tmp_path / "l.json").exists()
    assert not (tmp_path / "l").exists()  # nothing written


def test_bisect_shrinks_a_threshold_hang_to_exactly_65_and_heads_to_1(tmp_path):
    r = gpulab(["bisect", "--json", str(tmp_path / "b.json"), "--no-record", "--stall", str(STALL), "--out",
                str(tmp_path / "b"), "--space", "seq=128:1", "--space", "heads=8:1", "--",
                sys.executable, str(HANG), "--seq", "{seq}", "--heads", "{heads}"])
    assert r.returncode == 0, r.stderr
    b = json.loads((tmp_path / "b.json").read_text())
    assert b["minimal"] == {"seq": 65, "heads": 1}
    assert b["verdict"]["status"] == "hang"
    per_dim = {d: sum(1 for p in b["probes"] if p["dimension"] == d) for d in ("seq", "heads")}
    assert per_dim["seq"] <= math.ceil(math.log2(128)) + 2 and per_dim["heads"] <= math.ceil(math.log2(8)) + 2
    sh = (tmp_path / "b" / "repro.sh").read_text()
    assert "--seq 65 --heads 1" in sh
    again = watch.run(["sh", str(tmp_path / "b" / "repro.sh")], stall_s=STALL, timeout_s=60, out_dir=tmp_path / "again",
                      progress=lambda m: None)
    assert again.status == "hang"  # the emitted repro reproduces in a fresh child


def test_bisect_an_intermittent_hang_with_repeats(tmp_path):
    counter = tmp_path / "launches"
    counter.write_text("0")
    res = bisect.run([sys.executable, str(HANG), "--seq", "{seq}", "--every", "3", "--counter", str(counter)],
                     [bisect.IntDim("seq", 100, 1)], out_dir=tmp_path / "b", repeats=3, jobs=1, stall_s=STALL,
                     timeout_s=60, record=False, progress=lambda m: None)
    assert res.minimal == {"seq": 65}
    assert all(p.counts.get("pass", 0) == 3 for p in res.probes if p.outcome == "pass")  # a pass means 3 of 3


def test_bisect_of_a_passing_program_says_there_is_nothing_to_bisect(tmp_path):
    r = gpulab(["bisect", "--json", str(tmp_path / "b.json"), "--out", str(tmp_path / "b"), "--no-record", "--repeats",
                "2", "--space", "seq=40:1",
                "--", sys.executable, str(HANG), "--seq", "{seq}"])
    assert r.returncode == 2
    assert "nothing to bisect: the failing values (seq=40) passed 2 of 2 trial(s)" in r.stderr
    assert json.loads((tmp_path / "b.json").read_text())["probes"][0]["outcome"] == "pass"


def _watch_torch(folder, *extra):
    return watch.run([sys.executable, str(HANG), "--torch", "--seq", "70", "--heads", "3", *extra], stall_s=1.5,
                     timeout_s=120, out_dir=folder / "w", progress=lambda m: None)


@pytest.fixture(scope="module")
def torch_hang(tmp_path_factory):
    """One real hang inside a custom op, watched, and its verified replay (shared: each costs a torch start)."""
    folder = tmp_path_factory.mktemp("torch_hang")
    v = _watch_torch(folder)
    records = trace.read(Path(v.log["dir"]) / v.log["op_log"]).records
    res = repro.make(v, records, folder / "r", stall_s=1.5, timeout_s=120, progress=lambda m: None)
    return folder, v, records, res


def test_replay_of_the_in_flight_custom_op_reproduces(torch_hang, tmp_path):
    folder, v, records, res = torch_hang
    assert v.status == "hang" and v.in_flight_op["name"] == "gpulab_test.gate.default"
    assert v.in_flight_op["strides"][0] == [16, 48, 1]  # the non-contiguous layout was recorded
    assert res.candidates[0].reproduces and res.candidates[0].ops > 1   # the whole replay first, then smaller
    assert res.verified == "repro.py" and res.candidates[-1].ops == 1 and res.candidates[-1].reproduces
    src = (folder / "r" / "repro.py").read_text()
    assert "torch.ops.gpulab_test.gate.default(t([3, 70, 16], [16, 48, 1], 'float32', 'cpu'), False)" in src
    again = watch.run([sys.executable, str(folder / "r" / "repro.py")], stall_s=1.5, timeout_s=120,
                      out_dir=tmp_path / "again", progress=lambda m: None, stacks=False)
    assert again.status == "hang" and again.in_flight_op["name"] == "gpulab_test.gate.default"


def test_a_jobs_in_flight_op_is_not_replayed_alone(torch_hang, tmp_path):
    """A job's finding names one rank's open collective, with no record number: no single-process replay (it
    raised a TypeError comparing record numbers with None, and 03 failed)."""
    folder, v, records, _ = torch_hang
    job_op = {"name": "nccl:all_reduce", "args": "f32[1]", "call_site": "train.py:106 in main", "process": "rank 1/2"}
    res = repro.make(verdict.Verdict(**{**v.__dict__, "in_flight_op": job_op}), records, tmp_path / "r",
                     progress=lambda m: None)
    assert res.verified is None and res.candidates == () and "rank 1/2" in res.explanation
    assert "the job is the repro" in res.explanation


def test_replay_says_when_nothing_reproduces(torch_hang, tmp_path):
    folder, v, records, _ = torch_hang
    before = [r for r in records if "gate" not in r.name]
    fake = verdict.Verdict(**{**v.__dict__, "in_flight_op": verdict.op_dict(before[-1])})
    res = repro.make(fake, before, tmp_path / "r", stall_s=1.5, timeout_s=60, max_candidates=1,
                     progress=lambda m: None)
    assert res.verified is None and "none of 1 candidate(s)" in res.explanation
    ops, upto = repro.replay_ops(before, before[-1].seq)   # the calls to replay (an op stands for what it ran)
    assert res.candidates[0].ops == len([r for r in ops if r.seq <= upto][-repro.MAX_SUFFIX:])
    assert not (tmp_path / "r" / "repro.py").exists()


def test_bundle_holds_the_evidence_and_nothing_machine_private(torch_hang, tmp_path):
    folder, v, records, res = torch_hang
    path = bundle.write(tmp_path, verdict_dir=folder / "w", repro_dir=folder / "r",
                        versions=f"PyTorch version: 2.x\nhome {os.path.expanduser('~')} at {folder}\n",
                        roots={"data": folder})
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        body = {n: z.read(n).decode() for n in names}
    assert {"issue.md", "failure/verdict.json", "failure/stacks_python.txt", "repro/repro.py",
            "env/collect_env.txt"} <= names
    issue = body["issue.md"]
    for heading in ("### 🐛 Describe the bug", "#### Minimal repro", "### Versions", "```python"):
        assert heading in issue
    assert "gpulab_test.gate.default" in issue
    for text in body.values():
        assert str(folder) not in text and str(tmp_path) not in text and str(Path(LIB).parent) not in text


def test_replay_grows_a_suffix_when_the_op_alone_does_not_fail(tmp_path):
    v = _watch_torch(tmp_path, "--armed")
    snap = trace.read(Path(v.log["dir"]) / v.log["op_log"])
    res = repro.make(v, snap.records, tmp_path / "r", stall_s=1.5, timeout_s=120, progress=lambda m: None)
    assert res.candidates[0].reproduces and res.verified == "repro.py"   # the whole replay, then the shortest
    kept = (tmp_path / "r" / "repro.py").read_text()
    assert "gpulab_test.arm" in kept and "gpulab_test.gate" in kept
    assert [(c.ops, c.reproduces) for c in res.candidates[1:]] == [(1, False), (2, True)]  # arm, then gate



@pytest.mark.parametrize("cfg, light", [
    (WorkloadConfig(device="cuda"), True),                                     # the default: ~12 MB a trial
    (WorkloadConfig(device="cuda", batch=64, text_tokens=2048, image_tokens=2048), False),
    (WorkloadConfig(device="cuda", workload="script:train.py"), False),        # a user program: unknown needs
])
def test_light_trials_share_a_gpu_four_at_a_time(cfg, light):
    from gpulab import device
    from gpulab.hang.investigation import investigate

    assert investigate.light(cfg) is light
    assert device.trial_jobs(0, "cuda", investigate.light(cfg)) == (4 if light else 2)
    assert device.trial_jobs(3, "cuda", light) == 3 and device.trial_jobs(0, "cpu", light) <= 4
