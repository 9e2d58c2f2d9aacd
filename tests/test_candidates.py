"""The candidate registry: names, groups, specs, and that the tiled reference is the algorithm it claims."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gpulab import oracle
from gpulab.oracle import candidates


def test_cpu_registry_has_vendor_and_reference_kinds():
    av = candidates.available("cpu")
    for name in ("sdpa", "sdpa_math", "sdpa_flash", "decomposed", "tiled", "upcast_fp32"):
        assert name in av, f"{name} missing from {list(av)}"
    assert {c.kind for c in av.values()} <= set(candidates.KINDS)
    assert av["sdpa_math"].kind == "vendor" and av["tiled"].kind == "reference" and av["upcast_fp32"].kind == "fix"
    assert "sdpa_cudnn" not in av  # CUDA-only backends are not offered on the CPU
    assert av["tiled"].intermediates is not None


@pytest.mark.parametrize("group,kinds", [("vendor", {"vendor"}), ("reference", {"reference"}),
                                         ("planted", {"planted"}), ("all", {"vendor", "reference", "fix"})])
def test_resolve_groups(group, kinds):
    got = candidates.resolve([group], "cpu")
    assert got and {c.kind for c in got} == kinds


def test_resolve_unknown_name_lists_valid_names():
    with pytest.raises(candidates.CandidateSpecError) as exc:
        candidates.resolve(["sdpa_mathh"], "cpu")
    msg = str(exc.value)
    assert "sdpa_mathh" in msg and "sdpa_math" in msg and "tiled" in msg and "module:function" in msg


def test_resolve_cuda_only_backend_on_cpu_says_why():
    with pytest.raises(candidates.CandidateSpecError, match="sdpa_efficient"):
        candidates.resolve(["sdpa_efficient"], "cpu")


@pytest.mark.parametrize("spec,match", [("gpulab.oracle.candidates:nope", "no attribute"),
                                        ("no_such_module_xyz:f", "cannot import"),
                                        ("gpulab.oracle.candidates:", "must look like")])
def test_bad_specs(spec, match):
    with pytest.raises(candidates.CandidateSpecError, match=match):
        candidates.resolve([spec], "cpu")


def test_module_function_spec_resolves_to_user_candidate():
    (c,) = candidates.resolve(["gpulab.oracle.candidates:decomposed"], "cpu")
    assert c.kind == "user" and c.fn is candidates.decomposed and c.name == "gpulab.oracle.candidates:decomposed"


def test_user_attributes_are_honoured():
    def fn(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
        return candidates.decomposed(q, k, v, attn_mask, is_causal, scale, enable_gqa)
    fn.supports_gqa = True
    fn.intermediates = candidates.tiled_intermediates
    c = candidates.from_callable(fn)
    assert c.gqa and c.intermediates is candidates.tiled_intermediates and c.kind == "user"


def test_bad_kind_is_rejected():
    with pytest.raises(candidates.CandidateSpecError, match="kind='magic'"):
        candidates.Candidate("x", candidates.decomposed, "magic")


@pytest.mark.parametrize("block", [16, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk,h,hk", [(97, 200, 4, 2), (200, 97, 2, 2), (1, 130, 2, 1)])
def test_tiled_matches_sdpa(block, causal, sq, sk, h, hk):
    g = torch.Generator().manual_seed(sq + sk + block)
    q = torch.randn(2, h, sq, 48, generator=g)
    k, v = (torch.randn(2, hk, sk, 48, generator=g) for _ in range(2))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hk != h)
    out = candidates.tiled(q, k, v, is_causal=causal, enable_gqa=hk != h, block=block)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


def test_tiled_intermediates_are_softmax():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 70, 32, generator=g) for _ in range(3))
    got = candidates.tiled_intermediates(q, k, v, is_causal=True, block=32)
    s = q @ k.transpose(-2, -1) / math.sqrt(32)
    s_m = s.masked_fill(~torch.ones(70, 70, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(got["S"], s, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got["P"], torch.softmax(s_m, -1), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got["lse"], torch.logsumexp(s_m, -1), atol=1e-5, rtol=1e-5)


def test_planted_expectations_are_codes_the_oracle_emits():
    codes = set(oracle.PRIORITY)
    for name, p in candidates.planted().items():
        assert p.expected in codes, f"{name}: {p.expected}"
        assert p.candidate.kind == "planted" and p.candidate.name == name
