"""Whose bug is it: the program's, a library's or the platform's. Pure: a verdict's facts in, an Owner out.

The op the watchdog names is right far more often than the next step that followed from it: a program whose
own custom op dereferences a null pointer was sent upstream. Ownership is decided from what the verdict
already holds, most direct evidence first: what the driver or the hardware said (Xid, ECC: the platform),
where a faulting kernel's source lives (memcheck), where a custom op was registered, the Python and native
frames the failure happened in, and the namespace of the op in flight. An aten op that rejects or faults on
the program's input (an index out of range, a device-side assert: the kernel's own check of its input) is
the program's bug, named with the program's line that made the call. When nothing says, the owner is
`unknown`, with why: never a confident wrong answer.
"""
from __future__ import annotations

import os
import re
import sys
import sysconfig
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Sequence

from gpulab import lastwords
from gpulab.hang import capture, classify, collate, freedgraph, inplace, memcheck, memtrend, refusals, sharing

KINDS = ("program", "library", "platform", "unknown")
# failures whose class says the program's input was rejected by the kernel that checked it
INPUT_CLASSES = ("out_of_bounds", "device_assert")
# op namespaces that are PyTorch's own (the dispatcher's built-ins and torch's bundled libraries)
TORCH_NAMESPACES = {"aten", "prims", "prim", "c10d", "_c10d_functional", "_c10d_functional_autograd",
                    "c10d_functional", "_dtensor", "quantized", "_quantized", "rngprims", "higher_order",
                    "profiler", "inductor", "mkl", "mkldnn", "onednn", "debugprims", "_native", "export",
                    "torch", "_test", "fbgemm", "sparse", "_nested", "xnnpack", "cuda"}
_PLATFORM = re.compile(r"(NVRM: Xid|\bXid \d+|uncorrectable ECC|\bECC error|fallen off the bus|GPU is lost|"
                       r"cudaErrorECCUncorrectable|CUDA_ERROR_ECC_UNCORRECTABLE|cudaErrorHardwareStackError)[^\n]*",
                       re.I)
_RDNA12 = re.compile(r"gfx10(1[0-2]|3[0-6])\b")   # RDNA1 (gfx1010-1012) and RDNA2 (gfx1030-1036)
_ROCM_FAULT = "memory access fault by gpu node"
# native libraries by whose code they are (basename prefixes, lower case)
_SYSTEM_LIBS = ("libc.so", "libc-", "libpthread", "ld-linux", "ld.so", "libffi", "libdl", "libstdc++", "libgcc",
                "libpython", "_ctypes", "python3", "libm.so", "librt.so")
_LIBRARY_LIBS = {"libtorch": "PyTorch", "libc10": "PyTorch", "libshm": "PyTorch", "libcaffe2": "PyTorch",
                 "libcublas": "cuBLAS", "libcublaslt": "cuBLASLt", "libcudnn": "cuDNN", "libnccl": "NCCL",
                 "librccl": "RCCL", "libcufft": "cuFFT", "libcusparse": "cuSPARSE", "libcusolver": "cuSOLVER",
                 "libcurand": "cuRAND", "libcudart": "the CUDA runtime", "libmiopen": "MIOpen",
                 "librocblas": "rocBLAS", "libhipblas": "hipBLAS", "libamdhip": "HIP", "libgomp": "OpenMP (libgomp)",
                 "libiomp": "OpenMP (libiomp)", "libmkl": "MKL", "libdnnl": "oneDNN", "libtriton": "Triton",
                 "libnvrtc": "NVRTC", "libnvjitlink": "nvJitLink"}
_DRIVER_LIBS = {"libcuda.so": "the NVIDIA driver (libcuda)", "libhsa-runtime": "the ROCm runtime (HSA)",
                "libhsakmt": "the ROCm kernel driver interface"}
# the driver calls a host is stuck in when a kernel's first launch waits for its module to load (lazy loading) or
# the launch waits for the kernels already running: the platform's behaviour meeting the program's kernels
_DRIVER_API = re.compile(r"^(cu|cuda|hip|hsa)[A-Z_]\w*$")
_LOAD_OR_LAUNCH = re.compile(r"^(cu|cuda|hip)(LaunchKernel\w*|LaunchCooperativeKernel\w*|ModuleLaunchKernel\w*|"
                             r"ModuleLoad\w*|ModuleGetFunction|LibraryLoad\w*|LibraryGetKernel|KernelGetFunction)$")
_FRAME = re.compile(r"(?P<func>.*) \((?P<file>[^()]*?):(?P<line>\d+)\)$")
_TB = classify.TB_FRAME
_REGISTER = re.compile(
    r"""(?:custom_op|triton_op|define|register_fake|_register_fake|register_kernel|register_autograd|impl)\s*\(\s*[rbuf]?["'](?P<ns>[A-Za-z_]\w*)::(?P<op>\w+)"""
    r"""|Library\s*\(\s*["'](?P<lib>[A-Za-z_]\w*)["']"""
    r"""|TORCH_LIBRARY(?:_FRAGMENT|_IMPL)?\s*\(\s*(?P<cpp>[A-Za-z_]\w*)\s*[,)]""")
_TRITON = re.compile(r"@triton\.(?:jit|autotune|heuristics)[^\n]*\n(?:\s*@[^\n]*\n)*\s*def\s+(?P<name>\w+)")
_CUDA_KERNEL = re.compile(r"__global__\s+(?:void|[\w:<>]+)\s+(?P<name>\w+)\s*\(")
# a custom autograd.Function: autograd names its node <Class>Backward, and refuses what its backward returns there
_FUNCTION = re.compile(r"^class\s+(?P<name>\w+)\s*\([^)]*\b(?:torch\.autograd\.|autograd\.)?Function\s*\)\s*:", re.M)
_BACKWARD_DEF = re.compile(r"^[ \t]+def\s+backward\s*\(", re.M)
# a hook the program registers by name (tensor.register_hook(fn), module.register_forward_hook(fn), ...)
_HOOKED = re.compile(r"\.register_(?:\w+_)?hook\(\s*(?:self\.)?(?P<name>\w+)\s*[,)]")


@dataclass(frozen=True)
class Owner:
    kind: str        # program | library | platform | unknown
    where: str       # the place, as a person looks it up: prog.py:12 in f, aten.mm (PyTorch), an Xid line
    why: str         # the evidence it rests on, in words
    program: str = ""   # where the platform's behaviour meets the program's code: the program's own way out

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"owner kind {self.kind!r} is not valid; choose one of {', '.join(KINDS)}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "Owner | None":
        return (cls(d["kind"], d.get("where") or "", d.get("why") or "", d.get("program") or "")
                if d and d.get("kind") else None)


# ------------------------------------------------------------------------------------ where code lives

_PACKAGES = re.compile(r"[/\\](site|dist)-packages[/\\](?P<pkg>[^/\\]+)")
_STDLIB = re.compile(r"([/\\]lib[/\\]python\d[\d.]*[/\\])|(^<)")
_GPULAB = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# code torch.compile wrote: inductor's cache (torchinductor_<user>, or TORCHINDUCTOR_CACHE_DIR: files named by
# their hash, c + 51 characters, in a folder of its first two), PyTorch's own however far from site-packages
_GENERATED = re.compile(r"([/\\]torchinductor_[^/\\]+[/\\])|([/\\][a-z0-9]{2}[/\\]c[a-z0-9]{51}(\.main)?\.(py|cpp|so)$)")
_STDLIB_DIR = sysconfig.get_paths()["stdlib"]


