"""A GPU memory fault pinned to the kernel and the address: one bounded compute-sanitizer memcheck run.

"an illegal memory access was encountered" surfaces at the next sync, far from the kernel that made it;
NVIDIA's compute-sanitizer names the kernel, the faulting address, the block and thread, the access size and
the allocation it missed. The parser is pure (tested on real report text); `run` is the only part that starts
a process, through gpulab.proc with a deadline. The caching allocator hides an access past a tensor that
stays inside its cached block, so the run turns caching off (PYTORCH_NO_CUDA_MEMORY_CACHING=1, as PyTorch's
notes ask for with compute-sanitizer). On ROCm there is no equivalent here: the report says so.
"""
from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpulab import proc

TOOL = "compute-sanitizer"
PRINT_LIMIT = 5
TIMEOUT_S = 90.0                # a memcheck run is bounded: the verdict must not wait for a slow program
ERROR_EXIT = 99
# the classes a memcheck run can explain (a device-side assert already names its kernel, block and thread)
ANSWERS = ("illegal_address", "misaligned_address", "launch_failure")
ROCM_NOTE = ("compute-sanitizer is NVIDIA's; ROCm has no memcheck here (AddressSanitizer needs a rebuilt "
             "program): rerun with AMD_LOG_LEVEL=4 and read dmesg right after the fault, as ROCm's maintainers ask")

_PREFIX = re.compile(r"^\s*=+\s?")
_INVALID = re.compile(r"^Invalid (?:(?P<space>__\w+__) )?(?P<access>\w+) of size (?P<size>[\d,]+)(?: bytes?)?")
_AT = re.compile(r"^at (?P<what>.+?\+0x[0-9a-fA-F]+|0x[0-9a-fA-F]+)(?: in (?P<src>.+))?$")
_BY = re.compile(r"^by thread \((?P<thread>[\d, ]+)\) in block \((?P<block>[\d, ]+)\)")
_ADDR = re.compile(r"^(?:Address|Access at|Access to) (?P<address>0x[0-9a-fA-F]+) is (?P<problem>.+?)\.?$")
_NEAR = re.compile(r"^and is (?:(?P<distance>[\d,]+) bytes (?P<relation>after|before)|(?P<inside>inside)) the "
                   r"nearest allocation at (?P<alloc>0x[0-9a-fA-F]+) of size (?P<alloc_size>[\d,]+) bytes?")
_HOST = re.compile(r"^Host Frame:\s*(?P<func>.+?) in (?P<file>\S+\.py):(?P<line>\d+)$")
_HIT = re.compile(r'^Program hit (?P<error>\w+) \(error (?P<code>\d+)\) due to "(?P<message>[^"]+)" on CUDA API call '
                  r"to (?P<api>\w+)")
_SUMMARY = re.compile(r"^ERROR SUMMARY: (?P<n>[\d,]+) errors?")
_SRC_LINE_FUNC = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<func>.+)$")
_SRC_LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+)$")


@dataclass(frozen=True)
class Access:
    """One invalid access as memcheck reported it."""
    access: str                     # read | write | atomic...
    space: str | None               # __global__ | __shared__ | __local__ | None
    size: int                       # bytes
    kernel: str | None = None
    offset: str | None = None       # the instruction's offset in the kernel (0x...)
    file: str | None = None         # the kernel's source, when it was compiled with line info (Triton always)
    line: int | None = None
    block: str | None = None
    thread: str | None = None
    address: str | None = None
    problem: str | None = None      # out of bounds | misaligned | ...
    relation: str | None = None     # after | before | inside (the nearest allocation)
    distance: int | None = None     # bytes from that allocation
    allocation: str | None = None   # its address
    allocation_size: int | None = None
    host: tuple[str, ...] = ()      # the Python frames of the launch, innermost first ("func in file:line")

    def sentence(self) -> str:
        """As a person reads it: kernel, place, who, what, how far from which allocation."""
        where = f" ({short(self.file)}:{self.line})" if self.file else ""
        txt = (f"kernel {self.kernel or '?'}{where}: {self.access} of {self.size} bytes at {self.address or '?'}"
               f" by thread ({self.thread or '?'}) in block ({self.block or '?'})")
        if self.problem:
            txt += f", {self.problem}"
        if self.relation == "inside":
            txt += f", inside the allocation at {self.allocation} of {self.allocation_size} bytes"
        elif self.relation:
            txt += (f", {self.distance} bytes {self.relation} the nearest allocation at {self.allocation} of "
                    f"{self.allocation_size} bytes")
        if self.host:
            txt += f"; launched from {self.host[0]}"
        return txt


