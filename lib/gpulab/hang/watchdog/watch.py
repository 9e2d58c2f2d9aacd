"""The hang watchdog: run a command as a gpulab.proc child, watch its progress, and on a hang capture the
evidence (Python stacks, native stacks, GPU view, op-log tail) before stopping the whole process tree.

A Python command runs under `python -m gpulab.trace` (no change to the program) so every PyTorch op is
recorded crash-safely, and keeps a heartbeat (gpulab.beat: the main thread ran Python bytecode and burnt
CPU). Progress is gpulab.trace.liveness's rule: new completed records (host or GPU) while an op is open;
between ops and before the first op, the heartbeat, so a host thread spinning in a driver call outside any
op (it burns CPU, runs no bytecode) and a polling loop (bytecode, no CPU) are both hangs, while Python that
computes is not. Non-Python commands have neither log nor heartbeat: progress is the CPU time of the main
threads of the process tree, or new output. The verdict is computed from what was observed
(`gpulab.hang.verdict.judge`). Here: the watch loop (the stall rule is liveness.wait's), the job folder's
bounds, signals passed on and the end; how the command starts is gpulab.hang.watchdog.launch, the evidence and its
judging gpulab.hang.watchdog.evidence, the captures of --on-stall keep gpulab.hang.watchdog.keepstall.

For a job that runs for days: no timeout unless asked for; the job's output shown live with a bounded tail
kept in OUT (gpulab.tee); OUT/status.json rewritten every few seconds (gpulab.hang.watchdog.status); the job
folder and the watchdog's memory bounded (ended processes' files beyond the latest few go); a signal passed on
to the job, which gets a grace period to end by itself; and with --on-stall keep, each stall captured into its
own folder while the watch goes on, judged as a usual pause or not (gpulab.hang.watchdog.stalls).

    gpulab watch [--stall S] [--timeout S] [--on-stall stop|keep] [--grace S] [--json FILE] [--mode M]
                 [--fault SPEC] -- COMMAND [ARGS...]

Exit codes: the job's own when it ended by itself (0 ok, its exit status, 128+N when signal N ended it), 3
hang, 5 timeout, 2 bad usage, 127 command not found, 128+N when a signal N stopped the watchdog (passed on to
the job first).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from gpulab import lastwords, proc, tee, trace, workloads
from gpulab.args import BadInput, json_target, parser, positive, split_command, writable_dir
from gpulab.hang import classify, faults
from gpulab.hang.watchdog import evidence, keepstall, stalls
from gpulab.hang.jobs import job, jobread
from gpulab.hang.watchdog import status as status_mod
from gpulab.hang import eagerrun, memcheck, owner
from gpulab.hang.watchdog.launch import (FIXES_VAR, Launch, check_command, launch_plan, plain_env,  # noqa: F401 - watch's
                                program_sources, python_command)                        # names, as before
from gpulab.hang.verdict import EXIT_CODES, Verdict
from gpulab.report import write_json
from gpulab.trace import firstnan, follow, liveness
from gpulab.trace.liveness import POLL_S, STALL_S, Progress  # noqa: F401 - watch.Progress, as before
from gpulab.trace.run import keep_followed, keep_recorded

MODES = trace.MODES
ON_STALL = ("stop", "keep")
GRACE_S = 30.0           # the CLI's wait for a job that was passed a signal
KEEP_ENDED = 8           # ended processes whose files stay in the job folder: the latest ones
PRUNE_EVERY_S = 2.0      # ended processes pruned this often: DataLoader workers of short epochs pile up between prunes
# what to do about a NaN the program printed outside stats mode, which reads no values
STATS_HINT = ("rerun it as `gpulab watch --mode stats -- COMMAND`, which names the op that made the first one, its "
              "line, pass and cause")


# ------------------------------------------------------------------------------------ progress

def _tracker(child: proc.Child, launch: Launch) -> Any:
    """liveness's judge of the child (a JobProgress when the command's processes are followed)."""
    tracker: Any = Progress(child.pid, launch.log if launch.recorded else None, launch.beat,
                            (launch.stdout, launch.stderr))
    if launch.procs.is_dir():
        tracker = liveness.JobProgress(tracker, launch.procs)
    return tracker


def _poll(child: proc.Child, tracker: Any, stall_s: float, deadline: float | None,
          beat: Callable[[float | None], None]) -> tuple[str | None, float | None]:
    """liveness.wait (the stall rule), with the status file, the job folder's bounds and a signal served
    between polls by `beat`: (None, None) when the child ended, ('hang', monotonic time of the last strong
    progress) or ('timeout', None). The window starts now (again after a stall the job recovered from)."""
    t0 = time.monotonic()
    stopped, strong = liveness.wait(child, tracker, stall_s=stall_s, t0=t0, poll_s=POLL_S, each_poll=beat,
                                    timeout_s=None if deadline is None else deadline - t0)
    return stopped, None if strong is None else t0 + strong


def _recovered(child: proc.Child, tracker: Any, deadline: float | None,
               beat: Callable[[float | None], None]) -> float | None:
    """After a stall captured under --on-stall keep: when the job progressed again (strong progress: ops
    completing, Python working), or None when it ended or ran out of time first."""
    while child.poll() is None:
        now = time.monotonic()
        if tracker.advanced() == liveness.STRONG:
            return now
        if deadline is not None and now > deadline:
            return None
        beat(None)
        time.sleep(POLL_S)
    return None


# ------------------------------------------------------------------------------------ bounds over days

def _prune(procs: Path, tracker: Any, shrunk: set[int], keep_ended: int = KEEP_ENDED) -> None:
    """Bound the job folder and the watchdog's memory whatever the job's length: an ended process's op log is
    cut to what it recorded (once: `shrunk` remembers which); beyond the latest `keep_ended` ended processes
    (DataLoader workers started again every epoch), the oldest ones' files go, and the tracker forgets them."""
    metas = follow.metas(procs)
    ended = sorted((m.get("started") or 0, pid) for pid, m in metas.items()
                   if not m.get("root") and not jobread.live(pid))
    cut = max(0, len(ended) - keep_ended)
    for _, pid in ended[cut:]:
        log = follow.files(procs, pid)["log"]
        if pid not in shrunk and log.exists():
            keep_recorded(log)
            shrunk.add(pid)
    gone = {str(pid) for _, pid in ended[:cut]}
    # one listing, matched by name: a glob per pid compiles a pattern per pid, and pathlib's and re's caches
    # keep the latest hundreds of them, each one new memory, churned for days
    try:
        names = os.listdir(procs) if gone else []
    except OSError:
        names = []
    for name in names:
        if name.split(".", 1)[0] in gone:
            with contextlib.suppress(OSError):
                os.unlink(procs / name)
    for _, pid in ended[:cut]:
        shrunk.discard(pid)
        if hasattr(tracker, "forget"):
            tracker.forget(pid)


