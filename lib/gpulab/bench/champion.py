"""Which attention implementation to ship: the seeds' decision matrix, fed by measurements, not guesses.

Only candidates that passed notebook 05's oracle may win. A candidate becomes the champion only when its
ratio-of-medians CI against the current champion lies wholly below 1 - delta; a correct but slower one is
"correct, N.NNx slower"; one that failed the oracle is excluded with its reason; a speedup over 10x against
a vendor kernel is flagged as suspect (a kernel that skips work is fast and wrong). `choose` is pure: it gets
a compare function, so tests drive it with synthetic comparisons and the benchmark child with real ones.

The benchmark itself runs in a child process in its own process group with a deadline (`run`), because a
candidate kernel can hang; the child writes its results file after every step so a hang loses nothing
already measured.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Protocol, Sequence
from gpulab import proc

GATE_FILE = "oracle_gate.json"
RESULT_FILE = "benchmark.json"
NOTEBOOK = "06_benchmark"
SDPA_BACKENDS = ("math", "flash", "efficient", "cudnn")
# PyTorch's fused SDPA kernels (math is the reference composite, not a tuned kernel: beating it 25x is normal)
VENDOR_KERNELS = frozenset({"flash", "efficient", "cudnn", "sdpa", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn"})
# The registry (gpulab.candidates) calls the SDPA backends sdpa_<backend>; short names are accepted too.
ALIASES = {b: f"sdpa_{b}" for b in SDPA_BACKENDS}
SUSPECT_SPEEDUP = 10.0
OVERHEAD_BUDGET = 0.20  # the seeds' budget for what a fix may cost
STATUSES = ("champion", "baseline", "slower", "tie", "dethroned", "excluded", "suspect", "unverified", "error")


# ------------------------------------------------------------------------------------ the decision


class ComparisonLike(Protocol):
    ratio: float
    ratio_ci: tuple[float, float]
    verdict: str


@dataclass(frozen=True)
class Gate:
    """One candidate's line of 05's oracle_gate.json."""

    passed: bool
    reason: str = ""
    worst_ratio: float | None = None
    cases: int | None = None


@dataclass(frozen=True)
class Row:
    name: str
    status: str                    # one of STATUSES
    label: str                     # what the decision table says, e.g. "correct, 1.73x slower"
    compared_with: str | None = None
    ratio: float | None = None     # median(name)/median(compared_with)
    ratio_ci: tuple[float, float] | None = None
    verdict: str | None = None
    gate: str = "unverified"       # passed | failed | unverified


@dataclass(frozen=True)
class Decision:
    champion: str | None
    baseline: str
    rows: tuple[Row, ...]
    provisional: bool              # True when there was no oracle gate: nothing was verified correct
    delta: float

    def row(self, name: str) -> Row:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no row {name!r}; rows: {', '.join(r.name for r in self.rows)}")


def parse_gate(data: Mapping[str, Any] | None) -> dict[str, Gate] | None:
    """05's gate JSON -> {name: Gate}; None stays None (no gate file: nothing verified)."""
    if data is None:
        return None
    out = {}
    for name, entry in data.items():
        if not isinstance(entry, Mapping) or "passed" not in entry:
            raise ValueError(f"{GATE_FILE}: entry {name!r} must be a mapping with 'passed' (got {entry!r})")
        out[str(name)] = Gate(bool(entry["passed"]), str(entry.get("reason", "")), entry.get("worst_ratio"),
                              entry.get("cases"))
    return out


def load_gate(out_dir: str | os.PathLike) -> dict[str, Gate] | None:
    path = Path(out_dir) / GATE_FILE
    if not path.exists():
        return None
    return parse_gate(json.loads(path.read_text()))


def _fmt_ci(ci) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci and all(math.isfinite(v) for v in ci) else "[n/a]"


