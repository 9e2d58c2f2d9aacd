"""What a `gpulab watch` caught, opened in the workbook (`gpulab run --from DIR [DIR...]`): the capture's
folder(s) read back as 02's recording, 03's verdict and 04's reproduction, without running the job again.

Why not re-run: the failure came after hours, on one rank of many, and rarely twice the same way; the capture
is the evidence. Which evidence: a stall that never recovered (its capture folder under --on-stall keep),
else how the job ended when it failed, else the job's end (a job whose stalls all recovered is no hang; its
stalls are reported). Several folders are the nodes of one job: their processes join into one verdict, as
`gpulab merge` gives it. Everything used is copied into the run's own folder (`caught/`), so the report and
its bundle stand alone.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from gpulab import report
from gpulab.args import BadInput
from gpulab.hang.jobs import merge
from gpulab.hang.verdict import Verdict, headline
from gpulab.trace import firstnan, follow, ring
from gpulab.trace.liveness import STATUSES

COPY = "caught"              # the run folder's copy of what was used
FAILED = ("hang", "timeout", "crash", "error", "interrupted")
NOTHING_TO_FIX = "nothing to fix"   # how 04's reason starts when the capture shows no failure


# ------------------------------------------------------------------------------------ which folder

def why_not(d: str | os.PathLike) -> str | None:
    """Why a folder is not a watch capture (None when it is one)."""
    p = Path(d)
    if not p.is_dir():
        return f"{str(d)!r} is not a folder"
    v = p / "verdict.json"
    if not v.is_file():
        return (f"{str(d)!r} is not a gpulab watch capture: it has no verdict.json (give the --out folder of "
                f"`gpulab watch`, one per node of a job)")
    try:
        data = json.loads(v.read_text())
    except (OSError, ValueError) as exc:
        return f"{str(v)!r} is not a readable verdict: {exc}"
    if not isinstance(data, dict) or "status" not in data or "command" not in data:
        return f"{str(v)!r} is not a gpulab watch verdict (no status or command in it)"
    return None


def check(dirs: Sequence[str | os.PathLike]) -> list[Path]:
    """The folders, each a watch capture, resolved; BadInput naming the first that is not."""
    if not dirs:
        raise BadInput("--from needs at least one folder: the --out folder of a `gpulab watch`")
    for d in dirs:
        why = why_not(d)
        if why:
            raise BadInput(why)
    return [Path(d).resolve() for d in dirs]


@dataclass(frozen=True)
class Source:
    """One capture folder, and the folder inside it whose verdict tells the failure."""
    top: Path
    chosen: Path
    verdict: dict
    why: str          # how the chosen one was picked, in words


def recovered(v: dict) -> str | None:
    """What a capture of a stall that recovered was (`gpulab watch --on-stall keep` wrote it, the job went on), in
    words; None for any other verdict. Read as the hang it looked like at the time, it would be a false finding."""
    st = v.get("stall") if isinstance(v.get("stall"), dict) else None
    if not st or not st.get("recovered"):
        return None
    pause = st.get("pause") or {}
    kind = f" ({pause['kind']}: {pause.get('why')})" if pause.get("kind") else ""
    return (f"a stall that recovered after {float(st.get('for_s') or 0):.1f} s{kind}: the job went on, so it was "
            f"not a hang")


def source(d: str | os.PathLike) -> Source:
    top = Path(d)
    v = report.read_json(top / "verdict.json", default={}) or {}
    stuck = [s for s in v.get("stalls") or () if not s.get("recovered") and s.get("capture")]
    if stuck and (top / stuck[-1]["capture"] / "verdict.json").is_file():
        cap = top / stuck[-1]["capture"]
        return Source(top, cap, report.read_json(cap / "verdict.json", default={}),
                      f"the stall at {stuck[-1]['t']:.0f} s that never recovered ({stuck[-1]['capture']})")
    back = recovered(v)
    if back:
        return Source(top, top, v, f"the capture of {back}")
    if v.get("status") in FAILED:
        return Source(top, top, v, f"the job's end ({v.get('status')})")
    n = len(v.get("stalls") or ())
    return Source(top, top, v, f"the job's end ({v.get('status')}" + (f", after {n} stall(s) that all recovered)"
                                                                      if n else ")"))


# ------------------------------------------------------------------------------------ 03: the verdict

def _copy(src: Path, dest: Path) -> None:
    """The capture's files that tell the failure (not the sparse live logs of its top folder's siblings)."""
    dest.mkdir(parents=True, exist_ok=True)
    for p in src.iterdir():
        if p.is_file() and p.name not in ("beat",) and not p.name.endswith(".prev.txt"):
            shutil.copyfile(p, dest / p.name)
    if (src / "procs").is_dir():
        (dest / "procs").mkdir(exist_ok=True)
        for p in (src / "procs").iterdir():
            if p.is_file() and not p.name.endswith(".beat"):
                shutil.copyfile(p, dest / "procs" / p.name)
                if p.suffix == ".log":
                    _shrink(dest / "procs" / p.name)
    if (dest / "ops.log").exists():
        _shrink(dest / "ops.log")


def _shrink(log: Path) -> None:
    try:
        ring.shrink(log)
    except (OSError, ValueError):
        pass


def _job(folder: Path) -> bool:
    return (folder / "procs").is_dir() and any(p.suffix == ".json" and p.stem.isdigit()
                                               for p in (folder / "procs").iterdir())


def first_failure(dirs: Sequence[str | os.PathLike], out_dir: str | os.PathLike) -> Verdict:
    """03's verdict of what the watch(es) caught, copied into out_dir/caught/ (its `log` points there). A job's
    one folder keeps the cross-process verdict its watchdog wrote; several folders (one per node) get the one
    `gpulab merge` gives over them, with the node that holds the culprit as the base."""
    srcs = [source(d) for d in check(dirs)]
    out = Path(out_dir) / COPY
    shutil.rmtree(out, ignore_errors=True)
    copies = []
    for i, s in enumerate(srcs):
        dest = out if len(srcs) == 1 else out / f"node{i}_{s.top.name}"
        _copy(s.chosen, dest)
        copies.append(dest)
    base = 0
    v = Verdict.from_dict(srcs[0].verdict)
    if len(srcs) > 1:
        views, found = merge.merge(copies)
        culprit = next((p for p in views if p.role == found.culprit), None)
        if culprit is not None:
            base = next((i for i, c in enumerate(copies) if (c / "procs" / f"{culprit.pid}.json").exists()), 0)
        v = Verdict.from_dict(srcs[base].verdict)
        plain = json.loads(json.dumps(found.to_dict()))
        changes: dict = {"culprit": found.culprit, "divergence": plain["divergence"],
                         "processes": tuple(plain["processes"]),
                         "evidence": tuple(found.evidence) + tuple(f"{srcs[base].top.name}: {e}" for e in v.evidence)}
        if found.cls:
            changes["cls"] = found.cls
        if culprit is not None and culprit.open_op:
            changes["in_flight_op"] = {**culprit.open_op, "process": culprit.role}
        v = dataclasses.replace(v, **changes)
    back = recovered(srcs[base].verdict)
    if back:   # what the capture saw stays as evidence; the verdict is the stall's outcome
        v = dataclasses.replace(v, status="ok", cls=None, owner=None, suggested=(), culprit=None,
                                evidence=(back + "; what the capture saw then:",) + tuple(v.evidence))
    row = next((r for r in v.processes if r.get("role") == v.culprit), None) if v.culprit else None
    if row and row.get("log") and (copies[base] / "procs" / Path(row["log"]).name).is_file():
        # the replay reads the stuck process's ops, not a launcher's empty log
        v = dataclasses.replace(v, log={**v.log, "op_log": f"procs/{Path(row['log']).name}"})
    said = "; ".join(f"{s.top}: {s.why}" for s in srcs)
    v = dataclasses.replace(v, log={**v.log, "dir": str(copies[base]), "verdict": "verdict.json"},
                            notes=tuple(v.notes) + (f"read from what gpulab watch caught ({said}), not run again",))
    d = v.to_dict()
    if back:
        d["stall"] = srcs[base].verdict["stall"]   # 04 reads the copy: nothing to fix in a stall that recovered
    report.write_json(copies[base] / "verdict.json", d)
    if len(srcs) > 1:
        report.write_json(out / "verdict.json", d)
    return v


def finding(dirs: Sequence[str | os.PathLike], v: Verdict, rep: Any, workload: str) -> tuple[str, dict]:
    """03's headline and metrics from a capture, with the keys the chain's verdict reads from a ladder run."""
    from gpulab.hang import classify

    srcs = [source(d) for d in dirs]
    top = srcs[0].verdict
    found = [s for src in srcs for s in (report.read_json(src.top / "verdict.json", default={}) or {}).get("stalls")
             or ()]
    back = sum(1 for s in found if s.get("recovered"))
    stalls_txt = (f"; {len(found)} stall(s) while watched, {back} recovered"
                  + (f" ({', '.join(sorted({s['pause']['kind'] for s in found if (s.get('pause') or {}).get('kind')}))})"
                     if any((s.get("pause") or {}).get("kind") for s in found) else "")) if found else ""
    failed = v.status != "ok" and v.status in FAILED
    text = (headline(v) if failed else recovered(top)
            or f"the watched job ended {v.status} after {top.get('elapsed_s', 0):.0f} s")
    head = f"caught by gpulab watch: {text}{stalls_txt}" + ("; a verified repro.py" if rep and rep.verified else "")
    status = v.status if v.status in STATUSES else ("crash" if failed else "ok")
    op = v.in_flight_op or {}
    metrics = {
        "status": status, "class": v.cls if failed else None,
        "in_program": classify.program_cause(v.cls, v.culprit, v.processes, v.owner) if failed else None,
        "in_flight_op": op.get("name"), "call_site": op.get("call_site"),
        "host_blocked_in": (v.host_blocked_in or {}).get("name"), "first_failing_rung": None,
        "drill": v.drill, "planted": v.planted, "self_test": None, "rungs": {}, "runs": 0, "stall_s": v.stall_s,
        "minimal": None, "probes": 0, "repro_verified": bool(rep and rep.verified), "workload": workload,
        "rung": None, "suggested": [s.get("fix") for s in v.suggested], "jobs": 0,
        "from_capture": [str(s.top) for s in srcs], "captured_from": [s.why for s in srcs],
        "stalls": len(found), "stalls_recovered": back, "culprit": v.culprit,
        "owner": v.owner if failed else None,
    }
    return head, metrics


# ------------------------------------------------------------------------------------ 02: the recording

def _log_of(folder: Path, v: dict) -> Path | None:
    """The op log 02 shows: the root's when it recorded ops (unless, in a watch in stats mode, another process's op
    made the first NaN/Inf that the root only received), else the culprit's, else that of the process where the
    first NaN/Inf was made, else the busiest process's."""
    root = folder / "ops.log"
    try:
        if root.is_file() and ring.progress(root).started > 0:
            elsewhere = (firstnan.made_elsewhere(root, follow.child_logs(folder / "procs"))
                         if (folder / "procs").is_dir() else None)
            return elsewhere or root   # a stats watch: the process whose op made the first NaN, not one it reached
    except (OSError, ValueError):
        pass
    if not (folder / "procs").is_dir():
        return root if root.is_file() else None
    culprit = v.get("culprit")
    row = next((r for r in v.get("processes") or () if r.get("role") == culprit), None) if culprit else None
    if row and row.get("log") and (folder / "procs" / Path(row["log"]).name).is_file():
        return folder / "procs" / Path(row["log"]).name
    logs = follow.child_logs(folder / "procs")
    nan = firstnan.first_of_job(logs)   # a job in stats mode: the process where an op first made NaN/Inf
    if nan is not None:
        return nan[0]
    best, most = None, -1
    for log in logs:
        try:
            n = ring.progress(log).started
        except (OSError, ValueError):
            continue
        if n > most:
            best, most = log, n
    return best or (root if root.is_file() else None)


