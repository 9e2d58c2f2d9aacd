"""What the watchdog saw -> the verdict (DESIGN.md's contract). Pure: plain data in, plain data out.

The watchdog (`gpulab.hang.watchdog.watch`) gathers an `Observation` (how the run ended, the op log, the stacks,
stderr); `judge` turns it into a `Verdict`, so the verdict logic is tested on recorded inputs without
running anything. The sync line lies: when earlier ops finished on the host but their GPU work never
completed, the earliest of them is the op in flight and the op the host waits in is reported apart.
"""
from __future__ import annotations

import re
import signal
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from gpulab.hang import capture, classify, collate, freedgraph, inplace, lockcycle, memtrend, owner
from gpulab.trace import analysis
from gpulab.trace.analysis import localize  # noqa: F401 - hang.verdict.localize, as before
from gpulab.trace.liveness import STATUSES

EXIT_CODES = {"ok": 0, "error": 1, "hang": 3, "crash": 4, "timeout": 5}


@dataclass(frozen=True)
class Verdict:
    status: str
    phase: str
    cls: str | None
    in_flight_op: dict | None
    host_blocked_in: dict | None
    last_completed_op: dict | None
    ops_completed: int
    signal: str | None
    exit_code: int | None
    elapsed_s: float
    stacks: dict
    evidence: tuple[str, ...]
    planted: str | None
    capture_s: dict
    command: tuple[str, ...]
    log: dict
    stderr_tail: str = ""
    mode: str | None = None
    stall_s: float = 0.0
    timeout_s: float = 0.0
    hang_started_s: float | None = None     # elapsed time of the last progress before the hang
    time_to_verdict_s: float | None = None  # from the last progress to the verdict (stall + capture + kill)
    open_ops: tuple[dict, ...] = ()
    oplog_tail: tuple[dict, ...] = ()
    collapsed: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    left_running: tuple = ()  # processes of the run still alive after it ended by itself (then ended)
    # how in_flight_op was found: host (the open op) | gpu_event (the earliest op whose GPU work never
    # completed) | driver (the open op, the host stuck in a driver call inside it, all earlier GPU work
    # complete) | raised | None
    localized: str | None = None
    driver_call: str | None = None    # the GPU driver/runtime call the host thread is in (cuLaunchKernel, ...)
    # the fixes whose declared evidence this verdict shows (gpulab.fixes.answers.suggest): {"fix", "because",
    # "facts", "apply"}; what the report tells the user to try, and what `gpulab fixes --scenario auto` runs first
    suggested: tuple[dict, ...] = ()
    # a job of several processes (gpulab.hang.jobs.job): the per-process table, the first divergence of a process
    # group's collectives ({"group", "seq", "op", "waiting", "missing", "instead", "mismatch"}), and the role of
    # the process the finding names
    processes: tuple[dict, ...] = ()
    divergence: dict | None = None
    culprit: str | None = None
    # whose code the culprit is (gpulab.hang.owner.Owner as a dict: kind program|library|platform|unknown, where,
    # why) and, for a GPU memory fault where compute-sanitizer ran, its report (gpulab.hang.memcheck)
    owner: dict | None = None
    memcheck: dict | None = None
    # a crash inside torch.compile'd code: how the same program ran once eager, and where it failed then
    # (gpulab.hang.eagerrun: the op's own error and the program's line the generated kernel cannot name)
    eager_rerun: dict | None = None
    # `gpulab watch --on-stall keep`: every stall seen ({"t", "for_s", "where", "recovered", "pause", "window",
    # "capture"}), bounded (gpulab.hang.watchdog.stalls.kept); and a signal the watchdog passed on to the job
    stalls: tuple[dict, ...] = ()
    interrupted: dict | None = None
    # `gpulab watch --mode stats`: the first NaN/Inf an op made ({"op", "call_site", "pass", "backward", "cause",
    # "sentence", "next_step"}, gpulab.trace.firstnan), whatever the status
    first_nonfinite: dict | None = None
    # outside stats mode: the first line of the program's output that printed a NaN or an infinity (a loss of nan
    # in a run that ended well), so that an "ok" is not read as healthy numbers
    printed_nonfinite: str = ""
    # autograd's "modified by an inplace operation", read against the op log (gpulab.hang.inplace): the forward op
    # that saved the tensor and the in-place op(s) that changed it after
    modified_in_place: dict | None = None
    # autograd's "backward through the graph a second time", read against the op log (gpulab.hang.freedgraph): the
    # node it met and the forward line(s) that make such nodes
    freed_graph: dict | None = None
    # threads that wait for each other's locks, from their Python stacks and the sources (gpulab.hang.lockcycle)
    lock_cycle: dict | None = None
    # a batch the DataLoader's default collate could not stack (gpulab.hang.collate): the op, the samples' sizes,
    # the program's line that made them, the worker it ran in
    collate: dict | None = None
    # out of memory: whether the memory held climbed through the run before it ran out (gpulab.hang.memtrend)
    memory_trend: dict | None = None

    @property
    def drill(self) -> bool:
        """A planted fault: the verdict is a self-test of the watchdog, not a finding about the workload."""
        return self.planted is not None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["class"] = d.pop("cls")
        d["drill"] = self.drill
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Verdict":
        kw = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        kw["cls"] = d.get("class")
        for k in ("evidence", "command", "open_ops", "oplog_tail", "notes", "left_running", "suggested", "processes",
                  "stalls"):
            kw[k] = tuple(d.get(k) or ())
        return cls(**kw)