# ------------------------------------------------------------------------------------ the watchdog

def _exit_code_of(rc: int | None) -> int:
    """The job's code as a shell gives it: its exit status, or 128+N when signal N ended it."""
    if rc is None:
        return 1
    return 128 - rc if rc < 0 else rc


def run(command: Sequence[str], *, stall_s: float = STALL_S, timeout_s: float | None = None, record: bool = True,
        mode: str = "auto", fault: str | None = None, out_dir: str | os.PathLike | None = None,
        capture_gpu: bool | str = "auto", cuda_gdb: bool = False, coredump: bool = False,
        env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
        tail: int = 20, native_tools: tuple[str, ...] = ("py-spy", "gdb"), progress: Any = None,
        fixes: Sequence[str] = (), stacks: bool = True,
        finish: Callable[[Verdict, str | None], Verdict] | None = None, on_stall: str = "stop",
        grace_s: float = 0.0, echo: bool = False, keep_output: int | None = None, status: bool = False,
        status_every_s: float = status_mod.EVERY_S, say_every_s: float = 0.0, stdin: int | None = None) -> Verdict:
    """Run COMMAND under the watchdog and return the verdict (also written to out_dir/verdict.json).
    `log` paths in the verdict are relative to out_dir (`Verdict.log['dir']` is out_dir itself).
    stacks=False skips the stacks and the GPU view on a hang (a bisection probe needs only the outcome
    and the op log; gdb alone can take seconds). `finish(verdict, device)` amends the verdict before it is
    saved: how a caller above gpulab.hang adds what the watchdog cannot know (the fixes to try:
    gpulab.fixes.suggest.with_suggestions). `fixes` only labels the run: `env` must carry them.

    For a job that runs for days: timeout_s None (no bound; the stall window judges it); on_stall 'keep'
    captures each stall into captures/NN/ and goes on watching (the verdict's `stalls` lists them);
    grace_s > 0 passes SIGINT/SIGTERM/SIGHUP on to the job and waits that long for it to end (it may
    checkpoint) before stopping it; echo shows the job's output live on this process's stdout/stderr and
    keep_output bounds OUT/stdout.txt and stderr.txt to their last bytes (gpulab.tee); status rewrites
    OUT/status.json every status_every_s seconds (a line on stderr every say_every_s, 0: never). stdin: a file
    descriptor the job reads (gpulab watch passes its terminal on), else /dev/null, as a batch job's; a job
    that waits for a line from a terminal (pdb, input()) is paused for its user, not stalled."""
    command = [str(c) for c in command]
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not valid; choose one of {', '.join(MODES)}")
    if not (stall_s > 0 and (timeout_s is None or timeout_s > 0)):
        raise ValueError(f"stall_s={stall_s!r} and timeout_s={timeout_s!r} must both be > 0 (timeout_s None: no bound)")
    if capture_gpu not in (True, False, "auto"):
        raise ValueError(f"capture_gpu={capture_gpu!r}; choose True, False or 'auto'")
    if on_stall not in ON_STALL:
        raise ValueError(f"on_stall={on_stall!r} is not valid; choose one of {', '.join(ON_STALL)}")
    if grace_s < 0:
        raise ValueError(f"grace_s={grace_s!r} must be >= 0 seconds")
    spec = faults.parse(fault)
    check_command(command, cwd)
    out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="gpulab-watch-"))
    out.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda msg: print(f"[gpulab watch] {msg}", file=sys.stderr, flush=True))
    launch = launch_plan(command, out, record=record, mode=mode, fault=spec, env=env, coredump=coredump,
                         fixes=fixes)
    for p in (launch.log, launch.faulthandler, launch.beat, out / "status.json"):
        if p.exists():
            p.unlink()
    shutil.rmtree(out / "captures", ignore_errors=True)
    bound = f"timeout {timeout_s:g} s" if timeout_s else "no timeout"
    say(f"running {' '.join(launch.argv)}  (stall {stall_s:g} s, {bound}, on stall: {on_stall}, out {out})")
    t0 = time.monotonic()
    deadline = t0 + timeout_s if timeout_s else None
    tees: list[tee.Tee] = []
    if echo or keep_output:
        keep = keep_output or tee.KEEP_BYTES
        tees = [tee.Tee(launch.stdout, 1 if echo else None, keep, name="stdout"),
                tee.Tee(launch.stderr, 2 if echo else None, keep, name="stderr")]
    found = stalls.Seen()
    interrupted: dict | None = None
    writer = None
    seen: evidence.Seen | None = None
    stalled: str | None = None
    hang_started: float | None = None
    try:
        with proc.Child(launch.argv, stdout=tees[0].fd if tees else launch.stdout,
                        stderr=tees[1].fd if tees else launch.stderr, env=launch.env, cwd=cwd, stdin=stdin,
                        label="watched") as child:
            try:   # from the job's start: a signal that comes before the first poll is passed on too
                for t in tees:
                    t.started()
                tracker = _tracker(child, launch)
                if status:
                    writer = status_mod.Writer(out, lambda: status_mod.job_processes(
                        child.pid, launch.log if launch.recorded else None,
                        launch.procs if launch.procs.is_dir() else None), say, status_every_s, say_every_s).start()
                pruned, shrunk = [time.monotonic()], set()

                def beat(last: float | None, phase: str = "running") -> None:
                    now = time.monotonic()
                    if writer is not None and (last is None or now - getattr(beat, "t", 0.0) >= 1.0):
                        beat.t = now   # type: ignore[attr-defined]
                        by = dict(getattr(tracker, "last", {}) or {})
                        if last is not None:
                            by.setdefault(child.pid, last)
                        writer.update(status_mod.State(
                            phase="stalled" if last is None else phase, t0=t0, last=last, last_by_pid=by,
                            stalls=found.count, recovered=found.recovered,
                            note=found.last["where"] if found.last and not found.last["recovered"] else ""))
                    if launch.procs.is_dir() and now - pruned[0] > PRUNE_EVERY_S:
                        pruned[0] = now
                        _prune(launch.procs, tracker, shrunk)

                while True:
                    stalled, hang_started = _poll(child, tracker, stall_s, deadline, beat)
                    if stalled == "hang" and stdin is not None and _asks(child, say, stall_s):
                        if _recovered(child, tracker, deadline, beat) is not None:
                            continue   # the user answered: watched again from here
                        stalled = None if child.poll() is not None else "timeout"
                        break
                    if stalled == "hang":
                        say(f"no progress for {stall_s:g} s: capturing evidence")
                    elif stalled == "timeout":
                        say(f"timeout after {timeout_s:g} s: capturing evidence")
                    if stalled != "hang" or on_stall == "stop":
                        break
                    n = found.count + 1
                    cap = out / "captures" / f"{n:02d}"
                    if writer is not None:
                        writer.update(dataclasses.replace(writer.state, phase="capturing"), now=True)
                    rec = found.add(keepstall.apart(functools.partial(
                        evidence.keep_capture, child, launch, tracker, cap, command=command, t0=t0,
                        hang_started=hang_started, stall_s=stall_s, timeout_s=timeout_s, mode=mode, spec=spec,
                        tail=tail, stacks=stacks, capture_gpu=capture_gpu, cuda_gdb=cuda_gdb, coredump=coredump,
                        native_tools=native_tools)))
                    keepstall.thin_captures(out / "captures")
                    say(f"stall {n} captured in {cap} ({rec['where']}; "
                        f"{rec['pause']['kind'] or 'no usual pause'}): watching on")
                    keepstall.release()
                    back = _recovered(child, tracker, deadline, beat)
                    rec["for_s"] = round((back or time.monotonic()) - hang_started, 3)
                    if back is None:
                        break
                    found.recover(rec)
                    keepstall.lighten(cap, rec)
                    say(f"stall {n} recovered after {rec['for_s']:.1f} s")
                    if child.poll() is not None:
                        break
                if on_stall == "keep" and child.poll() is not None:
                    stalled = None   # it ended by itself, after its stalls: judged by how it ended
                if stalled:   # a hang (stop, or keep's stall that outlasted the timeout) or a timeout
                    seen = evidence.take(child, launch, tracker, launch.procs, stacks=stacks, capture_gpu=capture_gpu,
                                         cuda_gdb=cuda_gdb, coredump=coredump, native_tools=native_tools)
            except proc.Interrupted as exc:
                if not grace_s:
                    raise
                if found.last and found.last["for_s"] is None:   # the signal came while a stall went on
                    found.last["for_s"] = round(time.monotonic() - (hang_started or t0), 3)
                interrupted = _pass_on(child, exc, grace_s, say)
                stalled = None
            if seen is None:   # ended by itself (or passed a signal): the op log as it was left
                snap, notes = evidence.read_log(launch)
                seen = evidence.Seen({}, None, snap, tuple(notes))
            left = child.stop()
    finally:
        kept = [t.close() for t in tees]
        if writer is not None:
            writer.stop(dataclasses.replace(writer.state, phase="ended", stalls=found.count,
                                            recovered=found.recovered, note=""))
    return _finish(command, launch, seen, child, out, t0=t0, stalled=stalled, hang_started=hang_started,
                   stall_s=stall_s, timeout_s=timeout_s, mode=mode, spec=spec, left=left, tail=tail,
                   found=found, interrupted=interrupted, kept=kept, finish=finish, say=say)


