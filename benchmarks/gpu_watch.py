"""GPU verification of the watchdog (run on the H100; runs on a CPU with small sizes, GPU parts skipped).

Parts, each independent (a failure in one is recorded and the others still run):
  spin_gpu_mode      spin:aten.mm@3 in trace mode gpu: must name the 3rd aten.mm (GPU work never completed)
                     and report the .item() sync apart as host_blocked_in
  spin_ops_mode      the same drill in ops mode: what is seen without GPU progress (the sync line)
  spin_cuda_gdb      the gpu-mode drill with a cuda-gdb attach (GPU view; time to verdict with cuda-gdb)
  spin_coredump      the gpu-mode drill with a user-triggered CUDA core dump
  steps_<mode>       a normal `steps` run of the built-in workload in every trace mode: status ok
  deadlock_custom_op the CPU custom-op deadlock (GIL held): capture time with py-spy alone
  libload            the library-constructor deadlock at startup (needs a C compiler)

    python benchmarks/gpu_watch.py --out DIR [--stall 5] [--skip spin_coredump,...]

Writes DIR/<part>.json (the verdict), DIR/results.json and DIR/results.csv, prints a table last.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from gpulab.hang import faults
from gpulab.hang.watchdog import watch  # noqa: E402

FIX = ROOT / "tests" / "fixtures"
PY = sys.executable


def _has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def _check_spin_gpu(v) -> list[str]:
    bad = []
    if v.status != "hang":
        bad.append(f"status {v.status} != hang")
    if not v.in_flight_op or v.in_flight_op.get("name") != "aten.mm.default":
        bad.append(f"in_flight_op {(v.in_flight_op or {}).get('name')} != aten.mm.default")
    if not v.host_blocked_in:
        bad.append("host_blocked_in is null (the sync should be reported apart)")
    elif v.in_flight_op and (v.host_blocked_in.get("seq") or 0) <= v.in_flight_op.get("seq", 0):
        # The host blocks in whichever later call first waits on the device (seen on an H100: the
        # reduction in `a.sum()`, before `.item()`); what matters is that it is reported apart, later.
        bad.append(f"host_blocked_in {v.host_blocked_in.get('name')} is not a later op than the in-flight one")
    from gpulab import trace  # the whole op log, not the verdict's tail, to count matmuls from the start
    mms = [r for r in trace.read(v.log["op_log"]).records if r.name == "aten.mm.default"]
    if v.in_flight_op and len(mms) >= 3 and v.in_flight_op.get("seq") != mms[2].seq:
        bad.append(f"in-flight mm seq {v.in_flight_op.get('seq')} is not the 3rd mm (seq {mms[2].seq})")
    return bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--stall", type=float, default=5.0)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--skip", default="", help="comma-separated part names to skip")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    cuda = _has_cuda()
    skip = {s for s in a.skip.split(",") if s}
    from gpulab import workloads

    size = {} if cuda else dict(batch=1, heads=2, head_dim=16, text_tokens=8, image_tokens=24, layers=2)
    steps_cmd = workloads.command(workloads.WorkloadConfig.from_params(rung="steps", steps=10 if cuda else 2,
                                                                       device="cuda" if cuda else "cpu", **size))
    spin = [PY, str(FIX / "spin_then_sync.py")]
    parts: list[tuple[str, list[str], dict, bool, object]] = [
        ("spin_gpu_mode", spin, dict(mode="gpu", fault="spin:aten.mm@3"), True, _check_spin_gpu),
        ("spin_ops_mode", spin, dict(mode="ops", fault="spin:aten.mm@3"), True,
         lambda v: [] if v.status == "hang" else [f"status {v.status} != hang"]),
        ("spin_cuda_gdb", spin, dict(mode="gpu", fault="spin:aten.mm@3", cuda_gdb=True), True, _check_spin_gpu),
        ("spin_coredump", spin, dict(mode="gpu", fault="spin:aten.mm@3", coredump=True), True, _check_spin_gpu),
    ]
    for mode in watch.MODES:
        parts.append((f"steps_{mode}", steps_cmd, dict(mode=mode), False,
                      lambda v: [] if v.status == "ok" else [f"status {v.status} != ok: {v.stderr_tail[-300:]}"]))
    parts.append(("deadlock_custom_op", [PY, str(FIX / "custom_op_deadlock.py")], dict(native_tools=("py-spy",)),
                  False, lambda v: [] if (v.status, (v.in_flight_op or {}).get("name")) == (
                      "hang", "gpulab_fixtures.locked_scale.default") and v.stacks["native"] else
                  [f"{v.status} {(v.in_flight_op or {}).get('name')} native={bool(v.stacks['native'])}"]))
    parts.append(("libload", None, {}, False,
                  lambda v: [] if (v.status, v.phase, v.cls) == ("hang", "startup", "library_load") else
                  [f"{v.status} {v.phase} {v.cls}"]))
    results = []
    for name, cmd, kw, needs_cuda, check in parts:
        row = {"part": name}
        if name in skip:
            row.update(result="skipped", why="--skip")
        elif needs_cuda and not cuda:
            row.update(result="skipped", why="needs CUDA (torch.cuda.is_available() is False)")
        else:
            t0 = time.monotonic()
            try:
                if name == "libload":
                    cmd = [PY, str(FIX / "libload_deadlock.py"), str(faults.build_library())]
                v = watch.run(cmd, stall_s=a.stall, timeout_s=a.timeout, out_dir=a.out / name, **kw)
                (a.out / f"{name}.json").write_text(json.dumps(v.to_dict(), indent=1, default=str))
                problems = check(v)
                row.update(result="pass" if not problems else "FAIL", why="; ".join(problems), status=v.status,
                           cls=v.cls, in_flight=(v.in_flight_op or {}).get("name"),
                           in_flight_seq=(v.in_flight_op or {}).get("seq"),
                           host_blocked_in=(v.host_blocked_in or {}).get("name"),
                           time_to_verdict_s=v.time_to_verdict_s, capture_s=v.capture_s, elapsed_s=v.elapsed_s,
                           ops_completed=v.ops_completed, left_running=list(v.left_running),
                           gpu_view=(v.stacks.get("gpu") or "")[:2000])
            except Exception as exc:  # keep going: one part must not lose the others
                row.update(result="ERROR", why=f"{type(exc).__name__}: {exc}", tb=traceback.format_exc()[-3000:])
            row["wall_s"] = round(time.monotonic() - t0, 2)
        results.append(row)
        (a.out / "results.json").write_text(json.dumps({"cuda": cuda, "results": results}, indent=1, default=str))
        print(f"[gpu_watch] {name}: {row['result']} {row.get('why', '')}", file=sys.stderr, flush=True)
    try:
        import pandas as pd
        df = pd.DataFrame(results)
        df.drop(columns=[c for c in ("tb", "gpu_view") if c in df], errors="ignore").to_csv(a.out / "results.csv", index=False)
        cols = [c for c in ("part", "result", "status", "cls", "in_flight", "host_blocked_in", "time_to_verdict_s",
                            "wall_s", "why") if c in df]
        df["capture_s"] = [r.get("capture_s", {}).get("total") if isinstance(r.get("capture_s"), dict) else None
                           for r in results]
        print(df[cols + ["capture_s"]].to_string(index=False, max_colwidth=60))
    except Exception:
        for r in results:
            print(r["part"], r["result"], r.get("why", ""))
    return 0 if all(r["result"] in ("pass", "skipped") for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