@dataclass(frozen=True)
class Observation:
    """Everything the watchdog observed of one run, before judging it."""
    command: tuple[str, ...]
    status: str                       # ok | hang | timeout | crash | error (from the loop and the exit code)
    exit_code: int | None
    elapsed_s: float
    recorded: bool                    # a Python command under the recorder, whose op log exists
    records: tuple = ()               # trace.OpRecord (or dicts with the same keys)
    ops_started: int = 0
    ops_completed: int = 0
    dropped: int = 0
    log_stopped_at: int | None = None   # the recorder stopped writing after this many ops (the disk was full)
    raise_marks: bool | None = None   # the recorder marks an op that raises (None: not known)
    python_text: str = ""             # faulthandler dump (or py-spy text)
    native_text: str = ""             # py-spy --native or gdb text
    gpu_text: str | None = None
    capture_notes: tuple[tuple[str, str], ...] = ()  # (step, note) of capture steps that fell short
    capture_s: dict = field(default_factory=dict)
    stderr_tail: str = ""
    planted: str | None = None
    mode: str | None = None
    stall_s: float = 0.0
    timeout_s: float = 0.0
    hang_started_s: float | None = None
    verdict_at_s: float | None = None
    pid: int | None = None
    notes: tuple[str, ...] = ()
    left_running: tuple = ()
    tail: int = 20
    registered: tuple[tuple[str, str], ...] = ()   # custom-op namespaces and kernels in the program's sources
    memory: tuple = ()                # the recorder's memory samples (trace.ring.MemSample)


# ------------------------------------------------------------------------------------ pure helpers

def _get(rec: Any, key: str, default: Any = None) -> Any:
    if isinstance(rec, Mapping):
        return rec.get(key, default)
    return getattr(rec, key, default)


def op_dict(rec: Any) -> dict | None:
    """An op record -> the verdict's op: name, shapes, dtypes, strides, device, call site."""
    if rec is None:
        return None
    args = list(_get(rec, "args", ()) or ())
    tensors = [a for a in args if isinstance(a, Mapping) and "shape" in a]
    device = next((a.get("device") for a in tensors if a.get("device")), None)
    t0, t1 = _get(rec, "t_start"), _get(rec, "t_end")
    return {
        "seq": _get(rec, "seq"),
        "name": _get(rec, "name"),
        "shapes": [list(a.get("shape") or ()) for a in tensors],
        "dtypes": [a.get("dtype") for a in tensors],
        "strides": [list(a.get("stride") or ()) for a in tensors],
        "contiguous": [a.get("contiguous") for a in tensors],
        "device": device,
        "call_site": _get(rec, "call_site"),
        "thread": _get(rec, "thread"),
        "t_start": t0,
        "t_end": t1,
        "duration_s": (t1 - t0) if (t0 is not None and t1 is not None) else None,
        "gpu_done": _get(rec, "gpu_done"),
        "stream": _get(rec, "stream"),   # the op's CUDA stream (an index into the log's streams) when tracked
    }


