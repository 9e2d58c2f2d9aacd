"""The on-disk form of a fingerprint record: one JSON line per record, written by the recorded child
(gpulab.numerics.fingerprints) and read back by `gpulab compare` (compare.read_records).

Why not json.dumps of the record: the recorder writes a line per op of a training step while the program runs,
and formatting the 32 sample floats as decimal text cost more than the rest of a record (about 100 us of the
130 us json.dumps took here). The sample travels as the base64 of its float64 bytes ("s64"), exact and
cheap; the line's other fields are formatted directly, strings escaped once per distinct string.
"""
from __future__ import annotations

import base64
import json
import math
import struct

_ESCAPED: dict[str, str] = {}


def _s(text: str) -> str:
    got = _ESCAPED.get(text)
    if got is None:
        got = json.dumps(text)
        if len(_ESCAPED) < 100_000:
            _ESCAPED[text] = got
    return got


def _f(x: float) -> str:
    """A float as JSON writes it (json's NaN/Infinity, as json.dumps does)."""
    if math.isfinite(x):
        return repr(x)
    return "NaN" if x != x else ("Infinity" if x > 0 else "-Infinity")


def line(index: int, op: str, site: str, npass: int, bwd: bool, out: int, ins: list, red: int, dtype: str,
         shape: list, n: int, dev: str, figures: list, sample: bytes, ints: list) -> str:
    """One record's line: figures = (sum, abs-sum, max-abs), sample = its float64 bytes, ints = (checksum, NaN
    count, Inf count)."""
    return (f'{{"i":{index},"op":{_s(op)},"site":{_s(site)},"pass":{npass},"bwd":{"true" if bwd else "false"},'
            f'"out":{out},"in":{ins!r},"k":{red},"dtype":"{dtype}","shape":{shape!r},"n":{n},"device":"{dev}",'
            f'"sum":{_f(figures[0])},"asum":{_f(figures[1])},"amax":{_f(figures[2])},'
            f'"s64":"{base64.b64encode(sample).decode()}","ck":{ints[0]},"nan":{ints[1]},"inf":{ints[2]}}}')


def decode(record: dict) -> dict:
    """A record as read from its line, its sample as floats again (records without "s64" are returned as they
    are)."""
    s64 = record.pop("s64", None)
    if s64 is not None:
        raw = base64.b64decode(s64)
        record["sample"] = list(struct.unpack(f"<{len(raw) // 8}d", raw))
    return record
