"""The verdict over two runs' records: agree, diverged (naming the op that INTRODUCES the difference: its
inputs agree within tolerance and its output does not), or unaligned (where the runs part). Pure.

Why inputs are looked up by producer and not by alignment: an input is compared as the record that made it on
each side, so a difference made where the recorder sees no op (a compiled region's fused kernels, an op only
one side runs) is still found, and named as that region or that op. Why the first bitwise difference too:
the same command run twice should give the same bits; the first op that does not is the nondeterministic one,
even when its difference is within tolerance.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpulab.numerics import align as _align
from gpulab.numerics import reduction as _reduction
from gpulab.numerics.figures import Figures, compare
from gpulab.numerics.names import INPUT, collective, computation, random_op, shared_inputs
from gpulab.numerics.tolerance import Tolerance, for_dtypes
from gpulab.trace.nancause import base_name

GROWS = 10.0   # a difference that reaches this many times its size at the divergence "grows"


@dataclass(frozen=True)
class Judgement:
    status: str                          # agree | diverged | unaligned
    sentence: str
    first_divergence: dict | None = None
    first_bitwise: dict | None = None    # the first aligned op whose output differs in any bit
    parted: dict | None = None           # unaligned: where the runs go different ways
    tolerance: Tolerance | None = None   # the tolerance of the runs' dtypes (per op: the looser of its two)
    rows: tuple[dict, ...] = field(default=(), repr=False)   # per aligned op: its error along the run
    aligned: int = 0
    ref_ops: int = 0
    cand_ops: int = 0
    aligned_by: str = "call site"
    keep: tuple[str, str] | None = None  # the diverging records' keys on each side (what a replay run keeps)
    rounding: dict | None = None         # the largest difference beyond assert_close's tolerance that is rounding

    def to_dict(self) -> dict:
        return {"status": self.status, "summary": self.sentence, "first_divergence": self.first_divergence,
                "first_bitwise_difference": self.first_bitwise, "parted": self.parted,
                "tolerance": self.tolerance.to_dict() if self.tolerance else None,
                "ops": {"reference": self.ref_ops, "candidate": self.cand_ops, "aligned": self.aligned,
                        "aligned_by": self.aligned_by}, "largest_rounding": self.rounding}


def where(r: dict) -> str:
    """An op as a person names it: `aten.mul.Tensor at train.py:12 in step (pass 3, backward)`."""
    what = "the output of code the recorder cannot see (a compiled region)" if r.get("op") == INPUT else r.get("op")
    return (f"{what} at {short(r.get('site'))} (pass {r.get('pass')}"
            + (", backward)" if r.get("bwd") else ")"))


def short(site: str | None) -> str:
    """file:line in function, with the file's folder left out (the full path is in the JSON)."""
    site = site or "?"
    path, sep, rest = site.partition(":")
    return (path.rsplit("/", 1)[-1] + sep + rest) if sep else site


def _op(r: dict) -> dict:
    return {"op": r.get("op"), "call_site": r.get("site"), "pass": r.get("pass"), "backward": bool(r.get("bwd")),
            "output": r.get("out"), "dtype": r.get("dtype"), "shape": r.get("shape"), "record": r.get("i")}


def key(r: dict) -> str:
    """What the recorder's keep-mode matches: op|site|pass|out (gpulab.numerics.record)."""
    return f"{r.get('op')}|{r.get('site')}|{r.get('pass')}|{r.get('out')}"


def _inputs(r: dict, c: dict, R: dict, C: dict, rtol, atol) -> list[tuple[dict | None, dict | None, Figures | None]]:
    """Each input's two records (by producer) and how they compare, at the input's own scale (_at_scale)."""
    out = []
    n = shared_inputs(r.get("op"), c.get("op"))   # two backends' kernels: only the inputs they share
    for pr, pc in list(zip(r.get("in") or (), c.get("in") or ()))[:n]:
        rr, cc = R.get(pr), C.get(pc)
        fig = (compare(rr, cc, _at_scale(for_dtypes(rr.get("dtype"), cc.get("dtype"), rtol=rtol, atol=atol), rr))
               if rr and cc else None)
        out.append((rr, cc, fig))
    return out


