"""The hang watchdog: run a command as a gpulab.proc child, watch its progress, and on a hang capture the
evidence (Python stacks, native stacks, GPU view, op-log tail) before stopping the whole process tree.

A Python command runs under `python -m gpulab.trace` (no change to the program) so every PyTorch op is
recorded crash-safely, and keeps a heartbeat (gpulab.beat: the main thread ran Python bytecode and burnt
CPU). Progress is gpulab.trace.liveness's rule: new completed records (host or GPU) while an op is open;
between ops and before the first op, the heartbeat, so a host thread spinning in a driver call outside any
op (it burns CPU, runs no bytecode) and a polling loop (bytecode, no CPU) are both hangs, while Python that
computes is not. Non-Python commands have neither log nor heartbeat: progress is the CPU time of the main
threads of the process tree, or new output. The verdict is computed from what was observed
(`gpulab.hang.verdict.judge`).

    gpulab watch [--stall S] [--timeout S] [--json FILE] [--mode M] [--fault SPEC] -- COMMAND [ARGS...]

Exit codes: 0 ok, 1 error (non-zero exit), 3 hang, 4 crash, 5 timeout, 2 bad usage, 127 command not found,
128+N when a signal N stopped the watchdog (the watched program is stopped too).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from gpulab import beat, proc, trace, workloads
from gpulab.args import BadInput, json_target, parser, positive, writable_dir
from gpulab.hang import capture, faults, job, jobread
from gpulab.hang.verdict import EXIT_CODES, Observation, Verdict, judge, oplog_line
from gpulab.report import write_json, write_text
from gpulab.trace import follow, liveness, native
from gpulab.trace.liveness import POLL_S, Progress  # noqa: F401 - watch.Progress, as before
from gpulab.trace.run import keep_followed, keep_recorded, recorder_args

MODES = trace.MODES
_PY = re.compile(r"^python(\d+(\.\d+)*)?$")
_PY_FLAGS_NOARG = {"-u", "-O", "-OO", "-B", "-E", "-s", "-S", "-I", "-b", "-bb", "-q", "-v"}
STDERR_TAIL_CHARS = 4000
FIXES_VAR = "GPULAB_FIXES"   # gpulab.fixes.compose.FIXES_VAR: names the fixes a child installs


# ------------------------------------------------------------------------------------ the command

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


def check_command(command: Sequence[str], cwd: str | os.PathLike | None = None) -> None:
    """Refuse, before anything runs, a program that is not there: CommandNotFound (exit 127) for a missing
    executable, FileNotFoundError for a missing Python script."""
    if not command:
        raise ValueError("empty command; give the program to watch after '--', e.g. gpulab watch -- python train.py")
    pyc = python_command(command)
    base = Path(cwd) if cwd else Path.cwd()
    if pyc is not None and pyc[2][0] != "-m":
        script = Path(pyc[2][0])
        if not (script if script.is_absolute() else base / script).is_file():
            raise FileNotFoundError(f"no such Python script: {pyc[2][0]!r} (from {base})")
        return
    exe = command[0]
    if os.sep in exe:
        if not (Path(exe) if Path(exe).is_absolute() else base / exe).exists():
            raise proc.CommandNotFound(exe)
    elif shutil.which(exe) is None:
        raise proc.CommandNotFound(exe)


@dataclass(frozen=True)
class Launch:
    """How the watched child is started, and where its files go."""
    argv: tuple[str, ...]
    env: dict
    recorded: bool            # under the recorder (a Python program)
    out: Path

    @property
    def log(self) -> Path:
        return self.out / "ops.log"

    @property
    def beat(self) -> Path:
        return self.out / "beat"

    @property
    def faulthandler(self) -> Path:
        return self.out / "faulthandler.txt"

    @property
    def procs(self) -> Path:
        """The job folder: every followed process's files (gpulab.trace.follow)."""
        return self.out / "procs"

    @property
    def stdout(self) -> Path:
        return self.out / "stdout.txt"

    @property
    def stderr(self) -> Path:
        return self.out / "stderr.txt"


