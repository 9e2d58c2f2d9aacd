"""Running candidates over cases: the per-case verdicts (CaseResult), one candidate's OracleReport,
check/check_many in this process (notebook 05's Gate is gpulab.oracle.outcome's). The same on warm worker
children (one case of one candidate per job, each with a deadline; a kernel that hangs or faults costs only its
own report and its worker) is gpulab.oracle.pooled (isolated, check_isolated, judge_job); gpulab.oracle.gate
calls either.
"""
from __future__ import annotations

import inspect
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from gpulab import report
from gpulab.device import resolve
from gpulab.oracle import candidates as registry
from gpulab.oracle import view
from gpulab.oracle.cases import Case, case_set, make_inputs, resolve_dtypes
from gpulab.oracle.diagnose import Finding, across_cases, diagnose, explanation
from gpulab.oracle.errors import CandidateError, OracleError
from gpulab.oracle.rule import RuleResult, gold_and_baselines, rule
from gpulab.workloads import dtype_name


# ------------------------------------------------------------------------------------------ results

@dataclass(frozen=True)
class CaseResult:
    case: Case
    dtype: str
    status: str                       # pass | fail | unsupported
    rule: RuleResult | None = None
    findings: tuple[Finding, ...] = ()
    intermediates: tuple[tuple[str, RuleResult], ...] = ()
    message: str = ""                 # why unsupported
    worst: tuple[dict, ...] = ()
    heatmap: np.ndarray | None = field(default=None, compare=False, repr=False)
    p_heatmap: np.ndarray | None = field(default=None, compare=False, repr=False)
    nan_map: np.ndarray | None = field(default=None, compare=False, repr=False)   # (b*h, sq) bool
    tensors: dict | None = field(default=None, compare=False, repr=False)         # numpy arrays, failures only

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def row(self) -> dict:
        """One line of the report's table (plain dict: the GPU host may lack pandas)."""
        c, rr = self.case, self.rule
        nan = float("nan")
        return {
            "case": c.name, "shape": f"{c.batch}x{c.heads}x{c.sq}x{c.sk}x{c.head_dim}" + (f" kv{c.kv_heads}" if c.gqa else ""),
            "dtype": self.dtype, "causal": c.causal, "mask": c.mask, "dist": c.dist, "seed": c.seed,
            "error": rr.error if rr else nan, "ref_error": rr.ref_error if rr else nan,
            "allowed": rr.allowed if rr else nan, "ratio": rr.ratio if rr else nan,
            "nonfinite": rr.nonfinite if rr else 0, "excluded": rr.excluded if rr else 0,
            "status": self.status, "passed": self.passed,
            "pattern": "; ".join(f.code for f in self.findings) or (self.message[:80] if self.message else ""),
            **{f"{n}_ratio": ir.ratio for n, ir in self.intermediates},
        }


