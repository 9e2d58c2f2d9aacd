"""Where a failing kernel's error lives and which bug it is: error maps, tile heatmaps, worst elements,
spatial patterns in one case, an alternative gold that the output does match (the bug named), and what the
failing cases share. Pure (tensors and arrays in, findings out), so it is tested on synthetic errors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from gpulab.oracle.cases import Case
from gpulab.oracle.errors import OracleError
from gpulab.oracle.rule import RuleResult, reference

ALT_TILES = (16, 32, 64, 128, 256)  # block sizes tried when naming tile-shaped errors
# Finding codes, most specific first: a matched alternative gold names the bug; then when and where it shows.
PRIORITY = ("wrong_scale", "causal_alignment", "causal_diagonal", "causal_ignored", "tail_key_tile_dropped",
            "mask_ignored", "gqa_head_map", "large_magnitude", "nan_rows", "last_partial_tile", "heads",
            "only_when", "intermediate", "scattered")


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


def explanation(case_findings: Sequence[Sequence[Finding]], findings: Sequence[Finding] = ()) -> list[str]:
    """Findings in words, most specific first (a named bug before where/when), with how many of the failing
    cases (one sequence of findings each) show it; `findings` are the across-case ones."""
    per_case: dict[str, list[Finding]] = {}
    for fs in case_findings:
        for f in fs:
            per_case.setdefault(f.code, []).append(f)
    n = len(case_findings)
    out = []
    for code in PRIORITY:
        if code in per_case:
            fs = per_case[code]
            out.append(f"{fs[0].text} [{len(fs)} of {n} failing cases]")
        out += [f.text for f in findings if f.code == code]
    return out


@dataclass(frozen=True)
class Diagnosis:
    """One failing case, located: the findings, the worst elements and the maps the views draw."""
    findings: tuple[Finding, ...]
    worst: tuple[dict, ...]
    heatmap: np.ndarray = field(repr=False)            # (b*h, query tiles) error / allowed
    nan_map: np.ndarray = field(repr=False)            # (b*h, sq) bool: non-finite output where gold is finite
    error: np.ndarray = field(repr=False)              # |out - gold|, (b, h, sq, d)
    p_heatmap: np.ndarray | None = field(default=None, repr=False)  # (query tile, key tile) on the worst head


def diagnose(case: Case, inputs: dict, out: torch.Tensor, gold: dict, rr: RuleResult, tile: int, worst_k: int,
             p: tuple[torch.Tensor, RuleResult] | None = None, name_bug: bool = True) -> Diagnosis:
    """Locate a failing case's error; `p` is the candidate's exposed P and its rule result. Naming the bug
    costs a few fp64 attentions (alternative golds), so the caller rations it with `name_bug`."""
    err = error_map(out, gold["out"])
    nonfinite = np.isinf(err)
    p_err = p_allowed = p_hm = None
    if p is not None:
        p_err = error_map(p[0], gold["P"])
        p_allowed = p[1].allowed
        bh = np.unravel_index(int(np.argmax(np.nan_to_num(p_err.max(axis=(2, 3)), posinf=1e300))), p_err.shape[:2])
        p_hm = tile_heatmap_2d(p_err[bh], p_allowed, tile)
    findings = spatial_findings(err, nonfinite, rr.allowed, tile, p_err, p_allowed, case.causal)
    if name_bug:
        findings += explain(case, inputs, out, rr.error, rr.allowed)
    b, h, sq = err.shape[:3]
    worst = worst_elements(err, out.to(torch.float64).cpu().numpy(), gold["out"].cpu().numpy(), worst_k)
    return Diagnosis(tuple(findings), tuple(worst), tile_heatmap(err, rr.allowed, tile),
                     nonfinite.any(axis=-1).reshape(b * h, sq), err, p_hm)
