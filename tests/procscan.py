"""Find processes by a marker in their environment: how the tests prove that nothing was left running,
independently of gpulab's own bookkeeping."""
from __future__ import annotations

import os
import time
import uuid


def new_marker() -> tuple[str, str]:
    return "GPULAB_TEST_MARK", uuid.uuid4().hex


def carriers(name: str, value: str, exclude: tuple[int, ...] = ()) -> list[int]:
    """Live processes (not zombies) whose environment holds name=value."""
    needle = f"{name}={value}".encode()
    found = []
    for n in os.listdir("/proc"):
        if not n.isdigit() or int(n) == os.getpid() or int(n) in exclude:
            continue
        try:
            with open(f"/proc/{n}/stat", "rb") as fh:
                if fh.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                    continue
            with open(f"/proc/{n}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.append(int(n))
        except (OSError, IndexError):
            continue
    return found


def left_after(name: str, value: str, grace_s: float = 2.0, exclude: tuple[int, ...] = ()) -> list[str]:
    """Marked processes still alive after a short grace (exits are not instant); killed, then reported. The
    session's gpulab.proc guard is no leftover: started by the first test that starts a child, it carries that
    test's marker when that test runs alone."""
    from gpulab import proc

    exclude = (*exclude, *([proc.guard_pid()] if proc.guard_pid() else []))
    deadline = time.monotonic() + grace_s
    while True:
        pids = carriers(name, value, exclude)
        if not pids or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            out.append(f"{pid}: {cmd[:120]}")
            os.kill(pid, 9)
        except OSError:
            pass
    return out


def sigterm_once_saved(p, target, seen, limit_s: float = 120.0) -> dict:
    """SIGTERM a running gpulab command once its --json `target` holds what `seen(data)` wants; the file as
    the interrupted command left it. The command is killed if it outlives the signal."""
    import json
    import signal
    try:
        deadline = time.monotonic() + limit_s
        while not (target.exists() and seen(json.loads(target.read_text()))):
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read() if p.poll() is not None else "slow"
            time.sleep(0.1)
        p.send_signal(signal.SIGTERM)
        p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + signal.SIGTERM
    return json.loads(target.read_text())
