"""Real faults, planted on purpose, for drills and tests.

A drill is only worth something if the failure is real: a native mutex deadlock (with the GIL held or
released), a library whose static initializer deadlocks inside dlopen, a segfault inside an op, a slow op
that does finish, NaN written into an op's output, and on CUDA a kernel that spins forever. The watchdog
must find each of them from the outside, exactly as it would find the user's own bug.

Spec grammar (`--fault SPEC`, the notebooks' `fault` parameter)::

    SPEC := "none" | KIND [":" OP ["@" N]] ("," KEY "=" VALUE)*
    KIND := deadlock | segfault | slow | nan | error | spin | libload
    OP   := a PyTorch op as printed: aten.mm, aten.mm.default, mm (= aten.mm), mylib.my_op
    N    := which call of OP is hit, 1-based (default 1)
    keys := deadlock: gil=held|released (default held)
            slow:     seconds=FLOAT (default 1.0)
            spin:     cycles=INT (default 2**62: forever), CUDA only
    libload takes no OP: it loads a freshly compiled library whose constructor deadlocks, at startup.

Examples: ``deadlock:aten.mm@2,gil=released``, ``segfault:aten.addmm``, ``slow:aten.bmm,seconds=0.5``,
``nan:aten._softmax``, ``spin:aten.mm@3``, ``libload``.

The watchdog plants a fault by name, as the recorder knows no fault (it sits below gpulab.hang):
`child_env(env, spec)` puts the spec in $GPULAB_FAULT and `plant_from_env` first in $GPULAB_PRELOAD, which the
recorded child (`python -m gpulab.trace`) calls before the scenario's fixes and before the op recorder is
installed, so the fault's dispatch mode sits below the recorder: the recorder logs the op start, then the op
reaches the fault. Only the watched root plants it (the variable is dropped once read, so its own children do
not). Every planted fault announces itself on stderr so a report can mark it as planted.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from gpulab import proc
from gpulab.trace import preload

KINDS = ("deadlock", "segfault", "slow", "nan", "error", "spin", "libload")
_KEYS: Mapping[str, Mapping[str, Any]] = {
    "deadlock": {"gil": "held"},
    "segfault": {},
    "slow": {"seconds": 1.0},
    "nan": {},
    "error": {},
    "spin": {"cycles": 2 ** 62},
    "libload": {},
}
_GIL_CHOICES = ("held", "released")
PLANTED_MARK = "gpulab.faults: planted"
ENV = "GPULAB_FAULT"                          # the spec the watched root plants
PLANTER = "gpulab.hang.faults:plant_from_env"  # named in $GPULAB_PRELOAD (gpulab.trace.preload.ENV)
DATA = Path(__file__).resolve().parent / "native"


class FaultSpecError(ValueError):
    """A fault spec that does not parse; the message names the bad part and the valid choices."""


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    op: str | None = None          # full or packet op name, e.g. "aten.mm" or "aten.mm.default"
    nth: int = 1                   # which matching call triggers the fault (1-based)
    options: tuple[tuple[str, Any], ...] = field(default_factory=tuple)

    def option(self, key: str) -> Any:
        return dict(self.options).get(key, _KEYS[self.kind].get(key))

    def __str__(self) -> str:
        text = self.kind
        if self.op:
            text += f":{self.op}" + (f"@{self.nth}" if self.nth != 1 else "")
        for k, v in self.options:
            text += f",{k}={v}"
        return text

    def matches(self, op_name: str) -> bool:
        """True when a dispatched op's printed name (aten.mm.default) is the spec's op or its overload."""
        return self.op is not None and (op_name == self.op or op_name.startswith(self.op + "."))


def parse(spec: str | None) -> FaultSpec | None:
    """Text -> FaultSpec (None for "none"/""/None). Raises FaultSpecError naming the bad part."""
    if spec is None:
        return None
    text = str(spec).strip()
    if text.lower() in ("", "none", "null"):
        return None
    head, *opts = [p.strip() for p in text.split(",")]
    kind, _, target = head.partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise FaultSpecError(f"fault kind {kind!r} in {spec!r} is not valid; choose one of {', '.join(KINDS)} "
                             f"(or 'none')")
    op, nth = None, 1
    if target:
        if kind == "libload":
            raise FaultSpecError(f"fault {spec!r}: libload takes no op (it deadlocks at startup, before any op)")
        op, _, n = target.partition("@")
        op = op.strip()
        if not op:
            raise FaultSpecError(f"fault {spec!r}: empty op name; write e.g. {kind}:aten.mm")
        if "." not in op:
            op = f"aten.{op}"
        if n:
            try:
                nth = int(n)
            except ValueError:
                raise FaultSpecError(f"fault {spec!r}: call number {n!r} after '@' is not an integer") from None
            if nth < 1:
                raise FaultSpecError(f"fault {spec!r}: call number must be >= 1, got {nth}")
    elif kind != "libload":
        raise FaultSpecError(f"fault {spec!r}: {kind} needs an op, e.g. {kind}:aten.mm or {kind}:aten.mm@2")
    options = []
    for item in opts:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in _KEYS[kind]:
            valid = ", ".join(f"{k}=" for k in _KEYS[kind]) or "none"
            raise FaultSpecError(f"fault {spec!r}: option {item!r} is not valid for {kind}; valid options: {valid}")
        default = _KEYS[kind][key]
        try:
            conv = type(default)(value.strip()) if not isinstance(default, str) else value.strip().lower()
        except ValueError:
            raise FaultSpecError(f"fault {spec!r}: {key}={value!r} is not a {type(default).__name__}") from None
        if key == "gil" and conv not in _GIL_CHOICES:
            raise FaultSpecError(f"fault {spec!r}: gil={value!r}; choose one of {', '.join(_GIL_CHOICES)}")
        if key == "seconds" and not conv >= 0:
            raise FaultSpecError(f"fault {spec!r}: seconds must be >= 0, got {value!r}")
        options.append((key, conv))
    return FaultSpec(kind, op, nth, tuple(options))


# ------------------------------------------------------------------------------------ native pieces

def build_library(name: str = "ctor_deadlock", cc: str | None = None) -> Path:
    """Compile data/faults/NAME.c into a shared library, cached by source hash (the compile takes ~0.1 s
    but a drill should not pay it twice, and parallel builds must not see half-written files)."""
    src = DATA / f"{name}.c"
    if not src.exists():
        choices = sorted(p.stem for p in DATA.glob("*.c"))
        raise FileNotFoundError(f"no fault library source {src}; choose one of {', '.join(choices)}")
    compiler = cc or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise RuntimeError("the libload fault needs a C compiler (cc or gcc) on PATH, or CC set; none found")
    digest = hashlib.sha256(src.read_bytes() + compiler.encode()).hexdigest()[:16]
    cache = Path(tempfile.gettempdir()) / f"gpulab-faults-{os.getuid()}" / digest
    lib = cache / f"lib{name}.so"
    if lib.exists():
        return lib
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".lib{name}.{os.getpid()}.so"
    r = proc.run([compiler, "-shared", "-fPIC", "-O0", "-g", "-o", str(tmp), str(src), "-lpthread"],
                 timeout_s=120, capture=True)
    if r.returncode != 0:
        raise RuntimeError(f"compiling {src} with {compiler} failed ({r.status}, exit {r.returncode}): "
                           f"{r.stderr[-2000:]}")
    os.replace(tmp, lib)
    return lib


def native_deadlock(gil: str = "held") -> None:
    """Lock a default (non-recursive) pthread mutex twice in libc: a true native deadlock.

    PyDLL keeps the GIL held during the call (every other Python thread freezes too); CDLL releases it.
    """
    if gil not in _GIL_CHOICES:
        raise ValueError(f"gil={gil!r}; choose one of {', '.join(_GIL_CHOICES)}")
    libc = ctypes.PyDLL(None) if gil == "held" else ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)  # zeroed == PTHREAD_MUTEX_INITIALIZER on glibc and musl
    lock = libc.pthread_mutex_lock
    lock.argtypes = [ctypes.c_void_p]
    lock(mutex)
    lock(mutex)  # never returns


def native_segfault() -> None:
    """Write through a NULL pointer inside libc's memset: a real SIGSEGV in native code."""
    libc = ctypes.CDLL(None)
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    libc.memset(None, 0, 16)


