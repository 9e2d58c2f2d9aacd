"""Evidence -> failure class, citing the facts used. Pure: no processes, no files, no torch.

Classes (DESIGN.md): gemm, softmax, layout, sync, library_load, host_lock, collective, unknown; memory faults
read from what the driver or the runtime said (illegal_address, misaligned_address, out_of_bounds,
device_assert, launch_failure, gpu_page_fault); errors at the program's own call (refused_call, out_of_memory,
worker_died: CALL_CLASSES); a job of several processes adds collective_mismatch, rank_stuck, worker_stuck (a
DataLoader worker), child_stuck (any other child process its parent waits for)
(gpulab.hang.jobs.job judges those).
The rules go from the most specific observation to the least: frames that only appear in one situation
(NCCL waits, the dynamic loader running a constructor, a host thread parked on a mutex) beat the op's name,
and the op's name and layouts beat generic hints. Every rule that fires says, in words, what it saw.
"""
from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from gpulab import lastwords
from gpulab.hang.capture import Thread, parse_native, parse_python
from gpulab.trace.liveness import STATUSES   # how a watched child ended: one vocabulary
from gpulab.trace.vocab import (describe_op, layout_problems, noncontiguous_args, op_kind,  # the op vocabulary:
                                transposed_args)                                       # the recorder's, read here

# the bound check torch.compile's generated kernels make: "index out of bounds: 0 <= tmp2 < 64L"
_GENERATED_CHECK = re.compile(r"index out of bounds: (?P<cond>0 <= \w+ < (?P<bound>\w+?)L?)\b")
# What the driver or the runtime said when a kernel faulted, most specific first: a device-side assert also
# surfaces as a launch failure on some stacks, an illegal address report as a page fault on ROCm.
MEMORY_FAULTS = (
    ("device_assert", re.compile(r"device-side assert(ion)? triggered|Assertion `[^`]*` failed|"
                                 r"cudaErrorAssert|CUDA_ERROR_ASSERT", re.I)),
    ("misaligned_address", re.compile(r"misaligned address|cudaErrorMisalignedAddress|CUDA_ERROR_MISALIGNED_ADDRESS",
                                      re.I)),
    # a wild pointer that lands in the shared or local window rather than unmapped global memory (a store far
    # past its tensor on an H100 said this in 1 run of 4, "illegal memory access" in the others)
    ("illegal_address", re.compile(r"illegal memory access|illegal address|cudaErrorIllegalAddress|"
                                   r"CUDA_ERROR_ILLEGAL_ADDRESS|hipErrorIllegalAddress|"
                                   r"operation not supported on global/shared address space|"
                                   r"cudaErrorInvalidAddressSpace|CUDA_ERROR_INVALID_ADDRESS_SPACE", re.I)),
    ("gpu_page_fault", re.compile(r"Memory access fault by GPU node|Page not present or supervisor privilege", re.I)),
    # the last: the check torch.compile's generated CPU kernel makes (TORCH_CHECK: the process aborts with
    # "index out of bounds: 0 <= tmp2 < 64L"); its CUDA kernels' assert is a device_assert above
    ("out_of_bounds", re.compile(r"IndexError: [^\n]*out of (range|bounds)|index -?\d+ is out of bounds for dimension|"
                                 r"index out of range in self|out of bounds for dimension|" + _GENERATED_CHECK.pattern,
                                 re.I)),
    ("launch_failure", re.compile(r"unspecified launch failure|cudaErrorLaunchFailure|CUDA_ERROR_LAUNCH_FAILED|"
                                  r"too many resources requested for launch|invalid configuration argument|"
                                  r"no kernel image is available for execution|illegal instruction was encountered|"
                                  r"invalid program counter|cudaErrorInvalidPc|hardware stack error|"
                                  r"cudaErrorHardwareStackError|hipErrorLaunchFailure", re.I)),
)
FAULT_CLASSES = tuple(c for c, _ in MEMORY_FAULTS)
# Errors raised at the program's call, as it made it: PyTorch refused the call (its own check of the arguments:
# shapes, dtypes, devices, autograd's use), memory ran out, a DataLoader worker died. Read from the exception the
# program ended with, before the op's name: an error raised in aten.addmm is no GEMM fault.
CALL_CLASSES = ("refused_call", "out_of_memory", "worker_died")
CLASSES = ("gemm", "softmax", "layout", "sync", "library_load", "host_lock", "lock_cycle", "collective",
           "unknown") + FAULT_CLASSES \
    + CALL_CLASSES
JOB_CLASSES = ("collective_mismatch", "rank_stuck", "worker_stuck", "child_stuck", "uneven_inputs",
               "skipped_collective")   # gpulab.hang.jobs.job.CLASSES: across processes
