"""Notebook 06's champion: the decision matrix on synthetic comparisons, the workload's masked call (what is
timed, what refuses it), the tables/plots/words, the fix-overhead table, and the real benchmark child (CPU,
tiny sizes), including one that hangs."""
from __future__ import annotations

import json
import math
import re
import textwrap
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
import torch

from gpulab import bench
from gpulab.bench import child, decision, overhead, view, worker
from gpulab.bench.decision import Gate
from gpulab.stats import decide
from gpulab.oracle import GATE_FILE
from gpulab.report import record
from gpulab.workloads import AttentionCall, WorkloadConfig


@dataclass(frozen=True)
class Cmp:
    ratio: float
    ratio_ci: tuple[float, float]
    verdict: str


def cmp(ratio: float, half: float = 0.01, delta: float = 0.01) -> Cmp:
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


GATE_ALL = {n: Gate(True) for n in ("math", "flash", "custom", "other")}
choose = decision.choose


# ------------------------------------------------------------------------------------ the decision


def test_faster_with_ci_beyond_delta_becomes_champion():
    d = choose(["flash"], "math", table({("flash", "math"): cmp(0.4)}), gate=GATE_ALL)
    assert d.champion == "flash" and not d.provisional
    r = d.row("flash")
    assert r.status == "champion" and "2.50x faster than math" in r.label and r.gate == "passed"
    assert d.row("math").status == "baseline"


def test_correct_but_slower_is_labelled_with_its_factor():
    d = choose(["custom"], "math", table({("custom", "math"): cmp(1.73)}), gate=GATE_ALL)
    assert d.champion == "math"
    assert d.row("custom").status == "slower" and d.row("custom").label.startswith("correct, 1.73x slower")
    assert d.row("math").status == "champion"


@pytest.mark.parametrize("ratio, half", [(0.995, 0.003), (0.98, 0.02), (1.0, 0.0)])
def test_ci_touching_the_tie_zone_is_a_tie(ratio, half):
    d = choose(["custom"], "math", table({("custom", "math"): cmp(ratio, half)}), gate=GATE_ALL)
    assert d.champion == "math" and d.row("custom").status == "tie"


def test_failed_oracle_is_excluded_with_reason_and_never_timed():
    gate = {**GATE_ALL, "custom": Gate(False, "NaN rows in the last partial tile", 7.5, 40)}
    compare = table({("flash", "math"): cmp(0.5), ("custom", "math"): cmp(0.1)})
    d = choose(["custom", "flash"], "math", compare, gate=gate)
    assert d.champion == "flash"
    r = d.row("custom")
    assert r.status == "excluded" and "NaN rows in the last partial tile" in r.label and r.gate == "failed"
    assert all("custom" not in pair for pair in compare.calls)


def test_candidate_missing_from_the_gate_is_unverified_not_passed():
    gate = {"math": Gate(True), "flash": Gate(True)}
    d = choose(["flash", "custom"], "math", table({("flash", "math"): cmp(0.5), ("custom", "math"): cmp(0.2)}),
               gate=gate)
    assert d.champion == "flash" and d.row("custom").status == "unverified"


def test_no_gate_at_all_makes_the_decision_provisional():
    d = choose(["flash"], "math", table({("flash", "math"): cmp(0.5)}), gate=None)
    assert d.provisional and d.champion == "flash" and d.row("flash").label.startswith("unverified")


def test_over_ten_x_against_a_vendor_champion_is_suspect():
    compare = table({("flash", "math"): cmp(0.05, 0.005), ("custom", "math"): cmp(0.0025, 0.0005)})
    d = choose(["flash", "custom"], "math", compare, gate=GATE_ALL, order={"math": 100.0, "flash": 5.0,
                                                                           "custom": 0.25})
    # visited fastest first: custom beats math (not a tuned kernel) but is 20x faster than flash's median
    assert d.row("custom").status == "suspect" and "flash" in d.row("custom").label
    assert d.champion == "flash"  # flash vs math: 20x over the *reference* composite is not suspect


