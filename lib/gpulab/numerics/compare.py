"""`gpulab compare`'s work: the reference and the candidate command each run once, recorded with no change to
the program (every Python process of the run followed, gpulab.trace.follow, which calls this package's
recorder by name: $GPULAB_PRELOAD), stopped when it stalls (gpulab.trace.liveness); their records judged
(gpulab.numerics.judge); when they diverge, each side run again up to the diverging op to replay it alone
against float64 (gpulab.numerics.replay). A run that fails still gives what it recorded: the verdict is then
`failed`, says which run and where, and compares what both recorded.

`run(ref_cmd, cand_cmd, out_dir, ...) -> Comparison` is the notebook's entry point.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from gpulab import device, lastwords, proc, report
from gpulab.hang.watchdog.launch import bare_python, check_command
from gpulab.numerics import judge as _judge
from gpulab.numerics import figures, lines, workdir
from gpulab.numerics.tolerance import for_dtypes
from gpulab.numerics.names import ENV_DIR, ENV_KEEP, INSTALL
from gpulab.trace import follow, liveness, preload
from gpulab.trace.run import keep_followed

STATUSES = ("agree", "diverged", "unaligned", "failed")
ROUNDING_REPLAYS = 4   # ops a replay may find right on both sides (rounding) before the verdict stands as it is
SIDES = ("reference", "candidate")
SIDE_BY_SIDE_CORES = 4   # usable cores from which the two replays run at once (each side's own threads keep theirs)


@dataclass(frozen=True)
class Run:
    """One side's run: how it ended and what it recorded."""
    side: str
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    status: str                      # ok | error | crash | hang | timeout | not_started
    returncode: int | None
    elapsed_s: float
    folder: str
    records: tuple[dict, ...] = field(default=(), repr=False)
    why: str = ""                    # not_started: why; otherwise the output's last line
    output_tail: str = ""
    ranks: dict = field(default_factory=dict, repr=False)   # a job's records by rank (read_records)

    @property
    def ops(self) -> int:
        return sum(1 for r in self.records if r.get("op") != "<input>")

    def to_dict(self) -> dict:
        return {"command": list(self.command), "env": dict(self.env), "status": self.status,
                "exit_code": self.returncode, "elapsed_s": round(self.elapsed_s, 3), "folder": self.folder,
                "records": len(self.records), "ops": self.ops, "why": self.why}


@dataclass(frozen=True)
class Comparison:
    status: str                      # agree | diverged | unaligned | failed
    summary: str                     # the verdict in one sentence
    first_divergence: dict | None
    first_bitwise: dict | None
    parted: dict | None
    tolerance: dict | None
    runs: tuple[Run, Run]
    replay: dict | None = None
    rows: tuple[dict, ...] = field(default=(), repr=False)
    out_dir: str = ""
    aligned: dict = field(default_factory=dict)
    reference_wrote: tuple[str, ...] = ()   # files the reference created or changed in the working folder
    job: dict = field(default_factory=dict)  # a job of ranks: the rank the verdict is about, and each rank's status

    @property
    def table(self):
        """Per aligned op, in the reference's order: its error along the run (`excess`: error over tolerance,
        for a plot), with `first_divergence` marking the op the verdict names."""
        import pandas as pd

        df = pd.DataFrame(list(self.rows), columns=["n", "op", "call_site", "pass", "backward", "excess",
                                                    "max_rel_err", "bitwise_equal"])
        fd = self.first_divergence or {}
        df["first_divergence"] = [(r.get("op"), r.get("pass")) == (fd.get("op"), fd.get("pass"))
                                  and r.get("call_site") == _judge.short(fd.get("call_site")) for r in self.rows]
        return df

    @property
    def diverging(self):
        """The table's rows beyond tolerance, first first."""
        t = self.table
        return t[t["excess"] > 1.0]

    def to_dict(self) -> dict:
        return {"status": self.status, "summary": self.summary, "first_divergence": self.first_divergence,
                "first_bitwise_difference": self.first_bitwise, "parted": self.parted, "tolerance": self.tolerance,
                "replay": self.replay, "aligned": self.aligned, "reference_wrote": list(self.reference_wrote),
                "job": self.job,
                "runs": {r.side: r.to_dict() for r in self.runs}}


