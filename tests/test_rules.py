"""Platform risk rules: every rule fires on its platform's facts and stays quiet on healthy ones."""
from __future__ import annotations

import copy

import pytest

from gpulab.env import rules as R
from gpulab.env.facts import FACT_KEYS
from gpulab.fixes import registry

# A healthy x86 H100 node, shaped like gpulab.env.collect() output.
H100 = {k: None for k in FACT_KEYS}
H100.update({
    "cpu_arch": "x86_64", "cpu_model": "Intel Xeon Platinum 8480+", "host_memory_gb": 2000.0,
    "in_container": True, "nvidia_driver": "580.65.06", "torch_version": "2.11.0+cu130",
    "cuda_version": "13.0", "hip_version": None, "cudnn_version": 91300, "gpu_kind": "cuda",
    "device_kind": "cuda", "device_count": 1, "device_name": "NVIDIA H100 80GB HBM3",
    "compute_capability": "9.0", "device_memory_gb": 85.0, "unified_memory": "none",
    "unified_memory_attrs": {"integrated": 0, "pageable_memory_access": 0, "pageable_uses_host_page_tables": 0},
    "arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"],
    "arch_in_wheel": "sass", "sdpa_selected": "cudnn", "sdpa_fused_usable": ["flash", "efficient", "cudnn"],
    "sdpa_hung": [], "sdpa_failed": [], "env_vars": {}, "ptrace_permitted": True, "ptrace_scope": 1,
    "ptrace": {"permitted": True, "ptrace_scope": 1}, "native_stack_tools": ["py-spy"],
    "tools": {"py-spy": {"path": "/usr/bin/py-spy"}}, "torch_probe_status": "ok", "torch_probe_stuck_in": None,
    "sdpa": {"selected": "cudnn"},
})


def facts(**over) -> dict:
    f = copy.deepcopy(H100)
    for k, v in over.items():
        f[k] = v
    return f


GB10 = dict(cpu_arch="aarch64", device_name="NVIDIA GB10", compute_capability="12.1", unified_memory="integrated",
            device_memory_gb=128.5, host_memory_gb=128.5, arch_in_wheel="sass_family",
            sdpa_fused_usable=["efficient"], sdpa_selected="efficient")
RDNA2 = dict(gpu_kind="rocm", device_kind="rocm", device_name="AMD Radeon RX 6800 XT", compute_capability=None,
             gfx_arch="gfx1030", hip_version="6.2.41133-dd7f95766", cuda_version=None,
             arch_list=["gfx900", "gfx906", "gfx908", "gfx90a", "gfx1030", "gfx1100"], arch_in_wheel="sass")

# rule id -> a platform on which it must fire
FIRES = {
    "blackwell_aarch64_unified_sdpa": GB10,
    "unified_memory_oom_hang": dict(GB10),
    "arch_not_in_wheel": dict(device_name="NVIDIA GB10", compute_capability="12.1", arch_in_wheel="ptx_only",
                              arch_list=["sm_80", "sm_90", "compute_90"]),
    "rdna_rocm_memory_faults": RDNA2,
    "hsa_override_gfx_version": dict(RDNA2, gfx_arch="gfx1031", env_vars={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}),
    "library_load_deadlock": dict(torch_probe_status="hang", torch_probe_stuck_in="cuda_init",
                                  sdpa_selected=None, sdpa_fused_usable=None),
    "sdpa_backend_hangs": dict(GB10, sdpa_hung=["math"]),
    "no_fused_sdpa": dict(sdpa_fused_usable=[], sdpa_selected="math"),
    "no_ptrace": dict(ptrace_permitted=False, ptrace={"permitted": False, "ptrace_scope": 2}),
    "no_native_stack_tool": dict(native_stack_tools=[]),
    "cuda_launch_blocking_set": dict(env_vars={"CUDA_LAUNCH_BLOCKING": "1"}),
}

# Near misses: the same platform with the one fact that makes it safe changed.
QUIET = {
    "blackwell_aarch64_unified_sdpa": [dict(GB10, cpu_arch="x86_64"), dict(GB10, unified_memory="none"),
                                       dict(GB10, compute_capability="10.0")],
    "rdna_rocm_memory_faults": [dict(RDNA2, hip_version="6.1.40091"), dict(RDNA2, gfx_arch="gfx1100"),
                                dict(RDNA2, gfx_arch="gfx90a")],
    "library_load_deadlock": [dict(torch_probe_status="hang", torch_probe_stuck_in="sdpa_run:math"),
                              dict(torch_probe_status="error", torch_probe_stuck_in="cuda_init")],
    "arch_not_in_wheel": [dict(arch_in_wheel="sass_family"), dict(arch_in_wheel="n/a", gpu_kind=None)],
    "no_ptrace": [dict(ptrace_permitted=None)],
}


