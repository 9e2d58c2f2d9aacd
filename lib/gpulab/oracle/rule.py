"""The rule (FlashAttention's, see gpulab.oracle): fp64 gold, the working-dtype baselines, and the ratio
test between them. Pure: tensors in, numbers out, so it is tested on synthetic tensors.
"""
from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass
from typing import Sequence

import torch

from gpulab.oracle.errors import OracleError

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


_BARS: dict[tuple, tuple[tuple, tuple, float, float]] = {}   # recent cases' (ref_error, atol), by their tensors
_BARS_LOCK = threading.Lock()


def _emax(x: torch.Tensor, gold: torch.Tensor, fin: torch.Tensor | None) -> tuple[float, int]:
    """max|x - gold| where both are finite, and how many entries of x are not finite where gold is."""
    if x.numel() == 0:
        return 0.0, 0
    xd = x.to(torch.float64)
    d = (xd - gold).abs()
    if fin is None and bool(torch.isfinite(xd.sum())):
        return float(d.max()), 0
    xfin = torch.isfinite(xd)
    ok = xfin if fin is None else fin & xfin
    bad = ~xfin if fin is None else fin & ~xfin
    return float(torch.where(ok, d, torch.zeros((), dtype=torch.float64, device=d.device)).max()), int(bad.sum())


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:   # an inference-mode tensor keeps no version counter: never cached
        return None


def _bar(gold: torch.Tensor, fin: torch.Tensor | None, baselines: Sequence[torch.Tensor], dtype: torch.dtype
         ) -> tuple[float, float]:
    """(ref_error, atol): what every candidate on the case is held to, computed once for all of them (the 4
    baselines' errors were most of the rule's time when each candidate recomputed them). Keyed by the tensors'
    identity through weak references (no tensor is kept alive, and a reused id never matches) and version
    counters (a tensor changed in place since is measured again)."""
    key = (gold, *baselines)
    ids = (*(id(t) for t in key), dtype)
    versions = tuple(_version(t) for t in key)
    with _BARS_LOCK:
        hit = _BARS.get(ids)
    if hit is not None and None not in versions and all(r() is t for r, t in zip(hit[0], key)) \
            and hit[1] == versions:
        return hit[2], hit[3]
    ref_error = max((_emax(b, gold, fin)[0] for b in baselines), default=0.0)
    g = (gold if fin is None else torch.where(fin, gold, torch.zeros((), dtype=torch.float64, device=gold.device)))
    g = g.to(dtype)
    atol = 2.0 * float((((g + 0.3) - 0.3) - g).abs().max()) if g.numel() else 0.0
    if None not in versions:
        with _BARS_LOCK:
            while len(_BARS) >= 8:   # up to 4 per case (out, S, P, lse)
                _BARS.pop(next(iter(_BARS)))
            _BARS[ids] = (tuple(weakref.ref(t) for t in key), versions, ref_error, atol)
    return ref_error, atol


def rule(out: torch.Tensor, gold: torch.Tensor, baselines: Sequence[torch.Tensor], dtype: torch.dtype) -> RuleResult:
    """FlashAttention's forward rule plus the non-finite rule; pure (tensors in, numbers out)."""
    g64 = gold.to(torch.float64)
    fin = None if bool(torch.isfinite(g64.sum())) else torch.isfinite(g64)   # masks only when needed
    ref_error, atol = _bar(g64, fin, baselines, dtype)
    error, nonfinite = _emax(out, g64, fin)
    allowed = 2.0 * ref_error + atol
    ratio = error / ref_error if ref_error > 0 else (0.0 if error == 0 else float("inf"))
    return RuleResult(error, ref_error, atol, allowed, ratio, nonfinite, 0 if fin is None else int((~fin).sum()),
                      nonfinite == 0 and error <= allowed)


def gold_and_baselines(inputs: dict, dtype: torch.dtype) -> tuple[dict, list[dict]]:
    """fp64 gold and one working-dtype baseline per scale ordering: a kernel is never failed for picking
    another correct order (they differ by up to ~6x with fp32 inputs and large logits)."""
    args = (inputs["q"], inputs["k"], inputs["v"], inputs["attn_mask"], inputs["is_causal"], inputs["scale"])
    gold = reference(*args, dtype=torch.float64)
    return gold, [reference(*args, dtype=dtype, order=o) for o in ORDERS]
