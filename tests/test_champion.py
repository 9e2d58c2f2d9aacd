"""gpulab.champion: the decision matrix on synthetic comparisons, the fix-overhead table, and the real
benchmark child (CPU, tiny sizes), including one that hangs."""
from __future__ import annotations

import json
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpulab.bench import champion as ch
from gpulab.report import record


@dataclass(frozen=True)
class Cmp:
    ratio: float
    ratio_ci: tuple[float, float]
    verdict: str


def cmp(ratio: float, half: float = 0.01, delta: float = 0.01) -> Cmp:
    from gpulab.bench import decide

    ci = (ratio - half, ratio + half)
    return Cmp(ratio, ci, decide(ci, delta))


def table(pairs: dict[tuple[str, str], Cmp]):
    """compare(a, b) from a table; (b, a) is derived, so a test need only give one direction."""
    calls = []

    def compare(a, b):
        calls.append((a, b))
        if (a, b) in pairs:
            return pairs[(a, b)]
        c = pairs[(b, a)]
        return Cmp(1 / c.ratio, (1 / c.ratio_ci[1], 1 / c.ratio_ci[0]),
                   {"faster": "slower", "slower": "faster"}.get(c.verdict, "tie"))
    compare.calls = calls
    return compare


GATE_ALL = {n: ch.Gate(True) for n in ("math", "flash", "custom", "other")}


def test_faster_with_ci_beyond_delta_becomes_champion():
    d = ch.choose(["flash"], "math", table({("flash", "math"): cmp(0.4)}), gate=GATE_ALL)
    assert d.champion == "flash" and not d.provisional
    r = d.row("flash")
    assert r.status == "champion" and "2.50x faster than math" in r.label and r.gate == "passed"
    assert d.row("math").status == "baseline"


def test_correct_but_slower_is_labelled_with_its_factor():
    d = ch.choose(["custom"], "math", table({("custom", "math"): cmp(1.73)}), gate=GATE_ALL)
    assert d.champion == "math"
    assert d.row("custom").status == "slower" and d.row("custom").label.startswith("correct, 1.73x slower")
    assert d.row("math").status == "champion"


@pytest.mark.parametrize("ratio, half", [(0.995, 0.003), (0.98, 0.02), (1.0, 0.0)])
def test_ci_touching_the_tie_zone_is_a_tie(ratio, half):
    d = ch.choose(["custom"], "math", table({("custom", "math"): cmp(ratio, half)}), gate=GATE_ALL)
    assert d.champion == "math" and d.row("custom").status == "tie"


def test_failed_oracle_is_excluded_with_reason_and_never_timed():
    gate = {**GATE_ALL, "custom": ch.Gate(False, "NaN rows in the last partial tile", 7.5, 40)}
    compare = table({("flash", "math"): cmp(0.5), ("custom", "math"): cmp(0.1)})
    d = ch.choose(["custom", "flash"], "math", compare, gate=gate)
    assert d.champion == "flash"
    r = d.row("custom")
    assert r.status == "excluded" and "NaN rows in the last partial tile" in r.label and r.gate == "failed"
    assert all("custom" not in pair for pair in compare.calls)


def test_candidate_missing_from_the_gate_is_unverified_not_passed():
    gate = {"math": ch.Gate(True), "flash": ch.Gate(True)}
    d = ch.choose(["flash", "custom"], "math", table({("flash", "math"): cmp(0.5), ("custom", "math"): cmp(0.2)}),
                  gate=gate)
    assert d.champion == "flash" and d.row("custom").status == "unverified"


def test_no_gate_at_all_makes_the_decision_provisional():
    d = ch.choose(["flash"], "math", table({("flash", "math"): cmp(0.5)}), gate=None)
    assert d.provisional and d.champion == "flash" and d.row("flash").label.startswith("unverified")


def test_over_ten_x_against_a_vendor_champion_is_suspect():
    compare = table({("flash", "math"): cmp(0.05, 0.005), ("custom", "math"): cmp(0.0025, 0.0005)})
    d = ch.choose(["flash", "custom"], "math", compare, gate=GATE_ALL, order={"math": 100.0, "flash": 5.0,
                                                                              "custom": 0.25})
    # visited fastest first: custom beats math (not a tuned kernel) but is 20x faster than flash's median
    assert d.row("custom").status == "suspect" and "flash" in d.row("custom").label
    assert d.champion == "flash"  # flash vs math: 20x over the *reference* composite is not suspect


def test_suspect_against_vendor_champion_in_direct_comparison():
    d = ch.choose(["flash", "custom"], "math",
                  table({("flash", "math"): cmp(0.5), ("custom", "flash"): cmp(0.08, 0.002)}), gate=GATE_ALL)
    assert d.champion == "flash" and d.row("custom").status == "suspect"
    assert "12.5x faster than vendor kernel flash" in d.row("custom").label


