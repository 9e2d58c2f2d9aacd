"""Notebook 04: the fix registry, composition, the verdict rules, and the matrix on real hangs in real children.

Each fixture deadlocks for real (a native mutex taken twice) in a way exactly one fix removes: a GEMM kernel
on a transposed operand (contiguous_gemm_inputs), a reduced-precision softmax kernel (fp32_softmax), a
start-up check of an environment variable (omp_single_thread). Stall windows are short; trials are few (a
torch program costs seconds to start here).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from gpulab import paramsets, proc, workloads
from gpulab.chain import runner
from gpulab.env import rules
from gpulab.fixes import commands, compose, cost, matrix, numerics, registry, scenarios, verdict
from gpulab.fixes.fix import Fix, FixError, UnknownFix, not_applicable
from gpulab.fixes.target import Target
from gpulab.hang import classify
from gpulab.hang.investigation import ladder
from gpulab.hang.watchdog import watch
from nbfactory import notebook, project

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
CPU = {"device": "cpu", "gpu": None, "cudnn": False, "torch": "2.13"}
CUDA = {"device": "cuda", "gpu": "cuda", "cudnn": True, "torch": "2.13"}
ROCM = {"device": "cuda", "gpu": "rocm", "cudnn": False, "torch": "2.13"}
REQUIRED = ("sync_gemm", "fp32_softmax", "contiguous_gemm_inputs", "alloc_async", "alloc_expandable",
            "alloc_no_caching", "module_loading_lazy", "module_loading_eager", "launch_blocking", "sdpa_backend_math",
            "sdpa_backend_flash", "sdpa_backend_efficient", "sdpa_backend_cudnn", "sdpa_math_off",
            "decomposed_attention", "memory_fraction_cap", "rocm_safe", "cpu_fallback")

PROBE = '''
import os
from gpulab.fixes.fix import Fix


def _apply():
    with open(os.environ["GPULAB_TEST_MARK"], "a") as fh:
        fh.write("applied\\n")
    if os.environ.get("GPULAB_TEST_EXIT"):
        os._exit(0)   # the entry point called us: nothing more to see


FIX = Fix("probe", "writes a marker file", targets=("unknown",), apply=_apply, env={"GPULAB_TEST_PROBE": "1"})
'''


@pytest.fixture
def extra_patches(tmp_path, monkeypatch):
    """Write fix modules to a folder of $GPULAB_PATCHES (the children inherit it)."""
    folder = tmp_path / "patches"
    folder.mkdir()
    monkeypatch.setenv(registry.ENV_DIRS, str(folder))

    def write(**modules: str) -> Path:
        for name, text in modules.items():
            (folder / f"{name}.py").write_text(textwrap.dedent(text))
        registry._CACHE.clear()
        return folder
    yield write
    registry._CACHE.clear()


# ------------------------------------------------------------------------------------ the registry

def test_registry_has_every_fix_the_investigation_needs():
    assert set(REQUIRED) <= set(registry.names())


@pytest.mark.parametrize("name", registry.names())
def test_every_fix_declares_itself_and_has_its_scenario_file(name):
    fx = registry.get(name)
    assert fx.changes and fx.targets and (fx.env or fx.apply or fx.python or fx.params)
    assert fx.applies(CUDA if fx.needs else CPU) or fx.applies(ROCM), "a fix must apply somewhere"
    scen = yaml.safe_load((ROOT / "params" / "scenarios" / f"{name}.yaml").read_text())
    assert scen["fixes"] == [name] and scen["description"]
    assert {k: v for k, v in scen.items() if k not in paramsets.SCENARIO_KEYS} == dict(fx.params)


def test_every_fix_named_by_the_risk_rules_is_in_the_registry():
    named = {fx for r in rules.load_rules() for fx in r.fixes}
    assert named and named <= set(registry.names()), named - set(registry.names())


def test_a_risk_rule_naming_an_unknown_fix_is_refused():
    raw = {"id": "x", "title": "t", "signature": {"fact": "cpu_arch", "eq": "x"}, "risk": "r",
           "fixes": ["cuda_module_loading_lazy"], "source": "https://example.org/1"}
    with pytest.raises(rules.RuleError, match="module_loading_lazy"):
        rules.parse_rule(raw)


@pytest.mark.parametrize("names,msg", [(["no_such_fix"], "known fixes: alloc_async"),
                                       (["fp32_softmax", "fp32_softmax"], "more than once")])
def test_unknown_or_repeated_fix_is_an_error_naming_the_choices(names, msg):
    with pytest.raises(UnknownFix, match=msg):
        registry.resolve(names)


@pytest.mark.parametrize("kw,msg", [
    ({"targets": ("gemm", "bogus")}, "hang classes"),
    ({"targets": ("gemm",), "env": {}}, "changes nothing"),
    ({"targets": ("gemm",), "env": {"A": 1}}, "must be strings"),
    ({"targets": ("gemm",), "env": {"A": "1"}, "name": "Bad-Name"}, "snake_case"),
])
def test_a_fix_that_cannot_work_is_refused(kw, msg):
    kw = {"name": "x", "changes": "something", **kw}
    with pytest.raises(FixError, match=msg):
        Fix(**kw)


@pytest.mark.parametrize("name,text,msg", [
    ("mine", "X = 1\n", "must define FIX"),
    ("mine", "from gpulab.fixes.fix import Fix\nFIX = Fix('other', 'c', targets=('gemm',), env={'A': '1'})\n",
     "file's name"),
    ("fp32_softmax", "from gpulab.fixes.fix import Fix\nFIX = Fix('fp32_softmax', 'c', targets=('gemm',), "
     "env={'A': '1'})\n", "defined twice"),
])
def test_registry_refuses_a_bad_module(extra_patches, name, text, msg):
    extra_patches(**{name: text})
    with pytest.raises(FixError, match=msg):
        registry.load()


@pytest.mark.parametrize("name,facts,applies", [
    ("alloc_async", CPU, False), ("alloc_async", CUDA, True), ("alloc_async", ROCM, False),
    ("alloc_expandable", ROCM, True), ("sdpa_backend_cudnn", CPU, False), ("sdpa_backend_cudnn", CUDA, True),
    ("sdpa_backend_cudnn", {**CUDA, "cudnn": False}, False), ("sdpa_backend_efficient", CPU, False),
    ("sdpa_backend_math", CPU, True), ("sdpa_backend_flash", CPU, True), ("sdpa_backend_flash", CUDA, True),
    ("sdpa_backend_flash", {**CUDA, "sdpa_mask": True}, False), ("sdpa_backend_flash", {**CPU, "sdpa_mask": True}, True),
    ("sdpa_backend_flash", {**CUDA, "sdpa_mask": None}, True), ("rocm_safe", CUDA, False),
    ("rocm_safe", ROCM, True), ("cpu_fallback", CPU, False), ("cpu_fallback", CUDA, True),
    ("module_loading_eager", CPU, False), ("sync_gemm", CPU, False), ("contiguous_gemm_inputs", CPU, True),
    ("omp_single_thread", CPU, True),
])
def test_a_fix_that_means_nothing_here_is_not_applicable(name, facts, applies):
    assert registry.get(name).applies(facts) is applies
    assert (not_applicable([registry.get(name)], facts) is None) is applies


@pytest.mark.parametrize("params,masked", [({}, True), ({"text_tokens": 3}, False), ({"workload": "script:x.py"}, None),
                                           ({"workload": "m:f"}, None)])
def test_the_mask_fact_is_known_for_the_built_in_workload_only(params, masked):
    from gpulab.fixes.platform import workload_mask
    from gpulab.workloads import WorkloadConfig
    assert workload_mask(WorkloadConfig(**params)) is masked
    assert workload_mask(None) is None


def test_the_cpu_facts_are_torchs_own_without_importing_it(tmp_path):
    """04's kernel on the CPU only starts children: its facts come from torch's version file, and they are the
    ones the imported torch gives."""
    code = ("import sys, json; from gpulab.fixes import platform; "
            "print(json.dumps([platform.facts('cpu', True), 'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    facts, loaded = json.loads(out.stdout)
    assert facts == {"device": "cpu", "gpu": None, "cudnn": False, "torch": torch.__version__, "sdpa_mask": True}
    assert loaded is False


def test_not_applicable_names_the_first_fix_that_does_not_apply_and_what_it_needs():
    why = not_applicable(registry.resolve(["fp32_softmax", "sync_gemm", "alloc_async"]), CPU)
    assert why == f"sync_gemm needs {registry.get('sync_gemm').needs}"


@pytest.mark.parametrize("cls,expected", [("softmax", {"fp32_softmax", "sdpa_backend_math", "decomposed_attention"}),
                                          ("layout", {"contiguous_gemm_inputs"}),
                                          ("library_load", {"module_loading_lazy", "module_loading_eager"}),
                                          ("host_lock", {"omp_single_thread"}), (None, set())])
def test_fixes_targeting_a_class(cls, expected):
    got = set(registry.targeting(cls))
    assert expected <= got if cls else got == set()   # no class (a healthy run): no fix is pointed at
    assert got == {n for n in registry.names() if cls in registry.get(n).targets}


# ------------------------------------------------------------------------------------ composition

@pytest.mark.parametrize("names,env,params_", [
    (("alloc_async", "alloc_expandable"), {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync,expandable_segments:True"}, {}),
    (("omp_single_thread", "launch_blocking"), {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                                                "CUDA_LAUNCH_BLOCKING": "1", "HIP_LAUNCH_BLOCKING": "1"}, {}),
    (("cpu_fallback", "fp32_softmax"), {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}, {"device": "cpu"}),
    ((), {}, {}),
])
def test_fixes_compose(names, env, params_):
    c = compose.compose(registry.resolve(names))
    assert c.names == names and c.env == env and c.params == params_


def test_fixes_that_cannot_both_hold_are_refused(extra_patches):
    extra_patches(eager_too="from gpulab.fixes.fix import Fix\n"
                  "FIX = Fix('eager_too', 'c', targets=('library_load',), env={'CUDA_MODULE_LOADING': 'EAGER'}, "
                  "python='/opt/other/python')\n",
                  other_python="from gpulab.fixes.fix import Fix\n"
                  "FIX = Fix('other_python', 'c', targets=('unknown',), python='/opt/patched/python')\n")
    with pytest.raises(FixError, match="CUDA_MODULE_LOADING"):
        compose.compose(registry.resolve(["module_loading_lazy", "eager_too"]))
    with pytest.raises(FixError, match="two interpreters"):
        compose.compose(registry.resolve(["eager_too", "other_python"]))


@pytest.mark.parametrize("base", [{}, {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64", "KEEP": "x"}])
def test_scenario_env_adds_the_fixes_and_clean_env_takes_them_away(base):
    env = compose.scenario_env(["alloc_async", "omp_single_thread"], base)
    assert env["GPULAB_FIXES"] == "alloc_async,omp_single_thread" and env["OMP_NUM_THREADS"] == "1"
    assert "backend:cudaMallocAsync" in env["PYTORCH_CUDA_ALLOC_CONF"].split(",")
    assert compose.clean_env(env) == base
    again = compose.scenario_env(["launch_blocking"], env)    # a scenario's child with other fixes
    assert again["GPULAB_FIXES"] == "launch_blocking" and "OMP_NUM_THREADS" not in again
    assert compose.scenario_env([], env) == base


def test_launch_plan_puts_fixes_in_the_environment_not_on_the_command_line(tmp_path):
    script = tmp_path / "x.py"
    script.write_text("print(1)\n")
    fixes = ["omp_single_thread", "fp32_softmax"]   # composed by the caller: gpulab.hang knows no fixes
    plan = watch.launch_plan([sys.executable, str(script)], tmp_path, record=True, mode="ops", fault=None,
                             env=compose.scenario_env(fixes, {"A": "1"}), coredump=False, fixes=fixes)
    assert "--fix" not in plan.argv and plan.argv[1:3] == ("-m", "gpulab.trace")
    assert plan.env["GPULAB_FIXES"] == "omp_single_thread,fp32_softmax" and plan.env["OMP_NUM_THREADS"] == "1"
    other = watch.launch_plan([sys.executable, str(script)], tmp_path, record=True, mode="ops", fault=None,
                              env={workloads.PYTHON_ENV: "/opt/patched/bin/python"}, coredump=False)
    assert other.argv[0] == "/opt/patched/bin/python"


# ------------------------------------------------------------------------------------ verdicts

BASE_FAILS = verdict.Observed("baseline", (), True, 4, 4)
BASE_OK = verdict.Observed("baseline", (), True, 4, 0)


@pytest.mark.parametrize("obs,base,expected", [
    (verdict.Observed("a", ("a",), True, 4, 0, True, 0.05), BASE_FAILS, "fixes"),
    (verdict.Observed("a", ("a",), True, 4, 0, None, None), BASE_FAILS, "fixes"),       # plain command, no cost
    (verdict.Observed("a", ("a",), True, 4, 2, True, 0.05), BASE_FAILS, "partial"),
    (verdict.Observed("a", ("a",), True, 4, 4, True, 0.0), BASE_FAILS, "no_effect"),
    (verdict.Observed("a", ("a",), True, 4, 0, False, 0.05), BASE_FAILS, "breaks_numerics"),
    (verdict.Observed("a", ("a",), True, 4, 0, True, 0.35), BASE_FAILS, "too_slow"),
    (verdict.Observed("a", ("a",), True, 4, 2, True, 0.35), BASE_FAILS, "too_slow"),
    (verdict.Observed("a", ("a",), False), BASE_FAILS, "not_applicable"),
    (verdict.Observed("a", ("a",), True, 4, 0, True, 0.5), BASE_OK, "no_effect"),       # nothing to fix
    (verdict.Observed("a", ("a",), True, 4, 1, True, 0.0), BASE_OK, "no_effect"),
    (BASE_FAILS, BASE_FAILS, "baseline"),
    (verdict.Observed("a", ("a",)), BASE_FAILS, None),                                  # not run yet
])
def test_verdict_rules(obs, base, expected):
    got, why = verdict.judge(obs, base, max_overhead=0.2)
    assert got == expected and why


def test_a_fix_that_fails_where_the_baseline_passed_says_so():
    assert "FAILS where the baseline passed" in verdict.judge(verdict.Observed("a", ("a",), True, 4, 1), BASE_OK)[1]


def _recommend(*obs: verdict.Observed, untried=(), apply_lines=None):
    vs = [verdict.judge(o, obs[0], 0.2)[0] for o in obs]
    return verdict.recommend(obs, vs, stall_s=5, untried=untried, apply_lines=apply_lines)


def test_recommendation_is_the_cheapest_fix_with_unknown_cost_last():
    rec, why = _recommend(BASE_FAILS, verdict.Observed("dear", ("dear",), True, 4, 0, True, 0.15),
                          verdict.Observed("cheap", ("cheap",), True, 4, 0, True, 0.02),
                          verdict.Observed("unknown", ("unknown",), True, 4, 0, None, None))
    assert rec == "cheap" and "+2%" in why and "(0/4 failed, baseline 4/4)" in why
    rec, _ = _recommend(BASE_FAILS, verdict.Observed("unknown", ("unknown",), True, 4, 0, None, None),
                        verdict.Observed("b+c", ("b", "c"), True, 4, 0, True, 0.01))
    assert rec == "b+c"


@pytest.mark.parametrize("others,words", [
    ((), "nothing to fix"),
    ((verdict.Observed("p", ("p",), True, 4, 1, True, 0.0),), "lowers the failure rate"),
    ((verdict.Observed("s", ("s",), True, 4, 0, True, 0.9),), "costs too much"),
    ((verdict.Observed("n", ("n",), True, 4, 0, False, 0.0),), "changes the numbers"),
    ((verdict.Observed("x", ("x",), True, 4, 4, True, 0.0),), "nothing tried fixes it (1 fix scenario(s) ran); "
                                                               "not tried (time budget): fp32_softmax"),
])
def test_no_recommendation_says_what_to_try_next(others, words):
    base = BASE_OK if words == "nothing to fix" else BASE_FAILS
    rec, why = _recommend(base, *others, untried=("fp32_softmax",))
    assert rec is None and words in why


@pytest.mark.parametrize("cls,words,not_words", [
    (None, "take 03's evidence bundle upstream", "same collectives"),
    ("host_lock", "take 03's evidence bundle upstream", "same collectives"),
    ("collective_mismatch", "make every rank call the same collectives", "upstream"),
    ("worker_stuck", "the dataset's own code", "upstream"),
])
def test_where_no_fix_works_the_next_step_follows_the_class(cls, words, not_words):
    """04's own next step agrees with the index's (seen on two H100s: an NCCL rank skipping a collective, 04
    said 'take 03's evidence bundle upstream' while the index pointed at the program)."""
    failed = verdict.Observed("x", ("x",), True, 4, 4, True, 0.0)
    rec, why = verdict.recommend([BASE_FAILS, failed], [verdict.judge(o, BASE_FAILS, 0.2)[0] for o in
                                                        (BASE_FAILS, failed)], stall_s=5, untried=("a",),
                                 in_program=classify.program_cause(cls))
    assert rec is None and words in why and not_words not in why and "raise --budget" in why


def test_the_recommendation_says_how_to_apply_it_yourself():
    rec, why = _recommend(BASE_FAILS, verdict.Observed("eager", ("eager",), True, 4, 0, True, 0.05),
                          apply_lines={"eager": "export CUDA_MODULE_LOADING=EAGER"})
    assert rec == "eager" and "apply with: export CUDA_MODULE_LOADING=EAGER" in why and "+5% run time" in why


def test_with_no_cost_measurable_a_real_fix_comes_before_a_diagnostic_and_the_others_are_named():
    """Seen on a DataLoader whose workers inherit a lock held at fork: both num_workers=0 and spawn removed the
    hang, the baseline never finished a run (no cost), and the name's order made num_workers=0 the advice."""
    hangs = verdict.Observed("baseline", (), True, 3, 3)
    spawn = verdict.Observed("spawn", ("spawn",), True, 3, 0, None, None, 50.0)
    none = verdict.Observed("no_workers", ("no_workers",), True, 3, 0, None, None, 18.0)
    obs = (hangs, none, spawn)
    rec, why = verdict.recommend(obs, [verdict.judge(o, hangs, 0.2)[0] for o in obs], stall_s=5,
                                 means={"spawn": "the worker blocks on something it inherited at fork"},
                                 diagnostic={"no_workers": "loads the data in the training process"})
    assert rec == "spawn"
    assert why.startswith("spawn fixes it (0/3 failed, baseline 3/3) (cost not measured: the baseline never "
                          "finished a run to compare with): so the worker blocks on something it inherited at fork")
    assert "also fixes it: no_workers (0/3 failed; about 18 s a run against 50 s; it loads the data in the " \
           "training process)" in why
    rec, why = verdict.recommend(obs, [verdict.judge(o, hangs, 0.2)[0] for o in obs], stall_s=5)
    assert rec == "no_workers" and "also fixes it: spawn (0/3 failed; about 50 s a run against 18 s)" in why


def test_a_measured_cost_outranks_being_a_diagnostic():
    sync = verdict.Observed("sync", ("sync",), True, 4, 0, True, 0.05)
    layout = verdict.Observed("layout", ("layout",), True, 4, 0, True, 0.12)
    obs = (BASE_FAILS, layout, sync)
    rec, why = verdict.recommend(obs, [verdict.judge(o, BASE_FAILS, 0.2)[0] for o in obs], stall_s=5,
                                 diagnostic={"sync": "synchronizes the device twice per GEMM"})
    assert rec == "sync" and "also fixes it: layout (0/4 failed; cost +12%)" in why


def test_every_fix_that_declares_what_it_gives_up_or_means_says_it_in_words():
    for f in registry.load().values():
        for text in (f.means, f.diagnostic):
            assert text == "" or (text[0].islower() and not text.endswith(".")), (f.name, text)

# ------------------------------------------------------------------------------------ scenarios

@pytest.mark.parametrize("text,names,is_auto", [
    ("auto", ["baseline"], True),
    ("all", ["baseline", *registry.names()], False),
    ("fp32_softmax", ["baseline", "fp32_softmax"], False),
    ("sync_gemm+fp32_softmax,baseline", ["baseline", "sync_gemm+fp32_softmax"], False),
    ("cpu_fallback", ["baseline", "cpu_fallback"], False),
])
def test_scenario_lists(text, names, is_auto):
    got, auto = scenarios.parse(text)
    assert [s.name for s in got] == names and auto is is_auto
    assert not got[0].fixes


@pytest.mark.parametrize("text,msg", [("", "empty scenario"), ("fp32_softmax,,sync_gemm", "empty scenario"),
                                      ("nope", "unknown scenario 'nope'; choose baseline, auto, all"),
                                      ("fp32_softmax+nope", "unknown fix 'nope'"),
                                      ("sync_gemm,sync_gemm", "more than once"),
                                      ("module_loading_lazy+module_loading_eager", "cannot be combined")])
def test_bad_scenario_lists_name_the_choices(text, msg):
    with pytest.raises(ValueError, match=msg):
        scenarios.parse(text)


CPU = {"device": "cpu", "gpu": None, "cudnn": False, "torch": "2.x", "sdpa_mask": None}
CUDA = {"device": "cuda", "gpu": "cuda", "cudnn": True, "torch": "2.x", "sdpa_mask": None}


def test_auto_runs_the_evidence_first_then_01_then_the_class_then_the_rest(tmp_path):
    (tmp_path / "suggested_scenarios.json").write_text(json.dumps(
        {"scenarios": ["sdpa_math_off", "cpu_fallback"], "because": {"sdpa_math_off": ["no_fused_sdpa"]}}))
    (tmp_path / "metrics.json").write_text(json.dumps({"03_bisect_hang": {"headline": "h", "metrics": {
        "status": "hang", "class": "host_lock", "in_flight_op": "aten.mm.default", "drill": False}}}))
    found = scenarios.pointers(tmp_path)
    assert found.suggested == ("sdpa_math_off", "cpu_fallback") and found.classes == ("host_lock", "gemm")
    evidence = {"status": "hang", "phase": "ops", "class": "host_lock",
                "in_flight_op": {"name": "aten.mm.default", "shapes": [[8, 16], [16, 32]],
                                 "strides": [[16, 1], [1, 16]], "dtypes": ["torch.float32"], "device": "cpu"}}
    plan = scenarios.stages(found, [evidence], CPU, found.classes, have=["baseline"])
    stages = [st for st, _ in plan]
    names = [s.name for _, scs in plan for s in scs]
    assert stages[0] == "evidence" and [st for st in stages if st != "evidence"] == \
        [st for st in ("01", "class", "rest") if st in stages]
    assert names[:2] == ["contiguous_gemm_inputs", "omp_single_thread"]   # the most specific evidence first
    # 01 suggests sdpa_math_off, but the GEMM in flight rules it out: it is listed, with why, not run
    skipped = {t["scenario"]: t for t in scenarios.plan(found, [evidence], CPU, found.classes, ["baseline"]).skipped}
    assert "no_fused_sdpa" in skipped["sdpa_math_off"]["planned_because"] and "sdpa_math_off" not in names
    assert "op=aten.mm.default" in skipped["sdpa_math_off"]["why"]
    assert "cpu_fallback" not in names                                    # cannot apply on a CPU
    assert len(names) == len(set(names)) and set(names) <= {n for n, f in registry.load().items() if f.applies(CPU)}


def test_a_drill_in_03_is_not_a_verdict_to_follow(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps({"03_bisect_hang": {"headline": "h", "metrics": {
        "status": "hang", "class": "gemm", "in_flight_op": "aten.mm.default", "drill": True}}}))
    found = scenarios.pointers(tmp_path)
    assert found.classes == () and found.evidence is None
    assert [st for st, _ in scenarios.stages(found, [], CPU, ())] == ["rest"]


# ------------------------------------------------------------------------------------ numerics and cost

@pytest.mark.parametrize("ref,got,dtype,ok", [
    ({"output": torch.ones(4, 4), "losses": [1.0, 0.5]}, {"output": torch.ones(4, 4), "losses": [1.0, 0.5]},
     "float32", True),
    ({"output": torch.ones(4, 4)}, {"output": torch.ones(4, 4) + 5e-5}, "float32", True),
    ({"output": torch.ones(4, 4)}, {"output": torch.ones(4, 4) + 1e-2}, "float32", False),
    ({"output": torch.ones(4, 4)}, {"output": torch.ones(4, 4) + 1e-2}, "bfloat16", True),
    ({"output": torch.ones(4, 4), "losses": [1.0]}, {"output": torch.ones(4, 4), "losses": [1.5]}, "bfloat16", False),
    ({"output": torch.ones(4)}, {"output": torch.tensor([1.0, float("nan"), 1.0, 1.0])}, "bfloat16", False),
    ({"output": torch.ones(4)}, {"output": torch.ones(5)}, "float32", False),
    ({"output": torch.ones(4)}, {"other": torch.ones(4)}, "float32", False),
    (None, None, "float32", None),
])
def test_numerics_against_the_fix_free_run(ref, got, dtype, ok):
    res = numerics.compare_values(ref, got, dtype)
    assert res["ok"] is ok and res["note"]


def test_tolerances_cover_every_dtype():
    assert set(numerics.TOLERANCE) == set(workloads.DTYPE_NAMES)


def test_overhead_is_a_ratio_of_medians_with_an_interval():
    base = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0, 1.03]
    got = cost.overhead([x * 1.3 for x in base], base)
    assert got["overhead"] == pytest.approx(0.3, abs=1e-9)
    assert got["overhead_ci"][0] < 0.3 < got["overhead_ci"][1] + 1e-9 and got["overhead_ci"][0] > 0.2
    assert cost.overhead([1.0], [])["overhead"] is None and cost.overhead([1.0, 2.0], [1.0])["overhead_ci"] is None