_DRIVER_API = re.compile(r"^(cu|cuda|hip|hsa)[A-Z_]\w*$")
_LAUNCH_APIS = ("cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cudaLaunchKernel",
                "cudaLaunchKernelExC", "hipLaunchKernel", "hipModuleLaunchKernel")


def driver_call(native_threads: Sequence[capture.Thread]) -> str | None:
    """The innermost named GPU driver/runtime API call on the main thread's native stack (cuLaunchKernel,
    cuStreamSynchronize, ...), or None."""
    main = classify.main_thread(native_threads)
    for frame in (main.frames[:30] if main else ()):
        name = frame.split(" (", 1)[0].strip()
        if _DRIVER_API.match(name):
            return name
    return None


def within_facts(inflight: Any, records: Sequence[Any]) -> list[str]:
    """Where the in-flight record ran: the records it is nested in (a compiled region, a graph call, a user's
    record_function), and what the recorder cannot see inside a record with nothing open in it."""
    outer = analysis.enclosing(records, inflight)
    names = [_get(r, "name") for r in outer] + [_get(inflight, "name")]
    out = []
    if outer:
        chain = " > ".join(f"{_get(r, 'name')} ({_get(r, 'call_site') or '?'})" for r in outer)
        out.append(f"{_get(inflight, 'name')} ran inside {chain}"
                   + ("; compiled by torch.compile, which ran as without gpulab" if analysis.compiled_code(names) else ""))
    if _get(inflight, "kind") == "composite" and _get(inflight, "t_end") is None:
        out.append(f"no record inside {_get(inflight, 'name')} is open: the host is in code between its ops or in "
                   f"work the recorder does not see (a kernel torch.compile generated for the CPU, Python code, a "
                   f"library's own threads); the stacks say where")
    return out


def gpu_facts(inflight: Any, localized: str | None, records: Sequence[Any], api: str | None) -> list[str]:
    """What GPU progress says about where the GPU stopped, in words that do not overclaim: work launched
    outside the dispatcher (a raw Triton or CUDA kernel) is invisible to the recorder."""
    out = []
    name, site = _get(inflight, "name"), _get(inflight, "call_site") or "?"
    if localized == "gpu_event":
        seq, stream = _get(inflight, "seq"), _get(inflight, "stream")
        before = [r for r in records if _get(r, "seq") < seq and _get(r, "stream") == stream
                  and _get(r, "gpu_done") is True]
        if before:
            prev = max(before, key=lambda r: _get(r, "seq"))
            out.append(f"the GPU finished {_get(prev, 'name')} (#{_get(prev, 'seq')} at {_get(prev, 'call_site') or '?'})"
                       f" but never {name} (#{seq} at {site}): its own kernel never completed, or GPU work launched "
                       f"outside PyTorch's dispatcher between those two call sites (a raw CUDA or Triton kernel, "
                       f"torch.cuda._sleep) holds the stream")
        else:
            out.append(f"{name} is the first recorded op whose GPU work never completed; work launched before it "
                       f"outside PyTorch's dispatcher would hold its stream too")
    if localized == "driver":
        out.append(f"the GPU work of every earlier op completed and the host is stuck in {api} inside {name}: the "
                   f"GPU work that never completes was launched inside {name} (or just before it, outside "
                   f"PyTorch's dispatcher)")
    if api in _LAUNCH_APIS:
        out.append(f"the host is stuck launching a kernel ({api}), not waiting for a result: with lazy module "
                   f"loading (CUDA_MODULE_LOADING=LAZY, the default since CUDA 12.2) a kernel's first launch loads "
                   f"its module and waits for the kernels already running, so a kernel that never finishes blocks "
                   f"it (loading every module at start-up moves that wait to the next sync); a full launch queue "
                   f"blocks the same way")
    return out


