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

For a job that runs for days: no timeout unless asked for; the job's output shown live with a bounded tail
kept in OUT (gpulab.tee); OUT/status.json rewritten every few seconds (gpulab.hang.status); the job
folder and the watchdog's memory bounded (ended processes' files beyond the latest few go); a signal passed on
to the job, which gets a grace period to end by itself; and with --on-stall keep, each stall captured into its
own folder while the watch goes on, judged as a usual pause or not (gpulab.hang.stalls).

    gpulab watch [--stall S] [--timeout S] [--on-stall stop|keep] [--grace S] [--json FILE] [--mode M]
                 [--fault SPEC] -- COMMAND [ARGS...]

Exit codes: the job's own when it ended by itself (0 ok, its exit status, 128+N when signal N ended it), 3
hang, 5 timeout, 2 bad usage, 127 command not found, 128+N when a signal N stopped the watchdog (passed on to
the job first).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import select
import shutil
import signal
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from gpulab import beat, proc, report, tee, trace, workloads
from gpulab.args import BadInput, json_target, parser, positive, writable_dir
from gpulab.hang import capture, classify, faults, job, jobread, stalls
from gpulab.hang import status as status_mod
from gpulab.hang import memcheck, owner
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
ON_STALL = ("stop", "keep")
GRACE_S = 30.0           # the CLI's wait for a job that was passed a signal
APART_LIMIT_S = 300.0    # a capture's forked copy gets this long (captures take seconds; 29 s seen under load)
MAX_CAPTURES = 4         # capture folders kept under keep: the first and the latest half each (the verdict lists every stall)
KEEP_ENDED = 8           # ended processes whose files stay in the job folder: the latest ones
PRUNE_EVERY_S = 2.0      # ended processes pruned this often: DataLoader workers of short epochs pile up between prunes


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
        native.ensure_all()   # the followed processes' hot path is built here, never inside the job
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

def _tracker(child: proc.Child, launch: Launch) -> Any:
    """liveness's judge of the child (a JobProgress when the command's processes are followed)."""
    tracker: Any = Progress(child.pid, launch.log if launch.recorded else None, launch.beat,
                            (launch.stdout, launch.stderr))
    if launch.procs.is_dir():
        tracker = liveness.JobProgress(tracker, launch.procs)
    return tracker


def _poll(child: proc.Child, tracker: Any, stall_s: float, deadline: float | None,
          beat: Callable[[float | None], None]) -> tuple[str | None, float | None]:
    """liveness.wait's rule (no progress for stall_s, or only weak progress for SPIN_WINDOWS windows), polled
    here so that the status file, the job folder's bounds and a signal are served between polls: (None, None)
    when the child ended, ('hang', monotonic time of the last strong progress) or ('timeout', None)."""
    last = strong = time.monotonic()
    while child.poll() is None:
        now = time.monotonic()
        level = tracker.advanced()
        if level:
            last = now
        if level == liveness.STRONG:
            strong = now
        beat(last)
        if now - last > stall_s or now - strong > liveness.SPIN_WINDOWS * stall_s:
            return "hang", strong
        if deadline is not None and now > deadline:
            return "timeout", None
        time.sleep(POLL_S)
    return None, None


def _recovered(child: proc.Child, tracker: Any, deadline: float | None,
               beat: Callable[[float | None], None]) -> float | None:
    """After a stall captured under --on-stall keep: when the job progressed again (strong progress: ops
    completing, Python working), or None when it ended or ran out of time first."""
    while child.poll() is None:
        now = time.monotonic()
        if tracker.advanced() == liveness.STRONG:
            return now
        if deadline is not None and now > deadline:
            return None
        beat(None)
        time.sleep(POLL_S)
    return None


# ------------------------------------------------------------------------------------ bounds over days

def _prune(procs: Path, tracker: Any, shrunk: set[int], keep_ended: int = KEEP_ENDED) -> None:
    """Bound the job folder and the watchdog's memory whatever the job's length: an ended process's op log is
    cut to what it recorded (once: `shrunk` remembers which); beyond the latest `keep_ended` ended processes
    (DataLoader workers started again every epoch), the oldest ones' files go, and the tracker forgets them."""
    metas = follow.metas(procs)
    ended = sorted((m.get("started") or 0, pid) for pid, m in metas.items()
                   if not m.get("root") and not jobread.live(pid))
    cut = max(0, len(ended) - keep_ended)
    for _, pid in ended[cut:]:
        log = follow.files(procs, pid)["log"]
        if pid not in shrunk and log.exists():
            keep_recorded(log)
            shrunk.add(pid)
    gone = {str(pid) for _, pid in ended[:cut]}
    # one listing, matched by name: a glob per pid compiles a pattern per pid, and pathlib's and re's caches
    # keep the latest hundreds of them, each one new memory, churned for days
    try:
        names = os.listdir(procs) if gone else []
    except OSError:
        names = []
    for name in names:
        if name.split(".", 1)[0] in gone:
            with contextlib.suppress(OSError):
                os.unlink(procs / name)
    for _, pid in ended[:cut]:
        shrunk.discard(pid)
        if hasattr(tracker, "forget"):
            tracker.forget(pid)


def _thin_captures(root: Path, limit: int = MAX_CAPTURES) -> None:
    """Keep the first and the latest capture folders of a job that stalls again and again."""
    caps = sorted(p for p in root.iterdir() if p.is_dir() and p.name.isdigit())
    half = limit // 2
    for p in caps[half:-half] if len(caps) > limit else ():
        shutil.rmtree(p, ignore_errors=True)


