"""The inputs the oracle judges a kernel on: Case (one seeded configuration), the named case sets, and
the deterministic q, k, v and mask each case stands for.

The sets are chosen so tile, mask, causal, scale, GQA and overflow bugs cannot hide (see _default_cases).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from gpulab.oracle.errors import OracleError
from gpulab.oracle.sets import CASE_SETS
from gpulab.workloads import torch_dtype

MASKS = ("none", "bool", "additive")
DISTS = ("randn", "rand", "large")
LARGE_FACTOR = 6.0  # q, k ~ 6*N(0,1): logits with std ~36 overflow exp() in fp32 without max-subtraction


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
    """None/'auto' -> float32 on the CPU, bfloat16 AND float16 on CUDA: unlike workloads.resolve_dtype (the
    one dtype a workload runs in), the oracle judges a kernel in every low-precision type it may meet."""
    if dtypes is None or dtypes == "auto":
        names: Sequence[Any] = (("float32",) if device.startswith("cpu") else ("bfloat16", "float16"))
    else:
        names = [dtypes] if isinstance(dtypes, (str, torch.dtype)) else list(dtypes)
    try:
        return tuple(dict.fromkeys(torch_dtype(d) for d in names))
    except ValueError as exc:
        raise OracleError(f"{exc} (or 'auto')") from None


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
