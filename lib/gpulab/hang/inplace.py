"""Which in-place op broke backward: autograd's "modified by an inplace operation" error, read against the op log.

Why: PyTorch's message names only the saved tensor's shape, its version and the node that saved it, and hints
at anomaly mode (a rerun under a slower mode). The recorder already holds the forward op that made the tensor
and every in-place op after it: the one to change is the in-place op on a tensor of that shape between the two,
which is the program's line to fix, not the backward() call the traceback ends in. Pure: text and records in.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

_MODIFIED = re.compile(r"modified by an inplace operation: \[(?P<type>[\w.]+) \[(?P<shape>[\d, ]*)\]\], which is "
                       r"output (?P<out>\d+) of (?P<node>\w+?)(?:Backward\d*)?, is at version (?P<now>\d+); "
                       r"expected version (?P<then>\d+)")
BACKWARD = "autograd::engine::evaluate_function"   # the name of a backward node's record: "...: TanhBackward0"


# a torch.compile'd region's backward is one node for the whole region; its forward is the region's record
_COMPILED_NODE, COMPILED_REGION = "CompiledFunctionBackward", "Torch-Compiled Region"


def forward_ops(node: str) -> tuple[str, ...]:
    """The name prefixes of the forward op that makes an autograd node: NativeLayerNormBackward0 ->
    aten.native_layer_norm. and aten._native_layer_norm. (aten spells some ops with a leading underscore);
    CompiledFunctionBackward -> the compiled region's record ("Torch-Compiled Region: 0/1")."""
    if re.fullmatch(rf"{_COMPILED_NODE}\d*", node):
        return (COMPILED_REGION,)
    op = re.sub(r"(?<!^)(?=[A-Z])", "_", re.sub(r"Backward\d*$", "", node)).lower()
    return f"aten.{op}.", f"aten._{op}."


def field(rec: Any, key: str) -> Any:
    """A record's field, whether the record is an OpRecord or its dict."""
    return rec.get(key) if isinstance(rec, Mapping) else getattr(rec, key, None)


def shapes_of(rec: Any) -> list[list[int]]:
    """The shapes of a record's tensor arguments, in order."""
    return [list(a["shape"]) for a in field(rec, "args") or () if isinstance(a, Mapping) and "shape" in a]


def _first_shape(rec: Any) -> list[int] | None:
    return next(iter(shapes_of(rec)), None)


def _inplace(name: str) -> bool:
    """aten.add_.Tensor, aten.mul_.Scalar: the op's own name ends in an underscore."""
    parts = name.split(".")
    return len(parts) >= 2 and parts[0] == "aten" and parts[1].endswith("_") and not parts[1].startswith("_")


def find(message: str, records: Sequence[Any]) -> dict | None:
    """The forward op that saved the tensor and the in-place op(s) that changed it after, from the op log; None
    when the message is not autograd's or the log does not show them."""
    m = _MODIFIED.search(message or "")
    if not m:
        return None
    shape = [int(x) for x in m.group("shape").replace(" ", "").split(",") if x]
    names = forward_ops(m.group("node"))
    recs = sorted(records, key=lambda r: field(r, "seq") or 0)
    start = next((i for i, r in enumerate(recs) if str(field(r, "name") or "").startswith(BACKWARD)), len(recs))
    made = None
    for i in range(start - 1, -1, -1):
        if str(field(recs[i], "name") or "").startswith(names):
            made = i
            break
    if made is None:
        return None
    changed = [r for r in recs[made + 1:start] if _inplace(str(field(r, "name") or "")) and _first_shape(r) == shape]
    if not changed:
        return None
    top = min(field(r, "depth") or 0 for r in changed)   # relu_ runs clamp_min_ inside it: the outer op is the call
    changed = [r for r in changed if (field(r, "depth") or 0) == top]
    fwd = recs[made]
    return {"tensor": f"{m.group('type')} {shape}", "node": m.group("node"),
            "made_by": field(fwd, "name"), "made_at": field(fwd, "call_site"),
            "changed_by": [{"op": field(r, "name"), "at": field(r, "call_site")} for r in changed],
            "versions": (int(m.group("then")), int(m.group("now")))}


def words(found: Mapping[str, Any]) -> str:
    ch = found["changed_by"]
    return (f"backward needed the {found['tensor']} tensor that {found['made_by']} made at {found['made_at']} as it "
            f"was, and the program changed it in place after: "
            + ", ".join(f"{c['op']} at {c['at']}" for c in ch)
            + f" (version {found['versions'][0]} -> {found['versions'][1]}): write that op out of place "
              f"(x = x + 1 instead of x += 1; inplace=False for an nn.ReLU or Dropout) or apply it to a clone")
