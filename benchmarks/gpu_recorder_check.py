"""GPU verification of the recorder's GPU-progress tracking (run on the H100; < 3 minutes there).

Parts, each independent (a failure is recorded and the others still run):
  mechanism    which GPU-progress mechanism the driver allows (memop-ring, memop-pinned, events) and, per
               mechanism forced in turn and for `auto`, a CUDA program recorded to the end: every tracked
               op GPU-done, GPU progress caught up with the host, ops on a side stream and on autograd's
               threads tracked on their own streams
  drill_sleep  a program whose 3rd matmul is followed by `torch.cuda._sleep(1 << 62)` (a kernel that
               never completes), the host blocking later in `.item()`, under gpulab.hang.watchdog.watch.run(mode=
               "auto", stall_s=5): in_flight_op must be the first recorded op queued behind the spin (the
               spin is not a dispatched op), host_blocked_in the later op the host waits in
  drill_fault  the planted fault spin:aten.mm@3 (the spin inside the 3rd matmul): in_flight_op = that mm
  heldback     held back while the recorder was written: a Triton kernel that loops forever, wrapped as a
               custom op (in_flight_op = that op), or without Triton a `_sleep` on a side stream (the
               first op queued behind it on that stream)
  benchmarks   bench_trace_overhead.py and bench_step_time.py at GPU sizes (fewer rounds)

    python benchmarks/gpu_recorder_check.py --out DIR [--stall 5] [--skip part,...] [--repeats 3]

Everything printed also goes to DIR/results.json (and each part's verdict or table under DIR/<part>/).
"""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from gpulab import proc, trace  # noqa: E402
from gpulab.hang.watchdog import watch  # noqa: E402
from gpulab.trace import gpu, native  # noqa: E402
from gpulab.trace.run import _child_env, bootstrap_command  # noqa: E402

PY = sys.executable
PARTS = ("mechanism", "drill_sleep", "drill_fault", "heldback", "benchmarks")

MECH_PROGRAM = textwrap.dedent('''
    """Recorded to the end under one GPU mechanism: default stream, a side stream, backward."""
    import torch
    x = torch.randn(512, 512, device="cuda", requires_grad=True)
    w = torch.randn(512, 512, device="cuda")
    for _ in range(20):
        y = torch.relu(x @ w)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        z = (y @ w).sin()
    torch.cuda.current_stream().wait_stream(s)
    loss = (y * z).sum()
    loss.backward()          # backward ops run on autograd's device thread
    print(float(loss.item()))
    torch.cuda.synchronize()
''')

SLEEP_DRILL = textwrap.dedent('''
    """The 3rd matmul is followed by a kernel that never completes; the host blocks later in .item()."""
    import torch
    a = torch.randn(1024, 1024, device="cuda")
    b = torch.randn(1024, 1024, device="cuda")
    torch.cuda.synchronize()
    for i in range(6):
        c = a @ b
        if i == 2:
            torch.cuda._sleep(1 << 62)   # spins forever on the current stream
        c = torch.softmax(c, dim=-1) + 1.0
        a = c / c.norm()
    print("queued; now waiting on the device", flush=True)
    print(a.sum().item())
''')

SIDE_STREAM_DRILL = textwrap.dedent('''
    """Held back: the spin on a side stream; the first op queued behind it there is the culprit."""
    import torch
    x = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    y = x @ x
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        z = y @ y
        torch.cuda._sleep(1 << 62)
        w = z + 1                      # queued behind the spin on the side stream
    torch.cuda.current_stream().wait_stream(s)
    v = y * 2                          # the main stream now waits for the side stream too
    print("queued; now waiting on the device", flush=True)
    print((v + w).sum().item())
''')