def _at_scale(tol: Tolerance, r: dict) -> Tolerance:
    """An input's tolerance with atol shrunk to the input's mean magnitude where that is below 1: assert_close's
    atol is an allowance at unit scale, and held fixed it calls any two tensors of small values equal (the
    gradients of a mean loss, 1e-4 each, differing by 30%, or an optimizer's squared-gradient average of 1e-9),
    so an op reading them would be named as making a difference it was given. Outputs are judged this way only
    where a later op is beyond assert_close's tolerance anyway (_small_values), so nothing that agrees by it is
    called diverged; a tolerance the user set stands as set."""
    if tol.set_by_user:
        return tol
    try:
        scale = abs(float(r.get("asum"))) / max(int(r.get("n") or 0), 1)
    except (TypeError, ValueError):
        return tol
    if not (math.isfinite(scale) and scale < 1.0):
        return tol
    return Tolerance(tol.rtol, tol.atol * scale, tol.dtypes, tol.set_by_user, scale)


def judge(ref: list[dict], cand: list[dict], *, rtol: float | None = None, atol: float | None = None,
          same_command: bool = False, rounding: tuple[str, ...] = ()) -> Judgement:
    """ref, cand: every record of each run (gpulab.numerics.record's lines), in order. rounding: the keys (key())
    of ops a replay found right on both sides: their difference is rounding, and the judgement goes on past them."""
    R, C = {r["i"]: r for r in ref}, {c["i"]: c for c in cand}
    ro, co = _align.ops(ref), _align.ops(cand)
    tol = for_dtypes(*sorted({r.get("dtype") for r in ro} | {c.get("dtype") for c in co}), rtol=rtol, atol=atol)
    if not ro or not co:
        empty = "the reference run" if not ro else "the candidate run"
        return Judgement("unaligned", f"Cannot compare: {empty} recorded no PyTorch op (is it a Python program "
                         f"that runs PyTorch?).", tolerance=tol,
                         ref_ops=len(ro), cand_ops=len(co), parted={"reference": None, "candidate": None})
    al = _align.align(ro, co)
    base = dict(tolerance=tol, aligned=len(al.pairs), ref_ops=len(ro), cand_ops=len(co), aligned_by=al.by)
    if not al.aligned:
        return _unaligned(al, ro, co, base)
    rows, first, shown, bit, shape, incoming = [], None, None, None, None, None
    bit_at = len(ro)                      # position (in the reference's ops) of the first bitwise difference
    matched_r = {ro[a]["i"] for a, _ in al.pairs}
    matched_c = {co[b]["i"] for _, b in al.pairs}
    judged_r, judged_c = set(), set()     # aligned ops already judged: a difference they pass on is not new
    explained: list[tuple] = []           # beyond assert_close's tolerance, but rounding: (n, r, c, figures, how)
    small = None                          # the first op that makes a difference only its values' scale shows
    accepted = set(rounding)
    for n, (a, b) in enumerate(al.pairs):
        r, c = ro[a], co[b]
        tol_rc = for_dtypes(r.get("dtype"), c.get("dtype"), rtol=rtol, atol=atol)
        plain = fig = compare(r, c, tol_rc)
        if plain.comparable and not plain.within:
            slack = _slack(r, c, R, C, tol_rc.rtol)
            if slack:
                fig = compare(r, c, tol_rc, slack)
        rows.append({"n": n, "op": r.get("op"), "call_site": short(r.get("site")), "pass": r.get("pass"),
                     "backward": bool(r.get("bwd")), "excess": fig.excess, "max_rel_err": fig.max_rel_err,
                     "bitwise_equal": fig.bitwise, "plain_excess": plain.excess, "comparable": fig.comparable})
        if not fig.comparable:
            shape = shape or (r, c, fig)
            continue
        if bit is None and not fig.bitwise:
            bit, bit_at = (r, c, fig), a
        if small is None and first is None and plain.within and not fig.bitwise:
            small = _small_values(n, r, c, R, C, tol_rc, rtol, atol)
        if first is None and not plain.within:
            if fig.within:
                explained.append((n, r, c, plain, f"within its allowance for a {max(r.get('k') or 1, c.get('k') or 1)}"
                                                  f"-term reduction's rounding"))
            elif key(r) in accepted:
                explained.append((n, r, c, plain, "both runs compute it right for their dtype, replayed against "
                                                  "float64"))
            else:
                ins = _inputs(r, c, R, C, rtol, atol)
                if all(f is None or f.within for _, _, f in ins) and collective(r.get("op")):
                    incoming = incoming or (n, r, c, fig, ins, None, "reference")   # another rank's data
                elif all(f is None or f.within for _, _, f in ins):
                    first = (n, r, c, fig, ins, None, "reference")
                elif all(f is None or f.within or (rr["i"] in judged_r and cc["i"] in judged_c) for rr, cc, f in ins):
                    explained.append((n, r, c, plain, "passed on from its inputs' rounding"))
                elif shown is None:
                    shown = (n, r, c, fig, ins)
        judged_r.add(r["i"])
        judged_c.add(c["i"])
    if same_command and al.parted is not None and al.parted[0] <= bit_at:
        return _other_paths(al, ro, co, base)
    if shown is not None and (first is None or (shown[0] < first[0] and _derived(first))):
        first = _unseen(shown, matched_r, matched_c, R, C, rtol, atol)
    # a difference that only the values' scale shows comes first where a later op is beyond tolerance anyway
    # (never where the runs agree by assert_close's tolerance, or by rounding that stays within it at the end)
    beyond = first is not None or (explained and _end([x["plain_excess"] for x in rows]) > 1.0)
    if small is not None and beyond and (first is None or small[0] < first[0]):
        first = small
    if incoming is not None and (first is None or incoming[0] < first[0]):   # it came in before any op made one
        div, _ = _divergence(incoming, rows, al)
        div["from_other_rank"] = True
        return Judgement("diverged", f"On this process the first difference comes in through the collective "
                         f"{where(incoming[1])}: its own inputs agree, so another rank's data differs; "
                         f"{div['then']}.", first_divergence=div,
                         first_bitwise=_bitwise_dict(bit), rows=tuple(rows), **base)
    if first is None and shape is not None:
        r, c, fig = shape
        return Judgement("unaligned", f"The runs part at {where(r)}: the same op gives shape {r.get('shape')} in "
                         f"the reference and {c.get('shape')} in the candidate.", rows=tuple(rows),
                         parted={"reference": _op(r), "candidate": _op(c), "why": fig.why}, **base)
    bitwise = _bitwise_dict(bit)
    largest = _largest_rounding(explained)
    base["rounding"] = largest
    if first is None:
        end = _end([x["plain_excess"] for x in rows])
        if explained and end > 1.0:
            n, r, c, plain, how = explained[0]
            div, _ = _divergence((n, r, c, plain, _inputs(r, c, R, C, rtol, atol), None, "reference"), rows, al)
            div["rounding"] = how
            return Judgement("diverged", f"No op computes a wrong number, but rounding grows past the tolerance: it "
                             f"starts at {where(r)} ({how}) and the run ends at {end:.3g}x the tolerance.",
                             first_divergence=div, first_bitwise=bitwise, rows=tuple(rows), **base)
        return Judgement("agree", _agree_sentence(al, tol, bit, same_command, largest), first_bitwise=bitwise,
                         rows=tuple(rows), **base)
    div, keep = _divergence(first, rows, al)
    drawn = _drawn_before(al, ro, co, first[0], matched_r, matched_c) if first[5] is not None else None
    if drawn is not None:   # the unseen difference follows random numbers only one run draws there
        side, d = drawn
        seen, fig = first[5][0], first[5][2]
        div.update({**_op(d), "run": side, "random_draw": True})
        div["words"] = (f"the runs' random numbers part there (a compiled region draws its own: torch.compile's "
                        f"differ from eager's unless torch._inductor.config.fallback_random = True); the difference "
                        f"is first seen in the aligned op {where(seen)} ({fig.excess:.3g}x the tolerance); "
                        f"{div['then']}.")
        return Judgement("diverged", f"The runs diverge at {where(d)}, a random draw only the {side} makes: "
                         + div["words"], first_divergence=div, first_bitwise=bitwise, rows=tuple(rows), **base)
    only = (f", an op only the {first[6]} runs" if first[1].get("op") != INPUT
            and first[1]["i"] not in (matched_c if first[6] == "candidate" else matched_r) else "")
    scale = _loss_scale(first) if only else None
    if scale is not None:   # a mixed-precision loss scaler's multiply: by design, not a wrong number
        div["loss_scale"] = 2.0 ** scale
        div["words"] = div["words"].rstrip(".") + (
            f"; its values are the other run's times 2^{scale} exactly: a loss scale, as torch.amp.GradScaler's "
            f"scaler.scale(loss) makes (a power-of-two factor of the program's own reads the same), so that run's "
            f"gradients stay scaled until scaler.unscale_ or scaler.step. To see "
            f"where its numbers themselves part from the other run's, compare with the scale fixed at 1 "
            f"(GradScaler(init_scale=1.0, growth_interval=10**9)) or the scaler disabled (enabled=False).")
    sentence = (f"The runs diverge at {where(first[1])}{only}{_other_kernel(first)}: " + div["words"])
    return Judgement("diverged", sentence, first_divergence=div, first_bitwise=bitwise, rows=tuple(rows),
                     keep=keep, **base)