def test_suspect_against_vendor_champion_in_direct_comparison():
    d = choose(["flash", "custom"], "math",
               table({("flash", "math"): cmp(0.5), ("custom", "flash"): cmp(0.08, 0.002)}), gate=GATE_ALL)
    assert d.champion == "flash" and d.row("custom").status == "suspect"
    assert "12.5x faster than vendor kernel flash" in d.row("custom").label


def test_nine_x_over_vendor_is_a_real_win():
    d = choose(["flash", "custom"], "math",
               table({("flash", "math"): cmp(0.5), ("custom", "flash"): cmp(1 / 9, 0.002)}), gate=GATE_ALL)
    assert d.champion == "custom"


def test_errors_are_rows_not_crashes():
    def compare(a, b):
        if a == "other":
            raise RuntimeError("CUDA error: an illegal memory access")
        return cmp(0.5)
    d = choose(["flash", "other", "broken"], "math", compare, gate=GATE_ALL | {"broken": Gate(True)},
               errors={"broken": "ImportError: no module named mykernels"})
    assert d.row("broken").status == "error" and "mykernels" in d.row("broken").label
    assert d.row("other").status == "error" and "illegal memory access" in d.row("other").label
    assert d.champion == "flash"


def test_unsupported_for_the_call_is_a_row_never_compared():
    compare = table({("custom", "math"): cmp(0.5)})
    why = "Flash attention does not support non-null attn_mask."
    d = choose(["flash", "custom"], "math", compare, gate=GATE_ALL, unsupported={"flash": why})
    r = d.row("flash")
    assert r.status == "unsupported" and why in r.label and "workload's call" in r.label
    assert d.champion == "custom" and all("flash" not in pair for pair in compare.calls)


def test_baseline_not_eligible_first_eligible_takes_the_title():
    gate = {**GATE_ALL, "math": Gate(False, "overflow")}
    d = choose(["flash", "custom"], "math", table({("custom", "flash"): cmp(1.3)}), gate=gate,
               order={"flash": 1.0, "custom": 1.3})
    assert d.row("math").status == "excluded"
    assert d.champion == "flash" and "by default" in d.row("flash").label
    assert d.row("custom").status == "slower"


@pytest.mark.parametrize("order", [None, {"flash": 1.0, "custom": 0.6}])
def test_earlier_champion_beaten_later_is_overtaken(order):
    compare = table({("flash", "math"): cmp(0.5), ("custom", "flash"): cmp(0.6), ("custom", "math"): cmp(0.3)})
    d = choose(["flash", "custom"], "math", compare, gate=GATE_ALL, order=order)
    assert d.champion == "custom"
    if order is None:  # visited as given: flash first took the title, then lost it
        assert d.row("flash").status == "overtaken" and "was champion, then beaten by custom" in d.row("flash").label
    assert view.STATUS_WORDS["overtaken"] == "was champion, now beaten"


def test_decision_round_trips_through_json():
    d = choose(["flash"], "math", table({("flash", "math"): cmp(0.5)}), gate=GATE_ALL)
    again = decision.decision_from_dict(json.loads(json.dumps(asdict(d))))
    assert again == d
    assert list(view.decision_table({"decision": asdict(d)})["candidate"]) == ["math", "flash"]


@pytest.mark.parametrize("bad", [{"x": True}, {"x": {"reason": "no passed key"}}])
def test_bad_gate_is_refused(bad):
    with pytest.raises(ValueError, match="passed"):
        decision.parse_gate(bad)


def test_load_gate(tmp_path):
    assert child.load_gate(tmp_path) is None
    (tmp_path / GATE_FILE).write_text(json.dumps({"tiled": {"passed": False, "reason": "r", "worst_ratio": 9.0,
                                                            "cases": 3}}))
    assert child.load_gate(tmp_path) == {"tiled": Gate(False, "r", 9.0, 3)}


# ---------------------------------------------------------------------------- the workload's call


def _cfg(**kw) -> WorkloadConfig:
    return WorkloadConfig(**{**dict(batch=1, heads=2, head_dim=16, text_tokens=8, image_tokens=24, layers=1,
                                    lora_rank=4, steps=1, device="cpu"), **kw})


