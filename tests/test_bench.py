"""gpulab.bench (measure, compare), gpulab.stats and gpulab.bench.flops: real timings decide, the
statistics are right, the caps hold."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

from gpulab import bench
from gpulab import stats
from gpulab.bench import flops


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: on a shared 2-core box a second thread waits on the scheduler and adds
    millisecond stalls that have nothing to do with the work being timed."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def matmul_loop(n: int, size: int = 96):
    a = torch.randn(size, size)

    def fn():
        x = a
        for _ in range(n):
            x = a @ a
        return x

    return fn


# ------------------------------------------------------------------------------------ real timings


def test_self_compare_is_a_tie():
    fn = matmul_loop(8)
    c = bench.compare(fn, fn, device="cpu", max_time_s=1.5, min_time_s=0.3)
    assert c.verdict == "tie", c.summary()
    lo, hi = c.ratio_ci
    assert lo <= 1.0 + c.delta and hi >= 1.0 - c.delta
    assert c.candidate.n == c.baseline.n >= 10


@pytest.mark.parametrize("work", [4, 16])
def test_twice_the_work_is_slower_with_ci_excluding_one(work):
    c = bench.compare(matmul_loop(2 * work), matmul_loop(work), names=("2n", "n"), device="cpu",
                      max_time_s=1.5, min_time_s=0.3)
    assert c.verdict == "slower", c.summary()
    assert c.ratio_ci[0] > 1.0 + c.delta
    assert 1.5 < c.ratio < 2.6, c.ratio
    assert c.p_value < 1e-3
    assert c.hedges_g > 0  # reported (candidate mean is larger), but not what decided


def test_half_the_work_is_faster():
    c = bench.compare(matmul_loop(4), matmul_loop(8), device="cpu", max_time_s=1.0, min_time_s=0.2)
    assert c.verdict == "faster", c.summary()
    assert c.ratio_ci[1] < 1.0 - c.delta


@pytest.mark.parametrize("max_time_s", [0.2, 0.5])
def test_max_time_cap_is_respected(max_time_s):
    def slow():
        time.sleep(0.02)

    m = bench.measure(slow, device="cpu", max_time_s=max_time_s, min_time_s=10.0, min_samples=1000)
    assert m.stopped == "max_time"
    # at most one call past the deadline (a call, not a fixed 30 ms: a loaded host oversleeps 0.02 s by more)
    assert m.timed_s <= max_time_s + max(m.samples_ms) / 1e3 + 0.005, (m.timed_s, max(m.samples_ms))
    assert m.n >= 2
    assert 19.0 < m.median_ms < 40.0


@pytest.mark.parametrize("max_samples", [12, 50])
def test_max_samples_cap_is_respected(max_samples):
    m = bench.measure(matmul_loop(1, 32), device="cpu", max_samples=max_samples, min_samples=10,
                      min_time_s=5.0, max_time_s=5.0)
    assert m.n == max_samples and m.stopped == "max_samples"
    assert len(m.samples_ms) == max_samples


def test_min_samples_and_min_time_before_stopping():
    m = bench.measure(lambda: time.sleep(0.001), device="cpu", min_samples=40, min_time_s=0.15, max_time_s=3.0,
                      iqr_rel=10.0)  # "stable" at once: only the minimums hold it back
    assert m.stopped == "stable"
    assert m.n >= 40 and m.sampling_s >= 0.15


def test_measurement_fields_and_ci_contain_median():
    m = bench.measure(matmul_loop(2), name="mm", device="cpu", max_time_s=0.5)
    assert m.name == "mm" and m.timer == "perf_counter" and m.device == "cpu"
    assert m.ci_ms[0] <= m.median_ms <= m.ci_ms[1]
    assert m.median_ms == pytest.approx(float(np.median(m.samples_ms)))
    assert m.warmup_calls >= 1 and m.wall_s >= m.timed_s
    with pytest.raises(Exception):
        m.median_ms = 0  # frozen


def test_cuda_only_options_are_refused_on_cpu():
    with pytest.raises(ValueError, match="graph_calls"):
        bench.measure(lambda: None, device="cpu", graph_calls=10)
    with pytest.raises(ValueError, match="cuda_event"):
        bench.measure(lambda: None, device="cpu", timer="cuda_event")


@pytest.mark.parametrize("bad, match", [({"timer": "wall"}, "auto, cuda_event, perf_counter"),
                                        ({"min_samples": 20, "max_samples": 10}, "min_samples"),
                                        ({"confidence": 1.5}, "confidence"),
                                        ({"max_time_s": 0}, "max_time_s")])
def test_bad_config_names_the_value(bad, match):
    with pytest.raises(ValueError, match=match):
        bench.BenchConfig(**bad)


def test_unknown_override_lists_valid_fields():
    with pytest.raises(TypeError, match="max_time_s"):
        bench.measure(lambda: None, device="cpu", max_tim_s=1)


# ------------------------------------------------------------------------- statistics (synthetic)


@pytest.mark.parametrize("dist, true_median", [
    ("lognormal", 1.0),              # lognormal(0, 0.3): median exp(0) = 1
    ("exponential", math.log(2)),    # exponential(1): median ln 2, skewed like latency tails
])
def test_bootstrap_ci_covers_known_median_at_nominal_rate(dist, true_median):
    rng = np.random.default_rng(1234)
    trials, hits = 150, 0
    for t in range(trials):
        x = rng.lognormal(0.0, 0.3, 60) if dist == "lognormal" else rng.exponential(1.0, 60)
        (lo, hi), method = stats.median_ci(x, confidence=0.95, n_resamples=999, seed=t)
        assert method == "BCa"
        hits += lo <= true_median <= hi
    rate = hits / trials
    assert 0.88 <= rate <= 0.995, rate  # nominal 0.95; binomial sd over 150 trials ~0.018


def test_ratio_ci_covers_known_ratio():
    rng = np.random.default_rng(7)
    trials, hits = 100, 0
    for t in range(trials):
        a = rng.lognormal(math.log(1.3), 0.2, 50)
        b = rng.lognormal(0.0, 0.2, 50)
        (lo, hi), method = stats.ratio_ci(a, b, n_resamples=999, seed=t)
        assert method == "BCa"
        hits += lo <= 1.3 <= hi
    assert 0.86 <= hits / trials <= 1.0, hits


def test_median_ci_degenerate_inputs():
    assert stats.median_ci([2.0, 2.0, 2.0, 2.0]) == ((2.0, 2.0), "none")
    (lo, hi), method = stats.median_ci([1.0, 2.0])
    assert method == "none" and math.isnan(lo)
    (lo, hi), method = stats.median_ci([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.1])  # ties: BCa may fail
    assert method in ("BCa", "percentile") and lo <= 1.0 <= hi


@pytest.mark.parametrize("ci, delta, verdict", [
    ((0.90, 0.95), 0.01, "faster"),
    ((0.90, 0.995), 0.01, "tie"),      # crosses 1 - delta
    ((0.995, 1.005), 0.01, "tie"),
    ((1.005, 1.2), 0.01, "tie"),       # crosses 1 + delta
    ((1.02, 1.2), 0.01, "slower"),
    ((1.02, 1.2), 0.05, "tie"),
    ((float("nan"), float("nan")), 0.01, "tie"),
])
def test_decide(ci, delta, verdict):
    assert stats.decide(ci, delta) == verdict


def test_decide_bad_delta():
    with pytest.raises(ValueError, match="delta"):
        stats.decide((0.9, 0.95), delta=1.5)


def test_hedges_g_known_value():
    a = np.array([2.0, 3.0, 4.0, 5.0, 6.0])
    b = a - 1.0
    sd = float(np.std(a, ddof=1))
    expected = 1.0 / sd * (1 - 3 / (4 * 10 - 9))
    assert stats.hedges_g(a, b) == pytest.approx(expected)
    assert stats.hedges_g(b, a) == pytest.approx(-expected)


def test_comparison_from_synthetic_samples():
    rng = np.random.default_rng(3)
    fast = bench.summarize("fast", rng.normal(1.0, 0.01, 200))
    slow = bench.summarize("slow", rng.normal(1.5, 0.01, 200))
    c = bench.comparison_from(fast, slow)
    assert c.verdict == "faster" and c.ratio == pytest.approx(1 / 1.5, rel=0.01)
    assert c.p_value < 1e-10
    same = bench.comparison_from(fast, bench.summarize("again", rng.normal(1.0, 0.01, 200)))
    assert same.verdict == "tie"


def test_the_effect_size_agrees_with_the_ratio_when_a_few_samples_were_preempted():
    """Twice the work, and two baseline samples held up 60x by a loaded machine: the means would say the
    candidate is faster; the effect size (on log-times, the ratio's scale) says what the ratio does."""
    rng = np.random.default_rng(5)
    base = rng.normal(1.0, 0.05, 30)
    base[[7, 19]] = 60.0
    c = bench.comparison_from(bench.summarize("2n", rng.normal(2.0, 0.1, 30)), bench.summarize("n", base))
    assert c.verdict == "slower" and c.ratio == pytest.approx(2.0, rel=0.1)
    assert stats.hedges_g(c.candidate.samples_ms, base) < 0 < c.hedges_g, c.hedges_g


# ----------------------------------------------------------------------------------- throttling


@pytest.mark.parametrize("clocks, frac, flags", [
    ([1980, 1980, 1400, 1980], 0.75, [False, False, True, False]),  # 1400 < 0.75 * 1980 = 1485
    ([1980, 1500, 1485, 1484], 0.75, [False, False, False, True]),
    ([1000, None, 700], 0.75, [False, False, True]),                 # a failed NVML read is not a flag
    ([None, None], 0.75, [False, False]),
    ([1000, 900], 0.95, [False, True]),
])
def test_flag_throttled(clocks, frac, flags):
    assert list(stats.flag_throttled(clocks, frac)) == flags


def test_throttled_samples_are_kept_but_left_out_of_the_median():
    samples = [1.0] * 20 + [3.0] * 5          # the slow ones were taken at a low clock
    clocks = [1980.0] * 20 + [900.0] * 5
    m = bench.summarize("k", samples, clocks)
    assert m.n == 25 and m.n_throttled == 5 and len(m.samples_ms) == 25
    assert m.median_ms == 1.0 and m.mean_ms == 1.0
    unflagged = bench.summarize("k", samples)
    assert unflagged.n_throttled == 0 and unflagged.mean_ms > 1.0


def test_clock_count_must_match_samples():
    with pytest.raises(ValueError, match="clock readings"):
        bench.summarize("k", [1.0, 2.0, 3.0], [1000.0, 1000.0])


@pytest.mark.parametrize("samples, stable", [([1.0] * 9 + [1.001], True), ([1.0, 2.0] * 10, False)])
def test_is_stable(samples, stable):
    assert stats.is_stable(samples, iqr_rel=0.01, std_rel=0.005) is stable


_RNG = np.random.default_rng(0)


@pytest.mark.parametrize("samples, precise", [
    (_RNG.normal(100.0, 3.0, 500), True),     # 3% spread per sample, 500 samples: the median is within ~0.7%
    (_RNG.normal(100.0, 10.0, 50), False),    # 10% spread, 50 samples: its CI is ~7% wide
    ([20.0, 20.5] * 300, False),              # event-timer quantization split at the median: never pinned
    ([5.0, 5.0], False),                      # too few samples to bound the median
])
def test_median_precise(samples, precise):
    assert stats.median_precise(samples, ci_rel=0.01) is precise


def test_sampling_stops_once_the_median_is_pinned():
    """A spread that never gets under the per-sample rules still stops: on the median's CI, not the cap."""
    rng = np.random.default_rng(1)
    spin = matmul_loop(1, 16)

    def noisy():
        for _ in range(int(rng.integers(1, 4))):  # 1-3 calls: a ~50% spread per sample
            spin()

    m = bench.measure(noisy, device="cpu", iqr_rel=0.0, std_rel=0.0, ci_rel=0.25, min_time_s=0.05,
                      max_time_s=30.0, max_samples=100000)
    assert m.stopped == "stable" and m.timed_s < 30.0
    assert stats.median_precise(m.samples_ms, ci_rel=0.25) and not stats.is_stable(m.samples_ms, 0.05, 0.05)



@pytest.mark.parametrize("a, b, delta, clear", [
    (_RNG.normal(50.0, 5.0, 200), _RNG.normal(100.0, 10.0, 200), 0.01, True),    # half the time: faster
    (_RNG.normal(200.0, 20.0, 200), _RNG.normal(100.0, 10.0, 200), 0.01, True),  # twice: slower
    (_RNG.normal(100.0, 10.0, 200), _RNG.normal(100.0, 10.0, 200), 0.01, False),  # the same: a tie waits
    (_RNG.normal(98.0, 10.0, 200), _RNG.normal(100.0, 10.0, 200), 0.01, False),   # 2% apart, 10% spread: unsure
    (_RNG.normal(50.0, 5.0, 200), _RNG.normal(100.0, 10.0, 200), 0.6, False),     # inside a 60% tie zone
    ([1.0, 1.0], [2.0, 2.0], 0.01, False),                                         # too few to bound a median
])
def test_a_comparison_is_apart_only_beyond_doubt(a, b, delta, clear):
    assert stats.apart(a, b, delta) is clear


def test_a_comparison_stops_sampling_once_its_verdict_is_clear_and_a_tie_samples_on():
    """Half the work against the whole stops long before its cap, with the verdict the cap gives; a kernel
    against itself does not stop on that rule (it may still stop once both medians are pinned)."""
    fast, slow = matmul_loop(4), matmul_loop(8)
    c = bench.compare(fast, slow, device="cpu", max_time_s=20.0, min_time_s=0.1, iqr_rel=0.0, std_rel=0.0,
                      ci_rel=0.0)
    assert c.candidate.stopped == "decided" and c.verdict == "faster" and c.candidate.timed_s < 10.0, c.summary()
    same = bench.compare(fast, fast, device="cpu", max_time_s=0.5, min_time_s=0.1, iqr_rel=0.0, std_rel=0.0,
                         ci_rel=0.0)
    assert same.candidate.stopped in ("max_time", "max_samples") and same.verdict == "tie", same.summary()


# ---------------------------------------------------------------------------------------- flops


@pytest.mark.parametrize("causal, mode, factor", [(False, "fwd", 1.0), (True, "fwd", 0.5), (False, "bwd", 2.5),
                                                  (True, "fwd_bwd", 1.75)])
def test_attention_flops(causal, mode, factor):
    b, h, sq, sk, d = 2, 3, 5, 7, 11
    assert flops.attention_flops(b, h, sq, sk, d, causal=causal, mode=mode) == 4 * b * h * sq * sk * d * factor


def test_anchor_figures():
    # ANCHORS: B=4,H=16,S=4096,D=128 non-causal forward; cuDNN SDPA measured at 585 TFLOP/s on an H100
    f = flops.attention_flops(4, 16, 4096, 4096, 128)
    assert f == pytest.approx(5.497558e11, rel=1e-6)
    ms = f / 585e12 * 1e3
    assert flops.tflops(f, ms) == pytest.approx(585.0)
    assert flops.matmul_flops(8192, 8192, 8192) == 2 * 8192 ** 3
    assert flops.attention_bytes(1, 1, 4, 4, 2, dtype="bfloat16") == 2 * (2 * 8 + 2 * 8)


@pytest.mark.parametrize("bad", [dict(mode="forward"), dict(head_dim=0)])
def test_flops_bad_input(bad):
    kw = dict(batch=1, heads=1, seq_q=1, seq_k=1, head_dim=1, **{k: v for k, v in bad.items() if k != "head_dim"})
    if "head_dim" in bad:
        kw["head_dim"] = bad["head_dim"]
    with pytest.raises(ValueError):
        flops.attention_flops(**kw)


@pytest.mark.parametrize("name, peak_name, bf16", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.0), ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),
    ("NVIDIA H100 NVL", "H100 NVL", 835.0), ("NVIDIA H200", "H200", 989.0),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM", 312.0), ("NVIDIA L4", "L4", 121.0), ("NVIDIA L40S", "L40S", 362.0),
    ("NVIDIA B200", "B200", 2250.0), ("NVIDIA GB10", "GB10 (DGX Spark)", None),
])
def test_peaks_table(name, peak_name, bf16):
    p = flops.peak_for(name)
    assert p is not None and p.name == peak_name and p.bf16_tflops == bf16 and p.source
    roof = flops.table_roof(name, "bfloat16")
    assert (roof is None) == (bf16 is None)


