"""The last records of every op log under a folder, with their GPU state: what a job verdict was judged from.

    python scripts/oplog_tail.py FOLDER [--n 15]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from gpulab.trace.ring import read  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("folder", type=Path)
p.add_argument("--n", type=int, default=15)
a = p.parse_args()
for log in sorted(a.folder.rglob("*.log")):
    try:
        snap = read(log)
    except Exception as exc:  # noqa: BLE001 - not an op log
        continue
    print(f"== {log.relative_to(a.folder)}: mechanism={snap.gpu_mechanism!r} notes={snap.gpu_notes!r}")
    for s in snap.streams:
        print(f"   stream {s}")
    for r in snap.records[-a.n:]:
        print(f"   {r.seq:5d} {r.kind:9s} d{r.depth} {r.name[:44]:44s} t0={r.t_start:.3f} "
              f"t1={'open' if r.t_end is None else f'{r.t_end:.3f}'} gpu_done={r.gpu_done} "
              f"stream={r.stream} thr={r.thread} raised={r.raised} {str(r.args)[:60]}")