def launch_plan(command: Sequence[str], out: Path, *, record: bool, mode: str, fault: faults.FaultSpec | None,
                env: Mapping[str, str] | None, coredump: bool, fixes: Sequence[str] = (),
                follow_children: bool = True) -> Launch:
    python = python_command(command)
    pyc = python if record else None
    if fault is not None and pyc is None:
        raise ValueError(f"fault={str(fault)!r} needs a Python command run with record=True (it is planted by "
                         f"python -m gpulab.trace); got {list(command)!r}")
    child_env = dict(os.environ if env is None else env)
    if fixes and not child_env.get(FIXES_VAR):
        # the environment route: the caller that knows the fixes (gpulab.fixes.scenario_env) composes `env`;
        # the child installs them from it. gpulab.hang knows no fix, so a bare list here would be ignored.
        raise ValueError(f"fixes={list(fixes)!r} need an env that carries them: pass "
                         f"env=gpulab.fixes.scenario_env(fixes, base) (it sets ${FIXES_VAR})")
    child_env["PYTHONUNBUFFERED"] = "1"
    if coredump:
        child_env.update(capture.coredump_env(out))
    if python is not None:  # python -m gpulab.trace (or gpulab.fixes.child) starts it; a plain script cannot
        child_env[beat.ENV] = str(out / "beat")
    procs = out / "procs"
    if record and follow_children:   # every Python process the command starts is recorded into procs/
        procs.mkdir(parents=True, exist_ok=True)
        child_env = follow.child_env(child_env, procs, mode)
        native.ensure()   # the followed processes' hot path is built here, never inside the job
    if pyc is None:
        return Launch(tuple(command), child_env, False, out)
    child_env.pop(follow.ENV, None)   # the recorded root follows its children itself (--follow)
    interp, flags, rest = pyc
    interp = workloads.fix_interpreter(interp, child_env.get(workloads.PYTHON_ENV))
    child_env = proc.python_env(child_env)
    # the recorder's C hot path is built in here (never inside the watched program)
    argv = [interp, *flags, *recorder_args(out / "ops.log", mode, out / "faulthandler.txt", fault and str(fault),
                                           follow=procs if follow_children else None)]
    return Launch(tuple(argv + ["--", *rest]), child_env, True, out)


# ------------------------------------------------------------------------------------ progress

def _wait(child: proc.Child, launch: Launch, stall_s: float, timeout_s: float, t0: float,
          say: Callable[[str], None]) -> tuple[str | None, float | None, Any]:
    """Poll until the child ends (None, None), stalls ('hang', last progress) or runs out ('timeout', None);
    and the progress tracker (a JobProgress when the command's processes are followed)."""
    tracker = Progress(child.pid, launch.log if launch.recorded else None, launch.beat,
                       (launch.stdout, launch.stderr))
    if launch.procs.is_dir():
        tracker = liveness.JobProgress(tracker, launch.procs)
    stopped, last = liveness.wait(child, tracker, stall_s=stall_s, timeout_s=timeout_s, t0=t0, poll_s=POLL_S)
    if stopped == "hang":
        say(f"no progress for {stall_s:g} s: capturing evidence")
    elif stopped == "timeout":
        say(f"timeout after {timeout_s:g} s: capturing evidence")
    return stopped, last, tracker


# ------------------------------------------------------------------------------------ a job of processes

def _job_capture(launch: Launch, tracker: Any, root_pid: int, root_python: str, native_tools: Sequence[str],
                 stacks: bool) -> tuple[list, Any, dict]:
    """Every followed process's Python stacks (at once), the views, the cross-process finding, and the
    native stacks of the process the finding names; each process's op-log tail written from the same read.
    Before the stop: the processes are still stuck."""
    left = jobread.read_job(launch.procs)
    metas = {pid: lf.meta for pid, lf in left.items()}
    pythons = {pid: c.text for pid, c in jobread.capture_python(launch.procs, metas).items()} if stacks else {}
    if root_python and not pythons.get(root_pid):
        pythons[root_pid] = root_python
    views = jobread.views(launch.procs, pythons, getattr(tracker, "last", None), left=left)
    jobread.write_tails(launch.procs, left)
    finding = job.analyse(views)
    natives: dict = {}
    culprit = next((p for p in views if p.role == finding.culprit), None)
    if stacks and culprit is not None and culprit.pid != root_pid:
        natives = {pid: c.text for pid, c in jobread.capture_native([culprit.pid], native_tools).items()}
    return views, finding, {"python": pythons, "native": natives}


