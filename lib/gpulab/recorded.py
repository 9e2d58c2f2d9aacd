"""What a user's program was seen to call: its scaled_dot_product_attention calls in notebook 02's op log,
and so whether 05 (is each attention kernel right?) and 06 (which one is fastest?) apply to it.

Why the op log: a user program's attention calls are known only by running it, and 02 runs it once under
the recorder. The recorder writes a composite record `aten.scaled_dot_product_attention.default` with
(q, k, v, attn_mask) around every SDPA call, and the kernel that ran nested inside it (same thread, deeper).
is_causal is not in that record: it is read from the fused kernel's own positional arguments, or, on the
math backend, from the causal mask math builds (`aten.tril`). A fused kernel seen with no composite record
around it (called directly) counts as a call too. Pure apart from reading out_dir's files; no torch.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from gpulab import report
from gpulab.trace.liveness import STATUSES   # 02's `status` of the recorded run
from gpulab.workloads import DTYPE_NAMES, AttentionCall, WorkloadConfig

OPS_LOG = "ops.log"                     # notebook 02's op log in out_dir
RECORDER = "02_instrument"              # whose metrics.json entry holds the recorded run's exit code
SDPA = "aten.scaled_dot_product_attention.default"
MATH = "aten._scaled_dot_product_attention_math.default"
TRIL = "aten.tril.default"              # math builds the causal mask with it
CHOICE = "aten._fused_sdp_choice.default"  # the recorder asks it which backend runs, before going deeper
# fused kernel -> (backend, position of is_causal, position of the mask or None when it is keyword-only or
# not accepted): positions in the aten schemas (tests check them against torch's own)
KERNELS = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default": ("flash", 4, None),
    "aten._scaled_dot_product_flash_attention.default": ("flash", 4, None),
    "aten._scaled_dot_product_efficient_attention.default": ("efficient", 6, 3),
    "aten._scaled_dot_product_cudnn_attention.default": ("cudnn", 6, 3),
    "aten._scaled_dot_product_fused_attention_overrideable.default": ("overrideable", 5, 3),
}
# flash on CUDA takes no mask at all; flash on the CPU takes it as a keyword the record does not show
_NO_MASK = {"aten._scaled_dot_product_flash_attention.default"}
SEEN = ("builtin", "calls", "none", "unknown")


@dataclass(frozen=True)
class RecordedCall:
    """One distinct SDPA call of the program as recorded (shapes, dtype, mask, causality) and how often."""
    batch: int
    heads: int
    kv_heads: int
    seq_len: int                 # queries
    kv_len: int                  # keys
    head_dim: int
    v_head_dim: int
    dtype: str                   # as recorded: float32, bfloat16, float16, float64 ...
    mask: str                    # none | bool | additive | unknown
    mask_shape: tuple[int, ...] = ()
    causal: bool = False
    count: int = 0
    kernels: tuple[str, ...] = ()   # backends seen running it: flash, efficient, cudnn, math
    ndim: int = 4                # q's dimensions (SDPA takes 3-D or more; 06 times 4-D)
    device: str = ""

    @property
    def untimed(self) -> str:
        """Why 06 cannot time this call on its own inputs ("" when it can)."""
        if self.ndim != 4:
            return f"q has {self.ndim} dimensions (06 times batch, heads, length, head-dim calls)"
        if self.kv_heads != self.heads:
            return f"grouped-query attention ({self.kv_heads} k/v heads for {self.heads} query heads)"
        if self.v_head_dim != self.head_dim:
            return f"v's head size {self.v_head_dim} differs from q's {self.head_dim}"
        if self.dtype not in DTYPE_NAMES:
            return f"dtype {self.dtype} (06 times {', '.join(DTYPE_NAMES)})"
        if self.mask == "unknown":
            return "its mask is not in the record (a fused kernel called directly)"
        return ""

    def attention(self) -> AttentionCall:
        """The call as 06 times it (raises when `untimed` says why it cannot)."""
        if self.untimed:
            raise ValueError(f"cannot time {self.describe()}: {self.untimed}")
        return AttentionCall(self.batch, self.heads, self.seq_len, self.head_dim, self.dtype, self.mask, 0, None,
                             self.causal, None if self.kv_len == self.seq_len else self.kv_len,
                             self.mask_shape or None)

    def describe(self) -> str:
        heads = f"{self.heads}" + (f"/{self.kv_heads} kv" if self.kv_heads != self.heads else "")
        sk = f" Sk={self.kv_len}" if self.kv_len != self.seq_len else ""
        mask = {"none": "no mask", "unknown": "mask unknown"}.get(
            self.mask, f"{self.mask} mask {'x'.join(map(str, self.mask_shape))}")
        return (f"B={self.batch} H={heads} S={self.seq_len}{sk} D={self.head_dim} {self.dtype}, {mask}"
                + (", causal" if self.causal else ""))

    def row(self) -> dict[str, Any]:
        """A table row for a reader."""
        return {"call": self.describe(), "calls": self.count, "ran on": ", ".join(self.kernels) or "-",
                "timed by 06": "yes" if not self.untimed else f"no: {self.untimed}"}


# ------------------------------------------------------------------------------------ the op log, pure

def _shape(arg: Mapping[str, Any]) -> list[int] | None:
    return arg.get("shape") if isinstance(arg, Mapping) and "shape" in arg else None


def _flag(args: Sequence[Mapping[str, Any]], pos: int | None) -> bool:
    return pos is not None and len(args) > pos and str(args[pos].get("value")) == "True"


def _mask(args: Sequence[Mapping[str, Any]], pos: int | None) -> tuple[str, tuple[int, ...]]:
    if pos is None or len(args) <= pos or _shape(args[pos]) is None:
        return "none", ()
    return ("bool" if args[pos].get("dtype") == "bool" else "additive"), tuple(args[pos]["shape"])


def _inner(records: Sequence[Any], i: int) -> list[Any]:
    """The records nested in records[i]: later ones on its thread, deeper, up to the next that is not (the
    recorder's own backend query, at the composite's depth, comes first)."""
    outer, out = records[i], []
    for r in records[i + 1:]:
        if r.thread != outer.thread:
            continue
        if r.depth <= outer.depth:
            if r.name == CHOICE and not out:
                continue
            break
        out.append(r)
    return out


def _call(q, k, v, mask: tuple[str, tuple[int, ...]], causal: bool, kernel: str) -> RecordedCall | None:
    shapes = [_shape(a) for a in (q, k, v)]
    if any(s is None or len(s) < 3 for s in shapes):
        return None   # not tensors: a torn or truncated record
    sq, sk, sv = shapes
    lead = sq[:-2]
    batch = 1
    for n in (lead[:-1] if len(sq) >= 4 else lead):
        batch *= n
    heads = sq[-3] if len(sq) >= 4 else 1
    kv_heads = sk[-3] if len(sk) >= 4 else 1
    return RecordedCall(batch, heads, kv_heads, sq[-2], sk[-2], sq[-1], sv[-1], str(q.get("dtype")), mask[0],
                        mask[1], causal, 0, (kernel,) if kernel else (), len(sq), str(q.get("device", "")))


def calls_in(records: Sequence[Any]) -> list[RecordedCall]:
    """Every SDPA call in the records, in order (count 0: `attention_calls` counts them)."""
    out: list[RecordedCall] = []
    nested: set[int] = set()
    for i, r in enumerate(records):
        if r.name == SDPA:
            inner = _inner(records, i)
            nested.update(x.seq for x in inner)
            kernel = next((x for x in inner if x.name in KERNELS), None)
            if kernel is not None:
                backend, pos, _ = KERNELS[kernel.name]
                causal = _flag(kernel.args, pos)
            else:   # math (the decomposition, or nothing recorded inside)
                backend = "math" if inner else ""
                causal = any(x.name == TRIL for x in inner)
            args = list(r.args) + [{}] * (4 - len(r.args))
            c = _call(args[0], args[1], args[2], _mask(args, 3), causal, backend)
        elif r.name in KERNELS and r.seq not in nested:
            backend, pos, mpos = KERNELS[r.name]
            args = list(r.args) + [{}] * max(0, 3 - len(r.args))
            mask = _mask(r.args, mpos) if mpos is not None or r.name in _NO_MASK else ("unknown", ())
            c = _call(args[0], args[1], args[2], mask, _flag(r.args, pos), backend)
        else:
            continue
        if c is not None:
            out.append(c)
    return out


def attention_calls(records: Iterable[Any]) -> tuple[RecordedCall, ...]:
    """The distinct SDPA calls in an op log's records (gpulab.trace.read(path).records), each with how often
    it was made and the kernels seen running it; the most frequent first (ties: the first made first)."""
    seen = calls_in(list(records))
    key = lambda c: (c.batch, c.heads, c.kv_heads, c.seq_len, c.kv_len, c.head_dim, c.v_head_dim,  # noqa: E731
                     c.dtype, c.mask, c.mask_shape, c.causal, c.ndim, c.device)
    counts = Counter(key(c) for c in seen)
    first: dict[tuple, RecordedCall] = {}
    kernels: dict[tuple, dict[str, None]] = {}
    for c in seen:
        first.setdefault(key(c), c)
        kernels.setdefault(key(c), {}).update(dict.fromkeys(c.kernels))
    order = sorted(first, key=lambda k: -counts[k])   # sorted() is stable: ties keep their first-made order
    return tuple(replace(first[k], count=counts[k], kernels=tuple(kernels[k])) for k in order)


# ---------------------------------------------------------------------------------- what 05 and 06 do

@dataclass(frozen=True)
class AttentionUse:
    """Whether a workload calls attention, as far as 02's recording can say: `seen` is builtin (the built-in
    workload: its call is known), calls (the recording saw SDPA calls), none (the program ran to the end
    without one) or unknown (the recording is missing, ended early, or lost its oldest ops)."""
    workload: str
    seen: str
    calls: tuple[RecordedCall, ...] = ()
    ops: int = 0
    note: str = ""     # one sentence: what the recording shows, or why it cannot tell
    failed: bool = False   # the recording ended because the program failed (hang, crash, error, deadline)

    @property
    def applies(self) -> bool:
        """False only when the program is known to make no attention call."""
        return self.seen != "none"

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The dtypes of the program's attention calls that gpulab checks (most frequent call first)."""
        return tuple(dict.fromkeys(c.dtype for c in self.calls if c.dtype in DTYPE_NAMES))

    def benchmark(self) -> tuple[RecordedCall | None, str]:
        """The call 06 times (the most frequent one it can time) and a sentence saying whose call it is, or
        (None, why nothing is timed)."""
        if self.seen in ("none", "unknown"):
            return None, self.note
        timed = [c for c in self.calls if not c.untimed]
        total = sum(c.count for c in self.calls)
        if not timed:
            top = self.calls[0]
            return None, (f"none of the program's {len(self.calls)} distinct attention calls can be timed here; "
                          f"the most frequent ({top.describe()}, {top.count} of {total} calls): {top.untimed}")
        pick = timed[0]
        text = (f"the program's most frequent attention call as notebook 02 recorded it ({pick.count} of {total} "
                f"SDPA calls" + (f", ran on {', '.join(pick.kernels)}" if pick.kernels else "") + ")")
        skipped = [c for c in self.calls if c.untimed and c.count >= pick.count]
        if skipped:
            text += (f"; the more frequent {skipped[0].describe()} ({skipped[0].count} calls) is not timed: "
                     f"{skipped[0].untimed}")
        return pick, text