TRITON_DRILL = textwrap.dedent('''
    """Held back: a Triton kernel that loops forever, called as a custom op after two matmuls."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def spin(flag_ptr, out_ptr):
        v = tl.load(flag_ptr, volatile=True)
        while v == 0:
            v = tl.load(flag_ptr, volatile=True)
        tl.store(out_ptr, v)

    @torch.library.custom_op("gpulab_check::triton_spin", mutates_args=())
    def triton_spin(x: torch.Tensor) -> torch.Tensor:
        flag = torch.zeros(1, dtype=torch.int32, device=x.device)
        out = torch.empty(1, dtype=torch.int32, device=x.device)
        spin[(1,)](flag, out)
        return x + out.to(x.dtype)

    one = torch.ones(1, dtype=torch.int32, device="cuda")
    spin[(1,)](one, torch.empty(1, dtype=torch.int32, device="cuda"))   # compile now (flag 1: returns)
    torch.cuda.synchronize()
    a = torch.randn(1024, 1024, device="cuda")
    for i in range(4):
        a = torch.softmax(a @ a, dim=-1)
        if i == 1:
            a = torch.ops.gpulab_check.triton_spin(a)
    print("queued; now waiting on the device", flush=True)
    print(a.sum().item())
''')


def say(msg: str) -> None:
    print(f"[gpu_recorder_check] {msg}", file=sys.stderr, flush=True)


def cuda_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def part_mechanism(out: Path) -> dict:
    """Driver support, then the same program recorded under each mechanism and under auto."""
    drv = gpu.load()
    res: dict = {"support": gpu.support(drv).to_dict(), "runs": {}}
    prog = out / "mechanism_program.py"
    prog.write_text(MECH_PROGRAM)
    problems = []
    for run_name in ("auto", *gpu.MECHANISMS, "events/python"):   # the last: markers from the pure-Python path
        mech, _, path = run_name.partition("/")
        log = out / f"{run_name.replace('/', '-')}.log"
        cmd = bootstrap_command([str(prog)], log, "auto", gpu_mechanism=None if mech == "auto" else mech)
        env = _child_env() if not path else {**_child_env(), "GPULAB_TRACE_NATIVE": "0"}
        t0 = time.monotonic()
        r = proc.run(cmd, timeout_s=120, env=env, capture=True, label=run_name)
        row: dict = {"exit": r.returncode, "seconds": round(time.monotonic() - t0, 2),
                     "stderr_tail": r.stderr[-600:]}
        if log.exists():
            s = trace.read(log)
            tracked = [x for x in s.records if x.stream is not None]
            row.update(mechanism=s.gpu_mechanism, notes=s.gpu_notes, ops=s.started, tracked=len(tracked),
                       gpu_done=sum(x.gpu_done is True for x in tracked), gpu_completed=s.gpu_completed,
                       completed=s.completed,
                       streams=[{"index": x.index, "handle": hex(x.handle), "device": x.device, "done": x.done,
                                 "enqueued": x.enqueued} for x in s.streams],
                       threads=sorted({x.thread.split(" (")[0] for x in tracked}))
            want = mech if mech != "auto" else None
            bad = []
            if r.returncode != 0:
                bad.append(f"exit {r.returncode}")
            if want and want.startswith("memop") and not res["support"].get("stream_mem_ops"):
                # the driver refuses stream memory ops (nvidia module option NVreg_EnableStreamMemOPs=0):
                # the forced mechanism must then decline with the reason in the notes, and recording go on
                row["available"] = False
                if s.gpu_mechanism != "none" or "MEM_OPS" not in s.gpu_notes:
                    bad.append(f"memop refused by the driver, but mechanism {s.gpu_mechanism!r} notes {s.gpu_notes!r}")
                if s.completed != s.started or r.returncode != 0:
                    bad.append("recording did not go on without GPU progress")
                row["problems"] = bad
                problems += [f"{run_name}: {b}" for b in bad]
                res["runs"][run_name] = row
                say(f"mechanism {run_name}: not available on this driver ({s.gpu_notes}) problems={bad}")
                continue
            if want and s.gpu_mechanism != want:
                bad.append(f"mechanism {s.gpu_mechanism!r} != {want!r} ({s.gpu_notes})")
            if not tracked or len(tracked) != row["gpu_done"]:
                bad.append(f"{row['gpu_done']}/{len(tracked)} tracked ops GPU-done")
            if s.gpu_completed != s.completed:
                bad.append(f"gpu_completed {s.gpu_completed} != completed {s.completed}")
            if len(s.streams) < 2:
                bad.append(f"{len(s.streams)} stream(s) tracked, expected the default and the side stream")
            row["problems"] = bad
            problems += [f"{run_name}: {b}" for b in bad]
        else:
            row["problems"] = ["no log"]
            problems.append(f"{run_name}: no log")
        res["runs"][run_name] = row
        say(f"mechanism {run_name}: {row.get('mechanism')} ops={row.get('ops')} tracked={row.get('tracked')} "
            f"gpu_done={row.get('gpu_done')} problems={row['problems']}")
    res["auto_uses"] = res["runs"].get("auto", {}).get("mechanism")
    res["problems"] = problems
    return res