def choose(names: Sequence[str], baseline: str, compare: Callable[[str, str], ComparisonLike], *,
           gate: Mapping[str, Gate] | None = None, order: Mapping[str, float] | None = None,
           vendor: Collection[str] = VENDOR_KERNELS, delta: float = 0.01,
           suspect_speedup: float = SUSPECT_SPEEDUP, errors: Mapping[str, str] | None = None) -> Decision:
    """Run the decision matrix. `compare(a, b)` returns a comparison of a against b (ratio = a/b).

    Candidates are visited fastest-median first (`order`: name -> median ms), so each is judged against the
    best one known so far. Without a gate every candidate is eligible but the decision is provisional.
    A "faster" verdict more than `suspect_speedup` over the vendor champion, or over any vendor kernel's
    median in `order`, is flagged suspect and not promoted.
    """
    errors = dict(errors or {})
    provisional = gate is None
    tag = "unverified" if provisional else "correct"

    def gate_of(n: str) -> str:
        if gate is None or n not in gate:
            return "unverified"
        return "passed" if gate[n].passed else "failed"

    def eligible(n: str) -> bool:
        return n not in errors and (provisional or gate_of(n) == "passed")

    rows: dict[str, Row] = {}
    everyone = [baseline] + [n for n in dict.fromkeys(names) if n != baseline]
    for n in everyone:
        if gate is not None and n in gate and not gate[n].passed:
            rows[n] = Row(n, "excluded", f"excluded: failed the oracle ({gate[n].reason or 'no reason given'})",
                          gate="failed")
        elif n in errors:
            rows[n] = Row(n, "error", f"could not run: {errors[n]}", gate=gate_of(n))
        elif gate is not None and n not in gate:
            rows[n] = Row(n, "unverified", "not in 05's oracle gate: unverified, not benchmarked for the title",
                          gate="unverified")
    champion = baseline if eligible(baseline) else None
    if champion is not None:
        rows[baseline] = Row(baseline, "baseline", f"baseline ({tag})", gate=gate_of(baseline))
    rank = (lambda n: order.get(n, math.inf)) if order else (lambda n: everyone.index(n))
    promoted: list[str] = []
    for n in sorted((n for n in everyone if n != baseline and eligible(n)), key=rank):
        if champion is None:
            champion = n
            promoted.append(n)
            rows[n] = Row(n, "champion", f"champion by default ({tag}; baseline {baseline} not eligible)",
                          gate=gate_of(n))
            continue
        try:
            c = compare(n, champion)
        except Exception as exc:  # a candidate that breaks while timed is reported, not fatal
            rows[n] = Row(n, "error", f"comparison failed: {type(exc).__name__}: {exc}", champion, gate=gate_of(n))
            continue
        ci = tuple(c.ratio_ci)
        base = dict(compared_with=champion, ratio=c.ratio, ratio_ci=ci, verdict=c.verdict, gate=gate_of(n))
        speedup = 1.0 / c.ratio if c.ratio else math.inf
        over = {champion: speedup} if champion in vendor else {}
        if order and n in order and n not in vendor:  # any vendor kernel measured, not only the champion
            over.update({v: order[v] / order[n] for v in vendor if v in order and v != n and order[n] > 0})
        worst = max(over.items(), key=lambda kv: kv[1], default=(None, 0.0))
        if c.verdict == "faster" and worst[1] > suspect_speedup:
            rows[n] = Row(n, "suspect", f"suspect: {worst[1]:.1f}x faster than vendor kernel {worst[0]} "
                                        f"(> {suspect_speedup:g}x); check the oracle and the timing", **base)
        elif c.verdict == "faster":
            rows[n] = Row(n, "champion", f"{tag}, {speedup:.2f}x faster than {champion} "
                                         f"(CI {_fmt_ci(ci)} < {1 - delta:g}): new champion", **base)
            champion = n
            promoted.append(n)
        elif c.verdict == "slower":
            rows[n] = Row(n, "slower", f"{tag}, {c.ratio:.2f}x slower than {champion}", **base)
        else:
            rows[n] = Row(n, "tie", f"{tag}, tie with {champion} (ratio {c.ratio:.3f}, CI {_fmt_ci(ci)} "
                                    f"within 1 +/- {delta:g})", **base)
    for n in promoted:
        if n != champion:
            r = rows[n]
            rows[n] = Row(n, "dethroned", r.label.replace("new champion", f"then beaten by {champion}"),
                          r.compared_with, r.ratio, r.ratio_ci, r.verdict, r.gate)
    if champion is not None and champion == baseline:
        r = rows[baseline]
        rows[baseline] = Row(baseline, "champion", f"baseline stays champion ({tag}): nothing beat it by more "
                                                   f"than {delta:.0%}", gate=r.gate)
    return Decision(champion, baseline, tuple(rows[n] for n in everyone if n in rows), provisional, delta)