def load_deadlocking_library() -> None:
    """Compile and dlopen the library whose constructor deadlocks (frames: dlopen, _dl_init, call_init)."""
    ctypes.CDLL(str(build_library("ctor_deadlock")))


# ------------------------------------------------------------------------------------ dispatch mode

def _announce(spec: FaultSpec, detail: str) -> None:
    print(f"{PLANTED_MARK} {spec} ({detail})", file=sys.stderr, flush=True)


def _fill_nan(out: Any) -> bool:
    import torch

    if isinstance(out, torch.Tensor):
        if out.is_floating_point() or out.is_complex():
            out.fill_(float("nan"))
            return True
        return False
    if isinstance(out, (tuple, list)):
        return any(_fill_nan(o) for o in out)
    return False


def _make_mode(spec: FaultSpec):
    from torch.utils._python_dispatch import TorchDispatchMode

    class FaultMode(TorchDispatchMode):
        """Counts calls of the chosen op and triggers the fault at the N-th one."""

        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if not spec.matches(str(func)):
                return func(*args, **kwargs)
            self.calls += 1
            if self.calls != spec.nth:
                return func(*args, **kwargs)
            _announce(spec, f"triggered in call {self.calls} of {func}")
            if spec.kind == "deadlock":
                native_deadlock(spec.option("gil"))
            elif spec.kind == "segfault":
                native_segfault()
            elif spec.kind == "error":
                raise RuntimeError(f"planted error in {func} (gpulab fault {spec})")
            elif spec.kind == "slow":
                import time
                time.sleep(float(spec.option("seconds")))
            elif spec.kind == "spin":
                import torch
                torch.cuda._sleep(int(spec.option("cycles")))  # the stream is blocked behind this kernel
            out = func(*args, **kwargs)
            if spec.kind == "nan" and not _fill_nan(out):
                print(f"{PLANTED_MARK} {spec}: {func} has no floating output; nothing written", file=sys.stderr)
            return out

    return FaultMode()