def _spec(cfg: WorkloadConfig | None = None, **kw) -> child.Spec:
    base = dict(candidates=["math", "flash"], baseline="math", seq_lens=[32], delta=0.01, max_time_s=0.25)
    base.update(kw)
    return child.make_spec(cfg or _cfg(), **base)


@pytest.mark.parametrize("text, image", [(8, 24), (16, 64), (3, 40)])
def test_spec_times_exactly_the_workloads_call(text, image):
    cfg = _cfg(text_tokens=text, image_tokens=image)
    spec = _spec(cfg)
    assert spec.call == cfg.attention("cpu")
    assert spec.call.seq_len == text + image and spec.call.padded_keys == text // 4
    assert spec.call.mask == ("padding" if text // 4 else "none")
    assert spec.candidates == ("sdpa_math", "sdpa_flash") and spec.baseline == "sdpa_math"  # registry names


@pytest.mark.parametrize("seq_len, padded, pad_end", [(64, 2, 8), (32, 2, 8), (8, 2, 8), (4, 1, 1)])
def test_sweep_keeps_the_same_kind_of_mask(seq_len, padded, pad_end):
    call = AttentionCall(1, 2, 32, 16, "float32", "padding", 2, 8)
    at = child.at_length(call, seq_len)
    assert (at.seq_len, at.mask, at.padded_keys, at.pad_end) == (seq_len, "padding", padded, pad_end)
    mask = at.inputs("cpu")[3]
    assert mask.shape == (1, 1, seq_len, seq_len) and int((~mask[0, 0, 0]).sum()) == padded
    assert child.at_length(call.unmasked(), seq_len).mask == "none"


def _sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


def _no_kernel(q, k, v, attn_mask=None, is_causal=False, scale=None):
    if attn_mask is not None:
        raise RuntimeError("No available kernel. Aborting execution.")
    return _sdpa(q, k, v)


def _rejects_mask(q, k, v, attn_mask=None, is_causal=False, scale=None):
    if attn_mask is not None:
        raise NotImplementedError("this kernel has no attn_mask support")
    return _sdpa(q, k, v)


def _broken(q, k, v, attn_mask=None, is_causal=False, scale=None):
    raise ValueError("bad kernel build")


def _wrong_shape(q, k, v, attn_mask=None, is_causal=False, scale=None):
    return q[..., :1, :]


# What SDPA says on an H100 (torch 2.11) when flash is forced with a mask: the backends sdpa_kernel switched
# off are "runtime disabled", which is not why flash refused.
H100_FLASH_WARNINGS = ("Memory efficient kernel not used because:", "Memory Efficient attention has been runtime "
                       "disabled.", "Flash attention kernel not used because:", "Flash Attention does not support "
                       "non-null attn_mask.", "cuDNN attention kernel not used because:",
                       "cuDNN attention has been runtime disabled.")


def _flash_like(q, k, v, attn_mask=None, is_causal=False, scale=None):
    if attn_mask is not None:
        for w in H100_FLASH_WARNINGS:
            warnings.warn(w)
        raise RuntimeError("No available kernel. Aborting execution.")
    return _sdpa(q, k, v)


@pytest.mark.parametrize("fn, kind, words", [
    (_sdpa, None, None),
    (_no_kernel, "unsupported", "No available kernel"),
    (_flash_like, "unsupported", "Flash Attention does not support non-null attn_mask. (RuntimeError: No "
                                 "available kernel"),
    (_rejects_mask, "unsupported", "no attn_mask support"),
    (_broken, "error", "bad kernel build"),
    (_wrong_shape, "error", "output shape"),
])
def test_refusal_of_the_workloads_call(fn, kind, words):
    call = _cfg().attention("cpu")
    got = worker.refusal(fn, call, call.inputs("cpu"), "cpu")
    if kind is None:
        assert got is None
    else:
        assert got[0] == kind and words in got[1] and "runtime disabled" not in got[1]


@pytest.mark.gpu
def test_flash_refuses_the_workloads_masked_call_on_cuda():
    from gpulab.oracle import candidates

    call = _cfg(device="cuda").attention("cuda")
    flash = candidates.resolve(["flash"], "cuda")[0]
    got = worker.refusal(flash.fn, call, call.inputs("cuda"), "cuda")
    assert got is not None and got[0] == "unsupported" and "attn_mask" in got[1], got
    assert worker.refusal(flash.fn, call.unmasked(), call.unmasked().inputs("cuda"), "cuda") is None


# ----------------------------------------------------------------------------- tables, plots, words


@pytest.mark.parametrize("x, text", [(0.0000123456, "0.0000123"), (0.5, "0.500"), (1.2345, "1.23"),
                                     (12.345, "12.3"), (123456.0, "123,456"), (float("nan"), "n/a"), (None, "n/a")])
def test_numbers_have_few_digits(x, text):
    assert view.sig(x) == text


def _synthetic(tflops: dict[int, float], peak: float | None) -> dict:
    sweep = [{"candidate": "sdpa_math", "seq_len": s, "median_ms": 1.0, "ci_ms": [0.9, 1.1], "tflops": t}
             for s, t in tflops.items()]
    call = AttentionCall(1, 2, 32, 16, "float32", "padding", 2, 8)
    res = {"spec": {"call": asdict(call), "baseline": "sdpa_math", "candidates": ["sdpa_math"]}, "sweep": sweep}
    if peak:
        res["roof"] = {"tflops": peak, "source": "table: test", "mem_gbs": None}
    return res


def _peak_lines(fig) -> list:
    return [ln for ln in fig.axes[0].get_lines() if "peak" in str(ln.get_label())]


@pytest.mark.parametrize("peak, drawn", [(None, False), (5.0, True), (989.0, False)])
def test_sweep_plot_is_log_scaled_and_draws_the_peak_only_when_it_fits(peak, drawn):
    res = _synthetic({128: 0.0005, 256: 0.02, 512: 0.4}, peak)  # three decades apart
    fig = view.sweep_figure(res)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    assert bool(_peak_lines(fig)) is drawn
    assert ("not drawn" in view.sweep_note(res)) is (peak == 989.0)
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text() and lo <= t.get_position()[1] <= hi]
    assert 2 <= len(labels) <= 8 and not any("e" in t for t in labels), labels
    assert fig._repr_png_().startswith(b"\x89PNG")