# ------------------------------------------------------------------------------------ a job of processes

def _job_capture(launch: Launch, tracker: Any, root_pid: int, root_python: str, native_tools: Sequence[str],
                 stacks: bool, dest: Path, t_stall: float) -> tuple[list, Any, dict]:
    """Every followed process's Python stacks (at once), the views, the cross-process finding, and the
    native stacks of the process the finding names; each process's op-log tail written (into `dest`) from the
    same read. Before the stop: the processes are still stuck. t_stall (monotonic): when the stall was seen,
    what each process's last progress is counted back from (not the end of this capture: asking a rank that
    holds the GIL waits out its timeout)."""
    left = jobread.read_job(launch.procs, ask=True)   # the ranks' own collective numbers, while stuck
    metas = {pid: lf.meta for pid, lf in left.items()}
    pythons = {pid: c.text for pid, c in jobread.capture_python(launch.procs, metas).items()} if stacks else {}
    if root_python and not pythons.get(root_pid):
        pythons[root_pid] = root_python
    views = jobread.views(launch.procs, pythons, getattr(tracker, "last", None), now=t_stall, left=left)
    jobread.write_tails(dest, left)
    finding = job.analyse(views)
    natives: dict = {}
    culprit = next((p for p in views if p.role == finding.culprit), None)
    if stacks and culprit is not None and culprit.pid != root_pid:
        natives = {pid: c.text for pid, c in jobread.capture_native([culprit.pid], native_tools).items()}
    return views, finding, {"python": pythons, "native": natives}


def _with_job(v: Verdict, procs: Path, root: int, views: list, finding: Any, stacks: Mapping[str, dict]) -> Verdict:
    """The verdict of a job: the finding's class, culprit and evidence first, the per-process table, and every
    process's stacks as files in the job folder `procs`."""
    for kind, by_pid in stacks.items():
        for pid, text in by_pid.items():
            if text:
                write_text(procs / f"{pid}.stacks_{kind}.txt", text)
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
    who = next((p.role for p in views if p.pid == root), "the process the watchdog started")
    kept = ("the watchdog", "exit code", "planted")
    launcher = any(p.pid == root and p.supervises for p in views)   # where a launcher waits is no finding
    if finding.cls is None:
        if not launcher or v.status != "hang":
            changes["evidence"] = tuple(v.evidence) + tuple(finding.evidence)
            return dataclasses.replace(v, **changes)
        # the process the watchdog started only waits for its ranks (torchrun's agent, mp.spawn's parent): what
        # it is in says nothing of the job, and is never its finding
        why = (f"{who} only waits for the job's processes: what it is in is not the job's finding, and the job's "
               "processes show nothing that explains the stall")
        evidence = tuple(finding.evidence) + tuple(e for e in v.evidence if e.startswith(kept)) + (why,)
        changes.update(cls="unknown", host_blocked_in=None, evidence=evidence)
        return dataclasses.replace(v, **changes)
    # the job's finding first; what the watchdog saw of the process it started (often a launcher that
    # waits for its children) after it, said to be about that process
    own = tuple(e if e.startswith(kept) else f"{who}: {e}" for e in v.evidence
                if e != "no rule matched the evidence" and not e.startswith("status ")
                and not (launcher and not e.startswith(kept)))
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


@dataclass(frozen=True)
class _Seen:
    """The evidence taken at a stall (or at the end), before it is judged."""
    caps: dict
    jobbed: Any
    snap: Any
    notes: tuple[str, ...]


def _evidence(child: proc.Child, launch: Launch, tracker: Any, dest: Path, *, stacks: bool,
              capture_gpu: bool | str, cuda_gdb: bool, coredump: bool, native_tools: Sequence[str]) -> _Seen:
    """Stacks (every process's, for a job) and the op log as the stall left them; the child still runs."""
    t_stall = time.monotonic()
    if stacks:
        caps = _capture(child, launch, capture_gpu=capture_gpu, cuda_gdb=cuda_gdb, coredump=coredump,
                        native_tools=native_tools)
    else:
        caps = {"python": capture.Capture("python", "", None, 0.0, False, "not taken (stack capture off)")}
    jobbed = None
    if getattr(tracker, "procs", None):   # the job has processes besides the one started
        t_job = time.monotonic()
        jobbed = _job_capture(launch, tracker, child.pid, caps["python"].text, native_tools, stacks, dest, t_stall)
        caps["processes"] = capture.Capture("processes", "", "faulthandler", time.monotonic() - t_job, True)
    t_log = time.monotonic()
    snap, log_notes = _read_log(launch)  # last: the op-log tail as the stall left it
    caps["oplog"] = capture.Capture("oplog", "", "gpulab.trace" if snap is not None else None,
                                    time.monotonic() - t_log, snap is not None)
    return _Seen(caps, jobbed, snap, tuple(log_notes))


def _tail(path: Path, chars: int = STDERR_TAIL_CHARS) -> str:
    if not path.exists():
        return ""
    with open(path, "rb") as fh:
        fh.seek(max(0, path.stat().st_size - chars))
        return fh.read().decode("utf-8", "replace")


def _products(launch: Launch, v: Verdict, dest: Path | None = None) -> dict:
    """Stacks and the op-log tail as files beside the verdict (paths relative to `dest`, the products folder)."""
    out = dest or launch.out
    files = {"stdout": launch.stdout.name, "stderr": launch.stderr.name,
             "op_log": launch.log.name if (out / launch.log.name).exists() else None,
             "faulthandler": launch.faulthandler.name if (out / launch.faulthandler.name).exists() else None}
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