def _ended(status: str | None, exit_code: Any, open_op: str | None) -> str:
    """Why the recording may not have seen the whole program ('' when the program ran to the end)."""
    if status is None:
        why = "notebook 02's exit status for it is not in metrics.json"
    elif status == "ok":
        why = ""
    elif status == "hang":
        why = "the program made no progress and 02 stopped it as hung"
    elif status == "timeout":
        why = "the program was stopped at 02's deadline"
    elif isinstance(exit_code, int) and exit_code < 0:
        why = f"the program was killed by signal {-exit_code}"
    else:
        why = f"the program exited {exit_code}" if exit_code is not None else f"the program ended with {status}"
    if open_op:
        why = f"{why}, inside {open_op}" if why else f"it stopped inside {open_op}"
    return why


def judge(workload: str, calls: Sequence[RecordedCall], ops: int, *, dropped: int = 0, open_op: str | None = None,
          status: str | None = "ok", exit_code: Any = 0) -> AttentionUse:
    """Pure: the recording's facts -> AttentionUse. `ops` recorded in all (the oldest `dropped` of them
    overwritten in the ring), `open_op` the op still running when it ended, `status` and `exit_code` how the
    program ended as 02 saw it (status None: unknown)."""
    ended = _ended(status, exit_code, open_op)
    total = sum(c.count for c in calls)
    if calls:
        note = (f"02's recording saw {total} scaled_dot_product_attention call{'s' if total != 1 else ''} "
                f"({len(calls)} distinct) in {ops} ops")
        if ended or dropped:
            note += (f"; it did not see the whole program ({ended or f'the oldest {dropped} ops were overwritten'}), "
                     f"so the counts are of the calls it saw")
        return AttentionUse(workload, "calls", tuple(calls), ops, note)
    if ended:
        return AttentionUse(workload, "unknown", (), ops,
                            f"unknown whether the program calls attention: the recording ended after {ops} ops "
                            f"({ended}), none of them an attention call", failed=status not in (None, "ok"))
    if dropped:
        return AttentionUse(workload, "unknown", (), ops,
                            f"unknown whether the program calls attention: 02's recording kept only the last "
                            f"{ops - dropped} of {ops} ops (its ring wrapped), none of them an attention call")
    return AttentionUse(workload, "none", (), ops,
                        f"the program ran to the end without calling scaled_dot_product_attention (02 recorded "
                        f"{ops} ops, none of them an attention call)")