def test_unknown_device_has_no_table_roof():
    assert flops.peak_for("Some Future GPU") is None
    assert flops.table_roof("Some Future GPU", "bfloat16") is None


def test_figures_and_roofline():
    roof = flops.Roof("NVIDIA H100 80GB HBM3", "bfloat16", 989.0, 3350.0, "table")
    f = flops.attention_flops(4, 16, 4096, 4096, 128)
    b = flops.attention_bytes(4, 16, 4096, 4096, 128)
    fig = flops.figures(f, b, f / 585e12 * 1e3, roof)
    assert fig["tflops"] == pytest.approx(585.0) and fig["pct_peak"] == pytest.approx(100 * 585 / 989)
    assert fig["bound"] == "compute"
    small = flops.figures(1e6, 1e6, 0.001, roof)  # 1 FLOP/byte: far left of the ridge
    assert small["bound"] == "memory"


def test_measured_roof_on_cpu():
    roof = flops.device_roof("cpu", "float32", max_time_s=0.3)
    assert roof.source.startswith("measured") and roof.tflops > 0


# ------------------------------------------------------------------------------------------ layout


def test_contract_names_live_on_the_package():
    """DESIGN.md's contract: gpulab.bench.measure(fn) and gpulab.bench.compare(a, b) are functions."""
    assert callable(bench.measure) and callable(bench.compare)
    assert bench.Measurement.__dataclass_fields__.keys() >= {"samples_ms", "median_ms", "ci_ms"}
    assert set(stats.VERDICTS) == {"faster", "slower", "tie"}


