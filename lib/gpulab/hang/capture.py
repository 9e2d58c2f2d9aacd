"""Evidence capture from a live, hung process: Python stacks, native stacks, the GPU view.

Each step is bounded in time and reports what it could not do (a refused ptrace, a missing tool) instead
of failing, because a verdict with half the evidence beats no verdict. The parsers turn the tools' text
into threads of frames (innermost first) so that classification stays a pure function of plain data.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from gpulab import proc

PTRACE_REFUSED = "ptrace refused"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True)
class Capture:
    step: str                 # python | native | gpu | oplog
    text: str                 # the tool's output, as it printed it
    tool: str | None          # faulthandler, py-spy, gdb, cuda-gdb, nvidia-smi, coredump
    seconds: float
    ok: bool
    note: str = ""            # what went wrong or was skipped, in words


@dataclass(frozen=True)
class Thread:
    tid: str                  # thread id as the tool printed it (LWP, hex ident)
    name: str
    frames: tuple[str, ...]   # innermost first: "func (where)"
    main: bool = False

    @property
    def functions(self) -> tuple[str, ...]:
        return tuple(f.split(" (", 1)[0].strip() for f in self.frames)


# ----------------------------------------------------------------------------------- bounded tools

def find_tool(name: str) -> str | None:
    """PATH first, then beside the running interpreter (a venv's py-spy is not always on PATH)."""
    found = shutil.which(name)
    if found:
        return found
    cand = Path(sys.executable).parent / name
    return str(cand) if cand.exists() else None


def run_bounded(argv: list[str], timeout_s: float, env: dict | None = None) -> tuple[int | None, str, str]:
    """Run a capture tool as a gpulab.proc child; (exit code or None on overrun, stdout, stderr)."""
    try:
        r = proc.run(argv, timeout_s=timeout_s, env=env, capture=True, label=os.path.basename(argv[0]))
    except OSError as exc:
        return -1, "", f"{argv[0]}: {exc}"
    err = _ANSI.sub("", r.stderr)  # py-spy colours output in some environments
    if r.timed_out:
        err += f"\n[gpulab: {argv[0]} overran {timeout_s:.1f} s and was stopped]"
    return r.returncode, _ANSI.sub("", r.stdout), err


def _ptrace_refused(text: str) -> bool:
    t = text.lower()
    return any(s in t for s in ("operation not permitted", "permission denied", "ptrace_scope",
                                "could not attach", "eperm"))


# ----------------------------------------------------------------------------------- capture steps

def _py_spy_dump(pid: int, timeout_s: float, t0: float, spy: str | None) -> Capture:
    if spy is None:
        return Capture("python", "", None, time.monotonic() - t0, False,
                       "not run under gpulab.trace (no faulthandler) and py-spy is not installed")
    rc, out, err = run_bounded([spy, "dump", "--full-filenames", "--pid", str(pid)], timeout_s + 3)
    note = f"{PTRACE_REFUSED} for py-spy: {err.strip()[-300:]}" if rc != 0 and _ptrace_refused(err) else (
        "" if rc == 0 else f"py-spy exit {rc}: {err.strip()[-300:]}")
    return Capture("python", out, "py-spy", time.monotonic() - t0, rc == 0 and bool(out.strip()), note)


def python_stacks(pid: int, faulthandler_file: str | os.PathLike | None, timeout_s: float = 2.0, *,
                  paused: bool = False) -> Capture:
    """SIGUSR1 makes the child's faulthandler dump every thread; it is C code run in the signal handler,
    so it works while a thread sits in native code holding the GIL, and needs no ptrace. Without it, py-spy.
    paused: py-spy first (the process paused), SIGUSR1 only where py-spy cannot: for a job that must go on after
    the capture (--on-stall keep). faulthandler's dump walks the other threads' frames while they run, and
    CPython does not make that safe: a thread that pops a frame meanwhile can crash the dump, and with it the
    job (seen once: a job killed by SIGSEGV in the dump while the recorder's thread returned from a madvise)."""
    t0 = time.monotonic()
    spy = find_tool("py-spy")
    if paused and spy is not None:
        got = _py_spy_dump(pid, timeout_s, t0, spy)
        if got.ok or faulthandler_file is None:
            return got
    if faulthandler_file is not None and Path(faulthandler_file).exists():
        path = Path(faulthandler_file)
        start = path.stat().st_size
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            return Capture("python", "", "faulthandler", time.monotonic() - t0, False, "process already gone")
        size, stable_since = start, None
        while time.monotonic() - t0 < timeout_s:
            time.sleep(0.02)
            now = path.stat().st_size
            if now != size:
                size, stable_since = now, time.monotonic()
            elif size > start and stable_since and time.monotonic() - stable_since > 0.1:
                break
        with open(path, "rb") as fh:
            fh.seek(start)
            text = fh.read().decode("utf-8", "replace")
        ok = "(most recent call first)" in text
        return Capture("python", text, "faulthandler", time.monotonic() - t0, ok,
                       "" if ok else f"no faulthandler dump within {timeout_s:.1f} s after SIGUSR1")
    return _py_spy_dump(pid, timeout_s, t0, spy)


def native_stacks(pid: int, timeout_s: float = 5.0, tools: tuple[str, ...] = ("py-spy", "gdb"),
                  gdb_timeout_s: float = 30.0) -> Capture:
    """Native frames of every thread: py-spy --native (~0.5-1 s, no GIL needed), else gdb batch (5-10 s on
    a torch process: it loads libtorch's symbols, hence its own longer bound)."""
    t0 = time.monotonic()
    notes = []
    for tool in tools:
        exe = find_tool(tool)
        if exe is None:
            notes.append(f"{tool} not installed")
            continue
        if tool == "py-spy":
            argv = [exe, "dump", "--native", "--pid", str(pid)]
        elif tool == "gdb":
            argv = [exe, "-p", str(pid), "-batch", "-nx", "-ex", "set pagination off",
                    "-ex", "thread apply all bt"]
        else:
            raise ValueError(f"native stack tool {tool!r} is not known; choose from py-spy, gdb")
        limit = max(timeout_s, gdb_timeout_s) if tool == "gdb" else timeout_s
        rc, out, err = run_bounded(argv, limit)
        good = rc == 0 and ("Thread" in out) and not (tool == "gdb" and "ptrace:" in out + err)
        if good:
            note = "; ".join(notes)
            return Capture("native", out, tool, time.monotonic() - t0, True, note)
        blob = out + err
        if _ptrace_refused(blob):
            notes.append(f"{PTRACE_REFUSED} for {tool}: {err.strip()[-200:] or out.strip()[-200:]}")
        elif rc is None:
            notes.append(f"{tool} overran {limit:.1f} s")
        else:
            notes.append(f"{tool} failed (exit {rc}): {(err or out).strip()[-200:]}")
    return Capture("native", "", None, time.monotonic() - t0, False, "; ".join(notes) or "no tool")


def gpu_view(pid: int, *, cuda_gdb: bool = False, coredump_dir: str | os.PathLike | None = None,
             timeout_s: float = 60.0) -> Capture:
    """nvidia-smi power/utilization (busy with idle power hints a spin or deadlock), then optionally
    a cuda-gdb batch attach (~12 s, pauses the process) or a user-triggered CUDA core dump."""
    t0 = time.monotonic()
    parts, notes, tools = [], [], []
    smi = find_tool("nvidia-smi")
    if smi:
        rc, out, err = run_bounded([smi, "--query-gpu=index,name,power.draw,power.limit,utilization.gpu,"
                                    "memory.used,clocks.sm", "--format=csv"], 10)
        parts.append("# nvidia-smi\n" + (out if rc == 0 else err))
        rc2, out2, _ = run_bounded([smi, "--query-compute-apps=pid,used_memory", "--format=csv"], 10)
        if rc2 == 0:
            parts.append(out2)
        tools.append("nvidia-smi")
    else:
        notes.append("nvidia-smi not installed")
    if coredump_dir:
        parts.append(_coredump(pid, Path(coredump_dir), timeout_s, notes, tools))
    if cuda_gdb:
        cg = find_tool("cuda-gdb")
        if cg is None:
            notes.append("cuda-gdb not installed")
        else:
            rc, out, err = run_bounded([cg, "-p", str(pid), "-batch", "-nx", "-ex", "set pagination off",
                                        "-ex", "info cuda kernels", "-ex", "thread apply all bt"], timeout_s)
            tools.append("cuda-gdb")
            parts.append("# cuda-gdb -p\n" + out + ("\n" + err[-1000:] if err.strip() else ""))
            if _ptrace_refused(out + err):
                notes.append(f"{PTRACE_REFUSED} for cuda-gdb")
            elif rc is None:
                notes.append(f"cuda-gdb overran {timeout_s:.0f} s")
    text = "\n".join(parts)
    return Capture("gpu", text, "+".join(tools) or None, time.monotonic() - t0, bool(text.strip()), "; ".join(notes))


COREDUMP_PIPE, COREDUMP_FILE = "cuda_corepipe", "cuda_core"


def coredump_env(out_dir: str | os.PathLike) -> dict[str, str]:
    """Environment that makes the CUDA driver open a core-dump pipe for this process (set before launch).
    The driver expands %p/%t in the names, so the pipe is found afterwards in the process's open files."""
    out = Path(out_dir)
    return {"CUDA_ENABLE_USER_TRIGGERED_COREDUMP": "1",
            "CUDA_COREDUMP_PIPE": str(out / f"{COREDUMP_PIPE}.%p.%t"),
            "CUDA_COREDUMP_FILE": str(out / f"{COREDUMP_FILE}.%p.%t"),
            "CUDA_COREDUMP_SHOW_PROGRESS": "1",
            "CUDA_COREDUMP_GENERATION_FLAGS": "skip_nonrelocated_elf_images,skip_global_memory,"
                                              "skip_shared_memory,skip_local_memory,skip_constbank_memory"}


def _coredump(pid: int, out: Path, timeout_s: float, notes: list, tools: list) -> str:
    """Write 1 MiB to the driver's pipe (a short write may sit in the pipe buffer), wait for the file."""
    pipes = sorted(str(p) for p in out.glob(f"{COREDUMP_PIPE}.*"))
    try:
        pipes += [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")
                  if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(out / COREDUMP_PIPE))]
    except OSError:
        pass
    if not pipes:
        notes.append(f"no CUDA core-dump pipe {out / COREDUMP_PIPE}.* (CUDA not initialized in the process, "
                     f"or the driver does not support user-triggered core dumps)")
        return ""
    t1 = time.monotonic()
    try:
        fd = os.open(pipes[0], os.O_WRONLY | os.O_NONBLOCK)
        try:
            left = 1 << 20
            while left > 0 and time.monotonic() - t1 < 5:
                try:
                    left -= os.write(fd, b"\0" * min(left, 65536))
                except BlockingIOError:
                    time.sleep(0.01)
        finally:
            os.close(fd)
    except OSError as exc:
        notes.append(f"CUDA core-dump pipe {pipes[0]}: {exc}")
        return ""
    tools.append("coredump")
    size, stable, core = -1, 0.0, None
    while time.monotonic() - t1 < timeout_s:
        time.sleep(0.25)
        cores = sorted(out.glob(f"{COREDUMP_FILE}.*"))
        cur = cores[0].stat().st_size if cores else -1
        if cur > 0 and cur == size:
            stable += 0.25
            if stable >= 1.0:
                core = cores[0]
                break
        else:
            size, stable = cur, 0.0
    if core is None:
        notes.append(f"no CUDA core dump appeared in {out} within {timeout_s:.0f} s after writing to {pipes[0]}")
        return ""
    text = f"# CUDA core dump: {core} ({core.stat().st_size} bytes)\n"
    cg = find_tool("cuda-gdb")
    if cg:
        rc, o, e = run_bounded([cg, "-batch", "-nx", "-ex", f"target cudacore {core}", "-ex", "info cuda kernels",
                                "-ex", "bt"], timeout_s)
        text += "# cuda-gdb on the core dump\n" + o + e[-1000:]
    return text



