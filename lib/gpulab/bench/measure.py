"""Timing with confidence: how long a kernel takes, and whether one is really faster than another.

A loop of 100 calls around time.time() mixes launch overhead, warm caches and clock drift into one number
with no error bar. Here every call is timed on its own (CUDA events on a GPU, perf_counter on the CPU), L2 is
flushed before each timed GPU call (as triton's do_bench does), sampling stops when the spread is small
enough, the median is pinned (its CI within ci_rel of it) or a hard cap is hit, raw samples are kept, and
"faster" is decided from a bootstrap confidence interval of the ratio of medians (`gpulab.stats`).

torch is imported where a sample is taken: notebook 06's kernel reads and draws results and never pays its
start-up (the benchmark worker times).
"""
from __future__ import annotations

import ctypes
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np

from gpulab import device as _device
from gpulab.stats import (apart, check_delta, decide, flag_throttled, hedges_g, is_stable, mann_whitney_p,
                                median_ci, median_precise, ratio_ci)

TIMERS = ("auto", "cuda_event", "perf_counter")
L2_FLUSH_MIN_BYTES = 256 * 1024 * 1024  # triton do_bench / KernelBench flush buffer


@dataclass(frozen=True)
class BenchConfig:
    """How long and how hard to sample. Defaults follow do_bench (25 ms warm-up, ~100 ms of samples)
    and nvbench (>= 10 samples, stop at 0.5% relative std); IQR/median is adaptive_autorange's rule."""

    warmup_s: float = 0.025        # warm-up by time (at least one call)
    min_samples: int = 10
    max_samples: int = 1000         # BCa's jackknife costs n^2: 1000 samples keep the CI at ~0.1-0.2 s
    min_time_s: float = 0.1        # keep sampling at least this long (sum of sampling wall time)
    max_time_s: float = 2.0        # hard cap for the whole measurement, warm-up included
    iqr_rel: float = 0.01          # stop when IQR/median < this ...
    std_rel: float = 0.005         # ... or std/mean < this ...
    ci_rel: float = 0.01           # ... or the median's 95% CI is narrower than this fraction of it (0: off)
    decide_early: bool = True      # a comparison also stops once its verdict is beyond doubt (gpulab.stats.apart)
    flush_l2: bool = True          # GPU only: zero a buffer >= 2x L2 (and >= 256 MB) before each timed call
    graph_calls: int = 0           # GPU only: >0 times a CUDA graph of this many calls per sample
    hold_gpu: bool = True          # GPU only: nvbench's blocking kernel - hold the GPU while the host queues a
                                   # batch, so a sample is GPU time, not the host's launch overhead
    throttle_frac: float = 0.75    # nvbench: a sample whose SM clock < 75% of the run's max is throttled
    confidence: float = 0.95
    n_resamples: int = 2000
    seed: int = 0
    timer: str = "auto"            # choices: auto, cuda_event, perf_counter

    def __post_init__(self):
        if self.timer not in TIMERS:
            raise ValueError(f"timer={self.timer!r} is not valid; choose one of {', '.join(TIMERS)}")
        for name in ("min_samples", "max_samples", "n_resamples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 1")
        if self.min_samples > self.max_samples:
            raise ValueError(f"min_samples={self.min_samples} > max_samples={self.max_samples}")
        if not self.max_time_s > 0:
            raise ValueError(f"max_time_s={self.max_time_s!r} must be > 0")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence={self.confidence!r} must lie in (0, 1)")
        if not self.ci_rel >= 0:
            raise ValueError(f"ci_rel={self.ci_rel!r} must be >= 0 (0: stop on the spread rules only)")
        if self.graph_calls < 0:
            raise ValueError(f"graph_calls={self.graph_calls!r} must be >= 0 (0 = no CUDA graph)")