def recording(dirs: Sequence[str | os.PathLike], out_dir: str | os.PathLike) -> Any:
    """02's Recording of what the watch caught: the chosen op log (up to the stall) as out_dir/ops.log and the
    job's other processes' logs in out_dir/ops.procs/ (where 05 and 06 look for attention calls)."""
    from gpulab.trace import run as trace_run

    srcs = [source(d) for d in check(dirs)]
    s = next((x for x in srcs if x.verdict.get("culprit")), srcs[0])
    v = s.verdict
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dest, procs = out / "ops.log", out / "ops.procs"
    shutil.rmtree(procs, ignore_errors=True)
    dest.unlink(missing_ok=True)
    log = _log_of(s.chosen, v)
    snap = None
    if log is not None:
        shutil.copyfile(log, dest)
        _shrink(dest)
        snap = ring.read(dest)
        nan = firstnan.path(log)   # a watch in stats mode: the first NaN/Inf and its cause, beside its log
        firstnan.path(dest).unlink(missing_ok=True)
        if nan.is_file():
            shutil.copyfile(nan, firstnan.path(dest))
    n_procs, n_ops = 0, 0
    for x in srcs:
        folder = x.chosen / "procs"
        for pid, meta in (follow.metas(folder).items() if folder.is_dir() else ()):
            src = folder / str(meta.get("log") or "")
            if meta.get("root") or not meta.get("log") or not src.is_file() or (log is not None and src == log):
                continue
            procs.mkdir(exist_ok=True)
            report.write_json(procs / f"{pid}.json", meta)
            shutil.copyfile(src, procs / src.name)
            _shrink(procs / src.name)
            n_procs += 1
            try:
                n_ops += ring.progress(procs / src.name).started
            except (OSError, ValueError):
                pass
    # a stall that recovered is no failure: the job went on (its op logs were dropped then, their tails kept)
    status = "ok" if recovered(v) else v.get("status") if v.get("status") in STATUSES else "crash"
    rc = v.get("exit_code")
    return trace_run.Recording(
        snapshot=snap, returncode=rc, signal=-rc if isinstance(rc, int) and rc < 0 else None,
        timed_out=status == "timeout", elapsed_s=float(v.get("elapsed_s") or 0.0), log=str(dest),
        command=tuple(v.get("command") or ()), stderr_tail=str(v.get("stderr_tail") or ""), status=status,
        stall_s=v.get("stall_s"), processes=n_procs, process_ops=n_ops)