def _raised_at(stderr: str) -> tuple[str, str, bool] | None:
    """(file, line, raised by Python code: a `raise`, or the standard library) of the traceback frame a recorded
    op's call site would name (gpulab.hang.owner.call_site_frame), the last flag from the innermost frame of all."""
    lines = (stderr or "").splitlines()
    at = [i for i, ln in enumerate(lines) if classify.TB_FRAME.match(ln)]
    fr = owner.call_site_frame(owner.traceback_frames(stderr))
    if not at or fr is None:
        return None
    inner = classify.TB_FRAME.match(lines[at[-1]]).group("file")
    # a `raise` in Python, not in a dispatch mode of gpulab's raising for the op (a planted fault); or raised in
    # the standard library's own code (pickle, multiprocessing, socket): an op raises from C++ with its caller
    # innermost, which is never the standard library's (seen: a DataLoader pickling a lambda for its spawn workers,
    # read as the .item() before it)
    by_raise = ((at[-1] + 1 < len(lines) and lines[at[-1] + 1].strip().startswith("raise ")
                 and owner.origin(inner)[0] != "tool") or owner.origin(inner)[0] == "stdlib")
    return fr[1], fr[2], by_raise


def _called_at(rec: Any, where: tuple[str, str, bool]) -> bool:
    """Whether an op record's call site is the traceback's line `where`."""
    path, _, rest = str(_get(rec, "call_site") or "").partition(":")
    return bool(path) and rest.split(" ", 1)[0] == where[1] and (where[0] == path or where[0].endswith("/" + path))


def raised_op(records: Sequence[Any], stderr: str, marks: bool | None = None) -> Any:
    """The op whose exception ended the program: the last one the recorder marked raised, unless the traceback
    says the exception came from another line (the op's was caught: a fallback in a try/except, a program's
    own error after it) or from a Python `raise` (load_state_dict's error after its copies). None where the
    recorder marks raises (`marks`) and marked none: torch raised outside any op (torch.save into a folder that
    does not exist, after the detach it ran at the same line). Where it does not mark them, or it is not known
    (an older log; a build where neither an exception in flight nor missing outputs tell), the last op recorded if
    it was called from the traceback's line; never for a GPU error, raised at a later sync, where the line lies."""
    if not records:
        return None
    where = _raised_at(stderr)
    marked = [r for r in records if _get(r, "raised")]
    if marked:
        last = max(marked, key=lambda r: _get(r, "seq"))
        return last if where is None or (_called_at(last, where) and not where[2]) else None
    if marks or where is None or where[2] or classify.memory_fault(stderr) or "CUDA error" in stderr:
        return None
    last = max(records, key=lambda r: _get(r, "seq") or 0)
    return last if _get(last, "t_end") is not None and _called_at(last, where) else None


def python_blocked_frame(py_threads: Sequence[capture.Thread]) -> dict | None:
    """Where the main Python thread waits when no recorded op is open (e.g. torch.cuda.synchronize())."""
    main = classify.main_thread(py_threads)
    if not main or not main.frames:
        return None
    func, _, where = main.frames[0].partition(" (")
    return {"name": f"{func} (Python frame, not a recorded op)", "call_site": where.rstrip(")")}


def oplog_line(o: Mapping[str, Any]) -> str:
    return (f"{o['seq']:>6} {'OPEN ' if o['t_end'] is None else 'done '}"
            f"{'' if o['gpu_done'] is None else ('gpu-done ' if o['gpu_done'] else 'gpu-PENDING ')}"
            f"{o['name']} {o['shapes']} {o['call_site'] or ''}")


def _threads(obs: Observation) -> tuple[tuple[capture.Thread, ...], tuple[capture.Thread, ...]]:
    py = obs.python_text
    python = capture.parse_python(py) if "(most recent call first)" in py else \
        (capture.parse_native(py, obs.pid) if py else ())
    return python, capture.parse_native(obs.native_text, obs.pid)


