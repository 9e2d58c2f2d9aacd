"""Notebooks 05/06 on a user program (`workload=script:...`): the SDPA calls read from real op logs recorded
from small real programs (gpulab.recorded), what 05 judges and what 06 times for them, and the chain on a
program with attention calls and on one without (05/06 then say they do not apply, and nothing fails)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpulab import bench, oracle, recorded, trace
from gpulab.bench import child, view
from gpulab.report import esc, record
from gpulab.workloads import AttentionCall, WorkloadConfig

from conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures"
SDPA_SCRIPT = FIXTURES / "sdpa_calls.py"
NO_ATTENTION = FIXTURES / "no_attention.py"
CRASH_BEFORE = "import sys\nimport torch\n\nx = torch.randn(8, 8)\n(x @ x).sum()\nsys.exit(3)  # before any attention\n"


def _record(script: Path, out_dir: Path) -> trace.Recording:
    """Run the program under 02's recorder (ops mode) into out_dir/ops.log, and leave 02's metrics as 02 does."""
    rec = trace.record([sys.executable, str(script)], mode="ops", out_dir=out_dir, timeout_s=120, name="ops")
    record(out_dir, "02_instrument", "recorded", status=rec.status, ops_recorded=rec.snapshot.started,
           exit_code=rec.returncode)
    return rec


@pytest.fixture(scope="module")
def logs(chains, tmp_path_factory) -> dict[str, Path]:
    """out_dirs holding 02's products for: the attention program and one without attention (the folders of the
    chains below: their notebook 02 recorded these programs, which are not recorded twice), and one that exits
    3 before any attention call."""
    base = tmp_path_factory.mktemp("recorded")
    crash = base / "crash_before.py"
    crash.write_text(CRASH_BEFORE)
    _record(crash, base / "crash")
    return {"sdpa": chains["sdpa"][3], "none": chains["none"][3], "crash": base / "crash"}


def _calls(out_dir: Path) -> tuple[recorded.RecordedCall, ...]:
    return recorded.attention_calls(trace.read(out_dir / recorded.OPS_LOG).records)


# ------------------------------------------------------------------------------ the op log, parsed


def test_recorded_calls_are_the_programs_own_most_frequent_first(logs):
    calls = _calls(logs["sdpa"])
    got = [(c.count, c.describe(), c.kernels) for c in calls]
    assert got == [
        (4, "B=2 H=4/2 kv S=24 Sk=40 D=16 float32, no mask", ("flash",)),
        (3, "B=2 H=4 S=24 D=16 float32, bool mask 2x1x24x24", ("flash",)),
        (2, "B=2 H=4 S=24 D=16 float32, no mask, causal", ("flash", "math")),   # causal from both backends
        (1, "B=2 H=4 S=24 Sk=40 D=16 float32, no mask", ("flash",)),
        (1, "B=2 H=4 S=24 D=16 bfloat16, no mask", ("flash",)),
    ]
    assert "grouped-query" in calls[0].untimed and not any(c.untimed for c in calls[1:])
    cross = calls[3].attention()
    assert (cross.seq_len, cross.keys, cross.kv_len) == (24, 40, 40)
    q, k, v, mask = cross.inputs("cpu")
    assert q.shape == (2, 4, 24, 16) and k.shape == v.shape == (2, 4, 40, 16) and mask is None
    masked = calls[1].attention()
    mask = masked.inputs("cpu")[3]
    assert mask.dtype == torch.bool and mask.shape == (2, 1, 24, 24) and bool(mask[..., 0].all())


def test_a_program_without_attention_has_no_recorded_call(logs):
    assert _calls(logs["none"]) == ()
    assert _calls(logs["crash"]) == ()


def test_a_jobs_attention_calls_are_read_from_its_processes(tmp_path):
    """The launcher of a job calls no attention; its spawned processes do, each recorded in ops.procs/: 05 and
    06 judge their calls (before, 05 read the launcher's log alone and said the program calls none)."""
    _record(FIXTURES / "sdpa_in_worker.py", tmp_path)
    use = recorded.attention_use(WorkloadConfig(workload=f"script:{FIXTURES / 'sdpa_in_worker.py'}"), tmp_path)
    assert use.seen == "calls" and [c.count for c in use.calls] == [3], use.note


def test_kernel_argument_positions_match_torchs_schemas():
    """is_causal and the mask are read by position from the fused kernels' records: the positions must be
    those of this torch's aten schemas."""
    for name, (_, causal, mask) in recorded.KERNELS.items():
        packet = getattr(torch.ops.aten, name.split(".")[1], None)
        if packet is None:
            continue   # a kernel this torch does not have
        args = packet.default._schema.arguments
        assert args[causal].name == "is_causal" and not args[causal].kwarg_only, name
        if mask is not None:
            assert args[mask].name in ("attn_bias", "attn_mask") and not args[mask].kwarg_only, name


@pytest.mark.parametrize("facts, seen, words", [
    (dict(), "none", "the program ran to the end without calling scaled_dot_product_attention (02 recorded 50 ops"),
    (dict(status="error", exit_code=3), "unknown", "unknown whether the program calls attention: the recording "
                                                   "ended after 50 ops (the program exited 3)"),
    (dict(status="timeout", exit_code=None), "unknown", "(the program was stopped at 02's deadline)"),
    (dict(status="crash", exit_code=-9), "unknown", "(the program was killed by signal 9)"),
    (dict(status="hang", exit_code=None, open_op="aten.bmm.default"), "unknown",
     "(the program made no progress and 02 stopped it as hung, inside aten.bmm.default)"),
    (dict(open_op="aten.bmm.default"), "unknown", "ended after 50 ops (it stopped inside aten.bmm.default)"),
    (dict(status=None), "unknown", "02's exit status for it is not in metrics.json"),
    (dict(dropped=20), "unknown", "kept only the last 30 of 50 ops"),
])
def test_judge_says_none_only_when_the_whole_program_was_seen(facts, seen, words):
    use = recorded.judge("script:x.py", (), 50, **facts)
    assert use.seen == seen and words in use.note
    assert use.applies is (seen != "none")
    assert use.benchmark() == (None, use.note)


# ------------------------------------------------------------------------ what 05 and 06 do with it


def _spec(out_dir: Path | None, workload: str = f"script:{SDPA_SCRIPT}") -> child.Spec:
    return bench.make_spec(WorkloadConfig(workload=workload, device="cpu"), candidates=["math", "decomposed"],
                           baseline="math", seq_lens=[32, 48], delta=0.01, max_time_s=0.2, out_dir=out_dir)


def test_06_spec_times_the_programs_most_frequent_timeable_call(logs):
    spec = _spec(logs["sdpa"])
    assert spec.call == AttentionCall(2, 4, 24, 16, "float32", "bool", 0, None, False, None, (2, 1, 24, 24))
    assert "3 of 11 SDPA calls" in spec.source and "(4 calls) is not timed: grouped-query" in spec.source
    assert [r["calls"] for r in spec.recorded] == [4, 3, 2, 1, 1]
    assert child.spec_from_dict(json.loads(json.dumps(child.asdict(spec)))) == spec   # crosses to the child
    # the sweep stretches the recorded mask with the queries (self-attention: the keys too)
    assert [(c.seq_len, c.keys, c.mask_shape) for c in spec.sweep_calls()] == [
        (32, 32, (2, 1, 32, 32)), (48, 48, (2, 1, 48, 48))]
    # the note renders as the reader should see it (an apostrophe is not an entity in the report)
    from nbconvert.filters.markdown_mistune import markdown2html_mistune
    assert "the program's most frequent attention call" in markdown2html_mistune(bench.spec_note(spec))


def test_cross_attention_sweep_keeps_the_keys():
    call = AttentionCall(1, 2, 24, 16, "float32", "additive", 0, None, False, 40, (24, 40))
    at = child.at_length(call, 64)
    assert (at.seq_len, at.keys, at.mask_shape) == (64, 40, (64, 40))
    assert at.inputs("cpu")[3].shape == (64, 40)


def test_06_on_a_program_without_attention_times_nothing_and_says_why(logs, tmp_path):
    spec = _spec(logs["none"], f"script:{NO_ATTENTION}")
    assert spec.call is None and not spec.applies
    assert spec.reason.startswith("the program ran to the end without calling scaled_dot_product_attention")
    run = bench.run(spec, tmp_path)   # no child is started
    assert run.status == "not_applicable" and run.elapsed_s == 0.0
    head, metrics = bench.finding(run)
    assert head == f"nothing benchmarked for workload=script:{NO_ATTENTION}: {spec.reason}"
    assert metrics["applies"] is False and metrics["reason"] == spec.reason and metrics["champion"] is None
    assert bench.finding_text(run) == f"**Nothing was benchmarked:** {esc(spec.reason)}."
    assert all(str(f(run.result)) == "" for f in (view.candidates_table, view.decision_table, view.sweep_table,
                                                  view.latency_figure, view.sweep_figure, view.workload_note))


def test_06_when_the_recording_ended_early_or_is_missing(logs, tmp_path):
    spec = _spec(logs["crash"], "script:crash_before.py")
    assert spec.call is None
    assert spec.reason.startswith("unknown whether the program calls attention: the recording ended after ")
    assert "(the program exited 3)" in spec.reason
    missing = _spec(tmp_path)
    assert missing.call is None and "left no op log (ops.log)" in missing.reason


def test_06_built_in_workload_is_unchanged(tmp_path):
    cfg = WorkloadConfig(device="cpu")
    spec = bench.make_spec(cfg, candidates=["math"], baseline="math", seq_lens=[], delta=0.01, max_time_s=0.2,
                           out_dir=tmp_path)
    assert spec.call == cfg.attention("cpu") and spec.source == "" and spec.recorded == () and spec.applies


def test_05_scope_follows_the_recording(logs, tmp_path):
    used = oracle.scope_for(f"script:{SDPA_SCRIPT}", "auto", "cpu", logs["sdpa"])
    assert used.applies and used.dtypes == ("float32", "bfloat16") and not used.caveat   # the program's dtypes
    assert oracle.scope_for(f"script:{SDPA_SCRIPT}", "float16", "cpu", logs["sdpa"]).dtypes == ("float16",)
    failed = oracle.scope_for("script:crash_before.py", "auto", "cpu", logs["crash"])
    assert not failed.applies and "the program failed before any attention call" in failed.note
    unknown = oracle.scope_for("script:crash_before.py", "auto", "cpu", tmp_path)   # 02 left no op log
    assert unknown.applies and unknown.dtypes == ("float32",) and "unknown whether" in unknown.caveat
    none = oracle.scope_for(f"script:{NO_ATTENTION}", "auto", "cpu", logs["none"])
    assert not none.applies and none.note.startswith(f"05 does not apply to workload=script:{NO_ATTENTION}: the "
                                                     f"program ran to the end without calling")
    (tmp_path / oracle.GATE_FILE).write_text("{}")   # a stale gate (another workload's) must not gate 06
    gate = oracle.gate(["math"], "quick", "cpu", out_dir=tmp_path, scope=none)
    assert not gate.applies and gate.reports == {} and not (tmp_path / oracle.GATE_FILE).exists()
    head, metrics = oracle.finding(gate)
    assert head == none.note and metrics["applies"] is False and metrics["reason"] == none.note
    assert oracle.scope_for("builtin", "auto", "cpu", tmp_path) == oracle.Scope(True, ("float32",))
    on_gpu = oracle.scope_for("builtin", "auto", "cuda", tmp_path)   # the dtype the built-in workload runs in
    assert on_gpu.dtypes == ("bfloat16",) and "bfloat16, float16" in on_gpu.note
    assert oracle.scope_for("builtin", "float16", "cuda", tmp_path) == oracle.Scope(True, ("float16",))


# ---------------------------------------------------------------------------------------- the chain


def _chain(tmp: Path, script: Path, only: list[str]) -> subprocess.Popen:
    args = [sys.executable, "-m", "gpulab", "run", "--params", "params/smoke.yaml", "--out", str(tmp),
            "-p", f"workload=script:{script}", "-p", "overhead_repeats=1", "-p", "candidates=[math, decomposed]",
            "-p", "seq_lens=[32]"]
    for nb in only:
        args += ["--only", nb]
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "lib")})


