"""Record a workload in a gpulab.proc child (own process group, deadline) and measure what recording costs.

Why a child: the workload may hang or crash the interpreter; the notebook kernel must survive, and the
log (a mmap'ed ring) keeps everything that was recorded up to the kill. Why stall detection (stall_s, the
watchdog's rule in gpulab.trace.liveness): a workload that deadlocks would otherwise hold the notebook for
its whole deadline, and every later measurement would wait again. The measurements that need a finished
run (recording cost, the stats-mode rerun) take the first Recording and are skipped when it did not finish.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpulab import proc, report
from gpulab.trace import firstnan, follow, liveness, native
from gpulab.trace.ring import _check_mode, read, shrink, trim
from gpulab.trace.ring import progress as log_progress
from gpulab.workloads import WorkloadConfig, cli_args, command


@dataclass(frozen=True)
class Recording:
    snapshot: Any            # gpulab.trace.Snapshot (None if the child never created the log)
    returncode: int | None   # None when it was stopped (hang or timeout)
    signal: int | None       # the signal that ended the child, if any
    timed_out: bool          # stopped at its deadline while still making progress
    elapsed_s: float
    log: str
    command: tuple[str, ...]
    stderr_tail: str
    status: str = "ok"       # ok | hang (no progress for stall_s) | crash (a signal) | error (exit != 0) | timeout
    #                          | cancelled (its result no longer wanted: record's `cancel`)
    stall_s: float | None = None
    processes: int = 0       # other Python processes the program started (each recorded in `<log>.procs/`)
    process_ops: int = 0     # the ops those processes recorded, together
    shown: str = ""          # whose ops `snapshot` holds when not the root's: a launcher runs no op of its own

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def finished(self) -> bool:
        """It ended by itself (ok, error or crash), rather than being stopped (hang, timeout)."""
        return self.status in ("ok", "error", "crash")


class OverheadFailed(RuntimeError):
    """A timing child of `overhead` did not end well: how it ended, and its output file (in out_dir)."""

    def __init__(self, message: str, status: str, output: str):
        super().__init__(message)
        self.status, self.output = status, output


def _child_env() -> dict[str, str]:
    env = proc.python_env()
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _target(cfg_or_command) -> list[str]:
    """The part after `--`: SCRIPT.py [ARGS] or -m MODULE [ARGS] (a leading python executable is dropped)."""
    argv = command(cfg_or_command) if isinstance(cfg_or_command, WorkloadConfig) else list(cfg_or_command)
    if not argv:
        raise ValueError("cfg_or_command is empty; give a WorkloadConfig or an argv list")
    first = os.path.basename(argv[0])
    if first.startswith("python") or argv[0] == sys.executable:
        argv = argv[1:]
    if not argv or not (argv[0] == "-m" or argv[0].endswith(".py")):
        raise ValueError(f"cannot record {cfg_or_command!r}: expected [python] SCRIPT.py ARGS or "
                         f"[python] -m MODULE ARGS")
    return argv


def bootstrap_command(cfg_or_command, log: str | os.PathLike, mode: str = "auto",
                      faulthandler: str | None = None,
                      gpu_mechanism: str | None = None, follow: str | os.PathLike | None = None) -> list[str]:
    """argv that runs the workload under the recorder (what `record` and the watchdog start). The native
    hot path is built here, on the launcher's side, when it is not built yet (gpulab.trace.native)."""
    return [sys.executable, *recorder_args(log, mode, faulthandler, gpu_mechanism, follow), "--",
            *_target(cfg_or_command)]


def recorder_args(log: str | os.PathLike, mode: str = "auto", faulthandler: str | os.PathLike | None = None,
                  gpu_mechanism: str | None = None,
                  follow: str | os.PathLike | None = None) -> list[str]:
    """`-m gpulab.trace` and its options, up to the `--` (the interpreter is the caller's: the watchdog keeps
    a program's own interpreter and flags). Builds the native hot path on the launcher's side."""
    _check_mode(mode)
    native.ensure_all()
    args = ["-m", "gpulab.trace", "--log", str(log), "--mode", mode]
    if gpu_mechanism:
        args += ["--gpu-mechanism", gpu_mechanism]
    if faulthandler:
        args += ["--faulthandler", str(faulthandler)]
    if follow:
        args += ["--follow", str(follow)]
    return args


