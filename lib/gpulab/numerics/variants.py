"""Notebook 05's comparison of the configured workload: which two commands `compare=` runs (a rerun, eager
against compiled, CPU against GPU, float32 against a lower dtype), or why that comparison does not apply to
this workload here; and how the comparison folds into 05's headline and metrics. Pure: commands are built,
not run (gpulab.numerics.compare runs them).

Why a reason and not an error when a choice does not apply: the chain runs the same parameters on every
platform; a GPU-only comparison on a CPU host says so in the report and the oracle still runs.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from gpulab import workloads
from gpulab.trace import firstnan
from gpulab.workloads import WorkloadConfig

CHOICES = ("none", "rerun", "eager", "device", "dtype")
DTYPE_KNOB = "{dtype}"         # a script's own dtype flag, filled in per side: script:train.py --dtype {dtype}
NO_DYNAMO = firstnan.EAGER_ENV
NO_GPU = ("CUDA_VISIBLE_DEVICES", "")


@dataclass(frozen=True)
class Variant:
    """The two runs of one comparison (reference first), or why there are none (applies False)."""
    mode: str
    applies: bool
    what: str                                   # what is compared, or why it does not apply
    reference: tuple[str, ...] = ()
    candidate: tuple[str, ...] = ()
    ref_env: tuple[tuple[str, str], ...] = ()
    cand_env: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict:
        return {"mode": self.mode, "applies": self.applies, "what": self.what, "reference": list(self.reference),
                "candidate": list(self.candidate), "ref_env": dict(self.ref_env), "cand_env": dict(self.cand_env)}


def check(mode: str) -> str:
    if mode not in CHOICES:
        raise ValueError(f"compare={mode!r} is not valid; choose one of {', '.join(CHOICES)}")
    return mode


def _low_dtype(cfg: WorkloadConfig) -> str:
    """The candidate of a dtype comparison: the configured dtype when it is a lower one, else bfloat16."""
    return cfg.dtype if cfg.dtype not in ("auto", "float32") else "bfloat16"


def _fill(argv: list[str], dtype: str) -> tuple[str, ...]:
    return tuple(a.replace(DTYPE_KNOB, dtype) for a in argv)


def plan(mode: str, cfg: WorkloadConfig, *, has_gpu: bool) -> Variant:
    """The two commands of `compare=mode` for cfg (its device already resolved: cpu or cuda)."""
    check(mode)
    if mode == "none":
        return Variant(mode, False, "no comparison asked (compare=none)")
    if cfg.kind == "builtin":
        return _builtin(mode, cfg, has_gpu)
    return _program(mode, cfg, has_gpu)


def _builtin(mode: str, cfg: WorkloadConfig, has_gpu: bool) -> Variant:
    cmd = lambda c: tuple(workloads.command(c))  # noqa: E731
    if mode == "rerun":
        return Variant(mode, True, f"the built-in workload ({cfg.rung}, {cfg.device}) run twice: does it give "
                       f"the same numbers?", cmd(cfg), cmd(cfg))
    if mode == "eager":
        return Variant(mode, False, "does not apply: the built-in workload has no torch.compile option (it always "
                       "runs eager), so there is no compiled run to hold against the eager one")
    if mode == "device":
        if not has_gpu:
            return Variant(mode, False, "does not apply: no GPU here (torch.cuda.is_available() is False), so there "
                           "is no cuda run to hold against the cpu one")
        dt = cfg.dtype if cfg.dtype != "auto" else "float32"   # one dtype on both sides: only the device differs
        return Variant(mode, True, f"the built-in workload in {dt} on cpu (reference) against cuda (candidate)",
                       cmd(dataclasses.replace(cfg, device="cpu", dtype=dt)),
                       cmd(dataclasses.replace(cfg, device="cuda", dtype=dt)))
    low = _low_dtype(cfg)
    return Variant(mode, True, f"the built-in workload on {cfg.device} in float32 (reference) against {low} "
                   f"(candidate)", cmd(dataclasses.replace(cfg, dtype="float32")),
                   cmd(dataclasses.replace(cfg, dtype=low)))


def _program(mode: str, cfg: WorkloadConfig, has_gpu: bool) -> Variant:
    """A user program (script: or module:), run as the chain runs it: in the caller's folder, unchanged."""
    argv = workloads.command(cfg)
    knob = any(DTYPE_KNOB in a for a in argv)
    same = _fill(argv, cfg.dtype if cfg.dtype != "auto" else "float32")
    if mode == "rerun":
        return Variant(mode, True, "the program run twice: does it give the same numbers?", same, same)
    if mode == "eager":
        return Variant(mode, True, f"the program with {NO_DYNAMO[0]}=1 (reference, eager) against as it is "
                       f"(candidate: compiled where it calls torch.compile; without one both run eager)",
                       same, same, ref_env=(NO_DYNAMO,))
    if mode == "device":
        if not has_gpu:
            return Variant(mode, False, "does not apply: no GPU here (torch.cuda.is_available() is False), so the "
                           "program runs on the CPU either way")
        return Variant(mode, True, f"the program with {NO_GPU[0]}=\"\" (reference: a program that picks cuda when "
                       f"it is available runs on the CPU) against as it is (candidate)", same, same,
                       ref_env=(NO_GPU,))
    if not knob:
        return Variant(mode, False, f"does not apply: a program's dtype is its own; put {DTYPE_KNOB} where the "
                       f"program takes its dtype (e.g. workload='script:train.py --dtype {DTYPE_KNOB}') and 05 "
                       f"runs it in float32 and in the configured dtype")
    low = _low_dtype(cfg)
    return Variant(mode, True, f"the program with {DTYPE_KNOB}=float32 (reference) against {DTYPE_KNOB}={low} "
                   f"(candidate)", _fill(argv, "float32"), _fill(argv, low))