# ----------------------------------------------------------------------------------- parsers (pure)

_SPY_THREAD = re.compile(r'^Thread (?P<tid>\S+) \((?P<state>[^)]*)\)(?::\s*"(?P<name>[^"]*)")?')
_GDB_THREAD = re.compile(r'^Thread (?P<num>\d+) \((?:Thread 0x[0-9a-fA-F]+ \(LWP (?P<lwp>\d+)\)|process (?P<proc>\d+))'
                         r'(?: "(?P<name>[^"]*)")?\):?\s*$')
_GDB_FRAME = re.compile(r'^#(?P<n>\d+)\s+(?:0x[0-9a-fA-F]+ in )?(?P<func>[^\s(]+(?:\([^)]*\))?[^\s(]*)\s*\(.*?\)'
                        r'(?:\s+(?:at|from)\s+(?P<where>\S+))?')
_FH_THREAD = re.compile(r'^(?P<cur>Current thread|Thread) (?P<tid>0x[0-9a-fA-F]+)')
_FH_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>\S+)')


def parse_native(text: str, pid: int | None = None) -> tuple[Thread, ...]:
    """py-spy dump (--native) or gdb `thread apply all bt` text -> threads, innermost frame first."""
    threads: list[Thread] = []
    cur: dict | None = None

    def flush():
        if cur is not None:
            threads.append(Thread(cur["tid"], cur["name"], tuple(cur["frames"]), cur["main"]))

    for line in text.splitlines():
        g = _GDB_THREAD.match(line)
        m = _SPY_THREAD.match(line) if not g else None
        if m:
            flush()
            tid = m.group("tid")
            name = m.group("name") or ""
            main = name == "MainThread" or (pid is not None and tid == str(pid))
            cur = {"tid": tid, "name": name, "frames": [], "main": main}
            continue
        if g:
            flush()
            tid = g.group("lwp") or g.group("proc") or g.group("num")
            main = (pid is not None and tid == str(pid)) or (g.group("num") == "1" and pid is None)
            cur = {"tid": tid, "name": g.group("name") or "", "frames": [], "main": main}
            continue
        if cur is None:
            continue
        f = _GDB_FRAME.match(line.strip())
        if f:
            where = f.group("where") or ""
            cur["frames"].append(f"{f.group('func')} ({Path(where).name})" if where else f.group("func"))
        elif line.startswith("    ") and line.strip():
            cur["frames"].append(line.strip())
    flush()
    return tuple(threads)


