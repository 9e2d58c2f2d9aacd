"""Output statistics of each op (mode `stats`). Apart from the recorder because it is the one mode that reads
the op's outputs (tensor math per op, a host sync on CUDA); the recorder only decides when it runs."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable

from gpulab.trace.ring import _OFF_FLAGS, _OFF_NONFINITE, _OFF_STATS, _STATS, F_NONFINITE, F_STATS, _q


def stats_writer(mm: Any, torch: Any, state: dict) -> Callable[[Any, int, int], bool]:
    """compute_stats(out, off, seq) for slot `off` of op `seq` -> whether it is the log's first NaN/+Inf
    (state["nonfinite_set"])."""
    Tensor = torch.Tensor
    pack_q = _q.pack_into
    current_node = torch._C._current_autograd_node

    def compute_stats(out, off: int, seq: int) -> bool:
        """min/max/mean and NaN/+Inf/-Inf counts of floating outputs. Only NaN or +Inf flag a forward op: -Inf
        is how attention masks are written (scalar_tensor(-inf), where(mask, 0, -inf)), not a fault. In backward
        no mask is written: a -Inf gradient is as wrong as a +Inf one (sqrt's gradient at 0 times a negative
        upstream gradient), and the NaN it makes later is its consequence. True for the log's first NaN/+Inf
        (its cause is looked for then)."""
        ts = [out] if isinstance(out, Tensor) else [x for x in out if isinstance(x, Tensor)] \
            if isinstance(out, (list, tuple)) else []
        mn, mx, tot, cnt, nan, inf, ninf = float("inf"), float("-inf"), 0.0, 0, 0, 0, 0
        seen = False
        for t in ts:
            if not (t.is_floating_point() and t.numel() and t.device.type != "meta"):
                continue
            x = t.detach()
            n_nan = int(torch.isnan(x).sum())
            n_inf = int((x == float("inf")).sum())
            n_ninf = int((x == float("-inf")).sum())
            xf = x.float()
            lo, hi = torch.aminmax(xf)
            mn, mx = min(mn, float(lo)), max(mx, float(hi))
            tot += float(xf.sum()); cnt += x.numel()
            nan += n_nan; inf += n_inf; ninf += n_ninf
            seen = True
        state["neginf"] = ninf   # this op's -Inf (0 without floats): the ops that make -Inf are remembered
        state["amax"] = max(abs(mn), abs(mx)) if seen and not (nan or inf or ninf) else None   # finite outputs only
        state["bad"] = False
        if not seen:
            return False
        bad = state["bad"] = bool(nan or inf or (ninf and current_node() is not None))
        _STATS.pack_into(mm, off + _OFF_STATS, mn, mx, tot / cnt if cnt else 0.0, nan, inf, ninf)
        mm[off + _OFF_FLAGS] = F_STATS | (F_NONFINITE if bad else 0)
        if bad and not state["nonfinite_set"]:
            state["nonfinite_set"] = True
            pack_q(mm, _OFF_NONFINITE, seq)
            return True
        return False

    return compute_stats


# ---------------------------------------------------------------------------------------------- the first NaN

_FWD_MAX = 1 << 18   # forward nodes remembered for backward (a step's graph; older ones are dropped)
SELECTORS = ("where", "masked_fill", "nan_to_num", "index_put")   # ops that replace chosen values of a tensor
SELECT_WITHIN = 16   # ops after a forward NaN/+Inf in which such an op counts as hiding it


def _compiled_ran() -> bool:
    """Whether torch.compile compiled a graph in this process (its code runs unrecorded inside): dynamo's own
    count, read only where the program imported dynamo."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    try:
        return bool(utils is not None and utils.counters["stats"]["unique_graphs"] > 0)
    except Exception:  # noqa: BLE001 - another torch's counters: unknown, said as not compiled
        return False