@dataclass(frozen=True)
class Measurement:
    """Raw samples and their summary. median/CI use only the samples not flagged as throttled."""

    name: str
    samples_ms: tuple[float, ...]
    median_ms: float
    ci_ms: tuple[float, float]
    confidence: float
    ci_method: str                 # BCa | percentile | none (fewer than 3 samples or all equal)
    mean_ms: float
    std_ms: float
    iqr_ms: float
    n: int
    throttled: tuple[bool, ...]
    clocks_mhz: tuple[float, ...]  # SM clock per sample (NVML), empty when unavailable
    stopped: str                   # stable | decided (a comparison's verdict is clear) | max_time | max_samples
    timer: str                     # cuda_event | cuda_graph | perf_counter
    device: str
    warmup_calls: int
    sampling_s: float              # time spent in timed samples' batches
    timed_s: float                 # warm-up + sampling: what max_time_s caps
    wall_s: float                  # everything, the bootstrap included
    l2_flush_bytes: int = 0
    graph_calls: int = 0

    @property
    def n_throttled(self) -> int:
        return int(sum(self.throttled))

    @property
    def rel_ci(self) -> float:
        """CI width over the median: the precision actually reached."""
        lo, hi = self.ci_ms
        return (hi - lo) / self.median_ms if self.median_ms else float("nan")

    def summary(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("samples_ms", "throttled", "clocks_mhz")}
        d.update(n_throttled=self.n_throttled, rel_ci=self.rel_ci)
        return d


@dataclass(frozen=True)
class Comparison:
    """candidate vs baseline; ratio = median(candidate)/median(baseline), < 1 means the candidate is faster."""

    candidate: Measurement
    baseline: Measurement
    ratio: float
    ratio_ci: tuple[float, float]
    confidence: float
    ci_method: str
    delta: float
    verdict: str                   # faster | slower | tie
    p_value: float                 # Mann-Whitney U, two-sided
    hedges_g: float                # reported, never the decision (tight timings make it huge)
    wall_s: float = 0.0            # the whole comparison, sampling and bootstraps included

    @property
    def speedup(self) -> float:
        return 1.0 / self.ratio if self.ratio else float("inf")

    def summary(self) -> dict[str, Any]:
        return {"candidate": self.candidate.name, "baseline": self.baseline.name, "ratio": self.ratio,
                "ratio_ci": list(self.ratio_ci), "ci_method": self.ci_method, "delta": self.delta,
                "verdict": self.verdict, "p_value": self.p_value, "hedges_g": self.hedges_g,
                "candidate_median_ms": self.candidate.median_ms, "baseline_median_ms": self.baseline.median_ms,
                "n": [self.candidate.n, self.baseline.n], "wall_s": self.wall_s}


# ------------------------------------------------------------------------------------ device helpers


class _NvmlClock:
    """SM clock through libnvidia-ml by ctypes (no pynvml needed); None where NVML is absent."""

    NVML_CLOCK_SM = 1

    def __init__(self, cuda_index: int):
        self.handle = None
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return
            idx = cuda_index
            try:
                import torch
                idx = int(torch.cuda._get_nvml_device_index(cuda_index))
            except Exception:  # noqa: BLE001 - older torch or no CUDA_VISIBLE_DEVICES mapping: plain index
                pass
            handle = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(idx), ctypes.byref(handle)) != 0:
                return
            self.lib, self.handle = lib, handle
        except OSError:
            self.handle = None

    def read(self) -> float | None:
        if self.handle is None:
            return None
        mhz = ctypes.c_uint()
        if self.lib.nvmlDeviceGetClockInfo(self.handle, self.NVML_CLOCK_SM, ctypes.byref(mhz)) != 0:
            return None
        return float(mhz.value)


def l2_bytes(device: str) -> int:
    """The device's L2 size in bytes (0 on CPU or when torch does not say)."""
    if not str(device).startswith("cuda"):
        return 0
    import torch
    props = torch.cuda.get_device_properties(torch.device(device))
    return int(getattr(props, "L2_cache_size", 0) or 0)


def flush_buffer_bytes(device: str) -> int:
    """At least twice the L2 and at least do_bench's 256 MB."""
    return max(2 * l2_bytes(device), L2_FLUSH_MIN_BYTES)


def _guess_device(device: str | None) -> str:
    return _device.resolve("auto" if device is None else device)


# --------------------------------------------------------------------------------------- sampling


@dataclass
class _Series:
    samples: list[float] = field(default_factory=list)
    clocks: list[float | None] = field(default_factory=list)
    warmup_calls: int = 0