def _judge(command: Sequence[str], launch: Launch, seen: _Seen, *, status: str, rc: int | None, t0: float,
           hang_started: float | None, stall_s: float, timeout_s: float | None, mode: str, spec: Any, pid: int,
           left: tuple, tail: int, py_text: str | None = None) -> Verdict:
    """judge() over what was seen; times are the watchdog's monotonic clock, t0 its start."""
    caps = seen.caps
    planted = faults.planted_from_stderr(_tail(launch.stderr, 200_000))
    capture_s = {k: round(c.seconds, 3) for k, c in caps.items()}
    capture_s["total"] = round(sum(c.seconds for k, c in caps.items() if k != "oplog"), 3)
    snap = seen.snap
    obs = Observation(
        command=tuple(command), status=status, exit_code=rc, elapsed_s=time.monotonic() - t0,
        recorded=launch.recorded and snap is not None, records=tuple(snap.records) if snap is not None else (),
        ops_started=snap.started if snap is not None else 0, ops_completed=snap.completed if snap is not None else 0,
        dropped=snap.dropped if snap is not None else 0, log_stopped_at=snap.stopped_at if snap is not None else None,
        python_text=py_text if py_text is not None else (caps["python"].text if "python" in caps else ""),
        native_text=caps["native"].text if "native" in caps else "",
        gpu_text=caps["gpu"].text if "gpu" in caps else None,
        capture_notes=tuple((c.step, c.note) for c in caps.values() if c.note), capture_s=capture_s,
        stderr_tail=_tail(launch.stderr),
        planted=str(spec) if spec else (planted[0].split("planted ", 1)[1] if planted else None),
        mode=mode if launch.recorded else None, stall_s=stall_s, timeout_s=timeout_s or 0.0,
        hang_started_s=None if hang_started is None else hang_started - t0,
        verdict_at_s=time.monotonic() - t0, pid=pid, notes=seen.notes, left_running=left, tail=tail)
    return judge(obs)


# ------------------------------------------------------------------------------------ a stall under keep

def _snapshot(launch: Launch, dest: Path, limit: int = 32) -> None:
    """The op logs as a stall left them, copied into its capture folder (the live ones go on being written):
    the root's and, for a job, each process's <pid>.json and log (at most `limit`), each cut to what it holds."""
    dest.mkdir(parents=True, exist_ok=True)
    if launch.recorded and launch.log.exists():
        shutil.copyfile(launch.log, dest / launch.log.name)
        keep_recorded(dest / launch.log.name)
    for name, keep in ((launch.stdout.name, 64_000), (launch.stderr.name, 64_000)):
        text = _tail(launch.out / name, keep)
        if text:
            write_text(dest / name, text)
    if not launch.procs.is_dir():
        return
    (dest / "procs").mkdir(exist_ok=True)
    metas = follow.metas(launch.procs)
    for pid in sorted(metas, key=lambda p: (not jobread.live(p), p))[:limit]:
        f = follow.files(launch.procs, pid)
        with contextlib.suppress(OSError):
            shutil.copyfile(f["meta"], dest / "procs" / f["meta"].name)
            if f["log"].exists():
                shutil.copyfile(f["log"], dest / "procs" / f["log"].name)
                keep_recorded(dest / "procs" / f["log"].name)


def _stall_record(v: Verdict, seen: _Seen, *, t: float, stall_s: float, capture_dir: str,
                  last_wall: float) -> dict:
    """A stall as the verdict lists it: when, where, whether the evidence shows one of the usual pauses, and
    how the window compares with the job's own gaps between ops (from the op log up to the stall)."""
    culprit = next((p for p in v.processes if p.get("role") == v.culprit), None) if v.culprit else None
    open_op = v.in_flight_op
    py = v.stacks.get("python") or ""
    frame = jobread.main_frame(py).where if py else None
    frames = jobread.main_frame(py).frames if py else ()
    views = seen.jobbed[0] if seen.jobbed else []
    if culprit is not None and not open_op:
        frame = culprit.get("frame") or frame
        pythons = seen.jobbed[2].get("python", {}) if seen.jobbed else {}
        frames = jobread.main_frame(pythons.get(culprit.get("pid"), "")).frames or frames
    ranks_at = [p.frame or "" for p in views if p.kind == "rank"]
    pause = stalls.judge_pause(open_op, frames, v.divergence, ranks_at)
    records = list(seen.snap.records) if seen.snap is not None else []
    if not records and seen.jobbed:   # a launcher records nothing: the ranks' rhythm is the job's
        busiest = max((lf for lf in jobread.read_job(Path(v.log.get("dir", "")) / "procs").values()
                       if lf.snap is not None), key=lambda lf: lf.snap.completed, default=None) \
            if v.log.get("dir") else None
        records = list(busiest.snap.records) if busiest is not None else []
    gaps = stalls.gaps(records, before=last_wall)
    return {"t": round(t, 3), "for_s": None, "where": stalls.where(open_op, v.divergence, frame,
                                                                    v.culprit if culprit else None),
            "recovered": False, "pause": {"kind": pause.kind, "usual": pause.usual, "why": pause.why},
            "window": stalls.window_note(stall_s, gaps), "gaps": gaps.to_dict() if gaps else None,
            "capture": capture_dir}