def test_nine_x_over_vendor_is_a_real_win():
    d = ch.choose(["flash", "custom"], "math",
                  table({("flash", "math"): cmp(0.5), ("custom", "flash"): cmp(1 / 9, 0.002)}), gate=GATE_ALL)
    assert d.champion == "custom"


def test_errors_are_rows_not_crashes():
    def compare(a, b):
        if a == "other":
            raise RuntimeError("CUDA error: an illegal memory access")
        return cmp(0.5)
    d = ch.choose(["flash", "other", "broken"], "math", compare, gate=GATE_ALL | {"broken": ch.Gate(True)},
                  errors={"broken": "ImportError: no module named mykernels"})
    assert d.row("broken").status == "error" and "mykernels" in d.row("broken").label
    assert d.row("other").status == "error" and "illegal memory access" in d.row("other").label
    assert d.champion == "flash"


def test_baseline_not_eligible_first_eligible_takes_the_title():
    gate = {**GATE_ALL, "math": ch.Gate(False, "overflow")}
    d = ch.choose(["flash", "custom"], "math", table({("custom", "flash"): cmp(1.3)}), gate=gate,
                  order={"flash": 1.0, "custom": 1.3})
    assert d.row("math").status == "excluded"
    assert d.champion == "flash" and "by default" in d.row("flash").label
    assert d.row("custom").status == "slower"


def test_earlier_champion_beaten_later_is_dethroned():
    compare = table({("flash", "math"): cmp(0.5), ("custom", "flash"): cmp(0.6)})
    d = ch.choose(["flash", "custom"], "math", compare, gate=GATE_ALL)  # no order: visited as given
    assert d.champion == "custom"
    assert d.row("flash").status == "dethroned" and "beaten by custom" in d.row("flash").label


def test_decision_round_trips_through_json():
    from dataclasses import asdict

    d = ch.choose(["flash"], "math", table({("flash", "math"): cmp(0.5)}), gate=GATE_ALL)
    again = ch.decision_from_dict(json.loads(json.dumps(asdict(d))))
    assert again == d
    assert list(ch.decision_table(d)["candidate"]) == ["math", "flash"]


@pytest.mark.parametrize("bad", [{"x": True}, {"x": {"reason": "no passed key"}}])
def test_bad_gate_is_refused(bad):
    with pytest.raises(ValueError, match="passed"):
        ch.parse_gate(bad)


def test_load_gate(tmp_path):
    assert ch.load_gate(tmp_path) is None
    (tmp_path / ch.GATE_FILE).write_text(json.dumps({"tiled": {"passed": False, "reason": "r", "worst_ratio": 9.0,
                                                               "cases": 3}}))
    assert ch.load_gate(tmp_path) == {"tiled": ch.Gate(False, "r", 9.0, 3)}


# ---------------------------------------------------------------------------------- fix overhead


def _scenario(run: Path, name: str, ms: float | None, ci=None):
    kw = {"workload_ms": ms, "workload_ci_ms": ci or ([ms * 0.99, ms * 1.01] if ms else None)}
    record(run / name, "06_benchmark", "h", **kw)


def test_overhead_table_flags_over_budget(tmp_path):
    _scenario(tmp_path, "baseline", 10.0)
    _scenario(tmp_path, "sdpa_math", 11.5)
    _scenario(tmp_path, "upcast_fp32", 13.0)
    rows, note = ch.scenario_overhead(tmp_path / "upcast_fp32")
    by = {r["scenario"]: r for r in rows}
    assert by["baseline"]["within budget"] == "baseline"
    assert by["sdpa_math"]["within budget"] == "ok" and by["sdpa_math"]["overhead %"] == pytest.approx(15.0)
    assert by["upcast_fp32"]["within budget"] == "OVER BUDGET"
    assert by["upcast_fp32"]["bound low"] == pytest.approx(13 * 0.99 / 10.1)
    assert "20%" in note


def test_overhead_with_one_scenario_says_so(tmp_path):
    _scenario(tmp_path, "baseline", 10.0)
    rows, note = ch.scenario_overhead(tmp_path / "baseline")
    assert rows == [] and "only one scenario" in note


def test_overhead_without_baseline_scenario(tmp_path):
    _scenario(tmp_path, "a", 10.0)
    _scenario(tmp_path, "b", 12.0)
    rows, note = ch.scenario_overhead(tmp_path / "a")
    assert rows == [] and "'baseline'" in note


# ------------------------------------------------------------------------------ the real child


