"""The built-in workload's model (a small diffusion-transformer with joint text+image attention and LoRA)
and the running of any workload's rung in this process (`prepare`, `run`, `save_outputs`).

Why apart from gpulab.workloads: that module (the vocabulary and the child's command line) is imported by
the watchdog, the chain runner and most subpackages, which must not pay torch's import; this one is what a
workload child (`python -m gpulab.workloads`) and the in-process timers (the recorder's cost and the rung, both timed in 06) run.
torch is still imported only inside the functions.
"""
from __future__ import annotations

import importlib
import math
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpulab import device as _device
from gpulab.workloads import (WorkloadConfig, WorkloadResult, _split_callable, backend_name, key_padding_mask,
                              sdpa_backend_enum)


def _build(cfg: WorkloadConfig, device: str, dtype):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    dim = cfg.heads * cfg.head_dim

    class LoRALinear(nn.Module):
        """Frozen base weight plus a trainable low-rank update (B starts at zero, as in LoRA)."""

        def __init__(self, d_in: int, d_out: int, rank: int):
            super().__init__()
            self.base = nn.Linear(d_in, d_out)
            self.rank = rank
            if rank:
                self.lora_a = nn.Parameter(torch.randn(rank, d_in) / math.sqrt(d_in))
                self.lora_b = nn.Parameter(torch.zeros(d_out, rank))

        def forward(self, x):
            y = self.base(x)
            if self.rank:
                y = y + F.linear(F.linear(x, self.lora_a), self.lora_b)
            return y

    def rope(x, cos, sin):
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.mod = nn.Linear(dim, 6 * dim)   # adaLN: shift/scale/gate for attention and MLP
            self.norm1 = nn.LayerNorm(dim, elementwise_affine=False)
            self.norm2 = nn.LayerNorm(dim, elementwise_affine=False)
            self.q, self.k, self.v, self.o = (LoRALinear(dim, dim, cfg.lora_rank) for _ in range(4))
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))

        def forward(self, x, c, cos, sin, mask):
            s1, sc1, g1, s2, sc2, g2 = self.mod(F.silu(c)).unsqueeze(1).chunk(6, dim=-1)
            h = self.norm1(x) * (1 + sc1) + s1
            b, n, _ = h.shape
            q, k, v = (p(h).view(b, n, cfg.heads, cfg.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + g1 * self.o(a.transpose(1, 2).reshape(b, n, dim))
            return x + g2 * self.mlp(self.norm2(x) * (1 + sc2) + s2)

    class DiT(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = nn.Linear(16, dim)
            self.text = nn.Linear(dim, dim)
            self.t_mlp = nn.Sequential(nn.Linear(64, dim), nn.SiLU(), nn.Linear(dim, dim))
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.layers))
            self.head = nn.Linear(dim, 16)

        def forward(self, latents, text, t, cos, sin, mask):
            freqs = torch.exp(-math.log(10000) * torch.arange(32, device=t.device, dtype=torch.float32) / 32)
            temb = torch.cat([torch.sin(t[:, None] * freqs), torch.cos(t[:, None] * freqs)], -1).to(latents.dtype)
            c = self.t_mlp(temb)
            x = torch.cat([self.text(text), self.patch(latents)], dim=1)
            for blk in self.blocks:
                x = blk(x, c, cos, sin, mask)
            return self.head(x[:, cfg.text_tokens:])

    torch.manual_seed(cfg.seed)
    model = DiT().to(device=device, dtype=dtype)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    return model


def _inputs(cfg: WorkloadConfig, device: str, dtype):
    import torch

    g = torch.Generator(device="cpu").manual_seed(cfg.seed + 1)
    n = cfg.text_tokens + cfg.image_tokens
    dim = cfg.heads * cfg.head_dim
    latents = torch.randn(cfg.batch, cfg.image_tokens, 16, generator=g).to(device, dtype)
    noise = torch.randn(cfg.batch, cfg.image_tokens, 16, generator=g).to(device, dtype)
    text = torch.randn(cfg.batch, cfg.text_tokens, dim, generator=g).to(device, dtype)
    t = torch.rand(cfg.batch, generator=g).to(device)
    # rotary tables over the joint sequence (text first, then image)
    half = cfg.head_dim // 2
    inv = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
    ang = torch.arange(n, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = ang.cos().to(device, dtype), ang.sin().to(device, dtype)
    mask = key_padding_mask(cfg.batch, n, cfg.padded_text_tokens, device, pad_end=cfg.text_tokens)
    return latents, noise, text, t, cos, sin, mask


def _memory(device: str) -> dict:
    import torch

    if device.startswith("cuda"):
        return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
                "peak": torch.cuda.max_memory_allocated()}
    import psutil

    return {"rss": psutil.Process().memory_info().rss}


def _backend_ctx(cfg: WorkloadConfig):
    import contextlib

    if cfg.sdpa_backend == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel(sdpa_backend_enum(cfg.sdpa_backend))


def _backend_used(cfg: WorkloadConfig, q, mask) -> str:
    import torch

    with _backend_ctx(cfg):
        try:
            return backend_name(torch._fused_sdp_choice(q, q, q, mask, 0.0, False))
        except RuntimeError:
            return "none"


@dataclass(frozen=True)
class Prepared:
    """A built model and inputs, so one rung can be re-run (overhead timing) without rebuilding."""
    cfg: WorkloadConfig
    device: str
    dtype: str
    fn: Callable[[], list]
    backend_used: str
    trainable: int
    total: int
    state: dict = field(default_factory=dict, repr=False)


def prepare(cfg: WorkloadConfig) -> Prepared:
    """Build the built-in model; `fn()` runs the configured rung once and returns per-step loss/memory."""
    import torch

    if cfg.kind != "builtin":
        raise ValueError(f"prepare() needs workload='builtin', got {cfg.workload!r}; use run() or command()")
    dev = _device.resolve(cfg.device)
    dtype_name = cfg.resolved_dtype(dev)
    dtype = getattr(torch, dtype_name)
    latents, noise, text, t, cos, sin, mask = _inputs(cfg, dev, dtype)
    n = cfg.text_tokens + cfg.image_tokens
    q = torch.randn(cfg.batch, cfg.heads, n, cfg.head_dim, generator=torch.Generator().manual_seed(cfg.seed + 2))
    q = q.to(dev, dtype)
    used = _backend_used(cfg, q, mask)
    state: dict = {}   # state["output"]: the last output, for a numerics comparison (fix vs no fix)
    if cfg.rung == "sdpa":
        import torch.nn.functional as F

        def fn():
            with _backend_ctx(cfg):
                out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
            state["output"] = out.detach()
            return [(float(out.float().square().mean()), _memory(dev))]
        return Prepared(cfg, dev, dtype_name, fn, used, 0, 0, state)

    model = _build(cfg, dev, dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    # only the training rungs step: building AdamW imports torch._dynamo (about 2 s, a forward-only child's
    # largest start-up cost after torch itself)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01) if cfg.rung != "forward" else None
    trainable = sum(p.numel() for p in params)
    total = sum(p.numel() for p in model.parameters())

    def loss_fn():
        pred = model(latents + noise, text, t, cos, sin, mask)
        state["output"] = pred.detach()
        return torch.nn.functional.mse_loss(pred.float(), noise.float())

    def fn():
        out = []
        with _backend_ctx(cfg):
            if cfg.rung == "forward":
                out.append((float(loss_fn().detach()), _memory(dev)))
            else:
                for _ in range(cfg.steps if cfg.rung == "steps" else 1):
                    opt.zero_grad(set_to_none=True)
                    loss = loss_fn()
                    loss.backward()
                    opt.step()
                    out.append((float(loss.detach()), _memory(dev)))
        return out
    state.update(model=model, optimizer=opt)
    return Prepared(cfg, dev, dtype_name, fn, used, trainable, total, state)


def save_outputs(value: Any, path: str) -> None:
    """What a run computed (tensors moved to the CPU, numbers, lists and dicts of them), for a numerics
    comparison of a fixed run against the fix-free one; anything else is left out."""
    import torch

    def keep(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.detach().cpu()
        if isinstance(v, (int, float, bool)):
            return v
        if isinstance(v, (list, tuple)):
            return [keep(x) for x in v]
        if isinstance(v, dict):
            return {str(k): keep(x) for k, x in v.items()}
        return None
    torch.save(keep(value), path)


def run(cfg: WorkloadConfig, time_for: float = 0.0, outputs: str | None = None) -> WorkloadResult:
    """Run in this process. User workloads: `module:callable` is called with no arguments (its return
    value is ignored unless it is a WorkloadResult); `script:` runs the script as __main__ with its args.
    `outputs`: save the output (built-in: the last output and the losses; module: its return value);
    `time_for`: the built-in rung is then repeated for that many seconds (at least 3 times), each repeat
    timed (times_s): a sub-millisecond rung needs many repeats for a stable median, a long one few."""
    t0 = time.perf_counter()
    if cfg.kind == "builtin":
        prep = prepare(cfg)
        sync = _synchronizer(prep.device)
        steps = prep.fn()
        sync()
        losses = tuple(s[0] for s in steps)
        if outputs:
            save_outputs({"output": prep.state.get("output"), "losses": list(losses)}, outputs)
        seconds = time.perf_counter() - t0
        times: list[float] = []
        while time_for > 0 and (len(times) < 3 or sum(times) < time_for):
            t1 = time.perf_counter()
            prep.fn()
            sync()
            times.append(time.perf_counter() - t1)
        return WorkloadResult(cfg.rung, prep.device, prep.dtype, cfg.sdpa_backend, prep.backend_used,
                              losses, tuple(s[1] for s in steps), seconds, prep.trainable, prep.total, tuple(times))
    if cfg.kind == "module":
        mod, fn = _split_callable(cfg.workload.removeprefix("module:"))
        res = getattr(importlib.import_module(mod), fn)()
        if outputs:
            save_outputs(res, outputs)
        if isinstance(res, WorkloadResult):
            return res
    else:
        import runpy

        argv = shlex.split(cfg.workload[len("script:"):])
        saved = sys.argv
        sys.argv = argv
        try:
            runpy.run_path(argv[0], run_name="__main__")
        finally:
            sys.argv = saved
    return WorkloadResult(cfg.rung, str(cfg.device), cfg.dtype, cfg.sdpa_backend, "unknown", (), (),
                          time.perf_counter() - t0)


def _synchronizer(device: str) -> Callable[[], None]:
    """Waits for the GPU (a timing must include the kernels it queued); on the CPU there is nothing to wait for."""
    if not device.startswith("cuda"):
        return lambda: None
    import torch

    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.synchronize