@pytest.fixture(scope="module")
def chains(tmp_path_factory) -> dict[str, tuple[int, dict, str, Path]]:
    """The chain on the attention program (02, 06) and on the one without (02, 05, 06), side by side: (exit
    code, run.json, index.html, the scenario's folder)."""
    tmp = tmp_path_factory.mktemp("chains")
    procs = {"sdpa": _chain(tmp / "sdpa", SDPA_SCRIPT, ["02", "06"]),
             "none": _chain(tmp / "none", NO_ATTENTION, ["02", "05", "06"])}
    out = {}
    for name, p in procs.items():
        stdout, stderr = p.communicate(timeout=300)
        index = Path(stdout.strip().splitlines()[-1]) if stdout.strip() else None
        assert index is not None, stderr[-3000:]
        out[name] = (p.returncode, json.loads((index.parent / "run.json").read_text()), index.read_text(),
                     index.parent / "baseline")
    return out


def test_chain_benchmarks_the_programs_recorded_call(chains):
    rc, run, _, _ = chains["sdpa"]
    assert rc == 0 and run["status"] == "ok"
    sc = run["scenarios"][0]
    assert [nb["status"] for nb in sc["notebooks"]] == ["ok", "ok"]
    m = sc["metrics"]["06_benchmark"]["metrics"]
    assert m["applies"] is True and m["call"] == "B=2 H=4 S=24 D=16 float32, boolean mask of shape 2x1x24x24"
    assert "most frequent attention call as notebook 02 recorded it (3 of 11" in m["call_source"]
    assert set(m["candidates"]) == {"decomposed"} and m["champion"] in ("sdpa_math", "decomposed")
    assert sc["metrics"]["06_benchmark"]["headline"].startswith("champion on the program's most frequent")