def decision_table(decision: Decision):
    import pandas as pd

    return pd.DataFrame([{"candidate": r.name, "status": r.status, "decision": r.label, "vs": r.compared_with,
                          "ratio": r.ratio, "ratio CI": _fmt_ci(r.ratio_ci) if r.ratio_ci else "",
                          "oracle": r.gate} for r in decision.rows])


def decision_from_dict(d: Mapping[str, Any]) -> Decision:
    rows = tuple(Row(**{**r, "ratio_ci": tuple(r["ratio_ci"]) if r.get("ratio_ci") else None}) for r in d["rows"])
    return Decision(d["champion"], d["baseline"], rows, d["provisional"], d["delta"])


# ------------------------------------------------------------------------------------ candidates


@dataclass(frozen=True)
class Shape:
    """The attention call of the built-in workload: joint text+image tokens, non-causal."""

    batch: int
    heads: int
    seq: int
    head_dim: int
    dtype: str
    causal: bool = False


def resolve_dtype(dtype: str, device: str) -> str:
    choices = ("auto", "float32", "bfloat16", "float16")
    if dtype not in choices:
        raise ValueError(f"dtype={dtype!r} is not valid; choose one of {', '.join(choices)}")
    if dtype == "auto":
        return "bfloat16" if device.startswith("cuda") else "float32"
    return dtype


def canonical(names: Sequence[str]) -> list[str]:
    """Registry names ('math' -> 'sdpa_math'), in order, no repeats."""
    return list(dict.fromkeys(ALIASES.get(n, n) for n in names))


def resolve_candidates(names: Sequence[str], device: str) -> tuple[dict[str, tuple[Callable, str, str]], str, dict[str, str], dict[str, str]]:
    """name -> (fn, kind, notes) from gpulab.candidates, where they came from, names that failed (with why),
    and names skipped because this device does not have them (the CUDA-only SDPA backends on a CPU)."""
    from gpulab.oracle import candidates as reg

    failed: dict[str, str] = {}
    skipped: dict[str, str] = {}
    out: dict[str, tuple[Callable, str, str]] = {}
    avail = reg.available(device)
    for n in names:
        if n in avail:
            c = avail[n]
            out[n] = (c.fn, str(c.kind), str(c.notes))
            continue
        try:  # aliases, planted bugs, module:function specs
            c = reg.resolve([n], device)[0]
            out[n] = (c.fn, str(getattr(c, "kind", "user")), str(getattr(c, "notes", "")))
        except Exception as exc:
            if n in SDPA_BACKENDS or n in ALIASES.values():
                skipped[n] = f"not available on {device}"
            else:
                failed[n] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    return out, "gpulab.candidates", failed, skipped


# ------------------------------------------------------------------------------- the benchmark run


@dataclass(frozen=True)
class Spec:
    """Everything the benchmark child needs; JSON-able so it crosses the process boundary."""

    device: str
    shape: Shape
    candidates: tuple[str, ...]
    baseline: str = "math"
    seq_lens: tuple[int, ...] = ()
    delta: float = 0.01
    max_time_s: float = 1.0
    workload: dict | None = None    # gpulab.workloads.WorkloadConfig fields: the scenario's workload to time
    gate: dict | None = None        # 05's gate JSON as read, None when absent

    def deadline_s(self) -> float:
        """Caps of every measurement the child may take, plus start-up and bootstrap time."""
        n = len(set(self.candidates) | {self.baseline})
        timed = (2 * n + 1 + n * len(self.seq_lens) + 1)
        return 90.0 + timed * (1.5 * self.max_time_s + 5.0)


def spec_from_dict(d: Mapping[str, Any]) -> Spec:
    return Spec(**{**d, "shape": Shape(**d["shape"]), "candidates": tuple(d["candidates"]),
                   "seq_lens": tuple(d["seq_lens"])})


def _inputs(shape: Shape, device: str, seq: int | None = None):
    import torch

    s = seq or shape.seq
    g = torch.Generator(device="cpu").manual_seed(0)
    dt = getattr(torch, shape.dtype)
    return [torch.randn(shape.batch, shape.heads, s, shape.head_dim, generator=g).to(device=device, dtype=dt)
            for _ in range(3)]


def _say(msg: str) -> None:
    print(f"[06_benchmark] {msg}", file=sys.stderr, flush=True)