@pytest.mark.parametrize("fn", [view.sweep_figure, view.latency_figure, view.sweep_table])
def test_nothing_measured_gives_a_sentence_not_an_empty_plot(fn):
    out = fn({"spec": {}, "sweep": []})
    assert isinstance(out, view.Note) and out._repr_markdown_().strip()


def test_words_for_an_unsupported_candidate():
    why = "Flash attention does not support non-null attn_mask.; RuntimeError: No available kernel."
    res = {"spec": {"baseline": "sdpa_math", "candidates": ["sdpa_math", "sdpa_flash", "tiled"]},
           "call": "B=1 H=2 S=32 D=16 float32, boolean key-padding mask (2 of 32 keys masked)",
           "candidates": {"sdpa_math": {"kind": "vendor"}, "sdpa_flash": {"kind": "vendor"},
                          "tiled": {"kind": "reference"}},
           "unsupported": {"sdpa_flash": why}, "errors": {}, "skipped": {}, "vs_baseline": {}}
    d = choose(["sdpa_flash", "tiled"], "sdpa_math", table({("tiled", "sdpa_math"): cmp(2.0)}),
               unsupported=res["unsupported"])
    res["decision"] = asdict(d)
    t = view.candidates_table(res)  # indexed by candidate
    assert t.loc["sdpa_flash", "on the workload's call"].startswith("not supported") and why in \
        t.loc["sdpa_flash", "on the workload's call"]
    assert t.loc["tiled", "kind"] == "reference (gpulab)"
    text = view.finding_text(child.RunResult("ok", res, 1.0, "log"))
    assert "not supported for the workload's call" in text and "Flash attention does not support" in text
    assert "cannot be compared" in text and "01" in text  # 01's quick timing is a different measurement
    for banned in ("seeds'", "dethroned", "roof", "BCa"):
        assert banned not in text
    head, metrics = view.finding(child.RunResult("ok", res, 1.0, "log"))
    assert "sdpa_flash" in head and metrics["unsupported"] == res["unsupported"]


