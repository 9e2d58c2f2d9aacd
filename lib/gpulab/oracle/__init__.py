"""Correctness oracle for attention: is a candidate kernel numerically right, and where is it wrong?

The rule is FlashAttention's (tests/test_flash_attn.py): with gold computed in fp64 from the same
low-precision inputs, a candidate passes a case when

    e(out) <= 2 * e(baseline) + 2 * max|(gold + 0.3 - 0.3) - gold|      (the last term in the working dtype)

where e(x) = max|x - gold| and the baseline is plain attention math in the working dtype. FlashAttention
uses one baseline ordering (K scaled instead of Q); we run the four legitimate orderings (scale applied
to Q, to K, to the scores QK^T as fused kernels do, and sqrt(scale) on both Q and K as PyTorch's MATH
backend does) and take the largest error, so a kernel is never failed for picking another correct order:
with fp32 inputs and large logits the orderings differ by up to ~6x (measured on the default set).
fp32 candidates are judged the same way against fp32 baselines.
Any non-finite output where gold is finite fails, with its count and locations.

Conventions the case set pins down (and candidates must follow, since they mimic
`torch.nn.functional.scaled_dot_product_attention`):

- `is_causal=True` is TOP-LEFT aligned: query i sees keys j <= i even when sq != sk (FlashAttention's
  own convention is bottom-right; a kernel using it fails the sq != sk causal cases, named as such).
- Boolean masks: True = attend. Additive masks are added to the scaled scores. A row whose keys are all
  masked has no defined output (PyTorch math gives NaN there): gold is NaN in such rows and they are
  excluded from the error and from the non-finite rule (counted in `excluded_rows`). The built-in cases
  never generate such rows (key 0 is always visible).
- GQA (a case with `kv_heads < heads`): query head h uses kv head h // (heads // kv_heads), as SDPA's
  `enable_gqa=True`. A candidate that declares GQA support (`Candidate.gqa`, or a `supports_gqa = True`
  attribute on the function) receives k/v with `kv_heads` heads and `enable_gqa=True`; any other
  candidate receives k/v already expanded to `heads` heads and no extra keyword.

Optional intermediates protocol: a candidate may expose `intermediates(q, k, v, *, attn_mask=None,
is_causal=False, scale=None[, enable_gqa])` (the `Candidate.intermediates` field, or an `intermediates`
attribute on the function) returning a dict with any of
    "S":   scale * q @ k^T before masking, (B, H, Sq, Sk)
    "P":   softmax probabilities after masking, (B, H, Sq, Sk)
    "lse": log-sum-exp of the masked scaled scores (natural log), (B, H, Sq)
Each is judged with the same ratio rule against fp64 gold and the working-dtype baselines.

Modules, by job: `cases` (Case, the case sets, seeded inputs), `rule` (fp64 gold, baselines, the ratio
rule; pure), `diagnose` (error maps, tile heatmaps, worst elements, the bug named; pure), `check` (running
candidates in process, OracleReport, notebook 05's Gate), `pooled` (the same in warm worker children, a deadline
per case), `gate` (notebook 05's gate: in process or pooled), `gpulab.pool` (the warm worker: compute-only jobs one at a time in one persistent child, a lost one replaced), `candidates`
(the registry of implementations), `scope` (what 05 judges for a workload: a user program only when 02 saw it
call attention, or could not tell), `view` (tables and figures). `python -m gpulab.pool` is the worker;
`python -m gpulab.oracle` checks candidates in one process of its own (by hand, or a fixes test's entry point).
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any

# name -> the module that holds it. Imported when first used (PEP 562): notebook 05 decides whether it applies
# to a workload without torch (a second and a half of its start on a CPU), and loads the oracle only when it does.
_WHERE = {
    "candidates": None, "view": None, "cases": None, "check": None, "diagnose": None, "rule": None,
    "pooled": None, "scope": None, "errors": None, "outcome": None, "sets": None,
    "CASE_SETS": "sets", "DISTS": "cases", "MASKS": "cases", "Case": "cases", "case_set": "cases",
    "make_inputs": "cases", "resolve_dtypes": "cases",
    "GATE_FILE": "outcome", "Gate": "outcome", "finding": "outcome",
    "CaseResult": "check", "OracleReport": "check", "check": "check", "check_many": "check",
    "PRIORITY": "diagnose", "Finding": "diagnose", "across_cases": "diagnose", "error_map": "diagnose",
    "explain": "diagnose", "spatial_findings": "diagnose", "tile_heatmap": "diagnose", "tile_heatmap_2d": "diagnose",
    "worst_elements": "diagnose",
    "CandidateError": "errors", "OracleError": "errors",
    "gate": "gate",
    "check_isolated": "pooled", "isolated": "pooled",
    "ORDERS": "rule", "RuleResult": "rule", "gold_and_baselines": "rule", "reference": "rule", "rule": "rule",
    "Scope": "scope", "scope_for": "scope",
}

__all__ = sorted(k for k, v in _WHERE.items() if v is not None or k in ("candidates", "view"))


_FUNCTIONS = {k for k, v in _WHERE.items() if v == k}   # gate, check, rule: a function named as its module


class _Package(types.ModuleType):
    """Keeps oracle.gate, .check and .rule the functions: importing a submodule binds it on its package, and a
    submodule first imported by another module (pooled imports check) would otherwise hide the function."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FUNCTIONS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'gpulab.oracle' has no attribute {name!r}")
    where = _WHERE[name]
    mod = importlib.import_module(f"gpulab.oracle.{where or name}")
    value = mod if where is None else getattr(mod, name)
    setattr(sys.modules[__name__], name, value)
    return value
