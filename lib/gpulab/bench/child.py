"""Notebook 06's benchmark as a child process: what to time (`Spec`), and `run`, which starts the child.

A candidate kernel can hang or fault, so the timing runs in `python -m gpulab.bench.worker` through
gpulab.proc (own process group, deadline); the child writes its results file after every step, so a hang
loses nothing already measured. The parent never touches the device.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpulab import proc, recorded, report
from gpulab import device as _device
from gpulab.bench.decision import Gate, parse_gate
from gpulab.stats import check_delta
from gpulab.workloads import BACKENDS, SDPA_CANDIDATES, AttentionCall, WorkloadConfig

RESULT_FILE = "benchmark.json"
SPEC_FILE = "benchmark_spec.json"
LOG_FILE = "benchmark.log"
WORKER = "gpulab.bench.worker"
STATUSES = ("ok", "hang", "crash", "error", "not_applicable")   # not_applicable: nothing to time, no child
RECORDER_S = 300.0   # the worker's deadline grows by this when it also times the recorder (its own child had 600 s)


def canonical(names: Sequence[str]) -> list[str]:
    """Registry names in order, no repeats: the registry's aliases ('math' -> 'sdpa_math') applied."""
    return list(dict.fromkeys(SDPA_CANDIDATES.get(n, n) for n in names))


def at_length(call: AttentionCall, seq_len: int) -> AttentionCall:
    """The same call at another sequence length, with the same kind of mask: the masked (text padding) keys
    stay where they are when they fit, else they shrink in proportion, as a shorter prompt's would. A
    recorded call's mask keeps its broadcast dimensions; keys of another length than the queries (cross
    attention) keep theirs, and only the queries change."""
    if call.mask in ("bool", "additive"):
        shape = list(call.mask_shape or ())
        if len(shape) >= 2 and shape[-2] == call.seq_len:
            shape[-2] = seq_len
        if call.kv_len is None and shape and shape[-1] == call.seq_len:
            shape[-1] = seq_len
        return dataclasses.replace(call, seq_len=seq_len, mask_shape=tuple(shape))
    if call.mask == "none" or not call.padded_keys:
        return dataclasses.replace(call, seq_len=seq_len)
    end = call.seq_len if call.pad_end is None else call.pad_end
    if end > seq_len:
        end = max(1, round(end * seq_len / call.seq_len))
    padded = min(call.padded_keys, max(1, end - 1))
    return dataclasses.replace(call, seq_len=seq_len, padded_keys=padded, pad_end=end)


@dataclass(frozen=True)
class Spec:
    """Everything the benchmark child needs; JSON-able so it crosses the process boundary."""

    device: str
    call: AttentionCall | None      # the workload's attention call: what every candidate is timed on
    candidates: tuple[str, ...]     # registry names (gpulab.oracle.candidates)
    baseline: str = "sdpa_math"
    seq_lens: tuple[int, ...] = ()
    delta: float = 0.01
    max_time_s: float = 1.0
    workload: dict | None = None    # gpulab.workloads.WorkloadConfig fields: the scenario's workload to time
    gate: dict | None = None        # 05's gate JSON as read, None when absent
    source: str = ""                # whose call `call` is, in words ("" for the built-in workload's)
    reason: str = ""                # why nothing is timed (call is None): the workload makes no call 06 can time
    recorded: tuple[dict, ...] = () # a user program's attention calls as 02 recorded them (RecordedCall.row)
    recorder: dict | None = None    # the recorder's cost to time after the benchmark, in the same process
                                    # (gpulab.trace.followups.recorder_plan), None for none

    @property
    def applies(self) -> bool:
        return self.call is not None

    def sweep_calls(self) -> tuple[AttentionCall, ...]:
        return tuple(at_length(self.call, s) for s in self.seq_lens) if self.call is not None else ()

    def deadline_s(self) -> float:
        """Caps of every measurement the child may take, plus start-up and bootstrap time."""
        n = len(set(self.candidates) | {self.baseline})
        timed = (2 * n + 1 + n * len(self.seq_lens) + 1)
        return 90.0 + timed * (1.5 * self.max_time_s + 5.0) + (RECORDER_S if self.recorder else 0.0)


def spec_from_dict(d: Mapping[str, Any]) -> Spec:
    return Spec(**{**d, "call": AttentionCall(**d["call"]) if d.get("call") else None,
                   "candidates": tuple(d["candidates"]), "seq_lens": tuple(d["seq_lens"]),
                   "recorded": tuple(d.get("recorded") or ())})


def workload_call(cfg: WorkloadConfig, device: str, out_dir: str | os.PathLike | None
                  ) -> tuple[AttentionCall | None, str, tuple[dict, ...]]:
    """(the call 06 times, whose it is in words, the recorded calls' rows): the built-in workload's own
    call; a user program's most frequent SDPA call as notebook 02 recorded it in out_dir, or None and the
    reason when it made none 06 can time (or it is unknown whether it makes any)."""
    if cfg.kind == "builtin":
        return cfg.attention(device), "", ()
    use = recorded.attention_use(cfg, out_dir)
    pick, text = use.benchmark()
    rows = tuple(c.row() for c in use.calls)
    if pick is None:
        return None, text, rows
    return pick.attention(), text, rows