def _status(entry: Mapping[str, Any], ops: int) -> str | None:
    """How the recorded run ended, from 02's metrics.json entry, when that entry is about this log (it
    counted the same ops); older entries give only the exit code (None there: stopped)."""
    if "exit_code" not in entry or entry.get("ops_recorded") != ops:
        return None
    if entry.get("status") in STATUSES:
        return entry["status"]
    code = entry["exit_code"]
    return "timeout" if code is None else "ok" if code == 0 else "crash" if code < 0 else "error"


def attention_use(workload: str | WorkloadConfig, out_dir: str | os.PathLike | None) -> AttentionUse:
    """What 02's op log in out_dir (and its exit status in metrics.json) says about the workload's attention;
    the built-in workload's call is known without it."""
    cfg = workload if isinstance(workload, WorkloadConfig) else WorkloadConfig(workload=workload)
    if cfg.kind == "builtin":
        return AttentionUse(cfg.workload, "builtin")
    log = Path(out_dir) / OPS_LOG if out_dir is not None else None
    if log is None or not log.is_file():
        return AttentionUse(cfg.workload, "unknown", note="unknown whether the program calls attention: notebook 02 "
                            f"left no op log ({OPS_LOG}) in this out_dir (run 02 first)")
    from gpulab.trace.ring import read   # no torch: the ring is plain bytes

    snap = read(log)
    entry = report.metrics_of(out_dir, RECORDER)
    opened = [r for r in snap.records if r.in_flight]
    open_op = opened[-1].name if opened else (f"op {snap.completed}" if snap.completed < snap.started else None)
    status = _status(entry, snap.started)
    records, ops, dropped = list(snap.records), snap.started, snap.dropped
    for other in _followed(log):   # a job: its ranks and workers call attention, not the launcher
        records += other.records
        ops, dropped = ops + other.started, dropped + other.dropped
    return judge(cfg.workload, attention_calls(records), ops, dropped=dropped, open_op=open_op, status=status,
                 exit_code=entry.get("exit_code"))


def _followed(log: Path) -> list[Any]:
    """The op logs of the other Python processes the recorded program started (its job folder
    `<log stem>.procs/`, gpulab.trace.run.record's), read; torn or unreadable ones left out."""
    from gpulab.trace import follow
    from gpulab.trace.ring import read

    out = []
    for path in follow.child_logs(log.with_suffix(".procs")):
        try:
            out.append(read(path))
        except (OSError, ValueError):
            continue
    return out