def _with_job(v: Verdict, launch: Launch, root: int, views: list, finding: Any, stacks: Mapping[str, dict]) -> Verdict:
    """The verdict of a job: the finding's class, culprit and evidence first, the per-process table, and every
    process's stacks as files in the job folder."""
    for kind, by_pid in stacks.items():
        for pid, text in by_pid.items():
            if text:
                write_text(launch.procs / f"{pid}.stacks_{kind}.txt", text)
    rows = []
    for row in finding.processes:
        files = {k: f"procs/{row['pid']}.stacks_{k}.txt" for k in stacks if stacks[k].get(row["pid"])}
        rows.append({**row, "stacks": files})
    culprit = next((p for p in views if p.role == finding.culprit), None)
    plain = json.loads(json.dumps(finding.to_dict()))   # as verdict.json holds it (lists, not tuples)
    changes: dict = {"processes": tuple(rows), "culprit": finding.culprit,
                     "divergence": plain["divergence"]}
    if any(p.ops_completed or p.collectives for p in views):
        changes["phase"] = "ops"
    if finding.cls is None:
        changes["evidence"] = tuple(v.evidence) + tuple(finding.evidence)
        return dataclasses.replace(v, **changes)
    # the job's finding first; what the watchdog saw of the process it started (often a launcher that
    # waits for its children) after it, said to be about that process
    who = next((p.role for p in views if p.pid == root), "the process the watchdog started")
    own = tuple(e if e.startswith(("the watchdog", "exit code", "planted")) else f"{who}: {e}" for e in v.evidence
                if e != "no rule matched the evidence" and not e.startswith("status "))
    changes.update(cls=finding.cls, evidence=tuple(finding.evidence) + own, host_blocked_in=None)
    if culprit is not None and culprit.open_op:
        changes["in_flight_op"] = {**culprit.open_op, "process": culprit.role}
    return dataclasses.replace(v, **changes)



# ------------------------------------------------------------------------------------ evidence

def _read_log(launch: Launch) -> tuple[Any, list[str]]:
    """The op log (it survives the child's death); a corrupt one must not lose the rest of the verdict."""
    if not launch.recorded or not launch.log.exists():
        return None, []
    try:
        return trace.read(launch.log), []
    except Exception as exc:  # noqa: BLE001
        return None, [f"op log unreadable: {type(exc).__name__}: {exc}"]


def _capture(child: proc.Child, launch: Launch, *, capture_gpu: bool | str, cuda_gdb: bool, coredump: bool,
             native_tools: Sequence[str]) -> dict[str, capture.Capture]:
    """Stacks of the live, stuck process, then the GPU view when it is a GPU program."""
    caps = {"python": capture.python_stacks(child.pid, launch.faulthandler if launch.recorded else None),
            "native": capture.native_stacks(child.pid, timeout_s=10.0, tools=tuple(native_tools))}
    device = None
    if launch.recorded and launch.log.exists():
        try:
            device = trace.read_device(launch.log)
        except Exception:  # noqa: BLE001 - the device only decides whether to look at the GPU
            device = None
    want_gpu = capture_gpu is True or (capture_gpu == "auto" and (
        (device and str(device).startswith("cuda")) or
        (not launch.recorded and capture.find_tool("nvidia-smi") is not None)))
    if want_gpu or cuda_gdb or coredump:
        caps["gpu"] = capture.gpu_view(child.pid, cuda_gdb=cuda_gdb, coredump_dir=launch.out if coredump else None)
    return caps


def _tail(path: Path, chars: int = STDERR_TAIL_CHARS) -> str:
    if not path.exists():
        return ""
    with open(path, "rb") as fh:
        fh.seek(max(0, path.stat().st_size - chars))
        return fh.read().decode("utf-8", "replace")