def load_gate(out_dir: str | os.PathLike) -> dict[str, Gate] | None:
    """05's gate from out_dir, or None when 05 has not run there."""
    return parse_gate(report.read_json(Path(out_dir) / report.ORACLE_GATE_FILE), report.ORACLE_GATE_FILE)


def make_spec(cfg: WorkloadConfig, *, candidates: Sequence[str], baseline: str, seq_lens: Sequence[int],
              delta: float, max_time_s: float, out_dir: str | os.PathLike | None = None,
              recorder: Mapping[str, Any] | None = None) -> Spec:
    """The notebook's parameters -> a checked Spec (with 05's gate read from out_dir when it is there). recorder:
    gpulab.trace.followups.recorder_plan's request, timed by the worker after the benchmark (None: not)."""
    if not isinstance(candidates, (list, tuple)) or not all(isinstance(c, str) and c for c in candidates):
        raise ValueError(f"candidates={candidates!r} must be a list of names: SDPA backends "
                         f"({', '.join(BACKENDS)}), gpulab.oracle.candidates names or module:function")
    if not isinstance(baseline, str) or not baseline:
        raise ValueError(f"baseline={baseline!r} must name a candidate, e.g. 'math'")
    if not isinstance(seq_lens, (list, tuple)) or not all(isinstance(s, int) and s > 0 for s in seq_lens):
        raise ValueError(f"seq_lens={seq_lens!r} must be a list of positive integers")
    check_delta(delta)
    if not max_time_s > 0:
        raise ValueError(f"max_time_s={max_time_s!r} must be > 0 seconds")
    dev = _device.resolve(cfg.device)
    gate = None
    if out_dir is not None:
        gate = report.read_json(Path(out_dir) / report.ORACLE_GATE_FILE)
        parse_gate(gate, report.ORACLE_GATE_FILE)  # fail early on a malformed gate
    call, whose, rows = workload_call(cfg, dev, out_dir)
    return Spec(dev, call, tuple(canonical(candidates)), canonical([baseline])[0], tuple(seq_lens), float(delta),
                float(max_time_s), asdict(cfg), gate, source=whose if call is not None else "",
                reason=whose if call is None else "", recorded=rows, recorder=dict(recorder) if recorder else None)


@dataclass(frozen=True)
class RunResult:
    status: str                    # one of STATUSES
    result: dict                   # the child's results file as far as it got
    elapsed_s: float
    log: str                       # path of the child's output log
    detail: str = ""

    @property
    def recorder(self) -> dict | None:
        """What the worker said of the recorder's cost it was asked to time (gpulab.trace.followups.recorder_cost's
        `timed`): {"status": ok|not_here|hang|crash|error, "json", "why"}; None when it was not asked."""
        return self.result.get("recorder")


def run(spec: Spec, out_dir: str | os.PathLike, timeout_s: float | None = None) -> RunResult:
    """Run the worker in a child process group with a deadline; whatever it saved survives a hang or crash.
    A spec with no call to time starts no child: the result says why (status not_applicable)."""
    spec_path, result_path, log_path = (report.product(out_dir, n) for n in (SPEC_FILE, RESULT_FILE, LOG_FILE))
    report.write_json(spec_path, asdict(spec))
    result_path.unlink(missing_ok=True)
    if spec.recorder:
        with contextlib.suppress(OSError):   # an earlier run's figures are not this one's
            Path(spec.recorder["json"]).unlink(missing_ok=True)
    if not spec.applies:
        result = {"spec": asdict(spec), "done": True, "stage": "not_applicable", "reason": spec.reason}
        report.write_json(result_path, result)
        return RunResult("not_applicable", result, 0.0, "", spec.reason)
    deadline = timeout_s or spec.deadline_s()
    r = proc.run([sys.executable, "-m", WORKER, str(spec_path), str(result_path)], timeout_s=deadline,
                 env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log_path, stderr=subprocess.STDOUT,
                 grace_s=0.2, label="06_benchmark")
    result = report.read_json(result_path, default={}) or {}
    stage = result.get("stage", "none")
    ended, code = r.status, r.returncode
    if spec.recorder and result.get("done") and (result.get("recorder") or {}).get("status") in (None, "started"):
        # the benchmark was done and saved: only the recorder's timing after it ended with the process
        result["recorder"] = {**spec.recorder, "status": {"timeout": "hang", "crash": "crash"}.get(r.status, "error"),
                              "why": f"the worker {_ended_words(r, deadline)} while timing it"}
        ended, code = "ok", 0
    if ended == "timeout":
        status, detail = "hang", f"no result after {deadline:.0f} s (stage reached: {stage})"
    elif ended == "crash":
        status, detail = "crash", f"killed by signal {r.signal} (stage reached: {stage})"
    elif code != 0 or not result.get("done"):
        tail = log_path.read_text(errors="replace").strip().splitlines()
        status, detail = "error", f"exit code {code}: {tail[-1] if tail else ''}"
    else:
        status, detail = "ok", ""
    return RunResult(status, result, r.elapsed_s, str(log_path), detail)


def _ended_words(r: Any, deadline: float) -> str:
    if r.status == "timeout":
        return f"was stopped at its deadline ({deadline:.0f} s)"
    if r.status == "crash":
        return f"was killed by signal {r.signal}"
    return f"ended with exit code {r.returncode}"