def worker(spec: Spec, result_path: Path) -> dict[str, Any]:
    """The child's work: time every candidate against the baseline, decide, sweep, time the workload."""
    import torch

    from gpulab import bench
    from gpulab.bench import flops
    from gpulab.report import write_json

    dev = spec.device
    res: dict[str, Any] = {"spec": asdict(spec), "done": False, "stage": "start", "torch": torch.__version__,
                           "device_name": torch.cuda.get_device_name(torch.device(dev)) if dev.startswith("cuda") else "cpu",
                           "errors": {}, "vs_baseline": {}, "champion_compares": {}, "sweep": [], "workload": None}

    def save(stage: str):
        res["stage"] = stage
        write_json(result_path, res)

    names = list(dict.fromkeys([spec.baseline, *spec.candidates]))
    cands, source, failed, skipped = resolve_candidates(names, dev)
    names = [n for n in names if n not in skipped]
    res["source"] = source
    res["skipped"] = skipped
    res["candidates"] = {n: {"kind": k, "notes": t} for n, (_, k, t) in cands.items()}
    res["errors"].update(failed)
    q, k, v = _inputs(spec.shape, dev)
    kw = {"is_causal": spec.shape.causal}
    calls = {}
    for n, (fn, _, _) in cands.items():
        try:
            with torch.no_grad():
                out = fn(q, k, v, **kw)
            if dev.startswith("cuda"):
                torch.cuda.synchronize()
            if tuple(out.shape) != tuple(q.shape):
                raise RuntimeError(f"output shape {tuple(out.shape)} != {tuple(q.shape)}")
            calls[n] = (lambda fn=fn: fn(q, k, v, **kw))
        except Exception as exc:
            res["errors"][n] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    save("resolved")
    cfg = bench.BenchConfig(max_time_s=spec.max_time_s, min_time_s=min(0.1, spec.max_time_s / 4))
    cache: dict[tuple[str, str], bench.Comparison] = {}

    def cmp(a: str, b: str) -> bench.Comparison:
        if (a, b) not in cache:
            _say(f"compare {a} vs {b}")
            with torch.no_grad():
                cache[(a, b)] = bench.compare(calls[a], calls[b], names=(a, b), delta=spec.delta, device=dev, config=cfg)
            c = cache[(a, b)]
            entry = {**c.summary(), "candidate_m": asdict(c.candidate), "baseline_m": asdict(c.baseline)}
            (res["vs_baseline"] if b == spec.baseline else res["champion_compares"])[f"{a}|{b}" if b != spec.baseline else a] = entry
            save(f"compared {a} vs {b}")
        return cache[(a, b)]

    gate = parse_gate(spec.gate)
    timed = [n for n in names if gate is None or (n in gate and gate[n].passed) or n == spec.baseline]
    res["not_timed"] = [n for n in names if n not in timed]  # failed or missing from 05's gate
    if spec.baseline in calls:
        for n in timed:
            if n != spec.baseline and n in calls:
                try:
                    cmp(n, spec.baseline)
                except Exception as exc:
                    res["errors"][n] = f"{type(exc).__name__}: {exc}"
    else:
        res["errors"].setdefault(spec.baseline, "baseline could not run")
    order = {n: c.candidate.median_ms for (n, b), c in cache.items() if b == spec.baseline}
    if spec.baseline in calls and cache:
        order[spec.baseline] = next(iter(cache.values())).baseline.median_ms
    decision = choose(names, spec.baseline, cmp, gate=gate, order=order,
                      vendor=VENDOR_KERNELS,
                      delta=spec.delta, errors={n: e for n, e in res["errors"].items()})
    res["decision"] = asdict(decision)
    save("decided")
    roof = None
    try:
        roof = flops.device_roof(dev, spec.shape.dtype, max_time_s=min(1.0, spec.max_time_s))
        res["roof"] = asdict(roof)
    except Exception as exc:
        res["errors"]["roof"] = f"{type(exc).__name__}: {exc}"
    sh = spec.shape
    for s in spec.seq_lens:
        try:
            qs, ks, vs = _inputs(sh, dev, s)
        except Exception as exc:
            res["sweep"].append({"seq": s, "error": f"{type(exc).__name__}: {exc}"})
            continue
        for n in timed:
            if n not in calls:
                continue
            row = {"candidate": n, "seq": s}
            try:
                fn = cands[n][0]
                with torch.no_grad():
                    m = bench.measure(lambda fn=fn: fn(qs, ks, vs, **kw), name=n, device=dev, config=cfg)
                f = flops.attention_flops(sh.batch, sh.heads, s, s, sh.head_dim, causal=sh.causal)
                b = flops.attention_bytes(sh.batch, sh.heads, s, s, sh.head_dim, dtype=sh.dtype)
                row.update(median_ms=m.median_ms, ci_ms=list(m.ci_ms), n=m.n, **flops.figures(f, b, m.median_ms, roof))
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            res["sweep"].append(row)
            save(f"sweep {n} seq={s}")
        del qs, ks, vs
    if spec.workload is not None:
        try:
            res["workload"] = time_workload(spec.workload, dev, cfg)
        except Exception as exc:
            res["errors"]["workload"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    res["done"] = True
    save("done")
    return res


def time_workload(workload: Mapping[str, Any], device: str, cfg) -> dict[str, Any]:
    """One run of the scenario's workload rung (gpulab.workloads.prepare), measured like any kernel."""
    from gpulab import bench, workloads

    wc = workloads.WorkloadConfig.from_params(**{**workload, "device": device})
    if wc.kind != "builtin":
        return {"what": f"not timed: workload={wc.workload!r} is not the built-in one", "median_ms": None}
    _say(f"time the workload ({wc.rung}, sdpa_backend={wc.sdpa_backend})")
    prep = workloads.prepare(wc)
    prep.fn()
    m = bench.measure(prep.fn, name=f"workload[{wc.rung}]", device=device, config=cfg)
    return {"what": f"built-in workload, rung={wc.rung}, sdpa_backend={wc.sdpa_backend} "
                    f"(picked: {prep.backend_used}), dtype={prep.dtype}",
            "median_ms": m.median_ms, "ci_ms": list(m.ci_ms), "n": m.n, "stopped": m.stopped}


@dataclass(frozen=True)
class RunResult:
    status: str                    # ok | hang | crash | error
    result: dict                   # the child's results file as far as it got
    elapsed_s: float
    log: str                       # path of the child's stderr log
    detail: str = ""


def run(spec: Spec, out_dir: str | os.PathLike, timeout_s: float | None = None) -> RunResult:
    """Run `worker` in a child process group with a deadline; whatever it saved survives a hang or crash."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec_path, result_path, log_path = out / "benchmark_spec.json", out / RESULT_FILE, out / "benchmark.log"
    from gpulab.report import write_json

    write_json(spec_path, asdict(spec))
    if result_path.exists():
        result_path.unlink()
    deadline = timeout_s or spec.deadline_s()
    t0 = time.monotonic()
    r = proc.run([sys.executable, "-m", "gpulab.bench.champion", str(spec_path), str(result_path)],
                 timeout_s=deadline, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log_path,
                 stderr=subprocess.STDOUT, grace_s=0.2)
    rc = r.returncode
    elapsed = time.monotonic() - t0
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    if rc is None:
        status, detail = "hang", f"no result after {deadline:.0f} s (stage reached: {result.get('stage', 'none')})"
    elif rc < 0:
        status, detail = "crash", f"killed by signal {-rc} (stage reached: {result.get('stage', 'none')})"
    elif rc != 0 or not result.get("done"):
        tail = log_path.read_text()[-800:]
        status, detail = "error", f"exit code {rc}: {tail.strip().splitlines()[-1] if tail.strip() else ''}"
    else:
        status, detail = "ok", ""
    return RunResult(status, result, elapsed, str(log_path), detail)


def make_spec(device: str, *, dtype: str, batch: int, heads: int, head_dim: int, text_tokens: int,
              image_tokens: int, candidates: Sequence[str], baseline: str, seq_lens: Sequence[int], delta: float,
              max_time_s: float, workload: Mapping[str, Any] | None = None,
              out_dir: str | os.PathLike | None = None) -> Spec:
    """The notebook's parameters -> a checked Spec (with 05's gate read from out_dir when it is there)."""
    if not isinstance(candidates, (list, tuple)) or not all(isinstance(c, str) and c for c in candidates):
        raise ValueError(f"candidates={candidates!r} must be a list of names: SDPA backends "
                         f"({', '.join(SDPA_BACKENDS)}) or module:function")
    if not isinstance(baseline, str) or not baseline:
        raise ValueError(f"baseline={baseline!r} must name a candidate, e.g. 'math'")
    if not isinstance(seq_lens, (list, tuple)) or not all(isinstance(s, int) and s > 0 for s in seq_lens):
        raise ValueError(f"seq_lens={seq_lens!r} must be a list of positive integers")
    if not 0 <= delta < 1:
        raise ValueError(f"delta={delta!r} must lie in [0, 1), e.g. 0.01 for 1%")
    if not max_time_s > 0:
        raise ValueError(f"max_time_s={max_time_s!r} must be > 0 seconds")
    if workload is not None:
        from gpulab import workloads

        workloads.WorkloadConfig.from_params(**{**workload, "device": device})  # names a bad workload key now
    for name, v in (("batch", batch), ("heads", heads), ("head_dim", head_dim)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive integer")
    if not (text_tokens >= 0 and image_tokens >= 0 and text_tokens + image_tokens > 0):
        raise ValueError(f"text_tokens={text_tokens!r} + image_tokens={image_tokens!r} must be > 0")
    gate = None
    if out_dir is not None and (Path(out_dir) / GATE_FILE).exists():
        gate = json.loads((Path(out_dir) / GATE_FILE).read_text())
        parse_gate(gate)  # fail early on a malformed gate
    shape = Shape(batch, heads, text_tokens + image_tokens, head_dim, resolve_dtype(dtype, device))
    names = canonical(candidates)
    return Spec(device, shape, tuple(names), canonical([baseline])[0], tuple(seq_lens), float(delta),
                float(max_time_s), dict(workload) if workload is not None else None, gate)


# -------------------------------------------------------------------------- reading the results


def comparisons(result: Mapping[str, Any]) -> dict:
    """name -> bench.Comparison against the baseline, rebuilt from the results file."""
    from gpulab import bench

    out = {}
    for n, d in result.get("vs_baseline", {}).items():
        out[n] = bench.comparison_from_dict({**d, "candidate": d["candidate_m"], "baseline": d["baseline_m"],
                                             "confidence": d["candidate_m"]["confidence"]})
    return out


def candidates_table(result: Mapping[str, Any]):
    """One row per candidate: latency with CI, ratio to the baseline with CI, verdict, throughput."""
    import pandas as pd

    from gpulab.bench import flops

    spec = result.get("spec", {})
    sh = Shape(**spec["shape"]) if spec else None
    roof = result.get("roof")
    rows = []
    comps = comparisons(result)
    base_m = next(iter(comps.values())).baseline if comps else None
    ms = {n: c.candidate for n, c in comps.items()}
    if base_m is not None:
        ms[spec.get("baseline")] = base_m
    f = flops.attention_flops(sh.batch, sh.heads, sh.seq, sh.seq, sh.head_dim, causal=sh.causal) if sh else float("nan")
    for n, m in ms.items():
        c = comps.get(n)
        tf = flops.tflops(f, m.median_ms)
        rows.append({"candidate": n, "median ms": m.median_ms, "median CI ms": f"[{m.ci_ms[0]:.4g}, {m.ci_ms[1]:.4g}]",
                     "n": m.n, "throttled": m.n_throttled, "stopped": m.stopped,
                     "ratio vs baseline": c.ratio if c else 1.0,
                     "ratio CI": _fmt_ci(c.ratio_ci) if c else "", "verdict": c.verdict if c else "baseline",
                     "Mann-Whitney p": c.p_value if c else None, "Hedges g": c.hedges_g if c else None,
                     "TFLOP/s": tf, "% of roof": 100 * tf / roof["tflops"] if roof and roof.get("tflops") else None})
    for n, e in result.get("errors", {}).items():
        if n not in ms and n not in ("roof", "workload"):
            rows.append({"candidate": n, "verdict": f"error: {e}"})
    return pd.DataFrame(rows)


def sweep_table(result: Mapping[str, Any]):
    import pandas as pd

    return pd.DataFrame(result.get("sweep", []))


# ----------------------------------------------------------------------------------- fix overhead


def scenario_overhead(out_dir: str | os.PathLike, baseline_scenario: str = "baseline",
                      budget: float = OVERHEAD_BUDGET) -> tuple[list[dict[str, Any]], str]:
    """Each sibling scenario's workload time against the baseline scenario's; (rows, note).

    Scenarios run one after another, so a scenario sees only those that ran before it (the index shows all).
    """
    from gpulab.report import load_metrics

    here = Path(out_dir).resolve()
    parent = here.parent
    found = {}
    for d in sorted(p for p in parent.iterdir() if p.is_dir()) if parent.exists() else []:
        entry = load_metrics(d).get(NOTEBOOK)
        ms = (entry or {}).get("metrics", {}).get("workload_ms")
        if ms is not None:
            found[d.name] = (float(ms), (entry["metrics"].get("workload_ci_ms") or [None, None]))
    if len(found) < 2:
        return [], (f"only one scenario ({', '.join(found) or here.name}) has a 06 workload time in {parent}: "
                    f"no fix-overhead table (run several scenarios with `gpulab run --scenario all`)")
    if baseline_scenario not in found:
        return [], f"baseline scenario {baseline_scenario!r} has no 06 workload time yet; have: {', '.join(found)}"
    b_ms, b_ci = found[baseline_scenario]
    rows = []
    for name, (ms, ci) in found.items():
        ratio = ms / b_ms
        lo = ci[0] / b_ci[1] if None not in (ci[0], b_ci[1]) and b_ci[1] else None
        hi = ci[1] / b_ci[0] if None not in (ci[1], b_ci[0]) and b_ci[0] else None
        rows.append({"scenario": name, "workload ms": ms, "vs baseline": ratio, "bound low": lo, "bound high": hi,
                     "overhead %": 100 * (ratio - 1),
                     "within budget": "baseline" if name == baseline_scenario else
                     ("OVER BUDGET" if ratio > 1 + budget else "ok")})
    note = (f"{len(found)} scenarios; overhead = workload time / {baseline_scenario}'s - 1, budget {budget:.0%}. "
            f"Bounds combine each side's CI of the median (separate runs, not interleaved: conservative).")
    return rows, note


def overhead_table(rows: Sequence[Mapping[str, Any]]):
    import pandas as pd

    return pd.DataFrame(list(rows))


# -------------------------------------------------------------------------------------- plots


def plot_distributions(result: Mapping[str, Any], ax=None):
    """Box plot of every candidate's raw samples: the spread the medians hide."""
    import matplotlib.pyplot as plt

    comps = comparisons(result)
    data = {n: c.candidate.samples_ms for n, c in comps.items()}
    if comps:
        b = next(iter(comps.values())).baseline
        data = {b.name: b.samples_ms, **data}
    ax = ax or plt.subplots(figsize=(7, 3.5))[1]
    if data:
        ax.boxplot(list(data.values()), showfliers=True, flierprops={"markersize": 2})
        ax.set_xticks(range(1, len(data) + 1), list(data))
        ax.set_yscale("log")
    ax.set_ylabel("ms per call (log)")
    ax.set_title("latency distributions (all samples)")
    return ax