# ------------------------------------------------------------------------------------ the watchdog

def _exit_code_of(rc: int | None) -> int:
    """The job's code as a shell gives it: its exit status, or 128+N when signal N ended it."""
    if rc is None:
        return 1
    return 128 - rc if rc < 0 else rc


def run(command: Sequence[str], *, stall_s: float = 60.0, timeout_s: float | None = None, record: bool = True,
        mode: str = "auto", fault: str | None = None, out_dir: str | os.PathLike | None = None,
        capture_gpu: bool | str = "auto", cuda_gdb: bool = False, coredump: bool = False,
        env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
        tail: int = 20, native_tools: tuple[str, ...] = ("py-spy", "gdb"), progress: Any = None,
        fixes: Sequence[str] = (), stacks: bool = True,
        finish: Callable[[Verdict, str | None], Verdict] | None = None, on_stall: str = "stop",
        grace_s: float = 0.0, echo: bool = False, keep_output: int | None = None, status: bool = False,
        status_every_s: float = status_mod.EVERY_S, say_every_s: float = 0.0) -> Verdict:
    """Run COMMAND under the watchdog and return the verdict (also written to out_dir/verdict.json).
    `log` paths in the verdict are relative to out_dir (`Verdict.log['dir']` is out_dir itself).
    stacks=False skips the stacks and the GPU view on a hang (a bisection probe needs only the outcome
    and the op log; gdb alone can take seconds). `finish(verdict, device)` amends the verdict before it is
    saved: how a caller above gpulab.hang adds what the watchdog cannot know (the fixes to try:
    gpulab.fixes.suggest.with_suggestions). `fixes` only labels the run: `env` must carry them.

    For a job that runs for days: timeout_s None (no bound; the stall window judges it); on_stall 'keep'
    captures each stall into captures/NN/ and goes on watching (the verdict's `stalls` lists them);
    grace_s > 0 passes SIGINT/SIGTERM/SIGHUP on to the job and waits that long for it to end (it may
    checkpoint) before stopping it; echo shows the job's output live on this process's stdout/stderr and
    keep_output bounds OUT/stdout.txt and stderr.txt to their last bytes (gpulab.tee); status rewrites
    OUT/status.json every status_every_s seconds (a line on stderr every say_every_s, 0: never)."""
    command = [str(c) for c in command]
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not valid; choose one of {', '.join(MODES)}")
    if not (stall_s > 0 and (timeout_s is None or timeout_s > 0)):
        raise ValueError(f"stall_s={stall_s!r} and timeout_s={timeout_s!r} must both be > 0 (timeout_s None: no bound)")
    if capture_gpu not in (True, False, "auto"):
        raise ValueError(f"capture_gpu={capture_gpu!r}; choose True, False or 'auto'")
    if on_stall not in ON_STALL:
        raise ValueError(f"on_stall={on_stall!r} is not valid; choose one of {', '.join(ON_STALL)}")
    if grace_s < 0:
        raise ValueError(f"grace_s={grace_s!r} must be >= 0 seconds")
    spec = faults.parse(fault)
    check_command(command, cwd)
    out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="gpulab-watch-"))
    out.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda msg: print(f"[gpulab watch] {msg}", file=sys.stderr, flush=True))
    launch = launch_plan(command, out, record=record, mode=mode, fault=spec, env=env, coredump=coredump,
                         fixes=fixes)
    for p in (launch.log, launch.faulthandler, launch.beat, out / "status.json"):
        if p.exists():
            p.unlink()
    shutil.rmtree(out / "captures", ignore_errors=True)
    bound = f"timeout {timeout_s:g} s" if timeout_s else "no timeout"
    say(f"running {' '.join(launch.argv)}  (stall {stall_s:g} s, {bound}, on stall: {on_stall}, out {out})")
    t0 = time.monotonic()
    deadline = t0 + timeout_s if timeout_s else None
    tees: list[tee.Tee] = []
    if echo or keep_output:
        keep = keep_output or tee.KEEP_BYTES
        tees = [tee.Tee(launch.stdout, 1 if echo else None, keep, name="stdout"),
                tee.Tee(launch.stderr, 2 if echo else None, keep, name="stderr")]
    found = stalls.Seen()
    interrupted: dict | None = None
    writer = None
    seen: _Seen | None = None
    stalled: str | None = None
    hang_started: float | None = None
    try:
        with proc.Child(launch.argv, stdout=tees[0].fd if tees else launch.stdout,
                        stderr=tees[1].fd if tees else launch.stderr, env=launch.env, cwd=cwd,
                        label="watched") as child:
            for t in tees:
                t.started()
            tracker = _tracker(child, launch)
            if status:
                writer = status_mod.Writer(out, lambda: status_mod.job_processes(
                    child.pid, launch.log if launch.recorded else None,
                    launch.procs if launch.procs.is_dir() else None), say, status_every_s, say_every_s).start()
            pruned, shrunk = [time.monotonic()], set()

            def beat(last: float | None, phase: str = "running") -> None:
                now = time.monotonic()
                if writer is not None and (last is None or now - getattr(beat, "t", 0.0) >= 1.0):
                    beat.t = now   # type: ignore[attr-defined]
                    by = dict(getattr(tracker, "last", {}) or {})
                    if last is not None:
                        by.setdefault(child.pid, last)
                    writer.update(status_mod.State(
                        phase="stalled" if last is None else phase, t0=t0, last=last, last_by_pid=by,
                        stalls=found.count, recovered=found.recovered,
                        note=found.last["where"] if found.last and not found.last["recovered"] else ""))
                if launch.procs.is_dir() and now - pruned[0] > PRUNE_EVERY_S:
                    pruned[0] = now
                    _prune(launch.procs, tracker, shrunk)

            try:
                while True:
                    stalled, hang_started = _poll(child, tracker, stall_s, deadline, beat)
                    if stalled == "hang":
                        say(f"no progress for {stall_s:g} s: capturing evidence")
                    elif stalled == "timeout":
                        say(f"timeout after {timeout_s:g} s: capturing evidence")
                    if stalled != "hang" or on_stall == "stop":
                        break
                    n = found.count + 1
                    cap = out / "captures" / f"{n:02d}"
                    if writer is not None:
                        writer.update(dataclasses.replace(writer.state, phase="capturing"), now=True)
                    rec = found.add(_apart(functools.partial(
                        _keep_capture, child, launch, tracker, cap, command=command, t0=t0, hang_started=hang_started,
                        stall_s=stall_s, timeout_s=timeout_s, mode=mode, spec=spec, tail=tail, stacks=stacks,
                        capture_gpu=capture_gpu, cuda_gdb=cuda_gdb, coredump=coredump, native_tools=native_tools)))
                    _thin_captures(out / "captures")
                    say(f"stall {n} captured in {cap} ({rec['where']}; "
                        f"{rec['pause']['kind'] or 'no usual pause'}): watching on")
                    _release()
                    back = _recovered(child, tracker, deadline, beat)
                    rec["for_s"] = round((back or time.monotonic()) - hang_started, 3)
                    if back is None:
                        break
                    found.recover(rec)
                    _lighten(cap, rec)
                    say(f"stall {n} recovered after {rec['for_s']:.1f} s")
                    if child.poll() is not None:
                        break
                if on_stall == "keep" and child.poll() is not None:
                    stalled = None   # it ended by itself, after its stalls: judged by how it ended
                if stalled:   # a hang (stop, or keep's stall that outlasted the timeout) or a timeout
                    seen = _evidence(child, launch, tracker, launch.procs, stacks=stacks, capture_gpu=capture_gpu,
                                     cuda_gdb=cuda_gdb, coredump=coredump, native_tools=native_tools)
            except proc.Interrupted as exc:
                if not grace_s:
                    raise
                if found.last and found.last["for_s"] is None:   # the signal came while a stall went on
                    found.last["for_s"] = round(time.monotonic() - (hang_started or t0), 3)
                interrupted = _pass_on(child, exc, grace_s, say)
                stalled = None
            if seen is None:   # ended by itself (or passed a signal): the op log as it was left
                snap, notes = _read_log(launch)
                seen = _Seen({}, None, snap, tuple(notes))
            left = child.stop()
    finally:
        kept = [t.close() for t in tees]
        if writer is not None:
            writer.stop(dataclasses.replace(writer.state, phase="ended", stalls=found.count,
                                            recovered=found.recovered, note=""))
    return _finish(command, launch, seen, child, out, t0=t0, stalled=stalled, hang_started=hang_started,
                   stall_s=stall_s, timeout_s=timeout_s, mode=mode, spec=spec, left=left, tail=tail,
                   found=found, interrupted=interrupted, kept=kept, finish=finish, say=say)