def _asks(child: proc.Child, say: Callable[[str], None], stall_s: float) -> bool:
    """A stall where a process of the job waits for a line from the terminal passed to it: said, and True."""
    waiting = sorted(p for p in child.members() if liveness.reading_terminal(p))
    if waiting:
        say(f"no progress for {stall_s:g} s: process {waiting[0]} waits for input from the terminal (pdb, input()); "
            f"not a hang: watching on")
    return bool(waiting)


def _pass_on(child: proc.Child, exc: proc.Interrupted, grace_s: float, say: Callable[[str], None]) -> dict:
    """A signal to the watchdog goes to the job's main process, which gets grace_s seconds to end (it may write
    a checkpoint); a second signal meanwhile is not waited for."""
    say(f"{exc.name}: passed on to the job; waiting up to {grace_s:g} s for it to end")
    with contextlib.suppress(ProcessLookupError, PermissionError):
        # the job's main process only, as `kill PID` or a container stop does: it decides how its helpers end
        # (a DataLoader worker that got it too would die under the main process's checkpoint)
        os.kill(child.pid, exc.signum)
    rc = child.wait(grace_s)
    ended = rc is not None
    say(f"the job ended with {'exit code ' + str(rc) if rc is not None and rc >= 0 else 'signal ' + str(-rc)}"
        if ended else f"the job did not end within {grace_s:g} s: stopping it")
    return {"signal": exc.name, "signum": exc.signum, "passed_to_job": True, "grace_s": grace_s,
            "job_ended": ended}


