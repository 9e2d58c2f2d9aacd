"""Figure: per-op cost of each recorder mode vs a pass-through TorchDispatchMode, PyTorch's DebugMode and a
naive flushed-JSONL recorder, on a 6-layer transformer training step and on many tiny ops. Also the GPU
verification of the recorder (PASS/FAIL lines): every mode on a `steps` run, math-SDPA decomposition and
backward-thread ops recorded on CUDA, gpu-mode completion tracking.

  python benchmarks/bench_trace_overhead.py --out DIR [--device auto|cpu|cuda] [--repeats N]

us/op = (median time with recorder - median time without) / ops; variants interleaved (rotating order).
CPU: small sizes; CUDA: full sizes. Each part is guarded: a failure is recorded and the rest still runs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from gpulab import trace  # noqa: E402
from gpulab.report import write_json  # noqa: E402
from gpulab.trace import bench  # noqa: E402
from gpulab.workloads import WorkloadConfig, prepare  # noqa: E402

GOAL = 1.5


def jsonl_variant(path: Path):
    """The naive crash-safe baseline: one JSON line per op, flushed before the op runs."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class JsonlRecorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.fh = open(path, "a")
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            # repr() only of scalars: the repr of a list of CUDA tensors (AdamW's _foreach ops) would
            # copy them to the host and measure that instead of the recording
            meta = [[list(a.shape), str(a.dtype), list(a.stride()), str(a.device)] if isinstance(a, torch.Tensor)
                    else repr(a)[:32] if isinstance(a, (int, float, bool, str, type(None)))
                    else f"{type(a).__name__}[{len(a)}]" if isinstance(a, (list, tuple)) else type(a).__name__
                    for a in args]
            self.fh.write(json.dumps({"seq": self.n, "op": str(func), "args": meta, "t": time.time(),
                                      "thread": threading.current_thread().name}) + "\n")
            self.fh.flush()
            return func(*args, **(kwargs or {}))

        def __exit__(self, *exc):
            self.fh.close()
            return super().__exit__(*exc)

    return JsonlRecorder


def debugmode_variant():
    try:
        from torch.utils._debug_mode import DebugMode
    except ImportError:
        return None
    return DebugMode


def sizes(device: str) -> dict:
    if device == "cuda":
        return dict(batch=4, heads=16, head_dim=64, text_tokens=128, image_tokens=1024, layers=6, lora_rank=16)
    return dict(batch=1, heads=2, head_dim=16, text_tokens=8, image_tokens=24, layers=6, lora_rank=4)


def workload_fns(device: str, n_tiny: int):
    import torch

    cfg = WorkloadConfig(rung="step", device=device, **sizes(device))
    prep = prepare(cfg)
    x = torch.ones(4, device=device)

    def tiny():
        y = x
        for _ in range(n_tiny):
            y = y + 1
        return y
    return {"transformer_step": prep.fn, "tiny_ops": tiny}


def measure(out: Path, device: str, repeats: int, n_tiny: int, results: dict) -> None:
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else None
    modes = trace.modes_for(device)
    tmp = Path(tempfile.mkdtemp(prefix="bench_trace_"))
    fns = workload_fns(device, n_tiny)
    for wname, fn in fns.items():
        try:
            fn()  # warm up (lazy init, allocator)
            ops = bench.count_ops(fn)
            rec_variants, recs = bench.recorder_variants(modes, tmp)
            variants = {"none": None, "passthrough": bench.passthrough_variant()}
            dm = debugmode_variant()
            if dm is not None:
                variants["debugmode"] = dm
            variants["jsonl_flush"] = jsonl_variant(tmp / f"{wname}.jsonl")
            variants.update(rec_variants)
            samples = bench.time_variants(fn, variants, repeats=repeats, sync=sync)
            for r in recs:
                r.close()
            rows = bench.rows(samples, ops)
            results["figure"][wname] = {"ops": ops, "rows": [dict(r.__dict__, samples_s=list(r.samples_s))
                                                             for r in rows]}
        except Exception:  # noqa: BLE001 - keep the other workload's numbers
            results["errors"][f"figure/{wname}"] = traceback.format_exc()
        write_json(out / "bench_trace_overhead.json", results)


def check(results: dict, name: str, ok: bool, detail: str) -> None:
    results["checks"][name] = {"passed": bool(ok), "detail": detail}
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)


