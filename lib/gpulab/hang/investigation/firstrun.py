"""02's recorded run, made under the watchdog exactly as one of 03's ladder trials, so that 03 counts it as
its first trial instead of paying for the same run again.

Why: on a script that hangs, 03's first trial repeated 02's run to the same stall (a stall window, start-up
and the capture); on one that passes, a third of 03's trials was a run 02 had just made. The run is the
ladder's trial command (the configured rung's, the built-in workload writing its per-step result into the
folder), recorded in the same mode and judged by the same stall window, so its verdict (stacks included)
is what a trial would have given. 03 takes it only when everything that decides a trial's outcome is the
same (`as_trial`); a timeout is never taken (02's deadline is its own).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import signal
from pathlib import Path
from typing import Any

from gpulab import report, workloads
from gpulab.hang.investigation import caught, ladder
from gpulab.hang.watchdog import watch
from gpulab.hang.verdict import Verdict

FOLDER = "recorded"        # out_dir/recorded: the watched run (verdict.json, its op log when it failed)
REUSABLE = ("pass", "hang", "crash", "error")   # outcomes that do not depend on the run's deadline


def rung_of(cfg: workloads.WorkloadConfig) -> ladder.Rung:
    """The ladder rung 02 runs: the configured rung of the built-in workload, else the user's program."""
    if cfg.kind == "builtin":
        return ladder.builtin_rungs(cfg)[-1]
    return ladder.Rung(cfg.kind, tuple(workloads.command(cfg)))


def record(cfg: workloads.WorkloadConfig, out_dir: str | os.PathLike, *, mode: str, timeout_s: float,
           stall_s: float) -> Any:
    """Run the workload once under the watchdog (recording its ops) -> 02's Recording (gpulab.trace.run), its
    op log copied to out_dir/ops.log and its output to out_dir/ops.stderr.txt, as gpulab.trace.record leaves
    them. The watch folder keeps the verdict; its op logs only when the run failed (03 reads them then)."""
    out = Path(out_dir)
    folder = out / FOLDER
    shutil.rmtree(folder, ignore_errors=True)
    rung = rung_of(cfg)
    cmd = [c.replace("{trial}", str(folder)) for c in rung.command]
    folder.mkdir(parents=True, exist_ok=True)
    v = watch.run(cmd, stall_s=stall_s, timeout_s=timeout_s, mode=mode, record=True, out_dir=folder,
                  progress=lambda m: None)
    rec = caught.recording([folder], out)
    if rec.status in ("hang", "timeout"):   # stopped by the watchdog: no exit code of its own (trace.record's way)
        rec = dataclasses.replace(rec, returncode=None, signal=rec.signal or int(signal.SIGKILL))
    _output(folder, out / "ops.stderr.txt")
    ladder.keep_what_matters(v, folder)   # a pass drops its op log (02's copy is the one shown), a failure keeps it
    if v.status == "ok":
        shutil.rmtree(folder / "procs", ignore_errors=True)
    return rec


def _output(folder: Path, dest: Path) -> None:
    """The program's stdout and stderr, one file (gpulab.trace.record's ops.stderr.txt)."""
    parts = [(folder / n).read_text(errors="replace") for n in ("stdout.txt", "stderr.txt") if (folder / n).is_file()]
    report.write_text(dest, "".join(parts))


def as_trial(out_dir: str | os.PathLike, rung: ladder.Rung, *, mode: str, fault: str | None, stall_s: float,
             ladder_dir: str | os.PathLike) -> ladder.Trial | None:
    """02's watched run as trial 0 of `rung`, when it ran exactly that trial's command in the same recording
    mode with the same stall window and no planted fault, and ended in a way the deadline does not decide.
    Else None (03 runs every trial itself)."""
    folder = Path(out_dir) / FOLDER
    data = report.read_json(folder / "verdict.json", default=None)
    if not isinstance(data, dict) or watch.resolve_fault(fault) or data.get("planted"):
        return None
    try:
        v = Verdict.from_dict(data)
    except (TypeError, ValueError):   # another version's verdict: run the trial
        return None
    outcome = ladder.outcome_of(v)
    cmd = tuple(c.replace("{trial}", str(folder)) for c in rung.command)
    if (outcome not in REUSABLE or tuple(v.command) != cmd or v.mode != mode or v.stall_s != stall_s
            or v.interrupted):
        return None
    return ladder.Trial(rung.name, 0, outcome, round(float(v.elapsed_s or 0.0), 3),
                        os.path.relpath(folder, ladder_dir), ladder.brief(v), ladder.memory_of(rung, folder))