def plot_forest(result: Mapping[str, Any], ax=None):
    """Ratio to the baseline with its BCa CI; the band is the tie zone 1 +/- delta."""
    import matplotlib.pyplot as plt

    comps = comparisons(result)
    delta = result.get("spec", {}).get("delta", 0.01)
    ax = ax or plt.subplots(figsize=(7, 0.6 * max(len(comps), 1) + 1.2))[1]
    colors = {"faster": "tab:green", "slower": "tab:red", "tie": "tab:gray"}
    for i, (n, c) in enumerate(comps.items()):
        lo, hi = c.ratio_ci
        ax.errorbar([c.ratio], [i], xerr=[[max(c.ratio - lo, 0)], [max(hi - c.ratio, 0)]], fmt="o",
                    color=colors.get(c.verdict, "k"), capsize=4)
        ax.annotate(f" {c.verdict}", (hi, i), va="center", fontsize=8)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.axvspan(1 - delta, 1 + delta, color="tab:gray", alpha=0.2)
    ax.set_yticks(range(len(comps)), list(comps))
    ax.set_xscale("log")
    ax.set_xlabel(f"median ratio vs baseline {result.get('spec', {}).get('baseline', '')} (< 1 is faster)")
    ax.set_title("ratio of medians, BCa 95% CI")
    return ax


