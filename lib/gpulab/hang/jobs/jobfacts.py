"""What the cross-process judgement works on and gives: each process's view (gpulab.hang.jobs.jobread makes them
from the job's folder), its collectives, and the finding. Apart from the judgement so that the readers
(jobread, jobview, merge) and every part of it (job, jobgroup, jobloop, jobwords) share one vocabulary;
standard library only, as the judgement runs in a watched child and in the notebook."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# classes this module adds to gpulab.hang.classify's vocabulary
CLASSES = ("collective_mismatch", "rank_stuck", "worker_stuck", "child_stuck", "uneven_inputs", "skipped_collective")


@dataclass(frozen=True)
class Collective:
    """One torch.distributed call of one process, as its op log recorded it."""
    op: str                    # all_reduce, broadcast, barrier, send, recv, all_gather_object, new_group, ...
    group: str                 # the process group: "default" or its ranks "0,1"
    seq: int | None            # per-group sequence number (1-based) of collectives; None for p2p and new_group
    shapes: str = ""           # tensor shapes and dtypes, as the op log prints them: "f32[4, 4]"
    call_site: str = ""        # "train.py:42"
    done: bool = False         # completed (host call returned; NCCL: its GPU work completed)
    peer: int | None = None    # p2p: the other rank
    t_start: float = 0.0       # seconds, the process's op-log clock (comparable across processes of one host)
    t_end: float | None = None
    source: str = "op log"     # "op log" (the Python call), "flight recorder" (PyTorch's own entry), or both
    by_torch: bool = False     # issued by PyTorch inside the program's call (DDP's reducer in backward, FSDP's
                               # hooks, a functional collective), not a torch.distributed call of the program
    counted: bool = False      # its seq counted along the op log from a number the group gave (gpulab.hang.jobs.jobread)


@dataclass(frozen=True)
class ProcessView:
    """What the watchdog knows of one process of the job."""
    pid: int
    ppid: int | None
    role: str                  # "rank 1/4", "DataLoader worker 0 of rank 1", "pid 123: python x.py"
    kind: str                  # "rank" | "worker" | "launcher" | "main" | "process"
    state: str                 # "running" | "exited 0" | "exited 1" | "killed by SIGSEGV" | "unknown"
    rank: int | None = None
    world: int | None = None
    worker: int | None = None  # DataLoader worker id
    node: str = ""             # host name (a multi-node job merged from several folders)
    open_op: dict | None = None          # innermost op started and never completed: {"name", "args", "call_site"}
    collectives: tuple[Collective, ...] = ()
    ops_completed: int = 0
    last_progress_s: float | None = None  # seconds between its last progress and the stall (None: unknown)
    frame: str | None = None              # innermost Python frame of its main thread: "worker.py:12 in __getitem__"
    wait: str | None = None               # what its stacks show it waits in: lock | queue | collective | cuda_sync | io
    log: str | None = None                # its op log, relative to the job folder
    own_code: bool = False                # its main thread runs the program's own code (gpulab.hang.jobs.jobread)
    supervises: bool = False              # a launcher or supervisor of ranks (torchrun's agent, mp.spawn's parent)
    place: str | None = None              # the program's own line its main thread is at: "train.py:40"
    stack: tuple[str, ...] = ()           # the program's own lines on its main thread's stack, innermost first
    # around the lines that matter (its call sites, its stack): "train.py:40" -> the first and last line of
    # the innermost for/while holding it (None: at no loop, or the source is unknown) ...
    loops: dict = field(default_factory=dict)
    # ... and of the function holding it (the module: the whole file)
    scopes: dict = field(default_factory=dict)
    # ops the program's own lines issued (depth 0), by line: "train.py:31" -> count; None when the op log
    # lost records (then counts compare nothing)
    line_ops: dict | None = None
    # a line of the program -> the one line that calls the function holding it, read from the source
    # ("train.py:47" in average_gradients -> "train.py:70"): where a collective was issued from once the
    # host has moved on (NCCL returns at launch)
    callers: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Divergence:
    group: str
    seq: int
    op: str | None                         # the collective the waiting ranks are in
    waiting: tuple[str, ...]               # roles that reached seq and wait there
    missing: tuple[str, ...]               # roles that never reached seq
    instead: dict = field(default_factory=dict)   # role -> what it is doing instead (a sentence)
    mismatch: str | None = None            # "op" | "shape" when the ranks are at seq with different calls
    t_start: float | None = None           # when the first waiting call started (op-log clock): the timeline's mark
    # role -> its own call at seq, which completed although it differs from the waiting ranks': NCCL matches
    # a group's collectives by their order, so a rank's barrier (an all_reduce of one element) pairs with the
    # others' gradient all_reduce of the same number; it completes there, that rank goes on, theirs never does
    paired: dict = field(default_factory=dict)


@dataclass(frozen=True)
class JobFinding:
    cls: str | None                        # one of CLASSES, or None when nothing cross-process explains it
    culprit: str | None                    # the role of the process the finding names
    divergence: Divergence | None
    evidence: tuple[str, ...]
    processes: tuple[dict, ...]            # the per-process table (DESIGN.md: role, pid, state, open_op, collective, ...)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["class"] = d.pop("cls")
        return d


def _calls(v: ProcessView, group: str) -> dict[int, Collective]:
    calls: dict[int, Collective] = {}
    for c in v.collectives:
        if c.group == group and c.seq is not None:
            calls.setdefault(c.seq, c)
    return calls
