"""The line of a failed program's output that says why it failed.

Why not simply its last line: a launcher prints its own summary after the error (torchrun ends with a rule of
'=' and the rank's exit code, multiprocessing with its traceback's frames), and the last line then says nothing.
The last exception line wins ("RuntimeError: ...", torchrun's "[rank0]: RuntimeError: ..."), else the last line
that is not a rule.
"""
from __future__ import annotations

import re

_EXCEPTION = re.compile(r"^(?:\[rank\d+\]:\s*)?(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|"
                        r"Failure|Warning)\b(?::|$)")
_RULE = re.compile(r"^[\s=\-*_#~.]*$")


_RANK = re.compile(r"^\[(?:rank|default)\d+\]:\s?")
_FRAME = re.compile(r'^\s+File "')
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(?::\s|:?$)")   # an exception's name, then its message if any


def of(text: str) -> str:
    """The line that says why, stripped ('' when the output has none)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    said = next((ln for ln in reversed(lines) if _EXCEPTION.match(ln) and not _chained(ln)), "")
    return said or _after_traceback(text) or next((ln for ln in reversed(lines) if not _RULE.match(ln)), "")


def _after_traceback(text: str) -> str:
    """The exception line of the last traceback: the first unindented line after its frames (a tail may have lost
    the traceback's header). An exception whose name says no Error (torch._dynamo.exc.Unsupported, bdb.BdbQuit)
    is still the why, where the text after it (dynamo's hints, its 'Set TORCHDYNAMO_VERBOSE=1' line) is not."""
    said, in_frames = "", False
    for ln in text.splitlines():
        ln = _RANK.sub("", ln)
        if _FRAME.match(ln):
            in_frames = True
        elif in_frames and ln.strip() and not ln[0].isspace():
            in_frames = False
            if _RAISED.match(ln) and not _chained(ln):   # not a line of prose after a frame (dynamo's "Set ...")
                said = ln.strip()
    return said


def _chained(line: str) -> bool:
    """torchrun's own ChildFailedError repeats that a child failed, not why."""
    return "ChildFailedError" in line


# a number printed as Python and torch print a non-finite one: nan, inf, -inf, tensor(nan), loss=nan; not a word
# that holds one (info, w-nan)
_NONFINITE = re.compile(r"(?<![\w.])[-+]?(?<!\w-)(?<!\w\+)(?:nan|inf)(?![\w-])", re.IGNORECASE)


def nonfinite(text: str) -> str:
    """The first line of a program's output that prints a NaN or an infinity ('' when none does): a run that
    ended well may still have trained on NaN, and the recorder reads no values outside stats mode."""
    return next((ln.strip()[:200] for ln in text.splitlines() if _NONFINITE.search(ln)), "")