def _done(value: Any) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


def no_reruns(rec: Any) -> Any:
    """02's follow-up runs (GPU times, the stats-mode NaN/Inf check), not run: the job is not run again. A watch
    in stats mode (`gpulab watch --mode stats`) checked every output already: its recording is the check."""
    from gpulab.trace.followups import FollowUps

    why = "this is what a watch caught (gpulab run --from); the job is not run again"
    stats = (rec, "(what `gpulab watch --mode stats` recorded)") if getattr(rec.snapshot, "mode", None) == "stats" \
        else (None, f"**NaN/Inf not checked:** {why} (`gpulab watch --mode stats` would check every output).")
    return FollowUps(_done((None, f"**GPU times not measured:** {why}.")), _done(stats))


def no_overhead() -> tuple[None, str]:
    return None, ("**Recording cost not measured:** this is what a watch caught (gpulab run --from); the job is "
                  "not run again (benchmarks/bench_long_watch.py and bench_step_time.py measure it).")


# ------------------------------------------------------------------------------------ 04: what to try fixes on

def repro_command(repro: str, out_dir: str | os.PathLike) -> tuple[tuple[str, ...] | None, str]:
    """The command 04 tries fixes on: the user's shorter one (`-p repro=...`), else 03's verified repro.py;
    (None, why) when there is neither."""
    import sys

    if repro.strip():
        cmd = tuple(shlex.split(repro))
        return cmd, f"the command given as repro: {repro}"
    ended_ok = _ended_ok(out_dir)
    if ended_ok:
        return None, ended_ok
    kept = Path(out_dir) / "repro" / "repro.py"
    if kept.is_file():
        return (sys.executable, str(kept)), "03's verified repro.py (the recorded ops replayed)"
    said = (report.read_json(Path(out_dir) / "repro" / "repro.json", default=None) or {}).get("explanation")
    # 03's own reason when it wrote one (a job's collective is never replayed alone: seen on the user path, where
    # this said the replay 'did not fail the same way' of a replay that never ran)
    return None, (f"no reproduction to try fixes on: {said or 'no replay of the recorded ops failed the same way'}"
                  "; and no shorter command was given (-p repro='python small_case.py')")