def _keep_capture(child: proc.Child, launch: Launch, tracker: Any, cap: Path, *, command: Sequence[str],
                  t0: float, hang_started: float, stall_s: float, timeout_s: float | None, mode: str, spec: Any,
                  tail: int, stacks: bool, capture_gpu: bool | str, cuda_gdb: bool, coredump: bool,
                  native_tools: Sequence[str]) -> dict:
    """One stall under --on-stall keep: the evidence, as a stop would take it, into its own folder (a verdict
    of status hang, the op logs as they were, every process's stacks), the job left running; -> its record."""
    cap.mkdir(parents=True, exist_ok=True)
    capped = dataclasses.replace(launch, out=cap)
    seen = _evidence(child, launch, tracker, cap / "procs", stacks=stacks, capture_gpu=capture_gpu,
                     cuda_gdb=cuda_gdb, coredump=coredump, native_tools=native_tools)
    _snapshot(launch, cap)
    v = _judge(command, launch, seen, status="hang", rc=None, t0=t0, hang_started=hang_started, stall_s=stall_s,
               timeout_s=timeout_s, mode=mode, spec=spec, pid=child.pid, left=(), tail=tail)
    if seen.jobbed is not None:
        v = _with_job(v, cap / "procs", child.pid, *seen.jobbed)
    v = dataclasses.replace(v, log={"dir": str(cap), **_products(capped, v)})
    v = dataclasses.replace(v, evidence=tuple(e for e in v.evidence if not e.startswith("the watchdog stopped"))
                            + ("the watchdog left the job running (--on-stall keep)",))
    last_wall = time.time() - (time.monotonic() - hang_started)
    rec = _stall_record(v, seen, t=hang_started - t0, stall_s=stall_s,
                        capture_dir=str(cap.relative_to(launch.out)), last_wall=last_wall)
    rec["capture_s"] = v.capture_s.get("total")   # for_s includes it: recovery is seen once the capture is done
    write_json(cap / "verdict.json", {**v.to_dict(), "stall": rec})
    return rec