def _finish(command: Sequence[str], launch: Launch, seen: evidence.Seen, child: proc.Child, out: Path, *, t0: float,
            stalled: str | None, hang_started: float | None, stall_s: float, timeout_s: float | None, mode: str,
            spec: Any, left: tuple, tail: int, found: stalls.Seen, interrupted: dict | None, kept: list,
            finish: Callable[[Verdict, str | None], Verdict] | None, say: Callable[[str], None]) -> Verdict:
    rc = child.returncode
    if launch.recorded:
        keep_recorded(launch.log)   # the finished op log cut to what was recorded (gpulab.trace.ring.shrink)
    followed = keep_followed(launch.procs) if launch.procs.is_dir() else []
    ended_by_us = interrupted is not None and not interrupted["job_ended"]
    status = stalled or ("ok" if rc == 0 else ("crash" if rc is not None and rc < 0 else "error"))
    if ended_by_us:
        status = "crash"   # judged as the kill it was; relabelled below
    py_text = seen.caps["python"].text if "python" in seen.caps else ""
    if status == "crash" and launch.faulthandler.exists() and not ended_by_us:
        py_text = launch.faulthandler.read_text(errors="replace")
    v = evidence.judge_seen(command, launch, seen, status=status, rc=rc, t0=t0, hang_started=hang_started,
                            stall_s=stall_s, timeout_s=timeout_s, mode=mode, spec=spec, pid=child.pid, left=left,
                            tail=tail, py_text=py_text)
    jobbed = seen.jobbed
    if jobbed is None and status != "ok" and followed:   # ended by itself: who ended how
        views = jobread.views(launch.procs, {})
        jobbed = (views, job.analyse(views), {})
    if jobbed is not None:
        v = evidence.with_job(v, launch.procs, child.pid, *jobbed, stderr=evidence.tail_of(launch.stderr, 200_000))
    extra: list[str] = []
    for s in found.items:
        extra.append(f"stall at {s['t']:.1f} s for {s['for_s']:.1f} s (the capture took {s.get('capture_s') or 0:.1f} "
                     f"s of it) at {s['where']}: " + ("recovered" if s["recovered"] else "never recovered")
                     + f" ({s['pause']['why']})")
    if found.last:
        extra.append(found.last["window"])
    if found.count > len(found.items):
        extra.append(f"{found.count} stalls in all ({found.recovered} recovered); the first and the latest "
                     f"{stalls.MAX_KEPT // 2} are listed")
    for k in kept:
        if k.written > k.kept:
            extra.append(f"{Path(k.path).name} keeps the last {k.kept} of the {k.written} bytes the job wrote")
    changes: dict = {"stalls": tuple(found.items), "interrupted": interrupted}
    if interrupted is not None:
        extra.append(f"gpulab watch got {interrupted['signal']} and passed it to the job; "
                     + (f"the job ended by itself within {interrupted['grace_s']:g} s" if interrupted["job_ended"]
                        else f"the job did not end within {interrupted['grace_s']:g} s and was stopped"))
        if ended_by_us:
            changes.update(status="interrupted", signal=None, cls=None)
    nan = first_nonfinite(launch) if mode == "stats" else None
    if nan and nan.get("caught_by"):   # a GradScaler's overflow, caught: said, and no fault
        extra.append(f"NaN/Inf: none that the GradScaler did not catch: {nan['sentence']}")
    elif nan:
        extra.append(f"first NaN/Inf: {nan['sentence']}")
        changes["first_nonfinite"] = nan
    printed = lastwords.nonfinite(evidence.tail_of(launch.stdout, 200_000)) if mode != "stats" else ""
    if printed:
        extra.append(f"the program printed a NaN or an infinity ({printed!r}); this mode reads no values: {STATS_HINT}")
        changes["printed_nonfinite"] = printed
    v = dataclasses.replace(v, evidence=tuple(v.evidence) + tuple(extra), **changes)
    if v.status not in ("ok", "interrupted"):   # whose bug, on all that was gathered (the job's finding too)
        v = _attributed(v, command, launch, out, timeout_s=min(timeout_s or memcheck.TIMEOUT_S, memcheck.TIMEOUT_S),
                        say=say)
    v = dataclasses.replace(v, log={"dir": str(out), **evidence.products(launch, v)})
    if finish is not None:
        v = finish(v, log_device(launch.log if launch.recorded else None))
    write_json(out / "verdict.json", v.to_dict())
    say(f"{v.status}" + (f" ({v.cls})" if v.cls else "") + (f" in {v.in_flight_op['name']}" if v.in_flight_op
                                                            else "") + f"; verdict {out / 'verdict.json'}")
    return v