def parse_python(text: str) -> tuple[Thread, ...]:
    """faulthandler dump -> threads (the dumping thread is marked main when it says 'Current thread'); a py-spy
    dump (`Process PID:` first) as parse_native reads it."""
    threads: list[Thread] = []
    cur: dict | None = None
    for line in text.splitlines():
        m = _FH_THREAD.match(line)
        if m:
            if cur:
                threads.append(Thread(cur["tid"], cur["name"], tuple(cur["frames"]), cur["main"]))
            cur = {"tid": m.group("tid"), "name": "current" if m.group("cur").startswith("Current") else "",
                   "frames": [], "main": False}
            continue
        f = _FH_FRAME.match(line)
        if f and cur is not None:
            cur["frames"].append(f"{f.group('func')} ({f.group('file')}:{f.group('line')})")
    if cur:
        threads.append(Thread(cur["tid"], cur["name"], tuple(cur["frames"]), cur["main"]))
    spied = re.search(r"^Process (\d+):", text, re.M) if not threads else None
    if spied:   # py-spy's dump (python_stacks' other way): its threads, the main one by the process id
        return parse_native(text, int(spied.group(1)))
    if threads and not any(t.main for t in threads):
        # faulthandler lists the main thread last (oldest thread); mark it.
        last = threads[-1]
        threads[-1] = Thread(last.tid, last.name, last.frames, True)
    return tuple(threads)


def collapse(threads: tuple[Thread, ...], max_frames: int = 40) -> list[str]:
    """One line per thread, outermost;...;innermost (flame-graph 'collapsed' order)."""
    lines = []
    for t in threads:
        funcs = list(t.functions[:max_frames])[::-1]
        label = t.name or t.tid
        lines.append(f"{label}{' [main]' if t.main else ''}: " + ";".join(funcs))
    return lines