# ---------------------------------------------------------------------------------- fix overhead


def _scenario(run: Path, name: str, ms: float | None, ci=None):
    kw = {"workload_ms": ms, "workload_ci_ms": ci or ([ms * 0.99, ms * 1.01] if ms else None)}
    record(run / name, "06_benchmark", "h", **kw)


def test_overhead_table_flags_over_budget(tmp_path):
    _scenario(tmp_path, "baseline", 10.0)
    _scenario(tmp_path, "sdpa_math", 11.5)
    _scenario(tmp_path, "upcast_fp32", 13.0)
    rows, note = bench.scenario_overhead(tmp_path / "upcast_fp32")
    by = {r["scenario"]: r for r in rows}
    assert by["baseline"]["within budget"] == "baseline"
    assert by["sdpa_math"]["within budget"] == "ok" and by["sdpa_math"]["overhead %"] == pytest.approx(15.0)
    assert by["upcast_fp32"]["within budget"] == "OVER BUDGET"
    assert by["upcast_fp32"]["bound low"] == pytest.approx(13 * 0.99 / 10.1)
    assert "20%" in note
    shown = view.overhead_table(tmp_path / "upcast_fp32").set_index("scenario")
    assert shown.loc["sdpa_math", "overhead"] == "+15.0%"


def test_overhead_with_one_scenario_says_so(tmp_path):
    _scenario(tmp_path, "baseline", 10.0)
    rows, note = overhead.scenario_overhead(tmp_path / "baseline")
    assert rows == [] and "only one scenario" in note
    assert view.overhead_table(tmp_path / "baseline") is None and "only one scenario" in view.overhead_note(
        tmp_path / "baseline")


def test_overhead_without_baseline_scenario(tmp_path):
    _scenario(tmp_path, "a", 10.0)
    _scenario(tmp_path, "b", 12.0)
    rows, note = overhead.scenario_overhead(tmp_path / "a")
    assert rows == [] and "'baseline'" in note


# ------------------------------------------------------------------------------ the real child


MASK_KERNELS = '''
import torch.nn.functional as F

def needs_mask(q, k, v, attn_mask=None, is_causal=False, scale=None):
    if attn_mask is None:
        raise AssertionError("timed without the workload's mask")
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)

def refuses_mask(q, k, v, attn_mask=None, is_causal=False, scale=None):
    if attn_mask is not None:
        raise NotImplementedError("refuses_mask has no attn_mask support")
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
'''


