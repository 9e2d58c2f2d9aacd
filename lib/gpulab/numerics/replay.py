"""The diverging op replayed alone: which run is right. Each side is run again up to that op (the parent names its
record in $GPULAB_NUMERICS_KEEP); the child keeps the op's inputs (as they were before it ran), its output, and
the op run once more on float64 CPU copies of its inputs, writes them to the run folder and ends there. The
parent holds both outputs against the float64 results, and the two float64 results against each other (do the
two runs run the same computation, or another implementation of the op?).

Kept only when the op's tensors are small (LIMIT elements together): a replay is evidence, not a second run.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from gpulab.numerics import mathmode
from gpulab.numerics.names import VARIANTS, replay_file

LIMIT = 4_000_000


def snapshot(args, kwargs) -> list[torch.Tensor] | None:
    """Host copies of an op's floating inputs before it runs (None when they are too large to keep)."""
    flat = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if sum(t.numel() for t in flat) > LIMIT:
        return None
    return [t.detach().to("cpu", copy=True) for t in flat]


def keep(folder: str, func, args, kwargs, out: torch.Tensor, out_index: int, before: list | None, n: int = 0,
         last: bool = True) -> None:
    """In the child: write the replay material of the n-th op asked for; after the last, end the run (nothing
    after it is needed)."""
    rec: dict[str, Any] = {"op": str(func), "note": "", "arguments": arguments(func, args, kwargs),
                           "math": mathmode.read(func, tree_flatten((args, kwargs))[0])}
    if before is None or out.numel() > LIMIT:
        rec["note"] = "the op's tensors are too large to keep"
    else:
        rec["inputs"], rec["output"] = before, out.detach().to("cpu", copy=True)
        it = iter(before)

        def f64(v):
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                return next(it).to(torch.float64)
            return v.detach().cpu() if isinstance(v, torch.Tensor) else (
                "cpu" if isinstance(v, torch.device) else v)
        try:
            args64, kwargs64 = tree_map(f64, (args, kwargs))
            if "device" in kwargs64:
                kwargs64["device"] = "cpu"
            got = [t for t in tree_flatten(_on_cpu(func, args64, kwargs64))[0] if isinstance(t, torch.Tensor)]
            rec["f64"] = got[out_index] if out_index < len(got) else got[0]
            if rec["math"]:   # what a reduced precision may be off by, per element
                rec["mag"] = mathmode.magnitude(func, args64, kwargs64, out_index)
        except Exception as exc:  # noqa: BLE001 - an op with no float64 CPU kernel: said, not fatal
            rec["note"] = f"no float64 CPU replay: {type(exc).__name__}: {exc}"[:300]
    torch.save(rec, os.path.join(folder, replay_file(n)))
    if last:
        os._exit(0)


def _on_cpu(func, args64, kwargs64):
    """func on float64 CPU tensors; a backend's own kernel that the CPU lacks (cuDNN's batch norm, CUDA's flash or
    efficient attention) as the CPU's kernel for the same call: only its leading outputs, the ones every backend
    gives alike (gpulab.numerics.names.VARIANTS), are compared."""
    try:
        return func(*args64, **kwargs64)
    except (NotImplementedError, RuntimeError):
        name = getattr(getattr(func, "_schema", None), "name", "").removeprefix("aten::")
        fam = VARIANTS.get(name, ("",))[0]   # batch_norm, attention
        if fam == "batch_norm" and name in ("cudnn_batch_norm", "miopen_batch_norm"):   # the same arguments
            return torch.ops.aten.native_batch_norm.default(*args64, **kwargs64)
        if fam == "attention":
            a = _by_name(func, args64, kwargs64)
            if float(a.get("dropout_p") or 0.0) == 0.0:
                return torch.nn.functional.scaled_dot_product_attention(
                    a["query"], a["key"], a["value"], attn_mask=a.get("attn_mask", a.get("attn_bias")),
                    is_causal=bool(a.get("is_causal")), scale=a.get("scale"), enable_gqa=bool(a.get("enable_gqa")))
        raise


def _by_name(func, args, kwargs) -> dict:
    """The call's arguments by their schema names ('#i' for a positional one past the schema's)."""
    schema = getattr(func, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    return {**{(names[i] if i < len(names) else f"#{i}"): v for i, v in enumerate(args)}, **kwargs}


_NOT_THE_CALL = frozenset({"device", "pin_memory", "layout", "memory_format", "non_blocking", "generator", "out"})


def _plain(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str)) or (
        isinstance(v, (list, tuple)) and all(_plain(x) for x in v))


def arguments(func, args, kwargs) -> dict[str, str]:
    """The call's plain arguments by their schema names, as text: flags, sizes, scalars, modes (training=True,
    approximate='tanh', reduction). Left out: tensors, and what legitimately differs between compared runs
    (devices, dtypes, layouts, generators)."""
    return {name: repr(v) for name, v in _by_name(func, args, kwargs).items()
            if name not in _NOT_THE_CALL and _plain(v)}


def _other_arguments(ref: dict, cand: dict) -> list[tuple[str, str | None, str | None]]:
    """(name, the reference's, the candidate's) for each plain argument the two calls do not share."""
    a, b = ref.get("arguments") or {}, cand.get("arguments") or {}
    names = set(a) | set(b) if ref.get("op") == cand.get("op") else set(a) & set(b)   # two backends' kernels: shared
    return [(k, a.get(k), b.get(k)) for k in sorted(names) if a.get(k) != b.get(k)]


