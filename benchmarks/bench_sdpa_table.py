"""Each SDPA backend's latency, TFLOP/s and % of peak (README figure: the H100 SDPA table).

Calls: the built-in workload's own attention call at its default sizes (B=2, H=4, S=16+64=80, D=32,
non-causal, with its boolean key-padding mask: a backend that refuses the mask gets a "not supported" row
with torch's reason) and the ANCHORS reference shape (bf16, B=4, H=16, S=4096, D=128, non-causal, no mask).
On the CPU the reference shape is replaced by a small one (fp32, B=1, H=4, S=512, D=64): the math backend
would need 4 GB of scores.
Peak: the datasheet table in gpulab.flops for a known GPU, else a measured large matmul (the roof says which).

    python benchmarks/bench_sdpa_table.py --out DIR [--device auto|cpu|cuda] [--max-time-s 2]

Writes DIR/sdpa_table.json and DIR/sdpa_table.csv after every row, prints the table last.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from gpulab import report
from gpulab.bench import flops, measure
from gpulab.bench.worker import refusal
from gpulab.oracle import candidates
from gpulab.workloads import AttentionCall, WorkloadConfig

# ANCHORS.md, measured on an H100 80GB HBM3 with torch 2.11, bf16, B=4,H=16,S=4096,D=128, non-causal (TFLOP/s)
ANCHOR_TFLOPS = {"cudnn": 585.0, "flash": 327.0, "efficient": 172.0, "math": 23.0}


def calls(device: str) -> dict[str, AttentionCall]:
    out = {"workload": WorkloadConfig().attention(device)}
    if device.startswith("cuda"):
        out["anchor"] = AttentionCall(4, 16, 4096, 128, "bfloat16", mask="none")
    else:
        out["cpu512"] = AttentionCall(1, 4, 512, 64, "float32", mask="none")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--max-time-s", type=float, default=2.0, help="cap per measurement")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads on the CPU (0: default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = "cuda" if args.device == "auto" and torch.cuda.is_available() else ("cpu" if args.device == "auto" else args.device)
    cuda = dev == "cuda"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, roofs, errors = [], {}, {}
    meta = {"device": dev, "device_name": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__}

    def save():
        report.write_rows(out, "sdpa_table", rows, meta=meta, roofs=roofs, errors=errors)

    for label, call in calls(dev).items():
        B, H, S, D, dt = call.batch, call.heads, call.seq_len, call.head_dim, call.dtype
        try:
            if dt not in roofs:
                roofs[dt] = asdict(flops.device_roof(dev, dt, max_time_s=args.max_time_s))
            roof = flops.Roof(**roofs[dt])
            inputs = call.inputs(dev)
            q, k, v, mask = inputs
        except Exception as exc:
            errors[label] = f"{type(exc).__name__}: {exc}"
            save()
            continue
        f = flops.attention_flops(B, H, S, S, D)
        nbytes = flops.attention_bytes(B, H, S, S, D, dtype=dt)
        for name, cand in candidates.sdpa_backends(dev).items():
            fn = cand.fn
            print(f"[sdpa_table] {name} @ {label}", file=sys.stderr, flush=True)
            row = {"shape": label, "B": B, "H": H, "S": S, "D": D, "dtype": dt, "mask": call.mask, "backend": name}
            refused = refusal(fn, call, inputs, dev)
            if refused is not None:
                row["error"] = f"{'not supported' if refused[0] == 'unsupported' else 'error'}: {refused[1]}"
                rows.append(row)
                save()
                continue
            try:
                with torch.no_grad():
                    t0 = time.perf_counter()
                    m = measure(lambda fn=fn: fn(q, k, v, attn_mask=mask), name=name, device=dev,
                                max_time_s=args.max_time_s)
                fig = flops.figures(f, nbytes, m.median_ms, roof)
                row.update(median_ms=m.median_ms, ci_lo_ms=m.ci_ms[0], ci_hi_ms=m.ci_ms[1], n=m.n, stopped=m.stopped,
                           throttled=m.n_throttled, tflops=fig["tflops"], pct_peak=fig["pct_peak"], gbs=fig["gbs"],
                           pct_bw=fig["pct_bw"], bound=fig["bound"], roof_tflops=roof.tflops, roof=roof.source,
                           anchor_tflops=ANCHOR_TFLOPS.get(name) if label == "anchor" else None,
                           total_s=time.perf_counter() - t0)
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            rows.append(row)
            save()
        del q, k, v, mask, inputs
        if cuda:
            torch.cuda.empty_cache()
    save()
    print(f"\nSDPA backends on {meta['device_name']} (torch {meta['torch']}), non-causal forward; "
          f"workload = {calls(dev)['workload'].describe()}")
    for dt, r in roofs.items():
        print(f"roof {dt}: {r['tflops']:.4g} TFLOP/s, {r['mem_gbs']} GB/s ({r['source']})")
    print(f"{'shape':<10}{'backend':<11}{'median ms':>11}{'CI ms':>22}{'TFLOP/s':>10}{'% peak':>8}{'GB/s':>9}"
          f"{'anchor':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['shape']:<10}{r['backend']:<11}  {r['error'][:160]}")
            continue
        ci = f"[{r['ci_lo_ms']:.4g}, {r['ci_hi_ms']:.4g}]"
        anc = f"{r['anchor_tflops']:.0f}" if r.get("anchor_tflops") else ""
        print(f"{r['shape']:<10}{r['backend']:<11}{r['median_ms']:>11.4f}{ci:>22}{r['tflops']:>10.3f}"
              f"{r['pct_peak']:>8.1f}{r['gbs']:>9.1f}{anc:>8}")
    for k, e in errors.items():
        print(f"ERROR {k}: {e}")
    print(f"-> {out / 'sdpa_table.json'}")
    return 0 if rows and not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