ALL_CLASSES = CLASSES + JOB_CLASSES
# Failures whose cause is the program's own code when no fix removed them: the next step (04's and the index's)
# points there, not at an upstream report (seen on the user path: gloo ranks with a shape mismatch, NCCL ranks
# skipping a collective on two H100s, a dataset deadlocking in its own __getitem__ inside a DataLoader worker)
IN_THE_PROGRAM = {
    "uneven_inputs": ("a rank ran out of data and left the training loop while the others wait in the collective "
                      "of their next step (03 names the rank, its line and the collective): give every rank the "
                      "same number of batches (`DistributedSampler(..., drop_last=True)`, or stop every rank at the "
                      "smallest count, all-reduced with MIN), or run the loop under DDP's `with model.join():` "
                      "(torch.distributed.algorithms.Join), which lets the ranks that finish first shadow the "
                      "others' collectives"),
    "skipped_collective": ("a rank skipped a collective the others call (03 names the rank, the collective and "
                           "its line): a decision taken on one rank's own data (a NaN guard, an `if` on the batch "
                           "or the rank) must be taken together: all-reduce it first (`flag = torch.tensor("
                           "[float(skip)]); dist.all_reduce(flag, op=dist.ReduceOp.MAX); skip = flag.item() > 0`) "
                           "so every rank takes the same branch, or call the collective on every rank"),
    "collective_mismatch": ("the ranks call different collectives at the same point (03's divergence names both "
                            "calls): make every rank call the same collectives in the same order with the same "
                            "shapes; TORCH_DISTRIBUTED_DEBUG=DETAIL turns such a mismatch into an error that names it"),
    "worker_stuck": ("the DataLoader worker blocks in the dataset's own code (03 names the frame): fix it there; "
                     "num_workers=0 runs that code in the main process, where a debugger or py-spy reaches it"),
    "lock_cycle": ("the program's threads wait for each other's locks (03 names each thread, the lock it waits for "
                   "and where the other took it): take the locks in one order everywhere, or hold one at a time"),
    "child_stuck": ("the program waits for a child process (join(), wait(), communicate()) that does not end (03 "
                    "names where the child is and where it is waited for): a child that put data on a "
                    "multiprocessing Queue ends only once that data is read, so read the queue before join(); "
                    "otherwise the child's own frame says what it waits for"),
}
_BUSY = ("a rank runs the program's own code outside any op or collective (03 names its line) while the others "
         "wait in the collective for it: look there (a loop that does not end, a wait for something that never "
         "comes, a branch only that rank takes); `py-spy dump --pid` on that rank shows it live")


def program_step(where: Any, why: Any) -> str:
    """The next step when the owner is the program (gpulab.hang.owner): its place and what is wrong there."""
    return (f"the bug is in the program's own code, at {where}: {why}; fix it there (it is not PyTorch's, a "
            f"library's or the platform's code)")


def program_cause(cls: str | None, culprit: str | None = None, processes: Sequence[Mapping] = (),
                  owner: Mapping | None = None) -> str | None:
    """Why the failure is the program's own bug, in the next step's words, or None (a fix or an upstream report
    is the next step). By class (IN_THE_PROGRAM); a stuck rank only when the stacks show it in its own Python
    code (or the standard library on its behalf) with no op, collective or GPU wait open: a rank inside a torch
    call or a kernel is not the program's to fix. Else the verdict's owner (gpulab.hang.owner) when it is the
    program: its place and what the evidence says is wrong there."""
    held = forked_holding(culprit, processes) if cls in ("worker_stuck", "child_stuck", "rank_stuck") else None
    if held is not None:
        return fork_lock(held)
    if owner and owner.get("kind") == "program" and (cls not in IN_THE_PROGRAM or (
            cls == "child_stuck" and CHILD_OUTPUT_UNREAD in str(owner.get("where") or ""))):
        return program_step(owner.get("where"), owner.get("why"))
    if owner and owner.get("kind") == "platform" and owner.get("program"):
        return None   # the platform's behaviour meeting the program's code: the owner's step names both
    if cls in IN_THE_PROGRAM:
        return IN_THE_PROGRAM[cls]
    if cls != "rank_stuck" or not culprit:
        return None
    row = next((p for p in processes if p.get("role") == culprit), None)
    if row is None or row.get("open_op") or not row.get("own_code") or row.get("wait") in ("cuda_sync", "collective"):
        return None
    c = row.get("collective") or {}
    return None if c and not c.get("done") else _BUSY


PHASES = ("startup", "ops")

# The exception types PyTorch's argument checks raise (TORCH_CHECK and its ValueError, TypeError, IndexError and
# NotImplementedError forms, the Python binding's argument parser); a message that says PyTorch failed inside
# (an internal assert, a CUDA or library error code, a compiler's failure) is no refusal.
_REFUSED = re.compile(r"^(?:\[rank\d+\]:\s*)?(?:torch\.)?(?P<type>RuntimeError|ValueError|TypeError|IndexError|"
                      r"NotImplementedError|_?pickle\.UnpicklingError)(?::\s*(?P<msg>.*))?$")   # torch.load's check
_NOT_REFUSED = re.compile(r"INTERNAL ASSERT FAILED|please report a bug|CUDA error|CUDA driver error|CUBLAS_STATUS|"
                          r"cuDNN error|CUDNN_STATUS|NCCL error|nccl\w*Error|HIP error|hip\w*Error|cuda\w*Error|"
                          r"CUDA_ERROR|Triton Error|BackendCompilerFailed|InductorError|InternalTorchDynamoError|"
                          r"torch\._dynamo|torch\._inductor|out of memory|DataLoader worker|Connection closed by peer|"
                          r"remote worker|Connection reset by peer|DistNetworkError|DistBackendError", re.I)
_OOM = re.compile(r"[^\n]*(?:CUDA out of memory|OutOfMemoryError|HIP out of memory|MPS backend out of memory|"
                  r"CUDA error: out of memory|cudaErrorMemoryAllocation|DefaultCPUAllocator: (?:can't allocate memory|"
                  r"not enough memory))[^\n]*", re.I)