@pytest.mark.parametrize("n,r,first", [(3, 0, "a"), (3, 1, "b"), (3, 4, "b"), (1, 7, "a")])
def test_each_round_starts_with_another_scenario(n, r, first):
    names = ["a", "b", "c"][:n]
    order = cost.rotation(names, r)
    assert order[0] == first and sorted(order) == names


# ------------------------------------------------------------------------------------ bad input

@pytest.mark.parametrize("argv,msg", [
    (["--scenario", "nope"], "unknown scenario 'nope'"), (["--scenario", ""], "empty scenario"),
    (["--scenario", "fp32_softmax+bogus"], "unknown fix 'bogus'"), (["--repeats", "0"], "repeats=0"),
    (["--jobs", "-1"], "--jobs -1"), (["--max-overhead", "-1"], "max_overhead=-1"),
    (["--cost-rounds", "-1"], "cost_rounds=-1"),
])
def test_bad_input_is_one_line_and_nothing_is_run_or_written(tmp_path, capsys, argv, msg):
    out = tmp_path / "out"
    code = commands.main(["--json", str(tmp_path / "f.json"), "--out", str(out), *argv, "--", sys.executable,
                          str(FIXTURES / "fix_env_startup.py")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and msg in err and len(err.splitlines()) == 1
    assert not (tmp_path / "f.json").exists() and not out.exists()


@pytest.mark.parametrize("flag", ["--stall", "--timeout"])
def test_non_positive_time_limits_are_refused_by_the_command(tmp_path, flag):
    res = subprocess.run([sys.executable, "-m", "gpulab", "fixes", "--json", str(tmp_path / "f.json"), flag, "0",
                          "--", sys.executable, str(FIXTURES / "fix_env_startup.py")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and flag in res.stderr and not (tmp_path / "f.json").exists()


@pytest.mark.parametrize("kw", [{"repeats": 0}, {"jobs": 0}, {"stall_s": 0}, {"timeout_s": -1.0}, {"time_s": 0},
                                {"max_overhead": -0.1}, {"cost_rounds": -1}, {"mode": "bogus"}, {"fault": "bogus"}])
def test_matrix_config_refuses_bad_values(kw):
    with pytest.raises(ValueError, match=next(iter(kw)).split("_")[0] if "fault" not in kw else "bogus"):
        matrix.MatrixConfig(**kw)


# ------------------------------------------------------------------------------------ children get the fixes

ENTRY_POINTS = {
    "trace bootstrap": ["-m", "gpulab.trace", "--log", "{tmp}/ops.log", "--", "{script}"],
    "oracle child": ["-m", "gpulab.oracle", "--candidate", "sdpa", "--cases", "quick"],
    "benchmark worker": ["-m", "gpulab.bench.worker", "{tmp}/spec.json", "{tmp}/result.json"],
    "fixes child": ["-m", "gpulab.fixes.child", "--", "{script}"],
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_every_gpulab_child_entry_point_installs_the_scenarios_fixes(extra_patches, tmp_path, entry):
    extra_patches(probe=PROBE)
    script = tmp_path / "prog.py"
    script.write_text("print('the program ran')\n")
    mark = tmp_path / "mark.txt"
    argv = [sys.executable] + [a.format(tmp=tmp_path, script=script) for a in ENTRY_POINTS[entry]]
    env = {**compose.scenario_env(["probe"], os.environ), "GPULAB_TEST_MARK": str(mark), "GPULAB_TEST_EXIT": "1"}
    r = proc.run(argv, timeout_s=120, env=env, capture=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert mark.read_text() == "applied\n"


def test_the_fixes_interpreter_variable_is_the_workloads():
    """compose cannot import gpulab.workloads (children load it before runpy runs that module): same name."""
    assert compose.PYTHON_VAR == workloads.PYTHON_ENV


@pytest.mark.parametrize("command,fix_python,interp", [
    (("python", "train.py"), None, sys.executable),
    (("python", "train.py"), "/opt/patched/bin/python", "/opt/patched/bin/python"),
    (("/opt/user/bin/python3", "train.py"), None, "/opt/user/bin/python3"),
    (("/opt/user/bin/python3", "train.py"), "/opt/patched/bin/python", "/opt/user/bin/python3"),
])
def test_timing_children_run_under_the_interpreter_the_ladder_uses(tmp_path, command, fix_python, interp):
    """A fix's interpreter replaces gpulab's own, never one the command names (as in watch.launch_plan)."""
    argv = Target(command=command).timing_argv({}, tmp_path, fix_python, 1.0)
    assert argv[0] == interp and argv[1:3] == ["-m", "gpulab.fixes.child"] and argv[-1] == "train.py"
    plan = watch.launch_plan(list(command), tmp_path, record=True, mode="ops", fault=None, coredump=False,
                             env={workloads.PYTHON_ENV: fix_python} if fix_python else {})
    assert plan.argv[0] == interp


def test_another_interpreter_runs_the_workload_children(extra_patches, tmp_path):
    """The `python` route (a venv with a patched torch): the ladder's children run under the fix's interpreter."""
    wrapper = tmp_path / "patched-python"
    wrapper.write_text(f"#!/bin/sh\nGPULAB_TEST_PATCHED=1 exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    extra_patches(patched_torch=f"from gpulab.fixes.fix import Fix\nFIX = Fix('patched_torch', 'a patched build', "
                  f"targets=('unknown',), python={str(wrapper)!r})\n")
    script = tmp_path / "needs_patch.py"
    script.write_text("import os, sys\nsys.exit(0 if os.environ.get('GPULAB_TEST_PATCHED') == '1' else 3)\n")
    rungs = [ladder.Rung("run", (sys.executable, str(script)))]
    kw = dict(repeats=1, stall_s=5.0, timeout_s=60, out_dir=tmp_path / "lad", progress=lambda m: None, record=False)
    assert not ladder.run(rungs, **kw).passed           # as it is: the check fails
    kw["record"] = True                                  # under the recorder's bootstrap, with the fix
    env = compose.scenario_env(["patched_torch"], os.environ)   # how the matrix hands a scenario's fixes on
    assert ladder.run(rungs, fixes=["patched_torch"], env=env, **kw).passed


# ------------------------------------------------------------------------------------ the matrix, for real

@pytest.mark.parametrize("fixture,fixing", [
    ("fix_transposed_gemm.py", "contiguous_gemm_inputs"),
    ("fix_lowprec_softmax.py", "fp32_softmax"),
    ("fix_env_startup.py", "omp_single_thread"),
])
def test_the_matrix_finds_the_one_fix_that_removes_a_real_hang(tmp_path, fixture, fixing):
    cfg = matrix.MatrixConfig("contiguous_gemm_inputs,fp32_softmax,omp_single_thread,sync_gemm", repeats=1,
                              jobs=2, stall_s=2.0, timeout_s=120, cost_rounds=0)
    m = matrix.run(Target(command=(sys.executable, str(FIXTURES / fixture))), cfg, tmp_path, progress=lambda s: None)
    got = {s.name: s.verdict for s in m.scenarios}
    # sync_gemm is a CUDA fix: not applicable on a machine without a GPU, nor on a GPU machine to a program whose
    # failing op ran on the CPU; a program that hangs before any op (fix_env_startup.py) may be a GPU program
    # stuck in its CUDA start-up, so on a GPU machine it is tried
    sync = "no_effect" if torch.cuda.is_available() and fixture == "fix_env_startup.py" else "not_applicable"
    assert got == {"baseline": "baseline", "contiguous_gemm_inputs": "no_effect", "fp32_softmax": "no_effect",
                   "omp_single_thread": "no_effect", "sync_gemm": sync, fixing: "fixes"}
    assert m.recommendation == fixing and m.kind == "command" and "outcomes and time only" in m.numerics_note
    assert m.baseline.counts["hang"] == 1
    saved = json.loads((tmp_path / "fixes.json").read_text())
    assert saved["recommendation"] == fixing and {s["name"] for s in saved["scenarios"]} == set(got)
    assert (tmp_path / "fixes_table.csv").exists()


@pytest.mark.parametrize("target,seen,judged", [
    (Target(command=("python", "x.py")), "cpu", "cpu"),      # a CPU program on a GPU machine: no CUDA fix applies
    (Target(command=("python", "x.py")), "cuda:0", "cuda"),  # its op on the GPU: the machine's GPU
    (Target(command=("python", "x.py")), None, "cuda"),      # the evidence does not say: the machine's
    (Target(workloads.WorkloadConfig(device="cuda")), "cpu", "cuda"),   # the built-in workload: as configured
])
def test_a_commands_fixes_are_judged_where_its_failing_op_ran(monkeypatch, tmp_path, target, seen, judged):
    """Before a command runs, device auto is the machine's GPU; once its baseline failed, the failing op's device
    says where the program runs (a CPU program on a GPU host was offered sync_gemm, a CUDA fix)."""
    from gpulab.fixes.outcome import ScenarioResult
    asked = []
    monkeypatch.setattr(matrix.platform, "facts", lambda dev, mask=None: asked.append(dev) or {"device": dev})
    mx = matrix._Matrix(target, matrix.MatrixConfig("sync_gemm"), tmp_path, "cuda", lambda m: None,
                        scenarios.Pointers())
    op = {"name": "aten.mm.default", "device": seen} if seen else None
    mx.order, mx.done["baseline"] = ["baseline"], ScenarioResult(
        "baseline", (), "", "", True, counts={"hang": 1}, trials=1,
        first_failure={"evidence": {"status": "hang", "in_flight_op": op}})
    assert mx.facts["device"] == judged and asked == [judged]


def test_cost_of_a_plain_command_is_its_time(tmp_path):
    cfg = matrix.MatrixConfig("omp_single_thread", repeats=1, stall_s=5.0, timeout_s=60, cost_rounds=3)
    script = tmp_path / "quick.py"
    script.write_text("import time\ntime.sleep(0.05)\n")
    m = matrix.run(Target(command=(sys.executable, str(script))), cfg, tmp_path / "m", progress=lambda s: None)
    s = {x.name: x for x in m.scenarios}["omp_single_thread"]
    assert s.verdict == "no_effect" and s.overhead is not None and s.cost["samples"] == [3, 3]
    assert s.numerics["ok"] is None and "outcomes and time only" in s.numerics["note"]
    assert m.recommendation is None and "nothing to fix" in m.next_step


# ------------------------------------------------------------------------------------ the chain per scenario

CHAIN_NB = '''
import os, sys
from pathlib import Path
from gpulab import report
from gpulab.hang.watchdog import watch
os.environ["GPULAB_TEST_MARK"] = str(Path(out_dir) / "mark.txt")   # where the probe fix writes, in the child
prog = Path(out_dir) / "prog.py"
prog.write_text("print('ran')\\n")
v = watch.run([sys.executable, str(prog)], stall_s=20, timeout_s=60, out_dir=Path(out_dir) / "w", progress=lambda m: None)
report.record(out_dir, "01_probe", "probed", fixes=os.environ.get("GPULAB_FIXES"),
              applied=(Path(out_dir) / "mark.txt").exists(), gpu=os.environ.get("CUDA_VISIBLE_DEVICES"), status=v.status)
'''


def test_the_chain_runs_once_per_scenario_with_its_fixes_in_every_child(extra_patches, tmp_path, monkeypatch):
    """Three scenarios side by side (jobs=2) on a throwaway project: each notebook's child gets its fixes."""
    extra_patches(probe=PROBE)
    proj = project(tmp_path / "proj", {"01_probe": notebook("Probe", "", CHAIN_NB)},
                   base="device: cpu\n",   # no device=auto question (a torch child per environment; test_runner's)
                   scenarios={"baseline": "description: plain\n", "probe": "description: p\nfixes: [probe]\n",
                              "probe_too": "description: p2\nfixes: [probe, omp_single_thread]\n"})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")       # two GPUs to spread parallel scenarios over
    cfg = runner.RunConfig(root=proj, scenarios=("baseline", "probe", "probe_too"), out=proj / "outputs",
                           cell_timeout_s=120, notebook_timeout_s=180, jobs=2)
    code, idx = runner.run(cfg, progress=lambda m: None)
    assert code == 0
    run = json.loads((idx.parent / "run.json").read_text())
    got = {s["name"]: s["metrics"]["01_probe"]["metrics"] for s in run["scenarios"]}
    assert got["baseline"]["fixes"] is None and not got["baseline"]["applied"]
    assert got["probe"]["fixes"] == "probe" and got["probe"]["applied"] and got["probe"]["status"] == "ok"
    assert got["probe_too"]["fixes"] == "probe,omp_single_thread" and got["probe_too"]["applied"]
    assert all(g["gpu"] in ("0", "1") for g in got.values())


def test_a_scenario_file_with_an_unknown_fix_fails_before_anything_runs(tmp_path):
    proj = project(tmp_path, {"01_x": notebook("X", "", "print(1)")},
                   scenarios={"baseline": "description: b\n", "bad": "fixes: [no_such_fix]\n"})
    with pytest.raises(paramsets.ParamError, match="unknown fix 'no_such_fix'; known fixes"):
        runner.run(runner.RunConfig(root=proj, scenarios=("bad",), out=proj / "outputs"), progress=lambda m: None)
    assert not (proj / "outputs").exists()


# ------------------------------------------------------------------------------------ notebook 04

SMOKE = ["-p", "device", "cpu", "-p", "batch", "1", "-p", "heads", "2", "-p", "head_dim", "16", "-p", "text_tokens", "8",
         "-p", "image_tokens", "24", "-p", "rung", "sdpa", "-p", "stall_s", "2.0", "-p", "repeats", "1"]


ZERO_ATTENTION = """
from gpulab.fixes.fix import Fix


def _apply():
    import torch
    import torch.nn.functional as F
    F.scaled_dot_product_attention = lambda q, k, v, **kw: torch.zeros_like(q)


FIX = Fix("zero_attention", "attention that returns zeros (wrong on purpose)", targets=("softmax",), apply=_apply)
"""


def test_notebook_04_is_a_labelled_self_test_with_a_planted_fault(extra_patches, tmp_path):
    """A deadlock planted in the CPU flash attention kernel: the math backend removes it with the same numbers
    (the recommendation); a fix that returns zeros removes it too, and the numerics say it breaks them."""
    extra_patches(zero_attention=ZERO_ATTENTION)
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "papermill", str(ROOT / "notebooks" / "04_fix_scenarios.ipynb"),
                          str(tmp_path / "04.ipynb"), "-k", "python3", "--cwd", str(ROOT), "-p", "out_dir", str(out),
                          *SMOKE, "-p", "scenarios", "sdpa_backend_math,zero_attention", "-p", "cost_rounds", "1",
                          "-p", "max_overhead", "1000000.0",   # tiny CPU ops on a shared box: the cost is noise
                          "-p", "fault", "deadlock:aten._scaled_dot_product_flash_attention_for_cpu"],
                         capture_output=True, text=True, timeout=400, env={**os.environ, "PATH": os.path.dirname(
                             sys.executable) + os.pathsep + os.environ.get("PATH", "")})
    assert res.returncode == 0, res.stderr[-3000:]
    entry = json.loads((out / "metrics.json").read_text())["04_fix_scenarios"]
    m = entry["metrics"]
    assert entry["headline"].startswith("self-test passed") and m["self_test"] == "passed" and m["drill"]
    assert m["baseline_failed"] == 1 and m["recommendation"] == "sdpa_backend_math" and m["recommendation_overhead"] is not None
    math_, zero = m["scenarios"]["sdpa_backend_math"], m["scenarios"]["zero_attention"]
    assert math_["verdict"] == "fixes" and math_["numerics_ok"] is True and math_["overhead"] is not None
    assert zero["verdict"] == "breaks_numerics" and zero["numerics_ok"] is False
    saved = json.loads((out / "fixes" / "fixes.json").read_text())
    assert saved["recommendation"] == "sdpa_backend_math" and "04_fix_scenarios" in (out / "progress.log").read_text()


def test_the_fix_kit_knows_every_sdpa_backend_without_importing_the_workload():
    """kit is loaded in every child before `python -m gpulab.workloads` runs: it must not import that module
    (runpy warns and may run it twice), so it keeps its own switch table, checked here against the vocabulary."""
    from gpulab import workloads
    from gpulab.fixes import kit
    assert tuple(kit._SDPA_SWITCH) == workloads.BACKENDS


def test_the_matrix_plot_is_a_sentence_when_only_the_baseline_ran():
    import dataclasses as dc

    import matplotlib
    matplotlib.use("Agg")
    from gpulab.fixes import view
    from gpulab.fixes.matrix import MatrixResult, ScenarioResult, judged
    base = ScenarioResult("baseline", (), "as it is", "nothing", True, counts={"pass": 3}, trials=3, fail_rate=0.0,
                          fail_rate_ci=(0.0, 0.56))
    fix = dc.replace(base, name="sync_gemm", fixes=("sync_gemm",))
    m = MatrixResult("builtin", "builtin", {}, tuple(judged((base,), 0.2, 30.0)[0]), None, "nothing to fix", 0.2, 3,
                     30.0)
    assert view.plot_matrix(m) is None
    assert set(verdict.VERDICTS) <= set(view.COLOURS)   # every verdict the table can show has its colour
    assert "(no fix)" in view.details_md(m)
    m = dc.replace(m, scenarios=tuple(judged((base, fix), 0.2, 30.0)[0]))
    assert view.plot_matrix(m) is not None


@pytest.mark.parametrize("fixes,values,applies", [
    (["cpu_fallback"], {"device": "cpu"}, True),     # the fix's own device=cpu is not the platform it runs on
    (["cpu_fallback"], {"device": "auto"}, True),
    (["sdpa_backend_cudnn"], {"device": "cpu"}, False),   # a CPU the user asked for is the platform
    (["alloc_async"], {}, True),
])
def test_the_chain_judges_a_fix_on_the_platform_before_the_fix(monkeypatch, fixes, values, applies):
    """Found in review: on a GPU machine the chain reported cpu_fallback not_applicable ("needs a GPU")
    because it read the device the fix itself sets. A CUDA machine is stood in (this one has none)."""
    import torch

    from gpulab import device as gdevice
    from gpulab.chain import runner

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(gdevice, "resolve", lambda d="auto": "cuda" if str(d) in ("auto", "cuda") else str(d))
    assert (runner._not_applicable(fixes, values) is None) is applies


def test_where_no_fix_works_the_platform_meeting_the_program_is_told_with_its_way_out_not_upstream():
    """A child forked after OpenMP ran: 03's owner is the platform with a way out in the program (spawn); 04's own
    next step said 'take 03's evidence bundle upstream' while the index told both sides."""
    failed = verdict.Observed("x", ("x",), True, 4, 4, True, 0.0)
    plat = {"kind": "platform", "where": "OpenMP (libgomp)", "why": "GNU OpenMP is not fork-safe",
            "program": "start the child processes with spawn"}
    rec, why = verdict.recommend([BASE_FAILS, failed], [verdict.judge(o, BASE_FAILS, 0.2)[0] for o in
                                                        (BASE_FAILS, failed)], stall_s=5, owner=plat)
    assert rec is None and "GNU OpenMP is not fork-safe" in why and "start the child processes with spawn" in why
    assert "upstream" not in why, why