LOSS_SCALE_MIN = 8   # 2^k of at least this: a loss scaler's (GradScaler starts at 2^16), not a program's factor


def _loss_scale(first) -> int | None:
    """k where an op only one run runs is a multiply whose output is the other run's value times 2^k exactly (k
    >= LOSS_SCALE_MIN): a mixed-precision loss scale."""
    n, x, y, fig, ins, via, side = first
    if base_name(x.get("op")) != "mul" or via is None:
        return None
    try:
        a, b = float(x.get("sum")), float(y.get("sum"))
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(a) and math.isfinite(b) and a and b) or (a > 0) != (b > 0):
        return None
    k = math.log2(a / b)
    return round(k) if abs(k - round(k)) < 1e-6 and round(k) >= LOSS_SCALE_MIN else None


def _other_kernel(first) -> str:
    """', which the candidate runs as aten.X (another backend's kernel for the same call)' where the paired ops
    are one computation run by two backends' kernels."""
    n, x, y, fig, ins, via, side = first
    if via is not None or x.get("op") == y.get("op") or (
            computation(x.get("op"), x.get("out")) != computation(y.get("op"), y.get("out"))):
        return ""   # the same op, or no pair at all (an op only one run runs, and what the other run reads)
    return (f", which the {'candidate' if side == 'reference' else 'reference'} runs as {y.get('op')} (another "
            f"backend's kernel for the same call)")