class _Sampler:
    """Times one sample of each fn in turn (ABAB when there are two), in batches between syncs."""

    def __init__(self, fns: Sequence[Callable[[], Any]], cfg: BenchConfig, device: str,
                 decided: Callable[[list[float], list[float]], bool] | None = None):
        self.fns = list(fns)
        self.decided = decided   # two series: a rule that ends sampling once the comparison's verdict is clear
        self.cfg = cfg
        self.device = device
        self.cuda = device.startswith("cuda")
        timer = cfg.timer
        if timer == "auto":
            timer = "cuda_event" if self.cuda else "perf_counter"
        if timer == "cuda_event" and not self.cuda:
            raise ValueError(f"timer='cuda_event' needs a CUDA device, got device={device!r}; "
                             f"use timer='perf_counter' or 'auto'")
        if cfg.graph_calls and not self.cuda:
            raise ValueError(f"graph_calls={cfg.graph_calls} needs a CUDA device, got device={device!r}")
        self.timer = "cuda_graph" if (cfg.graph_calls and timer == "cuda_event") else timer
        self.cache = None
        self.flush_bytes = 0
        self.clock = None
        self.graphs: list[Any] = []
        self.host_per_iter = 1e-3  # seconds the host takes to queue one timed call; refined every batch
        if self.cuda:
            import torch
            if cfg.flush_l2:
                self.flush_bytes = flush_buffer_bytes(device)
                self.cache = torch.empty(self.flush_bytes, dtype=torch.int8, device=device)
            self.clock = _NvmlClock(torch.device(device).index or 0 if ":" in device else torch.cuda.current_device())

    def _sync(self):
        if self.cuda:
            import torch
            torch.cuda.synchronize(self.device)

    def _capture(self):
        """One CUDA graph per fn of `graph_calls` calls: removes launch overhead for microsecond kernels."""
        import torch
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for fn in self.fns:  # warm on a side stream, as torch.cuda.graphs recommends
                fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self._sync()
        for fn in self.fns:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(self.cfg.graph_calls):
                    fn()
            self.graphs.append(g)
        self._sync()

    def _call(self, i: int):
        if self.graphs:
            self.graphs[i].replay()
        else:
            self.fns[i]()

    def run(self) -> tuple[list[_Series], str, float, float, float]:
        cfg, t_begin = self.cfg, time.perf_counter()
        deadline = t_begin + cfg.max_time_s
        series = [_Series() for _ in self.fns]
        if self.timer == "cuda_graph":
            self._capture()
        # warm-up by time, capped at a quarter of the budget; also gives a per-call estimate
        warm_until = time.perf_counter() + min(cfg.warmup_s, 0.25 * cfg.max_time_s)
        calls = 0
        t0 = time.perf_counter()
        while True:
            for i in range(len(self.fns)):
                self._call(i)
                series[i].warmup_calls += 1
            calls += 1
            self._sync()
            if time.perf_counter() >= warm_until:
                break
        per_round = max((time.perf_counter() - t0) / calls, 1e-7)
        t_sampling = time.perf_counter()
        stopped = "max_time"
        look = cfg.min_samples   # the decided rule is asked after each doubling of the samples, not every batch
        while True:
            n = len(series[0].samples)
            now = time.perf_counter()
            if n >= cfg.max_samples:
                stopped = "max_samples"
                break
            if now >= deadline and n > 0:  # one sample even when the warm-up ate the budget
                stopped = "max_time"
                break
            if (n >= cfg.min_samples and now - t_sampling >= cfg.min_time_s
                    and all(is_stable(s.samples, cfg.iqr_rel, cfg.std_rel)
                            or median_precise(s.samples, cfg.ci_rel, cfg.confidence) for s in series)):
                stopped = "stable"
                break
            if (self.decided is not None and n >= look and now - t_sampling >= cfg.min_time_s):
                look = 2 * n
                if self.decided(series[0].samples, series[1].samples):
                    stopped = "decided"
                    break
            # a batch fills ~1/10 of the minimum time, never runs past the deadline or max_samples: near the
            # deadline it takes half of what is left, so calls that slow down (a loaded host) cannot carry a
            # batch sized on the faster ones past it; batches shrink to one call, the one that may end past it
            want = max(cfg.min_time_s / 10, 0.01)
            batch = int(min(want, max(deadline - now, 0.0) / 2) / per_round)
            # With the GPU held, a batch must fit the launch queue (~1024 entries) or the host blocks
            # and the device starves again once the spin ends.
            batch = max(1, min(batch, cfg.max_samples - n, 64 if (self.cuda and cfg.hold_gpu) else 1000))
            tb = time.perf_counter()
            self._batch(series, batch)
            per_round = max((time.perf_counter() - tb) / batch, 1e-7)
        end = time.perf_counter()
        return series, stopped, end - t_sampling, t_begin, end - t_begin

    def _batch(self, series: list[_Series], batch: int):
        k = len(self.fns)
        scale = 1.0 / self.cfg.graph_calls if self.graphs else 1.0
        if self.timer == "perf_counter":
            for _ in range(batch):
                for i in range(k):
                    t0 = time.perf_counter()
                    self._call(i)
                    if self.cuda:
                        self._sync()
                    series[i].samples.append((time.perf_counter() - t0) * 1e3)
                    series[i].clocks.append(self.clock.read() if self.clock else None)
            return
        import torch   # the event timers: a CUDA device, so torch is loaded already

        events = []
        hold = self.cfg.hold_gpu and hasattr(torch.cuda, "_sleep")
        if hold:
            # Spin the GPU for about as long as the host needs to queue this batch (estimated from the
            # last batch, capped at 0.2 s): the timed calls then run back to back on the device, as
            # nvbench's blocking kernel arranges. Without it a microsecond kernel behind a slow Python
            # wrapper measures the wrapper, since the start event fires before the kernel is launched.
            host_s = min(self.host_per_iter * batch * k * 1.25, 0.2)
            mhz = max((self.clock.read() if self.clock else None) or 0.0, 2000.0)  # err towards a longer hold
            torch.cuda._sleep(int(host_s * mhz * 1e6))
        t_host = time.perf_counter()
        for _ in range(batch):
            for i in range(k):
                if self.cache is not None:
                    self.cache.zero_()
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                self._call(i)
                end.record()
                events.append((i, start, end, self.clock.read() if self.clock else None))
        self.host_per_iter = (time.perf_counter() - t_host) / (batch * k)
        self._sync()
        for i, start, end, clk in events:
            series[i].samples.append(start.elapsed_time(end) * scale)
            series[i].clocks.append(clk)