def origin(path: str) -> tuple[str, str]:
    """(whose, name) of a source file: ("program", path), ("library", package), ("stdlib", "") or
    ("tool", "gpulab"): gpulab's own frames (the recorder, a planted fault) are never the culprit."""
    if path.startswith(_GPULAB) or re.search(r"(^|[/\\])gpulab[/\\](trace|hang|fixes)[/\\]", path):
        return "tool", "gpulab"
    if _GENERATED.search(path):
        return "library", "PyTorch"
    m = _PACKAGES.search(path)
    if m:
        pkg = m.group("pkg").split(".")[0].split("-")[0]
        return "library", ("PyTorch" if pkg in ("torch", "torchgen", "functorch") else pkg)
    if _STDLIB.search(path):
        return "stdlib", ""
    return "program", path


def program_site(call_site: str) -> bool:
    """Whether a recorded call site ("train.py:40 in step") is the program's own line. A site names its file by
    the last two parts of its path, so the standard library's show as "multiprocessing/process.py" or
    "python3.11/runpy.py": told apart by that first part."""
    path = str(call_site).split(":", 1)[0]
    head = re.split(r"[/\\]", path)[0] if not os.path.isabs(path) and re.search(r"[/\\]", path) else ""
    if re.fullmatch(r"python\d[\d.]*", head) or (
            head in sys.stdlib_module_names and os.path.isfile(os.path.join(_STDLIB_DIR, path))):
        return False
    return origin(path)[0] == "program"


def short(path: str, line: Any = None, func: str | None = None) -> str:
    parts = str(path).split(os.sep)
    where = os.sep.join(parts[-2:]) if len(parts) > 2 else str(path)
    return where + (f":{line}" if line is not None else "") + (f" in {func}" if func else "")


def namespace(op_name: str | None) -> str:
    """'holdout.bad_gather.default' -> 'holdout'; 'mylib::f' -> 'mylib'; '' for a name that is no op's
    (a record of the dispatcher's own, such as a dispatch mode)."""
    name = str(op_name or "").replace("::", ".")
    return name.split(".")[0] if "." in name else ""


INDUCTOR_KERNEL = re.compile(r"^triton_(poi|red|per|tem|for|mm|bmm|flex|tma|cooperative)_")


def kernel_owner(v: Mapping[str, Any], registered: Mapping[str, str]) -> Owner | None:
    """The owner when the in-flight record is a kernel launch, not an op (gpulab.trace.kernels records
    Inductor's launches by kernel name): the program's when its sources define that kernel (Inductor names a
    user's @triton.jit function NAME as NAME_0, NAME_1, ...), torch.compile's when Inductor generated it."""
    op = dict(v.get("in_flight_op") or {})
    name = str(op.get("name") or "")
    if not name or namespace(name) or name.startswith(("aten", "Torch-Compiled", "CompiledFunction", "autograd::")):
        return None
    at = f", launched at {op['call_site']}" if op.get("call_site") else ""
    base = re.sub(r"_\d+$", "", name)
    place = registered.get(f"kernel:{name}") or registered.get(f"kernel:{base}")
    if place and origin(place.rsplit(":", 1)[0])[0] == "program":
        return Owner("program", f"kernel {base} ({short(place)}){at}",
                     f"{_what(v)} in {name}, the program's own kernel {base} (defined at {short(place)})"
                     + (" whose GPU work never completed" if op.get("gpu_done") is False else ""))
    checked = compiled_index_owner(name, op.get("call_site"), str(v.get("stderr_tail") or "")) \
        if INDUCTOR_KERNEL.match(name) and v.get("class") in INPUT_CLASSES else None
    if checked is not None:
        return checked
    if INDUCTOR_KERNEL.match(name):
        return Owner("library", f"{name} (generated by torch.compile's Inductor){at}",
                     f"{_what(v)} in {name}, a kernel Inductor generated for the program's compiled code: "
                     f"torch.compile's (the program's source is the graph it was made from)")
    return None


def culprit_op(v: Mapping[str, Any]) -> dict:
    """The op in flight, or, when its record names no op (the dispatcher's own frame), the innermost open op
    that does."""
    op = dict(v.get("in_flight_op") or {})
    if op and not namespace(op.get("name")):
        named = [o for o in v.get("open_ops") or () if o and namespace(o.get("name"))]
        if named:
            return dict(named[-1])
    return op


def _frames(threads: Sequence[capture.Thread]) -> list[tuple[str, str, str]]:
    """The main thread's Python frames, innermost first: (func, file, line)."""
    main = next((t for t in threads if t.main), threads[0] if threads else None)
    return thread_frames(main) if main else []


def thread_frames(t: capture.Thread) -> list[tuple[str, str, str]]:
    """One thread's Python frames, innermost first: (func, file, line)."""
    return [(m.group("func"), m.group("file"), m.group("line")) for m in (_FRAME.match(f) for f in t.frames) if m]


def traceback_frames(text: str) -> list[tuple[str, str, str]]:
    """The last Python traceback in a program's stderr, innermost first: (func, file, line). A tail that begins
    inside a traceback (its header cut off, as a long one's is) counts from its first frame."""
    blocks, cur = [], []
    for line in (text or "").splitlines():
        if line.startswith("Traceback (most recent call last)"):
            cur = []
            blocks.append(cur)
        m = _TB.match(line)
        if m and not blocks:
            blocks.append(cur)
        if m:
            cur.append((m.group("func").strip(), m.group("file"), m.group("line")))
    return list(reversed(blocks[-1])) if blocks else []


def _first(frames: Iterable[tuple[str, str, str]], kinds: Sequence[str]) -> tuple[str, tuple[str, str, str]] | None:
    """The innermost frame whose origin is one of kinds (tool and stdlib frames are passed over unless asked)."""
    for fr in frames:
        who, _ = origin(fr[1])
        if who in kinds:
            return who, fr
    return None


def culprit_frame(frames: Sequence[tuple[str, str, str]]) -> tuple[str, str, tuple[str, str, str]] | None:
    """(whose, name, frame): the innermost frame that is the program's or a library's. The standard library
    runs on behalf of its caller, and gpulab's own frames are passed over: neither is a culprit."""
    for fr in frames:
        who, name = origin(fr[1])
        if who in ("program", "library"):
            return who, name, fr
    return None


def native_library(native: Sequence[capture.Thread]) -> tuple[str, str] | None:
    """(kind, name) of the innermost native library on the main thread that is not the C runtime, libffi or
    Python itself: ("library", "cuDNN"), ("platform", "the NVIDIA driver (libcuda)"), ("ctypes", "") for a
    ctypes call (the Python frame that made it decides), or None."""
    main = next((t for t in native if t.main), native[0] if native else None)
    for f in (main.frames[:40] if main else ()):
        where = f.rsplit(" (", 1)[-1].rstrip(")") if " (" in f else ""
        low = where.lower()
        func = f.split(" (", 1)[0]
        if func in ("ffi_call", "_ctypes_callproc", "PyCFuncPtr_call", "_call_function_pointer"):
            return "ctypes", ""
        if not low or low.endswith((".py", ".c")) or ".py:" in low or ".c:" in low:
            if ".py:" in low:   # a Python frame inside the native stack: Python code, not a native library
                return None
            continue
        if any(low.startswith(s) for s in _SYSTEM_LIBS):
            continue
        for prefix, name in _DRIVER_LIBS.items():
            if low.startswith(prefix):
                return "driver", name
        for prefix, name in _LIBRARY_LIBS.items():
            if low.startswith(prefix):
                return "library", name
        return "unknown_lib", where
    return None


