"""The hang watchdog: run a command in its own process group, watch its progress, and on a hang capture
the evidence (Python stacks, native stacks, GPU view, op-log tail) before killing the whole group.

A Python command runs under `python -m gpulab.trace` (no change to the program) so every PyTorch op is
recorded crash-safely; progress is new completed records (host or GPU); while no op is open (Python code
between ops, interpreter teardown) main-thread CPU time counts too, so only a stuck op or a thread that
sleeps on a lock makes a hang. Before the first op (imports, library loading,
CUDA init) and for non-Python commands there is no op log, so progress is the CPU time of the main threads
of the process tree, or new output: a deadlocked main thread advances neither. (A host spinning in a GPU
sync does burn CPU: without an op log such a hang ends as `timeout`, still with stacks.)
The verdict is computed from what was observed (classify.classify).

    gpulab watch [--stall S] [--timeout S] [--json FILE] [--mode M] [--fault SPEC] -- COMMAND [ARGS...]

Exit codes: 0 ok, 1 error (non-zero exit), 3 hang, 4 crash, 5 timeout, 2 bad usage.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpulab import proc
from gpulab.hang import capture, classify, faults
from gpulab.report import write_json

MODES = ("ops", "sync", "gpu", "stats")
EXIT_CODES = {"ok": 0, "error": 1, "hang": 3, "crash": 4, "timeout": 5}
_PY = re.compile(r"^python(\d+(\.\d+)*)?$")
_PY_FLAGS_NOARG = {"-u", "-O", "-OO", "-B", "-E", "-s", "-S", "-I", "-b", "-bb", "-q", "-v"}
POLL_S = 0.1
STDERR_TAIL_CHARS = 4000


@dataclass(frozen=True)
class Verdict:
    status: str
    phase: str
    cls: str | None
    in_flight_op: dict | None
    host_blocked_in: dict | None
    last_completed_op: dict | None
    ops_completed: int
    signal: str | None
    exit_code: int | None
    elapsed_s: float
    stacks: dict
    evidence: tuple[str, ...]
    planted: str | None
    capture_s: dict
    command: tuple[str, ...]
    log: dict
    stderr_tail: str = ""
    mode: str | None = None
    stall_s: float = 0.0
    timeout_s: float = 0.0
    hang_started_s: float | None = None     # elapsed time of the last progress before the hang
    time_to_verdict_s: float | None = None  # from the last progress to the verdict (stall + capture + kill)
    open_ops: tuple[dict, ...] = ()
    oplog_tail: tuple[dict, ...] = ()
    collapsed: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    left_running: tuple = ()  # processes of the run still alive after it ended by itself (then ended)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["class"] = d.pop("cls")
        return d


# ------------------------------------------------------------------------------------ pure helpers

def python_command(command: Sequence[str]) -> tuple[str, list[str], list[str]] | None:
    """(interpreter, interpreter flags, target args) when COMMAND runs a Python program, else None.

    Recognizes `python[3[.x]] [flags] x.py ...`, `python -m mod ...`, sys.executable, and `x.py ...`.
    `python -c CODE` is not rewritten (gpulab.trace runs a script or a module)."""
    if not command:
        raise ValueError("empty command; give the program to watch after '--', e.g. gpulab watch -- python train.py")
    first = command[0]
    base = os.path.basename(first)
    resolved = shutil.which(first) or first
    is_interp = bool(_PY.match(base)) or os.path.realpath(resolved) == os.path.realpath(sys.executable)
    if is_interp:
        flags, rest = [], list(command[1:])
        while rest and rest[0] in _PY_FLAGS_NOARG or (rest and rest[0] in ("-X", "-W")):
            if rest[0] in ("-X", "-W") and len(rest) > 1:
                flags += rest[:2]
                rest = rest[2:]
            else:
                flags.append(rest.pop(0))
        if not rest or rest[0] == "-c" or (rest[0].startswith("-") and rest[0] != "-m"):
            return None
        if rest[0] == "-m" and len(rest) < 2:
            return None
        # A bare `python`/`python3` means the interpreter gpulab runs in: it has the recorder (and, in a
        # venv, the user's torch), while PATH's python may be another one with neither. An explicit path
        # is kept as given.
        return (sys.executable if os.sep not in first else resolved), flags, rest
    if base.endswith(".py"):
        return sys.executable, [], list(command)
    return None


def _get(rec: Any, key: str, default: Any = None) -> Any:
    if isinstance(rec, Mapping):
        return rec.get(key, default)
    return getattr(rec, key, default)


def op_dict(rec: Any) -> dict | None:
    """An op record -> the verdict's op: name, shapes, dtypes, strides, device, call site."""
    if rec is None:
        return None
    args = list(_get(rec, "args", ()) or ())
    tensors = [a for a in args if isinstance(a, Mapping) and "shape" in a]
    device = next((a.get("device") for a in tensors if a.get("device")), None)
    t0, t1 = _get(rec, "t_start"), _get(rec, "t_end")
    return {
        "seq": _get(rec, "seq"),
        "name": _get(rec, "name"),
        "shapes": [list(a.get("shape") or ()) for a in tensors],
        "dtypes": [a.get("dtype") for a in tensors],
        "strides": [list(a.get("stride") or ()) for a in tensors],
        "contiguous": [a.get("contiguous") for a in tensors],
        "device": device,
        "call_site": _get(rec, "call_site"),
        "thread": _get(rec, "thread"),
        "t_start": t0,
        "t_end": t1,
        "duration_s": (t1 - t0) if (t0 is not None and t1 is not None) else None,
        "gpu_done": _get(rec, "gpu_done"),
    }


