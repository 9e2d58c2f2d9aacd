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
"""
from __future__ import annotations

import inspect
import math
import os
import pickle
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from gpulab import proc

MASKS = ("none", "bool", "additive")
DISTS = ("randn", "rand", "large")
LARGE_FACTOR = 6.0  # q, k ~ 6*N(0,1): logits with std ~36 overflow exp() in fp32 without max-subtraction
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
CASE_SETS = ("default", "quick")
ALT_TILES = (16, 32, 64, 128, 256)  # block sizes tried when naming tile-shaped errors


class OracleError(ValueError):
    """Bad input to the oracle (cases, dtypes, device): names the bad value and the valid choices."""


class CandidateError(RuntimeError):
    """A candidate broke the SDPA contract (signature, return type, shape): names candidate and case."""


# ---------------------------------------------------------------------------------------------- cases

@dataclass(frozen=True)
class Case:
    """One input configuration; inputs are regenerated from it deterministically (seeded)."""
    sq: int
    sk: int
    head_dim: int
    batch: int = 1
    heads: int = 2
    kv_heads: int | None = None  # None: no GQA
    causal: bool = False
    mask: str = "none"           # none | bool | additive (exclusive with causal, as in SDPA)
    dist: str = "randn"          # randn | rand | large
    seed: int = 0
    scale: float | None = None   # None: 1/sqrt(head_dim)

    def __post_init__(self):
        if self.mask not in MASKS:
            raise OracleError(f"Case.mask={self.mask!r} is not valid; choose one of {', '.join(MASKS)}")
        if self.dist not in DISTS:
            raise OracleError(f"Case.dist={self.dist!r} is not valid; choose one of {', '.join(DISTS)}")
        if self.causal and self.mask != "none":
            raise OracleError(f"Case with causal=True and mask={self.mask!r}: SDPA forbids attn_mask with "
                              f"is_causal; use one or the other")
        for key in ("sq", "sk", "head_dim", "batch", "heads"):
            if int(getattr(self, key)) < 1:
                raise OracleError(f"Case.{key}={getattr(self, key)!r} must be >= 1")
        if self.kv_heads is not None and (self.kv_heads < 1 or self.heads % self.kv_heads):
            raise OracleError(f"Case.kv_heads={self.kv_heads!r} must divide heads={self.heads}")

    @property
    def gqa(self) -> bool:
        return self.kv_heads is not None and self.kv_heads != self.heads

    @property
    def name(self) -> str:
        heads = f"h{self.heads}" + (f"kv{self.kv_heads}" if self.gqa else "")
        how = "causal" if self.causal else ("nomask" if self.mask == "none" else f"{self.mask}mask")
        sc = "" if self.scale is None else f"_sc{self.scale:g}"
        return f"b{self.batch}{heads}_q{self.sq}k{self.sk}d{self.head_dim}_{how}_{self.dist}_s{self.seed}{sc}"


def _default_cases() -> list[Case]:
    """Broad enough that tile, mask, causal, scale, GQA and overflow bugs cannot hide: every (lengths,
    masking, distribution) combination with 3 seeds, each seed on another head dim; ~300 cases, a few
    seconds per candidate on an idle 2-core CPU (tens of seconds when the machine is busy)."""
    shapes = [(128, 128), (97, 97), (200, 200), (1, 128), (97, 200), (200, 97), (64, 1025), (1025, 256)]
    head_dims = [32, 64, 80, 128, 256]
    modes = [(False, "none"), (True, "none"), (False, "bool"), (False, "additive")]
    cases, i = [], 0
    for seed in range(3):
        for sq, sk in shapes:
            for causal, mask in modes:
                for dist in DISTS:
                    d = head_dims[(i + seed) % len(head_dims)]
                    if sq * sk >= 64 * 1025 and d > 128:
                        d = 64
                    batch, heads = (2, 2) if seed < 2 else (1, 4)
                    cases.append(Case(sq, sk, d, batch=batch, heads=heads, causal=causal, mask=mask, dist=dist,
                                      seed=seed))
                    i += 1
    # GQA (groups of 2 and 3), custom scales and long square lengths (three partial-tile levels) on top.
    for causal, mask in modes:
        cases.append(Case(97, 200, 64, batch=2, heads=4, kv_heads=2, causal=causal, mask=mask, seed=1))
        cases.append(Case(200, 200, 128, batch=1, heads=6, kv_heads=2, causal=causal, mask=mask, dist="large",
                          seed=2))
        cases.append(Case(130, 97, 32, batch=2, heads=8, kv_heads=1, causal=causal, mask=mask, dist="rand", seed=3))
        cases.append(Case(97, 130, 96, batch=1, heads=2, causal=causal, mask=mask, scale=0.3, seed=0))
        cases.append(Case(200, 64, 64, batch=1, heads=2, causal=causal, mask=mask, scale=1.0, dist="rand", seed=4))
    cases.append(Case(1025, 1025, 64, batch=1, heads=2, causal=True, dist="randn", seed=0))
    cases.append(Case(1025, 1025, 128, batch=1, heads=1, mask="bool", dist="large", seed=1))
    cases.append(Case(2048, 2048, 64, batch=1, heads=1, causal=True, dist="large", seed=2))
    # Edge lengths (a single key, a single query and key) and many heads (head-confined errors stand out).
    for causal, mask in modes:
        cases.append(Case(33, 1, 64, batch=2, heads=2, causal=causal, mask=mask, seed=5))
        cases.append(Case(256, 256, 64, batch=4, heads=8, causal=causal, mask=mask, dist="rand", seed=6))
    cases.append(Case(1, 1, 128, batch=2, heads=2, seed=7))
    return cases


def _quick_cases() -> list[Case]:
    """A few seconds: one case per bug family (tiles, causal alignment, masks, GQA, scale, overflow)."""
    return [
        Case(128, 128, 64, batch=1, heads=2),
        Case(97, 97, 64, batch=2, heads=2, causal=True, seed=1),
        Case(97, 200, 32, batch=2, heads=2, causal=True, seed=2),
        Case(200, 97, 128, batch=1, heads=2, causal=True, dist="rand"),
        Case(97, 200, 64, batch=2, heads=2, mask="bool", seed=1),
        Case(200, 130, 80, batch=2, heads=2, mask="additive", dist="rand", seed=2),
        Case(97, 200, 64, batch=2, heads=4, kv_heads=2, seed=1),
        Case(200, 200, 64, batch=1, heads=2, dist="large", seed=2),
        Case(130, 130, 32, batch=1, heads=2, causal=True, dist="large", seed=3),
        Case(97, 130, 96, batch=1, heads=2, scale=0.3),
    ]


def case_set(cases: str | Sequence[Case] = "default") -> list[Case]:
    """'default' | 'quick' | a list of Case objects."""
    if isinstance(cases, str):
        if cases == "default":
            return _default_cases()
        if cases == "quick":
            return _quick_cases()
        raise OracleError(f"cases={cases!r} is not valid; choose one of {', '.join(CASE_SETS)} or pass a list of Case")
    out = list(cases)
    bad = [c for c in out if not isinstance(c, Case)]
    if bad or not out:
        raise OracleError(f"cases must be {' / '.join(CASE_SETS)} or a non-empty list of gpulab.oracle.Case; "
                          f"got {type(bad[0]).__name__ if bad else 'an empty list'}")
    return out


def resolve_dtypes(dtypes: Any, device: str) -> tuple[torch.dtype, ...]:
    """None/'auto' -> fp32 on CPU, (bf16, fp16) on CUDA; names or torch dtypes otherwise."""
    if dtypes is None or dtypes == "auto":
        return (torch.float32,) if device.startswith("cpu") else (torch.bfloat16, torch.float16)
    if isinstance(dtypes, (str, torch.dtype)):
        dtypes = [dtypes]
    out = []
    for d in dtypes:
        if isinstance(d, torch.dtype) and d in DTYPES.values():
            out.append(d)
        elif isinstance(d, str) and d in DTYPES:
            out.append(DTYPES[d])
        else:
            raise OracleError(f"dtype {d!r} is not valid; choose from float32, bfloat16, float16 (or 'auto')")
    return tuple(dict.fromkeys(out))


def make_inputs(case: Case, dtype: torch.dtype, device: str) -> dict[str, Any]:
    """Seeded q, k, v (k/v with kv_heads heads for GQA) and the mask, in the working dtype on `device`."""
    g = torch.Generator().manual_seed(1_000_003 * case.seed + 7919 * case.sq + 131 * case.sk + case.head_dim)
    kvh = case.kv_heads if case.gqa else case.heads
    shape_q = (case.batch, case.heads, case.sq, case.head_dim)
    shape_kv = (case.batch, kvh, case.sk, case.head_dim)
    if case.dist == "rand":
        q, k, v = (torch.rand(s, generator=g, dtype=torch.float64) for s in (shape_q, shape_kv, shape_kv))
    else:
        q, k, v = (torch.randn(s, generator=g, dtype=torch.float64) for s in (shape_q, shape_kv, shape_kv))
        if case.dist == "large":
            q, k = q * LARGE_FACTOR, k * LARGE_FACTOR
    mask = None
    if case.mask == "bool":
        keep = torch.rand((case.batch, 1, case.sq, case.sk), generator=g) < 0.8
        if case.batch > 1:  # key padding on odd batch entries
            keep[1::2, :, :, (3 * case.sk) // 4:] = False
        keep[..., 0] = True  # key 0 always visible: no fully masked row
        mask = keep.to(device)
    elif case.mask == "additive":
        i = torch.arange(case.sq, dtype=torch.float64)[:, None]
        j = torch.arange(case.sk, dtype=torch.float64)[None, :]
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / case.heads) for h in range(case.heads)], dtype=torch.float64)
        bias = -slopes[None, :, None, None] * (i - j).abs()  # ALiBi
        bias = bias + 0.5 * torch.randn((case.batch, case.heads, case.sq, case.sk), generator=g, dtype=torch.float64)
        if case.batch > 1:
            bias[1::2, :, :, (3 * case.sk) // 4:] = float("-inf")
        bias[..., 0] = bias[..., 0].clamp(min=-1.0)
        mask = bias.to(dtype).to(device)
    cast = lambda t: t.to(dtype).to(device)  # noqa: E731
    return {"q": cast(q), "k": cast(k), "v": cast(v), "attn_mask": mask, "is_causal": case.causal,
            "scale": case.scale}


# ------------------------------------------------------------------------------------------ reference

ORDERS = ("q", "k", "s", "sqrt")  # where the softmax scale is applied: Q, K, the scores, sqrt on both


def reference(q, k, v, attn_mask=None, is_causal=False, scale=None, *, dtype=torch.float64, order="q",
              causal_offset=0, key_limit=None, head_map="div", ignore_mask=False, ignore_causal=False):
    """Plain attention in `dtype` (fp64: gold; working dtype: baseline); keywords produce the variants
    used to name a bug (shifted diagonal, dropped keys, wrong head map, ignored mask)."""
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    h, hk = q.shape[-3], k.shape[-3]
    if hk != h:
        idx = torch.arange(h, device=q.device)
        idx = idx // (h // hk) if head_map == "div" else idx % hk
        k, v = k[..., idx, :, :], v[..., idx, :, :]
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if order == "q":
        s = (q * sc) @ k.transpose(-2, -1)
    elif order == "k":
        s = q @ (k * sc).transpose(-2, -1)
    elif order == "s":
        s = (q @ k.transpose(-2, -1)) * sc
    elif order == "sqrt":
        r = math.sqrt(sc) if sc >= 0 else None
        s = (q * r) @ (k * r).transpose(-2, -1) if r is not None else (q * sc) @ k.transpose(-2, -1)
    else:
        raise OracleError(f"order={order!r} is not valid; choose one of {', '.join(ORDERS)}")
    sq, sk = q.shape[-2], k.shape[-2]
    allowed = None
    if is_causal and not ignore_causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        allowed = j <= i + causal_offset
    if key_limit is not None:
        lim = torch.arange(sk, device=q.device)[None, :] < key_limit
        allowed = lim if allowed is None else allowed & lim
    if attn_mask is not None and not ignore_mask and attn_mask.dtype == torch.bool:
        allowed = attn_mask if allowed is None else allowed & attn_mask
    s_raw = s
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    if attn_mask is not None and not ignore_mask and attn_mask.dtype != torch.bool:
        s = s + attn_mask.to(dtype)
    p = torch.softmax(s, dim=-1)
    return {"out": p @ v, "S": s_raw, "P": p, "lse": torch.logsumexp(s, dim=-1)}


# ------------------------------------------------------------------------------------------ the rule

@dataclass(frozen=True)
class RuleResult:
    error: float            # max|out - gold| over entries where both are finite
    ref_error: float        # larger baseline error
    atol: float             # 2 * max|(gold + 0.3 - 0.3) - gold| in the working dtype
    allowed: float          # 2 * ref_error + atol
    ratio: float            # error / ref_error
    nonfinite: int          # non-finite outputs where gold is finite
    excluded: int           # entries where gold itself is not finite (fully masked rows)
    passed: bool


def rule(out: torch.Tensor, gold: torch.Tensor, baselines: Sequence[torch.Tensor], dtype: torch.dtype) -> RuleResult:
    """FlashAttention's forward rule plus the non-finite rule; pure (tensors in, numbers out)."""
    gold = gold.to(torch.float64)
    zero = torch.zeros((), dtype=torch.float64, device=gold.device)
    gold_all_finite = bool(torch.isfinite(gold.sum()))  # fast path: masks only when something is not finite
    fin = None if gold_all_finite else torch.isfinite(gold)

    def emax(x: torch.Tensor) -> tuple[float, int]:
        if x.numel() == 0:
            return 0.0, 0
        xd = x.to(torch.float64)
        d = (xd - gold).abs()
        if gold_all_finite and bool(torch.isfinite(xd.sum())):
            return float(d.max()), 0
        xfin = torch.isfinite(xd)
        ok = xfin if fin is None else fin & xfin
        bad = ~xfin if fin is None else fin & ~xfin
        return float(torch.where(ok, d, zero).max()), int(bad.sum())

    error, nonfinite = emax(out)
    ref_error = max((emax(b)[0] for b in baselines), default=0.0)
    g = (gold if fin is None else torch.where(fin, gold, zero)).to(dtype)
    atol = 2.0 * float((((g + 0.3) - 0.3) - g).abs().max()) if g.numel() else 0.0
    allowed = 2.0 * ref_error + atol
    ratio = error / ref_error if ref_error > 0 else (0.0 if error == 0 else float("inf"))
    return RuleResult(error, ref_error, atol, allowed, ratio, nonfinite, 0 if fin is None else int((~fin).sum()),
                      nonfinite == 0 and error <= allowed)


