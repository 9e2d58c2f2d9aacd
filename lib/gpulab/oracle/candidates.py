"""Attention implementations the oracle can judge, by name.

Kinds: `vendor` (PyTorch SDPA backends usable on the device: on CUDA math, flash, efficient, cudnn; on the
CPU math and the fused CPU flash kernel), `reference` (a plain decomposition and a tiled online-softmax
kernel written in torch ops: the algorithm custom kernels implement), `fix` (variants a fix scenario
applies), `user` (`module:function`), and `planted` (the tiled kernel with one realistic bug each; the
tests and benchmarks/bench_oracle.py share them to prove the oracle catches and names each bug).

Every candidate has SDPA's signature `fn(q, k, v, *, attn_mask=None, is_causal=False, scale=None)`.
A user function may carry `supports_gqa = True` (it then gets k/v with fewer heads and `enable_gqa=True`
in GQA cases) and an `intermediates` attribute (S, P, lse; see gpulab.oracle's docstring).
"""
from __future__ import annotations

import functools
import importlib
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from gpulab.device import resolve as resolve_device
from gpulab.workloads import BACKENDS, SDPA_CANDIDATES, sdpa_backend_enum

KINDS = ("vendor", "reference", "fix", "user", "planted")
GROUPS = ("all", "vendor", "reference", "fix", "planted")
ALIASES = SDPA_CANDIDATES                     # gpulab backend name -> registry name ("math" -> "sdpa_math")
CPU_BACKENDS = ("math", "flash")             # the SDPA backends PyTorch has on the CPU


class CandidateSpecError(ValueError):
    """An unknown candidate name or a bad 'module:function' spec; lists the valid names."""


@dataclass(frozen=True)
class Candidate:
    name: str
    fn: Callable
    kind: str                                 # vendor | reference | fix | user | planted
    notes: str = ""
    gqa: bool = False                         # accepts enable_gqa=True with fewer kv heads
    intermediates: Callable | None = None     # optional S / P / lse exposure

    def __post_init__(self):
        if self.kind not in KINDS:
            raise CandidateSpecError(f"Candidate {self.name!r}: kind={self.kind!r} is not valid; "
                                     f"choose one of {', '.join(KINDS)}")


@dataclass(frozen=True)
class Planted:
    """A candidate with one known bug and the pattern code the oracle must name for it."""
    candidate: Candidate
    expected: str
    description: str


# ------------------------------------------------------------------------------------------ vendor

_BACKENDS = {v: k for k, v in ALIASES.items()}  # registry name -> gpulab backend name


def sdpa_backend(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, *, backend: str = ""):
    """SDPA forced onto one backend (raises 'No available kernel' when that backend refuses the inputs)."""
    kw = {"enable_gqa": True} if enable_gqa else {}
    if not backend:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, **kw)
    with sdpa_kernel([sdpa_backend_enum(backend)]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, **kw)


def _probe(fn: Callable, device: str, gqa: bool) -> str | None:
    """None when fn runs on a tiny input on `device`, else why not."""
    dt = torch.float32 if device.startswith("cpu") else torch.float16
    q = torch.randn(1, 2, 8, 64, device=device, dtype=dt)
    k = torch.randn(1, 1 if gqa else 2, 8, 64, device=device, dtype=dt)
    try:
        fn(q, k, k, **({"enable_gqa": True} if gqa else {}))
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means "not available here"
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"


@functools.lru_cache(maxsize=8)
def _vendor(device: str) -> tuple[dict[str, Candidate], dict[str, str]]:
    names = ["sdpa"] + [ALIASES[b] for b in BACKENDS if b in CPU_BACKENDS or not device.startswith("cpu")]
    found, missing = {}, {}
    for name in names:
        fn = functools.partial(sdpa_backend, backend=_BACKENDS.get(name, ""))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            why = _probe(fn, device, gqa=False)
            gqa = why is None and _probe(fn, device, gqa=True) is None
        if why:
            missing[name] = why
            continue
        note = {"sdpa": "F.scaled_dot_product_attention with PyTorch's own backend choice",
                "sdpa_math": "SDPBackend.MATH (PyTorch's reference composite)",
                "sdpa_flash": ("SDPBackend.FLASH_ATTENTION: the fused CPU flash kernel" if device.startswith("cpu")
                               else "SDPBackend.FLASH_ATTENTION (FlashAttention-2 in PyTorch)"),
                "sdpa_efficient": "SDPBackend.EFFICIENT_ATTENTION (xFormers memory-efficient)",
                "sdpa_cudnn": "SDPBackend.CUDNN_ATTENTION (cuDNN fused attention)"}[name]
        found[name] = Candidate(name, fn, "vendor", note, gqa=gqa)
    return found, missing