def first_nan_watch(torch: Any, t: Any, log: Any) -> Any:
    """The stats mode's memory of where each op ran, for the one op that makes the first NaN/+Inf:
    `note(func)` after every op counts its calls per (op, caller's code, instruction) (the op's pass: which
    time that call ran, the training step of a loop's line) and, for a forward op that made an autograd node,
    maps the node's sequence number to that call, so a NaN first made in backward is named with the forward
    line that built the node; `first(func, args, out, seq)` then writes the op, its line, its pass and its
    cause (from its actual inputs) to gpulab.trace.firstnan.path(log), once. Keys hold the op and code
    objects themselves (t, gpulab.trace.texts' namespace, keeps both alive), never string ids, which a wrap of
    the string table reuses."""
    import os
    import sys
    import threading
    import weakref

    from gpulab.trace import firstnan, nancause
    from gpulab.trace.texts import site_label

    current_node = torch._C._current_autograd_node
    seq_nr = torch._C._autograd._get_sequence_nr
    get_ident = threading.get_ident
    getframe = sys._getframe
    counts: dict = {}       # (op, code, instruction) -> calls so far
    peaks: dict = {}        # (op, code, instruction) -> [first pass, its |max|, latest pass, its |max|] of outputs
    now: dict = {}          # thread -> the op it just noted: its key and pass (autograd's threads run ops too)
    neg: dict = {}          # storage -> (its tensor, (op, code, instruction, pass), its input's facts): a log's -Inf
    fwd: dict = {}          # autograd node sequence number -> (op, code, instruction, pass)
    last: dict = {}         # thread -> the sequence number after its newest node
    codes_get, code_kind = t.codes.get, t.code_kind

    def caller() -> Any:
        """The op's caller: the innermost frame outside torch and the recorder (as the call site's)."""
        f = getframe(2)
        while f is not None:
            d = codes_get(id(f.f_code))
            if d is None:
                d = code_kind(f.f_code)
            if d is not True:
                return f
            f = f.f_back
        return None

    def note(func: Any) -> None:
        f = caller()
        key = (func, f.f_code, f.f_lasti) if f is not None else (func, None, -1)
        n = counts.get(key, 0) + 1
        counts[key] = n
        now[get_ident()] = (key, n)
        if current_node() is None:
            tid = get_ident()
            s = seq_nr()
            if s != last.get(tid):   # this op built the node s - 1 (autograd numbers a node before the kernel)
                last[tid] = s
                fwd[s - 1] = (*key, n)
                if len(fwd) > _FWD_MAX:
                    for k in list(fwd)[:_FWD_MAX // 2]:
                        del fwd[k]

    def seen(amax: float | None) -> None:
        """After an op with finite floating outputs: their |max|, kept per call (its first pass and its latest),
        so that an overflow after values grew pass after pass is told from one op's own (gpulab.trace.nancause's
        growth)."""
        if amax is None or not amax > 0.0:
            return
        key, n = now.get(get_ident(), (None, 0))
        got = peaks.get(key)
        if got is None:
            peaks[key] = [n, amax, n, amax]
        else:
            got[2], got[3] = n, amax

    def made_neginf(func: Any, args: Any, out: Any) -> None:
        """After an op whose output holds -Inf: a log of zeros is remembered (where, from what), so that a NaN
        its -Inf makes later (0 * log(0) in a hand-written cross entropy) is not put down to a mask's -Inf.
        An op that passes a remembered -Inf on (`-log(p).mean()`: mean, then neg's +Inf) carries the log's
        memory to its output. Masks are made by other ops (full, where, masked_fill): they are not remembered."""
        if not (args and isinstance(out, torch.Tensor)):
            return
        if not nancause.is_log(str(func)):
            src = next((got for got in map(_remembered, _tensors(args)) if got is not None), None)
            if src is not None:
                _remember(out, *src)
            return
        f = caller()
        key = (func, f.f_code, f.f_lasti) if f is not None else (func, None, -1)
        given = args[1] if nancause.base_name(str(func)) == "xlogy" and len(args) > 1 else args[0]   # log's argument
        _remember(out, (*key, counts.get(key)), nancause.facts_of(given))

    def _remember(out: Any, where: tuple, facts: Any) -> None:
        if len(neg) >= 64:
            neg.pop(next(iter(neg)))
        neg[out.untyped_storage().data_ptr()] = (weakref.ref(out), where, facts)

    def _remembered(value: Any) -> tuple | None:
        got = neg.get(value.untyped_storage().data_ptr())
        return None if got is None or got[0]() is None else got[1:]

    def _tensors(args: Any) -> list:
        flat = [y for x in args for y in (x if isinstance(x, (list, tuple)) else (x,))]
        return [x for x in flat if isinstance(x, torch.Tensor)]

    fresh: dict = {}        # storage address -> (op, code, instruction, pass): an empty()'s memory no op wrote since
    wrote: list = [None]    # the op just run updated such memory in place: (its argument, that memory's entry)
    aliasing: dict = {}     # op -> (arguments it writes, returns a view, returns what it wrote)

    def _aliasing(func: Any) -> tuple:
        """From the op's schema. Only aten's are trusted to say what they write: c10d's collectives write into
        their tensors (broadcast, recv, all-gather into an empty buffer) with no mark of it, and so may another
        library's or an extension's op: each of their tensor arguments counts as written."""
        got = aliasing.get(func)
        if got is None:
            schema = getattr(func, "_schema", None)
            args = getattr(schema, "arguments", ()) or ()
            rets = getattr(schema, "returns", ()) or ()
            trusted = getattr(func, "namespace", None) in ("aten", "prims")
            got = aliasing[func] = (
                tuple(i for i, a in enumerate(args) if (a.alias_info is not None and a.alias_info.is_write)
                      or (not trusted and "Tensor" in str(a.type))),
                trusted and any(r.alias_info is not None and not r.alias_info.is_write for r in rets),
                not trusted or any(r.alias_info is not None and r.alias_info.is_write for r in rets), trusted)
        return got

    def _address(x: Any) -> int | None:
        try:
            return x.untyped_storage().data_ptr()
        except Exception:  # noqa: BLE001 - sparse, nested or fake tensors have no plain storage
            return None

    def allocated(func: Any, out: Any) -> None:
        """After an empty() (empty_like, new_empty, empty_strided): its memory holds a freed block's old bytes
        (NaN among them, often on the CUDA caching allocator) until an op writes it."""
        if "resize_" in str(func):
            return
        key, n = now.get(get_ident(), ((func, None, -1), None))
        for x in _tensors((out,)):
            a = _address(x)
            if a:
                if len(fresh) >= 256:
                    fresh.pop(next(iter(fresh)))
                fresh[a] = (*key, n)

    def unwritten(func: Any, args: Any, out: Any) -> bool:
        """After any other op: True when its output is a view of such memory (DDP's bucket views of its
        gradient buffers): its NaN is those old bytes, no op's fault. An op that writes such memory (in place,
        out=) makes it data; a new output at its address means it was freed and reused."""
        wrote[0] = None
        if not fresh:
            return False
        written, view, writes_out, trusted = _aliasing(func)
        outs = _tensors((out,))
        if written or writes_out:
            for i in written:   # an update in place (add_) of such memory reads its old bytes: kept for first()
                for x in _tensors(args[i:i + 1]):
                    got = fresh.pop(_address(x), None)
                    if got is not None and trusted:
                        wrote[0] = (i, got)
            for x in outs if writes_out else ():
                fresh.pop(_address(x), None)
            return False
        if view:
            return any(_address(x) in fresh for x in outs)
        for x in outs:
            fresh.pop(_address(x), None)
        return False

    def _fresh_of(value: Any) -> dict | None:
        got = fresh.get(_address(value)) if isinstance(value, torch.Tensor) else None
        return None if got is None else _where(got)

    def _where(got: tuple) -> dict:
        fop, code, lasti, n = got
        at, file = site(code, lasti)
        return {"op": str(fop), "call_site": at, "file": file, "pass": n}

    def neginf_from(value: Any) -> dict | None:
        """The remembered log that made value's -Inf (value is its output or a view of it), if any."""
        got = _remembered(value) if isinstance(value, torch.Tensor) else None
        if got is None:
            return None
        (fop, code, lasti, n), facts = got
        at, file = site(code, lasti)
        return {"op": str(fop), "call_site": at, "file": file, "pass": n,
                "zeros": facts.zeros if facts else None, "nonpositive": facts.nonpositive if facts else None}

    def line(code: Any, lasti: int) -> int | None:
        for lo, hi, ln in code.co_lines():
            if lo <= lasti < hi:
                return ln
        return None

    def site(code: Any, lasti: int) -> tuple[str | None, str | None]:
        return (site_label(code, line(code, lasti)), code.co_filename) if code is not None else (None, None)

    def first(func: Any, args: Any, out: Any, seq: int) -> bool:
        """Write the first NaN/+Inf's record; True (nothing written) for an op that only passes on what a
        GradScaler caught (clip_grad_norm_ of the overflowed gradients), so the watch goes on for a real one."""
        if caught and any(_is_caught(x) for x in _tensors(args)):
            for x in _tensors((out,)):   # a tensor or a list of them
                caught[x.untyped_storage().data_ptr()] = weakref.ref(x)
            return True
        try:
            _write(func, args, out, seq)
        except Exception as exc:  # noqa: BLE001 - the recording goes on; the reader says the cause is unknown
            firstnan.write(log, {"seq": seq, "op": str(func), "error": f"{type(exc).__name__}: {exc}"})
        return False

    def _is_caught(x: Any) -> bool:
        got = caught.get(x.untyped_storage().data_ptr())
        return got is not None and got() is not None

    load_file = os.path.join("torch", "serialization.py")

    def loaded_by() -> str | None:
        """'torch.load' when the op runs inside it (a checkpoint's tensors made of the file's bytes): a NaN it
        holds was saved by an earlier run, not made here."""
        f = getframe(2)
        for _ in range(200):
            if f is None:
                return None
            if f.f_code.co_filename.endswith(load_file):
                return "torch.load"
            f = f.f_back
        return None

    def _write(func: Any, args: Any, out: Any, seq: int) -> None:
        node = current_node()
        schema = getattr(func, "_schema", None)
        written = {i for i, a in enumerate(getattr(schema, "arguments", ()) or ())
                   if a.alias_info is not None and a.alias_info.is_write}
        ins = [None if i in written else nancause.facts_of(a) for i, a in enumerate(args)]
        outs = [nancause.facts_of(x) for x in ([out] if isinstance(out, torch.Tensor) else
                                               list(out) if isinstance(out, (list, tuple)) else [])
                if isinstance(x, torch.Tensor) and x.is_floating_point()]
        o = next((f for f in outs if f.nan or f.posinf or (f.neginf and node is not None)),
                 outs[0] if outs else nancause.TensorFacts("?"))
        try:
            top = float(torch.finfo(getattr(torch, o.dtype)).max)
        except (AttributeError, TypeError):
            top = None
        compiled = _compiled_ran()
        why = nancause.cause(str(func), ins, o, top, first=True, compiled=compiled)
        key = now.get(get_ident(), (None,))[0] if node is None else None   # as note() keyed this op
        history = dict(zip(("first_pass", "first", "last_pass", "last"), peaks[key])) if key in peaks else None
        why = nancause.grown(why, str(func), o.dtype, history)
        alloc = _fresh_of(args[why.input]) if why.earlier and why.input is not None and fresh else None
        if alloc is not None:   # it read an empty()'s memory that nothing wrote
            why = nancause.uninitialized(why, str(func), alloc)
        elif why.kind == "unknown" and wrote[0] is not None:   # it updated such memory in place
            why = nancause.uninitialized(why, str(func), _where(wrote[0][1]), written=wrote[0][0])
        loader = loaded_by() if why.earlier else None
        if loader is not None:
            why = nancause.loaded(why, str(func), loader)
        src = neginf_from(args[why.input]) if why.kind == "input_neginf" and why.input is not None else None
        if src is not None:   # the -Inf is a log's of values <= 0, not a mask's
            why = nancause.log_made(why, str(func), src, made="NaN" if o.nan else "+Inf")
        rec = {"seq": seq, "op": str(func), "cause": why.to_dict(), "inputs": [f.to_dict() if f else None for f in ins],
               "neginf_from": src, "history": history,
               "written": sorted(written), "output": o.to_dict(), "backward": node is not None,
               "compiled": compiled, **({"loaded_by": loader} if loader else {})}
        if node is None:
            at, file = site(key[1], key[2]) if key is not None else (None, None)
            rec.update(call_site=at, file=file, **{"pass": counts.get(key)})
        else:
            made = fwd.get(node._sequence_nr())
            rec["backward_node"] = node.name()
            if made is not None:
                fop, code, lasti, n = made
                at, file = site(code, lasti)
                rec.update(forward_op=str(fop), call_site=at, file=file, **{"pass": n})
            else:
                rec.update(forward_op=None, call_site=None, file=None, **{"pass": None})
        if scaler["caught"]:   # what the GradScaler caught before this one, which it did not
            rec["scaler_caught_before"] = {"count": scaler["caught"], "first": scaler["first"]}
        scaler["pending"] = rec
        weights.update(armed=True, finite=False, nan=False)
        hidden["left"], trap["key"] = 0, None   # the where-watch is the record's own: not an earlier record's
        if node is None and key is not None and fwd.get(seq_nr() - 1) == (*key, counts.get(key)):
            # made in forward by an op that built an autograd node (inside the mode no tensor requires grad):
            # watched for a where that hides it
            hidden.update(ptrs={_address(x) for x in _tensors((out,))}, left=SELECT_WITHIN, key=key)
        _put(rec)

    current: dict = {"rec": None}   # the record as last written: what later facts are added to

    def _put(rec: dict) -> None:
        current["rec"] = rec
        firstnan.write(log, rec)

    def _amend(**facts: Any) -> None:
        """Add facts to the written record (one in memory, no read back), the GradScaler's pending one too."""
        rec = {**current["rec"], **facts}
        if scaler["pending"] is current["rec"]:
            scaler["pending"] = rec
        _put(rec)

    weights: dict = {"armed": False, "finite": False, "nan": False}
    Parameter = torch.nn.Parameter
    isfinite = torch.isfinite

    def updated_weights(func: Any, args: Any) -> None:
        """After each op once the first NaN/Inf is recorded: when the op writes a Parameter in place (an
        optimizer's step, load_state_dict's copy), whether what it wrote is finite. The record keeps the first
        update after the NaN (`weights_finite`, said beside 'did not last') and the first that holds NaN/Inf
        (`weights_nan`: the NaN reached the weights, so it lasted: gpulab.trace.firstnan.lasted)."""
        if not weights["armed"] or weights["nan"]:
            return
        targets = _aliasing(func)[0]
        if not targets:
            return
        params = [x for i in targets if i < len(args)
                  for x in (args[i] if isinstance(args[i], (list, tuple)) else (args[i],)) if isinstance(x, Parameter)]
        if not params:
            return
        bad = any(not bool(isfinite(x).all()) for x in params if x.is_floating_point())
        if not bad and weights["finite"]:
            return
        weights["nan" if bad else "finite"] = True
        _amend(**{"weights_nan" if bad else "weights_finite": _here(func)})

    def _here(func: Any) -> dict:
        """The op as a record names it: its name, the caller's line, its pass."""
        f = caller()
        key = (func, f.f_code, f.f_lasti) if f is not None else (func, None, -1)
        return {"op": str(func), "call_site": site(key[1], key[2])[0], "pass": counts.get(key)}

    hidden: dict = {"ptrs": set(), "left": 0, "key": None}   # a forward NaN/Inf a where may hide, for a few ops
    trap: dict = {"key": None}   # a where hid it: is NaN then made in backward at its op's node?

    def selected(func: Any, args: Any, amax: float | None, bad: bool = False) -> None:
        """After an op, within a few ops of a forward NaN/+Inf that autograd tracks: when it is a where
        (masked_fill, nan_to_num, an index_put) that takes that output and leaves no NaN/Inf, the program
        selects the bad values away (`selected_by`); when backward then makes NaN/Inf at that op's own node, the
        where did not stop it: the zero gradient times the op's derivative there, 0 * Inf (the where-gradient
        trap), is what the record's `backward_nan` says was seen."""
        if bad and trap["key"] is not None:
            node = current_node()
            made = fwd.get(node._sequence_nr()) if node is not None else None
            if made is not None and made[:3] == trap["key"]:
                trap["key"] = None
                _amend(selected_by={**current["rec"]["selected_by"], "backward_nan": node.name()})
            return
        if hidden["left"] <= 0:
            return
        hidden["left"] -= 1
        if amax is None or nancause.base_name(str(func)) not in SELECTORS:
            return
        if not any(_address(x) in hidden["ptrs"] for x in _tensors(args)):
            return
        trap["key"], hidden["left"] = hidden["key"], 0
        _amend(selected_by=_here(func))

    scaler = {"pending": None, "caught": 0, "first": None}
    caught: dict = {}       # storage -> its tensor: the gradients a GradScaler found overflowed, and what they made
    check_ops = {id(op) for op in (getattr(getattr(torch.ops.aten, "_amp_foreach_non_finite_check_and_unscale_",
                                                   None), "default", None),) if op is not None}

    def scaler_check(func: Any, args: Any) -> bool:
        """After each op: when it is a GradScaler's check of the gradients (`scaler.step`, `scaler.unscale_`) that
        found Inf/NaN in them, and the first NaN/+Inf was made in backward since the last check, that NaN is the
        scaled gradients' overflow the scaler exists to catch: it skips the step and lowers its scale. The record
        says so (caught_by, how many times), and True re-arms the watch for a NaN the scaler does not catch (in
        forward, or in the weights)."""
        rec = scaler["pending"]
        if id(func) not in check_ops or rec is None or not rec.get("backward") or len(args) < 2:
            return False
        try:
            found = float(args[1].item())
        except Exception:  # noqa: BLE001 - another torch's signature: not judged
            return False
        if not found > 0:
            return False
        scaler["caught"] += 1
        scaler["first"] = scaler["first"] or {k: rec.get(k) for k in ("op", "call_site", "pass", "backward_node")}
        caught.clear()   # the gradients it checked: what reads them before the next step passes the overflow on
        for g in _tensors(args[:1]):   # the gradients it checked (a list)
            caught[g.untyped_storage().data_ptr()] = weakref.ref(g)
        _put({**rec, "caught_by": "GradScaler", "caught": scaler["caught"], "first_caught": scaler["first"]})
        scaler["pending"] = None
        return True

    return SimpleNamespace(note=note, first=first, made_neginf=made_neginf, seen=seen, scaler_check=scaler_check,
                           allocated=allocated, unwritten=unwritten, selected=selected, updated_weights=updated_weights)