def plot_sweep(result: Mapping[str, Any], ax=None):
    """TFLOP/s against sequence length per candidate, with the roof when one is known."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(7, 3.5))[1]
    rows = [r for r in result.get("sweep", []) if "tflops" in r]
    for n in dict.fromkeys(r["candidate"] for r in rows):
        pts = sorted((r["seq"], r["tflops"]) for r in rows if r["candidate"] == n)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=n)
    roof = result.get("roof")
    if roof and roof.get("tflops"):
        ax.axhline(roof["tflops"], color="k", ls="--", lw=0.8, label=f"roof {roof['tflops']:.3g}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length")
    ax.set_ylabel("TFLOP/s")
    ax.set_title("throughput vs sequence length")
    if rows:
        ax.legend(fontsize=8)
    return ax


def plot_histogram(result: Mapping[str, Any], name: str, ax=None):
    """One candidate's samples, for the interactive view."""
    import matplotlib.pyplot as plt

    comps = comparisons(result)
    ms = {n: c.candidate for n, c in comps.items()}
    if comps:
        b = next(iter(comps.values())).baseline
        ms[b.name] = b
    if name not in ms:
        raise KeyError(f"no samples for {name!r}; have: {', '.join(ms)}")
    m = ms[name]
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    ax.hist(m.samples_ms, bins=60)
    ax.axvline(m.median_ms, color="k")
    ax.axvspan(*m.ci_ms, color="tab:orange", alpha=0.4)
    ax.set_xlabel("ms per call")
    ax.set_title(f"{name}: median {m.median_ms:.4g} ms, CI [{m.ci_ms[0]:.4g}, {m.ci_ms[1]:.4g}], n={m.n}")
    return ax