def test_chain_says_05_and_06_do_not_apply_to_a_program_without_attention(chains):
    rc, run, html, _ = chains["none"]
    assert rc == 0 and run["status"] == "ok"   # not applying is not a failure
    sc = run["scenarios"][0]
    assert [nb["status"] for nb in sc["notebooks"]] == ["ok", "ok", "ok"]
    why = "the program ran to the end without calling scaled_dot_product_attention"
    for nb in ("05_oracle", "06_benchmark"):
        entry = sc["metrics"][nb]
        assert entry["metrics"]["applies"] is False and entry["metrics"]["reason"].split(" (")[0].endswith(why)
    assert sc["metrics"]["05_oracle"]["headline"].startswith("05 does not apply to workload=script:")
    assert sc["metrics"]["06_benchmark"]["headline"].startswith("nothing benchmarked for workload=script:")
    assert html.count(">does not apply</span>") == 2 and why in html   # the index shows the badge and why
    assert sc["verdict"] == "healthy"


# ------------------------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_recorded_cuda_calls_and_06_times_the_most_frequent(tmp_path):
    """The fused CUDA kernels' records give causality (flash and efficient put is_causal at different
    positions); 06 times the program's causal bf16 call with every backend, flash refusing nothing."""
    _record(FIXTURES / "sdpa_cuda.py", tmp_path)
    calls = _calls(tmp_path)
    assert [(c.count, c.describe(), c.causal) for c in calls] == [
        (6, "B=2 H=8 S=256 D=64 bfloat16, no mask, causal", True),
        (2, "B=2 H=8 S=256 D=64 bfloat16, bool mask 2x1x256x256", False)]
    assert "efficient" in calls[0].kernels and len(calls[0].kernels) >= 2 and "flash" not in calls[1].kernels
    spec = bench.make_spec(WorkloadConfig(workload="script:sdpa_cuda.py", device="cuda"),
                           candidates=["math", "flash", "efficient", "cudnn"], baseline="math", seq_lens=[512],
                           delta=0.01, max_time_s=0.3, out_dir=tmp_path)
    assert spec.call == AttentionCall(2, 8, 256, 64, "bfloat16", "none", 0, None, True)
    run = bench.run(spec, tmp_path)
    assert run.status == "ok", run.detail
    assert {"sdpa_flash", "sdpa_efficient"} <= set(run.result["vs_baseline"]) and not run.result["unsupported"]
    assert [r["seq_len"] for r in run.result["sweep"]][:1] == [512] and not any("error" in r
                                                                                   for r in run.result["sweep"])