def test_benchmark_child_end_to_end_on_cpu(tmp_path, monkeypatch):
    (tmp_path / "maskkernels.py").write_text(MASK_KERNELS)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{Path(bench.__file__).resolve().parents[2]}")   # lib: gpulab may not be installed
    needs, refuses = "maskkernels:needs_mask", "maskkernels:refuses_mask"
    gate = {n: {"passed": True, "reason": "", "worst_ratio": 1.0, "cases": 4}
            for n in ("sdpa_math", "sdpa_flash", needs, refuses)}
    (tmp_path / GATE_FILE).write_text(json.dumps(gate))
    spec = _spec(candidates=["math", "flash", needs, refuses], out_dir=tmp_path)
    assert spec.gate is not None and spec.workload is not None
    run = bench.run(spec, tmp_path)
    assert run.status == "ok", (run.detail, Path(run.log).read_text()[-2000:])
    res = run.result
    assert res["done"] and res["decision"]["provisional"] is False
    assert res["spec"]["call"] == asdict(_cfg().attention("cpu")) and "key-padding mask" in res["call"]
    d = decision.decision_from_dict(res["decision"])
    assert d.champion in spec.candidates and d.baseline == spec.baseline
    # the user kernel that refuses a mask is reported, never timed (not on the call, not in the sweep)
    assert "no attn_mask support" in res["unsupported"][refuses] and d.row(refuses).status == "unsupported"
    assert refuses not in res["vs_baseline"] and refuses not in {r["candidate"] for r in res["sweep"]}
    # the one that insists on the mask was timed: it got the workload's mask every call
    assert needs in res["vs_baseline"] and needs not in res["errors"]
    # flash on this CPU build with the padding mask: the tables say what happened, whichever it was
    rows = bench.candidates_table(res)  # indexed by candidate
    flash = rows.loc["sdpa_flash", "on the workload's call"]
    if "sdpa_flash" in res["unsupported"]:
        assert flash.startswith("not supported") and "sdpa_flash" not in res["vs_baseline"]
        assert d.row("sdpa_flash").status == "unsupported"
    else:
        assert flash == "timed" and "sdpa_flash" in res["vs_baseline"]
        assert d.row("sdpa_flash").status in ("champion", "slower", "tie", "overtaken", "suspect")
    comps = bench.comparisons(res)
    assert all(c.baseline.name == spec.baseline and c.candidate.n >= 2 for c in comps.values())
    assert {r["candidate"] for r in res["sweep"]} == set(comps) | {spec.baseline}
    assert all(r["tflops"] > 0 and r["masked_keys"] == spec.call.padded_keys for r in res["sweep"])
    assert res["workload"]["median_ms"] > 0
    assert res["roof"]["source"].startswith("measured")
    headline, metrics = bench.finding(run)
    assert d.champion in headline and metrics["workload_ms"] == res["workload"]["median_ms"]
    assert set(metrics["candidates"]) <= set(gate)
    assert not any(re.search(r"\.0*[1-9]\d{4,}", str(v)) for v in rows.to_numpy().ravel())  # no 15-digit floats
    assert (tmp_path / "benchmark_sweep.csv").exists() and (tmp_path / "benchmark_vs_baseline.csv").exists()