def _ended_ok(out_dir: str | os.PathLike) -> str | None:
    """Why there is nothing to fix when the watched job ended well (03's copy of the verdict), else None."""
    v = report.read_json(Path(out_dir) / COPY / "verdict.json", default=None) or {}
    back = recovered(v)
    if back:
        return f"{NOTHING_TO_FIX}: {back}"
    if v.get("status") != "ok":
        return None
    stalls = v.get("stalls") or []
    n = sum(1 for s in stalls if s.get("recovered"))
    also = f", after {len(stalls)} stall(s) that recovered ({n} of {len(stalls)})" if stalls else ""
    return f"{NOTHING_TO_FIX}: the watched job ended ok (exit code {v.get('exit_code')}){also}"


def workload_of(command: Sequence[str]) -> str:
    """The notebooks' workload parameter for a captured command (what 05 and 06 name; nothing runs it)."""
    from gpulab.hang.watchdog.watch import python_command

    cmd = [str(c) for c in command]
    py = python_command(cmd) if cmd else None
    if py is not None:
        return "script:" + shlex.join(py[2])
    if cmd and os.path.basename(cmd[0]) == "torchrun":
        return "script:" + shlex.join(["-m", "torch.distributed.run", *cmd[1:]])
    return "script:" + shlex.join(cmd or ["-c", "pass"])