def blocked_driver_call(v: Mapping[str, Any], native: Sequence[capture.Thread]) -> str | None:
    """The driver call the host thread is stuck in: the verdict's own (driver_call, host_blocked_in's api), else
    the innermost driver API frame on the main thread's native stack."""
    said = v.get("driver_call") or (v.get("host_blocked_in") or {}).get("api")
    if said:
        return str(said)
    main = classify.main_thread(native)
    for f in (main.frames[:30] if main else ()):
        name = f.split(" (", 1)[0].strip()
        if _DRIVER_API.match(name):
            return name
    return None


def load_or_launch(v: Mapping[str, Any], native: Sequence[capture.Thread], op: Mapping[str, Any],
                   py: Sequence[tuple[str, str, str]]) -> Owner | None:
    """A hang with the host stuck in a kernel launch or a module load: the platform's behaviour (lazy loading
    serialises a kernel's first launch behind the kernels already running) meeting the program's code (kernels
    that rely on running at once). Both are said; the program's part names its line."""
    if v.get("status") not in ("hang", "timeout") or v.get("class") in ("collective", "rank_stuck"):
        return None   # a collective's launch waits for the peers, not for a module
    api = blocked_driver_call(v, native)
    if not api or not _LOAD_OR_LAUNCH.match(api):
        return None
    mine = _first(py, ("program",))
    site = op.get("call_site") or (short(mine[1][1], mine[1][2], mine[1][0]) if mine else None)
    inside = f" inside {op.get('name')}" if op.get("name") else ""
    at = f" at {site}" if site else ""
    loading = "ModuleLoad" in api or "LibraryLoad" in api or "GetFunction" in api or "GetKernel" in api
    return Owner("platform", f"the driver's lazy module loading ({api}{inside}), meeting the program's code{at}",
                 f"the host is stuck in the driver's {api}{inside}: "
                 + ("a kernel's module is loaded on its first use" if loading else "a kernel's first launch loads its "
                    "module")
                 + " and waits for the kernels already running (lazy loading, CUDA_MODULE_LOADING=LAZY, the default "
                 "since CUDA 12.2, serialises it), while the program relies on two kernels running at once (one "
                 "waits for work only the other does)",
                 f"load the kernel launched{at} before the one that waits for it starts (run it once first, e.g. in "
                 f"a warm-up step), or do not make one kernel wait for another: CUDA does not promise that two "
                 f"kernels run at once")


# ------------------------------------------------------------------------------------ registrations

def registrations(sources: Mapping[str, str]) -> dict[str, str]:
    """{namespace: "file:line"} of custom-op namespaces defined in the given source texts ({path: text}),
    {"kernel:NAME": "file:line"} of Triton and CUDA kernels defined there, {"function:NAME": "file:line"} of
    autograd.Function subclasses (the line of their backward) and {"hook:NAME": "file:line"} of the functions it
    registers as hooks (register_hook, register_forward_hook, ...). Pure: the caller reads the files
    (the program's own: its script and the sources beside it)."""
    out: dict[str, str] = {}
    for path, text in sources.items():
        for m in _REGISTER.finditer(text):
            ns = m.group("ns") or m.group("lib") or m.group("cpp")
            if ns and ns not in TORCH_NAMESPACES:
                out.setdefault(ns, f"{path}:{text.count(chr(10), 0, m.start()) + 1}")
        for rx in (_TRITON, _CUDA_KERNEL):
            for m in rx.finditer(text):
                line = text.count("\n", 0, m.start("name")) + 1
                out.setdefault(f"kernel:{m.group('name')}", f"{path}:{line}")
        for m in _FUNCTION.finditer(text):
            end = re.search(r"^\S", text[m.end():], re.M)   # the class's body ends at the next unindented line
            body = text[m.end():m.end() + end.start()] if end else text[m.end():]
            bwd = _BACKWARD_DEF.search(body)
            at = m.end() + bwd.start() if bwd else m.start()
            out.setdefault(f"function:{m.group('name')}", f"{path}:{text.count(chr(10), 0, at) + 1}")
        for name in {m.group("name") for m in _HOOKED.finditer(text)}:
            d = re.search(rf"^[ \t]*def\s+{name}\s*\(", text, re.M)
            if d:
                out.setdefault(f"hook:{name}", f"{path}:{text.count(chr(10), 0, d.start()) + 1}")
    return out


# ------------------------------------------------------------------------------------ the decision

def _op_where(op: Mapping[str, Any]) -> str:
    site = op.get("call_site")
    return f"{op.get('name')}" + (f", called at {site}" if site else "")


def _said(text: str, rx: re.Pattern) -> str | None:
    m = rx.search(text or "")
    return m.group(0).strip()[:200] if m else None


def decide(v: Mapping[str, Any], registered: Mapping[str, str] | None = None,
           platform: Mapping[str, Any] | None = None) -> Owner:
    """The owner of a failed run's culprit, from its verdict (DESIGN.md's dict: status, class, in_flight_op,
    stacks, stderr_tail, memcheck, processes, culprit, divergence), where the program's sources register
    custom ops and kernels (`registrations`), and what is known of the platform (its GPU arch, when 01 read it).
    Never reads `planted`: a planted fault is judged like a real one."""
    who = _decide(v, registered, platform)
    op = v.get("in_flight_op") or {}
    nth = op.get("pass") if isinstance(op, Mapping) else None
    # an autograd node's calls count the nodes of one graph (one AccumulateGrad per parameter), not the program's
    # calls of a line: no pass words for them
    engine = bool(_BACKWARD.match(str(op.get("name") or ""))) if isinstance(op, Mapping) else False
    if who.kind == "program" and v.get("status") == "error" and isinstance(nth, int) and nth > 1 and not engine:
        return Owner(who.kind, who.where, f"{who.why}; {pass_words(op, nth)}", who.program)
    return who