@dataclass(frozen=True)
class OracleReport:
    candidate: str
    device: str
    tile: int
    results: tuple[CaseResult, ...]
    findings: tuple[Finding, ...] = ()
    wall_s: float = 0.0
    error: str = ""                   # set when the check itself could not finish (hang, crash in a child)

    @property
    def supported(self) -> tuple[CaseResult, ...]:
        return tuple(r for r in self.results if r.status != "unsupported")

    @property
    def failures(self) -> tuple[CaseResult, ...]:
        return tuple(r for r in self.results if r.status == "fail")

    @property
    def passed(self) -> bool:
        """All supported cases pass, and at least one case was supported."""
        return not self.error and bool(self.supported) and not self.failures

    @property
    def worst_ratio(self) -> float:
        ratios = [r.rule.ratio for r in self.supported if r.rule is not None]
        return max(ratios) if ratios else float("nan")

    @property
    def patterns(self) -> tuple[str, ...]:
        """Codes of every finding, report-level and per failing case (e.g. 'nan_rows', 'heads')."""
        codes = [f.code for f in self.findings] + [f.code for r in self.failures for f in r.findings]
        return tuple(dict.fromkeys(codes))

    @property
    def table(self):
        """One row per case (DESIGN.md's contract): a DataFrame."""
        return view.report_table(self)

    def rows(self) -> list[dict]:
        return [r.row() for r in self.results]

    def explanation(self) -> list[str]:
        """Findings in words, most specific first (a named bug before where/when), with how often seen."""
        return explanation([r.findings for r in self.failures], self.findings)

    def summary(self) -> dict:
        """The gate entry notebook 06 reads: passed, reason, worst_ratio, cases."""
        n_uns = len(self.results) - len(self.supported)
        if self.error:
            reason = self.error
        elif not self.supported:
            reason = f"no case supported ({self.results[0].message[:120] if self.results else 'no cases'})"
        elif self.failures:
            reason = f"{len(self.failures)} of {len(self.supported)} cases fail: {'; '.join(self.explanation()[:3])}"
        else:
            reason = f"all {len(self.supported)} cases pass (worst ratio {self.worst_ratio:.2f})"
        if n_uns and not self.error:
            reason += f"; {n_uns} unsupported"
        return {"passed": self.passed, "reason": reason, "worst_ratio": self.worst_ratio,
                "cases": len(self.results), "failed": len(self.failures), "unsupported": n_uns,
                "patterns": list(self.patterns), "wall_s": round(self.wall_s, 3)}

    def pick(self, case: int | str | None = None, need: str = "heatmap") -> CaseResult:
        """The case a view shows: by index or name, else the worst one that kept a `need` map."""
        pool = [r for r in self.results if getattr(r, need) is not None]
        if not pool:
            raise OracleError(f"candidate {self.candidate!r}: no case with a {need} (only failing cases keep one)")
        if case is None:
            return max(pool, key=lambda r: (r.rule.nonfinite if need == "nan_map" else 0,
                                            r.rule.ratio if r.rule else 0))
        if isinstance(case, int):
            return self.results[case]
        for r in pool:
            if r.case.name == case:
                return r
        raise OracleError(f"case {case!r} has no {need}; cases with one: {', '.join(r.case.name for r in pool)}")

    # the views live in gpulab.oracle.view; these keep `rep.plot_heatmap()` at hand in a notebook
    def worst_table(self, case: int | str | None = None):
        return view.worst_table(self, case)

    def plot_heatmap(self, case: int | str | None = None, ax=None):
        return view.plot_heatmap(self, case, ax)

    def plot_p_heatmap(self, case: int | str | None = None, ax=None):
        return view.plot_p_heatmap(self, case, ax)

    def plot_nan_map(self, case: int | str | None = None, ax=None):
        return view.plot_nan_map(self, case, ax)

    def plot_ratios(self, ax=None):
        return view.plot_ratios(self, ax)

    def save(self, out_dir: str | os.PathLike) -> list[Path]:
        """Table as CSV/JSON and every kept failing case's tensors as .npy (for offline analysis)."""
        out = Path(out_dir)
        name = f"{_safe(self.candidate)}_table"
        report.write_rows(out, name, self.rows())
        paths = [out / f"{name}.csv", out / f"{name}.json"]
        for r in self.results:
            if r.tensors:
                d = out / f"{_safe(self.candidate)}__{r.case.name}__{r.dtype}"
                d.mkdir(parents=True, exist_ok=True)
                for key, arr in r.tensors.items():
                    np.save(d / f"{key}.npy", arr)
                    paths.append(d / f"{key}.npy")
        return paths


def _safe(name: str) -> str:
    """A candidate name ('pkg.mod:fn') usable as a file name."""
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name)


# ------------------------------------------------------------------------------------------ one call

def _as_candidate(candidate, device: str) -> registry.Candidate:
    if isinstance(candidate, registry.Candidate):
        return candidate
    if isinstance(candidate, str):
        return registry.resolve([candidate], device)[0]
    if callable(candidate):
        return registry.from_callable(candidate)
    raise OracleError(f"candidate {candidate!r} is not a Candidate, a callable or a name/'module:function' spec")


def _validate_signature(cand: registry.Candidate) -> None:
    try:
        sig = inspect.signature(cand.fn)
    except (TypeError, ValueError):
        return  # builtins (torch's own SDPA) carry no signature; trust them
    kw = {"attn_mask": None, "is_causal": False, "scale": None}
    if cand.gqa:
        kw["enable_gqa"] = True
    try:
        sig.bind(0, 0, 0, **kw)
    except TypeError as exc:
        raise CandidateError(f"candidate {cand.name!r} has signature {getattr(cand.fn, '__name__', '')}"
                             f"{sig}, which cannot take (q, k, v, *, attn_mask=None, is_causal=False, scale=None"
                             f"{', enable_gqa=True' if cand.gqa else ''}): {exc}") from None


_FAULTS = ("CUDA error", "illegal memory access", "device-side assert", "HIP error", "misaligned address",
           "unspecified launch failure")