def _slack(r: dict, c: dict, R: dict, C: dict, rtol: float) -> float:
    """The op's allowance for its reduction's rounding (gpulab.numerics.reduction), the larger of the two runs'."""
    k = max(int(r.get("k") or 1), int(c.get("k") or 1))
    if k <= 1:
        return 0.0
    dtype = max((r.get("dtype"), c.get("dtype")), key=lambda d: _reduction.EPS.get(str(d), 0.0))
    got = 0.0
    for x, X in ((r, R), (c, C)):
        ins = sorted((X[p] for p in x.get("in") or () if p in X), key=lambda t: -int(t.get("n") or 0))
        got = max(got, _reduction.allowance(x.get("op"), k, dtype, rtol, [_amax(t) for t in ins], _amax(x)))
    return got


def _amax(r: dict) -> float:
    try:
        return abs(float(r.get("amax")))
    except (TypeError, ValueError):
        return math.nan


def _end(excess: list) -> float:
    """The worst error over tolerance in the last tenth of the run's aligned ops."""
    got = [x for x in excess if x is not None]
    return max(got[-max(1, len(got) // 10):], default=0.0)


def _largest_rounding(explained: list[tuple]) -> dict | None:
    if not explained:
        return None
    n, r, c, plain, how = max(explained, key=lambda e: e[3].excess)
    return {**_op(r), "excess": plain.excess, "max_rel_err": plain.max_rel_err, "why": how,
            "words": f"the largest rounding difference is at {where(r)}: {plain.excess:.3g}x assert_close's "
                     f"tolerance (max relative error {plain.max_rel_err:.3g}), {how}"}


def _unseen(shown, matched_r, matched_c, R: dict, C: dict, rtol, atol):
    """The first aligned op beyond tolerance got its difference through an input made where no aligned op
    shows it: name that input's maker (an `<input>` record: a compiled region; or an op one side only runs).
    An op only one side runs that was fed what the other side read as an `<input>` (the same values: the
    candidate scales the batch it loaded, the reference reads that batch as it is) made the difference itself."""
    n, r, c, fig, ins = shown
    for rr, cc, f in ins:
        if f is not None and not f.within:
            for op, other, X, side in ((cc, rr, C, "candidate"), (rr, cc, R, "reference")):
                fed = _fed(op, other, X, rtol, atol)
                if fed and op["i"] not in (matched_c if side == "candidate" else matched_r):
                    return n, op, other, f, fed, (r, c, fig), side
            # the candidate's maker when the reference's is aligned, or when neither is (each run makes the value
            # with ops of its own) and only the candidate's runs code at a line the reference never reaches (a
            # custom backward of its own)
            cand_side = cc.get("op") == INPUT or (rr.get("op") != INPUT and cc["i"] not in matched_c and (
                rr["i"] in matched_r or _own_code(cc, R) and not _own_code(rr, C)))
            return ((n, cc, rr, f, [], (r, c, fig), "candidate") if cand_side
                    else (n, rr, cc, f, [], (r, c, fig), "reference"))
    return (n, r, c, fig, ins, None, "reference")


SMALL_EXCESS = 100.0   # how far past the tolerance at its values' scale an op in tolerance must be to be named


def _small_values(n: int, r: dict, c: dict, R: dict, C: dict, tol: Tolerance, rtol, atol) -> tuple | None:
    """An aligned op within assert_close's tolerance only because its values are small (gradients of 1e-4 that
    differ by 30% are within an atol of 1e-5), whose inputs agree: it is the one that makes the difference.
    Judged at the values' scale (_at_scale) and named only when far past it (SMALL_EXCESS): rounding is not."""
    fig = compare(r, c, _at_scale(tol, r))
    if not (fig.comparable and fig.excess > SMALL_EXCESS):
        return None
    ins = _inputs(r, c, R, C, rtol, atol)
    if not all(f is None or f.within for _, _, f in ins) or not [f for _, _, f in ins if f is not None]:
        return None
    return (n, r, c, fig, ins, None, "reference")


def _own_code(x: dict, other_run: dict) -> bool:
    """Whether x's call site is a line the other run's recorded ops never ran."""
    site = x.get("site")
    return site is not None and all(y.get("site") != site for y in other_run.values())


def _derived(first) -> bool:
    """A first divergence whose op reads no recorded float input and draws no random numbers (a cast of a bool
    mask, an index): what it reads (integers, booleans) may carry an earlier difference the recorder does not
    fingerprint, so an earlier unexplained difference comes first."""
    n, r, c, fig, ins, via, side = first
    return via is None and not [f for _, _, f in ins if f is not None] and not random_op(r.get("op"))


def _drawn_before(al, ro: list[dict], co: list[dict], n: int, matched_r, matched_c) -> tuple[str, dict] | None:
    """The first random draw that only one run makes before the n-th aligned pair, where the other run draws
    none that is not paired (it draws them inside compiled code, unseen): (its run, its record)."""
    a, b = al.pairs[n]
    drawn = [next((x for x in ops[:upto] if random_op(x.get("op")) and x["i"] not in matched), None)
             for ops, upto, matched in ((ro, a, matched_r), (co, b, matched_c))]
    if (drawn[0] is None) == (drawn[1] is None):
        return None
    return ("reference", drawn[0]) if drawn[0] is not None else ("candidate", drawn[1])


def _fed(op: dict, other: dict, X: dict, rtol, atol) -> list:
    """op's input that agrees with the other side's `<input>` record, as _inputs' (its, other's, figures); []
    when op is itself an `<input>`, the other is not, or no input of op agrees with it."""
    if op.get("op") == INPUT or other.get("op") != INPUT:
        return []
    for p in op.get("in") or ():
        x = X.get(p)
        if x is None:
            continue
        f = compare(x, other, for_dtypes(x.get("dtype"), other.get("dtype"), rtol=rtol, atol=atol))
        if f.comparable and f.within:
            return [(x, other, f)]
    return []


def _divergence(first, rows: list[dict], al) -> tuple[dict, tuple[str, str] | None]:
    n, r, c, fig, ins, via, side = first
    # an output of another shape (batch norm's saved statistics, empty outside training) is no NaN/Inf
    seen = [x for x in rows[n + 1:] if x["excess"] is not None and x.get("comparable", True)]
    later = [x["excess"] for x in seen]
    peak = max(later, default=0.0)
    end = max(later[-max(1, len(later) // 10):], default=0.0)
    if not later:
        trend, then = "last", "it is the last op compared"
    elif math.isinf(fig.excess) or math.isinf(peak):
        nf = next((x for x in seen if math.isinf(x["excess"])), None)
        trend = "spreads"
        then = (f"it then spreads: NaN/Inf from {nf['op']} at {nf['call_site']} (pass {nf['pass']})"
                if nf and not math.isinf(fig.excess) else "its NaN/Inf difference stays in the ops after it")
    elif peak >= GROWS * max(fig.excess, 1.0):
        trend, then = "grows", f"it then grows, to {peak:.3g}x the tolerance (at the end of the run: {end:.3g}x)"
    elif end <= 1.0:
        trend = "fades"
        then = f"it then fades: by the end of the run the outputs are within tolerance again ({end:.3g}x)"
    elif end * GROWS < fig.excess:
        trend, then = "shrinks", f"it then shrinks but stays beyond tolerance ({end:.3g}x at the end of the run)"
    else:
        trend, then = "stays", f"it then stays about the same ({end:.3g}x the tolerance at the end of the run)"
    words = (f"its output differs by {fig.excess:.3g}x the tolerance ({fig.why}; max relative error "
             f"{fig.max_rel_err:.3g} on the sample, {fig.tol.words() if fig.tol else ''})")
    drawn = via is None and random_op(r.get("op"))
    if drawn:   # nothing to replay: its numbers come from the generator's state, not from its inputs
        words += (", and it draws random numbers: the runs' random generators are in different states there (a "
                  "generator not seeded, or seeded otherwise, or an earlier random draw only one run makes)")
    elif via is None:
        ok = [f for _, _, f in ins if f is not None]
        words += (f", while its {len(ok)} input(s) agree (worst {max((f.excess for f in ok), default=0.0):.3g}x)"
                  if ok else ", and it reads no earlier output")
    else:
        if ins:   # an op only one side runs, fed what the other side reads
            other = "reference" if side == "candidate" else "candidate"
            words += (f", while its input agrees with what the {other} run reads unchanged "
                      f"({ins[0][2].excess:.3g}x the tolerance)")
        elif c.get("op") not in (INPUT, r.get("op")):   # each run makes the value with ops of its own
            other = "reference" if side == "candidate" else "candidate"
            words += f", where the {other} run makes that value with {where(c)}"
        words += f"; first seen in the aligned op {where(via[0])}"
    words += f"; {then}."
    out = {**_op(r), "error": fig.to_dict(), "tolerance": fig.tol.to_dict() if fig.tol else None,
           "inputs": [f.to_dict() if f else None for _, _, f in ins],
           "run": side, "other_run": _op(c), "candidate": _op(c) if side == "reference" else _op(r), "then": then,
           "trend": trend,
           "nan_inf": fig.nonfinite[0] != fig.nonfinite[1] or fig.nonfinite[2] != fig.nonfinite[3],
           "words": words, "seen_first_at": _op(via[0]) if via else None}
    return out, (key(r), key(c)) if via is None and not drawn else None


def _bitwise_dict(bit) -> dict | None:
    if bit is None:
        return None
    r, c, fig = bit
    return {**_op(r), "candidate": _op(c), "error": fig.to_dict(),
            "words": f"first bitwise difference at {where(r)} ({'within' if fig.within else 'beyond'} tolerance, "
                     f"{_error_words(fig)})"}


def _error_words(fig: Figures) -> str:
    """'max relative error 2.1e-07'; where the worst element is 0 in the reference (a relative error of inf reads as
    a blow-up, which a difference within tolerance is not), the absolute error."""
    if math.isinf(fig.max_rel_err) and math.isfinite(fig.max_abs_err):
        return f"max absolute error {fig.max_abs_err:.3g}, where the reference holds 0"
    return f"max relative error {fig.max_rel_err:.3g}"


def _agree_sentence(al, tol: Tolerance, bit, same_command: bool, largest: dict | None = None) -> str:
    gaps = (al.ref_ops - len(al.pairs)) + (al.cand_ops - len(al.pairs))
    s = (f"The runs agree: all {len(al.pairs)} aligned ops are within tolerance ({tol.words()}, the looser dtype "
         f"of each pair, and each reduction's allowance for its rounding)"
         + (f"; {gaps} op(s) run on one side only" if gaps else "") + ".")
    if largest:
        s += " No op computes a wrong number: " + largest["words"] + "."
    if bit is None:
        return s + " Every aligned output is bitwise equal."
    r, _, fig = bit
    lead = ("The program is not deterministic: the first op whose output differs bitwise on a rerun is "
            if same_command else "The first bitwise difference is at ")
    return s + f" {lead}{where(r)} ({_error_words(fig)})."


def _other_paths(al, ro: list[dict], co: list[dict], base: dict) -> Judgement:
    """The same command twice, whose runs do not run the same ops before any op gives other numbers: they went
    different ways for a reason other than arithmetic, so comparing what they computed would pair unlike calls
    (the reference's second step with the candidate's first)."""
    i, r, c = _parting(al, ro, co)
    sentence = (f"The two runs of the same command do not run the same ops ({len(ro)} against {len(co)}): they part "
                f"after {i} op(s), where the reference runs {where(r) if r else 'to its end'} and the candidate runs "
                f"{where(c) if c else 'to its end'}, before any op gives other numbers. What they compute is not "
                f"compared: a program takes another path on a rerun when it reads what an earlier run left (a "
                f"checkpoint it resumes from, a cache) or branches on the clock or unseeded random numbers.")
    return Judgement("unaligned", sentence, parted={"reference": _op(r) if r else None,
                                                    "candidate": _op(c) if c else None, "after_ops": i}, **base)


def _parting(al, ro: list[dict], co: list[dict]) -> tuple[int, dict | None, dict | None]:
    """Where the runs part: the reference's ops before it, and each side's op there (None past its end)."""
    i, j = al.parted or (0, 0)
    return i, ro[i] if i < len(ro) else None, co[j] if j < len(co) else None


def _unaligned(al, ro: list[dict], co: list[dict], base: dict) -> Judgement:
    i, r, c = _parting(al, ro, co)
    ref_w = where(r) if r else "its end"
    cand_w = where(c) if c else "its end"
    sentence = (f"The runs cannot be aligned: only {len(al.pairs)} of {min(len(ro), len(co))} ops match; they part "
                f"after {i} op(s), where the reference runs {ref_w} and the candidate runs {cand_w}.")
    return Judgement("unaligned", sentence, parted={"reference": _op(r) if r else None,
                                                    "candidate": _op(c) if c else None, "after_ops": i}, **base)