def run_child(cmd: Sequence[str], timeout_s: float, stderr_path: Path, cwd: str | None = None, *,
              stall_s: float | None = None, log: str | os.PathLike | None = None,
              follow: str | os.PathLike | None = None, cancel: threading.Event | None = None,
              env: Mapping[str, str] | None = None) -> liveness.End:
    """Run cmd as a gpulab.proc child, output to stderr_path, with a heartbeat file beside it; stopped at the
    deadline, or after stall_s seconds without progress (liveness's rule, over `log` when it is recorded, and
    over each process of the job that `follow`s into that folder), or once `cancel` is set. env: variables set
    on top of the caller's."""
    beat = Path(stderr_path).with_suffix(".beat")
    try:
        return liveness.run(cmd, timeout_s=timeout_s, stall_s=stall_s, log=log, beat_path=beat,
                            env={**_child_env(), **(env or {})},
                            cwd=cwd, stdout=stderr_path, stderr=subprocess.STDOUT, follow=follow, cancel=cancel)
    finally:
        beat.unlink(missing_ok=True)


def keep_recorded(log: str | os.PathLike) -> None:
    """Cut a finished child's op log to what it recorded (gpulab.trace.ring.shrink): a copy or an upload of
    the outputs expands the empty, sparse rest. Nothing to do when there is no log; a file that is not a
    readable log is left as it is (its reader will say why). On a full disk the shrunk copy cannot be written:
    the log is only cut in place (`trim`, which frees space), so that the verdict can still be written."""
    try:
        shrink(log)
    except (FileNotFoundError, ValueError):
        pass
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        with contextlib.suppress(OSError, ValueError):
            trim(log)


def keep_followed(procs: str | os.PathLike) -> list[dict]:
    """The <pid>.json of every process a finished job started (its root's left out), each op log cut to what
    was recorded; a folder where the program started none is removed (nothing in it but the root's note)."""
    children = follow.children(procs)
    for log in follow.child_logs(procs, children):
        keep_recorded(log)
    if not children:
        shutil.rmtree(procs, ignore_errors=True)
    return children