def _apart(capture_fn: Callable[[], dict]) -> dict:
    """capture_fn() (a stall's capture under keep: files in its folder, -> its record) run in a forked copy of
    the watchdog, its record sent back as JSON; run here when the copy cannot do it (no fork, it failed).

    Why: a capture reads the op logs into ~100 MB of short-lived Python objects (a ring of 131072 records).
    In this process the few objects allocated meanwhile that outlive it (the record, the status thread's
    samples, the re and glob caches) each pin one of pymalloc's 1 MiB arenas, which are given back only
    when empty: measured, 12 arenas a stall stayed, and the watchdog grew by ~7 MB a stall however often it
    collected and trimmed. The copy's memory goes with it; the watchdog keeps the record only."""
    try:
        r, w = os.pipe()
    except OSError:
        return capture_fn()
    try:
        with warnings.catch_warnings():   # 3.12+ warns of fork with threads running: the copy takes none of
            warnings.simplefilter("ignore", DeprecationWarning)   # their locks (status writer, tees)
            pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return capture_fn()
    if pid == 0:   # the copy: never back into the watchdog's code, nor its exit handlers (they stop the job)
        code = 1
        try:
            os.close(r)
            with contextlib.suppress(ValueError):   # an interrupt ends the copy; the watchdog handles its own
                for sig in proc.HANDLED_SIGNALS:
                    signal.signal(sig, signal.SIG_DFL)
            data = json.dumps(capture_fn()).encode()
            code = 0
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
        except BaseException:  # noqa: BLE001 - the watchdog captures again itself
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    chunks: list[bytes] = []
    read = False
    deadline = time.monotonic() + APART_LIMIT_S
    try:
        # bounded: a copy forked while another thread held a lock it then needs would wait forever; past the
        # limit it is killed and the capture runs here
        while (left := deadline - time.monotonic()) > 0 and select.select([r], [], [], left)[0]:
            chunk = os.read(r, 1 << 16)
            if not chunk:
                read = True
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        if not read:   # interrupted meanwhile, or past the limit: the copy goes
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    try:
        if read:
            return json.loads(b"".join(chunks))
    except ValueError:
        pass
    return capture_fn()