def summarize(name: str, samples_ms: Sequence[float], clocks_mhz: Sequence[float | None] = (),
              config: BenchConfig | None = None, **meta: Any) -> Measurement:
    """Samples (+ optional SM clocks) -> Measurement; throttled samples are kept but left out of the
    median and its CI (nvbench drops them). Pure: `meta` fills the bookkeeping fields."""
    cfg = config or BenchConfig()
    x = np.asarray(samples_ms, dtype=float)
    clocks = list(clocks_mhz) if any(c is not None for c in clocks_mhz) else []
    if clocks and len(clocks) != x.size:
        raise ValueError(f"{len(clocks)} clock readings for {x.size} samples; give one per sample or none")
    throttled = flag_throttled(clocks, cfg.throttle_frac) if clocks else tuple(False for _ in range(x.size))
    kept = x[~np.asarray(throttled, dtype=bool)] if x.size else x
    if kept.size == 0:  # everything throttled: report on all samples rather than nothing
        kept = x
    ci, method = median_ci(kept, cfg.confidence, cfg.n_resamples, cfg.seed)
    q75, q25 = (np.percentile(kept, [75, 25]) if kept.size else (float("nan"), float("nan")))
    base = dict(stopped="given", timer="none", device="none", warmup_calls=0, sampling_s=0.0, timed_s=0.0,
                wall_s=0.0, l2_flush_bytes=0, graph_calls=0)
    base.update(meta)
    return Measurement(
        name=name, samples_ms=tuple(float(v) for v in x),
        median_ms=float(np.median(kept)) if kept.size else float("nan"), ci_ms=ci,
        confidence=cfg.confidence, ci_method=method,
        mean_ms=float(kept.mean()) if kept.size else float("nan"),
        std_ms=float(kept.std(ddof=1)) if kept.size > 1 else float("nan"),
        iqr_ms=float(q75 - q25), n=int(x.size), throttled=tuple(throttled),
        clocks_mhz=tuple(float(c) if c is not None else float("nan") for c in clocks), **base)


def _summarize(name: str, s: _Series, cfg: BenchConfig, sampler: _Sampler, stopped: str,
               sampling_s: float, t_begin: float, timed_s: float) -> Measurement:
    m = summarize(name, s.samples, s.clocks, cfg, stopped=stopped, timer=sampler.timer, device=sampler.device,
                  warmup_calls=s.warmup_calls, sampling_s=sampling_s, timed_s=timed_s,
                  l2_flush_bytes=sampler.flush_bytes,
                  graph_calls=cfg.graph_calls if sampler.timer == "cuda_graph" else 0)
    return replace(m, wall_s=time.perf_counter() - t_begin)


