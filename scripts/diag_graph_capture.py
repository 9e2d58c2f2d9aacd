"""Which part of the recorder breaks a CUDA graph capture: tests/fixtures/gpu_graph_spin.py (capture, replay)
run plain and under `python -m gpulab.trace` in each configuration (mode, GPU mechanism, parts of each record
switched off by GPULAB_TRACE_ABLATE, the capture's error mode), each in its own process. Prints per
configuration ok/failed, the GPU mechanism the log names and the child's last error line.

  python scripts/diag_graph_capture.py [--only NAME,...]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from gpulab import proc, trace  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "gpu_graph_spin.py"
# name -> (recorder args or None for plain, env, fixture args)
CONFIGS = {
    "plain": (None, {}, []),
    "ops": (["--mode", "ops"], {}, []),
    "auto": (["--mode", "auto"], {}, []),
    "auto-thread_local": (["--mode", "auto"], {}, ["--capture-mode", "thread_local"]),
    "auto-relaxed": (["--mode", "auto"], {}, ["--capture-mode", "relaxed"]),
    "auto-nomarks": (["--mode", "auto"], {"GPULAB_TRACE_ABLATE": "4"}, []),
    "auto-events": (["--mode", "auto", "--gpu-mechanism", "events"], {}, []),
    "auto-pinned": (["--mode", "auto", "--gpu-mechanism", "memop-pinned"], {}, []),
    "auto-dispatch": (["--mode", "auto"], {"GPULAB_TRACE_OBSERVER": "0"}, []),
    "auto-nokernels": (["--mode", "auto"], {"GPULAB_TRACE_KERNELS": "0"}, []),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="")
    ns = ap.parse_args(argv)
    names = [n for n in ns.only.split(",") if n] or list(CONFIGS)
    bad = [n for n in names if n not in CONFIGS]
    if bad:
        ap.error(f"unknown configuration {bad}; choose from {', '.join(CONFIGS)}")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="gpulab-diag-graph-") as tmp:
        for name in names:
            rec, env, extra = CONFIGS[name]
            log = Path(tmp) / f"{name}.log"
            cmd = [sys.executable, str(FIXTURE), *extra]
            if rec is not None:
                cmd = [sys.executable, "-m", "gpulab.trace", "--log", str(log), *rec, "--", str(FIXTURE), *extra]
            r = proc.run(cmd, timeout_s=120, env=proc.python_env({**os.environ, **env}),
                         capture=True)
            mech = ""
            if log.exists():
                try:
                    mech = trace.read(log).gpu_mechanism
                except Exception as e:  # noqa: BLE001 - a diagnostic prints what it can
                    mech = f"unreadable ({e})"
            errs = [ln for ln in r.stderr.splitlines() if "Error" in ln]
            failed += not r.ok
            print(f"{name:<20} {r.status:<8} {r.elapsed_s:6.1f} s  mechanism={mech or '-':<14} "
                  f"{errs[-1][:160] if errs and not r.ok else r.stdout.strip()[-60:]}", flush=True)
            if not r.ok:
                print("    " + "\n    ".join(r.stderr.strip().splitlines()[-12:]), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
