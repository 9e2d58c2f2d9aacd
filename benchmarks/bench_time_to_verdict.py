"""Figure: time to verdict after a hang starts = stall threshold + capture time (goal: capture < 5 s
without cuda-gdb).

Each trial is a real hang in a real child: a native mutex deadlock inside an op (GIL held / released)
and a library whose constructor deadlocks in dlopen, watched with several stall windows and each native
stack tool. Writes trials.csv, summary.json and time_to_verdict.png under --out; prints a table last.

    python benchmarks/bench_time_to_verdict.py --out /tmp/ttv [--stalls 1,2,4] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from gpulab.hang import capture
from gpulab.hang.watchdog import watch  # noqa: E402

SCRIPT = ROOT / "tests" / "fixtures" / "slow_then_ok.py"
DRILLS = {"deadlock_gil_held": "deadlock:aten.mm@2,gil=held",
          "deadlock_gil_released": "deadlock:aten.mm@2,gil=released",
          "libload": "libload"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--stalls", default="1,2,4", help="stall windows in seconds, comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--drills", default=",".join(DRILLS), help=f"subset of {', '.join(DRILLS)}")
    p.add_argument("--tools", default="py-spy,gdb", help="native stack tools to compare, each alone")
    a = p.parse_args(argv)
    import pandas as pd

    stalls = [float(s) for s in a.stalls.split(",") if s]
    drills = [d for d in a.drills.split(",") if d]
    bad = [d for d in drills if d not in DRILLS]
    if bad:
        p.error(f"unknown drill(s) {bad}; choose from {', '.join(DRILLS)}")
    tools = [t for t in a.tools.split(",") if t and capture.find_tool(t)]
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for tool in tools:
        for drill in drills:
            for stall in stalls:
                for r in range(a.repeats):
                    tag = f"{tool}_{drill}_s{stall:g}_r{r}"
                    t0 = time.monotonic()
                    try:
                        v = watch.run(["python", str(SCRIPT), "0"], stall_s=stall, timeout_s=120,
                                      fault=DRILLS[drill], out_dir=a.out / "runs" / tag, native_tools=(tool,),
                                      progress=lambda m: None)
                        rows.append({"tool": tool, "drill": drill, "stall_s": stall, "repeat": r, "status": v.status,
                                     "class": v.cls, "in_flight": (v.in_flight_op or {}).get("name"),
                                     "time_to_verdict_s": v.time_to_verdict_s,
                                     "capture_s": v.capture_s.get("total"),
                                     "python_s": v.capture_s.get("python"), "native_s": v.capture_s.get("native"),
                                     "native_ok": bool(v.stacks["native"]), "wall_s": time.monotonic() - t0})
                    except Exception as exc:  # one failed trial must not lose the others
                        rows.append({"tool": tool, "drill": drill, "stall_s": stall, "repeat": r, "status": "failed",
                                     "error": f"{type(exc).__name__}: {exc}"})
                    pd.DataFrame(rows).to_csv(a.out / "trials.csv", index=False)
                    print(f"{tag}: {rows[-1].get('status')} ttv {rows[-1].get('time_to_verdict_s')}", file=sys.stderr)
    df = pd.DataFrame(rows)
    ok = df[df["status"] == "hang"] if "status" in df else df
    summary = (ok.groupby(["tool", "drill", "stall_s"])
               .agg(n=("time_to_verdict_s", "size"), ttv_median_s=("time_to_verdict_s", "median"),
                    capture_median_s=("capture_s", "median"), capture_max_s=("capture_s", "max"),
                    native_median_s=("native_s", "median"))
               .reset_index()) if len(ok) else pd.DataFrame()
    (a.out / "summary.json").write_text(json.dumps({"trials": len(df), "hangs": int(len(ok)),
                                                    "summary": summary.to_dict(orient="records"),
                                                    "goal_capture_s": 5.0}, indent=2))
    if len(summary):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for (tool, drill), g in summary.groupby(["tool", "drill"]):
            ax.plot(g["stall_s"], g["ttv_median_s"], marker="o", label=f"{drill} ({tool})")
        xs = sorted(summary["stall_s"].unique())
        ax.plot(xs, [x + 5 for x in xs], "k--", lw=1, label="stall + 5 s (goal)")
        ax.plot(xs, xs, "k:", lw=1, label="stall window alone")
        ax.set_xlabel("stall window (s)")
        ax.set_ylabel("time to verdict after the hang starts (s), median")
        ax.legend(fontsize=8)
        fig.savefig(a.out / "time_to_verdict.png", dpi=110, bbox_inches="tight")
    print(summary.to_string(index=False) if len(summary) else "no hang trials succeeded")
    return 0 if len(ok) == len(df) and len(df) else 1


if __name__ == "__main__":
    raise SystemExit(main())
