"""GPU time per op type, beside the recorder's host time: the built-in workload's rung once more under
torch.profiler (CUDA activity) in a gpulab.proc child, after one warm-up run so set-up is not counted.

Why a separate run: the crash-safe recorder times the host side of each op (the launch); on a GPU the
kernel runs later and asynchronously, so only the GPU's own activity records say how long it took.

  python -m gpulab.trace.profile --json OUT -- <python -m gpulab.workloads flags>
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

from gpulab import beat, builtin_model, proc, report, workloads
from gpulab.trace import liveness


def _packet(name: str) -> str:
    """'aten::mm' (profiler) and 'aten.mm.default' (dispatcher) -> 'aten.mm'."""
    parts = name.replace("::", ".").split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else name


def not_measured(cfg: workloads.WorkloadConfig, first: Any = None) -> str:
    """Why the GPU times are not measured ("" when they are). first: 02's first Recording; when it did not
    finish well the profiler run is not wanted (it would fail again)."""
    if not str(cfg.device).startswith("cuda"):
        return "GPU time per op: not measured (the workload runs on the CPU, where host time is the op's time)"
    if cfg.kind != "builtin":
        return "GPU time per op: measured for the built-in workload only (a user program is not re-run)"
    if first is not None and not first.ok:
        return f"GPU time per op: not measured (the workload did not finish: {first.status})"
    return ""


def gpu_times(cfg: workloads.WorkloadConfig, out_dir: str | Path, timeout_s: float = 600.0,
              stall_s: float | None = None, first: Any = None, cancel: threading.Event | None = None):
    """-> (DataFrame of op type, calls, GPU ms; or None, and a sentence saying what was measured or why not,
    not_measured's). The profiler child is stopped after stall_s seconds without progress, or once `cancel` is
    set (02 no longer wants it: gpulab.trace.followups)."""
    import pandas as pd

    why = not_measured(cfg, first)
    if why:
        return None, why
    out = Path(out_dir)
    js = out / "gpu_times.json"
    beat_path = out / "gpu_times.beat"
    try:
        r = liveness.run([sys.executable, "-m", "gpulab.trace.profile", "--json", str(js), "--",
                          *workloads.cli_args(cfg)], timeout_s=timeout_s, stall_s=stall_s, beat_path=beat_path,
                         env=proc.python_env(), stdout=out / "gpu_times.log", stderr=subprocess.STDOUT)
    finally:
        beat_path.unlink(missing_ok=True)
    data = report.read_json(js, default=None)
    if r.status != "ok" or not data:
        return None, f"GPU time per op: the profiler run ended as {r.status} (see gpu_times.log)"
    frame = pd.DataFrame(data["rows"])
    return frame, (f"GPU time per op type from one {cfg.rung} run under torch.profiler after a warm-up run; "
                   f"{data['gpu_ms_total']:.3g} ms of GPU work in {data['wall_ms']:.3g} ms of wall time")


def merge(summ, gpu):
    """The host-time summary with a GPU ms column (by op type; composite SDPA names included)."""
    if gpu is None or summ.empty:
        return summ
    g = gpu.set_index("op")["gpu_ms"]
    out = summ.copy()
    out["gpu_ms"] = [g.get(_packet(n)) for n in out["name"]]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    import time

    beat.start_from_env()   # before torch: its parent stops a child that stalls
    import torch
    from torch.profiler import ProfilerActivity, profile

    raw = list(sys.argv[1:] if argv is None else argv)
    if "--" not in raw:
        print("usage: python -m gpulab.trace.profile --json OUT -- <gpulab.workloads flags>", file=sys.stderr)
        return 2
    i = raw.index("--")
    p = argparse.ArgumentParser(prog="python -m gpulab.trace.profile")
    p.add_argument("--json", required=True, type=Path)
    json_path = p.parse_args(raw[:i]).json
    cfg = workloads.parse_cli(raw[i + 1:])
    prep = builtin_model.prepare(cfg)
    prep.fn()  # warm-up: handles, autotuning, lazy module loading
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        prep.fn()
        torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3
    rows: dict[str, dict[str, Any]] = {}
    for e in prof.key_averages():
        gpu_us = float(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0) or 0.0)
        if not gpu_us or "::" not in e.key:
            continue
        r = rows.setdefault(_packet(e.key), {"op": _packet(e.key), "calls": 0, "gpu_ms": 0.0})
        r["calls"] += e.count
        r["gpu_ms"] += gpu_us / 1e3
    ordered = sorted(rows.values(), key=lambda r: -r["gpu_ms"])
    report.write_json(json_path, {"rows": ordered, "wall_ms": wall_ms,
                                  "gpu_ms_total": sum(r["gpu_ms"] for r in ordered)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