@dataclass(frozen=True)
class Report:
    available: bool                  # the tool exists where the program runs
    ran: bool = False
    errors: tuple[Access, ...] = ()
    api_errors: tuple[dict, ...] = ()   # "Program hit cudaErrorIllegalAddress ... on CUDA API call to X"
    error_count: int | None = None   # ERROR SUMMARY
    note: str = ""                   # why it did not run, or what fell short
    seconds: float = 0.0
    command: tuple[str, ...] = ()
    text_file: str | None = None     # the full report beside the verdict

    def to_dict(self) -> dict:
        d = asdict(self)
        d["errors"] = [dict(asdict(e), sentence=e.sentence()) for e in self.errors]
        return d

    def facts(self) -> list[str]:
        """The verdict's evidence lines."""
        if not self.ran:
            return [f"memcheck: {self.note}"] if self.note else []
        if not self.errors:
            return [f"memcheck ran ({self.seconds:.0f} s) and found no invalid access"
                    + (f"; the program hit {self.api_errors[0]['error']} at {self.api_errors[0]['api']}"
                       if self.api_errors else "") + (f" ({self.note})" if self.note else "")]
        return [f"memcheck: {e.sentence()}" for e in self.errors[:3]]


def short(path: str | None) -> str:
    parts = str(path or "").split(os.sep)
    return os.sep.join(parts[-2:]) if len(parts) > 2 else str(path or "")


def _int(text: str | None) -> int | None:
    return int(text.replace(",", "")) if text else None


# ------------------------------------------------------------------------------------ parsing (pure)

def parse(text: str) -> Report:
    """compute-sanitizer's (and cuda-memcheck's) memcheck text -> a Report (available and ran)."""
    errors: list[dict] = []
    hits: list[dict] = []
    count = None
    for raw in (text or "").splitlines():
        line = _PREFIX.sub("", raw).strip()
        if not line:
            continue
        m = _INVALID.match(line)
        if m:
            errors.append({"access": m.group("access"), "space": m.group("space"), "size": _int(m.group("size")),
                           "host": []})
            continue
        m = _HIT.match(line)
        if m:
            hits.append(m.groupdict())
            continue
        m = _SUMMARY.match(line)
        if m:
            count = _int(m.group("n"))
            continue
        if not errors:
            continue
        cur = errors[-1]
        if (m := _AT.match(line)) and "kernel" not in cur:
            _at(cur, m.group("what"), m.group("src"))
        elif (m := _BY.match(line)) and "block" not in cur:
            cur["thread"], cur["block"] = m.group("thread").replace(" ", ""), m.group("block").replace(" ", "")
        elif (m := _ADDR.match(line)) and "address" not in cur:
            cur["address"], cur["problem"] = m.group("address"), m.group("problem")
        elif (m := _NEAR.match(line)) and "allocation" not in cur:
            cur["relation"] = "inside" if m.group("inside") else m.group("relation")
            cur["distance"] = _int(m.group("distance"))
            cur["allocation"], cur["allocation_size"] = m.group("alloc"), _int(m.group("alloc_size"))
        elif (m := _HOST.match(line)) and len(cur["host"]) < 12:
            cur["host"].append(f"{m.group('func')} in {m.group('file')}:{m.group('line')}")
    accesses = tuple(Access(**{**e, "host": tuple(e["host"])}) for e in errors)
    return Report(True, True, accesses, tuple(hits), count)