# ------------------------------------------------------------------------------------------ reference

def decomposed(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """softmax(q k^T * scale + mask) v in the working dtype: what people write by hand."""
    h, hk = q.shape[-3], k.shape[-3]
    if enable_gqa and hk != h:
        k, v = k.repeat_interleave(h // hk, dim=-3), v.repeat_interleave(h // hk, dim=-3)
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * sc
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
    return torch.softmax(s, dim=-1) @ v


def upcast_fp32(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """The common fix for low-precision trouble: run SDPA math in fp32 and cast back."""
    m = attn_mask.float() if attn_mask is not None and attn_mask.dtype != torch.bool else attn_mask
    out = sdpa_backend(q.float(), k.float(), v.float(), m, is_causal, scale, enable_gqa, backend="math")
    return out.to(q.dtype)


@dataclass(frozen=True)
class Bugs:
    """Switches for the tiled kernel; all off is the correct algorithm."""
    scale: str = "ok"               # ok | inv_d (1/d instead of 1/sqrt(d)) | ignore_kwarg (always 1/sqrt(d))
    causal_offset: int = 0          # +1: query i also sees key i+1
    bottom_right: bool = False      # FlashAttention's causal alignment instead of PyTorch's top-left
    subtract_max: bool = True       # False: exp() of raw scores (overflows for large logits)
    drop_tail: bool = False         # skip the last partial key tile
    zero_partial_q: bool = False    # never write the rows of the last partial query tile
    gqa_mod: bool = False           # kv head = h % kv_heads instead of h // group
    ignore_mask: bool = False       # attn_mask not applied


NO_BUGS = Bugs()


def _tiled_core(q, k, v, attn_mask, is_causal, scale, enable_gqa, block: int, bugs: Bugs, keep_s: bool = False):
    h, hk = q.shape[-3], k.shape[-3]
    if hk != h:
        if not enable_gqa:
            raise ValueError(f"k has {hk} heads, q has {h}: pass enable_gqa=True")
        idx = torch.arange(h, device=q.device)
        idx = idx % hk if bugs.gqa_mod else idx // (h // hk)
        k, v = k[..., idx, :, :], v[..., idx, :, :]
    d = q.shape[-1]
    sc = 1.0 / math.sqrt(d) if scale is None else scale
    if bugs.scale == "inv_d":
        sc = 1.0 / d if scale is None else scale
    elif bugs.scale == "ignore_kwarg":
        sc = 1.0 / math.sqrt(d)
    sq, sk = q.shape[-2], k.shape[-2]
    qf, kf, vf = q.float(), k.float(), v.float()
    m = torch.full(q.shape[:-1], float("-inf"), device=q.device)
    l = torch.zeros(q.shape[:-1], device=q.device)
    acc = torch.zeros(*q.shape[:-1], v.shape[-1], device=q.device)
    i = torch.arange(sq, device=q.device)[:, None]
    offset = bugs.causal_offset + (sk - sq if bugs.bottom_right else 0)
    end = (sk // block) * block if (bugs.drop_tail and sk % block and sk > block) else sk
    tiles_raw, tiles = [], []
    for j0 in range(0, end, block):
        j1 = min(j0 + block, end)
        s = (qf @ kf[..., j0:j1, :].transpose(-2, -1)) * sc
        if keep_s:
            tiles_raw.append(s)
        if is_causal:
            j = torch.arange(j0, j1, device=q.device)[None, :]
            s = s.masked_fill(j > i + offset, float("-inf"))
        if attn_mask is not None and not bugs.ignore_mask:
            mk = attn_mask[..., j0:j1]
            s = s.masked_fill(~mk, float("-inf")) if mk.dtype == torch.bool else s + mk.float()
        if keep_s:
            tiles.append(s)
        m_new = torch.maximum(m, s.amax(dim=-1))
        m_use = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new)) if bugs.subtract_max \
            else torch.zeros_like(m_new)
        p = torch.exp(s - m_use[..., None])
        alpha = torch.exp((m if bugs.subtract_max else torch.zeros_like(m)) - m_use)
        if bugs.subtract_max:
            alpha = torch.where(torch.isfinite(m), alpha, torch.zeros_like(alpha))
        l = l * alpha + p.sum(dim=-1)
        acc = acc * alpha[..., None] + p.to(v.dtype).float() @ vf[..., j0:j1, :]  # P rounded like flash does
        m = m_new if bugs.subtract_max else m
    if keep_s:
        return acc, l, m, tiles_raw, tiles, end
    return acc, l, m, sc, offset, end


def tiled(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, *, block: int = 64,
          bugs: Bugs = NO_BUGS):
    """Online softmax over key tiles of `block` (FlashAttention's algorithm) with fp32 accumulators."""
    acc, l, _, _, _, _ = _tiled_core(q, k, v, attn_mask, is_causal, scale, enable_gqa, block, bugs)
    out = (acc / l[..., None]).to(q.dtype)
    sq = q.shape[-2]
    if bugs.zero_partial_q and sq % block:
        out[..., (sq // block) * block:, :] = 0
    return out


def tiled_intermediates(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, *,
                        block: int = 64, bugs: Bugs = NO_BUGS) -> dict[str, torch.Tensor]:
    """S, P and lse as the tiled kernel forms them: the same S tiles, P = exp(S - running max) / l."""
    _, l, m, tiles_raw, tiles, end = _tiled_core(q, k, v, attn_mask, is_causal, scale, enable_gqa, block, bugs,
                                                 keep_s=True)
    sk = k.shape[-2]
    pad = sk - end  # keys a buggy kernel never visited: S unknown (-inf), P 0
    if pad:
        fill = torch.full((*q.shape[:-1], pad), float("-inf"), device=q.device)
        tiles_raw, tiles = tiles_raw + [fill], tiles + [fill]
    s_raw, s = torch.cat(tiles_raw, dim=-1), torch.cat(tiles, dim=-1)
    m_use = m if bugs.subtract_max else torch.zeros_like(m)
    m_use = torch.where(torch.isfinite(m_use), m_use, torch.zeros_like(m_use))
    lse = m_use + torch.log(l)
    p = torch.exp(s - m_use[..., None]) / l[..., None]
    return {"S": s_raw.to(q.dtype), "P": p.to(q.dtype), "lse": lse.to(q.dtype)}


def _tiled_candidate(name: str, kind: str, notes: str, bugs: Bugs = NO_BUGS, block: int = 64) -> Candidate:
    return Candidate(name, functools.partial(tiled, block=block, bugs=bugs), kind, notes, gqa=True,
                     intermediates=functools.partial(tiled_intermediates, block=block, bugs=bugs))


def references() -> dict[str, Candidate]:
    return {
        "decomposed": Candidate("decomposed", decomposed, "reference",
                                "softmax(QK^T*scale + mask) V in the working dtype", gqa=True),
        "tiled": _tiled_candidate("tiled", "reference", "online softmax over 64-key tiles, fp32 accumulators, "
                                                        "P rounded to the working dtype (FlashAttention's algorithm); "
                                                        "exposes S, P, lse"),
    }


def fixes() -> dict[str, Candidate]:
    return {"upcast_fp32": Candidate("upcast_fp32", upcast_fp32, "fix",
                                     "SDPA math on fp32-upcast inputs, cast back (the usual low-precision fix)",
                                     gqa=True)}


def planted() -> dict[str, Planted]:
    """Realistic kernel bugs in the tiled kernel, with the pattern the oracle must name for each."""
    spec = [
        ("bug_scale_inv_d", Bugs(scale="inv_d"), "wrong_scale", "softmax scale 1/d instead of 1/sqrt(d)"),
        ("bug_scale_ignored", Bugs(scale="ignore_kwarg"), "wrong_scale", "the scale= argument ignored"),
        ("bug_causal_off_by_one", Bugs(causal_offset=1), "causal_diagonal", "causal mask lets query i see key i+1"),
        ("bug_causal_bottom_right", Bugs(bottom_right=True), "causal_alignment",
         "bottom-right causal alignment (FlashAttention's) where PyTorch's is top-left"),
        ("bug_no_max_subtraction", Bugs(subtract_max=False), "nan_rows",
         "softmax without max-subtraction: exp() overflows (fp32: logits > 88, only large inputs; "
         "fp16 P: logits > 11) -> NaN rows"),
        ("bug_dropped_tail_tile", Bugs(drop_tail=True), "tail_key_tile_dropped", "last partial key tile skipped"),
        ("bug_partial_q_tile", Bugs(zero_partial_q=True), "last_partial_tile",
         "rows of the last partial query tile never written"),
        ("bug_gqa_head_map", Bugs(gqa_mod=True), "heads", "GQA maps head h to kv head h % kv_heads"),
        ("bug_mask_ignored", Bugs(ignore_mask=True), "mask_ignored", "attn_mask not applied"),
    ]
    return {name: Planted(_tiled_candidate(name, "planted", why, bugs), expected, why)
            for name, bugs, expected, why in spec}


# ------------------------------------------------------------------------------------------ registry

def _device(device: str | None) -> str:
    return resolve_device("auto" if device is None else device)


def available(device: str | None = None) -> dict[str, Candidate]:
    """Every candidate usable on `device` except the planted bugs (ask planted() for those)."""
    dev = _device(device)
    vend, _ = _vendor(dev)
    return {**vend, **references(), **fixes()}


def sdpa_backends(device: str | None = None) -> dict[str, Candidate]:
    """The SDPA backends usable on `device` by backend name: auto (PyTorch's own choice), math, flash, ..."""
    vend, _ = _vendor(_device(device))
    return {_BACKENDS.get(n, "auto"): c for n, c in vend.items()}


def unavailable(device: str | None = None) -> dict[str, str]:
    """Vendor backends that did not run on `device`, with the reason."""
    return dict(_vendor(_device(device))[1])


def from_callable(fn: Callable, name: str | None = None, kind: str = "user") -> Candidate:
    """Wrap a user function; `supports_gqa` and `intermediates` attributes are honoured."""
    if isinstance(fn, Candidate):
        return fn
    if not callable(fn):
        raise CandidateSpecError(f"candidate {name or fn!r} is not callable (got {type(fn).__name__})")
    nm = name or getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", "candidate")
    return Candidate(nm, fn, kind, getattr(fn, "__doc__", "") or "", gqa=bool(getattr(fn, "supports_gqa", False)),
                     intermediates=getattr(fn, "intermediates", None))


def _from_spec(spec: str) -> Candidate:
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise CandidateSpecError(f"candidate spec {spec!r} must look like 'package.module:function'")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise CandidateSpecError(f"candidate spec {spec!r}: cannot import module {mod_name!r} ({exc})") from exc
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CandidateSpecError(f"candidate spec {spec!r}: module {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, Candidate):
        return obj
    return from_callable(obj, name=spec)


def resolve(names_or_specs: Iterable[Any] | str, device: str | None = None) -> list[Candidate]:
    """Names, groups (all, vendor, reference, fix, planted), 'module:function' specs, callables -> Candidates."""
    if isinstance(names_or_specs, str) or callable(names_or_specs):
        names_or_specs = [names_or_specs]
    avail = available(device)
    plant = {n: p.candidate for n, p in planted().items()}
    out: dict[str, Candidate] = {}
    for item in names_or_specs:
        if isinstance(item, Candidate):
            out[item.name] = item
        elif callable(item):
            c = from_callable(item)
            out[c.name] = c
        elif isinstance(item, str) and item in GROUPS:
            pool = plant if item == "planted" else avail
            out.update({n: c for n, c in pool.items() if item in ("all", c.kind)})
        elif isinstance(item, str) and ALIASES.get(item) in avail:
            out[ALIASES[item]] = avail[ALIASES[item]]
        elif isinstance(item, str) and item in avail:
            out[item] = avail[item]
        elif isinstance(item, str) and item in plant:
            out[item] = plant[item]
        elif isinstance(item, str) and ":" in item:
            c = _from_spec(item)
            out[c.name] = c
        else:
            miss = unavailable(device)
            extra = f" ({item} is not available on this device: {miss[item]})" if item in miss else ""
            raise CandidateSpecError(f"unknown candidate {item!r}{extra}; valid names: "
                                     f"{', '.join(list(avail) + list(plant))}; groups: {', '.join(GROUPS)}; "
                                     f"or 'module:function'")
    return list(out.values())