def _products(launch: Launch, v: Verdict) -> dict:
    """Stacks and the op-log tail as files beside the verdict (paths relative to the products folder)."""
    out = launch.out
    files = {"stdout": launch.stdout.name, "stderr": launch.stderr.name,
             "op_log": launch.log.name if launch.log.exists() else None,
             "faulthandler": launch.faulthandler.name if launch.faulthandler.exists() else None}
    for name, text in (("stacks_python.txt", v.stacks.get("python")), ("stacks_native.txt", v.stacks.get("native")),
                       ("stacks_gpu.txt", v.stacks.get("gpu"))):
        if text:
            write_text(out / name, text)
            files[name.split(".")[0]] = name
    if v.oplog_tail:
        write_text(out / "oplog_tail.txt", "\n".join(oplog_line(o) for o in v.oplog_tail) + "\n")
        files["oplog_tail"] = "oplog_tail.txt"
    files["verdict"] = "verdict.json"
    return files


# ------------------------------------------------------------------------------------ the watchdog

def run(command: Sequence[str], *, stall_s: float = 60.0, timeout_s: float = 3600.0, record: bool = True,
        mode: str = "auto", fault: str | None = None, out_dir: str | os.PathLike | None = None,
        capture_gpu: bool | str = "auto", cuda_gdb: bool = False, coredump: bool = False,
        env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
        tail: int = 20, native_tools: tuple[str, ...] = ("py-spy", "gdb"), progress: Any = None,
        fixes: Sequence[str] = (), stacks: bool = True,
        finish: Callable[[Verdict, str | None], Verdict] | None = None) -> Verdict:
    """Run COMMAND under the watchdog and return the verdict (also written to out_dir/verdict.json).
    `log` paths in the verdict are relative to out_dir (`Verdict.log['dir']` is out_dir itself).
    stacks=False skips the stacks and the GPU view on a hang (a bisection probe needs only the outcome
    and the op log; gdb alone can take seconds). `finish(verdict, device)` amends the verdict before it is
    saved: how a caller above gpulab.hang adds what the watchdog cannot know (the fixes to try:
    gpulab.fixes.suggest.with_suggestions). `fixes` only labels the run: `env` must carry them."""
    command = [str(c) for c in command]
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not valid; choose one of {', '.join(MODES)}")
    if not (stall_s > 0 and timeout_s > 0):
        raise ValueError(f"stall_s={stall_s!r} and timeout_s={timeout_s!r} must both be > 0")
    if capture_gpu not in (True, False, "auto"):
        raise ValueError(f"capture_gpu={capture_gpu!r}; choose True, False or 'auto'")
    spec = faults.parse(fault)
    check_command(command, cwd)
    out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="gpulab-watch-"))
    out.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda msg: print(f"[gpulab watch] {msg}", file=sys.stderr, flush=True))
    launch = launch_plan(command, out, record=record, mode=mode, fault=spec, env=env, coredump=coredump,
                         fixes=fixes)
    for p in (launch.log, launch.faulthandler, launch.beat):
        if p.exists():
            p.unlink()
    say(f"running {' '.join(launch.argv)}  (stall {stall_s:g} s, timeout {timeout_s:g} s, out {out})")
    t0 = time.monotonic()
    caps: dict[str, capture.Capture] = {}
    with proc.Child(launch.argv, stdout=launch.stdout, stderr=launch.stderr, env=launch.env, cwd=cwd,
                    label="watched") as child:
        stalled, hang_started, tracker = _wait(child, launch, stall_s, timeout_s, t0, say)
        if stalled and stacks:
            caps = _capture(child, launch, capture_gpu=capture_gpu, cuda_gdb=cuda_gdb, coredump=coredump,
                            native_tools=native_tools)
        elif stalled:
            caps = {"python": capture.Capture("python", "", None, 0.0, False, "not taken (stack capture off)")}
        jobbed = None
        if stalled and getattr(tracker, "procs", None):   # the job has processes besides the one started
            t_job = time.monotonic()
            jobbed = _job_capture(launch, tracker, child.pid, caps["python"].text, native_tools, stacks)
            caps["processes"] = capture.Capture("processes", "", "faulthandler", time.monotonic() - t_job, True)
        t_log = time.monotonic()
        snap, log_notes = _read_log(launch)  # last, before the stop: the op-log tail as the hang left it
        caps["oplog"] = capture.Capture("oplog", "", "gpulab.trace" if snap is not None else None,
                                        time.monotonic() - t_log, snap is not None)
        left = child.stop()
    rc = child.returncode
    if launch.recorded:
        keep_recorded(launch.log)   # the finished op log cut to what was recorded (gpulab.trace.ring.shrink)
    followed = keep_followed(launch.procs) if launch.procs.is_dir() else []

    status = stalled or ("ok" if rc == 0 else ("crash" if rc is not None and rc < 0 else "error"))
    py_text = caps["python"].text if "python" in caps else ""
    if status == "crash" and launch.faulthandler.exists():
        py_text = launch.faulthandler.read_text(errors="replace")
    stderr_tail = _tail(launch.stderr)
    planted = faults.planted_from_stderr(_tail(launch.stderr, 200_000))
    capture_s = {k: round(c.seconds, 3) for k, c in caps.items()}
    capture_s["total"] = round(sum(c.seconds for k, c in caps.items() if k != "oplog"), 3)
    obs = Observation(
        command=tuple(command), status=status, exit_code=rc, elapsed_s=time.monotonic() - t0,
        recorded=launch.recorded and snap is not None, records=tuple(snap.records) if snap is not None else (),
        ops_started=snap.started if snap is not None else 0, ops_completed=snap.completed if snap is not None else 0,
        dropped=snap.dropped if snap is not None else 0, python_text=py_text,
        native_text=caps["native"].text if "native" in caps else "",
        gpu_text=caps["gpu"].text if "gpu" in caps else None,
        capture_notes=tuple((c.step, c.note) for c in caps.values() if c.note), capture_s=capture_s,
        stderr_tail=stderr_tail, planted=str(spec) if spec else (planted[0].split("planted ", 1)[1] if planted else None),
        mode=mode if launch.recorded else None, stall_s=stall_s, timeout_s=timeout_s, hang_started_s=hang_started,
        verdict_at_s=time.monotonic() - t0, pid=child.pid, notes=tuple(log_notes), left_running=left, tail=tail)
    v = judge(obs)
    if jobbed is None and status != "ok" and followed:   # ended by itself: who ended how
        views = jobread.views(launch.procs, {})
        jobbed = (views, job.analyse(views), {})
    if jobbed is not None:
        v = _with_job(v, launch, child.pid, *jobbed)
    v = dataclasses.replace(v, log={"dir": str(out), **_products(launch, v)})
    if finish is not None:
        v = finish(v, log_device(launch.log if launch.recorded else None))
    write_json(out / "verdict.json", v.to_dict())
    say(f"{v.status}" + (f" ({v.cls})" if v.cls else "") + (f" in {v.in_flight_op['name']}" if v.in_flight_op
                                                            else "") + f"; verdict {out / 'verdict.json'}")
    return v


