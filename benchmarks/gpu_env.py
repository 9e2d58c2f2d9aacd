"""Verify notebook 01's environment probe on a real GPU (and run it small on the CPU).

    python benchmarks/gpu_env.py --out DIR [--size auto|small|full]

For a few variants of the workload's attention call (the workload itself: bf16 with a boolean padding
mask; the same without a mask, which flash accepts; fp32, which flash refuses; bf16 with backward) it
runs `gpulab.env.collect()`, writes DIR/env_<variant>.json, DIR/sdpa.csv and .json (one row per variant
x backend: usable, selected, measured ms, TFLOP/s, torch's refusal reason), DIR/risks.json and
DIR/checks.json (expectations: on an sm_90 GPU, flash/efficient/cudnn usable for bf16 without a mask),
and prints the table last. A variant that fails is recorded and the others still run.
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from gpulab import env, proc  # noqa: E402
from gpulab.env import rules  # noqa: E402
from gpulab.report import write_json, write_rows  # noqa: E402
from gpulab.workloads import FUSED_BACKENDS, WorkloadConfig  # noqa: E402

SIZES = {
    # B=4, H=16, S=4096, D=128: the shape ANCHORS.md quotes H100 SDPA figures for.
    "full": dict(batch=4, heads=16, head_dim=128, text_tokens=256, image_tokens=3840),
    "small": dict(batch=1, heads=2, head_dim=16, text_tokens=8, image_tokens=24),
}


def variants(size: dict, device: str) -> dict[str, tuple[WorkloadConfig, bool]]:
    """name -> (the workload, whether its attention call is probed without the padding mask)."""
    low = "bfloat16" if device == "cuda" else "float32"
    return {
        "workload": (WorkloadConfig(**size, device=device), False),
        "nomask": (WorkloadConfig(**size, device=device, dtype=low), True),
        "fp32": (WorkloadConfig(**size, device=device, dtype="float32"), False),
        "step": (WorkloadConfig(**size, device=device, dtype=low, rung="step"), False),
    }


def _has_gpu() -> bool:
    """Asked of a child: this script never imports torch itself (a torch import that hangs is one of the
    things the probe it verifies must survive)."""
    code = "import torch; print(torch.cuda.is_available())"
    try:
        r = proc.run([sys.executable, "-c", code], timeout_s=300, capture=True)
    except OSError:
        return False
    return r.stdout.strip().endswith("True")


def flops(f: dict) -> float:
    """gpulab.bench.flops.attention_flops's count (fwd, or fwd+bwd = 3.5x), kept here for the same reason."""
    sdpa = f.get("sdpa") or {}
    b, h, s, d = sdpa.get("shape") or (0, 0, 0, 0)
    return 4.0 * b * h * s * s * d * (3.5 if sdpa.get("requires_grad") else 1.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--size", choices=("auto", "small", "full"), default="auto")
    ap.add_argument("--only", action="append", default=[], choices=("workload", "nomask", "fp32", "step"),
                    help="run only these variants (repeatable)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = _has_gpu()
    size = SIZES["full" if (args.size == "full" or (args.size == "auto" and gpu)) else "small"]
    device = "cuda" if gpu else "cpu"
    rule_set = rules.load_rules()
    rows, risks, checks, status = [], {}, [], {}
    for name, (cfg, unmasked) in variants(size, device).items():
        if args.only and name not in args.only:
            continue
        t0 = time.time()
        print(f"[gpu_env] {name}: {cfg}{' without the mask' if unmasked else ''}", file=sys.stderr, flush=True)
        try:
            f = env.collect(cfg, unmasked=unmasked)
            matches = rules.evaluate(f, rule_set)
            write_json(args.out / f"env_{name}.json", env.document(f, matches))
            risks[name] = [m.rule_id for m in matches]
            fl = flops(f)
            for r in env.sdpa_rows(f):
                ms = r["ms"] if isinstance(r["ms"], (int, float)) else None
                rows.append({"variant": name, "dtype": f["sdpa"]["dtype"], "mask": bool(f["sdpa"]["mask"]),
                             "grad": f["sdpa"]["requires_grad"], "backend": r["backend"], "usable": r["usable"],
                             "selected": r["selected"], "run": r["run"], "ms": ms,
                             "tflops": round(fl / (ms * 1e-3) / 1e12, 2) if ms else None,
                             "reason": r["reason"][:300]})
            status[name] = {"ok": True, "seconds": round(time.time() - t0, 1), "probe": f["torch_probe_status"],
                            "errors": f["errors"], "device": f["device_name"], "cc": f["compute_capability"],
                            "arch_in_wheel": f["arch_in_wheel"], "unified_memory": f["unified_memory"],
                            "selected": f["sdpa_selected"]}
            if name == "nomask" and f.get("compute_capability") == "9.0":
                usable = {b: f["sdpa"]["backends"][b]["usable"] for b in FUSED_BACKENDS}
                checks.append({"check": "sm_90 bf16 no mask: flash, efficient, cudnn usable",
                               "passed": all(usable.values()), "observed": usable})
            if name == "fp32" and f.get("gpu_kind") == "cuda":
                # torch reports the first failing check per backend: with the mask on, flash names the
                # mask, so the dtype refusal shows on cuDNN (bf16/fp16 only).
                reasons = {b: f["sdpa"]["backends"][b]["reasons"] for b in FUSED_BACKENDS}
                checks.append({"check": "fp32: a fused backend refused with a dtype reason from torch",
                               "passed": any("dtype" in r.lower() for rs in reasons.values() for r in rs),
                               "observed": {b: rs[:1] for b, rs in reasons.items()}})
            if name == "workload":
                runs_ok = all(r["run"] in ("ok", "not usable") for r in env.sdpa_rows(f))
                checks.append({"check": "workload: every usable backend ran to completion", "passed": runs_ok,
                               "observed": {r["backend"]: r["run"] for r in env.sdpa_rows(f)}})
                checks.append({"check": "no platform risk expected on a healthy node", "passed": not matches,
                               "observed": risks[name]})
        except Exception as exc:  # noqa: BLE001 - one variant failing must not lose the others
            status[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                            "traceback": traceback.format_exc()[-2000:]}
        # Write as we go: a later failure keeps what is done.
        write_json(args.out / "status.json", status)
        write_json(args.out / "risks.json", risks)
        write_json(args.out / "checks.json", checks)
        write_rows(args.out, "sdpa", rows)

    print()
    for name, st in status.items():
        print(f"{name:<9} " + (f"ok in {st['seconds']} s, probe {st['probe']}, {st['device']} cc={st['cc']} "
                               f"arch_in_wheel={st['arch_in_wheel']} unified={st['unified_memory']} "
                               f"selected={st['selected']}, risks={risks.get(name)}"
                               if st["ok"] else f"FAILED: {st['error']}"))
    for c in checks:
        print(f"check {'PASS' if c['passed'] else 'FAIL'}: {c['check']}  observed={c['observed']}")
    print()
    print(f"{'variant':<9} {'dtype':<9} {'mask':<5} {'grad':<5} {'backend':<10} {'usable':<6} {'sel':<4} "
          f"{'run':<10} {'ms':>9} {'TFLOP/s':>8}  reason")
    for r in rows:
        ms = f"{r['ms']:.3f}" if r["ms"] is not None else "-"
        tf = f"{r['tflops']:.1f}" if r["tflops"] is not None else "-"
        print(f"{r['variant']:<9} {r['dtype']:<9} {str(r['mask']):<5} {str(r['grad']):<5} {r['backend']:<10} "
              f"{str(r['usable']):<6} {'*' if r['selected'] else '':<4} {r['run']:<10} {ms:>9} {tf:>8}  "
              f"{r['reason'][:90]}")
    failed = [n for n, st in status.items() if not st["ok"]] + [c["check"] for c in checks if not c["passed"]]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
