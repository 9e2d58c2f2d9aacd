"""The attention oracle: the rule on synthetic tensors, planted bugs caught and named, correct kernels pass."""
from __future__ import annotations

import os
import textwrap

import numpy as np
import pytest
import torch

from gpulab import oracle, proc
from gpulab.oracle import candidates

CORRECT = ["sdpa", "sdpa_math", "sdpa_flash", "decomposed", "tiled", "upcast_fp32"]
PLANTED = candidates.planted()


# ------------------------------------------------------------------------------------------ the rule

def _gold_and_base(n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    gold = torch.randn(n, generator=g, dtype=torch.float64)
    base = gold + 1e-3 * torch.randn(n, generator=g, dtype=torch.float64)
    return gold, base


@pytest.mark.parametrize("factor,passed", [(0.0, True), (1.0, True), (1.9, True), (2.5, False), (10.0, False)])
def test_rule_ratio_threshold(factor, passed):
    gold, base = _gold_and_base()
    e_base = float((base - gold).abs().max())
    out = gold.clone()
    out[7] += factor * e_base
    r = oracle.rule(out, gold, [base], torch.float32)
    assert r.passed is passed
    assert r.ratio == pytest.approx(factor, rel=1e-6)
    assert r.ref_error == pytest.approx(e_base)


def test_rule_takes_the_largest_baseline_error():
    gold, base = _gold_and_base()
    worse = gold + 3 * (base - gold)
    r = oracle.rule(base, gold, [base, worse], torch.float32)
    assert r.ref_error == pytest.approx(float((worse - gold).abs().max())) and r.passed


@pytest.mark.parametrize("dtype,ulp", [(torch.bfloat16, 2 ** -7), (torch.float16, 2 ** -10)])
def test_rule_atol_is_rounding_at_gold_plus_0p3(dtype, ulp):
    gold = torch.linspace(0.0, 1.0, 1001, dtype=torch.float64)  # gold + 0.3 <= 1.3: rounding step <= ulp
    r = oracle.rule(gold, gold, [gold], dtype)
    assert 0 < r.atol <= 2 * ulp
    out = gold + 0.9 * r.atol  # zero baseline error: only the atol term allows this
    assert oracle.rule(out, gold, [gold], dtype).passed
    assert not oracle.rule(gold + 1.1 * r.atol, gold, [gold], dtype).passed


def test_rule_bar_is_shared_by_a_case_candidates_and_never_stale():
    """The baselines' error is computed once per case for all its candidates; a tensor changed in place, or a
    new one at a reused address, is measured again, and no case's tensors are kept alive."""
    import gc
    import weakref

    gold, base = _gold_and_base()
    first = oracle.rule(base, gold, [base], torch.float32)
    assert oracle.rule(gold, gold, [base], torch.float32).ref_error == first.ref_error
    base.mul_(1.0).add_(gold - base, alpha=0.5)   # in place: the baseline error halves
    assert oracle.rule(gold, gold, [base], torch.float32).ref_error == pytest.approx(first.ref_error / 2)
    gone = weakref.ref(gold)
    del gold, base
    gc.collect()
    assert gone() is None
    for seed in range(1, 6):                      # fresh tensors, maybe at the old addresses
        g2, b2 = _gold_and_base(seed=seed)
        assert oracle.rule(g2, g2, [b2], torch.float32).ref_error == float((b2 - g2).abs().max())
    with torch.inference_mode():                  # no version counter: judged, never cached
        g3, b3 = _gold_and_base(seed=7)
    assert oracle.rule(g3, g3, [b3], torch.float32).ref_error == float((b3 - g3).abs().max())


def test_rule_nonfinite_where_gold_finite_fails_and_where_gold_nan_is_excluded():
    gold, base = _gold_and_base()
    out = base.clone()
    out[3] = float("nan")
    out[9] = float("inf")
    r = oracle.rule(out, gold, [base], torch.float32)
    assert not r.passed and r.nonfinite == 2
    gold2 = gold.clone()
    gold2[3] = float("nan")
    gold2[9] = float("nan")
    r2 = oracle.rule(out, gold2, [base], torch.float32)
    assert r2.passed and r2.nonfinite == 0 and r2.excluded == 2


def test_fully_masked_rows_are_excluded_from_gold():
    q, k, v = (torch.randn(1, 1, 4, 8, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    mask[..., 2, :] = False
    gold = oracle.reference(q, k, v, mask)["out"]
    assert torch.isnan(gold[..., 2, :]).all() and torch.isfinite(gold[..., [0, 1, 3], :]).all()
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # NaN (or 0) in row 2
    r = oracle.rule(out, gold, [gold], torch.float32)
    assert r.passed and r.excluded == 8


# ------------------------------------------------------------------------------------------ analysis

def test_tile_heatmap_and_findings_on_synthetic_errors():
    err = np.zeros((2, 3, 97, 8))
    err[:, 1, 70:, :] = 1.0  # head 1, rows of the last partial 64-tile
    hm = oracle.tile_heatmap(err, allowed=0.1, tile=64)
    assert hm.shape == (6, 2)
    assert hm[1, 1] == pytest.approx(10) and hm[4, 1] == pytest.approx(10) and hm[:, 0].max() == 0
    codes = {f.code for f in oracle.spatial_findings(err, np.isinf(err), 0.1, 64)}
    assert {"heads", "last_partial_tile"} <= codes and "scattered" not in codes
    err2 = np.zeros((1, 2, 10, 4))
    err2[0, 0, 3, :] = np.inf
    fs = oracle.spatial_findings(err2, np.isinf(err2), 0.1, 64)
    assert fs[0].code == "nan_rows" and "1 of 20 rows" in fs[0].text


def test_across_cases_names_large_magnitude():
    cases = oracle.case_set("quick")
    failed = [c for c in cases if c.dist == "large"]
    passed = [c for c in cases if c.dist != "large"]
    codes = [f.code for f in oracle.across_cases(failed, passed, 64)]
    assert "large_magnitude" in codes
    assert oracle.across_cases(failed[:1], passed, 64) == []  # one failing case proves nothing


def test_worst_elements_orders_by_error():
    err = np.zeros((1, 1, 4, 2))
    err[0, 0, 2, 1], err[0, 0, 0, 0] = 5.0, np.inf
    rows = oracle.worst_elements(err, np.ones_like(err), np.zeros_like(err), 2)
    assert rows[0]["index"] == (0, 0, 0, 0) and rows[1]["index"] == (0, 0, 2, 1)


# ------------------------------------------------------------------------------------------ candidates

@pytest.mark.parametrize("name", CORRECT)
def test_correct_candidates_pass_quick(name):
    rep = oracle.check(name, "quick", "cpu", progress=False)
    assert rep.passed, rep.summary()["reason"]
    assert rep.worst_ratio <= 2.0


def test_fused_cpu_kernel_passes_whole_default_set():
    """No false alarm on the full default set (the one long test: ~30 s on 2 cores)."""
    rep = oracle.check("sdpa_flash", "default", "cpu", progress=False)
    t = rep.table
    assert len(t) == len(oracle.case_set("default")) >= 100
    assert rep.passed, t[~t.passed].to_string()
    assert (t.nonfinite == 0).all() and (t.status == "pass").all()


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_bug_fails_with_its_pattern_named(name):
    p = PLANTED[name]
    rep = oracle.check(p.candidate, "quick", "cpu", progress=False)
    assert not rep.passed, f"{name} ({p.description}) was not caught"
    assert p.expected in rep.patterns, f"{name}: expected {p.expected}, got {rep.patterns}: {rep.explanation()}"
    assert all(f.worst and f.heatmap is not None for f in rep.failures)
    assert 1 <= sum(f.tensors is not None for f in rep.failures) <= 3  # the worst cases keep their tensors


def test_no_max_subtraction_gives_nan_rows_only_for_large_inputs():
    rep = oracle.check(PLANTED["bug_no_max_subtraction"].candidate, "quick", "cpu", progress=False)
    assert {"nan_rows", "large_magnitude"} <= set(rep.patterns)
    assert all(r.case.dist == "large" for r in rep.failures)
    assert all(r.rule.nonfinite > 0 for r in rep.failures)


def test_intermediate_failure_is_reported_when_output_is_right():
    def good(q, k, v, attn_mask=None, is_causal=False, scale=None):
        return candidates.decomposed(q, k, v, attn_mask, is_causal, scale)

    def bad_p(q, k, v, attn_mask=None, is_causal=False, scale=None):
        got = candidates.tiled_intermediates(q, k, v, attn_mask, is_causal, scale)
        got["P"] = got["P"] * 1.01
        return got
    good.intermediates = bad_p
    rep = oracle.check(good, [oracle.Case(64, 64, 32)], "cpu", progress=False)
    assert not rep.passed and "intermediate" in rep.patterns
    assert dict(rep.failures[0].intermediates)["P"].passed is False
    assert dict(rep.failures[0].intermediates)["S"].passed is True


# ------------------------------------------------------------------------------------------ bad input

CASE = [oracle.Case(16, 16, 8)]


def test_wrong_signature_names_the_candidate():
    def two_args(q, k):
        return q
    with pytest.raises(oracle.CandidateError, match="'two_args'.*signature"):
        oracle.check(two_args, CASE, "cpu", progress=False)


@pytest.mark.parametrize("ret,match", [("tuple", "returned tuple"), ("shape", "shape"), ("numpy", "returned ndarray")])
def test_bad_return_names_candidate_and_case(ret, match):
    def cand(q, k, v, attn_mask=None, is_causal=False, scale=None):
        out = candidates.decomposed(q, k, v, attn_mask, is_causal, scale)
        return {"tuple": (out, None), "shape": out[..., :-1], "numpy": out.numpy()}[ret]
    with pytest.raises(oracle.CandidateError, match=match) as exc:
        oracle.check(cand, CASE, "cpu", progress=False)
    assert "'cand'" in str(exc.value) and CASE[0].name in str(exc.value)


def test_candidate_type_error_names_case():
    def cand(q, k, v, attn_mask=None, is_causal=False, scale=None):
        return q + "x"
    with pytest.raises(oracle.CandidateError, match=f"'cand' raised TypeError on case {CASE[0].name}"):
        oracle.check(cand, CASE, "cpu", progress=False)


def test_runtime_error_is_unsupported_and_all_unsupported_does_not_pass():
    def refuses(q, k, v, attn_mask=None, is_causal=False, scale=None):
        raise RuntimeError("No available kernel. Aborting execution.")
    rep = oracle.check(refuses, CASE, "cpu", progress=False)
    assert not rep.passed and rep.results[0].status == "unsupported"
    assert "no case supported" in rep.summary()["reason"]


@pytest.mark.parametrize("kwargs,match", [({"mask": "lower"}, "mask='lower'.*none, bool, additive"),
                                          ({"dist": "cauchy"}, "dist='cauchy'"),
                                          ({"causal": True, "mask": "bool"}, "forbids"),
                                          ({"heads": 4, "kv_heads": 3}, "kv_heads=3")])
def test_bad_case_is_rejected(kwargs, match):
    with pytest.raises(oracle.OracleError, match=match):
        oracle.Case(8, 8, 8, **kwargs)


@pytest.mark.parametrize("cases,device,chosen", [("auto", "cpu", "quick"), ("auto", "cuda", "default"),
                                                  ("auto", "cuda:1", "default"), ("default", "cpu", "default"),
                                                  ("quick", "cuda", "quick")])
def test_auto_case_set_is_the_full_one_on_a_gpu_only(cases, device, chosen):
    from gpulab.oracle.sets import for_device
    assert for_device(cases, device) == chosen


def test_auto_case_set_gate_on_the_cpu_judges_the_quick_set():
    g = oracle.gate(["sdpa_math"], "auto", "cpu", isolate=False)
    assert g.cases == "quick" and "quick cases" in g.headline()
    with pytest.raises(oracle.OracleError, match="oracle_cases='all'.*auto, default, quick"):
        oracle.gate(["sdpa_math"], "all", "cpu", isolate=False)


@pytest.mark.parametrize("call,match", [(lambda: oracle.case_set("huge"), "cases='huge'.*default, quick"),
                                        (lambda: oracle.resolve_dtypes(["float8"], "cpu"), "float8"),
                                        (lambda: oracle.check("sdpa_math", CASE, "cpu", tile=0), "tile=0")])
def test_bad_arguments_name_value_and_choices(call, match):
    with pytest.raises(oracle.OracleError, match=match):
        call()


def test_dtype_defaults():
    assert oracle.resolve_dtypes(None, "cpu") == (torch.float32,)
    assert oracle.resolve_dtypes(None, "cuda") == (torch.bfloat16, torch.float16)


@pytest.mark.parametrize("given,expected", [("bf16", (torch.bfloat16,)), (torch.float16, (torch.float16,)),
                                            (["fp32", "float32", "half"], (torch.float32, torch.float16)),
                                            ("auto", (torch.float32,))])
def test_dtypes_take_the_workload_vocabulary(given, expected):
    assert oracle.resolve_dtypes(given, "cpu") == expected


# ------------------------------------------------------------------------------------------ products, isolation

def test_save_table_and_worst_tensors(tmp_path):
    rep = oracle.check(PLANTED["bug_dropped_tail_tile"].candidate, "quick", "cpu", progress=False)
    paths = rep.save(tmp_path)
    assert (tmp_path / "bug_dropped_tail_tile_table.csv").exists()
    npys = [p for p in paths if p.suffix == ".npy"]
    assert npys and any(p.name == "gold.npy" for p in npys)
    q = np.load([p for p in npys if p.name == "q.npy"][0])
    assert q.ndim == 4


def test_plots_draw(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    rep = oracle.check(PLANTED["bug_no_max_subtraction"].candidate, "quick", "cpu", progress=False)
    for ax in (rep.plot_heatmap(), rep.plot_nan_map(), rep.plot_ratios(), rep.plot_p_heatmap()):
        assert ax.get_title()
    ok = oracle.check("sdpa_math", "quick", "cpu", progress=False)
    with pytest.raises(oracle.OracleError, match="no case with a heatmap"):
        ok.plot_heatmap()


def test_gate_in_process_writes_products_and_its_finding(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    g = oracle.gate(["math", "bug_mask_ignored"], "quick", "cpu", isolate=False, out_dir=tmp_path)
    headline, metrics = oracle.finding(g)
    assert headline.startswith("1 of 2 attention candidates fail") and "bug_mask_ignored" in headline
    assert metrics["failures"] == ["bug_mask_ignored"] and metrics["passed"] == 1
    assert {"oracle_gate.json", "oracle_table.csv"} <= {p.name for p in tmp_path.iterdir()}
    assert len(g.table) == 2 * len(oracle.case_set("quick")) and list(g.verdicts.index) == list(g.reports)  # indexed by candidate
    fig = oracle.view.failure_figure(g.failing[0])
    assert len(fig.axes) >= 3 and fig.axes[0].get_title()


def test_isolated_check_passes_and_a_hanging_candidate_is_killed(tmp_path, monkeypatch):
    rep = oracle.check_isolated("sdpa_math", "quick", "cpu", timeout_s=120)
    assert rep.passed and len(rep.results) == len(oracle.case_set("quick"))
    (tmp_path / "hangmod.py").write_text(textwrap.dedent("""
        import time
        def attn(q, k, v, attn_mask=None, is_causal=False, scale=None):
            time.sleep(600)
    """))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    rep = oracle.check_isolated("hangmod:attn", "quick", "cpu", timeout_s=8)
    assert not rep.passed and rep.error.startswith("hang")


# ------------------------------------------------------------------------------------------ the warm worker

BROKEN = {  # candidates that take their process down: a deadlock, an abort, a segmentation fault
    "deadlockmod": """
        import threading
        LOCK = threading.Lock()
        def attn(q, k, v, attn_mask=None, is_causal=False, scale=None):
            with LOCK:
                with LOCK:  # a non-reentrant lock taken twice: waits forever
                    pass
    """,
    "abortmod": """
        import os
        def attn(q, k, v, attn_mask=None, is_causal=False, scale=None):
            os.abort()
    """,
    "segvmod": """
        import ctypes
        def attn(q, k, v, attn_mask=None, is_causal=False, scale=None):
            ctypes.string_at(0)
    """,
}


# a candidate's deadline in the worker tests: a judged candidate takes ~1-3 s there (a fresh worker's start
# included), so the deadlocked one is the only one that reaches it
HANG_S = 10


@pytest.fixture
def broken(tmp_path, monkeypatch):
    """Import path for the BROKEN candidates, and a marker every child inherits (procscan finds leftovers)."""
    from procscan import new_marker
    for mod, code in BROKEN.items():
        (tmp_path / f"{mod}.py").write_text(textwrap.dedent(code))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    name, value = new_marker()
    monkeypatch.setenv(name, value)
    return name, value


def test_warm_worker_loses_workers_to_a_deadlock_an_abort_and_a_segfault_and_judges_the_rest(broken):
    from procscan import left_after
    from gpulab.pool import Pool
    specs = ["deadlockmod:attn", "sdpa_math", "abortmod:attn", "segvmod:attn", "tiled"]
    with Pool(init=("gpulab.fixes:install_from_env",), label="oracle") as pool:
        reps = oracle.isolated(specs, "quick", "cpu", timeout_s=HANG_S, pool=pool)
        assert pool.started == 4  # the first worker, then a fresh one after each lost one
    assert reps["deadlockmod:attn"].error == f"hang: no result within {HANG_S}s (child process group killed)"
    assert reps["abortmod:attn"].error.startswith("crash (signal 6)") and "abortmod.py" in reps["abortmod:attn"].error
    assert reps["segvmod:attn"].error.startswith("crash (signal 11)") and "string_at" in reps["segvmod:attn"].error
    assert all(not reps[s].passed and not reps[s].results for s in specs if "mod:" in s)
    quick = len(oracle.case_set("quick"))
    same = oracle.check_many(["sdpa_math", "tiled"], "quick", "cpu", progress=False)
    for name in ("sdpa_math", "tiled"):  # judged on every case, exactly as in one process
        assert reps[name].passed and len(reps[name].results) == quick
        assert reps[name].rows() == same[name].rows() and reps[name].findings == same[name].findings
    assert left_after(*broken, exclude=(proc.guard_pid() or 0,)) == []


def test_pool_replaces_a_hung_worker_and_stops_its_whole_tree(broken):
    from procscan import left_after
    from gpulab.pool import Pool
    with Pool(label="test") as pool:
        first = pool.run("os:getpid", timeout_s=60)
        assert first.ok and first.fresh and pool.run("os:getpid", timeout_s=60).value == first.value  # warm
        assert pool.run("os:system", ("sleep 300 &",), timeout_s=60).ok  # a daemon of the worker
        hung = pool.run("time:sleep", (300,), timeout_s=2)
        assert hung.status == "hang" and not proc.alive(first.value)
        err = pool.run("math:sqrt", (-1.0,), timeout_s=60)  # an exception ends the worker, as a one-shot child
        assert err.status == "error" and err.detail.startswith("error (exit 1)") and "math domain error" in err.detail
        again = pool.run("os:getpid", timeout_s=60)
        assert again.ok and again.fresh and again.value != first.value and pool.started == 3
    assert left_after(*broken, exclude=(proc.guard_pid() or 0,)) == []  # the sleep too


def test_a_jobs_deadline_counts_from_its_start_not_the_workers_start_up(tmp_path, monkeypatch):
    """A fresh worker loads the job's module (torch, for the oracle) before the job runs: on a loaded machine that
    took longer than a candidate's 10 s, and a healthy sdpa_math was called a hang. A module that takes 3 s to
    load meets a 1 s deadline; a job that sleeps past it does not."""
    from gpulab.pool import Pool
    (tmp_path / "slowmod.py").write_text("import time\ntime.sleep(3)\n\ndef ready():\n    return 7\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    with Pool(label="test") as pool:
        got = pool.run("slowmod:ready", timeout_s=1)
        assert got.ok and got.value == 7 and got.seconds >= 3, got
        hung = pool.run("time:sleep", (30,), timeout_s=1)
        assert hung.status == "hang" and hung.detail == "hang: no result within 1s (child process group killed)"


def test_gate_results_in_the_warm_worker_equal_the_in_process_check(tmp_path, monkeypatch):
    """Bit for bit at one thread count: a CPU kernel's sums split by thread, so the workers' share of a 16-core
    host's threads (4 each) and this process's 16 round float32 differently (the H200 host, in its last bit)."""
    import torch
    cands = ["math", "tiled", "bug_mask_ignored", "bug_no_max_subtraction"]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")   # the user's setting: the workers keep it
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        iso = oracle.gate(cands, "quick", "cpu", out_dir=tmp_path / "iso")
        inp = oracle.gate(cands, "quick", "cpu", out_dir=tmp_path / "inp", isolate=False)
    finally:
        torch.set_num_threads(threads)
    drop = lambda d: {n: {k: v for k, v in s.items() if k != "wall_s"} for n, s in d.items()}  # noqa: E731
    assert drop(iso.gate_json()) == drop(inp.gate_json())
    assert {k: v for k, v in iso.metrics().items() if k != "wall_s"} == \
        {k: v for k, v in inp.metrics().items() if k != "wall_s"}
    assert (tmp_path / "iso" / "oracle_table.csv").read_text() == (tmp_path / "inp" / "oracle_table.csv").read_text()
    for a, b in zip(sorted((tmp_path / "iso").rglob("*.npy")), sorted((tmp_path / "inp").rglob("*.npy"))):
        assert a.relative_to(tmp_path / "iso") == b.relative_to(tmp_path / "inp")
        np.testing.assert_array_equal(np.load(a), np.load(b))


# ------------------------------------------------------------------------------------------ notebook, GPU

def test_notebook_05_writes_gate_metrics_and_tensors(tmp_path, root):
    """The notebook end to end on quick cases, with one planted bug so the failure views run too."""
    import papermill
    out = tmp_path / "out"
    papermill.execute_notebook(
        str(root / "notebooks" / "05_oracle.ipynb"), str(tmp_path / "05.ipynb"), kernel_name="python3",
        cwd=str(root), progress_bar=False, execution_timeout=300,
        parameters={"out_dir": str(out), "device": "cpu", "oracle_cases": "quick",
                    "candidates": ["math", "flash", "cudnn", "tiled", "bug_gqa_head_map"]})
    gate = __import__("json").loads((out / "oracle_gate.json").read_text())
    assert set(gate) == {"sdpa_math", "sdpa_flash", "tiled", "bug_gqa_head_map"}  # cudnn: skipped on the CPU
    assert gate["sdpa_math"]["passed"] and not gate["bug_gqa_head_map"]["passed"]
    assert "heads" in gate["bug_gqa_head_map"]["patterns"]
    m = __import__("gpulab").report.load_metrics(out)["05_oracle"]
    assert m["metrics"]["candidates_checked"] == 4 and m["metrics"]["passed"] == 3
    assert m["metrics"]["failures"] == ["bug_gqa_head_map"] and "1 of 4" in m["headline"]
    assert (out / "oracle_table.csv").exists() and list((out / "oracle_tensors").rglob("gold.npy"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_every_cuda_backend_passes_quick(dtype):
    vendor = [n for n, c in candidates.available("cuda").items() if c.kind == "vendor"]
    reps = oracle.check_many(vendor + ["tiled"], "quick", "cuda", [dtype], progress=False)
    bad = {n: r.summary()["reason"] for n, r in reps.items() if not r.passed}
    assert not bad, bad


@pytest.mark.gpu
def test_planted_bugs_caught_on_cuda():
    reps = oracle.check_many([p.candidate for p in PLANTED.values()], "quick", "cuda", ["bfloat16"], progress=False)
    for name, p in PLANTED.items():
        assert not reps[name].passed and p.expected in reps[name].patterns, (name, reps[name].patterns)


def test_gpu_fault_message_is_an_error_not_unsupported():
    def faults(q, k, v, attn_mask=None, is_causal=False, scale=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(oracle.CandidateError, match=f"'faults' faulted on case {CASE[0].name}"):
        oracle.check(faults, CASE, "cpu", progress=False)


# ------------------------------------------------------------------------------------------ workers side by side

PIDMOD = """
    import os
    from gpulab.oracle import candidates
    def attn(q, k, v, attn_mask=None, is_causal=False, scale=None):
        with open(os.environ["PIDMOD_FILE"], "a") as fh:  # which worker judged this case
            fh.write(f"{os.getpid()}\\n")
        return candidates.decomposed(q, k, v, attn_mask, is_causal, scale)
"""


def _verdicts(reps: dict) -> dict:
    """Per candidate, per case: what is judged (status, rule results) and which cases keep tensors."""
    return {n: [(r.case, r.dtype, r.status, r.rule, r.intermediates, r.tensors is not None) for r in rep.results]
            for n, rep in reps.items()}


def test_workers_side_by_side_judge_as_one_worker(broken, tmp_path, monkeypatch):
    from procscan import left_after
    (tmp_path / "pidmod.py").write_text(textwrap.dedent(PIDMOD))
    specs = ["sdpa_math", "pidmod:attn", "bug_mask_ignored"]
    reps, pids = {}, {}
    for w in (1, 2):
        monkeypatch.setenv("PIDMOD_FILE", str(tmp_path / f"pids-{w}"))
        reps[w] = oracle.isolated(specs, "quick", "cpu", timeout_s=120, explain_budget=1, workers=w, progress=False)
        pids[w] = set((tmp_path / f"pids-{w}").read_text().split())
    assert len(pids[1]) == 1 and len(pids[2]) == 2  # one worker, then two side by side
    assert _verdicts(reps[2]) == _verdicts(reps[1])
    quick = len(oracle.case_set("quick"))
    assert all(len(r.results) == quick and not r.error for r in reps[2].values())
    assert reps[2]["sdpa_math"].passed and reps[2]["pidmod:attn"].passed
    bug = {w: reps[w]["bug_mask_ignored"] for w in (1, 2)}
    assert len(bug[1].failures) >= 2  # more failures than the explain budget of 1
    named = {w: sum("mask_ignored" in {f.code for f in r.findings} for r in bug[w].failures) for w in (1, 2)}
    assert named[1] == 1 and named[2] <= 1  # one explain budget per candidate, shared by the workers
    assert left_after(*broken, exclude=(proc.guard_pid() or 0,)) == []


def test_workers_side_by_side_lose_a_hung_and_a_crashed_worker_and_judge_the_rest(broken):
    from procscan import left_after
    specs = ["deadlockmod:attn", "sdpa_math", "abortmod:attn", "tiled"]
    reps = oracle.isolated(specs, "quick", "cpu", timeout_s=HANG_S, workers=2, progress=False)
    assert reps["deadlockmod:attn"].error == f"hang: no result within {HANG_S}s (child process group killed)"
    assert reps["abortmod:attn"].error.startswith("crash (signal 6)") and "abortmod.py" in reps["abortmod:attn"].error
    assert all(not reps[s].passed and not reps[s].results for s in specs if "mod:" in s)
    quick = len(oracle.case_set("quick"))
    same = oracle.check_many(["sdpa_math", "tiled"], "quick", "cpu", progress=False)
    for name in ("sdpa_math", "tiled"):  # judged on every case, in case order, exactly as in one process
        assert reps[name].passed and len(reps[name].results) == quick
        assert reps[name].rows() == same[name].rows() and reps[name].findings == same[name].findings
    assert left_after(*broken, exclude=(proc.guard_pid() or 0,)) == []


def test_an_interrupt_stops_every_worker_side_by_side(broken):
    import signal
    import threading
    import time
    from procscan import left_after
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")

    def interrupt(signum, frame):
        raise KeyboardInterrupt
    old = signal.signal(signal.SIGALRM, interrupt)
    t0 = time.monotonic()
    try:
        signal.setitimer(signal.ITIMER_REAL, 4.0)  # both workers starting, or hung in the deadlock
        with pytest.raises(KeyboardInterrupt):
            oracle.isolated(["deadlockmod:attn"], "quick", "cpu", timeout_s=300, workers=2, progress=False)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert time.monotonic() - t0 < 60  # not the deadline of the hung jobs
    assert left_after(*broken, exclude=(proc.guard_pid() or 0,)) == []


def test_isolated_rejects_a_bad_worker_count():
    with pytest.raises(oracle.OracleError, match="workers=-1"):
        oracle.isolated(["sdpa_math"], CASE, "cpu", workers=-1)


@pytest.mark.parametrize("cores,n_cases,workers,threads", [(1, 320, 1, 1), (2, 320, 2, 1), (3, 320, 3, 1),
                                                            (64, 320, 4, 16), (16, 2, 2, 8), (8, 0, 1, 8)])
def test_oracle_workers_on_the_cpu_share_the_cores(cores, n_cases, workers, threads):
    from gpulab.device import oracle_threads, oracle_workers
    assert oracle_workers("cpu", n_cases, cores=cores) == workers
    assert oracle_threads(workers, cores=cores) == threads


def test_cpu_oracle_workers_get_their_share_of_threads_unless_the_user_set_it(monkeypatch):
    from gpulab.oracle import pooled
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(pooled, "oracle_threads", lambda w: 4 // w)
    assert pooled._worker_env("cpu", 2)["OMP_NUM_THREADS"] == "2"
    assert pooled._worker_env("cpu", 1) is None and pooled._worker_env("cuda:0", 2) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert pooled._worker_env("cpu", 2) is None


@pytest.mark.parametrize("cores,n_cases,expected", [(16, 320, 6), (64, 320, 6), (8, 320, 4), (4, 320, 2),
                                                    (2, 320, 1), (1, 320, 1), (16, 2, 2), (16, 1, 1), (16, 0, 1)])
def test_oracle_workers_on_a_gpu(cores, n_cases, expected):
    from gpulab.device import oracle_workers
    assert oracle_workers("cuda", n_cases, cores=cores) == expected
    assert oracle_workers("cuda:1", n_cases, cores=cores) == expected