def _release() -> None:
    """After a capture: what it left in this process given back to the system (all of a capture run here when
    _apart could not fork: a ring of 131072 records is ~100 MB of Python objects)."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)   # glibc keeps freed heap otherwise


def _lighten(cap: Path, rec: dict) -> None:
    """A stall that recovered keeps its verdict, stacks and op-log tails, not its copies of the op logs (MBs
    each): the folder then grows by little per usual pause, however many a job of days takes. Its per-process
    files (a few hundred bytes each, one disk block each, dozens for a job with DataLoader workers) are
    folded into one procs.json, name -> text."""
    dropped = [p for p in (cap / "ops.log", *(cap / "procs").glob("*.log")) if p.is_file()]
    for p in dropped:
        p.unlink()
    if (cap / "procs").is_dir():
        small = {p.name: p.read_text(errors="replace") for p in sorted((cap / "procs").iterdir()) if p.is_file()}
        write_json(cap / "procs.json", small)
        shutil.rmtree(cap / "procs", ignore_errors=True)
    data = report.read_json(cap / "verdict.json", default=None)
    if data is not None:
        data["stall"] = rec
        data["log"] = {**data.get("log", {}), "op_log": None}
        data["notes"] = [*data.get("notes", []), f"the job recovered after {rec['for_s']:.1f} s (the capture "
                         f"itself included): the op logs copied at the stall were dropped, their tails kept, the "
                         f"per-process files folded into procs.json"]
        write_json(cap / "verdict.json", data)


def _pass_on(child: proc.Child, exc: proc.Interrupted, grace_s: float, say: Callable[[str], None]) -> dict:
    """A signal to the watchdog goes to the job's main process, which gets grace_s seconds to end (it may write
    a checkpoint); a second signal meanwhile is not waited for."""
    say(f"{exc.name}: passed on to the job; waiting up to {grace_s:g} s for it to end")
    with contextlib.suppress(ProcessLookupError, PermissionError):
        # the job's main process only, as `kill PID` or a container stop does: it decides how its helpers end
        # (a DataLoader worker that got it too would die under the main process's checkpoint)
        os.kill(child.pid, exc.signum)
    rc = child.wait(grace_s)
    ended = rc is not None
    say(f"the job ended with {'exit code ' + str(rc) if rc is not None and rc >= 0 else 'signal ' + str(-rc)}"
        if ended else f"the job did not end within {grace_s:g} s: stopping it")
    return {"signal": exc.name, "signum": exc.signum, "passed_to_job": True, "grace_s": grace_s,
            "job_ended": ended}


def _finish(command: Sequence[str], launch: Launch, seen: _Seen, child: proc.Child, out: Path, *, t0: float,
            stalled: str | None, hang_started: float | None, stall_s: float, timeout_s: float | None, mode: str,
            spec: Any, left: tuple, tail: int, found: stalls.Seen, interrupted: dict | None, kept: list,
            finish: Callable[[Verdict, str | None], Verdict] | None, say: Callable[[str], None]) -> Verdict:
    rc = child.returncode
    if launch.recorded:
        keep_recorded(launch.log)   # the finished op log cut to what was recorded (gpulab.trace.ring.shrink)
    followed = keep_followed(launch.procs) if launch.procs.is_dir() else []
    ended_by_us = interrupted is not None and not interrupted["job_ended"]
    status = stalled or ("ok" if rc == 0 else ("crash" if rc is not None and rc < 0 else "error"))
    if ended_by_us:
        status = "crash"   # judged as the kill it was; relabelled below
    py_text = seen.caps["python"].text if "python" in seen.caps else ""
    if status == "crash" and launch.faulthandler.exists() and not ended_by_us:
        py_text = launch.faulthandler.read_text(errors="replace")
    v = _judge(command, launch, seen, status=status, rc=rc, t0=t0, hang_started=hang_started, stall_s=stall_s,
               timeout_s=timeout_s, mode=mode, spec=spec, pid=child.pid, left=left, tail=tail, py_text=py_text)
    jobbed = seen.jobbed
    if jobbed is None and status != "ok" and followed:   # ended by itself: who ended how
        views = jobread.views(launch.procs, {})
        jobbed = (views, job.analyse(views), {})
    if jobbed is not None:
        v = _with_job(v, launch.procs, child.pid, *jobbed)
    extra: list[str] = []
    for s in found.items:
        extra.append(f"stall at {s['t']:.1f} s for {s['for_s']:.1f} s (the capture took {s.get('capture_s') or 0:.1f} "
                     f"s of it) at {s['where']}: " + ("recovered" if s["recovered"] else "never recovered")
                     + f" ({s['pause']['why']})")
    if found.last:
        extra.append(found.last["window"])
    if found.count > len(found.items):
        extra.append(f"{found.count} stalls in all ({found.recovered} recovered); the first and the latest "
                     f"{stalls.MAX_KEPT // 2} are listed")
    for k in kept:
        if k.written > k.kept:
            extra.append(f"{Path(k.path).name} keeps the last {k.kept} of the {k.written} bytes the job wrote")
    changes: dict = {"stalls": tuple(found.items), "interrupted": interrupted}
    if interrupted is not None:
        extra.append(f"gpulab watch got {interrupted['signal']} and passed it to the job; "
                     + (f"the job ended by itself within {interrupted['grace_s']:g} s" if interrupted["job_ended"]
                        else f"the job did not end within {interrupted['grace_s']:g} s and was stopped"))
        if ended_by_us:
            changes.update(status="interrupted", signal=None, cls=None)
    v = dataclasses.replace(v, evidence=tuple(v.evidence) + tuple(extra), **changes)
    if v.status not in ("ok", "interrupted"):   # whose bug, on all that was gathered (the job's finding too)
        v = _attributed(v, command, launch, out, timeout_s=min(timeout_s or memcheck.TIMEOUT_S, memcheck.TIMEOUT_S),
                        say=say)
    v = dataclasses.replace(v, log={"dir": str(out), **_products(launch, v)})
    if finish is not None:
        v = finish(v, log_device(launch.log if launch.recorded else None))
    write_json(out / "verdict.json", v.to_dict())
    say(f"{v.status}" + (f" ({v.cls})" if v.cls else "") + (f" in {v.in_flight_op['name']}" if v.in_flight_op
                                                            else "") + f"; verdict {out / 'verdict.json'}")
    return v


def exit_code(v: Verdict) -> int:
    """gpulab watch's exit code: the job's own when it ended by itself (128+N for signal N, as a shell says),
    3 hang, 5 timeout, 128+N when a signal N to the watchdog ended the job."""
    if v.status == "interrupted":
        return 128 + int((v.interrupted or {}).get("signum") or 15)
    if v.status in ("ok", "error", "crash"):
        return _exit_code_of(v.exit_code) if v.status != "ok" else 0
    return EXIT_CODES.get(v.status, 1)


SOURCE_SUFFIXES = (".py", ".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp")
SOURCE_FILES_MAX, SOURCE_BYTES_MAX = 200, 512 << 10


def program_sources(command: Sequence[str], cwd: str | os.PathLike | None = None) -> dict[str, str]:
    """The program's own sources, where it registers custom ops and defines kernels: the script and the source
    files beside it (bounded: a folder of data must not cost the verdict)."""
    pyc = python_command(command)
    if pyc is None or pyc[2][0] == "-m":
        return {}
    script = Path(pyc[2][0]) if Path(pyc[2][0]).is_absolute() else Path(cwd or Path.cwd()) / pyc[2][0]
    out: dict[str, str] = {}
    try:
        files = [script] + sorted(p for p in script.parent.iterdir() if p.suffix in SOURCE_SUFFIXES and p != script)
    except OSError:
        return out
    for p in files[:SOURCE_FILES_MAX]:
        try:
            if p.is_file() and p.stat().st_size <= SOURCE_BYTES_MAX:
                out[str(p)] = p.read_text(errors="replace")
        except OSError:
            continue
    return out


def plain_env(env: Mapping[str, str]) -> dict[str, str]:
    """A watched child's environment without the recorder's variables: the program as it runs without gpulab."""
    out = {k: v for k, v in env.items() if k not in (follow.ENV, follow.MODE_ENV, beat.ENV)}
    if out.get("PYTHONPATH"):
        out["PYTHONPATH"] = os.pathsep.join(p for p in out["PYTHONPATH"].split(os.pathsep) if p != follow.SITE_DIR)
    return out


def _attributed(v: Verdict, command: Sequence[str], launch: Launch, out: Path, *, timeout_s: float,
                say: Callable[[str], None]) -> Verdict:
    """The verdict with its owner decided on everything gathered (the program's sources, where they register
    custom ops and define kernels; the job's finding) and, for a GPU memory fault, what one bounded memcheck
    run of the program (without the recorder) said. Relative paths are this process's: as the child's."""
    registered = owner.registrations(program_sources(command))
    device = str((v.in_flight_op or {}).get("device") or "")
    mc = None
    if v.cls == "gpu_page_fault":
        mc = memcheck.Report(False, note=memcheck.ROCM_NOTE)
    elif memcheck.applies(v.cls, v.status) and not device.startswith("cpu"):
        pyc = python_command(command)
        plain = [workloads.fix_interpreter(pyc[0], launch.env.get(workloads.PYTHON_ENV)), *pyc[1], *pyc[2]] \
            if pyc else list(command)
        say(f"{v.cls}: one compute-sanitizer memcheck run of the program (at most {timeout_s:g} s)")
        mc = memcheck.run(plain, out, timeout_s=timeout_s, env=plain_env(launch.env))
    d = v.to_dict()
    evidence = tuple(v.evidence)
    if mc is not None:
        d["memcheck"] = mc.to_dict()
        evidence += tuple(mc.facts())
    who = owner.decide(d, registered)
    said = f"whose code: {who.kind}" + (f", {who.where}" if who.where else "") + f" ({who.why})"
    return dataclasses.replace(v, owner=who.to_dict(), memcheck=d.get("memcheck"), evidence=evidence + (said,))


def log_device(log: str | os.PathLike | None) -> str | None:
    """Where a recorded program ran, from its op log (None when unknown): only a hint, never an error."""
    try:
        return trace.read_device(Path(log)) if log and Path(log).exists() else None
    except Exception:  # noqa: BLE001 - only a hint of where the program ran
        return None


# ------------------------------------------------------------------------------------ CLI

def _parser():
    p = parser("gpulab watch", "Run COMMAND under the hang watchdog and write a verdict JSON (status, phase, "
               "class, in-flight op, stacks, evidence). The job's output reaches this terminal live (OUT keeps its "
               "last bytes), OUT/status.json is rewritten every few seconds, and a signal to gpulab is passed on "
               "to the job. Exit codes: the job's own (0 ok, its exit status, 128+N when signal N ended it), 3 "
               "hang, 5 timeout, 2 bad usage, 127 command not found, 128+N stopped by signal N.",
               "gpulab watch --stall 120 --on-stall keep --out run1 -- python train.py --lr 1e-4")
    p.add_argument("--stall", type=positive("--stall"), default=60.0, metavar="S",
                   help="no progress for S seconds is a stall")
    p.add_argument("--timeout", type=positive("--timeout"), default=None, metavar="S",
                   help="bound on the whole run (default: none; the stall window judges the job)")
    p.add_argument("--on-stall", default="stop", choices=ON_STALL,
                   help="stop: capture the evidence and stop the job (a hang); keep: capture it into "
                        "OUT/captures/NN/ and go on watching (a stall that recovers is listed in the verdict)")
    p.add_argument("--grace", type=positive("--grace"), default=GRACE_S, metavar="S",
                   help="after SIGTERM/SIGINT/SIGHUP, passed on to the job: seconds it gets to end by itself")
    p.add_argument("--status-every", type=float, default=status_mod.SAY_EVERY_S, metavar="S",
                   help="a status line on stderr every S seconds (0: none); OUT/status.json is rewritten every "
                        f"{status_mod.EVERY_S:g} s regardless")
    p.add_argument("--keep-output", type=positive("--keep-output"), default=tee.KEEP_BYTES / 2**20, metavar="MB",
                   help="OUT/stdout.txt and stderr.txt keep the job's last MB megabytes each (default %(default)g)")
    p.add_argument("--quiet", action="store_true", help="do not show the job's output here (OUT keeps its tail)")
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
    if args.status_every < 0:
        print(f"gpulab watch: --status-every {args.status_every:g} is not valid; it must be >= 0 seconds "
              f"(0: no status line)", file=sys.stderr)
        return proc.EXIT_BAD_INPUT
    try:
        json_target(args.json)
        if args.out:
            writable_dir(args.out, "--out")
        v = run(command, stall_s=args.stall, timeout_s=args.timeout, record=not args.no_record, mode=args.mode,
                fault=args.fault, out_dir=args.out, cuda_gdb=args.cuda_gdb, coredump=args.coredump,
                finish=finish, on_stall=args.on_stall, grace_s=args.grace, echo=not args.quiet,
                keep_output=int(args.keep_output * 2**20), status=True, say_every_s=args.status_every)
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
          + (f"  stalls {len(v.stalls)} ({sum(1 for s in v.stalls if s.get('recovered'))} recovered)"
             if v.stalls else "")
          + (f"  SELF-TEST (planted {v.planted})" if v.planted else ""))
    for fact in v.evidence:
        print(f"  - {fact}")
    # the chain's own next step (gpulab.chain.verdict): a failure of the program's training loop names its remedy
    step = classify.program_cause(v.cls, v.culprit, v.processes, v.owner) or owner.next_step(v.owner)
    if step:
        print(f"next step: {step}")
    print(Path(v.log["dir"]) / v.log["verdict"])
    code = exit_code(v)
    if v.interrupted:   # the last line says what the signal did, as for every other command
        print(f"gpulab watch: interrupted by {v.interrupted['signal']}; passed to the job, which "
              + ("ended by itself" if v.interrupted["job_ended"] else "was stopped after the grace period")
              + f"; every child process was stopped; exit {code}", file=sys.stderr, flush=True)
    return code


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