# ------------------------------------------------------------ gpulab.trace.userbench (recorder cost as users run it)

def _user_run(rnd: int, wall_s: float, cpu_s: float, ops: int = 1000) -> dict:
    """One run's result as the benchmark program writes it (one block per list entry)."""
    return {"round": rnd, "tiny_ops": {"unit_s": [wall_s, wall_s], "cpu_s": [cpu_s], "ops_per_unit": ops}}


def test_user_run_summary_ratios_from_medians_and_per_round():
    from gpulab.trace import userbench as tbench

    raw = {"none": [_user_run(0, 1.0, 0.5), _user_run(1, 1.2, 0.5), _user_run(2, 1.0, 0.5)],
           "passthrough": [_user_run(0, 1.1, 0.6), _user_run(1, 1.3, 0.6), _user_run(2, 1.1, 0.6)],
           "ops": [_user_run(0, 1.15, 0.65), _user_run(1, 1.3, 0.65), _user_run(2, 1.3, 0.65),
                   {"round": 3}]}  # a run without this workload's block is left out
    rows = {r.variant: r for r in tbench.summarize(raw, "tiny_ops", {"ops": "the ring"})}
    ops, none = rows["ops"], rows["none"]
    assert (ops.workload, ops.runs, ops.ops_per_unit, ops.note) == ("tiny_ops", 3, 1000, "the ring")
    assert ops.us_per_op == pytest.approx(1300) and ops.over_none_us == pytest.approx(300)
    assert ops.ratio == pytest.approx(3.0)             # (1300 - 1000) / (1100 - 1000), from the medians
    assert ops.ratio_per_round == pytest.approx(1.5)   # rounds: 1.5, 1.0, 3.0
    assert ops.cpu_us_per_op == pytest.approx(650) and ops.cpu_ratio == pytest.approx(1.5)
    assert ops.samples_us == pytest.approx((1150, 1300, 1300))
    assert none.ratio is None and none.ratio_per_round is None and none.cpu_ratio is None
    assert none.over_none_us == 0 and rows["passthrough"].ratio == pytest.approx(1.0)
    assert tbench.summarize({"ops": raw["ops"]}, "tiny_ops") == []          # no baseline: nothing to say
    assert tbench.summarize(raw, "transformer_step") == []                  # no run has that block