_ACTIVE: list[Any] = []  # keeps the entered mode alive for the life of the process


def plant(spec: str | FaultSpec | None) -> FaultSpec | None:
    """Arm a fault in this process (the child): libload fires now, the others at the N-th call of their op."""
    fs = parse(spec) if not isinstance(spec, FaultSpec) else spec
    if fs is None:
        return None
    if fs.kind == "libload":
        _announce(fs, "loading a library whose constructor deadlocks")
        load_deadlocking_library()
        return fs
    if fs.kind == "spin":
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError(f"fault {fs} needs CUDA (a spinning GPU kernel); torch.cuda.is_available() is False. "
                               f"On a CPU use deadlock:OP instead")
    mode = _make_mode(fs)
    mode.__enter__()
    _ACTIVE.append(mode)
    _announce(fs, f"armed: call {fs.nth} of {fs.op}")
    return fs


def child_env(env: Mapping[str, str], spec: FaultSpec) -> dict[str, str]:
    """`env` with the fault named for the recorded child: the spec in $GPULAB_FAULT, its planter first in
    $GPULAB_PRELOAD (below whatever the caller put there, the scenario's fixes)."""
    out = dict(env)
    rest = [x for x in out.get(preload.ENV, "").split(",") if x.strip() and x.strip() != PLANTER]
    out[preload.ENV] = ",".join([PLANTER, *rest])
    out[ENV] = str(spec)
    return out


def plant_from_env() -> FaultSpec | None:
    """The recorded child's planter (named in $GPULAB_PRELOAD): plants $GPULAB_FAULT and drops the variable,
    so the processes the program starts do not plant it again."""
    return plant(os.environ.pop(ENV, None))


def planted_from_stderr(text: str) -> list[str]:
    """The planted-fault lines a child printed, so a verdict can say a failure was planted."""
    return [ln.strip() for ln in text.splitlines() if ln.startswith(PLANTED_MARK)]


EXPECTED_STATUS = {"deadlock": "hang", "segfault": "crash", "error": "error", "spin": "hang", "libload": "hang",
                   "slow": "ok", "nan": "ok"}


def self_test(spec: FaultSpec | str | None, status: str, in_flight_op: str | None) -> tuple[bool, str]:
    """Did the watchdog find the fault that was planted? (passed, in words). Pure."""
    fs = parse(spec) if not isinstance(spec, FaultSpec) else spec
    if fs is None:
        raise ValueError("self_test needs a planted fault spec")
    want = EXPECTED_STATUS[fs.kind]
    if status != want:
        return False, f"the planted {fs} should end as {want}, but the run ended as {status}"
    if fs.op and want != "ok" and not (in_flight_op and fs.matches(in_flight_op)):
        return False, f"the planted {fs} was not localized: the in-flight op is {in_flight_op or 'unknown'}"
    where = f" in {in_flight_op}" if in_flight_op and want != "ok" else ""
    return True, f"the planted {fs} was found: {status}{where}"