def pass_words(op: Mapping[str, Any], nth: int) -> str:
    """Whether the line ever ran the op before: on its first call the code path itself fails; on a later one the
    same code ran to the end before, so what it was given changed (the data, a shape, a state). Calls, not loop
    steps: a line that calls the op twice a step (two Linear layers in one Sequential) counts two a step."""
    if nth == 1:
        return f"it was the first call of {op.get('name')} from {op.get('call_site')}"
    return (f"it was the {ordinal(nth)} call of {op.get('name')} from {op.get('call_site')}: the {nth - 1} before "
            f"it from that line ran to the end, so what the line was given changed (the data, a shape, a state), "
            f"not the code")


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 13 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _decide(v: Mapping[str, Any], registered: Mapping[str, str] | None,
            platform: Mapping[str, Any] | None) -> Owner:
    registered = dict(registered or {})
    platform = dict(platform or {})
    cls = v.get("class")
    op = culprit_op(v)
    name = op.get("name")
    ns = namespace(name)
    stacks = v.get("stacks") or {}
    stderr = str(v.get("stderr_tail") or "")
    gpu_text = str(stacks.get("gpu") or "")

    # 1. the hardware or the driver said so
    hw = _said(stderr + "\n" + gpu_text, _PLATFORM)
    if hw:
        return Owner("platform", hw, "the driver reported a hardware or driver fault (an Xid, an ECC error, a lost "
                     "GPU): no program or library code can cause or fix that on its own")
    arch = str(platform.get("arch") or platform.get("gpu_arch") or "")
    if _ROCM_FAULT in stderr.lower() and _RDNA12.search(arch):
        return Owner("platform", f"ROCm on {arch} (RDNA1/RDNA2)", "a GPU page fault ('Memory access fault by GPU "
                     "node') on a consumer RDNA1/RDNA2 card, where ROCm's known faults of this kind are the driver's "
                     "and the runtime's (rule rdna_rocm_memory_faults)")

    py = _frames(capture.parse_python(stacks.get("python") or "")
                 if isinstance(stacks.get("python"), str) else stacks.get("python") or ())
    native = capture.parse_native(stacks.get("native") or "", v.get("pid")) \
        if isinstance(stacks.get("native"), str) else tuple(stacks.get("native") or ())

    # 2. a job: the cross-process rules already say whose it is
    if cls in ("collective_mismatch", "worker_stuck", "uneven_inputs", "skipped_collective"):
        row = next((p for p in v.get("processes") or () if p.get("role") == v.get("culprit")), {})
        d = v.get("divergence") or {}
        # its Python frame, else the op it has open (no stack captured: no py-spy, a rank holding its GIL), else
        # the collective the ranks part at
        where = row.get("frame") or row.get("open_op") or (
            f"{d.get('op')} (group {d.get('group')}, seq {d.get('seq')})" if d else "")
        if cls == "worker_stuck" and classify.forked_holding(v.get("culprit"), v.get("processes") or ()):
            return Owner("program", where, classify.fork_lock(row))
        if cls == "worker_stuck" and classify.fd_sharing_exhausted(stderr):
            return Owner("platform", f"the open-file limit, which {v.get('culprit') or 'a DataLoader worker'}'s "
                         f"batches exceed", "the workers could not send their batches: torch.multiprocessing shares "
                         "each tensor of a batch as an open file descriptor, the process ran out of them ('Too many "
                         "open files', printed by a worker's queue thread and lost), and the loader waits for a "
                         "batch that never comes",
                         program="torch.multiprocessing.set_sharing_strategy('file_system') before the DataLoader "
                                 "starts, or a higher open-file limit (ulimit -n), or batches of fewer, larger "
                                 "tensors (a collate_fn that stacks them)")
        return Owner("program", where or str(v.get("culprit") or "the job"),
                     {"collective_mismatch": "the ranks call different collectives at the same point",
                      "uneven_inputs": "a rank left the training loop the others are still in (uneven inputs)",
                      "skipped_collective": "a rank skipped a collective the others call"}.get(
                         cls, "the DataLoader worker blocks in the dataset's own code"))
    if cls == "child_stuck":
        return _child_owner(v)
    cycle = v.get("lock_cycle")
    if cls == "lock_cycle" and cycle:
        first = next((t for t in cycle["threads"] if t["thread"] == "the main thread"), cycle["threads"][0])
        return Owner("program", f"{first['at']} (waiting for {first['waits_for']})", cycle["said"])
    if cls == "rank_stuck":
        row = next((p for p in v.get("processes") or () if p.get("role") == v.get("culprit")), None)
        if row and classify.forked_holding(v.get("culprit"), v.get("processes") or ()):
            return Owner("program", f"{row.get('role')}: {row.get('frame') or 'its own code'}", classify.fork_lock(row))
        if row and row.get("own_code") and not row.get("open_op") and row.get("wait") not in ("cuda_sync",
                                                                                                "collective"):
            return Owner("program", f"{row.get('role')}: {row.get('frame') or 'its own code'}",
                         "the stuck rank runs the program's own code, with no op or collective open")

    # 2b. the host is stuck in a kernel launch or a module load: the platform's loading meets the program's kernels
    loaded = load_or_launch(v, native, op, py)
    if loaded is not None:
        return loaded

    # 2c. a crash inside compiled code, run once more eager (gpulab.hang.eagerrun): the op's own error names the line
    eager = eager_owner(v)
    if eager is not None:
        return eager

    # 3. a kernel launched outside the dispatcher is the in-flight record (compiled code's Triton launches)
    kern = kernel_owner(v, registered)
    if kern is not None:
        return kern

    # 3b. memcheck named the faulting kernel and where its code lives
    mc = v.get("memcheck") or {}
    for err in mc.get("errors") or ():
        src = err.get("file")
        if src:
            who, pkg = origin(src)
            kernel = err.get("kernel") or "?"
            if who == "program":
                return Owner("program", f"kernel {kernel} ({short(src, err.get('line'))})",
                             f"compute-sanitizer found the faulting access in kernel {kernel}, whose source is the "
                             f"program's own ({short(src, err.get('line'))})")
            if who == "library":
                return Owner("library", f"kernel {kernel} ({pkg}: {short(src, err.get('line'))})",
                             f"compute-sanitizer found the faulting access in kernel {kernel} of {pkg}")
        kernel = memcheck.kernel_name(err.get("kernel"))
        if f"kernel:{kernel}" in registered:
            place = registered[f"kernel:{kernel}"]
            return Owner("program", f"kernel {kernel} ({short(place)})",
                         f"compute-sanitizer found the faulting access in kernel {kernel}, defined in the program's "
                         f"own sources ({short(place)})")

    tb = traceback_frames(stderr)

    # 3c. the program's call met an error of its own making (refused arguments, memory, a dead worker)
    if cls in classify.CALL_CLASSES:
        changed = v.get("modified_in_place")
        if cls == "refused_call" and changed and changed["changed_by"][0].get("at"):
            first = changed["changed_by"][0]
            return Owner("program", f"{first['at']} (calling {first['op']})", inplace.words(changed))
        freed = v.get("freed_graph")
        if cls == "refused_call" and freed and len(freed["made_at"]) == 1:
            return Owner("program", f"{freed['made_at'][0][0]} (making the {freed['node']} node backward met again)",
                         freedgraph.words(freed))
        coll = v.get("collate")
        if cls == "refused_call" and coll:
            place, _ = _called_from({}, tb or py)
            where = (f"{coll['made_at']} (the samples of a batch the DataLoader could not stack)" if coll.get("made_at")
                     else f"{place or 'the DataLoader loop'} (a batch the DataLoader could not stack)")
            return Owner("program", where, collate.words(coll))
        tr = v.get("memory_trend") or {}
        if cls == "out_of_memory" and v.get("signal") == "SIGKILL" and tr.get("grew") \
                and not classify.out_of_memory(stderr):   # the host's out-of-memory killer: no call raised, none named
            who = f"{v['culprit']}: " if v.get("culprit") else ""
            return Owner("program", f"{who}what it keeps from step to step (killed by SIGKILL as its memory climbed)",
                         f"{memtrend.KILLED}; {memtrend.words(tr)}")
        called = call_owner(cls, op, tb or py, stderr, v.get("memory_trend"), worker_at=_worker_place(v),
                            registered=registered)
        if called is not None:
            return called

    # 4. the op's input was rejected by the kernel that checked it: the program made that input
    if cls in INPUT_CLASSES:
        mine = _first(tb, ("program",)) or _first(py, ("program",))
        seen = short(mine[1][1], mine[1][2], mine[1][0]) if mine else None
        if name and classify.op_kind(name) == "sync" and v.get("localized") != "gpu_event":
            # the error surfaced at a sync: the op that got the bad input ran before it, not localized
            return Owner("program", f"GPU work launched before {op.get('call_site') or seen or name} (not localized)",
                         f"a kernel's own device-side check of its input failed (typically an index out of range); "
                         f"{name} only reported it")
        line = op.get("call_site") if name else seen
        checked = compiled_index_owner(name, line, stderr) if name and name.startswith(inplace.COMPILED_REGION) \
            else None
        if checked is not None:
            return checked
        what = ("an index out of range" if cls == "out_of_bounds" else
                "an input that fails the kernel's own device-side check (typically an index out of range)")
        if line or name:
            return Owner("program", (f"{line}" if line else "") + (f" (calling {name})" if name else ""),
                         f"{name or 'the op'} rejected {what}: the kernel checked its input and the program "
                         f"passed it{' at ' + line if line else ''}")

    # 5. a custom op: where was it registered?
    if name and ns and ns not in TORCH_NAMESPACES:
        place = registered.get(ns)
        if place:
            who, pkg = origin(place.rsplit(":", 1)[0])
            if who == "program":
                kernels = [k.split(":", 1)[1] for k, p in registered.items() if k.startswith("kernel:")
                           and p.rsplit(":", 1)[0] == place.rsplit(":", 1)[0]]
                inner = culprit_frame(py) or culprit_frame(tb)
                mine = inner[2] if inner and inner[0] == "program" else None
                lib = native_library(native) if v.get("status") in ("hang", "timeout") else None
                how = " in a ctypes call" if mine and (lib == ("ctypes", "") or _calls_ctypes(py or tb, mine)) else ""
                where = (short(mine[1], mine[2], mine[0]) if mine else op.get("call_site") or "its call site")
                return Owner("program", f"{where} (the custom op {name}, registered at {short(place)}"
                             + (f", called at {op.get('call_site')}" if mine and op.get("call_site") else "") + ")",
                             f"{_what(v)} inside {name}, the program's own custom op (namespace {ns} registered at "
                             f"{short(place)})" + (f", at {where}{how}" if mine else "")
                             + (f"; its kernel(s) {', '.join(kernels)} are defined there" if kernels else ""))
            if who == "library":
                return Owner("library", f"{name} ({pkg})", f"the custom op's namespace {ns} is registered by {pkg}")

    # 5b. no op open, the main thread in init_process_group's rendezvous: it waits for the rest of its job
    waiting = rendezvous_wait(py) if v.get("status") in ("hang", "timeout") and not name else None
    if waiting is not None:
        return waiting

    # 6. the frames the failure happened in
    lib = native_library(native) if v.get("status") in ("hang", "timeout") else None
    inner = culprit_frame(py) or culprit_frame(tb)
    if lib and lib[0] == "library" and not (inner and inner[0] == "program" and ns not in TORCH_NAMESPACES):
        return Owner("library", lib[1] + (f" (in {name})" if name else ""),
                     f"the main thread is stuck inside {lib[1]}'s native code" + (f" during {name}" if name else ""))
    if lib and lib[0] == "driver" and not name:
        return Owner("unknown", lib[1], f"the host is inside {lib[1]} outside any recorded op: the GPU work it waits "
                     "for is not localized, so whose it is stays unknown")
    if inner:
        who, pkg, fr = inner
        place = short(fr[1], fr[2], fr[0])
        inside_op = _inside_dispatcher(py or tb, fr) and ns in TORCH_NAMESPACES and bool(ns)
        if who == "program" and not inside_op and (not name or ns not in TORCH_NAMESPACES
                                                   or not _in_torch_below(py or tb, fr)):
            how = ("a ctypes call from the program's code" if lib and lib[0] == "ctypes" or
                   _calls_ctypes(py or tb, fr) else "the program's own code")
            died = classify.dead_threads(v.get("stderr_tail") or "") if v.get("status") in ("hang", "timeout") else []
            # the place is the Owner's `where`: the why does not say it again (the next step says both)
            return Owner("program", place + (f" (inside {name})" if name else ""),
                         f"{_what(v)} in {how}"
                         + (f", inside its custom op {name}" if name and ns not in TORCH_NAMESPACES else "")
                         + _error_words(v)
                         + (f"; before it, the program's {classify.died_words(died[0])}: fix that first, as what "
                            f"waits here may wait for that thread's work (a queue it fills, a Queue's task_done, a "
                            f"join, an Event it would have set)" if died else ""))
        if who == "library" and pkg != "PyTorch":
            return Owner("library", f"{pkg} ({place})", f"the failure happened in the package {pkg} at {place}")
        if who == "library" and v.get("status") == "error" and not name:
            # an exception raised in PyTorch's own Python with no op in flight (no argument check that classify
            # reads as a refusal): whose it is follows from what it means, or stays unknown, named where it was
            mine = _first(py or tb, ("program",))
            at = short(mine[1][1], mine[1][2], mine[1][0]) if mine else None
            if _NO_DEVICE.search(stderr):
                return Owner("platform", f"{at or place} (asking for a GPU this PyTorch or machine does not have)",
                             f"{_what(v)} raised in PyTorch's {fr[0]} ({place}): the program asks for CUDA and this "
                             f"PyTorch build has none (a +cpu wheel), or the machine has no NVIDIA driver or no visible "
                             f"GPU (CUDA_VISIBLE_DEVICES): run it where PyTorch sees a GPU (torch.cuda.is_available()), "
                             f"or choose the device the program runs on (device='cpu' where there is none)")
            known = sharing.meaning(stderr)
            if known and at:
                gone = sharing.sender_gone(v.get("processes") or ()) if known[0] == sharing.RECEIVING else None
                return Owner("program", f"{at} ({known[0]})", f"{_what(v)} raised in PyTorch's {fr[0]} ({place}): "
                             f"{known[1]}" + (f"; {gone}" if gone else ""))
            return Owner("unknown", f"PyTorch ({place})" + (f", called at {at}" if at else ""),
                         f"{_what(v)} raised inside PyTorch's own {fr[0]} ({place}) with no op in flight"
                         + (f", from the program's call at {at}" if at else "") + ": whether that call or PyTorch "
                         "is at fault is not in the evidence; the exception's message says what it expected")
        if who == "library" and v.get("status") == "crash" and not name:
            # a process that dies of a signal inside PyTorch's own code, outside any op: no argument check
            # fired, so it is PyTorch's to fix, whatever the program passed
            mine = _first(py or tb, ("program",))
            at = f", called at {short(mine[1][1], mine[1][2], mine[1][0])}" if mine else ""
            return Owner("library", f"PyTorch ({place}){at}",
                         f"{_what(v)} inside PyTorch's own {fr[0]} ({place}), with no op in flight: a crash there "
                         f"is PyTorch's to fix, however it was called")

    # 7. an op of PyTorch's own, on inputs it accepted
    if name and ns in TORCH_NAMESPACES:
        if classify.op_kind(name) == "sync" and v.get("localized") != "gpu_event":
            return Owner("unknown", _op_where(op), f"the host waits in {name}, a sync: the GPU work it waits for "
                         "is not localized (the sync line lies), so whose code it is stays unknown")
        return Owner("library", f"{name} (PyTorch)" + (f", called at {op.get('call_site')}" if op.get("call_site")
                                                        else ""),
                     f"the failure is inside PyTorch's own {name} on inputs it accepted"
                     + (f" ({lib[1]} native code)" if lib and lib[0] == "library" else ""))
    if name:
        return Owner("unknown", _op_where(op), f"{name} is no PyTorch op and where its namespace {ns} is registered "
                     "was not found in the program's sources nor on the stacks")
    return Owner("unknown", "", "no op was in flight and no stack names the code that failed")