def argv_of(command: str | Sequence[str]) -> list[str]:
    """A command as one string (split as a shell would) or an argv list. A bare `python` is the interpreter gpulab
    runs in, as for `gpulab watch` (gpulab.hang.watchdog.launch): PATH's may be another, without torch."""
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    if not argv:
        raise ValueError("an empty command; give the program to run, e.g. 'python train.py'")
    if bare_python(argv[0]):
        argv[0] = sys.executable
    return argv


def _read(p: Path) -> tuple[dict, ...]:
    """One process's records; a cut last line (a killed run) is dropped."""
    got = []
    with open(p) as fh:
        for line in fh:
            try:
                got.append(lines.decode(json.loads(line)))
            except ValueError:
                break
    return tuple(got)


def read_records(folder: Path) -> tuple[tuple[dict, ...], dict[int, tuple[dict, ...]]]:
    """The records of the run's busiest process (<pid>.jsonl), and a job's by rank (the process that joined the
    process group as that rank, procs/<pid>.json; the busiest where two claim one; empty for a run of no ranks).
    Each file is read once."""
    by_pid = {p.stem: _read(p) for p in sorted(Path(folder).glob("*.jsonl"))}
    ranks: dict[int, tuple[dict, ...]] = {}
    for meta in sorted((Path(folder) / "procs").glob("*.json")):
        try:
            info = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        got = by_pid.get(str(info.get("pid")))
        if info.get("rank") is not None and got is not None and len(got) > len(ranks.get(int(info["rank"]), ())):
            ranks[int(info["rank"])] = got
    return max(by_pid.values(), key=len, default=()), ranks


def run_side(side: str, command: str | Sequence[str], out_dir: Path, *, env: Mapping[str, str] | None = None,
             timeout_s: float = 600.0, stall_s: float | None = liveness.STALL_S, keep: str | None = None,
             name: str | None = None) -> Run:
    """Run one side recorded, in out_dir/<name or side>/ (output.txt, <pid>.jsonl, procs/)."""
    argv = argv_of(command)
    folder = Path(out_dir) / (name or side)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    procs = folder / "procs"
    procs.mkdir()
    base = {**os.environ, **dict(env or {})}
    cenv = follow.child_env(base, procs, "ops")
    cenv[preload.ENV] = ",".join(x for x in (base.get(preload.ENV), INSTALL) if x)
    cenv[ENV_DIR] = str(folder.resolve())
    cenv.setdefault("PYTHONUNBUFFERED", "1")
    if keep:
        cenv[ENV_KEEP] = keep
    else:
        cenv.pop(ENV_KEEP, None)
    output = folder / "output.txt"
    try:
        end = liveness.run(argv, timeout_s=timeout_s, stall_s=stall_s, env=cenv, stdout=output,
                           stderr=subprocess.STDOUT, follow=procs, label=f"compare {side}")
    except (proc.CommandNotFound, proc.NotExecutable) as exc:
        return Run(side, tuple(argv), tuple(sorted((env or {}).items())), "not_started", None, 0.0, str(folder),
                   why=str(exc))
    keep_followed(procs)   # each process's op log cut to what it recorded
    tail = output.read_text(errors="replace")[-3000:] if output.exists() else ""
    last = lastwords.of(tail)
    records, ranks = read_records(folder)
    return Run(side, tuple(argv), tuple(sorted((env or {}).items())), end.status, end.returncode, end.elapsed_s,
               str(folder), records, last, tail, ranks)


def unstartable(argvs: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]], out: Path) -> list[Run]:
    """Both sides as not started where either command cannot start (not on PATH, no such script), else []: the
    side that can start is not run alone."""
    why = {}
    for side, argv in zip(SIDES, argvs):
        try:
            check_command(list(argv))
        except (FileNotFoundError, PermissionError) as exc:
            why[side] = str(exc)
    if not why:
        return []
    return [Run(side, tuple(argv), tuple(sorted(env.items())), "not_started", None, 0.0, str(out / side),
                why=why.get(side, "not run: the other command cannot start"))
            for side, argv, env in zip(SIDES, argvs, envs)]


def _ended(r: Run) -> str:
    if r.status == "not_started":
        return f"did not start ({r.why})"
    how = {"error": f"exited with code {r.returncode}", "crash": f"was killed by signal {-(r.returncode or 0)}",
           "hang": "stalled (no progress) and was stopped", "timeout": "ran out of time and was stopped"}[r.status]
    return how + (f": {r.why}" if r.why and r.status in ("error", "crash") else "")