def first_nonfinite(launch: Launch) -> dict | None:
    """The run's first NaN/Inf (stats mode writes it beside each process's op log) in the verdict's words; in a
    job, the process where an op made it (gpulab.trace.firstnan.first_of_job) and its rank. None when none."""
    logs = [launch.log] if launch.recorded else []
    if launch.procs.is_dir():
        logs += sorted(launch.procs.glob("*.log"))
    got = firstnan.first_of_job(logs)
    if got is None:
        return None
    log, rec = got
    firstnan.note_end(log)   # how the run went on after it, there and in the job's other processes
    firstnan.note_job(log, logs)
    rec = firstnan.read(log) or rec
    meta = follow.metas(launch.procs).get(int(log.stem)) if log.parent == launch.procs and log.stem.isdigit() else None
    rank, worker = (meta or {}).get("rank"), (meta or {}).get("worker")
    cause = rec.get("cause") or {}
    who = (f"rank {rank}: " if rank is not None else "") + (
        f"DataLoader worker {worker} of {meta.get('workers', '?')} (its passes count that worker's calls): "
        if worker is not None else "")
    return {"op": rec.get("op"), "call_site": rec.get("call_site"), "pass": rec.get("pass"),
            "backward": bool(rec.get("backward")), "cause": cause.get("words"), "rank": rank, "worker": worker,
            "sentence": who + firstnan.sentence(rec), "next_step": firstnan.next_step(rec),
            "caught_by": rec.get("caught_by"), "lasted": firstnan.lasted(rec)}


