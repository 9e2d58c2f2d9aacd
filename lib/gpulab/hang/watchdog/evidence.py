"""The evidence of a stall, taken while the child is still stuck, and judged: its stacks (every process's at once
for a job), the GPU's view, the op log as the stall left it (`take` -> `Seen`), the verdict over them
(`judge_seen`), a job's finding folded in (`with_job`), the products beside it; and under --on-stall keep one
stall's whole capture into its own folder (`keep_capture`), the job left running."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpulab import lastwords, proc, trace
from gpulab.hang import capture, classify, collate, faults, memtrend, owner
from gpulab.hang.jobs import job, jobread
from gpulab.hang.watchdog import stalls
from gpulab.hang.watchdog.launch import Launch
from gpulab.hang.verdict import Observation, Verdict, judge, op_dict, oplog_line
from gpulab.report import write_json, write_text
from gpulab.trace import follow
from gpulab.trace.run import keep_recorded

STDERR_TAIL_CHARS = 4000


def job_capture(launch: Launch, tracker: Any, root_pid: int, root_python: str, native_tools: Sequence[str],
                stacks: bool, dest: Path, t_stall: float, paused: bool = False) -> tuple[list, Any, dict]:
    """Every followed process's Python stacks (at once), the views, the cross-process finding, and the
    native stacks of the process the finding names; each process's op-log tail written (into `dest`) from the
    same read. Before the stop: the processes are still stuck. t_stall (monotonic): when the stall was seen,
    what each process's last progress is counted back from (not the end of this capture: asking a rank that
    holds the GIL waits out its timeout)."""
    left = jobread.read_job(launch.procs, ask=True)   # the ranks' own collective numbers, while stuck
    metas = {pid: lf.meta for pid, lf in left.items()}
    pythons = {pid: c.text for pid, c in jobread.capture_python(launch.procs, metas, paused=paused).items()} if stacks else {}
    if root_python and not pythons.get(root_pid):
        pythons[root_pid] = root_python
    views = jobread.views(launch.procs, pythons, getattr(tracker, "last", None), now=t_stall, left=left)
    jobread.write_tails(dest, left)
    finding = job.analyse(views)
    natives: dict = {}
    culprit = next((p for p in views if p.role == finding.culprit), None)
    if stacks and culprit is not None and culprit.pid != root_pid:
        natives = {pid: c.text for pid, c in jobread.capture_native([culprit.pid], native_tools).items()}
    return views, finding, {"python": pythons, "native": natives}


def _native_facts(procs: Path, pid: int, natives: Mapping[int, str]) -> dict:
    """What a process's native stack says its main thread is inside (a library's code: 'OpenMP (libgomp)'), and
    how it was started (fork, spawn, exec): a child forked from a parent that had run OpenMP's thread pool waits
    in that pool for threads fork did not copy (gpulab.hang.owner); one that waits alone for a lock waits for a
    lock fork copied held (gpulab.hang.classify.lock_alone)."""
    text = natives.get(pid)
    if not text:
        return {}
    threads = capture.parse_native(text, pid)
    lib = owner.native_library(threads)
    try:
        how = json.loads(follow.files(procs, pid)["meta"].read_text()).get("how")
    except (OSError, ValueError):
        how = None
    return {"native_lib": lib[1] if lib and lib[0] == "library" else None, "started_by": how,
            "lock_alone": classify.lock_alone(threads), "writing": classify.blocked_writing(threads)}


def with_job(v: Verdict, procs: Path, root: int, views: list, finding: Any, stacks: Mapping[str, dict],
             stderr: str = "") -> Verdict:
    """The verdict of a job: the finding's class, culprit and evidence first, the per-process table, and every
    process's stacks as files in the job folder `procs`. A job that ended in an error is judged by the rank whose
    own exception ended it (`stderr`: the job's, where its traceback is), not by the launcher's last words."""
    for kind, by_pid in stacks.items():
        for pid, text in by_pid.items():
            if text:
                write_text(procs / f"{pid}.stacks_{kind}.txt", text)
    rows = []
    for row in finding.processes:
        files = {k: f"procs/{row['pid']}.stacks_{k}.txt" for k in stacks if stacks[k].get(row["pid"])}
        rows.append({**row, "stacks": files, **_native_facts(procs, row["pid"], stacks.get("native", {}))})
    culprit = next((p for p in views if p.role == finding.culprit), None)
    plain = json.loads(json.dumps(finding.to_dict()))   # as verdict.json holds it (lists, not tuples)
    changes: dict = {"processes": tuple(rows), "culprit": finding.culprit,
                     "divergence": plain["divergence"]}
    if any(p.ops_completed or p.collectives for p in views):
        changes["phase"] = "ops"
    who = next((p.role for p in views if p.pid == root), "the process the watchdog started")
    kept = ("the watchdog", "exit code", "planted")
    launcher = any(p.pid == root and p.supervises for p in views)   # where a launcher waits is no finding
    crashed = rank_crash(procs, views, stderr or v.stderr_tail) if v.status == "error" else None
    if crashed is not None:
        role, sig, text, dead = crashed
        frame = next((t for t in capture.parse_python(text) if t.main), None)
        where = f" in {frame.frames[0]}" if frame is not None and frame.frames else ""
        said = (f"{role} died of {sig}{where} (its faulthandler: {classify.brief(text.splitlines()[0], 80)})" if text
                else f"{role} was killed by {sig} first (torchrun's first observed failure), which it cannot catch: "
                     f"it left no traceback")
        killed = _killed_climbing(procs, dead) if sig == "SIGKILL" and not text else None
        if killed is not None:
            changes.update(cls="out_of_memory", memory_trend=killed)
            said = (f"{role} was killed first (torchrun's first observed failure): {memtrend.KILLED}; from {role}'s "
                    f"memory samples: {memtrend.words(killed)}")
    if crashed is not None and finding.cls == "collective_mismatch":
        # ranks that called one collective with other shapes or ops: a backend may die of it (gloo aborts); the
        # mismatch is the cause, the death its consequence
        v = dataclasses.replace(v, evidence=tuple(v.evidence) + (f"{said}, inside the mismatched collective",))
    elif crashed is not None:   # a rank died of a signal: the job crashed there, whatever the launcher's exit
        changes.update(status="crash", signal=sig, culprit=role,
                       stacks={**v.stacks, "python": text},
                       evidence=(said,) + tuple(e for e in v.evidence if e != "no rule matched the evidence")
                       + tuple(finding.evidence))
        return dataclasses.replace(v, **changes)
    if finding.cls is None:
        first = classify.rank_error(rows, stderr or v.stderr_tail) if v.status == "error" else None
        if first is not None:
            role, said = first
            call = classify.call_class(classify.Evidence(status="error", stderr_tail=said))
            # what the launcher's own last words were classed as is no fact of the job's any more
            stale = classify.call_class(classify.Evidence(status=v.status, in_flight_op=v.in_flight_op,
                                                          stderr_tail=v.stderr_tail, localized=v.localized))
            stale = set(stale[1]) if stale else set()
            changes.update(culprit=role, cls=call[0] if call else v.cls,
                           # the failing rank's traceback last: whose code is read from it (gpulab.hang.owner)
                           stderr_tail=(v.stderr_tail[-1000:] + "\n" + said)[-4000:],
                           evidence=(f"{role} failed first, on its own: {lastwords.of(said)}",)
                           + tuple(call[1] if call else ())
                           + tuple(e for e in v.evidence if e not in stale and e != "no rule matched the evidence")
                           + tuple(finding.evidence))
            return dataclasses.replace(v, **changes)
        raised = classify.worker_raised(stderr or v.stderr_tail) if v.status == "error" else None
        died = classify.worker_died(stderr or v.stderr_tail) if v.status == "error" and raised is None else None
        if raised is not None:
            changes.update(worker_error(procs, root, views, raised))
        elif died is not None:
            changes.update(worker_death(procs, views, died))
            if changes.get("evidence"):   # its place is in the evidence now
                v = dataclasses.replace(v, evidence=tuple(e for e in v.evidence if e != classify.WORKER_PLACE_UNSEEN))
        if not launcher or v.status != "hang":
            changes["evidence"] = tuple(changes.get("evidence", ())) + tuple(v.evidence) + tuple(finding.evidence)
            return dataclasses.replace(v, **changes)
        # the process the watchdog started only waits for its ranks (torchrun's agent, mp.spawn's parent): what
        # it is in says nothing of the job, and is never its finding
        why = (f"{who} only waits for the job's processes: what it is in is not the job's finding, and the job's "
               "processes show nothing that explains the stall")
        evidence = tuple(finding.evidence) + tuple(e for e in v.evidence if e.startswith(kept)) + (why,)
        changes.update(cls="unknown", host_blocked_in=None, evidence=evidence)
        return dataclasses.replace(v, **changes)
    # the job's finding first; what the watchdog saw of the process it started (often a launcher that
    # waits for its children) after it, said to be about that process
    own = tuple(e if e.startswith(kept) else f"{who}: {e}" for e in v.evidence
                if e != "no rule matched the evidence" and not e.startswith("status ")
                and not (launcher and not e.startswith(kept)))
    changes.update(cls=finding.cls, evidence=tuple(finding.evidence) + own, host_blocked_in=None)
    if culprit is not None and culprit.open_op:
        changes["in_flight_op"] = {**culprit.open_op, "process": culprit.role}
    return dataclasses.replace(v, **changes)


def worker_error(procs: Path, root: int, views: list, raised: Mapping[str, Any]) -> dict:
    """A DataLoader worker's own exception (classify.worker_raised), read in that worker's op log: the op that
    raised there becomes the in-flight op and the worker the culprit; a batch the default collate could not stack
    is said as such (gpulab.hang.collate). Nothing when the worker or its log is not found."""
    workers = [p for p in views if p.kind == "worker" and p.worker == raised["worker"]]
    view = next((p for p in workers if p.ppid == root), workers[0] if len(workers) == 1 else None)
    records = _records_of(procs, view)
    rec = _raised_for(records, raised["traceback"])
    if rec is None and collate.passes_through(raised["traceback"]):
        rec = collate.unequal_stack(records)
    if rec is None:
        return {}
    got: dict = {"culprit": view.role, "localized": "raised", "in_flight_op": {**op_dict(rec), "process": view.role}}
    found = collate.find(raised["traceback"], records, rec, mine=owner.program_site, worker=view.role)
    if found:
        got.update(collate=found, evidence=(f"from {view.role}'s op log: {collate.words(found)}",))
    return got


def rank_crash(procs: Path, views: list, stderr: str) -> tuple[str, str, str, Any] | None:
    """(role, signal, its faulthandler text, its view) of the job's process that died of a signal, as its own
    faulthandler file says (its view's state): the rank torchrun names as the first observed failure where it names
    one, else the first rank, else any process of the job; else the rank torchrun's first observed failure says a
    signal ended with no faulthandler file (SIGKILL: text ""); None when none did."""
    dead = [p for p in views if str(p.state).startswith(jobread.DIED_OF)]   # jobread.state_of read their files
    if not dead:
        said = classify.root_signal(stderr)
        view = next((p for p in views if p.kind == "rank" and p.rank == said[0]), None) if said else None
        return (view.role, said[1], "", view) if view is not None else None
    root = classify.root_rank(stderr)
    first = (next((p for p in dead if p.rank == root), None) if root is not None else None) \
        or next((p for p in dead if p.kind == "rank"), dead[0])
    return first.role, first.state[len(jobread.DIED_OF):], jobread.fatal_text(procs, first.pid), first


def _killed_climbing(procs: Path, view: Any) -> dict | None:
    """The memory trend of a process killed by SIGKILL, from its own op log, when it climbed through the run (the
    host's out-of-memory killer's mark); None otherwise or without a log."""
    if view is None or not view.log:
        return None
    try:
        return memtrend.climbed(trace.read(procs / view.log).memory)
    except Exception:  # noqa: BLE001 - a torn log says nothing
        return None


def worker_death(procs: Path, views: list, died: Mapping[str, Any]) -> dict:
    """A DataLoader worker that died without a traceback (classify.worker_died), read in its own op log: the op
    it was in (still open) or the last one it finished, with the program's line; nothing when its log is not
    found. Its last op says where it was, not what killed it."""
    pids = {int(p) for p in re.findall(r"\d+", str(died.get("pids") or ""))}
    view = next((p for p in views if p.kind == "worker" and p.pid in pids), None)
    records = _records_of(procs, view)
    if not records:
        return {}
    last = max(records, key=lambda r: r.seq)
    op = {**op_dict(last), "process": view.role}
    still = last.t_end is None
    said = (f"{view.role} (pid {view.pid}) left its op log at {last.name} ({last.call_site}), "
            + ("still running when the worker died" if still else "finished: it died after that op, before its next"))
    return {"culprit": view.role, "evidence": (said,),
            **({"in_flight_op": op} if still else {"last_completed_op": op})}


def _records_of(procs: Path, view: Any) -> Sequence[Any]:
    """One process's op records, read from the job folder at the verdict (empty: no view, no log, or a torn one,
    and the main process's verdict stands)."""
    if view is None or not view.log:
        return ()
    try:
        return trace.read(procs / view.log).records
    except Exception:  # noqa: BLE001 - a torn log
        return ()


def _raised_for(records: Sequence[Any], traceback: str) -> Any:
    """The op a worker's traceback ended in: of the ops its log shows raising (a worker goes on to its next batch
    after one fails, and an op open when the job stops is marked too), the first one that the traceback's last
    line of code calls, else the first one. Where the recorder marks no raised op (torch 2.11's CUDA wheel), the
    ops left open stand in; on the H200 the failed stack was not among them, and worker_error then reads the
    collate's stack of unequal samples (collate.unequal_stack)."""
    raised = [r for r in records if getattr(r, "raised", False)] or [
        r for r in records if getattr(r, "t_end", None) is None and getattr(r, "kind", "op") == "op"]
    code = [ln.strip() for ln in (traceback or "").splitlines()
            if ln.strip() and not ln.lstrip().startswith(("File ", "Traceback", "^", "~"))]
    last = code[-2] if len(code) >= 2 else ""   # the innermost frame's line; the last one is the exception
    for r in raised:
        base = str(r.name).split(".")[1] if str(r.name).count(".") >= 1 else str(r.name)
        if base and f"{base}(" in last:
            return r
    return raised[0] if raised else None


def read_log(launch: Launch) -> tuple[Any, list[str]]:
    """The op log (it survives the child's death); a corrupt one must not lose the rest of the verdict."""
    if not launch.recorded or not launch.log.exists():
        return None, []
    try:
        return trace.read(launch.log), []
    except Exception as exc:  # noqa: BLE001
        return None, [f"op log unreadable: {type(exc).__name__}: {exc}"]


def capture_stacks(child: proc.Child, launch: Launch, *, capture_gpu: bool | str, cuda_gdb: bool, coredump: bool,
                   native_tools: Sequence[str], paused: bool = False) -> dict[str, capture.Capture]:
    """Stacks of the live, stuck process, then the GPU view when it is a GPU program (paused: see
    capture.python_stacks)."""
    caps = {"python": capture.python_stacks(child.pid, launch.faulthandler if launch.recorded else None,
                                            paused=paused),
            "native": capture.native_stacks(child.pid, timeout_s=10.0, tools=tuple(native_tools))}
    device = None
    if launch.recorded and launch.log.exists():
        try:
            device = trace.read_device(launch.log)
        except Exception:  # noqa: BLE001 - the device only decides whether to look at the GPU
            device = None
    want_gpu = capture_gpu is True or (capture_gpu == "auto" and (
        (device and str(device).startswith("cuda")) or
        (not launch.recorded and capture.find_tool("nvidia-smi") is not None)))
    if want_gpu or cuda_gdb or coredump:
        caps["gpu"] = capture.gpu_view(child.pid, cuda_gdb=cuda_gdb, coredump_dir=launch.out if coredump else None)
    return caps


@dataclass(frozen=True)
class Seen:
    """The evidence taken at a stall (or at the end), before it is judged."""
    caps: dict
    jobbed: Any
    snap: Any
    notes: tuple[str, ...]


def take(child: proc.Child, launch: Launch, tracker: Any, dest: Path, *, stacks: bool,
         capture_gpu: bool | str, cuda_gdb: bool, coredump: bool, native_tools: Sequence[str],
         paused: bool = False) -> Seen:
    """Stacks (every process's, for a job) and the op log as the stall left them; the child still runs (paused:
    it goes on after, so no stack dump that could crash it: capture.python_stacks)."""
    t_stall = time.monotonic()
    if stacks:
        caps = capture_stacks(child, launch, capture_gpu=capture_gpu, cuda_gdb=cuda_gdb, coredump=coredump,
                              native_tools=native_tools, paused=paused)
    else:
        caps = {"python": capture.Capture("python", "", None, 0.0, False, "not taken (stack capture off)")}
    jobbed = None
    if getattr(tracker, "procs", None):   # the job has processes besides the one started
        t_job = time.monotonic()
        jobbed = job_capture(launch, tracker, child.pid, caps["python"].text, native_tools, stacks, dest, t_stall,
                             paused)
        caps["processes"] = capture.Capture("processes", "", "faulthandler", time.monotonic() - t_job, True)
    t_log = time.monotonic()
    snap, log_notes = read_log(launch)  # last: the op-log tail as the stall left it
    caps["oplog"] = capture.Capture("oplog", "", "gpulab.trace" if snap is not None else None,
                                    time.monotonic() - t_log, snap is not None)
    return Seen(caps, jobbed, snap, tuple(log_notes))


def tail_of(path: Path, chars: int = STDERR_TAIL_CHARS) -> str:
    if not path.exists():
        return ""
    with open(path, "rb") as fh:
        fh.seek(max(0, path.stat().st_size - chars))
        return fh.read().decode("utf-8", "replace")


def products(launch: Launch, v: Verdict, dest: Path | None = None) -> dict:
    """Stacks and the op-log tail as files beside the verdict (paths relative to `dest`, the products folder)."""
    out = dest or launch.out
    files = {"stdout": launch.stdout.name, "stderr": launch.stderr.name,
             "op_log": launch.log.name if (out / launch.log.name).exists() else None,
             "faulthandler": launch.faulthandler.name if (out / launch.faulthandler.name).exists() else None}
    for name, text in (("stacks_python.txt", v.stacks.get("python")), ("stacks_native.txt", v.stacks.get("native")),
                       ("stacks_gpu.txt", v.stacks.get("gpu"))):
        if text:
            write_text(out / name, text)
            files[name.split(".")[0]] = name
    if v.oplog_tail:
        write_text(out / "oplog_tail.txt", "\n".join(oplog_line(o) for o in v.oplog_tail) + "\n")
        files["oplog_tail"] = "oplog_tail.txt"
    files["verdict"] = "verdict.json"
    return files


def judge_seen(command: Sequence[str], launch: Launch, seen: Seen, *, status: str, rc: int | None, t0: float,
               hang_started: float | None, stall_s: float, timeout_s: float | None, mode: str, spec: Any, pid: int,
               left: tuple, tail: int, py_text: str | None = None) -> Verdict:
    """judge() over what was seen; times are the watchdog's monotonic clock, t0 its start."""
    caps = seen.caps
    planted = faults.planted_from_stderr(tail_of(launch.stderr, 200_000))
    capture_s = {k: round(c.seconds, 3) for k, c in caps.items()}
    capture_s["total"] = round(sum(c.seconds for k, c in caps.items() if k != "oplog"), 3)
    snap = seen.snap
    obs = Observation(
        command=tuple(command), status=status, exit_code=rc, elapsed_s=time.monotonic() - t0,
        recorded=launch.recorded and snap is not None, records=tuple(snap.records) if snap is not None else (),
        ops_started=snap.started if snap is not None else 0, ops_completed=snap.completed if snap is not None else 0,
        dropped=snap.dropped if snap is not None else 0, log_stopped_at=snap.stopped_at if snap is not None else None,
        raise_marks=snap.raise_marks if snap is not None else None,
        python_text=py_text if py_text is not None else (caps["python"].text if "python" in caps else ""),
        native_text=caps["native"].text if "native" in caps else "",
        gpu_text=caps["gpu"].text if "gpu" in caps else None,
        capture_notes=tuple((c.step, c.note) for c in caps.values() if c.note), capture_s=capture_s,
        stderr_tail=tail_of(launch.stderr),
        planted=str(spec) if spec else (planted[0].split("planted ", 1)[1] if planted else None),
        mode=mode if launch.recorded else None, stall_s=stall_s, timeout_s=timeout_s or 0.0,
        hang_started_s=None if hang_started is None else hang_started - t0,
        verdict_at_s=time.monotonic() - t0, pid=pid, notes=seen.notes, left_running=left, tail=tail,
        memory=tuple(snap.memory) if snap is not None else ())
    return judge(obs)


def snapshot(launch: Launch, dest: Path, limit: int = 32) -> None:
    """The op logs as a stall left them, copied into its capture folder (the live ones go on being written):
    the root's and, for a job, each process's <pid>.json and log (at most `limit`), each cut to what it holds."""
    dest.mkdir(parents=True, exist_ok=True)
    if launch.recorded and launch.log.exists():
        shutil.copyfile(launch.log, dest / launch.log.name)
        keep_recorded(dest / launch.log.name)
    for name, keep in ((launch.stdout.name, 64_000), (launch.stderr.name, 64_000)):
        text = tail_of(launch.out / name, keep)
        if text:
            write_text(dest / name, text)
    if not launch.procs.is_dir():
        return
    (dest / "procs").mkdir(exist_ok=True)
    metas = follow.metas(launch.procs)
    for pid in sorted(metas, key=lambda p: (not jobread.live(p), p))[:limit]:
        f = follow.files(launch.procs, pid)
        with contextlib.suppress(OSError):
            shutil.copyfile(f["meta"], dest / "procs" / f["meta"].name)
            if f["log"].exists():
                shutil.copyfile(f["log"], dest / "procs" / f["log"].name)
                keep_recorded(dest / "procs" / f["log"].name)


def stall_record(v: Verdict, seen: Seen, *, t: float, stall_s: float, capture_dir: str,
                 last_wall: float) -> dict:
    """A stall as the verdict lists it: when, where, whether the evidence shows one of the usual pauses, and
    how the window compares with the job's own gaps between ops (from the op log up to the stall)."""
    culprit = next((p for p in v.processes if p.get("role") == v.culprit), None) if v.culprit else None
    open_op = v.in_flight_op
    py = v.stacks.get("python") or ""
    frame = jobread.main_frame(py).where if py else None
    frames = jobread.main_frame(py).frames if py else ()
    views = seen.jobbed[0] if seen.jobbed else []
    if culprit is not None and not open_op:
        frame = culprit.get("frame") or frame
        pythons = seen.jobbed[2].get("python", {}) if seen.jobbed else {}
        frames = jobread.main_frame(pythons.get(culprit.get("pid"), "")).frames or frames
    ranks_at = [p.frame or "" for p in views if p.kind == "rank"]
    pause = stalls.judge_pause(open_op, frames, v.divergence, ranks_at)
    records = list(seen.snap.records) if seen.snap is not None else []
    if not records and seen.jobbed:   # a launcher records nothing: the ranks' rhythm is the job's
        busiest = max((lf for lf in jobread.read_job(Path(v.log.get("dir", "")) / "procs").values()
                       if lf.snap is not None), key=lambda lf: lf.snap.completed, default=None) \
            if v.log.get("dir") else None
        records = list(busiest.snap.records) if busiest is not None else []
    gaps = stalls.gaps(records, before=last_wall)
    return {"t": round(t, 3), "for_s": None, "where": stalls.where(open_op, v.divergence, frame,
                                                                    v.culprit if culprit else None),
            "recovered": False, "pause": {"kind": pause.kind, "usual": pause.usual, "why": pause.why},
            "window": stalls.window_note(stall_s, gaps), "gaps": gaps.to_dict() if gaps else None,
            "capture": capture_dir}


def keep_capture(child: proc.Child, launch: Launch, tracker: Any, cap: Path, *, command: Sequence[str],
                 t0: float, hang_started: float, stall_s: float, timeout_s: float | None, mode: str, spec: Any,
                 tail: int, stacks: bool, capture_gpu: bool | str, cuda_gdb: bool, coredump: bool,
                 native_tools: Sequence[str]) -> dict:
    """One stall under --on-stall keep: the evidence, as a stop would take it, into its own folder (a verdict
    of status hang, the op logs as they were, every process's stacks), the job left running; -> its record."""
    cap.mkdir(parents=True, exist_ok=True)
    capped = dataclasses.replace(launch, out=cap)
    seen = take(child, launch, tracker, cap / "procs", stacks=stacks, capture_gpu=capture_gpu,
                cuda_gdb=cuda_gdb, coredump=coredump, native_tools=native_tools, paused=True)   # the job goes on
    snapshot(launch, cap)
    v = judge_seen(command, launch, seen, status="hang", rc=None, t0=t0, hang_started=hang_started, stall_s=stall_s,
                   timeout_s=timeout_s, mode=mode, spec=spec, pid=child.pid, left=(), tail=tail)
    if seen.jobbed is not None:
        v = with_job(v, cap / "procs", child.pid, *seen.jobbed)
    v = dataclasses.replace(v, log={"dir": str(cap), **products(capped, v)})
    v = dataclasses.replace(v, evidence=tuple(e for e in v.evidence if not e.startswith("the watchdog stopped"))
                            + ("the watchdog left the job running (--on-stall keep)",))
    last_wall = time.time() - (time.monotonic() - hang_started)
    rec = stall_record(v, seen, t=hang_started - t0, stall_s=stall_s,
                       capture_dir=str(cap.relative_to(launch.out)), last_wall=last_wall)
    rec["capture_s"] = v.capture_s.get("total")   # for_s includes it: recovery is seen once the capture is done
    write_json(cap / "verdict.json", {**v.to_dict(), "stall": rec})
    return rec
