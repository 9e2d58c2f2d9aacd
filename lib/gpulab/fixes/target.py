"""What the fix matrix runs: the built-in workload, a user's `module:callable`, or a plain command (a
`script:` workload or anything after `--`). The kind decides what can be compared: outputs and the loss
curve for the first two (gpulab.workloads saves them), outcomes and time only for a plain command.
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from gpulab import report, workloads
from gpulab.hang.investigation import ladder
from gpulab.hang.watchdog import watch

CHILD = "gpulab.fixes.child"


@dataclass(frozen=True)
class Target:
    cfg: workloads.WorkloadConfig | None = None
    command: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.cfg is None) == (not self.command):
            raise ValueError("give either a workload configuration or a command, not both and not neither")
        if self.cfg is not None and self.cfg.kind == "script":   # a script is a plain command
            object.__setattr__(self, "command", tuple(workloads.command(self.cfg)))
            object.__setattr__(self, "cfg", None)

    @property
    def kind(self) -> str:
        return self.cfg.kind if self.cfg is not None else "command"

    @property
    def compares_outputs(self) -> bool:
        return self.kind != "command"

    def describe(self) -> str:
        if self.cfg is None:
            return "command: " + " ".join(self.command)
        if self.kind == "module":
            return f"{self.cfg.workload} on {self.cfg.device}"
        c = self.cfg
        return (f"built-in workload up to the {c.rung} rung on {c.device} ({c.resolved_dtype(c.device)}, "
                f"sdpa_backend={c.sdpa_backend}, batch {c.batch}, {c.layers} layers)")

    def config(self, params: Mapping[str, Any]) -> workloads.WorkloadConfig:
        """The workload configuration with a fix's parameters (e.g. device=cpu) applied."""
        assert self.cfg is not None
        return dataclasses.replace(self.cfg, **params) if params else self.cfg

    def dtype(self, params: Mapping[str, Any]) -> str | None:
        if self.cfg is None:
            return None
        c = self.config(params)
        return workloads.resolve_dtype(c.dtype, c.device)

    def rungs(self, params: Mapping[str, Any]) -> list[ladder.Rung]:
        """The ladder: sdpa -> ... -> the configured rung for the built-in workload, else one rung."""
        if self.kind == "builtin":
            return ladder.builtin_rungs(self.config(params))
        if self.kind == "module":
            return [ladder.Rung("module", tuple(workloads.command(self.config(params))))]
        return [ladder.Rung("command", self.command)]

    def timing_argv(self, params: Mapping[str, Any], folder: Path, python: str | None, time_s: float) -> list[str]:
        """A child that runs the workload once more (without the recorder) and says how long it took; the
        built-in workload also times repeats of its rung for `time_s` seconds and saves its outputs. `python`
        is a fix's interpreter ($GPULAB_PYTHON), or None; it replaces the command's interpreter when that is
        gpulab's own, as in the ladder's children (gpulab.hang.watchdog.watch.launch_plan)."""
        timer = ["-m", CHILD, "--time", str(folder / "time.json"), "--"]
        if self.cfg is not None:
            return [python or sys.executable, *timer, "-m", "gpulab.workloads",
                    *workloads.cli_args(self.config(params)), "--json", str(folder / "result.json"),
                    "--outputs", str(folder / "outputs.pt"), "--time-for", str(time_s)]
        py = watch.python_command(self.command)
        if py is None:
            return list(self.command)
        interp, flags, rest = py
        return [workloads.fix_interpreter(interp, python), *flags, *timer, *rest]

    def samples(self, folder: Path, elapsed_s: float) -> tuple[float, ...]:
        """Seconds per timed repeat (built-in), else the program's own time, else the child's wall time."""
        times = (report.read_json(folder / "result.json", default={}) or {}).get("times_s") or ()
        if times:
            return tuple(float(t) for t in times)
        own = (report.read_json(folder / "time.json", default={}) or {}).get("seconds")
        return (float(own),) if own is not None else (float(elapsed_s),)