def _config(config: BenchConfig | None, overrides: dict[str, Any]) -> BenchConfig:
    cfg = config or BenchConfig()
    if overrides:
        valid = set(BenchConfig.__dataclass_fields__)
        bad = sorted(set(overrides) - valid)
        if bad:
            raise TypeError(f"unknown BenchConfig field(s) {bad}; valid: {', '.join(sorted(valid))}")
        cfg = replace(cfg, **overrides)
    return cfg


def measure(fn: Callable[[], Any], *, name: str = "fn", device: str | None = None,
            config: BenchConfig | None = None, **overrides: Any) -> Measurement:
    """Time `fn()` alone. `overrides` are BenchConfig fields, e.g. measure(f, max_time_s=0.5)."""
    cfg = _config(config, overrides)
    sampler = _Sampler([fn], cfg, _guess_device(device))
    series, stopped, sampling_s, t_begin, timed_s = sampler.run()
    return _summarize(name, series[0], cfg, sampler, stopped, sampling_s, t_begin, timed_s)


def compare(candidate: Callable[[], Any], baseline: Callable[[], Any], *,
            names: tuple[str, str] = ("candidate", "baseline"), delta: float = 0.01, device: str | None = None,
            config: BenchConfig | None = None, **overrides: Any) -> Comparison:
    """Interleave candidate and baseline (ABAB, cancelling drift) and decide from the ratio's bootstrap CI."""
    cfg = _config(config, overrides)
    check_delta(delta)
    sampler = _Sampler([candidate, baseline], cfg, _guess_device(device),
                       decided=(lambda a, b: apart(a, b, delta)) if cfg.decide_early else None)
    series, stopped, sampling_s, t_begin, timed_s = sampler.run()
    mc = _summarize(names[0], series[0], cfg, sampler, stopped, sampling_s, t_begin, timed_s)
    mb = _summarize(names[1], series[1], cfg, sampler, stopped, sampling_s, t_begin, timed_s)
    c = comparison_from(mc, mb, delta=delta, confidence=cfg.confidence, n_resamples=cfg.n_resamples,
                        seed=cfg.seed)
    return replace(c, wall_s=time.perf_counter() - t_begin)


def comparison_from(cand: Measurement, base: Measurement, *, delta: float = 0.01, confidence: float = 0.95,
                    n_resamples: int = 2000, seed: int = 0) -> Comparison:
    """The statistics of a Comparison from two measurements' unthrottled samples (pure)."""
    a = np.asarray(cand.samples_ms)[~np.asarray(cand.throttled, dtype=bool)] if cand.n else np.array([])
    b = np.asarray(base.samples_ms)[~np.asarray(base.throttled, dtype=bool)] if base.n else np.array([])
    ci, method = ratio_ci(a, b, confidence, n_resamples, seed)
    ratio = float(np.median(a) / np.median(b)) if a.size and b.size else float("nan")
    # the effect size on log-times, the ratio's scale: one preempted sample 50x long would otherwise outweigh a
    # whole run of samples 2x long, and the size would contradict the ratio it is reported beside
    g = hedges_g(np.log(a), np.log(b)) if (a > 0).all() and (b > 0).all() else hedges_g(a, b)
    return Comparison(cand, base, ratio, ci, confidence, method, delta, decide(ci, delta),
                      mann_whitney_p(a, b), g)


# ---------------------------------------------------------------------------- (de)serialization


def measurement_from_dict(d: dict[str, Any]) -> Measurement:
    """Rebuild a Measurement written with dataclasses.asdict (e.g. by a child process)."""
    fields = Measurement.__dataclass_fields__
    kw = {k: d[k] for k in fields if k in d}
    for k in ("samples_ms", "throttled", "clocks_mhz", "ci_ms"):
        kw[k] = tuple(float("nan") if v is None else v for v in kw.get(k, ()))
    kw["throttled"] = tuple(bool(v) for v in kw["throttled"])
    return Measurement(**kw)


def comparison_from_dict(d: dict[str, Any]) -> Comparison:
    kw = dict(d)
    kw["candidate"] = measurement_from_dict(d["candidate"])
    kw["baseline"] = measurement_from_dict(d["baseline"])
    kw["ratio_ci"] = tuple(float("nan") if v is None else v for v in d["ratio_ci"])
    for k in ("ratio", "p_value", "hedges_g"):
        kw[k] = float("nan") if kw[k] is None else kw[k]
    return Comparison(**{k: kw[k] for k in Comparison.__dataclass_fields__ if k in kw})
