"""The first NaN/+Inf of a stats-mode recording, with its line, pass and cause: the small JSON the recorder
writes beside its op log (gpulab.trace.opstats.first_nan_watch) at the one op that made it, and the words
02, the chain's verdict and the index say about it. Pure apart from reading and writing that file; whose code
the line is (the program's, a library's) is judged here from the file name the recorder kept.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

# what to change at the line, by cause (nancause.KINDS); the program's line is where it is fixed
REMEDY = {
    "zero_divisor": "keep the divisor away from 0 with an eps or clamp(min=eps), or skip the rows where it is 0",
    "variance_dof": "a variance of one element is 0/0 with the default correction: skip groups of fewer than 2 "
                    "elements, or pass correction=0 (unbiased=False)",
    "unit_domain": "clamp the argument to [-1, 1]: rounding (a cosine of equal vectors) pushes it just past",
    "log_domain": "clamp the log's argument above 0 with clamp_min(eps), or find why it reaches <= 0 (the log of "
                  "a softmax: log_softmax, or cross_entropy on the logits)",
    "sqrt_domain": "clamp at 0 before the sqrt, or find why its argument goes negative",
    "pow_domain": "a negative base to a fractional power is NaN: clamp the base at 0 or use abs()",
    "overflow": "compute it in a wider dtype, or subtract the max before exp as logsumexp and softmax do",
    "matmul_overflow": "run that matmul in float32 or bfloat16, whose range float16 lacks, or scale its inputs down",
    "cast_overflow": "scale the values into the target dtype's range before the cast, or cast to bfloat16",
    "softmax_masked_row": "leave every row at least one unmasked position, or mask with torch.finfo(dtype).min "
                          "instead of -inf (a fully masked row then softmaxes to finite weights) and zero such rows "
                          "after it",
    "growth": "find where the values start to run away: over the training's steps (the loss of the first steps), "
              "lower the learning rate or clip gradients (torch.nn.utils.clip_grad_norm_); within one step (a "
              "recurrence, a deep stack), scale down or normalize the weights it multiplies by; `gpulab compare` "
              "against a run with a lower learning rate names the first op where the two part",
    "uninitialized": "if nothing should have written it yet, allocate with torch.zeros or torch.full instead of "
                     "torch.empty (an empty() tensor holds a freed tensor's old bytes); if a kernel of yours fills "
                     "it, run that kernel on a zero-filled buffer: NaN/Inf still there is the kernel's",
    "no_targets": "skip a batch with no target to learn (if (target != ignore_index).any()), or add the loss with "
                  "reduction='sum' and divide by the count of counted targets, at least 1",
    "input_neginf": "the -inf of a mask reached an op that turns it into NaN: mask with torch.finfo(dtype).min, "
                    "or mask after the op",
}
BACKWARD_REMEDY = {   # a NaN first made in backward: the forward line's function has no finite gradient there
    "sqrt": "sqrt has an infinite gradient at 0: add an eps inside it, sqrt(x + eps)",
    "pow": "a fractional power has an infinite gradient at 0: add an eps to the base",
    "norm": "a norm's gradient at 0 is 0/0: add an eps",
    "linalg_vector_norm": "a norm's gradient at 0 (a vector minus itself: two equal points) is 0/0: add an eps "
                          "inside, sqrt((x ** 2).sum() + eps)",
    "cdist_forward": "a distance's gradient at 0 (a point and itself) is 0/0: add an eps inside the square root",
    "acos": "acos has an infinite gradient at -1 and 1 (a cosine of two equal vectors): clamp its argument to "
            "[-1 + eps, 1 - eps]",
    "asin": "asin has an infinite gradient at -1 and 1: clamp its argument to [-1 + eps, 1 - eps]",
    "std": "std's gradient where it is 0 (a constant or masked-out feature) is 0/0: use sqrt(var + eps), or leave "
           "such features out",
    "div": "the gradient of a division by a value near 0 overflows: keep the divisor away from 0",
    "log": "log's gradient at 0 is infinite: clamp its argument above 0",
}


def path(log: str | os.PathLike) -> Path:
    """`<stem>.firstnan.json` beside the op log `<stem>.log` (one per process of a job)."""
    p = Path(log)
    return p.with_name(f"{p.stem}.firstnan.json")


def write(log: str | os.PathLike, record: Mapping[str, Any]) -> None:
    """Atomically (a reader never sees half of it), from inside the recorded child."""
    from gpulab import report

    report.write_json(path(log), dict(record))


def read(log: str | os.PathLike | None) -> dict | None:
    """The record beside `log`, or None (no NaN/+Inf, no stats mode, or an unreadable file)."""
    if not log:
        return None
    try:
        data = json.loads(path(log).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("op") else None


LASTED_OPS = 20   # ops with floating outputs, all finite, that end a run whose NaN/Inf then did not last


def finite_after(snapshot: Any) -> int | None:
    """How many ops with floating outputs the log's newest records hold after its last op that made NaN/Inf
    (None: no such op among them). A NaN that spreads (into the loss, the gradients, the weights) leaves the
    run's last ops nonfinite; one the program cleans (nan_to_num, where over missing values) or skips (a step
    it does not take) leaves them finite."""
    n = 0
    for r in reversed(getattr(snapshot, "records", ()) or ()):
        st = r.stats
        if not st:
            continue
        if st.get("nonfinite"):
            return n
        n += 1
    return None


def note_end(log: str | os.PathLike, snapshot: Any = None) -> None:
    """After the run: its record says how it went on after the NaN/Inf (`finite_after`), read from the op log's
    newest records. Nothing to do without a record; once is enough."""
    rec = read(log)
    if rec is None or "finite_after" in rec:
        return
    if snapshot is None:
        from gpulab.trace import ring

        try:
            snapshot = ring.read(log)
        except (OSError, ValueError):
            return
    write(log, {**rec, "finite_after": finite_after(snapshot)})


def note_job(log: str | os.PathLike, logs: Sequence[str | os.PathLike]) -> None:
    """In a job, a NaN lasts where it spread: the shown process's record (`log`), whose own last ops are finite,
    is told when another process's NaN/Inf lasted to that one's end (a DataLoader worker's NaN reaches the main
    process's loss and weights, while the worker's own last ops are other samples', finite)."""
    rec = read(log)
    if rec is None or lasted(rec):
        return
    for other in logs:
        if Path(other).resolve() == Path(log).resolve():
            continue
        note_end(other)
        got = read(other)
        if got is not None and not caught(got) and lasted(got):
            write(log, {**rec, "lasted_in": Path(other).name})
            return


def lasted(rec: Mapping[str, Any] | None) -> bool:
    """Whether the NaN/Inf lasted, in its process or in another of the job (`lasted_in`), as far as its record
    says (True when it does not say): it reached the weights (`weights_nan`), or the run's last LASTED_OPS ops
    with floating outputs did not all come out finite (`finite_after`). Weights that stayed finite
    (`weights_finite`) do not make it pass: a model whose forward makes NaN every step has a NaN loss and
    finite weights (log's gradient at a negative value is finite)."""
    rec = rec or {}
    if rec.get("lasted_in") or rec.get("weights_nan"):
        return True
    n = rec.get("finite_after")
    return not (isinstance(n, int) and n >= LASTED_OPS)


def _not_lasting(rec: Mapping[str, Any]) -> str:
    w = rec.get("weights_finite")
    why = ("a loss over no target has a gradient of 0, so the weights stayed finite; the loss the program logs "
           "for that step is NaN" if (rec.get("cause") or {}).get("kind") == "no_targets" else
           "the program cleans or skips it: nan_to_num or where over missing values, a step it does not take")
    weights = ", and every update of the weights after it was finite" if w else ""
    return (f"it did not last: the run's last {rec.get('finite_after')} ops with floating outputs made none"
            f"{weights} ({why}); a fault only if those values should not be NaN/Inf")


def first_of_job(logs: Sequence[str | os.PathLike]) -> tuple[Path, dict] | None:
    """Of a job's processes (their op logs), the one whose record says where the NaN/Inf was made, and that
    record: a process where an op made it before one where it came in from outside (in a job, from another
    process through a collective as well as from the data: a DDP rank's gradients hold the NaN another rank's
    op made), then the one that wrote it first; one whose GradScaler caught it last of all."""
    found = []
    for log in logs:
        rec = read(log)
        if rec:
            try:
                when = path(log).stat().st_mtime
            except OSError:
                when = float("inf")
            found.append((caught(rec), _unseen(rec), when, str(log), rec))
    if not found:
        return None
    *_, log, rec = min(found, key=lambda x: x[:4])
    return Path(log), rec


def made_elsewhere(root: str | os.PathLike, logs: Sequence[str | os.PathLike]) -> Path | None:
    """The op log of another process of the job whose op made the first NaN/Inf, where root's own record has none
    or says it came in from outside (a DataLoader worker's batch the main process only reads); else None."""
    own = read(root)
    if own is not None and not _unseen(own):
        return None
    got = first_of_job([x for x in logs if Path(x).resolve() != Path(root).resolve()])
    return got[0] if got is not None and not _unseen(got[1]) else None


def owner(file: str | None) -> tuple[str, str]:
    """(kind, where): ("program", file) for the program's own code, ("library", package) for an installed
    package or Python's own library, ("unknown", "") when no line was seen (a native thread)."""
    if not file:
        return "unknown", ""
    parts = Path(file).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            i = parts.index(marker)
            return "library", (parts[i + 1] if i + 1 < len(parts) else marker).removesuffix(".py")
    stdlib = os.path.dirname(os.__file__)
    if file.startswith(stdlib + os.sep) or file.startswith(sys.base_prefix + os.sep + "lib"):
        return "library", "python"
    return "program", file


def _base(op: str | None) -> str:
    from gpulab.trace import nancause

    return nancause.base_name(op or "")


def made(rec: Mapping[str, Any]) -> str:
    from gpulab.trace import nancause

    out = rec.get("output") or {}
    # a -Inf alone flags an op only in backward (gpulab.trace.opstats): in forward it is a mask's value
    return nancause.made_word(out.get("nan"), out.get("posinf"), out.get("neginf") and rec.get("backward"))


def where(rec: Mapping[str, Any]) -> str:
    """`aten.div.Tensor at train.py:23 in main (pass 5)`, or the backward op named by its forward line."""
    n = rec.get("pass")
    at = f" at {rec['call_site']}" if rec.get("call_site") else " (no Python line: a native thread)"
    bits = ([f"pass {n}"] if n else []) + ([f"in the eager rerun, {EAGER_SET}"] if rec.get("rerun") == "eager" else [])
    step = f" ({'; '.join(bits)})" if bits else ""
    if rec.get("backward"):
        fwd = rec.get("forward_op")
        node = rec.get("backward_node") or "an autograd node"
        if fwd:
            return f"{rec['op']} in backward ({node}), the gradient of {fwd}{at}{step}"
        return f"{rec['op']} in backward ({node}; its forward line was not seen)"
    return f"{rec['op']}{at}{step}"


def caught(rec: Mapping[str, Any] | None) -> bool:
    """Whether the record is of scaled gradients' overflow that a GradScaler caught (it skipped the step and
    lowered its scale, as float16 mixed precision does while it finds its scale): no fault, and nothing after
    it in that run made a NaN/Inf the scaler did not catch."""
    return bool(rec) and rec.get("caught_by") == "GradScaler"


SCALER_MANY = 10   # skipped steps from which the words say what it means if it goes on


def caught_sentence(rec: Mapping[str, Any]) -> str:
    n = int(rec.get("caught") or 1)
    first = rec.get("first_caught") or rec
    at = f" at {first['call_site']}" if first.get("call_site") else ""
    text = (f"the scaled gradients overflowed in backward in {n} step(s) (first {first.get('op')} in "
            f"{first.get('backward_node') or 'backward'}{at}, pass {first.get('pass')}), and the GradScaler caught "
            f"each: it skipped those steps and lowered its scale, as float16 mixed precision does while it finds its "
            f"scale; not a fault")
    if n >= SCALER_MANY:
        text += (" unless it goes on: a scaler that skips step after step (its scale falling toward 1) has "
                 "gradients that overflow float16 unscaled; train in bfloat16, or find the op that overflows")
    return text


def _unseen(rec: Mapping[str, Any]) -> bool:
    """The first NaN/Inf came in through a tensor no recorded op made (the recorder's first: none made one
    before). A NaN the program passes as a number is its line's."""
    cause = rec.get("cause") or {}
    if cause.get("kind") not in ("input_nan", "input_inf"):
        return False
    ins = rec.get("inputs") or []
    i = cause.get("input")
    return not (isinstance(i, int) and i < len(ins) and (ins[i] or {}).get("scalar") is not None)


def _from_data(rec: Mapping[str, Any]) -> bool:
    """Made by no op: the data, not a line of code (when no compiled code ran, which the recorder cannot see, or
    a checkpoint's tensor that torch.load made holds it)."""
    return _unseen(rec) and (not rec.get("compiled") or bool(rec.get("loaded_by")))


def _from_compiled_or_data(rec: Mapping[str, Any]) -> bool:
    """Made by no op the recorder saw while torch.compile'd code ran: a compiled graph or the data; which one,
    only an eager run (TORCHDYNAMO_DISABLE=1) recorded the same way can tell."""
    return _unseen(rec) and bool(rec.get("compiled")) and not rec.get("loaded_by")


def _checkpoint(rec: Mapping[str, Any]) -> str:
    """The NaN came in with a checkpoint (`loaded_by`): its words, else ''."""
    if not (rec.get("loaded_by") and _unseen(rec)):
        return ""
    return (f"the checkpoint that {rec['loaded_by']} reads at {rec.get('call_site')} already holds {made(rec)}: "
            f"resume from an earlier checkpoint, and find where the run that saved this one first made it "
            f"(`gpulab watch --mode stats` of that run)")


EAGER_ENV = ("TORCHDYNAMO_DISABLE", "1")   # torch.compile off: every op runs, and is recorded, one by one
EAGER_SET = "=".join(EAGER_ENV)
EAGER = f"run it eager ({EAGER_SET}) under `gpulab watch --mode stats` (or 02's trace_mode=stats)"
EAGER_NOTE = ("The stats-mode run's first NaN/Inf came out of torch.compile'd code, whose inside the recorder does "
              f"not see: what follows is the same program rerun eager ({EAGER_SET}), every op recorded.")


def hidden_by_compile(rec: Mapping[str, Any] | None) -> bool:
    """Its first NaN/Inf came out of compiled code or the data, and no eager rerun has told which yet: 02 then
    reruns the program eager (gpulab.trace.run.eager_rerun)."""
    return bool(rec) and _from_compiled_or_data(rec) and not rec.get("eager")


def eager_note(said: str) -> str:
    """What an eager rerun that named no NaN/Inf showed: none at all ('clean'), or it did not finish."""
    if said == "clean":
        return f"The same program rerun eager ({EAGER_SET}) made no NaN/Inf: the compiled code makes it, not the data."
    return f"The eager rerun ({EAGER_SET}) ended as {said} before any NaN/Inf: it tells nothing."


def _compiled_only(rec: Mapping[str, Any]) -> bool:
    """The compiled run made it, and the same program eager did not: torch.compile's code, not the data."""
    return _unseen(rec) and rec.get("eager") == "clean"


SAFE_INPUT = {   # by cause: the input to make safe before the op, where a where selects its result away after
    "zero_divisor": "divide by torch.where(mask, divisor, 1)",
    "log_domain": "take the log of torch.where(mask, x, 1)",
    "sqrt_domain": "take the sqrt of torch.where(mask, x, 1) (not 0: sqrt's gradient at 0 is infinite too)",
    "pow_domain": "raise torch.where(mask, x, 1) to the power",
    "unit_domain": "take it of torch.where(mask, x, 0)",
    "softmax_masked_row": "mask the scores with torch.finfo(dtype).min instead of -inf",
}


def _selected(rec: Mapping[str, Any]) -> str:
    """The where-gradient trap, when the record shows a where that hid the NaN/Inf: its words, else ''."""
    sel = rec.get("selected_by")
    if not (sel and sel.get("backward_nan")):   # the where did its job: nothing made NaN at the op in backward
        return ""
    kind = (rec.get("cause") or {}).get("kind") or ""
    safe = SAFE_INPUT.get(kind, "compute it on an input made safe first, torch.where(mask, x, <a safe value>)")
    return (f"{_base(sel.get('op'))} at {sel.get('call_site')} selects other values where it is {made(rec)}, but "
            f"backward still multiplies the zero gradient there by this op's derivative, and 0 * Inf is NaN (the "
            f"where-gradient trap: {sel['backward_nan']} made NaN/Inf): {safe}, so that no {made(rec)} is made, then "
            f"select")


def _fix(rec: Mapping[str, Any]) -> str | None:
    """How to change the line: by the forward function when the NaN was made in its backward (not one its
    input brought: that op only passes it on), a where's trap when one hid a forward NaN/Inf, else by cause."""
    if trap := _selected(rec):
        return trap
    kind = (rec.get("cause") or {}).get("kind")
    own = kind not in ("input_nan", "input_inf", "input_neginf")
    fix = BACKWARD_REMEDY.get(_base(rec.get("forward_op"))) if rec.get("backward") and own else None
    return fix or REMEDY.get((rec.get("cause") or {}).get("kind") or "")


def whose(rec: Mapping[str, Any]) -> str:
    """Whose code to change, and how: the program's line, the data, a library's call."""
    if _checkpoint(rec):
        return f"the checkpoint, not this run's code: {rec['loaded_by']} reads it at {rec.get('call_site')}"
    if _from_data(rec):
        n = rec.get("pass")
        return (f"the data: the batch of pass {n} already holds it; check it where it is loaded" if n else
                "the data: check the inputs where they are loaded")
    if _compiled_only(rec):
        return ("torch.compile's code: the same program rerun eager made none (a compiled graph computes what eager "
                "does not)")
    if _from_compiled_or_data(rec):
        return (f"a torch.compile'd graph or the data, unknown which: {EAGER} to name the op (eager, every op the "
                f"graph ran is recorded)")
    who, lib = owner(rec.get("file"))
    fix = _fix(rec)
    if (rec.get("cause") or {}).get("kind") == "growth":   # the line only shows it: the training diverges
        return f"what runs before this line, not the line: the values run away before it; {fix}"
    if who == "program":
        return "the program's line: fix it there" + (f"; {fix}" if fix else "")
    if who == "library":
        return (f"{lib}'s code at that line, called by the program: change what the program passes it"
                + (f"; {fix}" if fix else "") + f"; or report it to {lib}")
    return "no line of the program was seen" + (f"; {fix}" if fix else "")


def next_step(rec: Mapping[str, Any]) -> str:
    """The index's next step: whose code to change, where, and how (the line named, as a hang's is); empty for
    an overflow a GradScaler caught, or a NaN/Inf that did not last (the program cleans or skips it)."""
    if caught(rec) or not lasted(rec):
        return ""
    site = rec.get("call_site")
    n = rec.get("pass")
    if ckpt := _checkpoint(rec):
        return ckpt
    if _from_data(rec):
        return (f"check the data where it is loaded: the batch of pass {n} already holds {made(rec)} "
                f"(the first op to read it: {rec.get('op')} at {site})" if n else
                f"check the data where it is loaded: it already holds {made(rec)} (the first op to read it: "
                f"{rec.get('op')})")
    if _compiled_only(rec):
        return (f"compare the program eager against compiled op by op (`gpulab compare` of the command with "
                f"{EAGER_SET} against it as it is, or 05's compare=eager) to name the first op where they "
                f"part; the first op here to read the {made(rec)} is {rec.get('op')} at {site}; then report it to "
                f"PyTorch (torch.compile), or keep that code eager (torch.compiler.disable)")
    if _from_compiled_or_data(rec):
        return (f"{EAGER} to name the op inside the compiled graph that makes {made(rec)} (here the first op to "
                f"read it is {rec.get('op')} at {site}); if the eager run's first op still reads it, check the data")
    who, lib = owner(rec.get("file"))
    fix = _fix(rec) or "read the op's inputs in 02 (stats.firstnan.json: NaN/Inf counts, min, max, zeros of each)"
    if (rec.get("cause") or {}).get("kind") == "growth":
        return f"the values run away before {site} overflows (pass {n}): {fix}"
    at = (rec.get("cause") or {}).get("at")   # the earlier op's line that the remedy is for (a log's)
    if at and who == "program" and owner(str(at).partition(":")[0])[0] == "program":
        site = at
    if who == "program":
        return f"fix the program's line {site}: {fix}"
    if who == "library":
        return f"{lib}'s code at {site} makes it from what the program passes: {fix}; or report it to {lib}"
    return f"no line of the program was seen: {fix}"


def sentence(rec: Mapping[str, Any] | None) -> str:
    """02's finding for the first NaN: op, line, pass, cause in words, whose code (plain text)."""
    if not rec:
        return ""
    cause = rec.get("cause") or {}
    if caught(rec):
        return caught_sentence(rec)
    if rec.get("error"):
        return f"{made(rec)} first made by {rec.get('op')} (its cause could not be read: {rec['error']})"
    before = rec.get("scaler_caught_before") or {}
    also = (f" (before it, the GradScaler caught {before['count']} overflow(s) of the scaled gradients)"
            if before.get("count") else "")
    end = "" if lasted(rec) else f"; {_not_lasting(rec)}"
    return (f"{made(rec)} first made by {where(rec)}: {cause.get('words') or 'cause unknown'}{also} — {whose(rec)}"
            f"{end}")


SOFTMAX_AFTER = 8   # ops after the first NaN/Inf in which a softmax counts as taking it in


def into_softmax(snapshot: Any, seq: int | None) -> bool:
    """The first NaN/Inf op is a softmax, or a softmax runs within the next few ops (the scores a low-precision
    matmul overflowed, then softmaxed): what makes a softmax fix worth trying."""
    if snapshot is None or seq is None:
        return False
    return any("softmax" in r.name for r in getattr(snapshot, "records", ()) if seq <= r.seq <= seq + SOFTMAX_AFTER)


def metrics(log: str | os.PathLike | Mapping[str, Any] | None, snapshot: Any = None) -> dict[str, Any]:
    """02's metrics of the first NaN's cause (empty when there is no record): what the chain's verdict reads.
    log: the op log whose record to read, or the record itself; snapshot: the stats-mode recording, to tell
    whether the NaN/Inf went into a softmax."""
    rec = log if isinstance(log, Mapping) else read(log)   # the record itself, where the caller read it
    if rec is None:
        return {}
    if caught(rec):   # no fault: said, and nothing for the chain's verdict to act on
        return {"first_nonfinite_caught_by": rec.get("caught_by"), "first_nonfinite_caught": rec.get("caught"),
                "first_nonfinite_sentence": sentence(rec)}
    cause = rec.get("cause") or {}
    who, lib = owner(rec.get("file"))
    out = rec.get("output") or {}
    return {"first_nonfinite_site": rec.get("call_site"), "first_nonfinite_pass": rec.get("pass"),
            "first_nonfinite_backward": bool(rec.get("backward")), "first_nonfinite_forward_op": rec.get("forward_op"),
            "first_nonfinite_cause": cause.get("words"), "first_nonfinite_cause_kind": cause.get("kind"),
            "first_nonfinite_dtype": out.get("dtype"), "first_nonfinite_owner": who,
            "first_nonfinite_owner_where": lib if who == "library" else None,
            "first_nonfinite_where": where(rec), "first_nonfinite_whose": whose(rec),
            "first_nonfinite_sentence": sentence(rec), "first_nonfinite_made": made(rec),
            "first_nonfinite_next": next_step(rec) if not rec.get("error") else None,
            "first_nonfinite_lasted": lasted(rec),
            "first_nonfinite_into_softmax": "softmax" in str(rec.get("op")) or into_softmax(snapshot, rec.get("seq"))}