def verify(out: Path, device: str, results: dict) -> None:
    """Real runs in children: every mode on a steps run; math-SDPA decomposition; backward threads."""
    small = sizes(device) | {"layers": 2}
    for mode in (["ops", "sync", "gpu", "stats"] if device == "cuda" else ["ops", "stats"]):
        try:
            cfg = WorkloadConfig(rung="steps", steps=3, device=device, **small)
            rec = trace.record(cfg, mode=mode, out_dir=out / "verify", timeout_s=300, name=f"steps_{mode}")
            s = rec.snapshot
            ok = rec.ok and s is not None and s.started == s.completed > 0 and not s.in_flight()
            detail = f"rc={rec.returncode} ops={s.started if s else None} {rec.elapsed_s:.1f}s"
            if mode == "gpu" and device == "cuda" and s is not None:
                gpu_ok = s.gpu_completed is not None and s.gpu_completed >= s.started - 1
                n_done = sum(r.gpu_done is True for r in s.records)
                ok = ok and gpu_ok and n_done > 0
                detail += f" gpu_completed={s.gpu_completed} records gpu_done={n_done}/{len(s.records)}"
            if mode == "stats" and s is not None:
                bad = trace.first_nonfinite(s)
                detail += f" first_nonfinite={bad.name if bad else None}"
            check(results, f"steps_rung_mode_{mode}", ok, detail + ("" if rec.ok else " " + rec.stderr_tail[-300:]))
        except Exception:  # noqa: BLE001
            check(results, f"steps_rung_mode_{mode}", False, traceback.format_exc()[-400:])
    try:
        cfg = WorkloadConfig(rung="step", sdpa_backend="math", device=device, **small)
        rec = trace.record(cfg, mode="ops", out_dir=out / "verify", timeout_s=300, name="sdpa_math")
        names = [r.name for r in rec.snapshot.records]
        has = {"composite": "aten.scaled_dot_product_attention.default" in names,
               "math": "aten._scaled_dot_product_attention_math.default" in names,
               "bmm": "aten.bmm.default" in names, "softmax": any("softmax" in n for n in names)}
        fused = sorted({n for n in names if "scaled_dot_product" in n and "_math" not in n
                        and n != "aten.scaled_dot_product_attention.default"})
        check(results, f"math_sdpa_decomposition_{device}", rec.ok and all(has.values()) and not fused,
              f"{has} fused kernels seen: {fused}")
        threads = {}
        for r in rec.snapshot.records:
            threads[r.thread] = threads.get(r.thread, 0) + 1
        bwd = [r for r in rec.snapshot.records if r.name.endswith("_backward.default") or "backward" in r.name]
        bwd_threads = sorted({r.thread for r in bwd})
        results["checks_info"] = {"threads": threads, "backward_threads": bwd_threads}
        if device == "cuda":
            other = [t for t in threads if not t.startswith("MainThread")]
            check(results, "backward_ops_on_autograd_threads_recorded", bool(other) and bool(bwd),
                  f"threads={threads} backward-op threads={bwd_threads}")
        else:
            check(results, "backward_ops_recorded_cpu", bool(bwd), f"{len(bwd)} backward ops, threads={threads}")
    except Exception:  # noqa: BLE001
        check(results, f"math_sdpa_decomposition_{device}", False, traceback.format_exc()[-400:])


def table(results: dict) -> str:
    lines = [f"device={results['device']} torch={results['torch']} (us/op over no recorder; ratio = us/op / "
             f"pass-through us/op; goal: ops <= {GOAL}x)"]
    for wname, fig in results["figure"].items():
        lines.append(f"\n{wname} ({fig['ops']} ops per call)")
        lines.append(f"  {'variant':<13}{'median ms':>11}{'us/op':>9}{'ratio':>8}")
        for r in fig["rows"]:
            ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
            lines.append(f"  {r['variant']:<13}{r['median_s'] * 1e3:>11.2f}{r['us_per_op']:>9.2f}{ratio:>8}")
    for name, c in results["checks"].items():
        lines.append(f"{'PASS' if c['passed'] else 'FAIL'} {name}")
    for name in results["errors"]:
        lines.append(f"ERROR {name} (see JSON)")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--repeats", type=int, default=None, help="default 11 on CUDA, 7 on CPU")
    p.add_argument("--tiny-ops", type=int, default=None, help="ops in the tiny-op loop (default 2000 CUDA / 500 CPU)")
    p.add_argument("--skip-verify", action="store_true")
    ns = p.parse_args(argv)
    import torch

    from gpulab import device as _device

    dev = _device.resolve(ns.device).split(":")[0]
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"device": dev, "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if dev == "cuda" else None,
               "cpu_count": os.cpu_count(), "figure": {}, "checks": {}, "errors": {}}
    try:
        import psutil
        results["load_avg"] = os.getloadavg()
        results["cpu_percent_before"] = psutil.cpu_percent(interval=0.5)
    except Exception:  # noqa: BLE001
        pass
    repeats = ns.repeats or (11 if dev == "cuda" else 7)
    n_tiny = ns.tiny_ops or (2000 if dev == "cuda" else 500)
    print(f"bench_trace_overhead: device={dev} repeats={repeats}", file=sys.stderr, flush=True)
    measure(out, dev, repeats, n_tiny, results)
    if not ns.skip_verify:
        verify(out, dev, results)
    write_json(out / "bench_trace_overhead.json", results)
    try:
        rows = [dict(workload=w, **{k: v for k, v in r.items() if k != "samples_s"})
                for w, f in results["figure"].items() for r in f["rows"]]
        import pandas as pd
        pd.DataFrame(rows).to_csv(out / "bench_trace_overhead.csv", index=False)
    except Exception:  # noqa: BLE001
        results["errors"]["csv"] = traceback.format_exc()
    print(table(results))
    return 0 if all(c["passed"] for c in results["checks"].values()) and not results["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
