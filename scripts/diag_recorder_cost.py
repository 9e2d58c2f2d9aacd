"""Where the recorder's per-op time goes on this host: the tiny-op program (and the training step) under
none / pass-through / ops (native and pure-Python hot path), with the log on the run folder's file system
and on /dev/shm, on CUDA and on the CPU; then a native py-spy profile of `ops` on the tiny ops.

    python scripts/diag_recorder_cost.py --out DIR [--device cuda] [--rounds 2]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from gpulab import proc  # noqa: E402
from gpulab.trace import native, userbench  # noqa: E402


def host_facts(out: Path) -> dict:
    def read(p):
        try:
            return Path(p).read_text().strip()
        except OSError as exc:
            return f"? {exc}"
    fs = proc.run(["df", "-T", str(out), "/dev/shm"], timeout_s=10, capture=True)
    return {"clocksource": read("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
            "kernel": os.uname().release, "df": fs.stdout, "native": str(native.ensure()[0])}


def per_op(raw: dict, workload: str) -> dict:
    out = {}
    for name, runs in raw.items():
        xs = [v for r in runs if (v := userbench.per_op_us(r, workload)) is not None]
        cs = [v for r in runs if (v := userbench.per_op_us(r, workload, "cpu_s")) is not None]
        if xs:
            out[name] = {"us_per_op": round(statistics.median(xs), 2), "cpu_us_per_op": round(statistics.median(cs), 2)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rounds", type=int, default=2)
    ns = ap.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    res = {"host": host_facts(ns.out)}
    print(json.dumps(res["host"], indent=1), flush=True)
    V = userbench.Variant
    variants = [V("none", wrapper="none"), V("passthrough", wrapper="passthrough"), V("ops", mode="ops"),
                V("ops_python", mode="ops", env=(("GPULAB_TRACE_NATIVE", "0"),))]
    for dev in (ns.device, "cpu"):
        for where, folder in (("run_dir", ns.out / f"runs_{dev}"), ("shm", Path("/dev/shm") / f"gpulab_diag_{dev}")):
            args = ["--device", dev, "--tiny", "3000", "--blocks", "5"]
            if where == "run_dir" and dev == ns.device and dev.startswith("cuda"):
                args += ["--steps", "1", "--step-blocks", "5", "--workload",
                         f"--rung step --device {dev} --batch 8 --heads 16 --head-dim 64 --text-tokens 256 "
                         f"--image-tokens 2048 --layers 6 --lora-rank 16"]
            r = userbench.user_run(variants, args, folder, ns.rounds)
            key = f"{dev}/{where}"
            res[key] = {"tiny_ops": per_op(r["raw"], "tiny_ops"), "failures": r["failures"]}
            if "--steps" in args:
                res[key]["transformer_step"] = per_op(r["raw"], "transformer_step")
            print(key, json.dumps(res[key]), flush=True)
            if where == "shm":
                shutil.rmtree(folder, ignore_errors=True)
    spy = shutil.which("py-spy")
    if spy:
        prog = ns.out / f"runs_{ns.device}" / "user_program.py"
        for name, env in (("ops_native", {}), ("ops_python", {"GPULAB_TRACE_NATIVE": "0"})):
            cmd = [spy, "record", "--native", "--rate", "2000", "--format", "raw", "--output",
                   str(ns.out / f"pyspy_{name}.txt"), "--", sys.executable, "-m", "gpulab.trace", "--log",
                   str(ns.out / f"pyspy_{name}.log"), "--mode", "ops", "--", str(prog), str(ns.out / "pyspy.json"),
                   "--device", ns.device, "--tiny", "20000", "--blocks", "3"]
            e = userbench.child_env(tuple(env.items()))
            r = proc.run(cmd, timeout_s=120, env=e, stdout=ns.out / f"pyspy_{name}.stdout", stderr=subprocess.STDOUT)
            print("py-spy", name, r.returncode, flush=True)
    (ns.out / "diag.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
