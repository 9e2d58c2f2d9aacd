"""The benchmark child (`python -m gpulab.bench.worker SPEC.json RESULT.json`): time every candidate on the
workload's own attention call, decide, sweep sequence lengths, time the workload.

Every candidate gets exactly the call the workload makes (`AttentionCall.inputs()`: same shapes, dtype,
boolean key-padding mask, causality). One that refuses it (flash with a mask, on CUDA) is recorded as not
supported, with the reason torch gives, and is never timed on some other call instead. The results file is
rewritten after every step, so a hang or a crash keeps what was measured.
"""
from __future__ import annotations

import json
import re
import sys
import time
import warnings
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

import torch

from gpulab import report
from gpulab.bench import flops
from gpulab.bench.decision import choose, parse_gate
from gpulab.bench.measure import BenchConfig, Comparison, compare, measure
from gpulab.bench.child import Spec, spec_from_dict
from gpulab.fixes import install_from_env
from gpulab.oracle import candidates as registry
from gpulab.builtin_model import prepare
from gpulab.workloads import AttentionCall, WorkloadConfig

_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)\s*$")
REFUSED = "No available kernel"  # what SDPA raises when the forced backend refuses the inputs
# SDPA explains every backend it did not use; under sdpa_kernel([one]) the others are only "runtime
# disabled", and the "... not used because:" headers carry no reason: neither says why this one refused.
_NOISE = re.compile(r"runtime disabled|not used because:\s*$")


_T0 = time.monotonic()   # the worker's imports done: each line of benchmark.log says how far in it was written


def _say(msg: str) -> None:
    print(f"[06_benchmark +{time.monotonic() - _T0:.1f}s] {msg}", file=sys.stderr, flush=True)


def _first_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {(text[0] if text else '')[:limit]}"


def resolve_candidates(names: list[str], device: str):
    """name -> registry Candidate; names that failed (with why); names this device does not have (the
    CUDA-only SDPA backends on a CPU), which are skipped rather than failed."""
    found, failed, skipped = {}, {}, {}
    missing = registry.unavailable(device)
    backends = set(registry.ALIASES.values())
    for n in names:
        if n in backends and n not in registry.available(device):
            skipped[n] = missing.get(n, f"not available on {device}")
            continue
        try:
            found[n] = registry.resolve([n], device)[0]
        except Exception as exc:  # noqa: BLE001 - a bad user spec is a row, not a crash
            failed[n] = _first_line(exc)
    return found, failed, skipped


def _attempt(fn: Callable, args: tuple, kw: dict, device: str):
    """Call fn once; (output, what torch warned, exception or None)."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            with torch.no_grad():
                out = fn(*args, **kw)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            return out, [], None
        except Exception as exc:  # noqa: BLE001 - the caller classifies it
            return None, [_TRIGGERED.sub("", str(w.message)).strip() for w in said], exc


def _why(said: list[str], exc: BaseException) -> str:
    """torch's own reasons for the refusal, then the exception: 'Flash Attention does not support non-null
    attn_mask. (RuntimeError: No available kernel. Aborting execution.)'."""
    reasons = " ".join(dict.fromkeys(s for s in said if s and not _NOISE.search(s)))
    return (f"{reasons} ({_first_line(exc)})" if reasons else _first_line(exc))[:600]


def refusal(fn: Callable, call: AttentionCall, inputs: tuple, device: str) -> tuple[str, str] | None:
    """None when fn runs the call; else ('unsupported', why) when it refuses this call (SDPA's "No available
    kernel", or it runs the same tensors without the mask), or ('error', why) when it cannot run at all."""
    q, k, v, mask = inputs
    out, said, exc = _attempt(fn, (q, k, v), {"attn_mask": mask, "is_causal": call.causal}, device)
    if exc is None:
        if tuple(out.shape) != tuple(q.shape):
            return "error", f"output shape {tuple(out.shape)} != {tuple(q.shape)}"
        return None
    reason = _why(said, exc)
    if REFUSED in str(exc):
        return "unsupported", reason
    if mask is not None and _attempt(fn, (q, k, v), {"is_causal": call.causal}, device)[2] is None:
        return "unsupported", reason
    return "error", reason