def localize(records: Sequence[Any]) -> tuple[Any, Any, list[Any]]:
    """(in-flight record, host-blocked-in record, all open records).

    The sync line lies: when earlier ops finished on the host but their GPU work never completed, the
    earliest of those is the culprit and the op the host is still inside (a sync) is reported apart."""
    open_host = [r for r in records if _get(r, "t_end") is None]
    gpu_pending = [r for r in records if _get(r, "t_end") is not None and _get(r, "gpu_done") is False]
    host = max(open_host, key=lambda r: _get(r, "seq")) if open_host else None
    if gpu_pending:
        first = min(gpu_pending, key=lambda r: _get(r, "seq"))
        blocked = host if host is not None and _get(host, "seq") > _get(first, "seq") else None
        return first, blocked, open_host
    return host, None, open_host


def _python_blocked_frame(py_threads: Sequence[capture.Thread]) -> dict | None:
    main = classify.main_thread(py_threads)
    if not main or not main.frames:
        return None
    func, _, where = main.frames[0].partition(" (")
    return {"name": f"{func} (Python frame, not a recorded op)", "call_site": where.rstrip(")")}


# ------------------------------------------------------------------------------------ process handling

def _main_thread_cpu(pid: int) -> float:
    """CPU seconds of a process's main thread: the thread that imports, loads libraries and inits CUDA.
    Helper threads (the recorder's sampler, BLAS pools) are left out: they tick on while the main one is stuck."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        import psutil
        try:
            t = psutil.Process(pid).cpu_times()
            return t.user + t.system
        except psutil.Error:
            return 0.0


def _tree_cpu(proc_ps) -> float:
    """Sum of the main-thread CPU time over the process tree (a shell waiting on python adds nothing)."""
    import psutil

    try:
        procs = [proc_ps] + proc_ps.children(recursive=True)
    except psutil.Error:
        return 0.0
    return sum(_main_thread_cpu(p.pid) for p in procs)




def _tail(path: Path, chars: int = STDERR_TAIL_CHARS) -> str:
    if not path.exists():
        return ""
    with open(path, "rb") as fh:
        fh.seek(max(0, path.stat().st_size - chars))
        return fh.read().decode("utf-8", "replace")


def _trace():
    try:
        from gpulab import trace
        return trace
    except ImportError:
        return None


def _progress(trace, log: Path) -> tuple[int, int, int] | None:
    """(started, completed, gpu_completed or -1 outside gpu mode) from the log header, or None before it exists."""
    if trace is None or not log.exists():
        return None
    try:
        p = trace.progress(log)
    except Exception:  # a header being created; try again next poll
        return None
    gpu = _get(p, "gpu_completed")
    return int(_get(p, "started") or 0), int(_get(p, "completed") or 0), -1 if gpu is None else int(gpu)


def _read_log(trace, log: Path, caps: dict, notes: list) -> tuple[Any, list]:
    """Snapshot of the op log (it survives the child's death), timed as the `oplog` capture step."""
    t = time.monotonic()
    snap, records = None, []
    if trace is not None and log.exists():
        try:
            snap = trace.read(log)
            records = list(_get(snap, "records", ()) or ())
        except Exception as exc:  # a corrupt log must not lose the rest of the verdict
            notes.append(f"op log unreadable: {type(exc).__name__}: {exc}")
    caps["oplog"] = capture.Capture("oplog", "", "gpulab.trace" if snap is not None else None,
                                    time.monotonic() - t, snap is not None)
    return snap, records


# ------------------------------------------------------------------------------------ the watchdog

def run(command: Sequence[str], *, stall_s: float = 60.0, timeout_s: float = 3600.0, record: bool = True,
        mode: str = "ops", fault: str | None = None, out_dir: str | os.PathLike | None = None,
        capture_gpu: bool | str = "auto", cuda_gdb: bool = False, coredump: bool = False,
        env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
        tail: int = 20, native_tools: tuple[str, ...] = ("py-spy", "gdb"), progress: Any = None) -> Verdict:
    """Run COMMAND under the watchdog and return the verdict (also written to out_dir/verdict.json)."""
    command = [str(c) for c in command]
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not valid; choose one of {', '.join(MODES)}")
    if not (stall_s > 0 and timeout_s > 0):
        raise ValueError(f"stall_s={stall_s!r} and timeout_s={timeout_s!r} must both be > 0")
    if capture_gpu not in (True, False, "auto"):
        raise ValueError(f"capture_gpu={capture_gpu!r}; choose True, False or 'auto'")
    spec = faults.parse(fault)
    out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="gpulab-watch-"))
    out.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda msg: print(f"[gpulab watch] {msg}", file=sys.stderr, flush=True))
    log, fh_file = out / "ops.log", out / "faulthandler.txt"
    stdout_f, stderr_f = out / "stdout.txt", out / "stderr.txt"
    for p in (log, fh_file):
        if p.exists():
            p.unlink()
    pyc = python_command(command) if record else None
    trace = _trace() if pyc else None
    notes: list[str] = []
    if pyc and trace is None:
        notes.append("gpulab.trace is not importable here: the command runs without an op log")
        pyc = None
    if spec is not None and pyc is None:
        raise ValueError(f"fault={fault!r} needs a Python command run with record=True (it is planted by "
                         f"python -m gpulab.trace); got {command!r}")
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONUNBUFFERED"] = "1"
    if pyc:
        interp, flags, rest = pyc
        lib_dir = str(Path(__file__).resolve().parent.parent)
        child_env["PYTHONPATH"] = os.pathsep.join([lib_dir] + [p for p in child_env.get("PYTHONPATH", "").split(os.pathsep) if p])
        argv = [interp, *flags, "-m", "gpulab.trace", "--log", str(log), "--mode", mode,
                "--faulthandler", str(fh_file)] + (["--fault", str(spec)] if spec else []) + ["--", *rest]
    else:
        argv = list(command)
    if coredump:
        child_env.update(capture.coredump_env(out))
    import psutil

    say(f"running {' '.join(argv)}  (stall {stall_s:g} s, timeout {timeout_s:g} s, out {out})")
    t0 = time.monotonic()
    child = proc.Child(argv, stdout=stdout_f, stderr=stderr_f, env=child_env, cwd=cwd, label="watched")
    status = None
    caps: dict[str, capture.Capture] = {}
    snap, records = None, []
    last_progress = t0
    hang_started = None
    detected = None
    left: tuple = ()
    try:
        ps = psutil.Process(child.pid)
        last_ops: Any = None
        last_size = -1
        cpu_prev = 0.0
        while True:
            rc = child.poll()
            if rc is not None:
                break
            now = time.monotonic()
            prog = _progress(trace, log)
            cpu = _tree_cpu(ps)
            cpu_grew, cpu_prev = cpu > cpu_prev, cpu
            if prog is not None and prog[0] > 0:
                started, completed, gpu_done = prog
                advanced = (completed, gpu_done) != last_ops   # newly completed records (host or GPU)
                last_ops = (completed, gpu_done)
                between_ops = started == completed and (gpu_done < 0 or gpu_done >= completed)
                if not advanced and between_ops and cpu_grew:
                    advanced = True  # Python work between ops, or interpreter teardown: not inside an op
            else:
                size = (stdout_f.stat().st_size if stdout_f.exists() else 0) + \
                       (stderr_f.stat().st_size if stderr_f.exists() else 0)
                advanced = cpu_grew or size != last_size
                last_size = size
            if advanced:
                last_progress = now
            if now - last_progress > stall_s:
                status, hang_started, detected = "hang", last_progress - t0, now - t0
                say(f"no progress for {stall_s:g} s: capturing evidence")
                break
            if now - t0 > timeout_s:
                status, detected = "timeout", now - t0
                say(f"timeout after {timeout_s:g} s: capturing evidence")
                break
            time.sleep(POLL_S)
        if status in ("hang", "timeout"):
            caps["python"] = capture.python_stacks(child.pid, fh_file if pyc else None)
            caps["native"] = capture.native_stacks(child.pid, timeout_s=10.0, tools=tuple(native_tools))
            snap_dev = None
            if trace is not None and log.exists():
                try:
                    snap_dev = _get(trace.read(log), "device")
                except Exception:
                    snap_dev = None
            want_gpu = capture_gpu is True or (capture_gpu == "auto" and (
                (snap_dev and str(snap_dev).startswith("cuda")) or
                (not pyc and capture.find_tool("nvidia-smi") is not None)))
            if want_gpu or cuda_gdb or coredump:
                caps["gpu"] = capture.gpu_view(child.pid, cuda_gdb=cuda_gdb, coredump_dir=out if coredump else None)
            snap, records = _read_log(trace, log, caps, notes)  # the op-log tail, last, before the kill
    finally:
        # also when the leader already exited: anything it started in its group must go too
        left = child.stop()
    elapsed = time.monotonic() - t0
    rc = child.returncode
    if status is None:
        status = "ok" if rc == 0 else ("crash" if rc < 0 else "error")
    sig = signal.Signals(-rc).name if (rc is not None and rc < 0 and status == "crash") else None

    if "oplog" not in caps:  # the process ended by itself: its log is complete now
        snap, records = _read_log(trace, log, caps, notes)
    started = int(_get(snap, "started", 0) or 0) if snap is not None else 0
    completed = int(_get(snap, "completed", 0) or 0) if snap is not None else 0
    inflight, blocked, open_recs = localize(records) if status != "ok" else (None, None, [])
    if inflight is None and status == "error":
        raised = [r for r in records if _get(r, "raised")]
        if raised:  # the op whose exception ended the program
            inflight = max(raised, key=lambda r: _get(r, "seq"))
            notes.append(f"{_get(inflight, 'name')} raised (the recorder marked it); it is reported as in_flight_op")
    done = [r for r in records if _get(r, "t_end") is not None]
    last_done = max(done, key=lambda r: _get(r, "seq")) if done else None

    py_text = caps["python"].text if "python" in caps else ""
    if status == "crash" and fh_file.exists():
        py_text = fh_file.read_text(errors="replace")
    py_threads = capture.parse_python(py_text) if "(most recent call first)" in py_text else \
        (capture.parse_native(py_text, child.pid) if py_text else ())
    native_text = caps["native"].text if "native" in caps else ""
    native_threads = capture.parse_native(native_text, child.pid)
    phase = classify.host_phase(pyc is not None and snap is not None, started, native_threads, py_threads)
    blocked_d = op_dict(blocked)
    if inflight is not None and blocked is None and _get(inflight, "t_end") is not None:
        blocked_d = _python_blocked_frame(py_threads)  # host waits outside any recorded op
    stderr_tail = _tail(stderr_f)
    evidence = classify.Evidence(
        status=status, phase=phase, in_flight_op=op_dict(inflight), host_blocked_in=blocked_d,
        native=native_threads, python=py_threads, gpu_text=caps["gpu"].text if "gpu" in caps else "",
        signal=sig, exit_code=rc, stderr_tail=stderr_tail, open_ops=tuple(op_dict(r) for r in open_recs))
    if status == "ok":
        cls, facts = None, [f"exit code 0 after {completed} recorded op(s)" if snap is not None else "exit code 0"]
    else:
        c = classify.classify(evidence)
        cls, facts = c.cls, list(c.facts)
    if status in ("hang", "timeout"):
        facts.append(f"the watchdog killed the process group (SIGKILL) after the capture; exit code {rc}")
    if status == "error":
        facts.append(f"exit code {rc}; stderr tail: " + " | ".join(stderr_tail.strip().splitlines()[-3:]))
    if status == "crash" and "Fatal Python error" in py_text:
        facts.append("faulthandler: " + py_text.strip().splitlines()[0])
    for c in caps.values():
        if c.note:
            facts.append(f"{c.step} capture: {c.note}")
    planted_lines = faults.planted_from_stderr(_tail(stderr_f, 200_000))
    planted = str(spec) if spec else (planted_lines[0].split("planted ", 1)[1] if planted_lines else None)
    if planted:
        facts.append(f"PLANTED fault {planted} (a drill: the failure was put there on purpose)")
    if snap is not None and _get(snap, "dropped"):
        notes.append(f"op log ring dropped {_get(snap, 'dropped')} old record(s)")

    # products
    stacks = {"python": py_text, "native": native_text, "gpu": caps["gpu"].text if "gpu" in caps else None}
    files = {"stdout": str(stdout_f), "stderr": str(stderr_f), "op_log": str(log) if log.exists() else None,
             "faulthandler": str(fh_file) if fh_file.exists() else None}
    for name, text in (("stacks_python.txt", py_text), ("stacks_native.txt", native_text),
                       ("stacks_gpu.txt", stacks["gpu"])):
        if text:
            (out / name).write_text(text)
            files[name.split(".")[0]] = str(out / name)
    oplog_tail = tuple(op_dict(r) for r in records[-tail:])
    if oplog_tail:
        (out / "oplog_tail.txt").write_text("\n".join(
            f"{o['seq']:>6} {'OPEN ' if o['t_end'] is None else 'done '}"
            f"{'' if o['gpu_done'] is None else ('gpu-done ' if o['gpu_done'] else 'gpu-PENDING ')}"
            f"{o['name']} {o['shapes']} {o['call_site'] or ''}" for o in oplog_tail) + "\n")
        files["oplog_tail"] = str(out / "oplog_tail.txt")
    files["verdict"] = str(out / "verdict.json")
    capture_s = {k: round(c.seconds, 3) for k, c in caps.items()}
    capture_s["total"] = round(sum(c.seconds for k, c in caps.items() if k != "oplog"), 3)
    now_rel = time.monotonic() - t0
    verdict = Verdict(
        status=status, phase=phase, cls=cls, in_flight_op=op_dict(inflight), host_blocked_in=blocked_d,
        last_completed_op=op_dict(last_done), ops_completed=completed, signal=sig, exit_code=rc,
        elapsed_s=round(elapsed, 3), stacks=stacks, evidence=tuple(facts), planted=planted, capture_s=capture_s,
        command=tuple(command), log=files, stderr_tail=stderr_tail[-2000:], mode=mode if pyc else None,
        stall_s=stall_s, timeout_s=timeout_s,
        hang_started_s=round(hang_started, 3) if hang_started is not None else None,
        time_to_verdict_s=round(now_rel - hang_started, 3) if hang_started is not None else None,
        open_ops=tuple(op_dict(r) for r in open_recs), oplog_tail=oplog_tail,
        collapsed={"python": capture.collapse(py_threads), "native": capture.collapse(native_threads)},
        notes=tuple(notes), left_running=left)
    write_json(out / "verdict.json", verdict.to_dict())
    say(f"{status}" + (f" ({cls})" if cls else "") + (f" in {verdict.in_flight_op['name']}" if verdict.in_flight_op
                                                       else "") + f"; verdict {out / 'verdict.json'}")
    return verdict