@pytest.fixture(scope="module")
def rules():
    return R.load_rules()


def test_bundled_rules_cover_the_issue(rules):
    ids = {r.id for r in rules}
    assert ids == set(FIRES), "every bundled rule needs a firing platform in FIRES (and vice versa)"
    for r in rules:
        assert r.source.startswith("https://") and r.risk and r.evidence


@pytest.mark.parametrize("rule_id", sorted(FIRES))
def test_rule_fires_on_its_platform(rules, rule_id):
    matches = {m.rule_id: m for m in R.evaluate(facts(**FIRES[rule_id]), rules)}
    assert rule_id in matches
    m = matches[rule_id]
    assert m.matched and all("observed" in c for c in m.matched)
    rule = next(r for r in rules if r.id == rule_id)
    assert set(m.evidence) == set(rule.evidence)


@pytest.mark.parametrize("rule_id", sorted(FIRES))
def test_rule_quiet_on_healthy_h100(rules, rule_id):
    assert rule_id not in {m.rule_id for m in R.evaluate(facts(), rules)}


@pytest.mark.parametrize("rule_id,over", [(rid, o) for rid, lst in QUIET.items() for o in lst])
def test_rule_quiet_on_near_miss(rules, rule_id, over):
    assert rule_id not in {m.rule_id for m in R.evaluate(facts(**over), rules)}


def test_no_rule_fires_on_this_machine(rules):
    from test_env import real_facts

    f = real_facts()
    fired = {m.rule_id for m in R.evaluate(f, rules)}
    # Rules about observations fire only when the observation is there (this machine: ptrace works,
    # py-spy and gdb installed, no hang); everything else needs a GPU platform this machine lacks.
    expected = set()
    if f["ptrace_permitted"] is False:
        expected.add("no_ptrace")
    if not f["native_stack_tools"]:
        expected.add("no_native_stack_tool")
    assert fired == expected


def test_gb10_suggestions_are_ordered_and_unique(rules):
    matches = R.evaluate(facts(**dict(GB10, sdpa_hung=["math"])), rules)
    assert [m.severity for m in matches] == sorted((m.severity for m in matches),
                                                   key=R.SEVERITIES.index)
    sug = R.suggested_scenarios(matches)
    assert sug[0] == "sdpa_math_off" and len(sug) == len(set(sug))
    assert set(sug) <= set(registry.names())
    prod = R.scenarios_product(matches)
    assert "blackwell_aarch64_unified_sdpa" in prod["because"]["sdpa_math_off"]


# -- the condition language ----------------------------------------------------------------------

F = {"a": "aarch64", "n": 3, "v": "6.2.41133-dd7f95766", "cc": "12.1", "l": ["flash"], "e": [],
     "env_vars": {"X": "1"}, "none": None}


@pytest.mark.parametrize("cond,expect", [
    ({"fact": "cpu_arch", "eq": "aarch64"}, True),
    ({"fact": "cpu_arch", "eq": "x86_64"}, False),
    ({"fact": "cpu_arch", "ne": "x86_64"}, True),
    ({"fact": "cpu_arch", "in": ["x86_64", "aarch64"]}, True),
    ({"fact": "cpu_arch", "not_in": ["aarch64"]}, False),
    ({"fact": "hip_version", "version_ge": "6.2"}, True),
    ({"fact": "hip_version", "version_ge": "6.2.41134"}, False),
    ({"fact": "hip_version", "version_lt": "6.10"}, True),
    ({"fact": "hip_version", "version_lt": "6.2"}, False),
    ({"fact": "compute_capability", "regex": r"^12\.\d+$"}, True),
    ({"fact": "compute_capability", "regex": r"^9\."}, False),
    ({"fact": "compute_capability", "prefix": "12."}, True),
    ({"fact": "sdpa_fused_usable", "contains": "flash"}, True),
    ({"fact": "sdpa_fused_usable", "contains": "cudnn"}, False),
    ({"fact": "sdpa_hung", "empty": True}, True),
    ({"fact": "sdpa_fused_usable", "empty": True}, False),
    ({"fact": "env_vars.X", "exists": True}, True),
    ({"fact": "env_vars.Y", "exists": True}, False),
    ({"fact": "env_vars.Y", "exists": False}, True),
    ({"fact": "gfx_arch", "exists": False}, True),        # None counts as absent
    ({"fact": "gfx_arch", "ne": "gfx1030"}, False),       # a missing fact never matches by accident
    ({"all": [{"fact": "cpu_arch", "eq": "aarch64"}, {"fact": "device_count", "eq": 3}]}, True),
    ({"all": [{"fact": "cpu_arch", "eq": "aarch64"}, {"fact": "device_count", "eq": 4}]}, False),
    ({"any": [{"fact": "cpu_arch", "eq": "x86_64"}, {"fact": "device_count", "eq": 3}]}, True),
    ({"any": [{"fact": "cpu_arch", "eq": "x86_64"}, {"fact": "device_count", "eq": 4}]}, False),
    ({"not": {"fact": "cpu_arch", "eq": "x86_64"}}, True),
    ({"not": {"fact": "cpu_arch", "eq": "aarch64"}}, False),
])
def test_condition_operators(cond, expect):
    f = {"cpu_arch": F["a"], "device_count": F["n"], "hip_version": F["v"], "compute_capability": F["cc"],
         "sdpa_fused_usable": F["l"], "sdpa_hung": F["e"], "env_vars": F["env_vars"], "gfx_arch": None}
    ok, cites = R.check(R.parse_condition(cond), f)
    assert ok is expect
    assert bool(cites) is expect