_OOM_FIGURES = {
    "asked": re.compile(r"Tried to allocate ([\d.]+ [KMGT]?i?B)"),
    "total": re.compile(r"total capacity of ([\d.]+ [KMGT]?i?B)"),
    "free": re.compile(r"of which ([\d.]+ [KMGT]?i?B) is free"),
    "allocated": re.compile(r"([\d.]+ [KMGT]?i?B) is allocated by PyTorch"),
    "reserved_unallocated": re.compile(r"([\d.]+ [KMGT]?i?B) is reserved by PyTorch but unallocated"),
    "cpu_bytes": re.compile(r"you tried to allocate (\d+) bytes"),
}
_WORKER_DIED = re.compile(r"DataLoader worker \(pid(?:\(s\))?\s*(?P<pids>[\d, ]+)\) (?:is killed by signal: "
                          r"(?P<sig>[^.\n]+)|exited unexpectedly)")
# what a worker's signal says of the cause, as PyTorch's own notes on DataLoader workers and shared memory tell
WORKER_SIGNALS = {
    "Killed": ("the worker got SIGKILL, which Python cannot catch: usually the kernel's out-of-memory killer or a "
               "container's memory limit (each worker holds its own copy of what the dataset references, and "
               "prefetch_factor batches of its output)"),
    "Bus error": ("the worker got SIGBUS writing a batch into shared memory: /dev/shm is too small (a container's "
                  "default is 64 MB)"),
    "Segmentation fault": ("the worker's native code crashed (a decoding or I/O library the dataset calls, or a "
                           "C extension), or a library that is not fork-safe was used after fork"),
    "Aborted": ("the worker's native code aborted (a failed check in a library the dataset calls, or a library "
                "that is not fork-safe used after fork)"),
}