# ------------------------------------------------------------------------------------------ analysis

@dataclass(frozen=True)
class Finding:
    code: str   # nan_rows | heads | last_partial_tile | causal_diagonal | causal_alignment | causal_ignored |
    #            tail_key_tile_dropped | wrong_scale | mask_ignored | gqa_head_map | large_magnitude | only_when | scattered
    text: str


def error_map(out: torch.Tensor, gold: torch.Tensor) -> np.ndarray:
    """|out - gold| with inf where gold is finite and out is not, 0 where gold is not finite."""
    gold = gold.to(torch.float64)
    outd = out.to(torch.float64)
    err = (outd - gold).abs()
    fin = torch.isfinite(gold)
    err = torch.where(fin & ~torch.isfinite(outd), torch.full_like(err, float("inf")), err)
    err = torch.where(fin, err, torch.zeros_like(err))
    return err.cpu().numpy()


def tile_heatmap(err: np.ndarray, allowed: float, tile: int) -> np.ndarray:
    """Max error / allowed per (batch*head) row and query tile of `tile` rows: >1 means that tile fails."""
    if tile < 1:
        raise OracleError(f"tile={tile!r} must be a positive integer")
    b, h, sq = err.shape[:3]
    rows = err.reshape(b * h, sq, -1).max(axis=-1)
    n = -(-sq // tile)
    pad = np.zeros((b * h, n * tile))
    pad[:, :sq] = rows
    hm = pad.reshape(b * h, n, tile).max(axis=-1)
    return hm / allowed if allowed > 0 else np.where(hm > 0, np.inf, 0.0)


def tile_heatmap_2d(err2d: np.ndarray, allowed: float, tile: int) -> np.ndarray:
    """Max error / allowed per (query tile, key tile) of an (Sq, Sk) error map (S or P)."""
    sq, sk = err2d.shape
    nq, nk = -(-sq // tile), -(-sk // tile)
    pad = np.zeros((nq * tile, nk * tile))
    pad[:sq, :sk] = err2d
    hm = pad.reshape(nq, tile, nk, tile).max(axis=(1, 3))
    return hm / allowed if allowed > 0 else np.where(hm > 0, np.inf, 0.0)


def worst_elements(err: np.ndarray, out: np.ndarray, gold: np.ndarray, k: int) -> list[dict]:
    """The k largest errors: index (b, h, i, d), candidate value, gold value, error."""
    flat = np.nan_to_num(err.reshape(-1), nan=np.inf)
    k = min(k, flat.size)
    idx = np.argpartition(-flat, k - 1)[:k] if k else np.array([], dtype=int)
    idx = idx[np.argsort(-flat[idx], kind="stable")]
    rows = []
    for i in idx:
        pos = np.unravel_index(int(i), err.shape)
        rows.append({"index": tuple(int(p) for p in pos), "candidate": float(out[pos]), "gold": float(gold[pos]),
                     "error": float(flat[i])})
    return rows


def _fmt_list(xs: Sequence[int], n: int = 6) -> str:
    xs = list(xs)
    return ", ".join(str(x) for x in xs[:n]) + (f", ... ({len(xs)} in all)" if len(xs) > n else "")


def spatial_findings(err: np.ndarray, nonfinite: np.ndarray, allowed: float, tile: int,
                     p_err: np.ndarray | None = None, p_allowed: float | None = None,
                     causal: bool = False) -> list[Finding]:
    """Where the error lives in one case: NaN rows, a subset of heads, the last partial tile, the diagonal."""
    b, h, sq = err.shape[:3]
    bad = (err > allowed).any(axis=-1)           # (b, h, sq) rows over the limit
    nf_rows = nonfinite.any(axis=-1)
    found: list[Finding] = []
    if nf_rows.any():
        bb, hh, ii = np.nonzero(nf_rows)
        where = "; ".join(f"b{x} h{y} row {z}" for x, y, z in list(zip(bb, hh, ii))[:4])
        found.append(Finding("nan_rows", f"non-finite output in {int(nf_rows.sum())} of {nf_rows.size} rows "
                                         f"({int(nonfinite.sum())} values; e.g. {where})"))
    if not bad.any():
        return found
    heads_bad = sorted(int(x) for x in np.nonzero(bad.any(axis=(0, 2)))[0])
    if 0 < len(heads_bad) < h:
        found.append(Finding("heads", f"error confined to heads {_fmt_list(heads_bad)} of {h} "
                                      f"(the other heads pass)"))
    rows_bad = np.nonzero(bad.any(axis=(0, 1)))[0]
    for t in sorted(set(ALT_TILES) | {tile}):
        start = (sq // t) * t
        if sq % t and start > 0 and rows_bad.min() >= start:
            found.append(Finding("last_partial_tile", f"error confined to query rows {start}..{sq - 1}: the last "
                                                      f"partial tile for tile size {t} (sq={sq})"))
            break
    if p_err is not None and causal and p_allowed is not None:
        pb = p_err > p_allowed
        if pb.any():
            ii, jj = np.nonzero(pb.any(axis=(0, 1)))
            if np.all(np.abs(jj - ii) <= 1):
                found.append(Finding("causal_diagonal", "P differs only on the causal boundary diagonal "
                                                        "(|j - i| <= 1)"))
    if not any(f.code in ("heads", "last_partial_tile") for f in found):
        frac = bad.sum() / bad.size
        found.append(Finding("scattered", f"{int(bad.sum())} of {bad.size} rows over the limit ({frac:.0%}), "
                                          f"across heads {_fmt_list(heads_bad)}"))
    return found


def _hypotheses(case: Case, sq: int, sk: int) -> list[tuple[str, str, dict]]:
    """Alternative golds, each one realistic kernel bug: (code, words, reference keywords)."""
    d = case.head_dim
    default = 1.0 / math.sqrt(d)
    used = case.scale if case.scale is not None else default
    hyps = []
    for alt, why in ((1.0 / d, "1/head_dim"), (1.0, "1 (no scaling)"), (default, "1/sqrt(head_dim) (scale= ignored)")):
        if not math.isclose(alt, used):
            hyps.append(("wrong_scale", f"softmax scale {why} = {alt:.4g} instead of {used:.4g}", {"scale": alt}))
    if case.causal:
        hyps.append(("causal_diagonal", "causal mask shifted by one (query i sees key i+1)", {"causal_offset": 1}))
        hyps.append(("causal_diagonal", "causal mask shifted by one (query i misses key i)", {"causal_offset": -1}))
        if sq != sk:
            hyps.append(("causal_alignment", f"bottom-right aligned causal mask (offset sk-sq={sk - sq}; "
                                             f"FlashAttention's convention, PyTorch's is top-left)",
                         {"causal_offset": sk - sq}))
        hyps.append(("causal_ignored", "no causal mask at all", {"ignore_causal": True}))
    for t in ALT_TILES:
        if sk % t and sk > t:
            hyps.append(("tail_key_tile_dropped", f"keys {(sk // t) * t}..{sk - 1} dropped (the last partial key "
                                                  f"tile for tile size {t})", {"key_limit": (sk // t) * t}))
    if case.mask != "none":
        hyps.append(("mask_ignored", f"the {case.mask} attn_mask ignored", {"ignore_mask": True}))
    if case.gqa:
        hyps.append(("gqa_head_map", "GQA head h mapped to kv head h % kv_heads instead of h // group",
                     {"head_map": "mod"}))
    return hyps


def explain(case: Case, inputs: dict, out: torch.Tensor, error: float, allowed: float) -> list[Finding]:
    """Name the bug by finding an alternative gold the output does match (computed, never assumed)."""
    found = []
    if error <= allowed:  # the case failed on non-finite values only: no alternative gold explains NaN
        return found
    outd = out.to(torch.float64)
    kw0 = {k: inputs[k] for k in ("attn_mask", "is_causal", "scale")}
    for code, words, kw in _hypotheses(case, case.sq, case.sk):
        args = dict(kw0)
        if "scale" in kw:
            args["scale"] = kw.pop("scale")
        alt = reference(inputs["q"], inputs["k"], inputs["v"], **args, **kw)["out"]
        fin = torch.isfinite(alt) & torch.isfinite(outd)
        if not fin.any() or bool((torch.isfinite(alt) & ~torch.isfinite(outd)).any()):
            continue
        e_alt = float((outd - alt).abs()[fin].max())
        if e_alt <= max(allowed, error / 20.0):
            found.append(Finding(code, f"output matches attention with {words} (error {e_alt:.2e} against that, "
                                       f"{error:.2e} against gold)"))
            break
    return found


_PREDICATES = (
    ("large_magnitude", "large-magnitude inputs (logits that overflow exp() without max-subtraction)",
     lambda c, t: c.dist == "large"),
    ("only_when", "partial tiles (sq or sk not a multiple of the tile)", lambda c, t: bool(c.sq % t or c.sk % t)),
    ("only_when", "causal cases", lambda c, t: c.causal),
    ("only_when", "masked cases", lambda c, t: c.mask != "none"),
    ("only_when", "boolean masks", lambda c, t: c.mask == "bool"),
    ("only_when", "additive masks", lambda c, t: c.mask == "additive"),
    ("only_when", "GQA cases", lambda c, t: c.gqa),
    ("only_when", "sq != sk", lambda c, t: c.sq != c.sk),
    ("only_when", "a custom scale", lambda c, t: c.scale is not None),
)


def across_cases(failed: Sequence[Case], passed: Sequence[Case], tile: int) -> list[Finding]:
    """What the failing cases share that passing ones lack (e.g. 'only for large-magnitude inputs')."""
    if len(failed) < 2 or not passed:  # one failing case shares everything with itself: no claim
        return []
    found = []
    # Claim "only when X" when the cases without X are numerous enough for their passing to mean something.
    enough = max(3, (len(failed) + len(passed)) // 5)
    for code, words, pred in _PREDICATES:
        if all(pred(c, tile) for c in failed) and sum(not pred(c, tile) for c in passed) >= enough:
            found.append(Finding(code, f"fails only for {words}: {len(failed)} failing cases all have it, "
                                       f"{sum(not pred(c, tile) for c in passed)} passing cases without it"))
    dims_f = {c.head_dim for c in failed}
    dims_all = dims_f | {c.head_dim for c in passed}
    if len(failed) >= 3 and dims_f != dims_all and sum(c.head_dim not in dims_f for c in passed) >= enough:
        found.append(Finding("only_when", f"fails only for head_dim in {sorted(dims_f)} (passes {sorted(dims_all - dims_f)})"))
    return found


# Most specific first: a matched alternative gold names the bug; then when and where it shows.
_PRIORITY = ("wrong_scale", "causal_alignment", "causal_diagonal", "causal_ignored", "tail_key_tile_dropped",
             "mask_ignored", "gqa_head_map", "large_magnitude", "nan_rows", "last_partial_tile", "heads",
             "only_when", "intermediate", "scattered")

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
        import pandas as pd
        return pd.DataFrame(self.rows())

    def rows(self) -> list[dict]:
        """The table as plain dicts (no pandas needed: the GPU host may lack it)."""
        rows = []
        for r in self.results:
            c, rr = r.case, r.rule
            inter = {f"{n}_ratio": ir.ratio for n, ir in r.intermediates}
            rows.append({
                "case": c.name, "shape": f"{c.batch}x{c.heads}x{c.sq}x{c.sk}x{c.head_dim}"
                                         + (f" kv{c.kv_heads}" if c.gqa else ""),
                "dtype": r.dtype, "causal": c.causal, "mask": c.mask, "dist": c.dist, "seed": c.seed,
                "error": rr.error if rr else float("nan"), "ref_error": rr.ref_error if rr else float("nan"),
                "allowed": rr.allowed if rr else float("nan"), "ratio": rr.ratio if rr else float("nan"),
                "nonfinite": rr.nonfinite if rr else 0, "excluded": rr.excluded if rr else 0,
                "status": r.status, "passed": r.passed,
                "pattern": "; ".join(f.code for f in r.findings) or (r.message[:80] if r.message else ""),
                **inter,
            })
        return rows

    def explanation(self) -> list[str]:
        """Findings in words, most specific first (a named bug before where/when), with how often seen."""
        per_case: dict[str, list[Finding]] = {}
        for r in self.failures:
            for f in r.findings:
                per_case.setdefault(f.code, []).append(f)
        n = len(self.failures)
        out = []
        for code in _PRIORITY:
            if code in per_case:
                fs = per_case[code]
                out.append(f"{fs[0].text} [{len(fs)} of {n} failing cases]")
            out += [f.text for f in self.findings if f.code == code]
        return out

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

    def _pick(self, case: int | str | None, need: str = "heatmap") -> CaseResult:
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

    def worst_table(self, case: int | str | None = None):
        import pandas as pd
        return pd.DataFrame(list(self._pick(case, "heatmap").worst))

    def plot_heatmap(self, case: int | str | None = None, ax=None):
        """Per-tile error / allowed: rows are (batch, head), columns query tiles; >1 fails."""
        import matplotlib.pyplot as plt
        from matplotlib.colors import LogNorm
        r = self._pick(case, "heatmap")
        ax = ax or plt.subplots(figsize=(6, 2.5))[1]
        hm = np.clip(np.nan_to_num(r.heatmap, posinf=1e6), 1e-3, 1e6)
        im = ax.imshow(hm, aspect="auto", cmap="magma", norm=LogNorm(vmin=1e-3, vmax=max(1e1, hm.max())),
                       interpolation="nearest")
        ax.set_xlabel(f"query tile ({self.tile} rows)")
        _row_ticks(ax, r.case)
        ax.set_xticks(range(hm.shape[1]))
        ax.set_title(f"{self.candidate}: {r.case.name} [{r.dtype}]", fontsize=8)
        ax.figure.colorbar(im, ax=ax, label="error / allowed")
        return ax

    def plot_p_heatmap(self, case: int | str | None = None, ax=None):
        """Error of the exposed P per (query tile, key tile) on the worst head."""
        import matplotlib.pyplot as plt
        from matplotlib.colors import LogNorm
        r = self._pick(case, "p_heatmap")
        ax = ax or plt.subplots(figsize=(4, 3))[1]
        hm = np.clip(np.nan_to_num(r.p_heatmap, posinf=1e6), 1e-3, 1e6)
        im = ax.imshow(hm, cmap="magma", norm=LogNorm(vmin=1e-3, vmax=max(1e1, hm.max())), interpolation="nearest")
        ax.set_xlabel(f"key tile ({self.tile})")
        ax.set_ylabel(f"query tile ({self.tile})")
        ax.set_title(f"P error: {r.case.name}", fontsize=8)
        ax.figure.colorbar(im, ax=ax, label="error / allowed")
        return ax

    def plot_nan_map(self, case: int | str | None = None, ax=None):
        """Where the output is non-finite (gold finite): rows (batch, head) x query position."""
        import matplotlib.pyplot as plt
        r = self._pick(case, "nan_map")
        ax = ax or plt.subplots(figsize=(6, 2.5))[1]
        ax.imshow(r.nan_map, aspect="auto", cmap="Greys", interpolation="nearest", vmin=0, vmax=1)
        ax.set_xlabel("query row")
        _row_ticks(ax, r.case)
        ax.set_title(f"non-finite rows (black): {self.candidate} {r.case.name} ({int(r.nan_map.sum())} rows)",
                     fontsize=8)
        return ax

    def plot_ratios(self, ax=None):
        """e(candidate) / e(baseline) per case, with the pass line at 2 (plus the atol allowance)."""
        import matplotlib.pyplot as plt
        ax = ax or plt.subplots(figsize=(6, 2.5))[1]
        rs = [r for r in self.supported if r.rule is not None]
        y = [min(r.rule.ratio, 1e6) if math.isfinite(r.rule.ratio) else 1e6 for r in rs]
        y = np.maximum(y, 1e-3)
        for kind, color, marker in (("pass", "tab:green", "o"), ("fail", "tab:red", "o"), ("nonfinite", "tab:red", "x")):
            idx = [i for i, r in enumerate(rs) if (r.passed if kind == "pass" else
                                                   (not r.passed and (r.rule.nonfinite > 0) == (kind == "nonfinite")))]
            if idx:
                ax.scatter(idx, y[idx], c=color, marker=marker, s=14, label=kind)
        ax.axhline(2.0, color="grey", ls="--", lw=1, label="2x baseline")
        ax.set_yscale("log")
        ax.set_xlabel("case")
        ax.set_ylabel("e(cand) / e(baseline)")
        ax.set_title(f"{self.candidate}: worst ratio {self.worst_ratio:.2f}", fontsize=9)
        ax.legend(fontsize=7)
        return ax

    def save(self, out_dir: str | os.PathLike) -> list[Path]:
        """Table as CSV and every kept failing case's tensors as .npy (for offline analysis)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / f"{_safe(self.candidate)}_table.csv"]
        _write_csv(paths[0], self.rows())
        for r in self.results:
            if r.tensors:
                d = out / f"{_safe(self.candidate)}__{r.case.name}__{r.dtype}"
                d.mkdir(exist_ok=True)
                for name, arr in r.tensors.items():
                    np.save(d / f"{name}.npy", arr)
                    paths.append(d / f"{name}.npy")
        return paths


def _safe(name: str) -> str:
    """A candidate name ('pkg.mod:fn') usable as a file name."""
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name)


def _write_csv(path: Path, rows: list[dict]) -> None:
    import csv
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def _row_ticks(ax, case: Case) -> None:
    rows = case.batch * case.heads
    ax.set_ylabel("batch, head")
    if rows <= 16:
        ax.set_yticks(range(rows), [f"b{b} h{h}" for b in range(case.batch) for h in range(case.heads)], fontsize=7)


# ------------------------------------------------------------------------------------------ checking

def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def _as_candidate(candidate, device: str):
    from gpulab.oracle import candidates as cands
    if isinstance(candidate, cands.Candidate):
        return candidate
    if isinstance(candidate, str):
        return cands.resolve([candidate], device)[0]
    if callable(candidate):
        return cands.from_callable(candidate)
    raise OracleError(f"candidate {candidate!r} is not a Candidate, a callable or a name/'module:function' spec")


def _validate_signature(cand) -> None:
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
        raise CandidateError(f"candidate {cand.name!r} has signature {cand.fn.__name__ if hasattr(cand.fn, '__name__') else ''}"
                             f"{sig}, which cannot take (q, k, v, *, attn_mask=None, is_causal=False, scale=None"
                             f"{', enable_gqa=True' if cand.gqa else ''}): {exc}") from None


_FAULTS = ("CUDA error", "illegal memory access", "device-side assert", "HIP error", "misaligned address",
           "unspecified launch failure")


def _call(cand, fn, inputs: dict, case: Case, dtype) -> Any:
    """(output, None), or (None, why) when the candidate refuses the case (RuntimeError: 'No available
    kernel', unsupported head dim...); any other exception, or a GPU fault, raises CandidateError."""
    import warnings
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
                raise CandidateError(f"candidate {cand.name!r} faulted on case {case.name} ({_dtype_name(dtype)}): "
                                     f"{str(exc).splitlines()[0][:300]}") from exc
            why = " | ".join(str(w.message).splitlines()[0][:160] for w in caught[:3])
            return None, (str(exc).splitlines()[0][:200] + (f" [{why}]" if why else ""))
        except Exception as exc:
            raise CandidateError(f"candidate {cand.name!r} raised {type(exc).__name__} on case {case.name} "
                                 f"({_dtype_name(dtype)}): {exc}") from exc


def _expect_tensor(cand, out, expected_shape, device, case: Case, dtype, what="output") -> torch.Tensor:
    where = f"on case {case.name} ({_dtype_name(dtype)})"
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


def _gold_and_baselines(inputs: dict, dtype) -> tuple[dict, dict, dict]:
    args = (inputs["q"], inputs["k"], inputs["v"], inputs["attn_mask"], inputs["is_causal"], inputs["scale"])
    gold = reference(*args, dtype=torch.float64)
    return gold, [reference(*args, dtype=dtype, order=o) for o in ORDERS]


def _analyse(cand, case: Case, dtype, inputs, out, gold, rr: RuleResult, tile: int, worst_k: int,
             inter: dict, budget: list) -> CaseResult:
    err = error_map(out, gold["out"])
    nonfinite = np.isinf(err)
    p_err = p_allowed = p_hm = None
    if "P" in inter:
        p_err = error_map(inter["P"][0], gold["P"])
        p_allowed = inter["P"][1].allowed
        bh = np.unravel_index(int(np.argmax(np.nan_to_num(p_err.max(axis=(2, 3)), posinf=1e300))), p_err.shape[:2])
        p_hm = tile_heatmap_2d(p_err[bh], p_allowed, tile)
    findings = spatial_findings(err, nonfinite, rr.allowed, tile, p_err, p_allowed, case.causal)
    if budget[0] > 0:  # alternative golds cost a few fp64 attentions: name the bug on the first failures only
        budget[0] -= 1
        findings += explain(case, inputs, out, rr.error, rr.allowed)
    outn = out.to(torch.float64).cpu().numpy()
    goldn = gold["out"].cpu().numpy()
    b, h, sq = err.shape[:3]
    tensors = {n: inputs[n].to(torch.float32).cpu().numpy() for n in ("q", "k", "v")}
    if inputs["attn_mask"] is not None:
        m = inputs["attn_mask"]
        tensors["attn_mask"] = m.cpu().numpy() if m.dtype == torch.bool else m.to(torch.float32).cpu().numpy()
    tensors.update(out=out.to(torch.float32).cpu().numpy(), gold=goldn, error=err.astype(np.float32))
    return CaseResult(case, _dtype_name(dtype), "fail", rr, tuple(findings), tuple((n, x[1]) for n, x in inter.items()),
                      worst=tuple(worst_elements(err, outn, goldn, worst_k)),
                      heatmap=tile_heatmap(err, rr.allowed, tile), p_heatmap=p_hm,
                      nan_map=nonfinite.any(axis=-1).reshape(b * h, sq), tensors=tensors)


def _severity(r: CaseResult) -> tuple:
    return (r.rule.nonfinite > 0, r.rule.ratio if math.isfinite(r.rule.ratio) else 1e300)


def _keep_worst_tensors(rs: list[CaseResult], keep: int) -> None:
    """Only the `keep` worst failing cases keep their tensors (.npy products): bounded memory."""
    held = [i for i, r in enumerate(rs) if r.tensors is not None]
    if len(held) > keep:
        drop = min(held, key=lambda i: _severity(rs[i]))
        rs[drop] = replace(rs[drop], tensors=None)


def check_many(candidates: Iterable, cases: str | Sequence[Case] = "default", device: str | None = None,
               dtypes: Any = None, *, tile: int = 64, worst_k: int = 8, explain_budget: int = 12,
               keep_tensors: int = 3, progress: bool = True) -> dict[str, OracleReport]:
    """Judge several candidates; gold and baselines are computed once per case and shared."""
    from gpulab.device import resolve
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
            gold, bases = _gold_and_baselines(inputs, dt)
            for c in cands:
                t0 = time.perf_counter()
                out, why = _call(c, c.fn, inputs, case, dt)
                if why is not None:
                    results[c.name].append(CaseResult(case, _dtype_name(dt), "unsupported", message=why))
                    walls[c.name] += time.perf_counter() - t0
                    continue
                out = _expect_tensor(c, out, gold["out"].shape, device, case, dt)
                rr = rule(out, gold["out"], [b["out"] for b in bases], dt)
                inter = {}
                if c.intermediates is not None:
                    got, why_i = _call(c, c.intermediates, inputs, case, dt)
                    if why_i is None:
                        if not isinstance(got, dict):
                            raise CandidateError(f"candidate {c.name!r}: intermediates returned "
                                                 f"{type(got).__name__} on case {case.name}; expected a dict "
                                                 f"with keys among S, P, lse")
                        for key in ("S", "P", "lse"):
                            if key in got:
                                t = _expect_tensor(c, got[key], gold[key].shape, device, case, dt, what=key)
                                inter[key] = (t, rule(t, gold[key], [b[key] for b in bases], dt))
                ok = rr.passed and all(x[1].passed for x in inter.values())
                if ok:
                    res = CaseResult(case, _dtype_name(dt), "pass", rr,
                                     intermediates=tuple((k_, x[1]) for k_, x in inter.items()))
                else:
                    res = _analyse(c, case, dt, inputs, out, gold, rr, tile, worst_k, inter, budgets[c.name])
                    if rr.passed:
                        bad = [k_ for k_, x in inter.items() if not x[1].passed]
                        res = replace(res, findings=res.findings + (Finding("intermediate", f"output passes but "
                                                                            f"{', '.join(bad)} fails the rule"),))
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
        rs = results[c.name]
        failed = [r.case for r in rs if r.status == "fail"]
        passed = [r.case for r in rs if r.status == "pass"]
        reports[c.name] = OracleReport(c.name, device, tile, tuple(rs), tuple(across_cases(failed, passed, tile)),
                                       wall_s=walls[c.name] + shared / max(1, len(cands)))
    return reports


def check(candidate, cases: str | Sequence[Case] = "default", device: str | None = None, dtypes: Any = None,
          *, tile: int = 64, worst_k: int = 8, progress: bool = True) -> OracleReport:
    """Judge one candidate (a Candidate, an SDPA-like callable, a registry name or 'module:function')."""
    t0 = time.monotonic()
    from gpulab import device as _dev
    dev = _dev.resolve("auto" if device is None else device)
    cand = _as_candidate(candidate, dev)
    rep = check_many([cand], cases, dev, dtypes, tile=tile, worst_k=worst_k, progress=progress)[cand.name]
    return replace(rep, wall_s=time.monotonic() - t0)


# ------------------------------------------------------------------------------------------ isolation

def check_isolated(spec: str, cases: str = "default", device: str | None = None, dtypes: Any = None, *,
                   tile: int = 64, worst_k: int = 8, timeout_s: float = 900.0) -> OracleReport:
    """check() in a child process in its own process group with a deadline: a kernel that hangs or
    faults (and poisons the CUDA context) cannot take the notebook down. `spec` is a registry name or
    'module:function' (something a fresh process can resolve)."""
    return next(iter(_isolated([spec], cases, device, dtypes, tile, worst_k, timeout_s).values()))


def _relay(log_path: Path, seen: int, final: bool = False) -> int:
    """Print the child's new 'oracle:' progress lines to stderr; returns how many lines were read."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return seen
    complete = lines if final else lines[:-1]  # the last line may still be being written
    for line in complete[seen:]:
        if line.startswith("oracle:"):
            print(line, file=sys.stderr, flush=True)
    return max(seen, len(complete))


def _isolated(specs: Sequence[str], cases: str, device, dtypes, tile: int, worst_k: int,
              timeout_s: float) -> dict[str, OracleReport]:
    """check_many() of `specs` in one child; on hang/crash every spec gets a report carrying the error."""
    if not isinstance(cases, str):
        raise OracleError("isolated checks take a case-set name (default, quick); use check() for Case lists")
    specs = list(specs)
    with tempfile.TemporaryDirectory(prefix="gpulab-oracle-") as tmp:
        res = Path(tmp) / "report.pkl"
        args = [sys.executable, "-m", "gpulab.oracle", "--cases", cases, "--pickle", str(res),
                "--tile", str(tile), "--worst-k", str(worst_k)]
        for spec in specs:
            args += ["--candidate", spec]
        if device:
            args += ["--device", device]
        if dtypes not in (None, "auto"):
            args += ["--dtypes", ",".join([dtypes] if isinstance(dtypes, str) else [_dtype_name(d) if
                                                                                   isinstance(d, torch.dtype) else d
                                                                                   for d in dtypes])]
        t0 = time.monotonic()
        log_path = Path(tmp) / "child.log"
        err = ""
        seen = 0
        # output to a file, not a pipe: a chatty child can never block on it
        with proc.Child(args, stdout=log_path, stderr=subprocess.STDOUT, label="oracle") as child:
            while child.wait(timeout=min(2.0, max(0.01, t0 + timeout_s - time.monotonic()))) is None:
                if time.monotonic() - t0 >= timeout_s:
                    err = f"hang: no result within {timeout_s:.0f}s (child process group killed)"
                    break
                seen = _relay(log_path, seen)  # relay the child's progress lines while it runs
        _relay(log_path, seen, final=True)
        log = log_path.read_text(errors="replace")
        if not err and (child.returncode != 0 or not res.exists()):
            tail = " | ".join(log.strip().splitlines()[-3:])[-400:]
            kind = f"crash (signal {-child.returncode})" if child.returncode < 0 else f"error (exit {child.returncode})"
            err = f"{kind}: {tail}"
        if err:
            return {s: OracleReport(s, device or "auto", tile, (), wall_s=time.monotonic() - t0, error=err)
                    for s in specs}
        with open(res, "rb") as fh:
            got = pickle.load(fh)
        return got  # keyed by candidate name (a spec may be an alias or a group)


# ------------------------------------------------------------------------------------------ the gate

GATE_FILE = "oracle_gate.json"


@dataclass(frozen=True)
class Gate:
    """Notebook 05's result: one OracleReport per candidate, and what notebook 06 may benchmark."""
    reports: dict
    device: str
    dtypes: tuple[str, ...]
    cases: str
    kinds: dict
    wall_s: float
    unavailable: dict

    @property
    def verdicts(self):
        import pandas as pd
        rows = []
        for name, r in self.reports.items():
            s = r.summary()
            rows.append({"candidate": name, "kind": self.kinds.get(name, ""), "passed": s["passed"],
                         "cases": s["cases"], "failed": s["failed"], "unsupported": s["unsupported"],
                         "worst ratio": s["worst_ratio"], "wall s": round(r.wall_s, 1), "reason": s["reason"]})
        return pd.DataFrame(rows)

    @property
    def table(self):
        import pandas as pd
        parts = [r.table.assign(candidate=n) for n, r in self.reports.items() if r.results]
        if not parts:
            return pd.DataFrame()
        t = pd.concat(parts, ignore_index=True)
        return t[["candidate"] + [c for c in t.columns if c != "candidate"]]

    @property
    def failing(self) -> list[OracleReport]:
        return [r for r in self.reports.values() if not r.passed]

    def gate_json(self) -> dict:
        return {n: r.summary() for n, r in self.reports.items()}

    def headline(self) -> str:
        n, ok = len(self.reports), sum(r.passed for r in self.reports.values())
        where = f"{self.device}, {'/'.join(self.dtypes)}, {self.cases} cases"
        if ok == n:
            worst = max(self.reports.values(), key=lambda r: r.worst_ratio if math.isfinite(r.worst_ratio) else -1)
            return (f"all {n} attention candidates pass the oracle ({where}); worst error ratio "
                    f"{worst.worst_ratio:.2f} ({worst.candidate})")
        bad = self.failing[0]
        return f"{n - ok} of {n} attention candidates fail the oracle ({where}): {bad.candidate}: " \
               f"{bad.summary()['reason'][:160]}"

    def metrics(self) -> dict:
        return {"candidates_checked": len(self.reports), "passed": sum(r.passed for r in self.reports.values()),
                "failures": [r.candidate for r in self.failing],
                "max_ratio": {n: r.worst_ratio for n, r in self.reports.items()},
                "wall_s": round(self.wall_s, 2), "device": self.device, "dtypes": list(self.dtypes),
                "cases": self.cases, "unavailable": self.unavailable}

    def ratios(self):
        """Long table of every supported case's ratio, for the distribution plot."""
        t = self.table
        return t[t.status != "unsupported"] if len(t) else t

    def plot_ratio_distribution(self, ax=None):
        """Where each candidate sits against the 2x line: the margin a passing kernel has."""
        import matplotlib.pyplot as plt
        t = self.ratios()
        names = list(self.reports)
        ax = ax or plt.subplots(figsize=(7, 0.5 + 0.45 * len(names)))[1]
        data = [np.clip(t[t.candidate == n].ratio.replace([np.inf], 1e6).dropna().to_numpy(), 1e-3, 1e6)
                for n in names]
        ax.boxplot([d if len(d) else [np.nan] for d in data], vert=False, showfliers=True)
        ax.set_yticks(range(1, len(names) + 1), names)
        ax.axvline(2.0, color="tab:red", ls="--", lw=1, label="2x baseline (pass line, before atol)")
        ax.set_xscale("log")
        finite = np.concatenate([d for d in data if len(d)]) if any(len(d) for d in data) else np.array([1.0])
        lo, hi = min(0.1, finite.min() / 1.5), max(10.0, finite.max() * 1.5)
        ax.set_xlim(lo, hi)
        ticks = [t for t in (1e-3, 1e-2, 0.1, 0.5, 1, 2, 5, 10, 1e2, 1e3, 1e4, 1e5, 1e6) if lo <= t <= hi]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.set_xlabel("e(candidate) / e(baseline) per case")
        ax.legend(fontsize=7, loc="lower right")
        ax.set_title(f"oracle error ratios ({self.device}, {'/'.join(self.dtypes)})", fontsize=9)
        return ax


def gate(candidates: Sequence[str] | str = ("vendor", "reference", "fix"), cases: str = "default",
         device: str | None = None, dtypes: Any = None, *, out_dir: str | os.PathLike | None = None, tile: int = 64,
         worst_k: int = 8, timeout_s: float = 900.0, isolate: bool = True) -> Gate:
    """Judge candidates by name/group/spec in a child process (deadline timeout_s per candidate); write
    oracle_gate.json, oracle_table.csv and worst-case tensors under out_dir as results arrive."""
    from gpulab.oracle import candidates as cands
    from gpulab import report as rep_mod
    from gpulab.device import resolve
    dev = resolve("auto" if device is None else device)
    dts = tuple(_dtype_name(d) for d in resolve_dtypes(dtypes, dev))
    if cases not in CASE_SETS:
        raise OracleError(f"oracle_cases={cases!r} is not valid; choose one of {', '.join(CASE_SETS)}")
    wanted = [candidates] if isinstance(candidates, str) else list(candidates)
    missing = cands.unavailable(dev)
    cuda_only = set(cands.ALIASES) | set(cands.ALIASES.values())
    skipped = {n: missing.get(cands.ALIASES.get(n, n), f"not available on {dev}") for n in wanted
               if isinstance(n, str) and n in cuda_only
               and cands.ALIASES.get(n, n) not in cands.available(dev)}  # as notebook 06: skip, don't fail
    resolved = cands.resolve([n for n in wanted if n not in skipped], dev)
    if not resolved:
        raise OracleError(f"candidates={wanted!r}: none is available on {dev} ({skipped})")
    kinds = {c.name: c.kind for c in resolved}
    t0 = time.monotonic()
    if isolate:
        names = [c.name for c in resolved]
        reports = _isolated(names, cases, dev, list(dts), tile, worst_k, timeout_s * len(names))
        if any(r.error for r in reports.values()) and len(names) > 1:  # find the one that hangs/crashes
            print("oracle: the shared child failed; checking each candidate alone", file=sys.stderr)
            reports = {}
            for n in names:
                reports.update(_isolated([n], cases, dev, list(dts), tile, worst_k, timeout_s))
    else:
        reports = check_many(resolved, cases, dev, list(dts), tile=tile, worst_k=worst_k)
    g = Gate(reports, dev, dts, cases, kinds, time.monotonic() - t0, {**missing, **skipped})
    if out_dir is not None:
        rep_mod.write_json(rep_mod.product(out_dir, GATE_FILE), g.gate_json())
        rows = [{"candidate": n, **row} for n, r in g.reports.items() for row in r.rows()]
        if rows:
            _write_csv(rep_mod.product(out_dir, "oracle_table.csv"), rows)
        for r in g.failing:
            r.save(Path(out_dir) / "oracle_tensors")
    return g


def _main(argv: Sequence[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m gpulab.oracle", description="check one attention candidate")
    ap.add_argument("--candidate", required=True, action="append", help="repeat for several")
    ap.add_argument("--cases", default="default", choices=CASE_SETS)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtypes", default=None, help="comma list: float32,bfloat16,float16")
    ap.add_argument("--tile", type=int, default=64)
    ap.add_argument("--worst-k", type=int, default=8)
    ap.add_argument("--pickle", default=None, help="write the OracleReport here (for check_isolated)")
    a = ap.parse_args(argv)
    from gpulab import oracle as mod  # the importable module, not __main__, so the pickle loads in the parent
    reps = mod.check_many(a.candidate, a.cases, a.device, a.dtypes.split(",") if a.dtypes else None, tile=a.tile,
                          worst_k=a.worst_k)
    if a.pickle:
        tmp = a.pickle + ".tmp"
        with open(tmp, "wb") as fh:
            pickle.dump(reps, fh)
        os.replace(tmp, a.pickle)
    for rep in reps.values():
        s = rep.summary()
        print(f"{rep.candidate}: {'PASS' if rep.passed else 'FAIL'} - {s['reason']} ({rep.wall_s:.1f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
