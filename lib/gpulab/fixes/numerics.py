"""Does a fix change the numbers? Its run's outputs and loss curve against the fix-free run's, on a
configuration where the fix-free run finishes (same seed, same inputs).

A fix may change rounding (another kernel, another summation order), not results: the rule is the one
`gpulab compare` judges each op by (gpulab.tolerances: assert_close's rtol and atol for the looser dtype of
the two runs, as cpu_fallback runs float32 where the GPU ran bfloat16), taken at the output's magnitude
(max(1, max |reference|)) and allowed RUN_FACTOR times over, since a whole run's outputs carry the rounding of
every op before them. A value that is finite without the fix and not with it always breaks numerics.

It stays here, below gpulab.numerics (the per-op comparison of two runs, `gpulab compare`): the fix matrix is
its only caller and every function of it is on that path, and fixes may not import numerics (a higher layer).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gpulab import tolerances
from gpulab.workloads import DTYPE_NAMES

RUN_FACTOR = 5.0   # a whole run's outputs against one op's: rounding accumulated over the run
# max abs error / max(1, max |reference|), per dtype: RUN_FACTOR * (rtol + atol) of assert_close's
TOLERANCE = {d: RUN_FACTOR * sum(tolerances.DEFAULTS[d]) for d in DTYPE_NAMES}


def _flat(value: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return {prefix or "value": value.detach().to(torch.float64)}
    if isinstance(value, bool) or value is None:
        return {}
    if isinstance(value, (int, float)):
        return {prefix or "value": torch.tensor([float(value)], dtype=torch.float64)}
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                          for v in value):
        return {prefix or "value": torch.tensor([float(v) for v in value], dtype=torch.float64)}
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    out: dict[str, torch.Tensor] = {}
    for k, v in items:
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def tolerance(*dtypes: str | None) -> float:
    """The allowance relative to the output's magnitude: the looser dtype's (gpulab.tolerances.for_dtypes)."""
    t = tolerances.for_dtypes(*dtypes)
    return RUN_FACTOR * (t.rtol + t.atol)


def compare_values(reference: Any, candidate: Any, *dtypes: str | None) -> dict[str, Any]:
    """{ok, max_abs_err, loss_max_abs_diff, tolerance, new_nonfinite, note}; ok None when there is nothing
    to compare. Pure (tensors in, numbers out)."""
    ref, got = _flat(reference), _flat(candidate)
    tol = tolerance(*dtypes)
    if not ref:
        return {"ok": None, "note": "the fix-free run saved nothing to compare", "tolerance": tol}
    if set(ref) != set(got):
        return {"ok": False, "tolerance": tol, "note": f"the outputs differ in structure: {sorted(ref)} vs {sorted(got)}"}
    worst, worst_key, loss_diff, nonfinite = 0.0, None, None, 0
    ok = True
    for key, a in ref.items():
        b = got[key]
        if a.shape != b.shape:
            return {"ok": False, "tolerance": tol, "note": f"{key}: shape {list(b.shape)} vs {list(a.shape)}"}
        both = torch.isfinite(a) & torch.isfinite(b)
        nonfinite += int((torch.isfinite(a) & ~torch.isfinite(b)).sum())
        err = float((a - b)[both].abs().max()) if bool(both.any()) else 0.0
        scale = max(1.0, float(a[torch.isfinite(a)].abs().max()) if bool(torch.isfinite(a).any()) else 1.0)
        ok = ok and err <= tol * scale
        if key.startswith("losses"):
            loss_diff = max(loss_diff or 0.0, err)
        if err >= worst:
            worst, worst_key = err, key
    ok = ok and nonfinite == 0
    note = (f"largest difference {worst:.3g} in {worst_key}" + (f"; {nonfinite} value(s) became NaN/inf" if nonfinite
                                                                  else ""))
    return {"ok": ok, "max_abs_err": worst, "loss_max_abs_diff": loss_diff, "tolerance": tol,
            "new_nonfinite": nonfinite, "note": note}


def compare_files(reference: Path, candidate: Path, *dtypes: str | None) -> dict[str, Any]:
    """compare_values of two saved outputs (gpulab.builtin_model.save_outputs)."""
    if not Path(reference).exists() or not Path(candidate).exists():
        return {"ok": None, "note": "no saved outputs to compare (a run did not finish)"}
    load = lambda p: torch.load(p, map_location="cpu", weights_only=True)  # noqa: E731
    return compare_values(load(reference), load(candidate), *dtypes)
