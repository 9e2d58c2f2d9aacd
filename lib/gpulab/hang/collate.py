"""A batch the DataLoader's default collate could not put together: "stack expects each tensor to be equal size".

Why: the op that raised is torch.stack inside torch's collate.py, called from the loop's `for batch in loader`
line, so "PyTorch refused the arguments the program gave it at the for line" points at a line that passes
nothing. The program's part is the Dataset: its samples differ in size, and the default collate_fn can only
stack equal ones. The raised op's shapes show the sizes; the op log shows the Dataset's line that made them.
Pure: text and records in.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Sequence

from gpulab.hang.inplace import field, shapes_of

_COLLATE = re.compile(r'File "[^"]*[/\\]torch[/\\]utils[/\\]data[/\\]_utils[/\\]collate\.py"')
_JOIN_OPS = ("aten.stack", "aten.cat", "aten._stack", "aten._cat")
_MAX_SHAPES = 6


def _loader_next(name: str) -> bool:
    return "DataLoader" in name and "__next__" in name


def find(traceback: str, records: Sequence[Any], raised: Mapping[str, Any] | Any | None, *,
         mine: Callable[[str], bool], worker: str | None = None) -> dict | None:
    """The op the default collate raised in, the sizes it was given, and the program's line that made the
    batch's samples (the last op of the program's own code before it, after the loop asked for the batch; None
    when the log does not show one); None when the traceback does not pass through the default collate or the
    op is not one that joins samples. `mine(call_site)`: whether a call site is the program's; `worker`: the
    DataLoader worker's role where it ran in one."""
    if not passes_through(traceback) or raised is None:
        return None
    name = str(field(raised, "name") or "")
    if not name.startswith(_JOIN_OPS):
        return None
    shapes = shapes_of(raised)
    if not shapes:   # an op dict (the verdict's in-flight op) holds them apart
        shapes = [list(s) for s in field(raised, "shapes") or ()]
    # the recorder keeps a list's first tensors and its length ("L8"): how many samples the batch had
    count = next((int(a["value"][1:]) for a in field(raised, "args") or ()
                  if isinstance(a, Mapping) and re.fullmatch(r"L\d+", str(a.get("value") or ""))), len(shapes))
    seq = field(raised, "seq")
    before = [r for r in records if seq is None or (field(r, "seq") or 0) < seq]
    start = max((i for i, r in enumerate(before) if _loader_next(str(field(r, "name") or ""))), default=-1)
    # ops inside the loop's own fetch carry the loop's line (the recorder's call site of a nested op): no Dataset line
    loop = field(before[start], "call_site") if start >= 0 else None
    made = next((str(field(r, "call_site")) for r in reversed(before[start + 1:])
                 if field(r, "call_site") and field(r, "call_site") != loop and mine(str(field(r, "call_site")))),
                None)
    return {"op": name, "shapes": shapes, "samples": max(count, len(shapes)), "made_at": made, "worker": worker}


def unequal_stack(records: Sequence[Any]) -> Any:
    """The first torch.stack of samples of different sizes in a log: the op that raised "stack expects each tensor
    to be equal size" where the recorder marks no raised op (torch 2.11's CUDA wheel) and the process went on."""
    for r in records:
        if str(field(r, "name") or "").startswith("aten.stack") and len({tuple(x) for x in shapes_of(r)}) > 1:
            return r
    return None


def passes_through(traceback: str) -> bool:
    """Whether a traceback runs through the DataLoader's default collate."""
    return bool(_COLLATE.search(traceback or ""))


def words(found: Mapping[str, Any]) -> str:
    shapes = found["shapes"]
    shown = shapes[:_MAX_SHAPES]
    sizes = " x ".join(str(s) for s in shown) + (
        f", the first {len(shown)} of {found.get('samples')}" if (found.get("samples") or 0) > len(shown) else "")
    where = f" in {found['worker']}" if found.get("worker") else ""
    made = f" (made at {found['made_at']})" if found.get("made_at") else ""
    return (f"the DataLoader's default collate_fn joins one batch's samples with {found['op']}{where}, and this "
            f"batch's samples differ in size ({sizes}): the Dataset returns samples of different sizes{made}; give "
            f"the DataLoader a collate_fn that pads them (torch.nn.utils.rnn.pad_sequence(..., batch_first=True), "
            f"with a mask of the padding), or make every sample one size (crop or pad it in __getitem__)")