def _verdict_row(v, expected) -> dict:
    op = v.in_flight_op or {}
    row = {"status": v.status, "class": v.cls, "localized": v.localized, "in_flight_op": op.get("name"),
           "in_flight_seq": op.get("seq"), "in_flight_call_site": op.get("call_site"),
           "host_blocked_in": (v.host_blocked_in or {}).get("name"),
           "host_blocked_seq": (v.host_blocked_in or {}).get("seq"), "time_to_verdict_s": v.time_to_verdict_s,
           "expected_op": expected.name if expected else None, "expected_seq": expected.seq if expected else None,
           "evidence": list(v.evidence)[:6]}
    bad = []
    if v.status != "hang":
        bad.append(f"status {v.status} != hang")
    if expected is None:
        bad.append("expected op not found in the log")
    elif op.get("seq") != expected.seq:
        bad.append(f"in_flight_op {op.get('name')}#{op.get('seq')} != expected {expected.name}#{expected.seq}")
    if v.localized not in ("gpu_event", "driver"):  # both rest on GPU progress (see Verdict.localized)
        bad.append(f"localized {v.localized!r} is not gpu_event or driver (GPU progress)")
    if not v.host_blocked_in:
        bad.append("host_blocked_in is null (the host's wait should be reported apart)")
    row["problems"] = bad
    return row


def _drill(out: Path, name: str, program: str | None, expect, stall: float, **kw) -> dict:
    """Run a drill under the watchdog in auto mode; `expect(records)` -> the op that must be named."""
    cmd = [PY, str(ROOT / "tests" / "fixtures" / "spin_then_sync.py")]
    if program is not None:
        prog = out / f"{name}.py"
        prog.write_text(program)
        cmd = [PY, str(prog)]
    v = watch.run(cmd, stall_s=stall, timeout_s=120, mode="auto", out_dir=out / name, progress=lambda m: None, **kw)
    (out / f"{name}.verdict.json").write_text(json.dumps(v.to_dict(), indent=1, default=str))
    snap = trace.read(Path(v.log["dir"]) / v.log["op_log"]) if v.log.get("op_log") else None
    records = list(snap.records) if snap else []
    row = _verdict_row(v, expect(records))
    row["gpu_mechanism"] = snap.gpu_mechanism if snap else None
    row["gpu_notes"] = snap.gpu_notes if snap else None
    say(f"{name}: {row['status']} class={row['class']} localized={row['localized']} in_flight_op="
        f"{row['in_flight_op']}#{row['in_flight_seq']} host_blocked_in={row['host_blocked_in']} expected="
        f"{row['expected_op']}#{row['expected_seq']} mechanism={row['gpu_mechanism']} problems={row['problems']}")
    return row


def _after_nth_mm(n: int):
    def pick(records):
        mms = [r for r in records if r.name == "aten.mm.default"]
        if len(mms) < n:
            return None
        return next((r for r in records if r.seq > mms[n - 1].seq and r.depth == 0), None)
    return pick


def _nth_mm(n: int):
    def pick(records):
        mms = [r for r in records if r.name == "aten.mm.default"]
        return mms[n - 1] if len(mms) >= n else None
    return pick


def part_heldback(out: Path, stall: float) -> dict:
    try:
        import triton  # noqa: F401
        have_triton = True
    except Exception:  # noqa: BLE001
        have_triton = False
    if have_triton:
        row = _drill(out, "heldback_triton", TRITON_DRILL,
                     lambda recs: next((r for r in recs if r.name == "gpulab_check.triton_spin.default"), None), stall)
        row["variant"] = "triton infinite loop as a custom op"
    else:
        row = _drill(out, "heldback_side_stream", SIDE_STREAM_DRILL, _after_nth_mm(2), stall)
        row["variant"] = "_sleep on a side stream (triton not importable)"
    return row