def finding(run: RunResult) -> str:
    """The sentence the notebook prints under the decision table."""
    res = run.result
    parts = []
    if run.status != "ok":
        parts.append(f"**The benchmark child ended with status `{run.status}`** ({run.detail}); "
                     f"what it measured before that is shown. Log: `{run.log}`.")
    d = res.get("decision")
    if d is None:
        return " ".join(parts) or "No decision was reached."
    if d["provisional"]:
        parts.append(f"No `{GATE_FILE}` from notebook 05 in this out_dir: every candidate is **unverified**, "
                     f"so the champion below is provisional (fast is not the same as right).")
    dec = decision_from_dict(d)
    champ = dec.champion
    if champ is None:
        parts.append("No candidate is eligible to be champion.")
    else:
        parts.append(f"Champion: **{champ}** ({dec.row(champ).label}).")
    for r in dec.rows:
        if r.status in ("suspect", "excluded", "error"):
            parts.append(f"`{r.name}`: {r.label}.")
    if res.get("skipped"):
        parts.append("Skipped on this device: " + ", ".join(f"`{n}`" for n in res["skipped"]) + ".")
    if res.get("roof"):
        parts.append(f"Roof: {res['roof']['tflops']:.3g} TFLOP/s ({res['roof']['source']}).")
    return " ".join(parts)