def line_pass(records: Sequence[Any], rec: Any) -> int | None:
    """Which call of its op from its call site the record is, counting from 1 (owner.pass_words: calls, not loop
    steps). None where the op has no call site."""
    name, site, seq = _get(rec, "name"), _get(rec, "call_site"), _get(rec, "seq")
    if not site or seq is None:
        return None
    return sum(1 for r in records if _get(r, "call_site") == site and _get(r, "name") == name
               and _get(r, "seq") is not None and _get(r, "seq") <= seq)


# ------------------------------------------------------------------------------------ the judgement

def judge(obs: Observation, *, log: Mapping[str, Any] | None = None) -> Verdict:
    """The verdict of one observed run. Never reads `planted` to decide anything: a drill is judged like a
    bug, and only labelled afterwards."""
    if obs.status not in STATUSES:
        raise ValueError(f"observation status {obs.status!r} is not valid; choose one of {', '.join(STATUSES)}")
    status, records, notes = obs.status, list(obs.records), list(obs.notes)
    inflight, blocked, open_recs = localize(records) if status != "ok" else (None, None, [])
    localized = None
    if inflight is not None:
        localized = "gpu_event" if _get(inflight, "gpu_done") is False else "host"
    if inflight is None and status == "error":
        inflight = raised_op(records, obs.stderr_tail, obs.raise_marks)
        if inflight is not None:   # the op whose exception ended the program
            localized = "raised"
            notes.append(f"{_get(inflight, 'name')} raised" + (" (the recorder marked it)" if _get(inflight, "raised")
                         else " (the last op recorded at the line the exception came from: this PyTorch build's "
                         "ops are not marked when they raise)") + "; it is reported as in_flight_op")
    done = [r for r in records if _get(r, "t_end") is not None]
    last_done = max(done, key=lambda r: _get(r, "seq")) if done else None
    py_threads, native_threads = _threads(obs)
    phase = classify.host_phase(obs.recorded, obs.ops_started, native_threads, py_threads)
    blocked_d = op_dict(blocked)
    if inflight is not None and blocked is None and _get(inflight, "t_end") is not None:
        blocked_d = python_blocked_frame(py_threads)  # host waits outside any recorded op
    api = driver_call(native_threads) if status in ("hang", "timeout") else None
    if inflight is not None and blocked is None and _get(inflight, "t_end") is None and api:
        # the host never left the in-flight op: it is stuck in the driver inside it
        blocked_d = {"name": f"{api} (a GPU driver call inside {_get(inflight, 'name')})",
                     "call_site": _get(inflight, "call_site"), "driver": True}
        earlier = [r for r in records if _get(r, "seq") < _get(inflight, "seq") and _get(r, "gpu_done") is not None]
        if earlier and all(_get(r, "gpu_done") for r in earlier):
            localized = "driver"
    elif blocked_d and api and not blocked_d.get("driver"):
        blocked_d = {**blocked_d, "api": api}   # which driver call the waiting op is in (a launch is no sync)
    if status in ("hang", "timeout") and inflight is None and blocked_d is None:
        # no recorded op was open: say where the host is (a Python frame, a driver call outside the dispatcher)
        where = python_blocked_frame(py_threads)
        if where is not None or api:
            blocked_d = {**(where or {"name": "native code (no Python frame captured)", "call_site": None}),
                         **({"api": api} if api else {}), "outside_ops": True}
    sig = _signal_name(obs.exit_code) if status == "crash" else None
    cycle = lockcycle.find(py_threads) if status in ("hang", "timeout") and inflight is None else None
    evidence = classify.Evidence(
        status=status, phase=phase, in_flight_op=op_dict(inflight), host_blocked_in=blocked_d,
        native=native_threads, python=py_threads, gpu_text=obs.gpu_text or "", signal=sig,
        exit_code=obs.exit_code, stderr_tail=obs.stderr_tail, open_ops=tuple(op_dict(r) for r in open_recs),
        localized=localized, lock_cycle=cycle)
    if status == "ok":
        cls, facts = None, [f"exit code 0 after {obs.ops_completed} recorded op(s)" if obs.recorded else "exit code 0"]
    else:
        c = classify.classify(evidence)
        cls, facts = c.cls, list(c.facts)
        if cls == "unknown" and sig == "SIGKILL" and memtrend.climbed(obs.memory):
            # no process can catch SIGKILL: the climb is the evidence of who sent it
            cls = "out_of_memory"
            facts = [f for f in facts if f != "no rule matched the evidence"] + [memtrend.KILLED]
    if inflight is not None and status != "ok":
        facts.extend(within_facts(inflight, records))
    if inflight is not None and status in ("hang", "timeout"):
        facts.extend(gpu_facts(inflight, localized, records, api))
    if status in ("hang", "timeout"):
        facts.append(f"the watchdog stopped the whole process tree after the capture; exit code {obs.exit_code}")
    if status == "error":
        facts.append(f"exit code {obs.exit_code}; stderr tail: "
                     + " | ".join(obs.stderr_tail.strip().splitlines()[-3:]))
    if status == "crash" and "Fatal Python error" in obs.python_text:
        facts.append("faulthandler: " + obs.python_text.strip().splitlines()[0])
    facts.extend(f"{step} capture: {note}" for step, note in obs.capture_notes if note)
    if obs.left_running:
        facts.append(f"{len(obs.left_running)} process(es) of the run were still running after it ended: "
                     + ", ".join(str(p) for p in obs.left_running) + " (then ended)")
    if obs.planted:
        facts.append(f"PLANTED fault {obs.planted} (a self-test: the failure was put there on purpose)")
    if obs.dropped:
        notes.append(f"op log ring dropped {obs.dropped} old record(s)")
    if obs.log_stopped_at is not None:   # evidence, so that it is shown with the verdict, not only kept
        facts.append(f"recording stopped after {obs.log_stopped_at} op(s): the disk had no space left for the op "
                     f"log; the program ran on, and its later ops are not in the log (an op named from it may "
                     f"not be the last one)")
    oplog_tail = tuple(op_dict(r) for r in records[-obs.tail:])
    changed = inplace.find(obs.stderr_tail, records) if cls == "refused_call" else None
    if changed:
        facts.append(f"from the op log: {inplace.words(changed)}")
    freed = freedgraph.find(obs.stderr_tail, records, op_dict(inflight)) if cls == "refused_call" else None
    if freed:
        facts.append(f"from the op log: {freedgraph.words(freed)}")
    coll = collate.find(obs.stderr_tail, records, inflight, mine=owner.program_site) \
        if cls == "refused_call" and localized == "raised" else None
    if coll:
        facts.append(f"from the op log: {collate.words(coll)}")
    mem = memtrend.trend(obs.memory) if cls == "out_of_memory" else None
    if mem:
        facts.append(f"from the recorder's memory samples: {memtrend.words(mem)}")
    nth = line_pass(records, inflight) if inflight is not None and not obs.dropped else None
    inflight_d = op_dict(inflight)
    if nth:
        inflight_d["pass"] = nth
        facts.append(owner.pass_words(inflight_d, nth))
    who = None if status == "ok" else owner.decide(
        {"status": status, "class": cls, "signal": sig, "in_flight_op": inflight_d, "localized": localized,
         "modified_in_place": changed, "freed_graph": freed, "collate": coll, "memory_trend": mem,
         "lock_cycle": cycle, "pid": obs.pid,
         "stacks": {"python": py_threads, "native": native_threads, "gpu": obs.gpu_text},
         "stderr_tail": obs.stderr_tail, "open_ops": [op_dict(r) for r in open_recs]},
        dict(obs.registered)).to_dict()
    return Verdict(
        status=status, phase=phase, cls=cls, in_flight_op=inflight_d, host_blocked_in=blocked_d,
        last_completed_op=op_dict(last_done), ops_completed=obs.ops_completed, signal=sig,
        exit_code=obs.exit_code, elapsed_s=round(obs.elapsed_s, 3),
        stacks={"python": obs.python_text, "native": obs.native_text, "gpu": obs.gpu_text},
        evidence=tuple(facts), planted=obs.planted, capture_s=dict(obs.capture_s), command=tuple(obs.command),
        log=dict(log or {}), stderr_tail=obs.stderr_tail[-2000:], mode=obs.mode, stall_s=obs.stall_s,
        timeout_s=obs.timeout_s,
        hang_started_s=round(obs.hang_started_s, 3) if obs.hang_started_s is not None else None,
        time_to_verdict_s=(round(obs.verdict_at_s - obs.hang_started_s, 3)
                           if obs.hang_started_s is not None and obs.verdict_at_s is not None else None),
        open_ops=tuple(op_dict(r) for r in open_recs), oplog_tail=oplog_tail,
        collapsed={"python": capture.collapse(py_threads), "native": capture.collapse(native_threads)},
        notes=tuple(notes), left_running=tuple(obs.left_running), localized=localized, driver_call=api, owner=who,
        modified_in_place=changed, freed_graph=freed, collate=coll, memory_trend=mem, lock_cycle=cycle)