def _spec(**kw) -> ch.Spec:
    base = dict(dtype="float32", batch=1, heads=2, head_dim=16, text_tokens=8, image_tokens=24,
                candidates=["math", "flash"], baseline="math", seq_lens=[32], delta=0.01, max_time_s=0.25)
    base.update(kw)
    return ch.make_spec("cpu", **base)


def test_benchmark_child_end_to_end_on_cpu(tmp_path):
    gate = {"sdpa_math": {"passed": True, "reason": "", "worst_ratio": 1.0, "cases": 4},
            "sdpa_flash": {"passed": True, "reason": "", "worst_ratio": 1.2, "cases": 4},
            "math": {"passed": True, "reason": ""}, "flash": {"passed": True, "reason": ""}}
    (tmp_path / ch.GATE_FILE).write_text(json.dumps(gate))
    wl = dict(workload="builtin", rung="forward", sdpa_backend="auto", dtype="auto", batch=1, heads=2, head_dim=16,
              text_tokens=8, image_tokens=24, layers=1, lora_rank=4, steps=1)
    spec = _spec(workload=wl, out_dir=tmp_path)
    assert spec.gate is not None
    run = ch.run(spec, tmp_path)
    assert run.status == "ok", (run.detail, Path(run.log).read_text()[-2000:])
    res = run.result
    assert res["done"] and res["decision"]["provisional"] is False
    d = ch.decision_from_dict(res["decision"])
    assert d.champion in spec.candidates and d.baseline == spec.baseline
    comps = ch.comparisons(res)
    (name, c), = comps.items()
    assert c.baseline.name == spec.baseline and c.candidate.n >= 2 and c.verdict in ("faster", "slower", "tie")
    assert {r["candidate"] for r in res["sweep"]} == set(spec.candidates)
    assert all(r["tflops"] > 0 for r in res["sweep"])
    assert res["workload"]["median_ms"] > 0
    assert res["roof"]["source"].startswith("measured")
    headline, metrics = ch.metrics(res, run.status)
    assert d.champion in headline and metrics["workload_ms"] == res["workload"]["median_ms"]
    assert set(ch.candidates_table(res)["candidate"]) >= set(spec.candidates)


def test_benchmark_child_does_not_time_what_failed_the_oracle(tmp_path):
    gate = {"sdpa_math": {"passed": True, "reason": "ok"},
            "sdpa_flash": {"passed": False, "reason": "wrong scale: 1/d instead of 1/sqrt(d)"}}
    (tmp_path / ch.GATE_FILE).write_text(json.dumps(gate))
    run = ch.run(_spec(seq_lens=[32], out_dir=tmp_path), tmp_path)
    assert run.status == "ok", run.detail
    d = ch.decision_from_dict(run.result["decision"])
    failed = "sdpa_flash"  # registry names: what 05 writes in its gate
    assert d.row(failed).status == "excluded" and "1/sqrt(d)" in d.row(failed).label
    assert d.champion == d.baseline
    assert failed not in run.result["vs_baseline"] and run.result["not_timed"] == [failed]
    assert {r["candidate"] for r in run.result["sweep"]} == {d.baseline}


def test_benchmark_child_that_hangs_is_killed_and_keeps_what_it_measured(tmp_path, monkeypatch):
    mod = tmp_path / "hangs_later.py"
    mod.write_text(textwrap.dedent('''
        import time
        import torch.nn.functional as F
        calls = 0
        def attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
            global calls
            calls += 1
            if calls > 3:          # runs for the probe and the warm-up, then never returns
                time.sleep(3600)
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    '''))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{Path(ch.__file__).resolve().parents[1]}")
    spec = _spec(candidates=["math", "hangs_later:attention"], seq_lens=[], max_time_s=0.2)
    run = ch.run(spec, tmp_path, timeout_s=15)
    assert run.status == "hang", run.detail
    assert run.result["stage"] in ("resolved",) and "decision" not in run.result
    assert run.elapsed_s < 25
    head, metrics = ch.metrics(run.result, run.status)
    assert "hang" in head


@pytest.mark.parametrize("kw, match", [
    (dict(candidates="math"), "candidates"), (dict(seq_lens=[0]), "seq_lens"), (dict(delta=2.0), "delta"),
    (dict(max_time_s=0), "max_time_s"), (dict(dtype="float64"), "dtype"), (dict(baseline=""), "baseline"),
])
def test_bad_notebook_parameters_name_the_value(kw, match):
    with pytest.raises(ValueError, match=match):
        _spec(**kw)


def test_spec_round_trips_and_deadline_grows_with_work():
    from dataclasses import asdict

    s = _spec()
    assert ch.spec_from_dict(json.loads(json.dumps(asdict(s)))) == s
    assert _spec(seq_lens=[32, 64, 128]).deadline_s() > s.deadline_s() > 0
    assert math.isfinite(s.deadline_s())
