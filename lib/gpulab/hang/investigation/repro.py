"""Op replay: from the recorded op log, the smallest standalone repro.py that still fails.

Maintainers close reports without a repro. The op log holds every op's name, shapes, dtypes and strides
(non-contiguous layouts are rebuilt with as_strided), device and scalar arguments; input values are not
recorded, so inputs are random (standard normal floats, small integers, random booleans). First the
in-flight op alone is tried; when that does not fail, the shortest suffix of the op sequence that does
(doubling, then halving the gap between the longest passing and shortest failing suffix). Ops of user extensions are replayed by importing the module that defines them (run with a
`__name__` other than `__main__`, so its main block does not run). Every candidate is verified in a fresh
child under the watchdog; only a candidate that fails the same way (status, and the same in-flight op for
a hang or crash) is kept, and the report says when none does.
"""
from __future__ import annotations

import ast
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from gpulab import report
from gpulab.hang.watchdog import watch
from gpulab.hang.verdict import Verdict
from gpulab.trace import liveness

BUILTIN_NAMESPACES = frozenset({"aten", "prims", "_prims", "debugprims", "rngprims", "quantized", "_quantized",
                                "mkldnn", "mkl", "_c10d_functional", "c10d", "_c10d_functional_autograd",
                                "profiler", "higher_order", "inductor", "_inductor_test", "fbgemm"})
MAX_SUFFIX = 256


@dataclass(frozen=True)
class Candidate:
    ops: int                      # how many recorded ops it replays
    path: str                     # relative to the repro folder
    status: str                   # the verdict of running it: ok | hang | crash | error | timeout
    in_flight_op: str | None
    reproduces: bool
    seconds: float
    complete: bool                # every argument could be rebuilt from the log
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReproResult:
    verified: str | None          # path of the kept repro.py, or None when no candidate reproduces
    candidates: tuple[Candidate, ...]
    target: dict                  # what a candidate must reproduce: status and in-flight op
    explanation: str

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------------ from log to code (pure)

def _get(rec: Any, key: str, default: Any = None) -> Any:
    return rec.get(key, default) if isinstance(rec, Mapping) else getattr(rec, key, default)


def literal(text: str) -> tuple[str, bool]:
    """A recorded scalar's text -> Python source for it, and whether it is exact (reprs are cut at 32
    characters; an unparsable one becomes None, flagged)."""
    t = text.strip()
    if t.startswith("torch.") and t.replace(".", "").replace("_", "").isalnum():
        return t, True  # torch.float32, torch.contiguous_format, ...
    if t.startswith("device(type="):
        return f"torch.{t}", True
    if t in ("inf", "-inf", "nan"):
        return f"float({t!r})", True
    try:
        ast.literal_eval(t)
        return t, True
    except (ValueError, SyntaxError):
        return "None", False


def _tensor_src(a: Mapping[str, Any]) -> str:
    return f"t({list(a['shape'])}, {list(a['stride'])}, {a['dtype']!r}, {a.get('device') or 'cpu'!r})"


def args_src(args: Sequence[Mapping[str, Any]]) -> tuple[list[str], bool]:
    """Recorded positional arguments -> source expressions; complete is False when something was cut."""
    out, complete, i = [], True, 0
    while i < len(args):
        a = args[i]
        if "shape" in a:
            out.append(_tensor_src(a))
        elif "truncated" in a:
            complete = False
            out.append("None")
        else:
            text = str(a.get("value", ""))
            if text.startswith("L") and text[1:].isdigit():  # a list of tensors: L<n> then up to 4 tensors
                n = int(text[1:])
                items = [x for x in args[i + 1:i + 1 + min(n, 4)] if "shape" in x]
                if len(items) < n:
                    complete = False
                out.append("[" + ", ".join(_tensor_src(x) for x in items) + "]")
                i += 1 + len(items)
                continue
            src, exact = literal(text)
            complete &= exact
            out.append(src)
        i += 1
    return out, complete


def namespace(op_name: str) -> str:
    return op_name.replace("::", ".").split(".", 1)[0]


PRELUDE = '''import runpy, sys
import torch


def t(shape, stride, dtype, device):
    """A tensor with the recorded shape, strides (layout kept), dtype and device; random values."""
    dt = getattr(torch, dtype)
    if any(n == 0 for n in shape):
        return torch.empty_strided(shape, stride, dtype=dt, device=device)
    need = 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    if dt.is_floating_point or dt.is_complex:
        base = torch.randn(need)
    elif dt == torch.bool:
        base = torch.rand(need) > 0.5
    else:
        base = torch.randint(0, 4, (need,))
    return base.to(device=device, dtype=dt).as_strided(shape, stride)


'''