def _failed(runs: tuple[Run, Run], j: _judge.Judgement | None) -> str:
    bad = sorted((r for r in runs if r.status != "ok"), key=lambda r: r.why.startswith("not run:"))  # the cause first
    parts = []
    for r in bad:
        if r.status == "not_started" or not r.records:
            what = (f"The {r.side} command {_ended(r)}" if r.status == "not_started"
                    else f"The {r.side} run {_ended(r)} before recording any op")
        else:
            last = next((x for x in reversed(r.records) if x.get("op") != "<input>"), r.records[-1])
            what = f"The {r.side} run {_ended(r)} after {r.ops} recorded op(s), the last {_judge.where(last)}"
        parts.append(what + ".")
    if j is not None and all(r.records for r in runs):
        up = {"agree": "up to there the runs agree", "diverged": "before that " + j.sentence[0].lower() + j.sentence[1:],
              "unaligned": "what they recorded cannot be aligned"}[j.status]
        parts.append(up[0].upper() + up[1:] + ("" if up.endswith(".") else "."))
    return " ".join(parts)


def run(ref_cmd: str | Sequence[str], cand_cmd: str | Sequence[str], out_dir: str | os.PathLike, *,
        ref_env: Mapping[str, str] | None = None, cand_env: Mapping[str, str] | None = None,
        rtol: float | None = None, atol: float | None = None, timeout_s: float = 600.0,
        stall_s: float | None = liveness.STALL_S, replay: bool = True,
        log: Callable[[str], Any] | None = None) -> Comparison:
    """Run both commands recorded and compare them op by op (the reference first). Writes out_dir/compare.json."""
    from gpulab.numerics import tolerance

    tolerance.check(rtol, atol)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    say = log or (lambda s: print(f"[gpulab compare] {s}", file=sys.stderr))
    argvs = (argv_of(ref_cmd), argv_of(cand_cmd))
    envs = (dict(ref_env or {}), dict(cand_env or {}))
    # a command that cannot start is said before either runs: a typo must not cost a whole reference run first
    runs = unstartable(argvs, envs, out)
    snaps: list = [None, None] if runs else []
    for r in runs:
        say(f"{r.side}: {_ended(r)}")
    for side, argv, env in () if runs else zip(SIDES, argvs, envs):
        snaps.append(workdir.snapshot(os.getcwd(), skip=(out,)))   # the commands run in the caller's folder
        say(f"running the {side}: {shlex.join(argv)}")
        r = run_side(side, argv, out, env=env, timeout_s=timeout_s, stall_s=stall_s)
        say(f"{side}: {r.status}, {r.ops} ops recorded in {r.elapsed_s:.1f}s")
        runs.append(r)
    ref, cand = runs
    same = argvs[0] == argvs[1] and envs[0] == envs[1]
    job: dict = {}
    if len(ref.ranks) > 1 and set(ref.ranks) == set(cand.ranks):   # a job: rank against rank
        job, j = _by_rank(ref, cand, rtol, atol, same)
        ref, cand = (replace(r, records=r.ranks[job["rank"]]) for r in (ref, cand))
    else:
        j = _judge.judge(list(ref.records), list(cand.records), rtol=rtol, atol=atol, same_command=same)
    rep = None
    if all(r.status == "ok" for r in runs):
        status, summary = j.status, j.sentence
        if job and status == "agree":
            summary = (f"All {job['world']} ranks agree, each with the same rank of the other run. "
                       f"Rank {job['rank']}: {summary}")
        elif job:
            summary = (f"On rank {job['rank']} of {job['world']} (each rank against the same rank of the other run): "
                       f"{summary}")
        if j.status == "diverged" and replay and j.keep and not job:   # a collective's peers cannot be replayed
            plan, after = _plan(ref, cand, j, rtol, atol, same)
            now = workdir.snapshot(os.getcwd(), skip=(out,))
            wrote_by_runs = (workdir.written(snaps[0], now, root=os.getcwd())
                             if snaps[0] is not None and now is not None else None)
            together = side_by_side((ref, cand), wrote_by_runs, device.usable_cores())
            say(f"replaying the diverging op alone ({'both sides at once' if together else 'each side'} again, up "
                f"to that op{_also(plan)})")
            reps = _replay(argvs, envs, out, plan, rtol, atol, timeout_s, stall_s, together,
                           (ref.records, cand.records))
            for n, (j, rep) in enumerate(zip(plan, reps)):   # past each op both runs compute right: rounding
                if (not (rep.get("reference_right") and rep.get("candidate_right")) or rep.get("arguments")
                        or rep.get("reproduced") is False or n == ROUNDING_REPLAYS):
                    break
                op, site, npass, _ = j.keep[0].split("|")
                say(f"{op} at {_judge.short(site)} (pass {npass}): its difference is rounding (both sides right "
                    f"against float64)")
                if n == len(plan) - 1:
                    j, rep = after, {}
            status, summary = j.status, j.sentence
            rep = rep or None
            if rep and rep.get("words"):
                summary = summary.rstrip(".") + "; " + rep["words"] + "."
            if rep and rep.get("cause"):
                summary = summary.rstrip(".") + f"; the NaN/Inf's cause: {rep['cause']}."
    else:
        status, summary = "failed", _failed((ref, cand), j)
    wrote = workdir.written(*snaps, root=os.getcwd())
    if status != "agree" and wrote:
        summary = summary.rstrip() + " " + workdir.words(wrote)
    res = Comparison(status, summary, j.first_divergence if j else None, j.first_bitwise if j else None,
                     j.parted if j else None, j.tolerance.to_dict() if j and j.tolerance else None, (ref, cand), rep,
                     j.rows if j else (), str(out),
                     {"reference_ops": ref.ops, "candidate_ops": cand.ops, "aligned": j.aligned if j else 0,
                      "by": j.aligned_by if j else None}, tuple(wrote), job)
    if res.first_divergence is not None and rep is not None:
        res.first_divergence["replay"] = rep
        if rep.get("cause"):
            res.first_divergence["cause"] = rep["cause"]
    elif res.first_divergence is not None and res.first_divergence.get("nan_inf"):
        res.first_divergence["cause"] = "cause unknown (the op's inputs were not kept)"
    report.write_json(out / "compare.json", res.to_dict())
    return res