def test_variant_commands_and_choice():
    import sys

    from gpulab.trace import userbench as tbench
    from gpulab.trace.run import bootstrap_command

    ops, none = tbench.Variant("ops", mode="ops"), tbench.Variant("none", wrapper="none")
    program = ["prog.py", "res.json", "--tiny", "5"]
    assert tbench.variant_command(ops, program, "x.log") == [
        sys.executable, "-m", "gpulab.trace", "--log", "x.log", "--mode", "ops", "--", *program]
    assert tbench.variant_command(ops, program, "x.log") == bootstrap_command(program, "x.log", "ops")
    assert tbench.variant_command(none, program, "x.log") == [
        sys.executable, "-m", "gpulab.trace.bench", "wrap", "--variant", "none", "--jsonl", "x.log", "--", *program]
    std = tbench.standard_variants("cpu")
    assert [v.name for v in tbench.pick_variants(std, "ops")] == ["none", "ops"]   # the baseline is always kept
    assert {"gpu_events", "sync"}.isdisjoint(v.name for v in std)
    with pytest.raises(ValueError, match="variants sync are not valid here"):
        tbench.pick_variants(std, "ops,sync")


def test_benchmark_text_table_aligns_and_dashes_missing_values():
    from gpulab.trace import userbench as tbench

    cols = (("variant", "variant", 8, "{}"), ("ms", "ms", 7, "{:.2f}"), ("goal", "goal", 6, "{:.0f}%"))
    assert tbench.text_table([{"variant": "ops", "ms": 1.234, "goal": 3.0},
                              {"variant": "none", "ms": 10.0, "goal": None}], cols) == [
        "  variant      ms  goal", "  ops        1.23    3%", "  none      10.00     -"]


def test_06s_kernel_reads_and_draws_without_loading_torch():
    """06's kernel only reads the worker's results and draws them: torch's start-up (seconds on a small CPU) is
    the worker's alone."""
    import subprocess
    import sys
    code = ("import sys, gpulab.bench, gpulab.bench.view, gpulab.trace.followups, gpulab.trace.analysis; "
            "gpulab.bench.finding; print('torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "False", p.stderr
