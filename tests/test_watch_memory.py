"""`gpulab watch --on-stall keep` over days: the watchdog's own memory stays flat however many stalls it captures.

Each capture reads the job's op log (up to 131072 records) into ~100 MB of short-lived Python objects. Run in
the watchdog, the few objects that outlived a capture pinned pymalloc arenas and the watchdog grew by MBs a
stall (measured here: +22.7 MB over the 6 stalls; ~7 MB a stall in bench_long_watch); each capture now runs in a
forked copy (keepstall.apart) and the watchdog stays within 0.1 MB. The job is real and really pauses; the
watchdog runs in a process of its own, whose resident memory is read after each stall recovered. About 25 s on
2 cores."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from gpulab.hang.watchdog import keepstall

JOB = '''
import json, os, sys, time
import torch

pauses, every, pause, captures = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
x = torch.zeros(8)
done, last = 0, time.monotonic()


def save_checkpoint():   # storage slower than the stall window
    time.sleep(pause)


def recovered(n):   # the watchdog saw stall n end: the next pause is a stall of its own, however slow the machine
    try:
        with open(os.path.join(captures, f"{n:02d}", "verdict.json")) as fh:
            return json.load(fh)["stall"]["recovered"]
    except (OSError, ValueError, KeyError):
        return False


while done < pauses or not recovered(done) and time.monotonic() - last < 60:
    for _ in range(100):
        x = x + 1   # an op each: the op log fills with tens of thousands of records
    time.sleep(0.02)
    if done < pauses and time.monotonic() - last > every and (done == 0 or recovered(done)):
        save_checkpoint()
        done += 1
        last = time.monotonic()
sys.stdout.flush()
os._exit(0)   # no torch teardown: on a loaded machine it outlasts the 0.7 s window, a seventh stall of no interest here
'''

WATCHDOG = '''
import json, os, sys
from gpulab.hang.watchdog import watch

out, job = sys.argv[1], sys.argv[2]
rss = []


def say(msg):
    if " recovered after " in msg:   # after the capture, its release and the recovery: what the watchdog keeps
        with open("/proc/self/statm") as fh:
            rss.append(int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))


# 6 pauses of 1.5 s (each after 1 s of ops and once the stall before was seen recovered), a 0.7 s window
v = watch.run([sys.executable, job, "6", "1.0", "1.5", os.path.join(out, "captures")], stall_s=0.7, on_stall="keep",
              out_dir=out, progress=say, native_tools=(), status=True, keep_output=1 << 20)
print(json.dumps({"rss": rss, "status": v.status, "stalls": [dict(s) for s in v.stalls]}))
'''


def test_the_watchdog_does_not_grow_with_the_stalls_it_captures(tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "watchdog.py").write_text(textwrap.dedent(WATCHDOG))
    r = subprocess.run([sys.executable, str(tmp_path / "watchdog.py"), str(tmp_path / "w"), str(tmp_path / "job.py")],
                       capture_output=True, text=True, timeout=150, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["status"] == "ok", got
    rss = [b / 2**20 for b in got["rss"]]
    said = [(s["t"], s["recovered"], s["pause"]["kind"]) for s in got["stalls"]]
    assert len(rss) == len(said) == 6, said   # each pause captured, each recovered
    assert all(ok and kind == "checkpoint" for _, ok, kind in said), said
    # the first capture may import what it needs once; after it, a few MB a stall was the leak
    assert rss[-1] - rss[0] < 2.5, f"the watchdog grew from {rss[0]:.1f} to {rss[-1]:.1f} MB over {len(rss)} stalls: " \
                                   f"{[round(x, 1) for x in rss]}"


def test_a_capture_copy_that_never_reports_is_killed_and_the_capture_runs_in_the_watchdog(monkeypatch):
    """A copy forked while another thread held a lock it then needs would wait forever: past the limit it goes
    and the watchdog captures itself."""
    monkeypatch.setattr(keepstall, "APART_LIMIT_S", 0.5)
    parent = os.getpid()

    def capture():
        if os.getpid() != parent:
            time.sleep(30)   # the copy never answers
        return {"where": "here"}

    forked = []
    real_fork = os.fork

    def fork():
        pid = real_fork()
        if pid:
            forked.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", fork)
    t0 = time.monotonic()
    assert keepstall.apart(capture) == {"where": "here"}
    assert time.monotonic() - t0 < 10 and len(forked) == 1
    with pytest.raises(ChildProcessError):   # the copy was killed and reaped (another test's children aside)
        os.waitpid(forked[0], os.WNOHANG)