def no_fixes(why: str) -> tuple[str, dict]:
    """04's headline and metrics when there is nothing to try fixes on: nothing was tried, and why."""
    return (why if why.startswith(NOTHING_TO_FIX) else f"nothing tried: {why}",
            {"recommendation": None, "tried": [], "not_tried": [], "next_step": why, "kind": "capture",
             "drill": False, "repro": None})


# ------------------------------------------------------------------------------------ words for the notebooks

def intro_md(dirs: Sequence[str | os.PathLike]) -> str:
    """03's opening when it reads a capture: which folders, and which of their evidence tells the failure."""
    lines = []
    for d in dirs:
        s = source(d)
        v = s.verdict
        lines.append(f"- {report.code(str(s.top))}: `{report.esc(' '.join(v.get('command') or ()))[:200]}`, "
                     f"watched {float(v.get('elapsed_s') or 0):.0f} s with a {v.get('stall_s')} s stall window; "
                     f"the evidence used: {report.esc(s.why)}")
    return ("**What gpulab watch caught** (`gpulab run --from`): the verdict below is the watchdog's, read back; "
            "no ladder is climbed and the job is not run again.\n\n" + "\n".join(lines))


def repro_md(cmd: Sequence[str] | None, why: str) -> str:
    if cmd is None:
        return f"**No fixes tried:** {report.esc(why)}."
    return f"Fixes are tried on {report.esc(why)}: {report.code(' '.join(cmd))} (the job itself is not run again)."


def no_fixes_md(why: str) -> str:
    if why.startswith(NOTHING_TO_FIX):   # no failure: no shorter failing command to ask for
        return f"**Nothing tried:** {report.esc(why)}."
    return (f"**Nothing tried:** {report.esc(why)}. Give a shorter command that fails the same way "
            f"(`gpulab run --from DIR -p repro='python small_case.py'`).")