def test_any_cites_only_branches_that_held():
    cond = R.parse_condition({"any": [{"fact": "cpu_arch", "eq": "x86_64"}, {"fact": "cpu_arch", "eq": "aarch64"}]})
    ok, cites = R.check(cond, {"cpu_arch": "aarch64"})
    assert ok and cites == ["cpu_arch eq 'aarch64' (observed 'aarch64')"]


@pytest.mark.parametrize("text,want", [
    ("6.2.41133-dd7f95766", (6, 2, 41133)), ("12.1", (12, 1)), ("2.11.0+cu130", (2, 11, 0)),
    (13000, (13000,)), ("", ()), (None, ()), ("rocm", ()),
])
def test_parse_version(text, want):
    assert R.parse_version(text) == want


# -- loader errors ---------------------------------------------------------------------------------

def _rule(**over):
    r = {"id": "x", "title": "t", "signature": {"fact": "cpu_arch", "eq": "aarch64"}, "risk": "r",
         "evidence": ["cpu_arch"], "fixes": ["cpu_fallback"], "source": "https://example.org/issue/1"}
    r.update(over)
    return {"rules": [r]}


@pytest.mark.parametrize("data,needle", [
    (_rule(signature={"fact": "cpu_arch", "like": "arm"}), "unknown operator 'like'"),
    (_rule(signature={"fact": "cpu_arc", "eq": "arm"}), "unknown fact key 'cpu_arc'"),
    (_rule(signature={"fact": "cpu_arch.sub", "eq": "arm"}), "unknown fact key 'cpu_arch.sub'"),
    (_rule(signature={"allof": [{"fact": "cpu_arch", "eq": "x"}]}), "unknown operator(s) ['allof']"),
    (_rule(signature={"fact": "cpu_arch", "eq": "a", "ne": "b"}), "exactly one operator"),
    (_rule(signature={"fact": "cpu_arch", "in": "aarch64"}), "'in' needs a list"),
    (_rule(signature={"fact": "cpu_arch", "regex": "("}), "bad regex"),
    (_rule(signature={"fact": "hip_version", "version_ge": "new"}), "needs a version"),
    (_rule(signature={"any": []}), "non-empty list"),
    (_rule(evidence=["cpu_arch", "gpu_name"]), "unknown fact key 'gpu_name'"),
    (_rule(fixes=["reboot"]), "unknown fix scenario 'reboot'"),
    (_rule(severity="critical"), "severity 'critical'"),
    (_rule(source="a forum post"), "public URL"),
    (_rule(colour="red"), "unknown field(s) ['colour']"),
    (_rule(risk=""), "missing required field 'risk'"),
    ({"rules": [_rule()["rules"][0], _rule()["rules"][0]]}, "duplicate rule id 'x'"),
    ({"rule": []}, "'rules' list"),
])
def test_loader_errors_name_rule_and_key(data, needle):
    with pytest.raises(R.RuleError) as exc:
        R.parse_rules(data, "test.yaml")
    assert needle in str(exc.value)
    if "rules" in data and data["rules"] and "duplicate" not in needle:
        assert "rule 'x'" in str(exc.value)


def test_load_rules_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules: [\n")
    with pytest.raises(R.RuleError, match="not valid YAML"):
        R.load_rules(bad)
    with pytest.raises(R.RuleError, match="cannot read rules file"):
        R.load_rules(tmp_path / "missing.yaml")
    bad.write_text("rules:\n  - id: x\n    title: t\n    risk: r\n    source: https://e.org\n"
                   "    signature: {fact: cpu_arch, eq: aarch64, __import__: os}\n")
    with pytest.raises(R.RuleError, match="exactly one operator"):
        R.load_rules(bad)