def _call(cand: registry.Candidate, fn, inputs: dict, case: Case, dtype) -> tuple[Any, str | None]:
    """(output, None), or (None, why) when the candidate refuses the case (RuntimeError: 'No available
    kernel', unsupported head dim...); any other exception, or a GPU fault, raises CandidateError."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    kw = {"attn_mask": inputs["attn_mask"], "is_causal": inputs["is_causal"], "scale": inputs["scale"]}
    if case.gqa:
        if cand.gqa:
            kw["enable_gqa"] = True
        else:
            g = case.heads // case.kv_heads
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return fn(q, k, v, **kw), None
        except (RuntimeError, NotImplementedError) as exc:
            if any(m in str(exc) for m in _FAULTS):  # a GPU fault poisons the context: not "unsupported"
                raise CandidateError(f"candidate {cand.name!r} faulted on case {case.name} ({dtype_name(dtype)}): "
                                     f"{str(exc).splitlines()[0][:300]}") from exc
            why = " | ".join(str(w.message).splitlines()[0][:160] for w in caught[:3])
            return None, (str(exc).splitlines()[0][:200] + (f" [{why}]" if why else ""))
        except Exception as exc:
            raise CandidateError(f"candidate {cand.name!r} raised {type(exc).__name__} on case {case.name} "
                                 f"({dtype_name(dtype)}): {exc}") from exc


def _expect_tensor(cand: registry.Candidate, out, expected_shape, device: str, case: Case, dtype,
                   what: str = "output") -> torch.Tensor:
    where = f"on case {case.name} ({dtype_name(dtype)})"
    if not isinstance(out, torch.Tensor):
        raise CandidateError(f"candidate {cand.name!r} returned {type(out).__name__} as its {what} {where}; "
                             f"expected a torch.Tensor of shape {tuple(expected_shape)}")
    if tuple(out.shape) != tuple(expected_shape):
        raise CandidateError(f"candidate {cand.name!r} returned {what} of shape {tuple(out.shape)} {where}; "
                             f"expected {tuple(expected_shape)} (B, H, Sq, D)")
    if out.device.type != torch.device(device).type:
        raise CandidateError(f"candidate {cand.name!r} returned its {what} on {out.device} {where}; "
                             f"expected {device}")
    return out


def _intermediates(c: registry.Candidate, inputs: dict, case: Case, dtype, gold: dict, bases: list[dict],
                   device: str) -> dict[str, tuple[torch.Tensor, RuleResult]]:
    """The exposed S / P / lse, each judged by the rule (empty when the candidate exposes none here)."""
    if c.intermediates is None:
        return {}
    got, why = _call(c, c.intermediates, inputs, case, dtype)
    if why is not None:
        return {}
    if not isinstance(got, dict):
        raise CandidateError(f"candidate {c.name!r}: intermediates returned {type(got).__name__} on case "
                             f"{case.name}; expected a dict with keys among S, P, lse")
    inter = {}
    for key in ("S", "P", "lse"):
        if key in got:
            t = _expect_tensor(c, got[key], gold[key].shape, device, case, dtype, what=key)
            inter[key] = (t, rule(t, gold[key], [b[key] for b in bases], dtype))
    return inter


def _tensors(inputs: dict, out: torch.Tensor, gold: dict, err: np.ndarray) -> dict[str, np.ndarray]:
    """What a failing case leaves for offline analysis: inputs, output, gold and the error map."""
    arrays = {n: inputs[n].to(torch.float32).cpu().numpy() for n in ("q", "k", "v")}
    m = inputs["attn_mask"]
    if m is not None:
        arrays["attn_mask"] = m.cpu().numpy() if m.dtype == torch.bool else m.to(torch.float32).cpu().numpy()
    arrays.update(out=out.to(torch.float32).cpu().numpy(), gold=gold["out"].cpu().numpy(),
                  error=err.astype(np.float32))
    return arrays


def _judge(c: registry.Candidate, case: Case, dtype, inputs: dict, gold: dict, bases: list[dict], device: str,
           tile: int, worst_k: int, budget: list[int]) -> CaseResult:
    """One candidate on one case: call it, apply the rule, and locate the error when it fails."""
    out, why = _call(c, c.fn, inputs, case, dtype)
    if why is not None:
        return CaseResult(case, dtype_name(dtype), "unsupported", message=why)
    out = _expect_tensor(c, out, gold["out"].shape, device, case, dtype)
    rr = rule(out, gold["out"], [b["out"] for b in bases], dtype)
    inter = _intermediates(c, inputs, case, dtype, gold, bases, device)
    judged = tuple((k, x[1]) for k, x in inter.items())
    if rr.passed and all(x.passed for _, x in judged):
        return CaseResult(case, dtype_name(dtype), "pass", rr, intermediates=judged)
    name_bug = budget[0] > 0  # alternative golds cost a few fp64 attentions: name the bug on the first failures
    if name_bug:
        budget[0] -= 1
    d = diagnose(case, inputs, out, gold, rr, tile, worst_k, inter.get("P"), name_bug)
    findings = d.findings
    if rr.passed:
        bad = [k for k, x in judged if not x.passed]
        findings += (Finding("intermediate", f"output passes but {', '.join(bad)} fails the rule"),)
    return CaseResult(case, dtype_name(dtype), "fail", rr, findings, judged, worst=d.worst, heatmap=d.heatmap,
                      p_heatmap=d.p_heatmap, nan_map=d.nan_map, tensors=_tensors(inputs, out, gold, d.error))


def _severity(r: CaseResult) -> tuple:
    return (r.rule.nonfinite > 0, r.rule.ratio if math.isfinite(r.rule.ratio) else 1e300)


def _keep_worst_tensors(rs: list[CaseResult] | dict[int, CaseResult], keep: int) -> None:
    """Only the `keep` worst failing cases keep their tensors (.npy products): bounded memory. `rs` is in case
    order, or keyed by case index (results of workers side by side, arriving out of order): the least severe
    goes first, the earlier case on a tie, so the same ones stay whatever the order of arrival."""
    held = [i for i, r in (rs.items() if isinstance(rs, dict) else enumerate(rs)) if r.tensors is not None]
    if len(held) > keep:
        drop = min(held, key=lambda i: (_severity(rs[i]), i))
        rs[drop] = replace(rs[drop], tensors=None)


def _report(name: str, device: str, tile: int, rs: Sequence[CaseResult], wall_s: float) -> OracleReport:
    """A candidate's report from its results in case order, with what its failing cases share."""
    failed = [r.case for r in rs if r.status == "fail"]
    passed = [r.case for r in rs if r.status == "pass"]
    return OracleReport(name, device, tile, tuple(rs), tuple(across_cases(failed, passed, tile)), wall_s=wall_s)