_NO_DEVICE = re.compile(r"Torch not compiled with CUDA enabled|Found no NVIDIA driver on your system|"
                        r"No CUDA GPUs are available|CUDA driver initialization failed")
_RENDEZVOUS = ("_create_c10d_store", "_env_rendezvous_handler", "_tcp_rendezvous_handler", "_store_based_barrier",
               "_file_rendezvous_handler", "rendezvous")


def rendezvous_wait(py: Sequence[tuple[str, str, str]]) -> Owner | None:
    """A process held in torch.distributed's rendezvous (the TCPStore waits for its workers, a worker for its
    master, a store-based barrier for the other ranks) past the stall window: the job's other processes never
    joined. PyTorch's store works; the launch does not match the world size the program asked for."""
    inner = next((f for f in py if f[0] in _RENDEZVOUS and "/torch/distributed/" in f[1].replace(os.sep, "/")), None)
    mine = _first(py, ("program",))
    if inner is None or mine is None:
        return None
    at = short(mine[1][1], mine[1][2], mine[1][0])
    return Owner("program", f"{at} (init_process_group, waiting for the job's other processes)",
                 f"the process waits in torch.distributed's rendezvous ({inner[0]}) for the rest of its job, and they "
                 f"never joined: started alone (python, not torchrun), with a world size larger than the processes "
                 f"launched, stuck before they reach init_process_group (their own verdicts say where), or unable "
                 f"to reach MASTER_ADDR:MASTER_PORT (another job on that port, a firewall, a node that never "
                 f"started): launch every rank (torchrun --nproc-per-node N, or mp.spawn), make "
                 f"WORLD_SIZE match what is launched, or check the address; PyTorch's store only waits as asked")