def _err(got: torch.Tensor, ref: torch.Tensor) -> dict:
    """Elementwise error of got against a float64 reference (finite elements), and whether NaN/Inf agree."""
    g, r = got.detach().to(torch.float64).reshape(-1), ref.detach().to(torch.float64).reshape(-1)
    if g.shape != r.shape:
        return {"max_abs_err": math.inf, "max_rel_err": math.inf, "note": "shapes differ"}
    both = torch.isfinite(g) & torch.isfinite(r)
    d = (g - r)[both].abs()
    rel = d / r[both].abs().clamp_min(1e-30)
    return {"max_abs_err": float(d.max()) if d.numel() else 0.0,
            "max_rel_err": float(rel.max()) if rel.numel() else 0.0,
            "nonfinite_differ": int((torch.isfinite(g) != torch.isfinite(r)).sum())}


def _within(got: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float) -> bool:
    g, r = got.detach().to(torch.float64), ref.detach().to(torch.float64)
    return g.shape == r.shape and bool(torch.isclose(g, r, rtol=rtol, atol=atol, equal_nan=True).all())


def judge(ref_dir: Path, cand_dir: Path, rtol: float | None = None, atol: float | None = None, n: int = 0) -> dict:
    """Both sides' replay material -> which run is right, in words and figures ({"available": False, ...} when a
    side kept nothing). Each output is held against the float64 replay of its OWN inputs, under its own dtype's
    tolerance (rtol/atol: the user's): an op that computes right for what it was given is right, and the
    difference it shows is its inputs' rounding amplified; one that does not is a wrong kernel."""
    from gpulab.numerics.tolerance import for_dtypes

    got = {}
    for side, folder in (("reference", ref_dir), ("candidate", cand_dir)):
        p = Path(folder) / replay_file(n)
        if not p.exists():
            return {"available": False, "words": f"no replay: the {side} run did not reach the op again"}
        got[side] = torch.load(p, map_location="cpu", weights_only=True)
    settings = {side: g["math"] for side, g in got.items() if g.get("math")}
    for side, g in got.items():
        if "f64" not in g:
            said = "; ".join(mathmode.words(s, m, None) for s, m in settings.items())
            return {"available": False, "words": f"no replay: {g.get('note') or 'nothing kept'}"
                    + (f"; {said}" if said else ""), **({"settings": settings} if settings else {})}
    out: dict[str, Any] = {"available": True}
    right, reduced, beyond = {}, {}, ""
    for side, g in got.items():
        tol = for_dtypes(str(g["output"].dtype), rtol=rtol, atol=atol)
        right[side] = _within(g["output"], g["f64"], tol.rtol, tol.atol)
        out[f"{side}_vs_float64"] = {**_err(g["output"], g["f64"]), "right": right[side],
                                     "tolerance": tol.to_dict()}
        if not right[side] and side in settings and "mag" in g:   # off at float32: within its own precision?
            ok, frac = mathmode.within(g["output"], g["f64"], g["mag"], settings[side], tol.atol)
            out[f"{side}_vs_float64"]["of_magnitude"] = frac
            if ok:
                reduced[side] = mathmode.words(side, settings[side], frac)
            else:
                name = mathmode.NAMES[settings[side]["precision"]]
                beyond = (f" ({side}: {name} was allowed, but its error, {frac:.2g} of the sum of |products|, is "
                          f"more than that precision gives)")
    r, c = right["reference"], right["candidate"]
    how = "replayed alone on float64 CPU copies of each run's own inputs"
    if reduced and all(right[s] or s in reduced for s in right):   # each right for the precision it ran in
        out["settings"] = {s: settings[s] for s in reduced}
        out["words"] = f"{how}, each run computes it right for the precision it ran in: " + "; ".join(reduced.values())
        out["reference_right"], out["candidate_right"] = r, c
        out["cause"] = _nan_cause(got["reference"], got["candidate"])
        return out
    if r and not c:
        out["words"] = (f"{how}, the reference computes it right and the candidate does not (max relative error "
                        f"{out['candidate_vs_float64']['max_rel_err']:.3g}): the candidate's kernel is wrong")
    elif c and not r:
        out["words"] = (f"{how}, the candidate computes it right and the reference does not (max relative error "
                        f"{out['reference_vs_float64']['max_rel_err']:.3g}): the reference's kernel is wrong")
    elif r and c:
        out["words"] = (f"{how}, both runs compute it right for their dtype: the difference is the rounding of "
                        f"its inputs, which this op amplifies past the tolerance")
    else:
        out["words"] = (f"{how}, neither run is within its dtype's tolerance (max relative error "
                        f"{out['reference_vs_float64']['max_rel_err']:.3g} reference, "
                        f"{out['candidate_vs_float64']['max_rel_err']:.3g} candidate)")
    out["words"] += beyond
    out["reference_right"], out["candidate_right"] = r, c
    other = _other_arguments(got["reference"], got["candidate"])
    if other:   # each run computes right what it was asked: the two were asked different things
        said = ", ".join(f"{k}={'(none)' if x is None else x} in the reference and {'(none)' if y is None else y} "
                         f"in the candidate" for k, x, y in other)
        out["arguments"] = [{"name": k, "reference": x, "candidate": y} for k, x, y in other]
        out["words"] = (f"{how}, each run computes right what it was called with, but the two calls differ: {said}: "
                        f"the difference is the call (the program's code or its state), not a kernel or rounding")
    out["cause"] = _nan_cause(got["reference"], got["candidate"])
    return out


def _nan_cause(ref: dict, cand: dict) -> str | None:
    """Where the diverging op makes NaN/Inf in one run: the cause in words (gpulab.trace.nancause)."""
    from gpulab.trace import nancause

    for side in (cand, ref):
        o = side["output"]
        if o.is_floating_point() and not bool(torch.isfinite(o).all()):
            facts = [nancause.facts_of(t) for t in side["inputs"]]
            return nancause.cause(side["op"], facts, nancause.facts_of(o)).words
    return None