def metrics(result: Mapping[str, Any], run_status: str) -> tuple[str, dict[str, Any]]:
    """Headline and metrics for report.record."""
    d = result.get("decision")
    comps = comparisons(result)
    per = {n: {"median_ms": c.candidate.median_ms, "ratio": c.ratio, "ratio_ci": list(c.ratio_ci),
               "verdict": c.verdict} for n, c in comps.items()}
    sweep = {f"{r['candidate']}@{r['seq']}": r.get("tflops") for r in result.get("sweep", []) if "candidate" in r}
    wl = result.get("workload") or {}
    m = {"status": run_status, "champion": d["champion"] if d else None,
         "provisional": d["provisional"] if d else None, "baseline": result.get("spec", {}).get("baseline"),
         "candidates": per, "tflops": sweep, "workload_ms": wl.get("median_ms"), "workload_ci_ms": wl.get("ci_ms"),
         "errors": result.get("errors", {}), "device_name": result.get("device_name")}
    if comps:
        m["baseline_median_ms"] = next(iter(comps.values())).baseline.median_ms
    if not d:
        return f"benchmark {run_status}: no decision reached", m
    champ = d["champion"]
    if champ is None:
        head = "no eligible candidate: nothing passed the oracle"
    else:
        c = comps.get(champ)
        speed = f", {1 / c.ratio:.2f}x vs {c.baseline.name} (CI {_fmt_ci(tuple(1 / v for v in c.ratio_ci[::-1]))})" if c else ""
        head = f"champion: {champ}{speed}"
    if d["provisional"]:
        head += " [unverified: no oracle gate from 05]"
    if run_status != "ok":
        head += f" [benchmark {run_status}]"
    return head, m


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m gpulab.bench.champion SPEC.json RESULT.json", file=sys.stderr)
        return 2
    spec = spec_from_dict(json.loads(Path(argv[0]).read_text()))
    worker(spec, Path(argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