def _child_owner(v: Mapping[str, Any]) -> Owner:
    """A child process its parent waits for: the parent's join is the line to change when the child only waits to
    hand over what it put on a Queue; else the child's own frame, the program's when it runs the program's code."""
    rows = v.get("processes") or ()
    child = next((p for p in rows if p.get("role") == v.get("culprit")), {})
    parent = next((p for p in rows if p.get("wait") == "children"), {})
    if child.get("wait") == "queue_flush" and parent.get("frame"):
        return Owner("program", f"{parent['frame']} (joining {child.get('role')} before reading its queue)",
                     f"{child.get('role')} has done its work and cannot end: a process that put data on a "
                     f"multiprocessing Queue waits, as it exits, until that data is written into the queue's pipe, "
                     f"and nobody reads it while its parent waits in join(): get() everything from the queue "
                     f"before join() (or join with a timeout after the queue is drained)")
    if child.get("writing") and parent.get("frame"):
        return Owner("program", f"{parent['frame']} ({classify.CHILD_OUTPUT_UNREAD})",
                     f"{' '.join(str(child.get('role')).split())} is blocked in write(), and the program waits for "
                     "it to end before it reads what the child writes: a pipe holds 64 kB, so a child whose stdout "
                     "or stderr is a pipe (subprocess.Popen(..., stdout=PIPE)) stops in write() once it is full, and "
                     "never ends; read while it runs: proc.communicate() (or subprocess.run(..., capture_output=True)), "
                     "or send what you do not read to a file or subprocess.DEVNULL")
    where = child.get("frame") or str(v.get("culprit") or "the child process")
    if classify.forked_holding(v.get("culprit"), rows):
        return Owner("program", where, classify.fork_lock(child))
    if child.get("started_by") == "fork" and "OpenMP" in str(child.get("native_lib") or ""):
        op = child.get("open_op")
        return Owner("platform", f"{child['native_lib']}, in {child.get('role')}" + (f" ({op})" if op else ""),
                     f"{child.get('role')} was forked from a process that had already run parallel CPU work, and "
                     f"waits inside {child['native_lib']}'s thread pool: fork copies the pool's state but not its "
                     f"threads, so the child's first parallel op waits for workers that do not exist (GNU OpenMP "
                     f"is not fork-safe)",
                     program="start the child processes with spawn or forkserver "
                             "(multiprocessing.get_context('spawn'), or torch.multiprocessing's start_processes with "
                             "start_method='spawn'), which begin a fresh interpreter, or fork before the parent runs "
                             "any parallel CPU op")
    if child.get("own_code"):
        return Owner("program", where, f"the child process the program waits for runs the program's own code there "
                     f"and does not end")
    return Owner("unknown", where, "the child process the program waits for does not end, and its frame is not the "
                 "program's own code: what it waits for is not in the evidence")


_GENERIC = {"forward", "_call_impl", "_wrapped_call_impl", "__call__", "inner", "wrapper", "<module>",
            "_fn"}   # _fn, inner: torch._dynamo.disable's wrappers (torch.optim's methods run inside them)


def _torch_entry(frames: Sequence[tuple[str, str, str]]) -> str | None:
    """The PyTorch function the program called where it raised (torch.save, not the file writer's __init__ inside
    it): the outermost named frame of PyTorch's innermost run of frames."""
    run = []
    for f in frames:
        if origin(f[1]) != ("library", "PyTorch"):
            if run:
                break
            continue
        run.append(f[0])
    return next((fn for fn in reversed(run) if fn not in _GENERIC), None)


_BACKWARD = re.compile(r"^autograd::engine::evaluate_function:\s*(\S+)")


def _library_not_torch(fr: tuple[str, str, str]) -> bool:
    who, pkg = origin(fr[1])
    return who == "library" and pkg != "PyTorch"


def call_site_frame(frames: Sequence[tuple[str, str, str]]) -> tuple[str, str, str] | None:
    """The innermost frame that is the program's or a library's other than PyTorch: where the recorder's call
    site of an op called from those frames points (gpulab.trace's rule: the innermost frame outside torch)."""
    return next((f for f in frames if origin(f[1])[0] == "program" or _library_not_torch(f)), None)


def _called_from(op: Mapping[str, Any], frames: Sequence[tuple[str, str, str]]) -> tuple[str | None, str | None]:
    """(the program's line that made the call, a library's line between it and PyTorch): the traceback's innermost
    program frame, else the recorded op's call site."""
    mine = _first(frames, ("program",))
    lib = next((f for f in frames if _library_not_torch(f)), None)
    place = short(mine[1][1], mine[1][2], mine[1][0]) if mine else None
    if place is None and op.get("call_site") and program_site(op["call_site"]):
        place = str(op["call_site"])
    via = None
    if lib and (not mine or frames.index(lib) < frames.index(mine[1])):
        via = f"{origin(lib[1])[1]} ({short(lib[1], lib[2], lib[0])})"
    return place, via


def compiled_op(v: Mapping[str, Any]) -> dict | None:
    """The record of the compiled region (or of a kernel torch.compile generated) the failed run was in: the op in
    flight, else the innermost open one; None when it was in none."""
    for op in (v.get("in_flight_op") or {}, *reversed(list(v.get("open_ops") or ()))):
        name = str((op or {}).get("name") or "")
        if name.startswith((inplace.COMPILED_REGION, "CompiledFunction")) or INDUCTOR_KERNEL.match(name):
            return dict(op)
    return None


