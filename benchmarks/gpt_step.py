"""A GPT-2-small-like model training step, as real training code runs it: 12 layers, width 768, 12 heads,
1024 tokens, batch 8, bf16 autocast, fused AdamW, F.scaled_dot_product_attention (on the CPU a tiny size).
Times each step to the loss on the host (the loss.item() a training loop logs) and writes the step times and
torch.compile's counters as JSON, for bench_real_step.py to run with and without gpulab.

  python gpt_step.py --json OUT.json [--compile] [--steps N] [--warmup N] [--device auto|cpu|cuda] [--tiny]
"""
from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab: int, ctx: int, d: int, layers: int, heads: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def setup(device: str = "auto", tiny: bool = False):
    """(device, model, AdamW, tokens, targets): GPT-2 small (batch 8 of 1024 tokens) on a GPU, a tiny one on the
    CPU; the benchmarks that time this step share it."""
    dev = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    tiny = tiny or dev == "cpu"
    cfg = dict(vocab=512, ctx=64, d=64, layers=2, heads=4) if tiny else dict(vocab=50304, ctx=1024, d=768, layers=12,
                                                                               heads=12)
    batch = 4 if tiny else 8
    torch.manual_seed(0)
    model = GPT(**cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=dev == "cuda")
    idx = torch.randint(0, cfg["vocab"], (batch, cfg["ctx"]), device=dev)
    tgt = torch.randint(0, cfg["vocab"], (batch, cfg["ctx"]), device=dev)
    return dev, model, opt, idx, tgt


def enqueue(dev: str, fwd, opt, idx, tgt):
    """One training step queued (forward under bf16 autocast, backward, optimizer step, grads dropped): its loss,
    not yet read on the host (the benchmarks that time this step read it)."""
    with torch.autocast(dev, dtype=torch.bfloat16):
        loss = fwd(idx, tgt)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--tiny", action="store_true", help="a small size (the CPU's default)")
    a = ap.parse_args()
    dev, model, opt, idx, tgt = setup(a.device, a.tiny)
    fwd = torch.compile(model) if a.compile else model
    times, host, t_first = [], [], time.perf_counter()
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        loss = enqueue(dev, fwd, opt, idx, tgt)
        t_host = time.perf_counter()   # the step is enqueued: the host's share, before its one sync
        value = loss.item()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
            host.append(t_host - t0)
    out = {"device": dev, "compile": a.compile, "size": "tiny" if idx.shape[1] < 1024 else "gpt2-small", "batch": idx.shape[0],
           "step_s": times, "host_s": host, "loss": value, "finite": math.isfinite(value),
           "total_s": time.perf_counter() - t_first}
    if a.compile:
        from torch._dynamo.utils import counters
        out["dynamo"] = {"frames_ok": counters["frames"]["ok"], "graphs": counters["stats"]["unique_graphs"],
                         "calls": counters["stats"]["calls_captured"]}
    with open(a.json, "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    main()