def script(records: Sequence[Any], *, title: str, imports: Sequence[str] = ()) -> tuple[str, bool]:
    """Source of a standalone replay of `records` (in order); complete is False when an argument was lost."""
    lines = [f'"""{title}\n\nGenerated by gpulab from a recorded op log. Inputs are random with the recorded '
             'shapes, strides, dtypes and devices.\n"""', PRELUDE.rstrip(), ""]
    for path in imports:
        lines.append(f"sys.argv = [{path!r}]  # its main block does not run: only the ops it defines are needed")
        lines.append(f"runpy.run_path({path!r}, run_name='__gpulab_replay__')")
    complete = True
    lines.append("")
    for rec in records:
        args, ok = args_src(_get(rec, "args") or ())
        complete &= ok
        name = str(_get(rec, "name"))
        lines.append(f"# op {_get(rec, 'seq')} at {_get(rec, 'call_site') or '?'}")
        lines.append(f"out = torch.ops.{name}({', '.join(args)})")
    lines += ["if torch.cuda.is_available() and torch.cuda.is_initialized():",
              "    torch.cuda.synchronize()  # the replayed GPU work must finish for the replay to pass",
              f"print('replayed {len(records)} op(s)')"]
    return "\n".join(lines) + "\n", complete


def sources_for(records: Sequence[Any], command: Sequence[str], cwd: Path) -> tuple[list[str], list[str]]:
    """Files to import for ops outside PyTorch's namespaces: the recorded call sites (shortened to two path
    components) matched against the program's script and folder. -> (paths, notes)."""
    notes, paths = [], []
    foreign = sorted({namespace(str(_get(r, "name"))) for r in records} - BUILTIN_NAMESPACES)
    if not foreign:
        return [], []
    script_path = next((Path(c) for c in command if c.endswith(".py")), None)
    roots = [cwd] + ([(cwd / script_path).resolve().parent] if script_path else [])
    for r in records:
        if namespace(str(_get(r, "name"))) not in foreign:
            continue
        short = str(_get(r, "call_site") or "").split(":", 1)[0]
        found = None
        if script_path and short and (cwd / script_path).resolve().as_posix().endswith(short):
            found = (cwd / script_path).resolve()
        for root in roots if found is None else ():
            for base in (root, root.parent):
                if short and (base / short).is_file():
                    found = (base / short).resolve()
                    break
            if found:
                break
        if found and str(found) not in paths:
            paths.append(str(found))
    if not paths:
        notes.append(f"ops of {', '.join(foreign)} need the module that defines them; none was found from the "
                     f"call sites")
    return paths, notes


# ------------------------------------------------------------------------------------ verification

_OP_NAME = re.compile(r"^[A-Za-z_]\w*\.[A-Za-z_]\w*\.[A-Za-z_]\w*$")   # ns.op.overload, as torch prints an op


def replayable(records: Sequence[Any]) -> list[tuple[Any, Any]]:
    """(record to replay, the record it stands for) per replayed call, in order: the outermost ops (replaying an
    op runs what it ran inside it); inside a record that is no op (a compiled region, a torch.distributed call,
    a record_function scope) the ops it ran. A record nested in a replayed op stands for that op."""
    out: list[tuple[Any, Any]] = []
    stacks: dict = {}   # thread -> [(depth, record, replayed record or None)]
    for r in sorted(records, key=lambda r: _get(r, "seq")):
        depth = _get(r, "depth") or 0
        stack = stacks.setdefault(_get(r, "thread"), [])
        while stack and stack[-1][0] >= depth:
            stack.pop()
        inside = next((rep for _, _, rep in reversed(stack) if rep is not None), None)
        if inside is not None:
            stack.append((depth, r, inside))
            out.append((inside, r))
            continue
        rep = r if _OP_NAME.match(str(_get(r, "name") or "")) else None
        stack.append((depth, r, rep))
        if rep is not None:
            out.append((r, r))
    return out


def replay_ops(records: Sequence[Any], seq: int | None = None) -> tuple[list[Any], int | None]:
    """The records to replay, and the seq of the one that stands for record `seq`."""
    pairs = replayable(records)
    stands = next((_get(rep, "seq") for rep, r in pairs if _get(r, "seq") == seq), None)
    seen, ops = set(), []
    for rep, _ in pairs:
        if _get(rep, "seq") not in seen:
            seen.add(_get(rep, "seq"))
            ops.append(rep)
    return ops, stands


