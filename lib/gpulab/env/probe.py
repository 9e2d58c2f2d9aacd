"""Parent side of the torch/GPU probe: runs `gpulab.env.child` stage by stage with a deadline per stage.

A CUDA library that deadlocks while loading, or an attention kernel that spins forever, becomes a fact
(`torch_probe_status: hang`, `sdpa_hung: [math]`) instead of a hung notebook: the child reports each
stage on stdout (a file, read as it grows) before running it, so a stage that overruns its deadline is
named, and the child's whole process group is stopped through gpulab.proc.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpulab import proc
from gpulab.workloads import BACKENDS, FUSED_BACKENDS, WorkloadConfig

# Deadlines per probe stage (seconds). A CUDA init on a big node or a first cuDNN call may take a while;
# anything past these is treated as stuck.
STAGE_TIMEOUT_S = {"startup": 120.0, "import_torch": 180.0, "cuda_init": 180.0, "sdpa_select": 90.0,
                   "sdpa_run": 90.0}
SETUP_STAGES = ("import_torch", "cuda_init", "sdpa_select")
TRAINING_RUNGS = ("step", "steps")  # rungs whose attention also runs backward
# Fused backends first, the reference (math) last: the order of every table and of the real runs.
REPORT_ORDER = FUSED_BACKENDS + tuple(b for b in BACKENDS if b not in FUSED_BACKENDS)
LINE = "GPULAB_PROBE "  # prefix of the child's protocol lines on stdout
CHILD_MODULE = "gpulab.env.child"


def probe_spec(cfg: WorkloadConfig, unmasked: bool = False) -> dict:
    """The JSON the probe child gets: the workload's AttentionCall (`unmasked` for the no-mask comparison),
    with the dtype left as asked, since only the child (which imports torch) knows what 'auto' becomes."""
    call = cfg.attention(cfg.device)
    if unmasked:
        call = call.unmasked()
    return {"call": {**asdict(call), "dtype": cfg.dtype}, "device": cfg.device,
            "requires_grad": cfg.rung in TRAINING_RUNGS, "rung": cfg.rung, "sdpa_backend": cfg.sdpa_backend}


def run_order(sdpa: dict) -> list[str]:
    """Backends to run for real: the usable ones, the selected one first, math last (math is the one
    that has hung on new platforms, so it must not keep the others from being measured)."""
    sel = sdpa.get("selected")
    todo = [b for b in REPORT_ORDER if sdpa["backends"][b]["usable"]]
    return sorted(todo, key=lambda b: (b != sel, b not in FUSED_BACKENDS))


@dataclass(frozen=True)
class StageResult:
    """One stage of a probe child: ok, error, hang (killed at the deadline) or crash (child died)."""
    stage: str
    status: str
    seconds: float | None
    error: str | None = None


def stage_timeouts(overrides: dict | None = None) -> dict:
    """STAGE_TIMEOUT_S with overrides per stage kind ("sdpa_run") or per stage ("sdpa_run:math")."""
    t = {**STAGE_TIMEOUT_S, **(overrides or {})}
    t.setdefault("between_stages", t["sdpa_select"])
    t.setdefault("exit", 30.0)
    return t


class _LineReader:
    """Complete lines of a file another process is appending to (the probe's stdout)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.buf = path, 0, b""

    def next_line(self, final: bool = False) -> str | None:
        if b"\n" not in self.buf:
            try:
                with open(self.path, "rb") as fh:
                    fh.seek(self.offset)
                    chunk = fh.read()
            except OSError:
                chunk = b""
            self.offset += len(chunk)
            self.buf += chunk
        if b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            return line.decode("utf-8", "replace")
        if final and self.buf:
            line, self.buf = self.buf, b""
            return line.decode("utf-8", "replace")
        return None


def _tail_text(path: Path, chars: int = 800) -> str:
    try:
        return path.read_bytes()[-chars:].decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _child_env(env: dict | None) -> dict:
    """The child imports this very gpulab, whatever its PYTHONPATH said."""
    child_env = proc.python_env(env)
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    return child_env


def _hang(stage: str, seconds: float, limit: float) -> StageResult:
    return StageResult(stage, "hang", round(seconds, 3), f"no progress for {limit:g} s; killed the probe's process group")


def _ended(current: str, code: int | None, seconds: float, err_path: Path) -> StageResult | None:
    """What the child's exit means once every line was read: nothing when it finished cleanly."""
    if current == "exit":
        if code in (0, None):
            return None
        return StageResult("exit", "crash" if code < 0 else "error", None,
                           f"the probe child ended with code {code} after its last stage")
    status = "crash" if code is not None and code < 0 else "error"
    why = f"killed by signal {-code}" if status == "crash" else f"exited with code {code}"
    tail = _tail_text(err_path)
    return StageResult(current, status, round(seconds, 3), f"{why} during {current}" + (f": {tail}" if tail else ""))


def run_child(spec: dict, timeouts: dict, env: dict | None = None,
              progress: bool = False) -> tuple[list[StageResult], dict, str]:
    """Run `python -m gpulab.env.child SPEC`, enforcing each stage's deadline; returns the stages, the
    facts they reported (real runs under "_runs"), and the child's stderr tail."""
    argv = [sys.executable, "-m", CHILD_MODULE, json.dumps(spec)]
    results: list[StageResult] = []
    facts: dict = {}
    with tempfile.TemporaryDirectory(prefix="gpulab-probe-") as tmp:
        out_path, err_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
        try:
            child = proc.spawn(argv, stdout=out_path, stderr=err_path, env=_child_env(env), label="env-probe")
        except OSError as exc:
            return [StageResult("startup", "error", None, f"{type(exc).__name__}: {exc}")], facts, ""
        lines = _LineReader(out_path)
        current, started = "startup", time.monotonic()
        try:
            while True:
                limit = timeouts.get(current, timeouts.get(current.split(":", 1)[0], 120.0))
                if time.monotonic() - started > limit:
                    results.append(_hang(current, time.monotonic() - started, limit))
                    break
                line = lines.next_line()
                if line is None:
                    if child.wait(timeout=0.05) is None:
                        continue
                    line = lines.next_line(final=True)
                    if line is None:  # the child exited and every line was read
                        last = _ended(current, child.returncode, time.monotonic() - started, err_path)
                        results += [last] if last else []
                        break
                if not line.startswith(LINE):
                    continue
                try:
                    msg = json.loads(line[len(LINE):])
                except ValueError:
                    continue
                if msg.get("event") == "end":
                    current, started = "exit", time.monotonic()
                elif msg.get("event") == "start":
                    current, started = msg["stage"], time.monotonic()
                    if progress:
                        print(f"[gpulab env] {current} ...", file=sys.stderr, flush=True)
                elif msg.get("event") in ("done", "error"):
                    took = msg.get("s")
                    if took is not None and took > limit:  # it overran while we were not looking: a hang all the same
                        results.append(_hang(current, took, limit))
                        break
                    ok = msg["event"] == "done"
                    results.append(StageResult(msg["stage"], "ok" if ok else "error", msg.get("s"), msg.get("error")))
                    if ok:
                        f = msg.get("facts") or {}
                        if msg["stage"].startswith("sdpa_run:"):
                            facts.setdefault("_runs", {})[f.get("backend", msg["stage"].split(":", 1)[1])] = f
                        else:
                            facts.update(f)
                    current, started = "between_stages", time.monotonic()
        finally:
            child.stop()
            err_tail = _tail_text(err_path, 40 * 200)
    return results, facts, err_tail


def probe_torch(spec: dict, run_sdpa: bool, timeouts: dict, env: dict | None = None,
                progress: bool = False) -> dict:
    """The torch/GPU facts. One child normally does everything; a run that hangs or crashes is killed and
    the backends after it get a fresh child, so one bad kernel costs only its own row."""
    facts: dict[str, Any] = {}
    stages = list(SETUP_STAGES) + (["sdpa_run"] if run_sdpa else [])
    res, got, _ = run_child({**spec, "stages": stages}, timeouts, env, progress)
    results = list(res)
    runs: dict[str, dict] = dict(got.pop("_runs", {}))
    facts.update(got)
    setup = [r for r in res if not r.stage.startswith("sdpa_run:") and r.stage != "exit"]
    first_bad = next((r for r in setup if r.status != "ok"), None)
    facts["torch_probe_status"] = first_bad.status if first_bad else "ok"
    facts["torch_probe_stuck_in"] = first_bad.stage if first_bad else None
    hung, failed = [], []
    sdpa = facts.get("sdpa")
    if run_sdpa and sdpa:
        order = run_order(sdpa)
        while True:
            for r in res:
                if r.stage.startswith("sdpa_run:"):
                    b = r.stage.split(":", 1)[1]
                    if r.status == "hang":
                        hung.append(b)
                    elif r.status in ("error", "crash"):
                        failed.append(b)
                    if r.status != "ok":
                        runs[b] = {"backend": b, "status": r.status, "error": r.error}
            todo = [b for b in order if b not in runs]
            if not todo:
                break
            if not any(r.stage.startswith("sdpa_run:") for r in res):
                for b in todo:  # the child died before any run: say so once, do not loop
                    runs[b] = {"backend": b, "status": "not_run", "error": res[-1].error if res else None}
                break
            rerun = {**spec, "stages": ["import_torch", "cuda_init", "sdpa_run"], "run_backends": todo}
            res, got, _ = run_child(rerun, timeouts, env, progress)
            results += [r for r in res if r.stage.startswith("sdpa_run") or r.status != "ok"]
            runs.update(got.get("_runs", {}))
        for b, r in runs.items():
            r.setdefault("status", "ok")
            sdpa["backends"][b]["run"] = r
    facts["sdpa_hung"] = hung
    facts["sdpa_failed"] = failed
    facts["probe_stages"] = [asdict(s) for s in results]
    facts["workload"] = {k: v for k, v in spec.items() if k not in ("stages", "run_backends")}
    return facts