def record(cfg_or_command, mode: str = "ops", out_dir: str | os.PathLike = "outputs/trace",
           timeout_s: float = 300.0, name: str | None = None, stall_s: float | None = None,
           cancel: threading.Event | None = None, env: Mapping[str, str] | None = None) -> Recording:
    """Run the workload under the recorder in a child; whatever was recorded is kept, even when it was
    stopped (at its deadline, after stall_s seconds without progress, or once `cancel` is set: status
    'cancelled'). env: variables set for this run only (the eager rerun's TORCHDYNAMO_DISABLE)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = name or f"trace_{mode}"
    log = out / f"{stem}.log"
    procs = out / f"{stem}.procs"   # the program's own Python children (ranks, workers), each recorded there
    shutil.rmtree(procs, ignore_errors=True)
    cmd = bootstrap_command(cfg_or_command, log, mode, follow=procs)
    if log.exists():
        log.unlink()
    end = run_child(cmd, timeout_s, out / f"{stem}.stderr.txt", stall_s=stall_s, log=log, follow=procs, cancel=cancel,
                    env=env)
    keep_recorded(log)
    children = keep_followed(procs)
    snap = read(log) if log.exists() else None
    tail = (out / f"{stem}.stderr.txt").read_text(errors="replace")[-4000:]
    stopped = end.status in ("hang", "timeout", "cancelled")
    sig = end.signal or (signal.SIGKILL if stopped else None)
    ops = {x: _started(x) for x in follow.child_logs(procs, children)}   # each header read once
    shown, shown_log = "", log
    # in stats mode, a process whose op made the first NaN/Inf that the root only received (a DataLoader worker's)
    pick = firstnan.made_elsewhere(log, list(ops)) if mode == "stats" and ops else None
    if pick is None and (snap is None or snap.started == 0) and ops:
        # a launcher (torchrun's agent, mp.spawn's parent) runs no op of its own: show the busiest process, or
        # in stats mode the one where an op made the first NaN/Inf (another rank may only have received it)
        nan = firstnan.first_of_job(list(ops)) if mode == "stats" else None
        pick = nan[0] if nan is not None else max(ops, key=ops.get)
    if pick is not None and ops.get(pick, 0) > 0:
        meta = next((m for m in children if Path(procs) / m.get("log", "") == pick), {})
        shown = (f"process {meta.get('pid')}" + (f" (rank {meta['rank']})" if meta.get("rank") is not None
                                                else f" (DataLoader worker {meta['worker']})"
                                                if meta.get("worker") is not None else "")) if meta else pick.stem
        shown_log, snap = pick, read(pick)
    if mode == "stats":   # how the run went on after its first NaN/Inf, there and in the job's other processes
        with contextlib.suppress(OSError):
            firstnan.note_end(shown_log, snap)
            firstnan.note_job(shown_log, [log, *ops])
    return Recording(snap, end.returncode, sig, end.timed_out, end.elapsed_s, str(shown_log), tuple(cmd), tail,
                     end.status, stall_s, len(children), sum(ops.values()), shown)


def _started(log: Path) -> int:
    """Ops a log recorded, from its header alone (0 when it is not a readable log)."""
    try:
        return log_progress(log).started
    except (OSError, ValueError):
        return 0


def stats_not_checked(first: Recording) -> str:
    """Why 02's stats-mode run is not wanted after `first` ("" when it is): a stopped first run (hang,
    timeout) would only wait again. After a crash or an error it is: the first NaN/Inf often comes before."""
    if first.finished:
        return ""
    return (f"**NaN/Inf not checked:** the workload did not finish ({first.status}), and a stats-mode "
            f"rerun would only {'hang' if first.status == 'hang' else 'run out of time'} again.")


def stats_recording(first: Recording, cfg_or_command, *, out_dir: str | os.PathLike, timeout_s: float = 300.0,
                    stall_s: float | None = None, ran: Recording | None = None) -> tuple[Recording | None, str]:
    """02's NaN/Inf check, a rerun in stats mode -> (the Recording or None, a sentence), bounded by stall_s;
    not run where stats_not_checked says why. `ran`: the stats-mode run, already made beside the first
    (gpulab.trace.followups), read instead of running one."""
    why = stats_not_checked(first)
    if why:
        return None, why
    rec = ran or record(cfg_or_command, mode="stats", out_dir=out_dir, timeout_s=timeout_s, name="stats",
                        stall_s=stall_s)
    note = "" if rec.ok else (f"The stats-mode rerun ended as {rec.status} (the first run: {first.status}); the ops "
                              f"up to its end were checked.")
    if not firstnan.hidden_by_compile(firstnan.read(rec.log)):
        return rec, note
    return eager_rerun(rec, note, cfg_or_command, out_dir=out_dir, timeout_s=timeout_s, stall_s=stall_s)


def eager_rerun(rec: Recording, note: str, cfg_or_command, *, out_dir: str | os.PathLike, timeout_s: float,
                stall_s: float | None) -> tuple[Recording, str]:
    """The first NaN/Inf came out of torch.compile'd code, whose inside the recorder does not see (or with the
    data): the same program once more in stats mode with TORCHDYNAMO_DISABLE=1, where every op is recorded.
    -> the eager run when it names where its first NaN/Inf came from (its record says `rerun: eager`); else
    the compiled run, its record saying what the eager one showed (`eager: clean` when it made none: then the
    compiled code makes it, not the data)."""
    eager = record(cfg_or_command, mode="stats", out_dir=out_dir, timeout_s=timeout_s, name="stats_eager",
                   stall_s=stall_s, env=dict([firstnan.EAGER_ENV]))
    got = firstnan.read(eager.log)
    if got is not None:
        firstnan.write(eager.log, {**got, "rerun": "eager"})
        return eager, " ".join(x for x in (note, firstnan.EAGER_NOTE) if x)
    compiled = firstnan.read(rec.log) or {}
    said = "clean" if eager.ok else eager.status
    firstnan.write(rec.log, {**compiled, "eager": said})
    return rec, " ".join(x for x in (note, firstnan.eager_note(said)) if x)


def measure_overhead(first: Recording, cfg, *, mode: str = "ops", repeats: int = 5,
                     out_dir: str | os.PathLike = "outputs/trace", timeout_s: float = 600.0,
                     stall_s: float | None = None):
    """The recording-cost table -> (DataFrame, "") or (None, a sentence saying why not), with `mode` (the one
    the chain records with) among the modes timed. Measured only when the first run finished well: a failing
    program's wall time is no cost figure, and re-running it would only fail again. The timing children are
    stopped after stall_s seconds without progress."""
    if not first.ok:
        return None, unfinished_cost(first.status)
    return timed_overhead(cfg, mode=mode, repeats=repeats, out_dir=out_dir, timeout_s=timeout_s, stall_s=stall_s)


def unfinished_cost(status: str, what: str = "the workload") -> str:
    return f"**Recording cost not measured:** {what} did not finish ({status}), so its wall time measures nothing."


OVERHEAD_RAW = "overhead_raw.json"   # the recorder's cost as timed in one process (gpulab.trace.bench)


def timed_overhead(cfg, *, mode: str, repeats: int, out_dir: str | os.PathLike, timeout_s: float = 600.0,
                   stall_s: float | None = None):
    """`overhead` of `mode`'s set of modes -> (DataFrame, "") or (None, the sentence saying how a timing run ended)."""
    try:
        ov = overhead(cfg, modes=modes_for(cfg, mode), repeats=repeats, out_dir=out_dir, timeout_s=timeout_s,
                      stall_s=stall_s)
    except OverheadFailed as exc:
        return None, (f"**Recording cost not measured:** a timing run ended as {exc.status} (see "
                      f"{report.code(exc.output)}).")
    return ov, ""