def exit_code(v: Verdict) -> int:
    """gpulab watch's exit code: the job's own when it ended by itself (128+N for signal N, as a shell says),
    3 hang, 5 timeout, 128+N when a signal N to the watchdog ended the job."""
    if v.status == "interrupted":
        return 128 + int((v.interrupted or {}).get("signum") or 15)
    if v.status in ("ok", "error", "crash"):
        return _exit_code_of(v.exit_code) if v.status != "ok" else 0
    return EXIT_CODES.get(v.status, 1)


def _attributed(v: Verdict, command: Sequence[str], launch: Launch, out: Path, *, timeout_s: float,
                say: Callable[[str], None]) -> Verdict:
    """The verdict with its owner decided on everything gathered (the program's sources, where they register
    custom ops and define kernels; the job's finding) and, for a GPU memory fault, what one bounded memcheck
    run of the program (without the recorder) said. Relative paths are this process's: as the child's."""
    registered = owner.registrations(program_sources(command))
    device = str((v.in_flight_op or {}).get("device") or "")
    mc = None
    if v.cls == "gpu_page_fault":
        mc = memcheck.Report(False, note=memcheck.ROCM_NOTE)
    elif memcheck.applies(v.cls, v.status) and not device.startswith("cpu"):
        say(f"{v.cls}: one compute-sanitizer memcheck run of the program (at most {timeout_s:g} s)")
        mc = memcheck.run(_plain(command, launch), out, timeout_s=timeout_s, env=plain_env(launch.env))
    d = v.to_dict()
    evidence = tuple(v.evidence)
    if mc is not None:
        d["memcheck"] = mc.to_dict()
        evidence += tuple(mc.facts())
    if eagerrun.applies(d, launch.env):
        where = eagerrun.region(d)
        say(f"{v.cls or 'a crash'} inside {where}: the program once more eager, to name the op (TORCHDYNAMO_DISABLE=1, "
            f"at most {timeout_s:g} s)")
        er = eagerrun.run(_plain(command, launch), out, env=plain_env(launch.env), timeout_s=timeout_s)
        d["eager_rerun"] = er.to_dict()
        evidence += tuple(er.facts(where))
        if d.get("class") in (None, "", "unknown") and er.cls:   # what the compiled run's end could not say
            d["class"] = er.cls
            evidence += (f"class {er.cls}: from the eager rerun's error (the compiled run's end named none)",)
    who = owner.decide(d, registered)
    said = f"whose code: {who.kind}" + (f", {who.where}" if who.where else "") + f" ({who.why})"
    return dataclasses.replace(v, cls=d.get("class"), owner=who.to_dict(), memcheck=d.get("memcheck"),
                               eager_rerun=d.get("eager_rerun"), evidence=evidence + (said,))