# ------------------------------------------------------------------------------------ CLI

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpulab watch", description="Run COMMAND under the hang watchdog and "
                                "write a verdict JSON (status, phase, class, in-flight op, stacks, evidence).",
                                epilog="exit codes: 0 ok, 1 error, 3 hang, 4 crash, 5 timeout, 2 bad usage")
    p.add_argument("--stall", type=float, default=60.0, metavar="S", help="no progress for S seconds is a hang")
    p.add_argument("--timeout", type=float, default=3600.0, metavar="S", help="bound on the whole run")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the verdict here")
    p.add_argument("--out", type=Path, default=None, metavar="DIR", help="products folder (default: a temp dir)")
    p.add_argument("--mode", default="ops", choices=MODES, help="op recording mode of gpulab.trace")
    p.add_argument("--fault", default=None, metavar="SPEC", help="plant a real fault (see gpulab.hang.faults)")
    p.add_argument("--no-record", action="store_true", help="run a Python command as is (no op log)")
    p.add_argument("--cuda-gdb", action="store_true", help="attach cuda-gdb on a hang (~12 s, pauses the process)")
    p.add_argument("--coredump", action="store_true", help="enable and trigger a CUDA user core dump on a hang")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("gpulab watch: give the command after '--', e.g. gpulab watch --stall 30 -- python train.py",
              file=sys.stderr)
        return 2
    try:
        v = run(command, stall_s=args.stall, timeout_s=args.timeout, record=not args.no_record, mode=args.mode,
                fault=args.fault, out_dir=args.out, cuda_gdb=args.cuda_gdb, coredump=args.coredump)
    except (ValueError, faults.FaultSpecError) as exc:
        print(f"gpulab watch: {exc}", file=sys.stderr)
        return 2
    if args.json:
        write_json(args.json, v.to_dict())
    op = v.in_flight_op
    print(f"status {v.status}  phase {v.phase}  class {v.cls}  in-flight {op['name'] if op else None}"
          + (f" at {op['call_site']}" if op and op.get('call_site') else "")
          + (f"  host blocked in {v.host_blocked_in['name']}" if v.host_blocked_in else "")
          + (f"  PLANTED {v.planted}" if v.planted else ""))
    for fact in v.evidence:
        print(f"  - {fact}")
    print(v.log["verdict"])
    return EXIT_CODES.get(v.status, 1)