def overhead(cfg, modes: Sequence[str] | None = None, repeats: int = 5, out_dir: str | os.PathLike =
             "outputs/trace", timeout_s: float = 600.0, stall_s: float | None = None):
    """Wall time of one rung with no recorder vs each mode, interleaved, in ONE child (a DataFrame). Raises
    OverheadFailed when a child fails, hangs (no progress for stall_s) or runs out of time.

    The built-in workload is timed in-process in the child (model built once); us/op = (t_mode - t_none)/ops.
    modes: default `modes_for(cfg)`.
    """
    modes = modes_for(cfg) if modes is None else modes
    for m in modes:
        _check_mode(m)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not isinstance(cfg, WorkloadConfig) or cfg.kind != "builtin":
        return _overhead_whole_process(cfg, modes, repeats, out, timeout_s, stall_s)
    js = out / OVERHEAD_RAW
    native.ensure_all()
    cmd = [sys.executable, "-m", "gpulab.trace.bench", "--json", str(js), "--modes", ",".join(modes),
           "--repeats", str(repeats), "--", *cli_args(cfg)]
    end = run_child(cmd, timeout_s, out / "overhead.stderr.txt", stall_s=stall_s)
    if end.status != "ok" or not js.exists():
        tail = (out / "overhead.stderr.txt").read_text(errors="replace")[-2000:]
        raise OverheadFailed(f"the overhead child ended as {end.status} (exit {end.returncode}):\n{tail}", end.status,
                             "overhead.stderr.txt")
    return overhead_from(js)


def overhead_from(path: str | os.PathLike):
    """The rows gpulab.trace.bench.time_recorder wrote, as overhead() returns them (a DataFrame)."""
    import pandas as pd

    return pd.DataFrame(json.loads(Path(path).read_text())["rows"])


def _overhead_whole_process(cfg_or_command, modes, repeats, out: Path, timeout_s: float,
                            stall_s: float | None = None):
    """User workloads: whole-process wall time bare vs under each mode (startup included: noisier)."""
    import statistics

    import pandas as pd

    bare = command(cfg_or_command) if isinstance(cfg_or_command, WorkloadConfig) else list(cfg_or_command)
    variants = {"none": bare, **{m: bootstrap_command(cfg_or_command, out / f"overhead_{m}.log", m) for m in modes}}
    samples: dict[str, list[float]] = {n: [] for n in variants}
    names = list(variants)
    for r in range(repeats):
        for n in names[r % len(names):] + names[:r % len(names)]:
            end = run_child(variants[n], timeout_s, out / f"overhead_{n}.stderr.txt", stall_s=stall_s,
                            log=None if n == "none" else out / f"overhead_{n}.log")
            if end.status != "ok":
                raise OverheadFailed(f"overhead run {n!r} ended as {end.status} (exit {end.returncode}); see "
                                     f"{out / f'overhead_{n}.stderr.txt'}", end.status, f"overhead_{n}.stderr.txt")
            samples[n].append(end.elapsed_s)
    for m in modes:
        keep_recorded(out / f"overhead_{m}.log")
    ops = read(out / f"overhead_{modes[0]}.log").started if modes else 0
    base = statistics.median(samples["none"])
    return pd.DataFrame([{"variant": n, "ops": ops, "median_s": statistics.median(s), "baseline_s": base,
                          "us_per_op": (statistics.median(s) - base) / max(ops, 1) * 1e6, "ratio": None,
                          "samples_s": s} for n, s in samples.items()])


def modes_for(cfg, mode: str = "ops") -> list[str]:
    """Modes worth timing for this workload, `mode` always among them: auto, gpu and sync only differ from ops
    on CUDA; a user's workload is timed as a whole process, so only `mode` is (each mode is one more full run)."""
    _check_mode(mode)
    if not isinstance(cfg, WorkloadConfig) or cfg.kind != "builtin":
        return [mode]
    modes = ["ops", "auto", "gpu", "sync", "stats"] if str(cfg.device).startswith("cuda") else ["ops", "stats"]
    return modes if mode in modes else [*modes[:1], mode, *modes[1:]]