def run(v: Variant, out_dir: str, *, timeout_s: float, stall_s: float, log=print):
    """05's comparison of the planned pair, in out_dir/compare; None when the choice does not apply."""
    if not v.applies:
        return None
    from gpulab.numerics import compare

    return compare.run(v.reference, v.candidate, f"{out_dir}/compare", ref_env=dict(v.ref_env),
                       cand_env=dict(v.cand_env), timeout_s=timeout_s, stall_s=stall_s, log=log)


def metrics(v: Variant, comparison_dict: Mapping[str, Any] | None) -> dict:
    """05's `compare` metrics: what ran, the status and the first divergence (op, call site, pass, cause).
    comparison_dict is Comparison.to_dict() (None when nothing ran)."""
    out: dict[str, Any] = {"mode": v.mode, "applies": v.applies, "what": v.what}
    if not v.applies or comparison_dict is None:
        out["status"] = "not_applicable" if v.mode != "none" else "none"
        return out
    c = comparison_dict
    fd = c.get("first_divergence") or {}
    rep = c.get("replay") or fd.get("replay") or {}
    out.update(status=c.get("status"), summary=c.get("summary"),
               nondeterministic_op=(c.get("first_bitwise_difference") or {}).get("op"),
               same_command=bool(v.reference == v.candidate and v.ref_env == v.cand_env))
    if fd:
        err = fd.get("error") or {}
        out["first_divergence"] = {
            "op": fd.get("op"), "call_site": fd.get("call_site"), "pass": fd.get("pass"),
            "backward": fd.get("backward"), "run": fd.get("run"), "nan_inf": bool(fd.get("nan_inf")),
            "cause": fd.get("cause"), "excess": err.get("excess"), "max_rel_err": err.get("max_rel_err"),
            "replay": rep.get("words"), "reference_right": rep.get("reference_right"),
            "candidate_right": rep.get("candidate_right"), "arguments": rep.get("arguments"),
            "trend": fd.get("trend")}
    return out


def precision_only(cmp: Mapping[str, Any]) -> bool:
    """Whether a dtype comparison's divergence is the lower dtype's own rounding and nothing more: the float64
    replay finds both runs right for their dtype, no NaN/Inf, no cause, and the difference fades by the end of
    the run. Then it is what the lower dtype costs, not a wrong number; one that stays or grows (a statistic
    accumulated in bfloat16) still is."""
    fd = cmp.get("first_divergence") or {}
    return bool(cmp.get("mode") == "dtype" and cmp.get("status") == "diverged" and fd
                and fd.get("reference_right") is True and fd.get("candidate_right") is True
                and not fd.get("nan_inf") and not fd.get("cause") and not fd.get("arguments")
                and fd.get("trend") == "fades")


def fold(headline: str, oracle_metrics: Mapping[str, Any], cmp: Mapping[str, Any]) -> tuple[str, dict]:
    """05's headline and metrics with the comparison in: the oracle's keys unchanged (06 reads them), the
    comparison under `compare`; a divergence leads the headline (it is the workload's own wrong number)."""
    m = {**oracle_metrics, "compare": dict(cmp)}
    if cmp.get("mode") == "none":
        return headline, m
    words = cmp.get("summary") or str(cmp.get("what"))
    if precision_only(cmp):
        words = (f"{words.rstrip('.')}. Replayed against float64 both runs compute it right for their dtype and the "
                 f"difference fades: the lower dtype's rounding, not a wrong number.")
    elif cmp.get("status") in ("diverged", "failed", "unaligned"):
        return f"{words.rstrip('.')}. Oracle: {headline}", m
    return f"{headline.rstrip('.')}. Comparison ({cmp.get('mode')}): {words}", m