# ------------------------------------------------------------------------------------ notebook helpers

AUTO_DRILL = "deadlock:aten.mm@3,gil=held"  # a real native deadlock inside the 3rd matmul, GIL held


def resolve_fault(fault: str | None, device: str) -> str | None:
    """The notebooks' `fault` parameter: "none", "auto" (a planted hang drill on a CPU-only machine, none
    on a GPU, where the workload's own behaviour is what we watch) or a spec (see gpulab.hang.faults)."""
    text = "none" if fault is None else str(fault).strip()
    if text.lower() == "auto":
        return AUTO_DRILL if str(device).startswith("cpu") else None
    fs = faults.parse(text)
    return str(fs) if fs else None


def watch_workload(params: Mapping[str, Any], *, out_dir: str | os.PathLike, stall_s: float, timeout_s: float,
                   trace_mode: str = "ops", fault: str | None = "auto", **kw: Any) -> Verdict:
    """Run the notebooks' workload (builtin, module:callable or script:...) under the watchdog."""
    from gpulab import device as _device
    from gpulab import workloads

    dev = _device.resolve(params.get("device", "auto"))
    cfg = workloads.WorkloadConfig.from_params(**{**dict(params), "device": dev})
    return run(workloads.command(cfg), stall_s=stall_s, timeout_s=timeout_s, mode=trace_mode,
               fault=resolve_fault(fault, dev), out_dir=out_dir, **kw)