BENCH_VARIANTS = {"bench_trace_overhead": "none,passthrough,ops,auto,gpu_events",
                  "bench_step_time": "none,ops,auto,gpu_events"}


def part_benchmarks(out: Path, repeats: int) -> dict:
    """Both benchmarks at GPU sizes, the variants that decide the goals (the scripts alone run them all)."""
    res = {}
    for name, variants in BENCH_VARIANTS.items():
        r = proc.run([PY, str(ROOT / "benchmarks" / f"{name}.py"), "--out", str(out / name), "--repeats",
                      str(repeats), "--variants", variants], timeout_s=150, capture=True, label=name)
        table = r.stdout.strip()
        res[name] = {"exit": r.returncode, "timed_out": r.timed_out, "table": table, "stderr_tail": r.stderr[-1500:]}
        say(f"{name} (exit {r.returncode}{', timed out' if r.timed_out else ''}):\n{table}")
    res["problems"] = [f"{k} exit {v['exit']}" for k, v in res.items() if isinstance(v, dict) and v["exit"] != 0]
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--stall", type=float, default=5.0)
    p.add_argument("--skip", default="", help=f"comma-separated parts to skip: {', '.join(PARTS)}")
    p.add_argument("--repeats", type=int, default=2, help="benchmark rounds (2 keeps the check under 3 min)")
    a = p.parse_args(argv)
    skip = {s for s in a.skip.split(",") if s}
    bad = skip - set(PARTS)
    if bad:
        p.error(f"--skip {','.join(sorted(bad))}: not a part; choose from {', '.join(PARTS)}")
    a.out.mkdir(parents=True, exist_ok=True)
    cuda = cuda_available()
    built, why = native.ensure()
    results: dict = {"cuda": cuda, "native_hot_path": str(built) if built else f"not built: {why}",
                     "python": sys.version.split()[0], "parts": {}}
    say(f"cuda={cuda} native hot path: {results['native_hot_path']}")
    runs = {
        "mechanism": lambda: part_mechanism(a.out),
        "drill_sleep": lambda: _drill(a.out, "drill_sleep", SLEEP_DRILL, _after_nth_mm(3), a.stall),
        "drill_fault": lambda: _drill(a.out, "drill_fault", None, _nth_mm(3), a.stall, fault="spin:aten.mm@3"),
        "heldback": lambda: part_heldback(a.out, a.stall),
        "benchmarks": lambda: part_benchmarks(a.out, a.repeats),
    }
    for name in PARTS:
        t0 = time.monotonic()
        if name in skip:
            row = {"result": "skipped", "why": "--skip"}
        elif not cuda and name != "benchmarks":
            row = {"result": "skipped", "why": "needs CUDA (torch.cuda.is_available() is False)"}
        else:
            try:
                row = runs[name]()
                row["result"] = "pass" if not row.get("problems") else "FAIL"
            except Exception as exc:  # noqa: BLE001 - one part must not lose the others
                row = {"result": "ERROR", "why": f"{type(exc).__name__}: {exc}", "tb": traceback.format_exc()[-3000:]}
        row["wall_s"] = round(time.monotonic() - t0, 1)
        results["parts"][name] = row
        (a.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
        say(f"{name}: {row['result']} ({row['wall_s']} s) {row.get('why', '')} {row.get('problems', '')}")
    print("\npart          result   seconds  detail")
    for name, row in results["parts"].items():
        detail = row.get("why") or "; ".join(row.get("problems") or []) or (
            f"in_flight_op={row.get('in_flight_op')} host_blocked_in={row.get('host_blocked_in')} "
            f"class={row.get('class')} localized={row.get('localized')} mechanism={row.get('gpu_mechanism')}"
            if "in_flight_op" in row else f"auto uses {row.get('auto_uses')}" if "auto_uses" in row else "")
        print(f"{name:<13} {row['result']:<8} {row['wall_s']:>7}  {detail}")
    return 0 if all(r["result"] in ("pass", "skipped") for r in results["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