# ------------------------------------------------------------------------------------------ in process

def check_many(candidates: Iterable, cases: str | Sequence[Case] = "default", device: str | None = None,
               dtypes: Any = None, *, tile: int = 64, worst_k: int = 8, explain_budget: int = 12,
               keep_tensors: int = 3, progress: bool = True) -> dict[str, OracleReport]:
    """Judge several candidates; gold and baselines are computed once per case and shared."""
    device = resolve("auto" if device is None else device)
    dts = resolve_dtypes(dtypes, device)
    cases_l = case_set(cases)
    if not isinstance(tile, int) or tile < 1:
        raise OracleError(f"tile={tile!r} must be a positive integer")
    cands = [_as_candidate(c, device) for c in candidates]
    names = [c.name for c in cands]
    if len(set(names)) != len(names):
        raise OracleError(f"candidate names must be unique; got {names}")
    for c in cands:
        _validate_signature(c)
    results: dict[str, list[CaseResult]] = {c.name: [] for c in cands}
    walls = {c.name: 0.0 for c in cands}
    budgets = {c.name: [explain_budget] for c in cands}
    total, t_start, last_print = len(cases_l) * len(dts), time.monotonic(), 0.0
    n = 0
    for dt in dts:
        for case in cases_l:
            n += 1
            inputs = make_inputs(case, dt, device)
            gold, bases = gold_and_baselines(inputs, dt)
            for c in cands:
                t0 = time.perf_counter()
                res = _judge(c, case, dt, inputs, gold, bases, device, tile, worst_k, budgets[c.name])
                results[c.name].append(res)
                if res.tensors is not None:
                    _keep_worst_tensors(results[c.name], keep_tensors)
                walls[c.name] += time.perf_counter() - t0
            now = time.monotonic() - t_start
            if progress and (now - last_print > 5 or n == total):
                last_print = now
                print(f"oracle: {n}/{total} cases ({now:.0f}s) {', '.join(names)[:60]}", file=sys.stderr, flush=True)
    shared = time.monotonic() - t_start - sum(walls.values())
    reports = {}
    for c in cands:
        reports[c.name] = _report(c.name, device, tile, results[c.name],
                                  walls[c.name] + shared / max(1, len(cands)))
    return reports


def check(candidate, cases: str | Sequence[Case] = "default", device: str | None = None, dtypes: Any = None,
          *, tile: int = 64, worst_k: int = 8, progress: bool = True) -> OracleReport:
    """Judge one candidate (a Candidate, an SDPA-like callable, a registry name or 'module:function')."""
    t0 = time.monotonic()
    dev = resolve("auto" if device is None else device)
    cand = _as_candidate(candidate, dev)
    rep = check_many([cand], cases, dev, dtypes, tile=tile, worst_k=worst_k, progress=progress)[cand.name]
    return replace(rep, wall_s=time.monotonic() - t0)
