"""Figure: a job watched for a long time stays bounded: the watch folder's size and the resident memory of
the watchdog and of the job, sampled at fixed times (goal: at 1, 10 and 30 minutes within 10% of each
other).

The job is a CPU training loop that does what makes a naive watcher grow: it prints a line every step, starts
new DataLoader worker processes every epoch (each one recorded, with its own op log), and pauses for a
checkpoint longer than the stall window now and then (each pause captured under --on-stall keep, and
recovered). It runs under the real `gpulab watch` command until the last sample, then gets SIGTERM (passed on
to the job, which checkpoints and exits 0). Writes samples.csv, summary.json (and the watch folder) under
--out; prints a table last.

    python benchmarks/bench_long_watch.py --out /tmp/long --at 1,10,30          # minutes: the figure
    python benchmarks/bench_long_watch.py --out /tmp/long --at 0.25,0.5,1      # a short check
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
JOB = '''
import io, os, signal, sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset

CKPT_EVERY_S, PAUSE_S = float(sys.argv[1]), float(sys.argv[2])
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = TensorDataset(torch.randn(2048, 64), torch.randn(2048, 1))
step, epoch, last_ckpt = 0, 0, time.monotonic()
while not stop:
    epoch += 1
    for x, y in DataLoader(data, batch_size=32, num_workers=2, shuffle=True):   # new workers every epoch
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        step += 1
        print(f"epoch {epoch} step {step} loss {loss.item():.5f}", flush=True)
        if time.monotonic() - last_ckpt > CKPT_EVERY_S:
            def save_checkpoint():   # storage slower than the job: the main thread waits on it
                buf = io.BytesIO()
                torch.save(model.state_dict(), buf)
                end = time.monotonic() + PAUSE_S
                with open(os.devnull, "wb") as fh:
                    while time.monotonic() < end:
                        fh.write(buf.getvalue()); fh.flush(); time.sleep(0.25)
            save_checkpoint()
            last_ckpt = time.monotonic()
        time.sleep(0.01)
        if stop:
            break
print(f"SIGTERM at step {step}: checkpoint written", flush=True)
'''


def folder_size(path: Path) -> tuple[int, int]:
    """(bytes on disk, apparent bytes) of everything under path."""
    disk = apparent = 0
    for dirpath, _, names in os.walk(path):
        for n in names:
            try:
                st = os.lstat(os.path.join(dirpath, n))
            except OSError:
                continue
            disk += st.st_blocks * 512
            apparent += st.st_size
    return disk, apparent


def rss(p: psutil.Process) -> int:
    try:
        return p.memory_info().rss
    except psutil.Error:
        return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--at", default="1,10,30", help="sample times in minutes, comma-separated")
    ap.add_argument("--stall", type=float, default=10.0, help="the watch's stall window (s)")
    ap.add_argument("--checkpoint-every", type=float, default=120.0, help="seconds between checkpoint pauses")
    ap.add_argument("--pause", type=float, default=14.0, help="seconds each checkpoint takes (above --stall)")
    a = ap.parse_args(argv)
    at = sorted(float(x) * 60 for x in a.at.split(",") if x)
    if not at or at[0] <= 0:
        ap.error(f"--at {a.at!r}: give positive minutes, e.g. 1,10,30")
    a.out.mkdir(parents=True, exist_ok=True)
    job, watch_dir = a.out / "job.py", a.out / "watch"
    job.write_text(JOB)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "lib"), os.environ.get("PYTHONPATH", "")]))
    log = open(a.out / "watch_output.txt", "wb")   # the job's output as a terminal would get it
    cmd = [sys.executable, "-m", "gpulab", "watch", "--stall", str(a.stall), "--on-stall", "keep",
           "--status-every", "60", "--out", str(watch_dir), "--", sys.executable, str(job),
           str(a.checkpoint_every), str(a.pause)]
    watcher = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    wp = psutil.Process(watcher.pid)
    rows, t0 = [], time.monotonic()
    try:
        for t in at:
            while time.monotonic() - t0 < t:
                if watcher.poll() is not None:
                    raise SystemExit(f"gpulab watch ended early (exit {watcher.returncode}); see "
                                     f"{a.out / 'watch_output.txt'}")
                time.sleep(min(1.0, t - (time.monotonic() - t0)))
            kids = wp.children(recursive=True)
            disk, apparent = folder_size(watch_dir)
            st = json.loads((watch_dir / "status.json").read_text()) if (watch_dir / "status.json").exists() else {}
            row = {"minutes": round(t / 60, 2), "folder_disk_mb": round(disk / 2**20, 2),
                   "folder_apparent_mb": round(apparent / 2**20, 2),
                   "watchdog_rss_mb": round(rss(wp) / 2**20, 1),
                   "job_rss_mb": round(sum(rss(k) for k in kids) / 2**20, 1), "job_processes": len(kids),
                   "stalls": st.get("stalls"), "recovered": st.get("recovered"),
                   "procs_files": len(list((watch_dir / "procs").glob("*"))) if (watch_dir / "procs").is_dir() else 0,
                   "ops_completed": sum(r.get("ops_completed") or 0 for r in st.get("processes") or ())}
            rows.append(row)
            print(json.dumps(row), flush=True)
        watcher.send_signal(signal.SIGTERM)   # a scheduler's preemption: passed on to the job
        code = watcher.wait(timeout=120)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
        log.close()
    verdict = json.loads((watch_dir / "verdict.json").read_text()) if (watch_dir / "verdict.json").exists() else {}
    keys = ("folder_disk_mb", "watchdog_rss_mb", "job_rss_mb")
    spread = {k: round(max(r[k] for r in rows) / max(min(r[k] for r in rows), 1e-9) - 1, 3) for k in keys}
    summary = {"samples": rows, "spread_max_over_min_minus_1": spread, "exit_code": code,
               "verdict_status": verdict.get("status"), "stalls": len(verdict.get("stalls") or ()),
               "stalls_recovered": sum(1 for s in verdict.get("stalls") or () if s.get("recovered")),
               "command": cmd, "machine": os.uname().nodename, "cpus": os.cpu_count()}
    (a.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    import csv
    with open(a.out / "samples.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"\n{'minutes':>8} {'folder MB':>10} {'apparent MB':>12} {'watchdog MB':>12} {'job MB':>8} {'procs':>6} "
          f"{'files':>6} {'stalls':>7}")
    for r in rows:
        print(f"{r['minutes']:>8} {r['folder_disk_mb']:>10} {r['folder_apparent_mb']:>12} {r['watchdog_rss_mb']:>12} "
              f"{r['job_rss_mb']:>8} {r['job_processes']:>6} {r['procs_files']:>6} "
              f"{r['stalls']}/{r['recovered']}")
    print("spread (max/min - 1): " + ", ".join(f"{k} {v:+.1%}" for k, v in spread.items())
          + f"; exit {code}, verdict {summary['verdict_status']}, stalls {summary['stalls']} "
          f"({summary['stalls_recovered']} recovered)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