def _signal_name(rc: int | None) -> str | None:
    if rc is None or rc >= 0:
        return None
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def op_brief(op: Mapping[str, Any] | None) -> str:
    if not op:
        return "-"
    shapes = " x ".join(str(tuple(s)) for s in op.get("shapes") or ())
    return f"{op.get('name')} {shapes}".strip()


def headline(v: Verdict) -> str:
    """One sentence for the index. A drill says so first: it tests the watchdog, not the workload."""
    if v.status == "ok":
        text = f"the program finished (ok, {v.ops_completed} ops recorded)"
    elif v.culprit or v.divergence:
        text = f"{v.status} ({v.cls}) {job_where(v)}"
    else:
        where = op_brief(v.in_flight_op) if v.in_flight_op else f"phase {v.phase}"
        site = f" at {v.in_flight_op['call_site']}" if v.in_flight_op and v.in_flight_op.get("call_site") else ""
        blocked = f"; host blocked in {v.host_blocked_in['name']}" if v.host_blocked_in else ""
        text = f"{v.status} ({v.cls}) in {where}{site}{blocked}"
    return f"self-test of the watchdog with a planted {v.planted}: {text}" if v.drill else text


def job_where(v: Verdict) -> str:
    """Where a job of several processes is stuck: the collective (group, seq), who waits, who does what."""
    d = v.divergence or {}
    coll = f"at {d['op']} (group {d['group']}, seq {d['seq']})" if d.get("op") else ""
    instead = dict(d.get("instead") or {})
    if v.culprit and v.culprit not in instead and v.in_flight_op:
        instead[v.culprit] = f"in {op_brief(v.in_flight_op)}"
    if v.culprit and v.culprit not in instead:
        row = next((p for p in v.processes if p.get("role") == v.culprit), {})
        instead[v.culprit] = (f"at {row.get('frame')}" if row.get("frame") else
                              "failed first, on its own" if v.status in ("error", "crash") else "no progress")
    waiting = ", ".join(d.get("waiting") or ())
    parts = [f"{who}: {what}" for who, what in instead.items()]
    if waiting and d.get("op"):
        parts.append(f"{waiting} wait{'s' if len(d['waiting']) == 1 else ''} in it")
    return ": ".join(x for x in (coll, "; ".join(parts)) if x)


def finding(v: Verdict) -> tuple[str, dict]:
    """Notebook 03's headline and metrics from one watched run."""
    op = v.in_flight_op or {}
    return headline(v), {
        "status": v.status, "phase": v.phase, "class": v.cls, "in_flight_op": op.get("name"),
        "call_site": op.get("call_site"), "host_blocked_in": (v.host_blocked_in or {}).get("name"),
        "localized": v.localized, "planted": v.planted, "drill": v.drill, "time_to_verdict_s": v.time_to_verdict_s,
        "capture_s": v.capture_s.get("total"), "ops_completed": v.ops_completed, "elapsed_s": v.elapsed_s,
        "processes": len(v.processes), "culprit": v.culprit, "owner": v.owner,
        "divergence": {k: (v.divergence or {}).get(k) for k in ("group", "seq", "op")} if v.divergence else None}