def _by_rank(ref: Run, cand: Run, rtol, atol, same: bool) -> tuple[dict, _judge.Judgement]:
    """Each rank's records against the same rank's of the other run; the verdict is about the rank where an op
    makes the difference (not one where it only comes in through a collective), else the first that differs."""
    got = {r: _judge.judge(list(ref.ranks[r]), list(cand.ranks[r]), rtol=rtol, atol=atol, same_command=same)
           for r in sorted(ref.ranks)}

    def received(j: _judge.Judgement) -> bool:
        return j.status != "diverged" or bool((j.first_divergence or {}).get("from_other_rank"))

    rank = min(got, key=lambda r: (received(got[r]), got[r].status == "agree", r))
    return {"rank": rank, "world": len(got), "ranks": {str(r): j.status for r, j in got.items()}}, got[rank]


def _plan(ref: Run, cand: Run, j: _judge.Judgement, rtol, atol, same: bool
          ) -> tuple[list[_judge.Judgement], _judge.Judgement | None]:
    """The diverging op and those that would be named next if each before it proved rounding (at most
    ROUNDING_REPLAYS of them), so that one replay per side keeps them all; and the judgement past the last of
    them when it names no op to replay (None when the plan is full)."""
    plan = [j]
    while len(plan) <= ROUNDING_REPLAYS:
        nxt = _judge.judge(list(ref.records), list(cand.records), rtol=rtol, atol=atol, same_command=same,
                           rounding=tuple(p.keep[0] for p in plan))
        if not (nxt.status == "diverged" and nxt.keep):
            return plan, nxt
        plan.append(nxt)
    return plan, None


def _also(plan: list) -> str:
    return f", keeping the {len(plan) - 1} named next in case it is rounding" if len(plan) > 1 else ""


def side_by_side(runs: Sequence[Run], wrote: Sequence[str] | None, cores: int) -> bool:
    """Whether the two replays may run at once: then they take the longer one's time, not the sum. Only where
    they cannot meet: spare cores, at most one side on a GPU (a program sized for a GPU's memory may not fit
    twice) and no file the runs wrote in the working folder (one side could read what the other writes; None:
    not known)."""
    if wrote is None or wrote or cores < SIDE_BY_SIDE_CORES:
        return False
    on_gpu = [any(r.get("device", "cpu") != "cpu" for r in run.records) for run in runs]
    return sum(on_gpu) <= 1


