"""Two runs' records put side by side as a person would: by (op, call site, output, forward/backward) in
order, with a sequence alignment (difflib's matching blocks), so ops only one side runs (another
decomposition, a cast, a compiled region's extern calls) leave gaps instead of shifting every later op. One
computation run by another backend's kernel (CPU's flash attention, CUDA's efficient one) is paired as one op. Pure.

When the call sites do not match at all (the same program under another file name) the runs are aligned by
op sequence alone, and the alignment says so.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

from gpulab.numerics.names import INPUT, computation

MIN_SHARE = 0.2      # below this share of the shorter run matched, the runs are not the same program
LOOSE_SHARE = 0.9    # by occurrence unless that pairs fewer than this share of what op and site alone pair


@dataclass(frozen=True)
class Alignment:
    pairs: tuple[tuple[int, int], ...]   # (position in ref ops, position in cand ops), in order
    ref_ops: int
    cand_ops: int
    by: str                              # "call site" | "op sequence"
    parted: tuple[int, int] | None       # where the runs first go different ways (positions), None if they do not

    @property
    def share(self) -> float:
        return len(self.pairs) / max(1, min(self.ref_ops, self.cand_ops))

    @property
    def aligned(self) -> bool:
        return bool(self.pairs) and self.share >= MIN_SHARE


def ops(records: list[dict]) -> list[dict]:
    """The records of ops (the `<input>` records are what ops read, not ops)."""
    return [r for r in records if r.get("op") != INPUT]


def _key(r: dict, site: bool, npass: bool = False) -> tuple:
    return (computation(r.get("op"), r.get("out")), r.get("site") if site else None, r.get("out"), bool(r.get("bwd")),
            r.get("pass") if npass else None)


def _match(a: list[tuple], b: list[tuple]) -> tuple[list[tuple[int, int]], tuple[int, int] | None]:
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    pairs = [(blk.a + k, blk.b + k) for blk in sm.get_matching_blocks() for k in range(blk.size)]
    parted = None
    for tag, i1, _, j1, _ in sm.get_opcodes():
        if tag != "equal":
            parted = (i1, j1)
            break
    return pairs, parted


def align(ref: list[dict], cand: list[dict]) -> Alignment:
    """ref, cand: the op records of each run (ops()), in order. By occurrence too (the pass: which call from that
    site): a run of one op at one line (an optimizer's add_ per parameter) that the other run interrupts with
    ops of its own would otherwise be matched as the longest common block, shifted (the first parameter's update
    against the fifth's). Where that pairs clearly fewer ops (one run calls an op at a site more often, and every
    later pass shifts), by op and site alone."""
    pairs, parted = _match([_key(r, True, True) for r in ref], [_key(r, True, True) for r in cand])
    if len(pairs) < LOOSE_SHARE * min(len(ref), len(cand)):   # else no loose matching can pair clearly more
        loose, loose_parted = _match([_key(r, True) for r in ref], [_key(r, True) for r in cand])
        if len(pairs) < LOOSE_SHARE * len(loose):
            pairs, parted = loose, loose_parted
    out = Alignment(tuple(pairs), len(ref), len(cand), "call site", parted)
    if out.share < MIN_SHARE and ref and cand:
        p2, parted2 = _match([_key(r, False) for r in ref], [_key(r, False) for r in cand])
        alt = Alignment(tuple(p2), len(ref), len(cand), "op sequence", parted2)
        if alt.share >= 0.8:
            return alt
    return out