def brief(text: str, limit: int = 240) -> str:
    """A message cut at a sentence's end within limit characters (PyTorch's run to several sentences)."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    cut = text.rfind(". ", 0, limit)
    return text[:cut + 1] if cut > limit // 3 else text[:limit].rsplit(" ", 1)[0] + " ..."


def size_text(n: int | str) -> str:
    """Bytes as a person reads them: '16.00 MiB', '1.93 GiB' (the units PyTorch's own messages use)."""
    v, units = float(n), ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    i = 0
    while v >= 1024 and i < len(units) - 1:
        v, i = v / 1024, i + 1
    return f"{v:.2f} {units[i]}"


# torch.compile runs each call on fake tensors while it traces: a call PyTorch refuses fails there first, wrapped
_FAKE_REFUSED = re.compile(r"Dynamo failed to run FX node with fake tensors: .*?: got (?P<type>RuntimeError|ValueError|"
                           r"TypeError|IndexError)\((?P<q>['\"])(?P<msg>.*?)(?P=q)\)")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")   # a message's own bold (torch.load's): no escapes in a verdict's words


def refused(text: str) -> tuple[str, str] | None:
    """(exception type, message) when the program ended with an exception of the kinds PyTorch's argument
    checks raise and nothing in it says PyTorch failed inside, else None."""
    fake = _FAKE_REFUSED.search(text or "")
    if fake:
        return fake.group("type"), (f"{fake.group('msg')} (raised while torch.compile traced the call with fake "
                                    f"tensors: the same call fails eager)")
    line = lastwords.of(text or "")
    m = _REFUSED.match(line)
    if not m or _NOT_REFUSED.search(text or ""):
        return None
    msg = (m.group("msg") or "").strip()
    # a message of several lines (load_state_dict's: each mismatch indented below its first line)
    lines = (text or "").splitlines()
    at = max((i for i, ln in enumerate(lines) if ln.strip() == line), default=-1)
    more = []
    for ln in lines[at + 1:] if at >= 0 else ():
        if not ln[:1].isspace() or not ln.strip():
            break
        more.append(ln.strip())
    return m.group("type"), _ANSI.sub("", " ".join([msg, *more]).strip())


def out_of_memory(text: str) -> dict | None:
    """The out-of-memory line and its figures (what was asked for, the device's total, free, held by PyTorch,
    reserved but unallocated), else None."""
    m = _OOM.search(text or "")
    if not m:
        return None
    got = {"line": m.group(0).strip()[:400]}
    for key, rx in _OOM_FIGURES.items():
        f = rx.search(text)
        if f:
            got[key] = f.group(1)
    if "cpu_bytes" in got:   # the CPU allocator's message counts bytes
        got["asked"] = size_text(got.pop("cpu_bytes"))
    return got


def worker_died(text: str) -> dict | None:
    """The DataLoader's report of a dead worker: its pid(s), the signal (None: it exited), what that signal
    usually means."""
    m = _WORKER_DIED.search(text or "")
    if not m:
        return None
    sig = (m.group("sig") or "").strip() or None
    return {"pids": m.group("pids").strip(), "signal": sig, "line": m.group(0),
            "meaning": WORKER_SIGNALS.get(sig or "", "the worker process ended without sending its batch back")}


WORKER_PLACE_UNSEEN = ("the main process only learnt of it waiting for that worker's batch: the worker's own last "
                       "place is not in this run's evidence")
_WORKER_RAISED = re.compile(r"Caught (?P<type>[\w.]+) in DataLoader worker process (?P<n>\d+)\.\s*\n"
                            r"Original Traceback \(most recent call last\):\n(?P<tb>[\s\S]*)")


def worker_raised(text: str) -> dict | None:
    """A DataLoader worker's own exception, as the main process raises it again ("Caught X in DataLoader worker
    process N. Original Traceback ..."): the worker's number and its traceback (the worker's frames, then the
    exception). Not a dead worker: the worker said what went wrong, where."""
    found = list(_WORKER_RAISED.finditer(text or ""))
    if not found:
        return None
    m = found[-1]
    return {"worker": int(m.group("n")), "type": m.group("type"),
            "traceback": "Traceback (most recent call last):\n" + m.group("tb")}


def _torch_frame(path: str) -> bool:
    return re.search(r"[/\\]torch[/\\]", path) is not None and not re.search(r"[/\\]_(dynamo|inductor)[/\\]", path)


def raised_in_torch(text: str, localized: str | None, op: Mapping[str, Any] | None) -> bool:
    """Whether the program's exception came out of PyTorch: an aten op the recorder saw raise, or a traceback
    whose innermost frame is PyTorch's Python."""
    if _FAKE_REFUSED.search(text or ""):
        return True
    frames = [TB_FRAME.match(ln) for ln in (text or "").splitlines()]
    frames = [f for f in frames if f]
    if frames and re.search(r"[/\\]gpulab[/\\]", frames[-1].group("file")):
        return False   # raised by a dispatch mode of gpulab's (a planted fault, a fix), not by PyTorch's check
    if localized == "raised" and op and str(op.get("name") or "").startswith(("aten.", "prims.")):
        return True
    return bool(frames) and _torch_frame(frames[-1].group("file"))

_DL_FRAMES = ("_dl_init", "call_init", "dl_open_worker", "_dl_open", "dlopen", "_dl_catch_exception",
              "_dl_map_object", "_dl_relocate_object")
_LOCK_FRAMES = ("pthread_mutex_lock", "__lll_lock_wait", "lll_mutex_lock", "pthread_cond_wait", "pthread_cond_timedwait",
                "__pthread_cond_wait", "sem_wait", "pthread_rwlock_rdlock", "pthread_rwlock_wrlock",
                "std::mutex::lock", "std::condition_variable::wait", "pthread_join", "take_gil")
_SYNC_FRAMES = ("cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize", "cudaDeviceSynchronize",
                "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cuMemcpyDtoH", "cuMemcpy",
                "hipDeviceSynchronize", "hipStreamSynchronize", "hipMemcpy", "hsa_signal_wait", "hsaKmtWaitOnEvent",
                "c10::cuda::device_synchronize", "c10_cuda_check_implementation", "_local_scalar_dense_cuda",
                "cudaStreamSynchronize", "synchronize (torch/cuda")
_GEMM_FRAMES = ("cublas", "gemm", "cutlass", "cublasLt", "rocblas", "hipblas", "mkl_blas", "sgemm", "dgemm")
_COLLECTIVE_FRAMES = ("ncclKernel", "ProcessGroupNCCL", "ncclComm", "c10d::", "gloo::", "ProcessGroupGloo",
                      "rccl", "WorkNCCL")


@dataclass(frozen=True)
class Evidence:
    """What the watchdog saw, as plain data (a fixture can be written by hand)."""
    status: str
    phase: str = "ops"
    in_flight_op: Mapping[str, Any] | None = None
    host_blocked_in: Mapping[str, Any] | None = None
    native: tuple[Thread, ...] = ()
    python: tuple[Thread, ...] = ()
    gpu_text: str = ""
    signal: str | None = None
    exit_code: int | None = None
    stderr_tail: str = ""
    open_ops: tuple[Mapping[str, Any], ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    localized: str | None = None     # "raised": the in-flight op is the one whose exception ended the program
    lock_cycle: Mapping[str, Any] | None = None   # threads waiting for each other's locks (gpulab.hang.lockcycle)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Evidence":
        """A fixture/verdict dict -> Evidence; stacks may be raw tool text (py-spy, gdb, faulthandler)."""
        stacks = d.get("stacks") or {}
        native = stacks.get("native") or ""
        python = stacks.get("python") or ""
        return cls(status=d["status"], phase=d.get("phase", "ops"), in_flight_op=d.get("in_flight_op"),
                   host_blocked_in=d.get("host_blocked_in"),
                   native=parse_native(native, d.get("pid")) if isinstance(native, str) else tuple(native),
                   python=parse_python(python) if isinstance(python, str) else tuple(python),
                   gpu_text=stacks.get("gpu") or "", signal=d.get("signal"), exit_code=d.get("exit_code"),
                   stderr_tail=d.get("stderr_tail") or "", open_ops=tuple(d.get("open_ops") or ()),
                   localized=d.get("localized"), lock_cycle=d.get("lock_cycle"))


@dataclass(frozen=True)
class Classification:
    cls: str
    facts: tuple[str, ...]


# ------------------------------------------------------------------------------------ small helpers

def _hits(frames: Iterable[str], marks: Sequence[str]) -> list[str]:
    found = []
    for f in frames:
        if any(m in f for m in marks) and f not in found:
            found.append(f)
    return found


TB_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_THREAD_DIED = re.compile(r"^Exception in thread (?P<name>.+?):\s*$")


def dead_threads(text: str) -> list[dict]:
    """Threads that died of an exception, as Python's threading reports them on stderr ('Exception in thread
    NAME:' and its traceback): each one's name, its exception line, and the innermost frame of its traceback.
    A hang after one is often the work that thread would have done, waited for (Queue.join, Thread.join, an
    Event)."""
    out, cur = [], None
    for line in (text or "").splitlines():
        m = _THREAD_DIED.match(line)
        if m:
            cur = {"thread": m.group("name"), "frames": [], "text": []}
            out.append(cur)
            continue
        if cur is None:
            continue
        f = TB_FRAME.match(line)
        if f:
            cur["frames"].append((f.group("func").strip(), f.group("file"), f.group("line")))
        cur["text"].append(line)
        if cur["frames"] and line.strip() and not line[:1].isspace() and not line.startswith("Traceback"):
            cur = None   # its exception's line ends the report: what follows is the program's other output
    died = []
    for d in out:
        said = lastwords.of("\n".join(d["text"]))
        if not (d["frames"] and said):
            continue
        func, file, line = d["frames"][-1]
        died.append({"thread": d["thread"], "error": said, "file": file, "line": int(line), "func": func})
    return died


def died_words(d: Mapping[str, Any]) -> str:
    return f"thread {d['thread']} died: {d['error']} at {d['file']}:{d['line']} in {d['func']}"


_LOCK_WAITS = ("lock_PyThread_acquire_lock", "PyThread_acquire_lock_timed", "rlock_acquire")
_WAITS_FOR_OTHERS = ("(threading.py:", "(queue.py:", "/threading.py:", "/queue.py:", "concurrent/futures/")


def lock_alone(threads: Sequence[Thread]) -> bool:
    """The main thread waits to acquire a Python lock (threading's Lock or RLock: py-spy's native view shows the
    acquire under the Python frame), taken by the program's own line (not inside an Event's, a join's or a queue's
    wait, which waits for another thread or process), and no other thread of the process runs Python of its own
    (gpulab's are not the program's; native pools run none): nothing in that process can release the lock."""
    main = main_thread(threads)
    py = [i for i, f in enumerate(main.frames) if ".py:" in f] if main is not None else []
    if not py or not any(fn in _LOCK_WAITS for fn in main.functions[:py[0]]):
        return False
    if any(m in main.frames[py[0]] for m in _WAITS_FOR_OTHERS):   # an Event, a join, a queue: waits for another
        return False
    return not any(t is not main and not t.name.startswith("gpulab") and not any("gpulab/" in f for f in t.frames)
                   and any(".py:" in f for f in t.frames) for t in threads)


_FD_SHARING = re.compile(r"_share_fd_cpu_|reduce_storage|rebuild_storage_fd|multiprocessing[/\\]reductions\.py")


def fd_sharing_exhausted(stderr: str) -> bool:
    """A process of the run could not share a tensor for want of file descriptors: torch.multiprocessing sends
    each CPU tensor's storage as one (its default strategy), and 'Too many open files' raised there, in a
    worker's queue feeder thread, is printed and lost: the loader then waits for a batch that never comes."""
    return "Too many open files" in (stderr or "") and _FD_SHARING.search(stderr or "") is not None


CHILD_OUTPUT_UNREAD = "waiting for a child whose output it has not read"   # gpulab.hang.owner's place of it
_WRITES = ("write", "__libc_write", "__GI___libc_write", "__write_nocancel", "__write")


def blocked_writing(threads: Sequence[Thread]) -> bool:
    """The main thread sits in the write() system call itself (the top of its native stack): a write that does not
    return waits for a reader, most often of a pipe that is full (64 kB on Linux)."""
    main = main_thread(threads)
    return main is not None and bool(main.functions) and main.functions[0] in _WRITES


def fork_lock(row: Mapping[str, Any]) -> str:
    """Why a forked process that waits alone for a lock never goes on, and how to change the program."""
    return (f"{row.get('role') or 'the process'} waits for a lock at {row.get('frame') or 'its frame'} that no thread "
            f"of it can release: it was forked while another thread of its parent held that lock, and fork() copies "
            f"the lock, held, but not the thread that would release it: create such locks after the fork (a "
            f"DataLoader's worker_init_fn) or reset them in the child (os.register_at_fork(after_in_child=...)), "
            f"do not hold them while processes are forked, or start the processes with spawn (DataLoader(..., "
            f"multiprocessing_context='spawn'), multiprocessing.get_context('spawn'), torch.multiprocessing's "
            f"start_processes(..., start_method='spawn'))")


def forked_holding(culprit: str | None, processes: Sequence[Mapping]) -> Mapping | None:
    """The culprit's row when it was forked and waits alone for a lock (gpulab.hang.watchdog.evidence's facts)."""
    row = next((p for p in processes if p.get("role") == culprit), None) if culprit else None
    return row if row and row.get("started_by") == "fork" and row.get("lock_alone") else None


def main_thread(threads: Sequence[Thread]) -> Thread | None:
    for t in threads:
        if t.main:
            return t
    return threads[0] if threads else None


def _is_gpu_frame(frame: str) -> bool:
    return any(m in frame for m in ("libcuda", "libcudart", "libamdhip", "libhsa", "libnccl", "librccl")) or \
        frame.startswith(("cu", "cuda", "hip", "hsa", "nccl"))


def host_phase(recorded: bool, ops_started: int, native: Sequence[Thread], python: Sequence[Thread]) -> str:
    """startup before the first recorded op; without an op log, from the stacks (loader or import frames)."""
    if recorded:
        return "startup" if ops_started == 0 else "ops"
    frames = [f for t in native for f in t.frames]
    if _hits(frames, _DL_FRAMES) or _hits(frames, ("cuInit", "cuDevicePrimaryCtxRetain", "hipInit")):
        return "startup"
    main = main_thread(python) or main_thread(native)
    if main and any("_find_and_load" in f or "importlib" in f for f in main.frames):
        return "startup"
    return "ops"


def memory_fault(text: str) -> tuple[str, str] | None:
    """(class, the line that says so) when a program's last words report a GPU memory fault or a kernel's
    rejected input, else None."""
    for cls, rx in MEMORY_FAULTS:
        m = rx.search(text or "")
        if m:
            start = text.rfind("\n", 0, m.start()) + 1
            end = text.find("\n", m.end())
            return cls, text[start:end if end >= 0 else len(text)].strip()[:300]
    return None


# the integer division check of torch.compile's generated CPU code (eager's aten op raises ZeroDivisionError too)
_GENERATED_DIV = re.compile(r"inductor_cpu_throw_if_integer_div_error[^\n]*ZeroDivisionError")


def generated_check(text: str) -> bool:
    """Whether the program's exception is a check of its input that torch.compile's generated code made (an
    integer division by zero), raised from a file of inductor's cache rather than from PyTorch's own Python."""
    return _GENERATED_DIV.search(text or "") is not None


def generated_index_check(text: str) -> dict | None:
    """The bound check a kernel torch.compile generated failed (its CPU kernels' TORCH_CHECK, its Triton kernels'
    device assert, both "index out of bounds: 0 <= tmp2 < 64"): the condition and the table's size, else None."""
    m = _GENERATED_CHECK.search(text or "")
    return {"cond": m.group("cond").rstrip("L"), "bound": m.group("bound")} if m else None


_ASSERT = re.compile(r"(?P<file>[^\s:]+\.(?:cu|cuh|cpp|h|py)):(?P<line>\d+): (?P<kernel>[^:\n]+): block: \[(?P<block>[\d,]+)\], "
                     r"thread: \[(?P<thread>[\d,]+)\] Assertion `(?P<cond>[^`]*)` failed")


def device_assert(text: str) -> dict | None:
    """The first device-side assertion the runtime printed: kernel, source line, block, thread, condition."""
    m = _ASSERT.search(text or "")
    return {k: m.group(k) for k in ("file", "line", "kernel", "block", "thread", "cond")} if m else None


_UNCAUGHT = "exited after an uncaught "
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?", re.M)
# what a rank says when another rank died first: the consequence, never the job's finding
_PEER_GONE = re.compile(r"Connection closed by peer|remote worker crashing|Connection reset by peer|Broken pipe|"
                        r"DistNetworkError|DistBackendError|NCCL communicator was aborted|ProcessGroupNCCL.*"
                        r"(?:Watchdog|timed out|timeout)|SIGTERM|Terminated", re.I)
_ROOT_RANK = re.compile(r"Root Cause \(first observed failure\):\s*\[\d+\]:(?:.*\n){0,4}?\s*rank\s*:\s*(\d+)")


_MESSAGE_LINES = 8
_NOT_MESSAGE = re.compile(r"^(?:[WEIF]\d{4} |Traceback|\s*File \"|\[W|\[E|During handling|The above exception)")


_FATAL = re.compile(r"^Fatal Python error: (?P<what>[^\n]+)", re.M)
FATAL_SIGNALS = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
                 "Floating point exception": "SIGFPE", "Illegal instruction": "SIGILL"}


def fatal_signal(faulthandler_text: str) -> str | None:
    """The signal a process died of, as its faulthandler file says ("Fatal Python error: Segmentation fault")."""
    m = _FATAL.search(faulthandler_text or "")
    return FATAL_SIGNALS.get(m.group("what").strip()) if m else None


_ROOT_SIGNAL = re.compile(r"Root Cause \(first observed failure\):\s*\[\d+\]:(?:.*\n){0,4}?\s*rank\s*:\s*(\d+)[^\n]*\n"
                          r"(?:\s*exitcode\s*:\s*-(\d+) \(pid: \d+\)|(?:.*\n){1,3}?\s*traceback\s*:\s*Signal (\d+) )")


def root_signal(stderr: str) -> tuple[int, str] | None:
    """(rank, signal) when torchrun's first observed failure is a rank a signal ended ("exitcode : -9 (pid: 1852)",
    torch 2.13 adding "(SIGKILL)", 2.11 a traceback line "Signal 9 (SIGKILL) received by PID 1852"): a SIGKILL
    leaves no faulthandler file, so this is the only word of it."""
    m = _ROOT_SIGNAL.search(stderr or "")
    if not m:
        return None
    n = int(m.group(2) or m.group(3))   # the exit code's, or the traceback line's
    try:
        return int(m.group(1)), signal.Signals(n).name
    except ValueError:
        return int(m.group(1)), f"signal {n}"


def root_rank(stderr: str) -> int | None:
    """The rank torchrun names as the first observed failure, or None."""
    m = _ROOT_RANK.search(stderr or "")
    return int(m.group(1)) if m else None


def rank_error(processes: Sequence[Mapping[str, Any]], stderr: str) -> tuple[str, str] | None:
    """(role, its traceback) of the rank whose own exception ended a job: torchrun's root cause where it names
    one, else the first rank whose exception is not a peer's death seen from the other side (gloo's 'Connection
    closed by peer'); its traceback is the block of the job's stderr that ends in that exception."""
    # (role, its exception) per rank that died of one; torchrun prefixes a rank's lines with "[rankN]: "
    failed = [(str(p.get("role")), _RANK_PREFIX.sub("", str(p["state"])[len(_UNCAUGHT):]).strip())
              for p in processes if p.get("kind") == "rank" and str(p.get("state") or "").startswith(_UNCAUGHT)]
    own = [f for f in failed if not _PEER_GONE.search(f[1])]
    root = _ROOT_RANK.search(stderr or "")
    if root:
        own = [f for f in own if f[0].startswith(f"rank {root.group(1)}/")] or own
    if not own:
        return None
    role, said = own[0]
    head = said[:60]
    blocks = _RANK_PREFIX.sub("", stderr or "").split("Traceback (most recent call last):")
    for b in reversed(blocks[1:]):
        if head and head in b:
            end = b.find("\n", b.find(head))
            if end >= 0:   # the message's own further lines (DDP names the parameters there), not what follows it
                for ln in b[end + 1:].splitlines()[:_MESSAGE_LINES]:
                    if not ln.strip() or _NOT_MESSAGE.match(ln):
                        break
                    end += len(ln) + 1
            return role, "Traceback (most recent call last):" + (b if end < 0 else b[:end])
    return role, said


# ------------------------------------------------------------------------------------ the classifier

def call_class(ev: Evidence) -> tuple[str, list[str]] | None:
    """An error the program's own call met (CALL_CLASSES) and the facts that say so, else None."""
    if ev.status not in ("error", "crash"):
        return None
    oom = out_of_memory(ev.stderr_tail)
    if oom:
        figures = [f"{k.replace('_', ' ')} {oom[k]}" for k in ("asked", "total", "free", "allocated",
                                                              "reserved_unallocated") if k in oom]
        return "out_of_memory", [f"the program ran out of memory: {brief(oom['line'])}"] + (
            [f"memory figures: {', '.join(figures)}"] if figures else [])
    died = worker_died(ev.stderr_tail)
    if died:
        how = f"was killed by signal {died['signal']}" if died["signal"] else "exited unexpectedly"
        return "worker_died", [f"a DataLoader worker (pid {died['pids']}) {how}: {died['meaning']}",
                               WORKER_PLACE_UNSEEN]
    if ev.status != "error":
        return None
    raised = worker_raised(ev.stderr_tail)
    if raised is not None:   # the worker's own traceback is the one to judge; the main only passed it on
        got = refused(raised["traceback"])
        if not got or not raised_in_torch(raised["traceback"], None, None):
            return None
        return "refused_call", [f"DataLoader worker {raised['worker']} raised {got[0]}: {brief(got[1])} while it made a "
                                f"batch (the main process raised it again where it asked for that batch)",
                                f"PyTorch refused the call: {got[0]}: {brief(got[1])} (its own check of what it was "
                                f"given, not a fault inside it)"]
    got = refused(ev.stderr_tail)
    if got and (raised_in_torch(ev.stderr_tail, ev.localized, ev.in_flight_op) or generated_check(ev.stderr_tail)):
        op = ev.in_flight_op if ev.localized == "raised" else None
        who = f"{op.get('name')}" if op else "PyTorch"
        return "refused_call", [f"PyTorch refused the program's call: {who} raised {got[0]}: {brief(got[1])} (its "
                                f"own check of what it was given, not a fault inside it)"]
    return None


def classify(ev: Evidence) -> Classification:
    """The failure class and the facts it rests on. Never reads `planted`: a drill is judged like a bug."""
    if ev.status not in STATUSES:
        raise ValueError(f"evidence status {ev.status!r} is not valid; choose one of {', '.join(STATUSES)}")
    facts: list[str] = []
    op = ev.in_flight_op
    main_n = main_thread(ev.native)
    all_native = [f for t in ev.native for f in t.frames]
    facts.append(f"status {ev.status}, phase {ev.phase}")
    if ev.signal:
        facts.append(f"the process was killed by {ev.signal}")
    if ev.status in ("hang", "timeout"):
        facts.extend(f"before the hang, {died_words(d)} (what waits may wait for its work)"
                     for d in dead_threads(ev.stderr_tail)[:3])
    if op:
        facts.append(f"in-flight op: {describe_op(op)}")
    if ev.host_blocked_in and ev.host_blocked_in.get("driver"):
        facts.append(f"host thread is stuck in {ev.host_blocked_in.get('name')}")
    elif ev.host_blocked_in and ev.host_blocked_in.get("outside_ops"):
        api = ev.host_blocked_in.get("api")
        site = ev.host_blocked_in.get("call_site")
        facts.append(f"no recorded op was open: the host thread is in {ev.host_blocked_in.get('name')}"
                     + (f" at {site}" if site else "") + (f", inside the driver's {api}" if api else "")
                     + " (work outside PyTorch's dispatcher, or Python code, that makes no progress)")
    elif ev.host_blocked_in:
        api = ev.host_blocked_in.get("api")
        facts.append(f"host thread blocked in {ev.host_blocked_in.get('name')} ("
                     + (f"in the driver's {api}" if api else "a sync") + ", waiting behind the in-flight op's GPU "
                     "work, which never completed)")

    # 0. the driver or the runtime said what went wrong: a GPU memory fault, a kernel's failed check of its
    #    input, a launch that failed. The op the host was in when it was said may only be the next sync.
    said = memory_fault(ev.stderr_tail) if ev.status in ("crash", "error") else None
    if said:
        cls, line = said
        facts.append(f"the program's last words report {cls.replace('_', ' ')}: {line}")
        da = device_assert(ev.stderr_tail) if cls == "device_assert" else None
        if da:
            facts.append(f"kernel {da['kernel']} ({da['file']}:{da['line']}) failed its check `{da['cond']}` in "
                         f"block [{da['block']}], thread [{da['thread']}]")
        if op and op_kind(op.get("name")) == "sync":
            facts.append(f"{op.get('name')} only reported it: GPU errors surface at the next sync")
        return Classification(cls, tuple(facts))

    # 0b. the program's call ended it: memory ran out, a DataLoader worker died, PyTorch refused the arguments
    call = call_class(ev)
    if call:
        facts.extend(call[1])
        return Classification(call[0], tuple(facts))

    # 0c. the program's threads wait for each other's locks (read from their Python stacks and the sources)
    if ev.lock_cycle and ev.status in ("hang", "timeout"):
        facts.append(ev.lock_cycle["said"])
        return Classification("lock_cycle", tuple(facts))

    # 1. collectives: the op or NCCL/gloo frames
    coll = _hits(all_native, _COLLECTIVE_FRAMES)
    if (op and op_kind(op.get("name")) == "collective") or coll:
        if coll:
            facts.append("native frames in a collective library: " + ", ".join(coll[:4]))
        return Classification("collective", tuple(facts))

    # 2. the dynamic loader running a library's initializer
    for t in ev.native:
        dl = _hits(t.frames, _DL_FRAMES)
        if dl:
            ctor = [f for f in t.frames[: t.frames.index(dl[0])] if not f.startswith("0x")][-3:]
            facts.append(f"thread {t.name or t.tid}{' (main)' if t.main else ''} is inside the dynamic loader: "
                         + ", ".join(dl[:5]))
            if ctor:
                facts.append("frames above the loader (the library initializer): " + ", ".join(ctor))
            if ev.phase == "startup":
                facts.append("no op had started yet: the hang is in loading, not in computing")
            return Classification("library_load", tuple(facts))
    if ev.phase == "startup" and not ev.native:
        py_main = main_thread(ev.python)
        if py_main and any("ctypes" in f and "__init__" in f for f in py_main.frames):
            facts.append("main Python thread is in ctypes.CDLL(...) (a shared library load); no native stacks")
            return Classification("library_load", tuple(facts))

    # 3. a host thread parked on a lock (not inside the GPU driver)
    if main_n is not None:
        top = main_n.frames[:12]
        locks = _hits(top, _LOCK_FRAMES)
        gpu = [f for f in top if _is_gpu_frame(f)]
        if locks and not gpu:
            kind = "the GIL" if any("take_gil" in f for f in locks) else "a lock"
            facts.append(f"main thread waits on {kind} in native code: " + ", ".join(locks[:3]) +
                         " (no GPU driver frame above it)")
            waiting_gil = [t for t in ev.native if not t.main and _hits(t.frames[:6], ("take_gil",))]
            if waiting_gil:
                facts.append(f"{len(waiting_gil)} other thread(s) wait for the GIL (it is held by the blocked thread)")
            if op:
                facts.append(f"the lock is taken inside {op.get('name')} (the op never returned)")
            return Classification("host_lock", tuple(facts))

    # 4. the in-flight op's own kind and layouts
    kind = op_kind(op.get("name")) if op else None
    if op:
        bad = layout_problems(op)
        if bad and kind in ("gemm", None, "layout"):
            facts.extend(bad)
            return Classification("layout", tuple(facts))
        nc = noncontiguous_args(op)
        if kind is None and nc:
            facts.append(f"{op.get('name')} received non-contiguous input(s) {nc} (strides "
                         f"{[list(op['strides'][i]) for i in nc if i < len(op.get('strides') or ())]})")
            return Classification("layout", tuple(facts))
        if kind == "gemm":
            tr = transposed_args(op)
            facts.append(f"{op.get('name')} is a matrix multiply (cuBLAS/BLAS GEMM)" +
                         (f"; arg(s) {tr} are transposed (column-major), which GEMM handles natively" if tr else ""))
            g = _hits(all_native, _GEMM_FRAMES)
            if g:
                facts.append("native GEMM frames: " + ", ".join(g[:3]))
            return Classification("gemm", tuple(facts))
        if kind == "softmax":
            facts.append(f"{op.get('name')} computes a softmax reduction (attention or softmax kernel)")
            return Classification("softmax", tuple(facts))
        if kind == "layout":
            facts.append(f"{op.get('name')} is a copy/layout op" +
                         (f" with non-contiguous input(s) {nc}" if nc else ""))
            return Classification("layout", tuple(facts))

    # 5. the host waits on the device
    sync_frames = _hits(main_n.frames[:20], _SYNC_FRAMES) if main_n else []
    gpu_frames = [f for f in (main_n.frames[:12] if main_n else ()) if _is_gpu_frame(f)]
    waiting = ev.host_blocked_in if (op or (ev.host_blocked_in or {}).get("api")) else None
    if kind == "sync" or waiting or sync_frames or (ev.status == "hang" and gpu_frames):
        if sync_frames:
            facts.append("main thread native frames wait on the device: " + ", ".join(sync_frames[:3]))
        elif gpu_frames:
            facts.append("main thread is inside the GPU driver: " + ", ".join(gpu_frames[:3]))
        if kind == "sync" and not ev.host_blocked_in:
            facts.append(f"{op.get('name')} makes the host wait for the device; the GPU work it waits on is not "
                         f"localized (trace mode 'auto', the default, names it once CUDA is up; 'ops' cannot)")
        return Classification("sync", tuple(facts))

    # 6. generic native hints
    g = _hits(main_n.frames[:15] if main_n else (), _GEMM_FRAMES)
    if g:
        facts.append("main thread native frames are in GEMM code: " + ", ".join(g[:3]))
        return Classification("gemm", tuple(facts))
    s = _hits(main_n.frames[:15] if main_n else (), ("softmax", "attention", "flash"))
    if s:
        facts.append("main thread native frames are in softmax/attention code: " + ", ".join(s[:3]))
        return Classification("softmax", tuple(facts))
    if "memory access fault" in ev.stderr_tail.lower() or "page fault" in ev.stderr_tail.lower():
        facts.append("the driver reported a GPU memory access (page) fault on stderr")
    if not ev.native:
        facts.append("no native stacks were captured")
    facts.append("no rule matched the evidence")
    return Classification("unknown", tuple(facts))