def _op_brief(op: Mapping[str, Any] | None) -> str:
    if not op:
        return "-"
    shapes = " x ".join(str(tuple(s)) for s in op.get("shapes") or ())
    return f"{op.get('name')} {shapes}".strip()


def verdict_table(v: Verdict):
    """One row per verdict field a person reads first."""
    import pandas as pd

    op = v.in_flight_op or {}
    rows = [("status", v.status), ("phase", v.phase), ("class", v.cls or "-"),
            ("in-flight op", _op_brief(v.in_flight_op)), ("dtypes", ", ".join(map(str, op.get("dtypes") or ())) or "-"),
            ("strides", " x ".join(str(tuple(s)) for s in op.get("strides") or ()) or "-"),
            ("device", op.get("device") or "-"), ("call site", op.get("call_site") or "-"),
            ("host blocked in", (v.host_blocked_in or {}).get("name", "-")),
            ("last completed op", _op_brief(v.last_completed_op)), ("ops completed", v.ops_completed),
            ("signal / exit code", f"{v.signal or '-'} / {v.exit_code}"), ("elapsed", f"{v.elapsed_s:.2f} s"),
            ("time to verdict", f"{v.time_to_verdict_s:.2f} s" if v.time_to_verdict_s is not None else "-"),
            ("planted", f"PLANTED: {v.planted}" if v.planted else "no (a real failure)"),
            ("trace mode", v.mode or "not recorded")]
    return pd.DataFrame(rows, columns=["field", "value"]).set_index("field")


