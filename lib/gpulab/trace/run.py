"""Record a workload in a gpulab.proc child (own process group, deadline) and measure what recording costs.

Why a child: the workload may hang or crash the interpreter; the notebook kernel must survive, and the
log (a mmap'ed ring) keeps everything that was recorded up to the kill.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from gpulab import proc
from gpulab.trace import native
from gpulab.trace.ring import _check_mode, read
from gpulab.workloads import WorkloadConfig, cli_args, command



@dataclass(frozen=True)
class Recording:
    snapshot: Any            # gpulab.trace.Snapshot (None if the child never created the log)
    returncode: int | None   # None when killed on timeout
    signal: int | None       # the signal that ended the child, if any
    timed_out: bool
    elapsed_s: float
    log: str
    command: tuple[str, ...]
    stderr_tail: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


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
                      faulthandler: str | None = None, fault: str | None = None,
                      gpu_mechanism: str | None = None) -> list[str]:
    """argv that runs the workload under the recorder (what `record` and the watchdog start). The native
    hot path is built here, on the launcher's side, when it is not built yet (gpulab.trace.native)."""
    return [sys.executable, *recorder_args(log, mode, faulthandler, fault, gpu_mechanism), "--",
            *_target(cfg_or_command)]


def recorder_args(log: str | os.PathLike, mode: str = "auto", faulthandler: str | os.PathLike | None = None,
                  fault: str | None = None, gpu_mechanism: str | None = None) -> list[str]:
    """`-m gpulab.trace` and its options, up to the `--` (the interpreter is the caller's: the watchdog keeps
    a program's own interpreter and flags). Builds the native hot path on the launcher's side."""
    _check_mode(mode)
    native.ensure()
    args = ["-m", "gpulab.trace", "--log", str(log), "--mode", mode]
    if gpu_mechanism:
        args += ["--gpu-mechanism", gpu_mechanism]
    if faulthandler:
        args += ["--faulthandler", str(faulthandler)]
    if fault:
        args += ["--fault", str(fault)]
    return args


def run_child(cmd: Sequence[str], timeout_s: float, stderr_path: Path, cwd: str | None = None
              ) -> tuple[int | None, bool, float]:
    """Run cmd as a gpulab.proc child, output to stderr_path; stopped at the deadline.
    -> (exit code or None, timed_out, seconds)."""
    r = proc.run(cmd, timeout_s=timeout_s, env=_child_env(), cwd=cwd, stdout=stderr_path, stderr=subprocess.STDOUT)
    return r.returncode, r.timed_out, r.elapsed_s


def record(cfg_or_command, mode: str = "ops", out_dir: str | os.PathLike = "outputs/trace",
           timeout_s: float = 300.0, name: str | None = None) -> Recording:
    """Run the workload under the recorder in a child; whatever was recorded is kept, even on timeout."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = name or f"trace_{mode}"
    log = out / f"{stem}.log"
    cmd = bootstrap_command(cfg_or_command, log, mode)
    if log.exists():
        log.unlink()
    rc, timed_out, secs = run_child(cmd, timeout_s, out / f"{stem}.stderr.txt")
    snap = read(log) if log.exists() else None
    tail = (out / f"{stem}.stderr.txt").read_text(errors="replace")[-4000:]
    sig = -rc if rc is not None and rc < 0 else (signal.SIGKILL if timed_out else None)
    return Recording(snap, None if timed_out else rc, sig, timed_out, secs, str(log), tuple(cmd), tail)


def overhead(cfg, modes: Sequence[str] | None = None, repeats: int = 5, out_dir: str | os.PathLike =
             "outputs/trace", timeout_s: float = 600.0):
    """Wall time of one rung with no recorder vs each mode, interleaved, in ONE child (a DataFrame).

    The built-in workload is timed in-process in the child (model built once); us/op = (t_mode - t_none)/ops.
    modes: default `modes_for(cfg)`.
    """
    import pandas as pd

    modes = modes_for(cfg) if modes is None else modes
    for m in modes:
        _check_mode(m)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not isinstance(cfg, WorkloadConfig) or cfg.kind != "builtin":
        return _overhead_whole_process(cfg, modes, repeats, out, timeout_s)
    js = out / "overhead_raw.json"
    native.ensure()
    cmd = [sys.executable, "-m", "gpulab.trace.bench", "--json", str(js), "--modes", ",".join(modes),
           "--repeats", str(repeats), "--", *cli_args(cfg)]
    rc, timed_out, _ = run_child(cmd, timeout_s, out / "overhead.stderr.txt")
    if rc != 0 or not js.exists():
        tail = (out / "overhead.stderr.txt").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"overhead child failed (rc={rc}, timed_out={timed_out}):\n{tail}")
    data = json.loads(js.read_text())
    return pd.DataFrame(data["rows"])


def _overhead_whole_process(cfg_or_command, modes, repeats, out: Path, timeout_s: float):
    """User workloads: whole-process wall time bare vs under each mode (startup included: noisier)."""
    import statistics

    import pandas as pd

    bare = command(cfg_or_command) if isinstance(cfg_or_command, WorkloadConfig) else list(cfg_or_command)
    variants = {"none": bare, **{m: bootstrap_command(cfg_or_command, out / f"overhead_{m}.log", m) for m in modes}}
    samples: dict[str, list[float]] = {n: [] for n in variants}
    names = list(variants)
    for r in range(repeats):
        for n in names[r % len(names):] + names[:r % len(names)]:
            rc, timed_out, secs = run_child(variants[n], timeout_s, out / f"overhead_{n}.stderr.txt")
            if rc != 0:
                raise RuntimeError(f"overhead run {n!r} failed (rc={rc}, timed_out={timed_out}); see "
                                   f"{out / f'overhead_{n}.stderr.txt'}")
            samples[n].append(secs)
    ops = read(out / f"overhead_{modes[0]}.log").started if modes else 0
    base = statistics.median(samples["none"])
    return pd.DataFrame([{"variant": n, "ops": ops, "median_s": statistics.median(s), "baseline_s": base,
                          "us_per_op": (statistics.median(s) - base) / max(ops, 1) * 1e6, "ratio": None,
                          "samples_s": s} for n, s in samples.items()])


def modes_for(cfg) -> list[str]:
    """Modes worth timing for this workload: auto, gpu and sync only differ from ops on CUDA; a user's
    workload is timed as a whole process, so only ops is (each mode would be one more full run)."""
    if not isinstance(cfg, WorkloadConfig) or cfg.kind != "builtin":
        return ["ops"]
    return ["ops", "auto", "gpu", "sync", "stats"] if str(cfg.device).startswith("cuda") else ["ops", "stats"]