def time_workload(workload: dict, device: str, cfg: BenchConfig) -> dict[str, Any]:
    """One run of the scenario's workload rung (gpulab.builtin_model.prepare), measured like any kernel."""
    wc = WorkloadConfig(**{**workload, "device": device})
    if wc.kind != "builtin":
        return {"what": f"not timed: workload={wc.workload!r} is not the built-in one", "median_ms": None}
    _say(f"time the workload ({wc.rung}, sdpa_backend={wc.sdpa_backend})")
    prep = prepare(wc)
    prep.fn()
    m = measure(prep.fn, name=f"workload[{wc.rung}]", device=device, config=cfg)
    return {"what": f"built-in workload, rung={wc.rung}, sdpa_backend={wc.sdpa_backend} "
                    f"(picked: {prep.backend_used}), dtype={prep.dtype}",
            "median_ms": m.median_ms, "ci_ms": list(m.ci_ms), "n": m.n, "stopped": m.stopped}


def worker(spec: Spec, result_path: Path) -> dict[str, Any]:
    dev, call = spec.device, spec.call
    out_dir = result_path.parent
    res: dict[str, Any] = {"spec": asdict(spec), "done": False, "stage": "start", "torch": torch.__version__,
                           "device_name": torch.cuda.get_device_name(torch.device(dev)) if dev.startswith("cuda")
                           else "cpu", "call": call.describe(), "candidates": {}, "errors": {}, "unsupported": {},
                           "skipped": {}, "vs_baseline": {}, "champion_compares": {}, "sweep": [],
                           "stage_errors": {}, "workload": None}

    def save(stage: str) -> None:
        res["stage"] = stage
        report.write_json(result_path, res)

    names = list(dict.fromkeys([spec.baseline, *spec.candidates]))
    cands, res["errors"], res["skipped"] = resolve_candidates(names, dev)
    names = [n for n in names if n not in res["skipped"]]
    res["candidates"] = {n: {"kind": c.kind, "notes": c.notes} for n, c in cands.items()}
    _say(f"the workload's call: {call.describe()}")
    inputs = call.inputs(dev)
    q, k, v, mask = inputs
    calls: dict[str, Callable[[], Any]] = {}
    for n, c in cands.items():
        refused = refusal(c.fn, call, inputs, dev)
        if refused is None:
            calls[n] = (lambda fn=c.fn: fn(q, k, v, attn_mask=mask, is_causal=call.causal))
        elif refused[0] == "unsupported":
            res["unsupported"][n] = refused[1]
        else:
            res["errors"][n] = refused[1]
    save("resolved")
    cfg = BenchConfig(max_time_s=spec.max_time_s, min_time_s=min(0.1, spec.max_time_s / 4))
    cache: dict[tuple[str, str], Comparison] = {}

    def cmp(a: str, b: str) -> Comparison:
        if (a, b) not in cache:
            _say(f"compare {a} vs {b}")
            with torch.no_grad():
                cache[(a, b)] = compare(calls[a], calls[b], names=(a, b), delta=spec.delta, device=dev, config=cfg)
            if b == spec.baseline:
                res["vs_baseline"][a] = asdict(cache[(a, b)])
                report.write_rows(out_dir, "benchmark_vs_baseline",
                                  [cache[(n, spec.baseline)].summary() for n in res["vs_baseline"]],
                                  call=res["call"])
            else:
                res["champion_compares"][f"{a}|{b}"] = asdict(cache[(a, b)])
            save(f"compared {a} vs {b}")
        return cache[(a, b)]

    gate = parse_gate(spec.gate)
    timed = [n for n in names if n in calls and (gate is None or (n in gate and gate[n].passed)
                                                 or n == spec.baseline)]
    res["not_timed"] = [n for n in names if n in calls and n not in timed]  # failed or missing from 05's gate
    if spec.baseline in calls:
        for n in timed:
            if n != spec.baseline:
                try:
                    cmp(n, spec.baseline)
                except Exception as exc:  # noqa: BLE001 - a kernel that breaks while timed is a row
                    res["errors"][n] = _first_line(exc)
    order = {n: c.candidate.median_ms for (n, b), c in cache.items() if b == spec.baseline}
    if cache:
        order[spec.baseline] = next(iter(cache.values())).baseline.median_ms
    vendor = {n for n, c in cands.items() if c.kind == "vendor" and n != registry.ALIASES["math"]}
    decision = choose(names, spec.baseline, cmp, gate=gate, order=order, vendor=vendor, delta=spec.delta,
                      errors=res["errors"], unsupported=res["unsupported"])
    res["decision"] = asdict(decision)
    save("decided")
    roof = None
    _say("the device's peak, then the sweep over sequence lengths")
    try:
        roof = flops.device_roof(dev, call.dtype, max_time_s=min(1.0, spec.max_time_s))
        res["roof"] = asdict(roof)
    except Exception as exc:  # noqa: BLE001 - no peak: the sweep still gives TFLOP/s
        res["stage_errors"]["peak"] = _first_line(exc)
    # A sweep point draws a curve on a log scale, where a few percent is plenty: a quarter of the cap each, and
    # done once the median is known to 5% (on a GPU they pin the median long before either cap; on a CPU they
    # ran to the cap: 16 s of the default chain's 06, then 4 s)
    sweep_cfg = replace(cfg, max_time_s=spec.max_time_s / 4, min_time_s=min(cfg.min_time_s, spec.max_time_s / 16),
                        ci_rel=max(cfg.ci_rel, 0.05))
    for sc in spec.sweep_calls():
        sq, sk, sv, smask = sc.inputs(dev)
        f = flops.attention_flops(sc.batch, sc.heads, sc.seq_len, sc.keys, sc.head_dim, causal=sc.causal)
        nbytes = flops.attention_bytes(sc.batch, sc.heads, sc.seq_len, sc.keys, sc.head_dim, dtype=sc.dtype)
        for n in timed:
            row: dict[str, Any] = {"candidate": n, "seq_len": sc.seq_len, "masked_keys": sc.padded_keys}
            try:
                fn = cands[n].fn
                with torch.no_grad():
                    m = measure(lambda fn=fn: fn(sq, sk, sv, attn_mask=smask, is_causal=sc.causal), name=n,
                                device=dev, config=sweep_cfg)
                row.update(median_ms=m.median_ms, ci_ms=list(m.ci_ms), n=m.n,
                           **flops.figures(f, nbytes, m.median_ms, roof))
            except Exception as exc:  # noqa: BLE001 - one length a kernel refuses is a row
                row["error"] = _first_line(exc, 200)
            res["sweep"].append(row)
            report.write_rows(out_dir, "benchmark_sweep", res["sweep"], call=res["call"])
            save(f"sweep {n} seq_len={sc.seq_len}")
        del sq, sk, sv, smask
    if spec.workload is not None:
        try:
            res["workload"] = time_workload(spec.workload, dev, cfg)
        except Exception as exc:  # noqa: BLE001 - reported beside the rest
            res["stage_errors"]["workload"] = _first_line(exc)
    res["done"] = True
    save("done")
    if spec.recorder:
        res["recorder"] = {**spec.recorder, "status": "started"}
        save("recorder")
        res["recorder"] = _time_recorder(spec)
        save("recorder timed")
    return res


