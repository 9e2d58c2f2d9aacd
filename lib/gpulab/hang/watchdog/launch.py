"""How a watched command starts: whether it is a Python program (then run under `python -m gpulab.trace`, with
a heartbeat, its processes followed), the environment it gets, and where its files go (`Launch`). Apart from the
watch loop (gpulab.hang.watchdog.watch) so that the command line is read and checked in one place, before anything runs."""
from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from gpulab import beat, proc, workloads
from gpulab.hang import capture, faults, sources
from gpulab.trace import follow, native
from gpulab.trace.run import recorder_args

_PY = re.compile(r"^python(\d+(\.\d+)*)?$")
_PY_FLAGS_NOARG = {"-u", "-O", "-OO", "-B", "-E", "-s", "-S", "-I", "-b", "-bb", "-q", "-v"}
FIXES_VAR = "GPULAB_FIXES"   # gpulab.fixes.compose.FIXES_VAR: names the fixes a child installs


def bare_python(first: str) -> bool:
    """`python`, `python3`, `python3.12` with no folder: the interpreter gpulab runs in is meant (below)."""
    return os.sep not in first and bool(_PY.match(first))


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
    if fault is not None:   # named for the recorded root's preload, below the fixes and the recorder
        child_env = faults.child_env(child_env, fault)
    # the recorder's C hot path is built in here (never inside the watched program)
    argv = [interp, *flags, *recorder_args(out / "ops.log", mode, out / "faulthandler.txt",
                                           follow=procs if follow_children else None)]
    return Launch(tuple(argv + ["--", *rest]), child_env, True, out)


def program_sources(command: Sequence[str], cwd: str | os.PathLike | None = None) -> dict[str, str]:
    """The program's own sources, where it registers custom ops and defines kernels: the script (or `-m`
    module), the source files beside it and the modules of its own it imports (gpulab.hang.sources)."""
    pyc = python_command(command)
    if pyc is None:
        return {}
    target, base = pyc[2], Path(cwd or Path.cwd())
    if target[0] == "-m":
        mine = sources.program(base, module=target[1])
        script = next((a for a in target[2:] if a.endswith(".py")), None)   # a launcher's script (torchrun)
        return mine or (sources.program(base, script=script) if script else {})
    return sources.program(base, script=target[0])


def plain_env(env: Mapping[str, str]) -> dict[str, str]:
    """A watched child's environment without the recorder's variables: the program as it runs without gpulab."""
    out = {k: v for k, v in env.items() if k not in (follow.ENV, follow.MODE_ENV, beat.ENV)}
    if out.get("PYTHONPATH"):
        out["PYTHONPATH"] = os.pathsep.join(p for p in out["PYTHONPATH"].split(os.pathsep) if p != follow.SITE_DIR)
    return out