def evidence_table(v: Verdict):
    import pandas as pd

    return pd.DataFrame({"fact": list(v.evidence)})


def stacks_table(v: Verdict, max_chars: int = 400):
    """Collapsed stacks (outermost;...;innermost), one row per thread, innermost end kept when cut."""
    import pandas as pd

    rows = []
    for kind in ("python", "native"):
        for line in v.collapsed.get(kind, ()):
            thread, _, stack = line.partition(": ")
            rows.append({"kind": kind, "thread": thread,
                         "stack (outer;...;inner)": stack if len(stack) <= max_chars else "..." + stack[-max_chars:]})
    return pd.DataFrame(rows, columns=["kind", "thread", "stack (outer;...;inner)"])


def oplog_table(v: Verdict):
    import pandas as pd

    rows = [{"seq": o["seq"], "op": o["name"], "shapes": " x ".join(str(tuple(s)) for s in o["shapes"]),
             "state": "IN FLIGHT" if o["t_end"] is None else "done",
             "gpu": {None: "-", True: "done", False: "PENDING"}[o["gpu_done"]],
             "ms": round(o["duration_s"] * 1e3, 3) if o["duration_s"] is not None else None,
             "call site": o["call_site"]} for o in v.oplog_tail]
    return pd.DataFrame(rows, columns=["seq", "op", "shapes", "state", "gpu", "ms", "call site"])


