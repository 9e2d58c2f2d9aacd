"""Which forward line carries an earlier step's graph: autograd's "backward through the graph a second time"
error, read against the op log.

Why: PyTorch's message suggests retain_graph=True, which is rarely the fix: the usual cause is a tensor computed
in an earlier step (an RNN's hidden state, a running sum of losses, a cached embedding) that this step's loss
still depends on, so backward walks into the graph the earlier backward() freed. The node it raised in is
named in the op log; the forward op that builds such nodes, and the line it ran at, say which tensor that is.
Pure: text and records in.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from gpulab.hang.inplace import BACKWARD, COMPILED_REGION, field, forward_ops

_SECOND_TIME = "Trying to backward through the graph a second time"


def _node(name: str) -> str | None:
    """'autograd::engine::evaluate_function: TanhBackward0' -> 'TanhBackward0'."""
    head, _, node = name.partition(": ")
    if head != BACKWARD:
        return None
    node = node.strip()
    return node if re.fullmatch(r"\w+?Backward\d*", node) else None


def find(message: str, records: Sequence[Any], raised: Mapping[str, Any] | None) -> dict | None:
    """The backward node that met the freed graph, the forward line(s) whose op makes such nodes (with how often it
    ran there, and whether it ran again since the backward() before), and which backward() call this was; None when
    the message is not autograd's or the log does not show them."""
    if _SECOND_TIME not in (message or ""):
        return None
    if not raised:   # torch 2.11's CUDA wheels mark no engine node as raised: the node met is the log's last one
        raised = next((r for r in sorted(records, key=lambda r: -(field(r, "seq") or 0))
                       if str(field(r, "name") or "").startswith(BACKWARD)), None)
        if raised is None:
            return None
    node = _node(str(field(raised, "name") or ""))
    site = field(raised, "call_site")
    if node is None or not site:
        return None
    upto = field(raised, "seq")
    recs = [r for r in sorted(records, key=lambda r: field(r, "seq") or 0)
            if upto is None or (field(r, "seq") or 0) <= upto]
    names = forward_ops(node)
    # forward line -> [runs in all, runs since the last backward(), the same as counted when this one began]
    runs: dict[str, list[int]] = {}
    calls, inside = 0, None           # backward() calls: runs of engine records, each from one line
    traced = _compile_traces(recs)
    for i, r in enumerate(recs):
        name = str(field(r, "name") or "")
        at = field(r, "call_site")
        if i in traced:
            continue
        if name.startswith(BACKWARD):
            if inside != at:
                calls += 1
                for n in runs.values():
                    n[1:] = [0, n[1]]
            inside = at
        elif at != inside:
            # a top-level op at another line ends the backward() call; the ops a node runs inside it (a compiled
            # backward's, whose call site may name generated code) do not, and are no forward op
            if not field(r, "depth"):
                inside = None
            if inside is None and name.startswith(names) and at:
                n = runs.setdefault(at, [0, 0, 0])
                n[0] += 1
                n[1] += 1
    if not runs or calls < 2:
        return None
    made = sorted(((at, n[0], n[2]) for at, n in runs.items()), key=lambda x: -x[1])
    older = [m for m in made if not m[2]]
    if older:   # a line that ran again since the backward() before makes fresh nodes: the met node is the others'
        made, how = older, "shared"
    else:       # every line ran again: the met node is an older one of one of them
        how = "carried" if len(made) == 1 else "either"
    return {"node": node, "backward_at": site, "backward_call": calls, "made_at": made, "how": how}


def _compile_traces(recs: Sequence[Any]) -> set[int]:
    """The indices of engine records that torch.compile made while compiling (AOTAutograd traces the joint graph
    through autograd's engine, at the line that calls the compiled code, before the region runs): a run of them
    is followed by that line's region record before any other engine record. They are no backward() call (a
    backward() on the very line that calls the compiled code looks the same, and is not counted either)."""
    marks = [(i, str(field(r, "name") or "").startswith(BACKWARD), field(r, "call_site")) for i, r in enumerate(recs)
             if str(field(r, "name") or "").startswith((BACKWARD, COMPILED_REGION))]
    out: set[int] = set()
    k = 0
    while k < len(marks):
        if not marks[k][1]:
            k += 1
            continue
        line, end = marks[k][2], k
        while end + 1 < len(marks) and marks[end + 1][1] and marks[end + 1][2] == line:
            end += 1
        after = marks[end + 1] if end + 1 < len(marks) else None
        if after is not None and not after[1] and after[2] == line:
            out.update(m[0] for m in marks[k:end + 1])
        k = end + 1
    return out


_HOW = {
    "carried": "it ran again since the backward() before, so the node met is an older one: a tensor computed there "
               "in an earlier step is part of this step's graph (a state carried across steps: an RNN's hidden "
               "state, a running total of losses): detach it where the step begins (h = h.detach()), or add up "
               "loss.item() instead of the loss",
    "shared": "a tensor computed there before the backward() before is used again after that backward() freed its "
              "graph (a batch two losses share, as a GAN's generated batch; a tensor computed once, before the "
              "loop): detach it for the loss that must not reach it (D(fake.detach())), compute it again, or add "
              "the losses and call backward() once",
    "either": "a tensor computed there before an earlier backward() is part of this backward()'s graph: a state "
              "carried across steps (detach it where the step begins) or a tensor two losses share (detach it for "
              "one of them, or add the losses and call backward() once)",
}


def words(found: Mapping[str, Any]) -> str:
    sites = found["made_at"]
    where = (f"at {sites[0][0]} ({_times(sites[0][1])})" if len(sites) == 1 else
             "at one of " + ", ".join(f"{s} ({_times(n)})" for s, n, _ in sites))
    made = ("the torch.compile'd region that made it" if found["node"].startswith("CompiledFunctionBackward")
            else "its forward op")
    return (f"backward() at {found['backward_at']} (the run's backward() call {found['backward_call']}) reached "
            f"{found['node']}, a node whose saved values an earlier backward() freed; {made} ran {where}: "
            f"{_HOW[found['how']]}; retain_graph=True would keep the earlier graph alive, growing memory and time "
            f"step after step")


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"