def _plain(command: Sequence[str], launch: Launch) -> list[str]:
    """The program's command as it runs without gpulab (its interpreter, not the recorder's bootstrap)."""
    pyc = python_command(command)
    return [workloads.fix_interpreter(pyc[0], launch.env.get(workloads.PYTHON_ENV)), *pyc[1], *pyc[2]] \
        if pyc else list(command)


def log_device(log: str | os.PathLike | None) -> str | None:
    """Where a recorded program ran, from its op log (None when unknown): only a hint, never an error."""
    try:
        return trace.read_device(Path(log)) if log and Path(log).exists() else None
    except Exception:  # noqa: BLE001 - only a hint of where the program ran
        return None


# ------------------------------------------------------------------------------------ CLI

def _parser():
    p = parser("gpulab watch", "Run COMMAND under the hang watchdog and write a verdict JSON (status, phase, "
               "class, in-flight op, stacks, evidence). The job's output reaches this terminal live (OUT keeps its "
               "last bytes), OUT/status.json is rewritten every few seconds, and a signal to gpulab is passed on "
               "to the job. Exit codes: the job's own (0 ok, its exit status, 128+N when signal N ended it), 3 "
               "hang, 5 timeout, 2 bad usage, 127 command not found, 128+N stopped by signal N.",
               "gpulab watch --stall 120 --on-stall keep --out run1 -- python train.py --lr 1e-4")
    p.add_argument("--stall", type=positive("--stall"), default=STALL_S, metavar="S",
                   help="no progress for S seconds is a stall (default %(default)g)")
    p.add_argument("--timeout", type=positive("--timeout"), default=None, metavar="S",
                   help="bound on the whole run (default: none; the stall window judges the job)")
    p.add_argument("--on-stall", default="stop", choices=ON_STALL,
                   help="stop: capture the evidence and stop the job (a hang); keep: capture it into "
                        "OUT/captures/NN/ and go on watching (a stall that recovers is listed in the verdict)")
    p.add_argument("--grace", type=positive("--grace"), default=GRACE_S, metavar="S",
                   help="after SIGTERM/SIGINT/SIGHUP, passed on to the job: seconds it gets to end by itself")
    p.add_argument("--status-every", type=float, default=status_mod.SAY_EVERY_S, metavar="S",
                   help="a status line on stderr every S seconds (0: none); OUT/status.json is rewritten every "
                        f"{status_mod.EVERY_S:g} s regardless")
    p.add_argument("--keep-output", type=positive("--keep-output"), default=tee.KEEP_BYTES / 2**20, metavar="MB",
                   help="OUT/stdout.txt and stderr.txt keep the job's last MB megabytes each (default %(default)g)")
    p.add_argument("--quiet", action="store_true", help="do not show the job's output here (OUT keeps its tail)")
    p.add_argument("--no-input", action="store_true",
                   help="give the job no standard input (/dev/null, as a batch job) even from a terminal; by default "
                        "a terminal is passed on, so pdb and input() work, and a job waiting on it is no hang")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the verdict here")
    p.add_argument("--out", type=Path, default=None, metavar="DIR", help="products folder (default: a new temp dir)")
    p.add_argument("--mode", default="auto", choices=MODES, help="op recording mode of gpulab.trace (auto: ops, plus GPU completion tracking once CUDA is up; "
                   "stats: also each op's output statistics, and the first NaN/Inf with its op, line, pass and cause)")
    p.add_argument("--fault", default=None, metavar="SPEC", help="plant a real fault (a self-test; see gpulab.hang.faults)")
    p.add_argument("--no-record", action="store_true", help="run a Python command as is (no op log)")
    p.add_argument("--cuda-gdb", action="store_true", help="attach cuda-gdb on a hang (~12 s, pauses the process)")
    p.add_argument("--coredump", action="store_true", help="enable and trigger a CUDA user core dump on a hang")
    p.add_argument("command", nargs="*", help="-- COMMAND [ARGS...]")
    return p


def _terminal() -> int | None:
    """This process's standard input when it is a terminal (a person at it), else None."""
    try:
        return sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    except (OSError, ValueError):
        return None