def make(v: Verdict, records: Sequence[Any], out_dir: str | Path, *, stall_s: float = liveness.STALL_S,
         timeout_s: float = 120.0, cwd: str | Path | None = None, max_candidates: int = 8,
         progress: Callable[[str], None] | None = None) -> ReproResult:
    """Write and verify candidate repros for a failed run; the verified one becomes out_dir/repro.py."""
    say = progress or (lambda m: print(f"[gpulab repro] {m}", file=sys.stderr, flush=True))
    out = Path(out_dir)
    (out / "candidates").mkdir(parents=True, exist_ok=True)
    target_op = (v.in_flight_op or {}).get("name")
    target = {"status": v.status, "in_flight_op": target_op}
    if v.status == "ok" or not v.in_flight_op:
        why = ("the run did not fail" if v.status == "ok" else
               f"no recorded op was in flight (phase {v.phase}): the failure is outside PyTorch ops (library "
               f"loading, Python code), so the program itself is the repro (bisection's repro.sh, when it ran, "
               f"is its smallest failing form)")
        return _save(out, ReproResult(None, (), target, why))
    if v.in_flight_op.get("seq") is None:
        # a job's finding: the op one process had open, named across the job's processes (seen on the user path:
        # a rank alone in an all_reduce); one process's replay cannot call a collective with the others
        who = v.in_flight_op.get("process") or "one process"
        return _save(out, ReproResult(None, (), target, f"the op in flight is {who}'s in a job of several "
                                                         f"processes: replaying one process's ops cannot reproduce "
                                                         f"what the others take part in, so the job is the repro"))
    ordered, seq = replay_ops(records, v.in_flight_op.get("seq"))
    seq = v.in_flight_op.get("seq") if seq is None else seq
    upto = [r for r in ordered if _get(r, "seq") <= seq][-MAX_SUFFIX:]
    if not upto or _get(upto[-1], "seq") != seq:
        return _save(out, ReproResult(None, (), target, f"op {seq} ({target_op}) is not in the op log any more "
                                                         f"(the ring wrapped)"))
    base = Path(cwd) if cwd else Path.cwd()
    cands: list[Candidate] = []

    def attempt(n: int) -> bool:
        recs = upto[-n:]
        imports, notes = sources_for(recs, v.command, base)
        src, complete = script(recs, title=f"Replay of the last {n} op(s) before {target_op} {v.status}", imports=imports)
        path = out / "candidates" / f"repro_{n:03d}.py"
        report.write_text(path, src)
        t0 = time.monotonic()
        got = watch.run([sys.executable, str(path)], stall_s=stall_s, timeout_s=timeout_s, out_dir=path.with_suffix(""),
                        cwd=base, progress=lambda m: None, stacks=False, mode=v.mode or "ops")
        op = (got.in_flight_op or {}).get("name")
        same = got.status == v.status and (v.status not in ("hang", "crash") or op == target_op)
        cands.append(Candidate(n, str(path.relative_to(out)), got.status, op, same,
                               round(time.monotonic() - t0, 2), complete, tuple(notes)))
        say(f"{n} op(s): {got.status}" + (f" in {op}" if op else "") + (" - reproduces" if same else ""))
        return same

    # The longest replay first: when even it does not fail like the program, no shorter one will (one child,
    # not log2(n)); when it does, grow from the in-flight op alone, then bisect between the two.
    shortest = len(upto) if attempt(len(upto)) else None
    last_pass = 0
    n = 1
    while shortest is not None and n < shortest and len(cands) < max_candidates:
        if attempt(n):
            shortest = n
            break
        last_pass, n = n, n * 2
    while shortest is not None and shortest - last_pass > 1 and len(cands) < max_candidates:
        mid = (shortest + last_pass) // 2
        if attempt(mid):
            shortest = mid
        else:
            last_pass = mid
    if shortest is None:
        why = (f"none of {len(cands)} candidate(s) (up to the last {cands[-1].ops if cands else 0} ops) "
               f"{v.status}s like the program: the failure needs more than the recorded ops (values, state "
               f"outside PyTorch, timing, or other processes); attach the op log and stacks instead")
        return _save(out, ReproResult(None, tuple(cands), target, why))
    kept = out / "repro.py"
    report.write_text(kept, (out / "candidates" / f"repro_{shortest:03d}.py").read_text())
    why = (f"replaying {'the in-flight op alone' if shortest == 1 else f'the last {shortest} ops'} "
           f"{v.status}s like the program (verified in a fresh child under the watchdog)")
    return _save(out, ReproResult(str(kept.relative_to(out)), tuple(cands), target, why))


def _save(out: Path, res: ReproResult) -> ReproResult:
    report.write_json(out / "repro.json", res.to_dict())
    return res