def log_device(log: str | os.PathLike | None) -> str | None:
    """Where a recorded program ran, from its op log (None when unknown): only a hint, never an error."""
    try:
        return trace.read_device(Path(log)) if log and Path(log).exists() else None
    except Exception:  # noqa: BLE001 - only a hint of where the program ran
        return None


# ------------------------------------------------------------------------------------ CLI

def _parser():
    p = parser("gpulab watch", "Run COMMAND under the hang watchdog and write a verdict JSON (status, phase, "
               "class, in-flight op, stacks, evidence). Exit codes: 0 ok, 1 error, 3 hang, 4 crash, 5 timeout, "
               "2 bad usage, 127 command not found, 128+N stopped by signal N.",
               "gpulab watch --stall 30 --json verdict.json -- python train.py --lr 1e-4")
    p.add_argument("--stall", type=positive("--stall"), default=60.0, metavar="S",
                   help="no progress for S seconds is a hang")
    p.add_argument("--timeout", type=positive("--timeout"), default=3600.0, metavar="S", help="bound on the whole run")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the verdict here")
    p.add_argument("--out", type=Path, default=None, metavar="DIR", help="products folder (default: a new temp dir)")
    p.add_argument("--mode", default="auto", choices=MODES, help="op recording mode of gpulab.trace (auto: ops, plus GPU completion tracking once CUDA is up)")
    p.add_argument("--fault", default=None, metavar="SPEC", help="plant a real fault (a self-test; see gpulab.hang.faults)")
    p.add_argument("--no-record", action="store_true", help="run a Python command as is (no op log)")
    p.add_argument("--cuda-gdb", action="store_true", help="attach cuda-gdb on a hang (~12 s, pauses the process)")
    p.add_argument("--coredump", action="store_true", help="enable and trigger a CUDA user core dump on a hang")
    p.add_argument("command", nargs="*", help="-- COMMAND [ARGS...]")
    return p