def plot_time_to_verdict(v: Verdict, ax=None):
    """Where the time between the hang's start and the verdict went: stall window, then each capture."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 2.2))
    if v.time_to_verdict_s is None:
        ax.text(0.5, 0.5, f"status {v.status}: no hang, so no time to verdict", ha="center", va="center")
        ax.set_axis_off()
        return ax
    parts = [("stall window", v.stall_s)] + [(f"{k} capture", s) for k, s in v.capture_s.items()
                                             if k not in ("total", "oplog")]
    parts.append(("kill + verdict", max(0.0, v.time_to_verdict_s - v.stall_s - v.capture_s.get("total", 0.0))))
    left, colors = 0.0, plt.get_cmap("tab10").colors
    for i, (label, width) in enumerate(parts):
        ax.barh(0, width, left=left, color=colors[i % 10], label=f"{label} {width:.2f} s")
        left += width
    ax.axvline(v.stall_s + 5.0, color="k", ls="--", lw=1)
    ax.text(v.stall_s + 5.0, 0.45, " goal: capture within 5 s", fontsize=8, va="bottom")
    ax.set_yticks([])
    ax.set_xlabel("seconds after the last progress (the hang's start)")
    ax.set_title(f"time to verdict {v.time_to_verdict_s:.2f} s ({v.status}, {v.cls})")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=3, fontsize=8, frameon=False)
    return ax


def headline(v: Verdict) -> str:
    """One sentence for the index: what failed, where, and whether it was planted."""
    tag = f" [PLANTED drill: {v.planted}]" if v.planted else ""
    if v.status == "ok":
        return f"the workload finished (ok, {v.ops_completed} ops recorded){tag}"
    where = _op_brief(v.in_flight_op) if v.in_flight_op else f"phase {v.phase}"
    site = f" at {v.in_flight_op['call_site']}" if v.in_flight_op and v.in_flight_op.get("call_site") else ""
    blocked = f"; host blocked in {v.host_blocked_in['name']}" if v.host_blocked_in else ""
    return f"{v.status} ({v.cls}) in {where}{site}{blocked}{tag}"