def eager_owner(v: Mapping[str, Any]) -> Owner | None:
    """Whose a crash inside compiled code is, from its eager rerun: the program's line where the same data failed
    eager with the error of an op that names itself; torch.compile's when eager ran to its end. None when the
    rerun did not run, was stopped, or ended with no class and no line of the program's."""
    er = v.get("eager_rerun") or {}
    op = compiled_op(v) or {}
    compiled = op.get("call_site")
    region = f"the compiled region called at {compiled}" if compiled else "the compiled region"
    if er.get("status") == "ok":
        name = op.get("name") or "the compiled code"
        return Owner("library", f"{name} (torch.compile's generated code){', called at ' + compiled if compiled else ''}",
                     f"the same program ran to its end eager (TORCHDYNAMO_DISABLE=1): what failed is the code "
                     f"torch.compile generated for {region} (report it to PyTorch; TORCH_COMPILE_DEBUG=1 keeps that "
                     f"code, the minifier cuts it down), unless the fault does not recur run after run",
                     program="torch.compile off for that region (torch.compiler.disable on the function, or "
                             "TORCHDYNAMO_DISABLE=1) until PyTorch fixes it")
    if er.get("status") not in ("error", "crash") or not er.get("cls") or not er.get("place"):
        return None
    outer = f", called from {er['called_from'][0]}" if er.get("called_from") else ""
    return Owner("program", f"{er['place']} (found eager; compiled: {region})",
                 f"torch.compile's generated kernel names no op, so gpulab ran the program once more eager "
                 f"(TORCHDYNAMO_DISABLE=1): the same data failed at {er['place']}{outer} with "
                 f"`{classify.brief(er.get('said') or '', 200)}`; what the program passes there is what to fix "
                 f"(the compiled run failed on it too, without a name)")


def compiled_index_owner(name: str, line: str | None, stderr: str) -> Owner | None:
    """The program's, at the line that called the compiled code (`name`: its region or its kernel), when the
    kernel torch.compile generated failed its own bound check; None otherwise. Why: the generated kernel knows only
    its temporaries (tmp2), the eager run raises at the op that takes the index."""
    check = classify.generated_index_check(stderr)
    if not check or not line:
        return None
    n = check["bound"]
    return Owner("program", f"{line} (calling {name})",
                 f"the kernel torch.compile generated for the region called at {line} checked an index against a "
                 f"table of {n} rows (`{check['cond']}`) and found it outside: the program passed that index into the "
                 f"compiled code (typically a token id past an embedding's vocabulary of {n}, or a class id past {n} "
                 f"classes, from data made for another model); run the program once eager (TORCHDYNAMO_DISABLE=1) "
                 f"and PyTorch names the op and its line, with the bad index")


def _worker_place(v: Mapping[str, Any]) -> str | None:
    """The op a dead DataLoader worker was in, or finished last, and its line, read from the worker's op log
    (gpulab.hang.watchdog.evidence.worker_death); None when not known."""
    for key, how in (("in_flight_op", "in"), ("last_completed_op", "after")):
        op = v.get(key) or {}
        if str(op.get("process") or "").startswith("DataLoader worker"):
            return f"{how} {op.get('name')} at {op.get('call_site')}"
    return None


_FN_GRADS = re.compile(r"[Ff]unction (?P<node>\w+) returned an incorrect number of gradients \(expected (?P<want>\d+), "
                       r"got (?P<got>\d+)\)|[Ff]unction (?P<node2>\w+) returned an invalid gradient at index (?P<i>\d+) - "
                       r"(?P<what>[^\n]+)")


def _own_function(stderr: str, registered: Mapping[str, str]) -> Owner | None:
    """autograd refusing what a custom autograd.Function's backward returned: the line to change is that
    backward (found in the program's sources by its class: autograd names its node <Class>Backward), not the
    backward() call that ran it."""
    m = _FN_GRADS.search(stderr or "")
    if not m:
        return None
    node = m.group("node") or m.group("node2")
    cls_name = node[:-len("Backward")] if node.endswith("Backward") else node
    at = registered.get(f"function:{cls_name}")
    if not at:
        return None
    if m.group("want"):
        why = (f"its backward returns {m.group('got')} gradient(s) where forward takes {m.group('want')} input(s): "
               f"return one per input of forward, in forward's order, None for an input that needs none (a "
               f"number, a flag, a tensor that needs no gradient)")
    else:
        why = (f"the gradient its backward returns at index {m.group('i')} does not fit forward's input "
               f"{m.group('i')} ({classify.brief(m.group('what'), 200)}): return a gradient of that input's shape, "
               f"dtype and device (sum it over the dimensions forward broadcast)")
    return Owner("program", f"{short(at)} ({cls_name}.backward, the program's autograd.Function)",
                 f"autograd refused what the program's autograd.Function {cls_name} returned from backward ({why})")


_HOOK_CHANGED = re.compile(r"hook '(?P<name>\w+)' has changed the (?P<what>size|type|device) of value")


def _own_hook(stderr: str, registered: Mapping[str, str]) -> Owner | None:
    """autograd refusing what a gradient hook of the program's returned: the hook is the line to change."""
    m = _HOOK_CHANGED.search(stderr or "")
    at = registered.get(f"hook:{m.group('name')}") if m else None
    if not at:
        return None
    return Owner("program", f"{short(at)} ({m.group('name')}, a hook the program registered)",
                 f"autograd refused what the program's hook {m.group('name')} returned: a gradient of another "
                 f"{m.group('what')} than the one it was given; a gradient hook returns None (to keep the gradient) "
                 f"or a tensor of the same shape, dtype and device")