def test_benchmark_child_does_not_time_what_failed_the_oracle(tmp_path):
    gate = {"sdpa_math": {"passed": True, "reason": "ok"},
            "sdpa_flash": {"passed": False, "reason": "wrong scale: 1/d instead of 1/sqrt(d)"}}
    (tmp_path / GATE_FILE).write_text(json.dumps(gate))
    run = bench.run(_spec(seq_lens=[32], out_dir=tmp_path), tmp_path)
    assert run.status == "ok", run.detail
    d = decision.decision_from_dict(run.result["decision"])
    failed = "sdpa_flash"  # registry names: what 05 writes in its gate
    assert d.row(failed).status == "excluded" and "1/sqrt(d)" in d.row(failed).label
    assert d.champion == d.baseline
    if failed not in run.result["unsupported"]:
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
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    '''))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{Path(bench.__file__).resolve().parents[2]}")   # lib: gpulab may not be installed
    spec = _spec(candidates=["math", "hangs_later:attention"], seq_lens=[], max_time_s=0.2)
    run = bench.run(spec, tmp_path, timeout_s=15)
    assert run.status == "hang", run.detail
    assert run.result["stage"] in ("resolved",) and "decision" not in run.result
    assert run.elapsed_s < 25
    head, metrics = bench.finding(run)
    assert "hang" in head


def test_the_worker_times_the_recorder_after_the_kernels_and_06_reads_its_figures(tmp_path):
    """06's recorder cost in the benchmark's own process, after its timing: no child of its own (one torch import
    fewer), the figures in the file the child wrote, read as the child's were."""
    from gpulab.trace import followups
    cfg = _cfg(layers=2)
    plan = followups.recorder_plan(cfg, tmp_path, mode="auto", repeats=2)
    assert plan["modes"] and plan["json"].endswith("overhead_raw.json")
    run = bench.run(_spec(cfg, candidates=["math"], seq_lens=[], max_time_s=0.05, recorder=plan), tmp_path)
    assert run.status == "ok" and run.result["done"], (run.detail, Path(run.log).read_text()[-2000:])
    assert run.recorder["status"] == "ok" and run.result["stage"] == "recorder timed"
    ov, note = followups.recorder_cost(cfg, tmp_path, mode="auto", repeats=2, timed=run.recorder)
    assert note == "" and {"none", "passthrough", *plan["modes"]} <= set(ov["variant"])
    assert (ov["ops"] > 50).all() and (ov["median_s"] > 0).all()
    assert not (tmp_path / "overhead.stderr.txt").exists()   # no child of its own
    assert (tmp_path / "overhead.csv").exists()
    # a user program: nothing to plan, and 02's unfinished run: nothing either
    assert followups.recorder_plan(WorkloadConfig(workload="script:x.py"), tmp_path, mode="auto", repeats=2) is None
    record(tmp_path / "hung", "02_instrument", "hang", status="hang")
    assert followups.recorder_plan(cfg, tmp_path / "hung", mode="auto", repeats=2) is None


def test_where_the_benchmark_imported_dynamo_the_recorder_is_timed_in_a_child_of_its_own(tmp_path, monkeypatch):
    """A candidate that imports torch._dynamo (a compiled kernel's module) makes the process one no recorded run
    is: the modes would be timed wrapped. The worker leaves it, and 06's own child times it."""
    from gpulab.trace import followups
    (tmp_path / "dynkernel.py").write_text("import torch._dynamo\nimport torch.nn.functional as F\n"
                                           "def attention(q, k, v, attn_mask=None, is_causal=False, scale=None):\n"
                                           "    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{Path(bench.__file__).resolve().parents[2]}")
    cfg = _cfg()
    plan = followups.recorder_plan(cfg, tmp_path, mode="auto", repeats=1)
    run = bench.run(_spec(cfg, candidates=["dynkernel:attention"], seq_lens=[], max_time_s=0.05, recorder=plan),
                    tmp_path)
    assert run.status == "ok", (run.detail, Path(run.log).read_text()[-2000:])
    assert run.recorder["status"] == "not_here" and "torch._dynamo" in run.recorder["why"]
    assert not Path(plan["json"]).exists()
    ov, note = followups.recorder_cost(cfg, tmp_path, mode="auto", repeats=1, stall_s=30.0, timed=run.recorder)
    assert note == "" and "auto" in set(ov["variant"]) and (tmp_path / "overhead.stderr.txt").exists()


def test_a_recorder_timing_that_fails_in_the_worker_keeps_the_benchmark_and_says_why(tmp_path):
    from gpulab.trace import followups
    cfg = _cfg()
    (tmp_path / "a_file").write_text("")
    plan = {**followups.recorder_plan(cfg, tmp_path, mode="auto", repeats=1),
            "json": str(tmp_path / "a_file" / "overhead_raw.json")}   # under a file: it cannot be written
    run = bench.run(_spec(cfg, candidates=["math"], seq_lens=[], max_time_s=0.05, recorder=plan), tmp_path)
    assert run.status == "ok" and "decision" in run.result, run.detail
    assert run.recorder["status"] == "error" and run.recorder["why"]
    ov, note = followups.recorder_cost(cfg, tmp_path, mode="auto", repeats=1, timed=run.recorder)
    assert ov is None and note.startswith("**Recording cost not measured:** its timing in the benchmark worker "
                                          "ended as error (")


@pytest.mark.parametrize("kw, match", [
    (dict(candidates="math"), "candidates"), (dict(seq_lens=[0]), "seq_lens"), (dict(delta=2.0), "delta"),
    (dict(max_time_s=0), "max_time_s"), (dict(baseline=""), "baseline"),
])
def test_bad_notebook_parameters_name_the_value(kw, match):
    with pytest.raises(ValueError, match=match):
        _spec(**kw)


def test_bad_dtype_names_the_choices():
    with pytest.raises(ValueError, match="dtype"):
        _spec(_cfg(dtype="float64"))


def test_spec_round_trips_and_deadline_grows_with_work():
    s = _spec()
    assert child.spec_from_dict(json.loads(json.dumps(asdict(s)))) == s
    assert _spec(seq_lens=[32, 64, 128]).deadline_s() > s.deadline_s() > 0
    assert math.isfinite(s.deadline_s())