def _time_recorder(spec: Spec) -> dict[str, Any]:
    """The recorder's cost on the built-in workload (gpulab.trace.bench.time_recorder), timed here after the
    benchmark instead of in a child of its own: one process start and torch import fewer. Not here (06 then times
    it in its own child) where something in this process imported torch._dynamo: a recorded run defers it, and
    the modes timed with it imported would cost what no recorded run pays."""
    from gpulab.trace import bench as recorder_bench
    from gpulab.trace import lazydynamo

    plan = dict(spec.recorder)
    if lazydynamo.NAME in sys.modules:
        return {**plan, "status": "not_here", "why": "torch._dynamo was imported in the benchmark's process"}
    lazydynamo.defer()
    _say("time the recorder on the workload")
    try:
        recorder_bench.time_recorder(WorkloadConfig(**{**(spec.workload or {}), "device": spec.device}),
                                     list(plan["modes"]), int(plan["repeats"]), plan["json"])
    except Exception as exc:  # noqa: BLE001 - the benchmark's results stand; the cost says why it is missing
        return {**plan, "status": "error", "why": _first_line(exc)}
    return {**plan, "status": "ok"}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m gpulab.bench.worker SPEC.json RESULT.json", file=sys.stderr)
        return 2
    install_from_env()  # the scenario's fixes ($GPULAB_FIXES), so 06 times the fixed configuration
    spec = spec_from_dict(json.loads(Path(argv[0]).read_text()))
    worker(spec, Path(argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