def call_owner(cls: str, op: Mapping[str, Any], frames: Sequence[tuple[str, str, str]], stderr: str,
               trend: Mapping[str, Any] | None = None, worker_at: str | None = None,
               registered: Mapping[str, str] | None = None) -> Owner | None:
    """Whose an error at the program's own call is (classify.CALL_CLASSES): refused arguments and memory that ran
    out are the program's (the line that made the call); a DataLoader worker that died without a traceback is
    the platform's limits meeting the program's data loading (SIGKILL, SIGBUS), else unknown."""
    name = op.get("name") if op else None
    if cls == "worker_died":
        died = classify.worker_died(stderr) or {}
        sig = died.get("signal")
        where = f"DataLoader worker (pid {died.get('pids')})"
        last = f" (its op log: last {worker_at})" if worker_at else ""
        if sig == "Killed":
            return Owner("platform", f"{where} killed by SIGKILL{last}", died["meaning"],
                         program="fewer workers (num_workers), a smaller prefetch_factor, a dataset that reads each "
                                 "sample when asked instead of holding them all; DataLoader(num_workers=0) loads in the "
                                 "main process, where a run under gpulab records the line that dies")
        if sig == "Bus error":
            return Owner("platform", f"{where} killed by SIGBUS: shared memory (/dev/shm) full{last}", died["meaning"],
                         program="a larger /dev/shm (docker run --shm-size=8g), or "
                                 "torch.multiprocessing.set_sharing_strategy('file_system') before the DataLoader "
                                 "starts, or fewer workers or a smaller prefetch_factor")
        if worker_at:
            return Owner("unknown", where + last, f"{died.get('meaning') or 'the worker died'}; it left no traceback: "
                         f"its op log shows it last {worker_at}, which says where it was, not what ended it; "
                         "DataLoader(num_workers=0) runs the same loading in the main process, where a run under "
                         "gpulab records where it dies")
        return Owner("unknown", where, f"{died.get('meaning') or 'the worker died'}; it left no traceback, so the "
                     "code it died in is not known: DataLoader(num_workers=0) runs the same loading in the main "
                     "process, where a run under gpulab records where it dies")
    place, via = _called_from(op or {}, frames)
    if cls == "refused_call":
        got = classify.refused(stderr)
        if not got or not (place or name):
            return None
        # autograd refusing what the program's own Function or hook returned: read from its message, whichever op
        # the recorder saw in flight (a build that marks no raised op leaves backward()'s last op there)
        own = _own_function(stderr, registered or {}) or _own_hook(stderr, registered or {})
        if own is not None:
            return own
        node = _BACKWARD.match(str(name or ""))
        if node:   # autograd's engine raised while running a node: the program's use of autograd, in its backward
            name = None
            what = f"autograd (running {node.group(1)})"
        else:
            torch_fn = _torch_entry(frames)
            what = name or ("the code torch.compile generated" if classify.generated_check(stderr) else
                            f"PyTorch's {torch_fn}" if torch_fn else "PyTorch")
        said = f"{got[0]}: {classify.brief(got[1], 300)}"
        known = refusals.meaning(stderr)
        if known and place and not via:
            return Owner("program", f"{place} ({known[0]})", f"{what} refused the call ({said}): {known[1]}")
        if via and place:
            return Owner("program", place, f"{what} refused the call that {via} made on the program's behalf "
                         f"({said}): check what the program passes to it there")
        if via:
            return Owner("library", via, f"{what} refused the call {via} made ({said}), and no frame of the "
                         f"program's own is between them")
        return Owner("program", place + (f" (calling {name})" if name else ""),
                     f"{what} refused the arguments the program gave it ({said}): its own check, not a fault "
                     f"inside it")
    if cls == "out_of_memory":
        oom = classify.out_of_memory(stderr) or {}
        tr = trend or {}
        why = "memory ran out at the program's call" + (f" asking for {oom['asked']}" if oom.get("asked") else "")
        if oom.get("allocated"):
            why += f"; PyTorch held {oom['allocated']} of {oom.get('total', 'the device')}"
            why += f", {oom['free']} free" if oom.get("free") else ""
            why += f", {oom['reserved_unallocated']} reserved but unallocated" if oom.get("reserved_unallocated") else ""
        need = ("the program's tensors, batch and model need more than the device has free (a smaller batch or "
                "sequence, activation checkpointing, a lower precision")
        if tr.get("grew"):
            why += f"; {memtrend.words(tr)}"
        elif tr:
            why += f"; {memtrend.words(tr)}: {need})"
        else:
            why += (f": {need}; if the memory PyTorch holds grows step after step, the program keeps tensors alive "
                    f"across steps: a loss summed without .item(), outputs kept in a list)")
        at = ", where memory ran out" if tr.get("grew") else ""   # what keeps the memory is elsewhere
        return Owner("program", (place or "the program") + (f" (calling {name}{at})" if name else at), why)
    return None


def _what(v: Mapping[str, Any]) -> str:
    """How the run failed, in a few words: 'a crash (SIGSEGV)', 'a hang (host_lock)', 'an error (illegal_address)',
    or for an error no class names, the program's last words ('an error (KeyError: ...)')."""
    status, cls = v.get("status"), v.get("class")
    detail = v.get("signal") if status == "crash" and v.get("signal") else cls
    if status == "error" and cls in (None, "unknown"):
        detail = lastwords.of(v.get("stderr_tail") or "")[:200] or detail
    return f"{'an' if status in ('error',) else 'a'} {status}" + (f" ({detail})" if detail else "")


_NO_INPUT = (("bdb.BdbQuit", "a debugger stop (breakpoint() or pdb.set_trace(), just before this line)"),
             ("EOFError: EOF when reading a line", "input()"))


def _error_words(v: Mapping[str, Any]) -> str:
    """What an error's own words say beyond 'fix it there': a program that reads standard input fails where gpulab
    gives it none (stdin is /dev/null, as a batch job's, so pdb quits and input() raises at once; only `gpulab
    watch` at a terminal passes the terminal on); torch.compile refusing a line (a graph break made an error by
    fullgraph=True), with dynamo's hint."""
    tail = v.get("stderr_tail") or ""
    words = lastwords.of(tail) if v.get("status") == "error" else ""
    what = next((w for k, w in _NO_INPUT if words.startswith(k)), None)
    if what:
        return (f"; the program reads standard input there ({what}) and gpulab gives it none (stdin is /dev/null, "
                f"as in a batch job), so it ends where a terminal would wait: remove it, or run it under `gpulab "
                f"watch` at a terminal, which passes the terminal on")
    if not words.startswith("torch._dynamo.exc.Unsupported"):
        return ""
    hints = [ln.strip()[len("Hint:"):].strip() for ln in tail.splitlines() if ln.strip().startswith("Hint:")]
    # a hint that names what to write instead (torch.cond, torch.where) before one about dynamo itself
    hint = next((h for h in hints if "`" in h or "torch." in h), hints[0] if hints else "")
    return ("; torch.compile cannot trace this line and was told to stop there (fullgraph=True, or "
            "error_on_graph_break): rewrite it" + (f" (dynamo's hint: {hint[:300]})" if hint else "")
            + ", or compile without fullgraph=True")


def _in_torch_below(frames: Sequence[tuple[str, str, str]], fr: tuple[str, str, str]) -> bool:
    """Whether PyTorch's frames sit inside (innermost of) the program's frame: the program called torch and
    the failure is in torch's code, not in the program's line itself."""
    for f in frames:
        if f is fr:
            return False
        if origin(f[1]) == ("library", "PyTorch"):
            return True
    return False


def _inside_dispatcher(frames: Sequence[tuple[str, str, str]], fr: tuple[str, str, str]) -> bool:
    """Whether gpulab's own frames (its dispatch modes: the recorder, a planted fault) sit inside the program's
    frame: the program's line only made the call; the failure is inside the op it called."""
    for f in frames:
        if f is fr:
            return False
        if origin(f[1])[0] == "tool":
            return True
    return False


def _calls_ctypes(frames: Sequence[tuple[str, str, str]], fr: tuple[str, str, str]) -> bool:
    for f in frames:
        if f is fr:
            return False
        if re.search(r"[/\\]ctypes[/\\]", f[1]):
            return True
    return False


# ------------------------------------------------------------------------------------ what to do

def meets(o: Mapping[str, Any]) -> str:
    """A platform owner with a way out in the program (a launch stuck behind lazy loading, a child forked into
    OpenMP's pool): both sides, in the words the index and 04 share."""
    return (f"the platform's behaviour meets the program's code: {o.get('why')}; the program's own way out: "
            f"{o.get('program')}")


def next_step(o: Owner | Mapping[str, Any] | None) -> str | None:
    """The next step that follows from the owner alone (None when unknown: the caller's own rules decide)."""
    if isinstance(o, Mapping):
        o = Owner.from_dict(o)
    if o is None or o.kind == "unknown":
        return None
    if o.kind == "program":
        return classify.program_step(o.where, o.why)
    if o.kind == "library":
        return (f"the fault is in {o.where}: report it upstream with 03's verified repro and bundle.zip "
                f"(today's behaviour), and the workaround if 04 found one")
    if o.program:
        return (f"the platform's behaviour meets the program's code: {o.where} ({o.why}); apply the fix registry's "
                f"setting for it (gpulab fixes --scenario auto tries it), or, in the program: {o.program}")
    return (f"the platform: {o.where}; apply the fix registry's settings for this platform (gpulab fixes "
            f"--scenario auto tries them) and check the driver, firmware and hardware ({o.why})")