def _at(cur: dict, what: str, src: str | None) -> None:
    """'KERNEL+0xOFF [in FILE:LINE]' (compute-sanitizer) or '0xOFF in FILE:LINE:KERNEL' / '0xOFF in KERNEL'
    (older reports)."""
    if what.startswith("0x"):
        cur["offset"] = what
        m = _SRC_LINE_FUNC.match(src or "") or _SRC_LINE.match(src or "")
        if m:
            cur["file"], cur["line"] = m.group("file"), int(m.group("line"))
            cur["kernel"] = m.groupdict().get("func")
        else:
            cur["kernel"] = src
    else:
        kernel, _, off = what.rpartition("+")
        cur["kernel"], cur["offset"] = kernel, off
        m = _SRC_LINE.match(src or "")
        if m:
            cur["file"], cur["line"] = m.group("file"), int(m.group("line"))
    if cur.get("kernel"):
        cur["kernel"] = cur["kernel"].strip()


def kernel_name(signature: str | None) -> str:
    """'void ns::oob_kernel<float>(float *, int)' -> 'oob_kernel': the name a source defines."""
    s = re.sub(r"\(.*$", "", str(signature or "")).strip()
    s = re.sub(r"<.*>$", "", s).split()[-1] if s else ""
    return s.split("::")[-1]


# ------------------------------------------------------------------------------------ running

def tool() -> str | None:
    """compute-sanitizer on PATH, else where CUDA installs it."""
    found = shutil.which(TOOL)
    if found:
        return found
    for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        cand = Path(base or "") / "bin" / TOOL
        if base and cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return None


def applies(cls: str | None, status: str | None) -> bool:
    return status in ("crash", "error") and cls in ANSWERS


def run(command: Sequence[str], out_dir: str | os.PathLike, *, timeout_s: float = TIMEOUT_S,
        env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None, rocm: bool = False) -> Report:
    """One memcheck run of COMMAND (the program as it runs, or its repro), bounded by timeout_s; the report
    text goes to out_dir/memcheck.txt. Never raises for a missing tool: the Report says why it did not run."""
    if rocm:
        return Report(False, note=ROCM_NOTE)
    exe = tool()
    if exe is None:
        return Report(False, note=f"{TOOL} is not installed (looked on PATH and in $CUDA_HOME/bin, /usr/local/cuda/bin)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "memcheck.txt"
    argv = [exe, "--tool", "memcheck", "--print-limit", str(PRINT_LIMIT), "--error-exitcode", str(ERROR_EXIT),
            "--log-file", str(log), *command]
    child_env = dict(os.environ if env is None else env)
    child_env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"   # an access past a tensor must leave its allocation
    t0 = time.monotonic()
    try:
        r = proc.run(argv, timeout_s=timeout_s, env=child_env, cwd=cwd, capture=True, label="memcheck")
    except OSError as exc:
        return Report(True, note=f"{TOOL} could not start: {exc}", command=tuple(argv))
    seconds = time.monotonic() - t0
    text = log.read_text(errors="replace") if log.exists() else (r.stdout or "")
    rep = parse(text)
    note = ""
    if r.timed_out:
        note = f"stopped at its {timeout_s:g} s deadline (what it reported before is kept)"
    elif not rep.errors and r.returncode not in (0, ERROR_EXIT):
        note = f"the program exited {r.returncode} under memcheck without an invalid access reported"
    return Report(True, True, rep.errors, rep.api_errors, rep.error_count, note, round(seconds, 2), tuple(argv),
                  log.name if log.exists() else None)


def from_dict(d: Mapping[str, Any] | None) -> Report | None:
    if not d:
        return None
    errs = tuple(Access(**{k: v for k, v in e.items() if k in Access.__dataclass_fields__ and k != "host"},
                        host=tuple(e.get("host") or ())) for e in d.get("errors") or ())
    kw = {k: v for k, v in d.items() if k in Report.__dataclass_fields__ and k not in ("errors",)}
    kw["api_errors"] = tuple(kw.get("api_errors") or ())
    kw["command"] = tuple(kw.get("command") or ())
    return Report(**{**kw, "errors": errs})