def main(argv: Sequence[str] | None = None,
         finish: Callable[[Verdict, str | None], Verdict] | None = None) -> int:
    """`gpulab watch` without the fix suggestions; the command itself is gpulab.fixes.commands.watch_main,
    which passes `finish` (gpulab.hang cannot import gpulab.fixes)."""
    raw = list(sys.argv[1:] if argv is None else argv)
    opts, command = (raw[:raw.index("--")], raw[raw.index("--") + 1:]) if "--" in raw else (raw, [])
    args = _parser().parse_args(opts)
    command = command or list(args.command)
    if not command:
        print("gpulab watch: give the command after '--', e.g. gpulab watch --stall 30 -- python train.py",
              file=sys.stderr)
        return proc.EXIT_BAD_INPUT
    try:
        json_target(args.json)
        if args.out:
            writable_dir(args.out, "--out")
        v = run(command, stall_s=args.stall, timeout_s=args.timeout, record=not args.no_record, mode=args.mode,
                fault=args.fault, out_dir=args.out, cuda_gdb=args.cuda_gdb, coredump=args.coredump,
                finish=finish)
    except proc.CommandNotFound as exc:
        print(f"gpulab watch: {exc}", file=sys.stderr)
        return proc.EXIT_NOT_FOUND
    except (ValueError, FileNotFoundError, BadInput, faults.FaultSpecError) as exc:
        print(f"gpulab watch: {exc}", file=sys.stderr)
        return proc.EXIT_BAD_INPUT
    if args.json:
        write_json(args.json, v.to_dict())
    op = v.in_flight_op
    print(f"status {v.status}  phase {v.phase}  class {v.cls}  in-flight {op['name'] if op else None}"
          + (f" at {op['call_site']}" if op and op.get('call_site') else "")
          + (f"  host blocked in {v.host_blocked_in['name']}" if v.host_blocked_in else "")
          + (f"  process {v.culprit}" if v.culprit else "")
          + (f"  collective {v.divergence['op']} (group {v.divergence['group']}, seq {v.divergence['seq']})"
             if v.divergence else "")
          + (f"  SELF-TEST (planted {v.planted})" if v.planted else ""))
    for fact in v.evidence:
        print(f"  - {fact}")
    print(Path(v.log["dir"]) / v.log["verdict"])
    return EXIT_CODES.get(v.status, 1)


# ------------------------------------------------------------------------------------ the workload

def resolve_fault(fault: str | None) -> str | None:
    """The notebooks' `fault` parameter: 'none' (the default: the workload runs as it is) or a fault spec,
    which makes the run a labelled self-test of the watchdog."""
    fs = faults.parse(fault)
    return str(fs) if fs else None


def watch_workload(cfg: Any, *, out_dir: str | os.PathLike, stall_s: float, timeout_s: float,
                   trace_mode: str = "auto", fault: str | None = None, **kw: Any) -> Verdict:
    """Run the notebooks' workload (a WorkloadConfig: builtin, module:callable or script:...) under the watchdog."""
    return run(workloads.command(cfg), stall_s=stall_s, timeout_s=timeout_s, mode=trace_mode,
               fault=resolve_fault(fault), out_dir=out_dir, **kw)