def _by_key(records: Sequence[dict], keys: set[str]) -> dict[str, dict]:
    """The records of these keys (op|site|pass|out), in one pass over a run's records."""
    out: dict[str, dict] = {}
    for r in records:
        k = _judge.key(r)
        if k in keys and k not in out:
            out[k] = r
    return out


def reproduced(first: Sequence[dict], again: Sequence[dict], keep: str, rtol=None, atol=None,
               apart: float = 1.0) -> bool | None:
    """Whether a replay run gave the kept op (its key) the values its first run gave: closer to them than the two
    compared runs are to each other (`apart`: their difference over the tolerance) and than the tolerance (a GPU's
    atomics may change the last bits); None where either run lacks its record. `first`/`again`: the runs' records,
    or only those of the kept keys (_by_key)."""
    a = _by_key(first, {keep}).get(keep)
    b = _by_key(again, {keep}).get(keep)
    if a is None or b is None:
        return None
    return figures.compare(a, b, for_dtypes(a.get("dtype"), rtol=rtol, atol=atol)).excess < max(1.0, apart)


def _not_reproduced(sides: Sequence[str]) -> str:
    whose = " and ".join(f"the {s}'s" for s in sides)
    runs, their = ("runs", "their first runs") if len(sides) > 1 else ("run", "its first run")
    return (f"no replay: {whose} replay {runs} gave this op other values than {their} (a program whose runs differ, "
            "or one that reads what another run wrote), so what the replay kept is not what was compared")


def _replay(argvs, envs, out: Path, plan: list[_judge.Judgement], rtol, atol, timeout_s, stall_s,
            together: bool = False, firsts: Sequence[Sequence[dict]] = ((), ())) -> list[dict]:
    """One run per side keeps every planned op's inputs: per op, which run is right (replay.judge), and whether
    each replay run reproduced its first run at that op (else its judgement is of other inputs: a program whose
    runs differ, or one reading what another run wrote)."""
    from gpulab.numerics import replay

    def side(n: int) -> Run:
        return run_side(SIDES[n], argvs[n], out, env=envs[n], timeout_s=timeout_s, stall_s=stall_s,
                        keep="\n".join(p.keep[n] for p in plan), name=f"{SIDES[n]}.replay")

    if together:
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="replay") as pool:
            again = list(pool.map(side, (0, 1)))
    else:
        again = [side(0), side(1)]
    keys = [{p.keep[k] for p in plan} for k in (0, 1)]   # each run's records read once for every planned op
    firsts = [_by_key(firsts[k], keys[k]) for k in (0, 1)]
    kept = [_by_key(again[k].records, keys[k]) for k in (0, 1)]
    reps = []
    for n, p in enumerate(plan):
        try:
            rep = replay.judge(Path(again[0].folder), Path(again[1].folder), rtol, atol, n)
        except Exception as exc:  # noqa: BLE001 - the verdict stands without its replay
            rep = {"available": False, "words": f"no replay: {type(exc).__name__}: {exc}"[:300]}
        apart = ((p.first_divergence or {}).get("error") or {}).get("excess")
        apart = apart if isinstance(apart, (int, float)) else float("inf")   # "inf": NaN on one side, as far as can be
        same = {s: reproduced(list(firsts[k].values()), list(kept[k].values()), p.keep[k], rtol, atol, apart)
                for k, s in enumerate(SIDES)}
        rep["reproduced"] = False if False in same.values() else (None if None in same.values() else True)
        off = [s for s, ok in same.items() if ok is False]
        if off:   # what it kept is not what was compared: its judgement (which run is right, the call) is not said
            rep = {"available": False, "reproduced": False, "replayed": rep, "words": _not_reproduced(off)}
        reps.append(rep)
    return reps


def finding(c: Comparison) -> tuple[str, dict]:
    """The notebook's headline and metrics (gpulab.report.record) of a comparison."""
    fd = c.first_divergence or {}
    err = fd.get("error") or {}
    return c.summary, {"status": c.status, "op": fd.get("op"), "call_site": fd.get("call_site"),
                       "pass": fd.get("pass"), "excess": err.get("excess"), "max_rel_err": err.get("max_rel_err"),
                       "nondeterministic_op": (c.first_bitwise or {}).get("op"),
                       "aligned_ops": c.aligned.get("aligned"), "reference_ops": c.aligned.get("reference_ops"),
                       "candidate_ops": c.aligned.get("candidate_ops")}