def main(argv: Sequence[str] | None = None,
         finish: Callable[[Verdict, str | None], Verdict] | None = None) -> int:
    """`gpulab watch` without the fix suggestions; the command itself is gpulab.fixes.commands.watch_main,
    which passes `finish` (gpulab.hang cannot import gpulab.fixes)."""
    raw = list(sys.argv[1:] if argv is None else argv)
    opts, command = split_command(raw)
    args = _parser().parse_args(opts)
    command = command or list(args.command)
    if not command:
        print("gpulab watch: give the command after '--', e.g. gpulab watch --stall 30 -- python train.py",
              file=sys.stderr)
        return proc.EXIT_BAD_INPUT
    if args.status_every < 0:
        print(f"gpulab watch: --status-every {args.status_every:g} is not valid; it must be >= 0 seconds "
              f"(0: no status line)", file=sys.stderr)
        return proc.EXIT_BAD_INPUT
    try:
        json_target(args.json)
        if args.out:
            writable_dir(args.out, "--out")
        v = run(command, stall_s=args.stall, timeout_s=args.timeout, record=not args.no_record, mode=args.mode,
                fault=args.fault, out_dir=args.out, cuda_gdb=args.cuda_gdb, coredump=args.coredump,
                finish=finish, on_stall=args.on_stall, grace_s=args.grace, echo=not args.quiet,
                keep_output=int(args.keep_output * 2**20), status=True, say_every_s=args.status_every,
                stdin=_terminal() if not args.no_input else None)
    except proc.CommandNotFound as exc:
        print(f"gpulab watch: {exc}", file=sys.stderr)
        return proc.EXIT_NOT_FOUND
    except (ValueError, FileNotFoundError, BadInput, faults.FaultSpecError) as exc:
        print(f"gpulab watch: {exc}", file=sys.stderr)
        return proc.EXIT_BAD_INPUT
    if args.json:
        write_json(args.json, v.to_dict())
    op = v.in_flight_op
    print(f"status {v.status}  phase {v.phase}  class {v.cls}  in-flight {op['name'] if op else None}"
          + (f" at {op['call_site']}" if op and op.get('call_site') else "")
          + (f"  host blocked in {v.host_blocked_in['name']}" if v.host_blocked_in else "")
          + (f"  process {v.culprit}" if v.culprit else "")
          + (f"  collective {v.divergence['op']} (group {v.divergence['group']}, seq {v.divergence['seq']})"
             if v.divergence else "")
          + (f"  stalls {len(v.stalls)} ({sum(1 for s in v.stalls if s.get('recovered'))} recovered)"
             if v.stalls else "")
          + (f"  SELF-TEST (planted {v.planted})" if v.planted else ""))
    for fact in v.evidence:
        print(f"  - {fact}")
    # the chain's own next step (gpulab.chain.verdict): a failure of the program's training loop names its remedy
    step = classify.program_cause(v.cls, v.culprit, v.processes, v.owner) or owner.next_step(v.owner)
    if not step and v.first_nonfinite:
        step = v.first_nonfinite["next_step"]
    if not step and v.printed_nonfinite:
        step = f"find where the NaN/Inf the program printed starts: {STATS_HINT}"
    if step:
        print(f"next step: {step}")
    print(Path(v.log["dir"]) / v.log["verdict"])
    code = exit_code(v)
    if v.interrupted:   # the last line says what the signal did, as for every other command
        print(f"gpulab watch: interrupted by {v.interrupted['signal']}; passed to the job, which "
              + ("ended by itself" if v.interrupted["job_ended"] else "was stopped after the grace period")
              + f"; every child process was stopped; exit {code}", file=sys.stderr, flush=True)
    return code


# ------------------------------------------------------------------------------------ the workload

def resolve_fault(fault: str | None) -> str | None:
    """The notebooks' `fault` parameter: 'none' (the default: the workload runs as it is) or a fault spec,
    which makes the run a labelled self-test of the watchdog."""
    fs = faults.parse(fault)
    return str(fs) if fs else None


def watch_workload(cfg: Any, *, out_dir: str | os.PathLike, stall_s: float, timeout_s: float,
                   trace_mode: str = "auto", fault: str | None = None, **kw: Any) -> Verdict:
    """Run the notebooks' workload (a WorkloadConfig: builtin, module:callable or script:...) under the watchdog."""
    return run(workloads.command(cfg), stall_s=stall_s, timeout_s=timeout_s, mode=trace_mode,
               fault=resolve_fault(fault), out_dir=out_dir, **kw)
