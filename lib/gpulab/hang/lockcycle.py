"""Threads that wait for each other's locks: a lock-order deadlock read from the Python stacks and the sources.

Why: a trainer beside a logging, metrics or checkpoint thread that takes the same two locks in the other order
hangs with no op open and the GPU idle; the stacks show each thread at a `with lock:` line, which alone reads as
"a hang in the program's own code". What makes it a deadlock is what each thread already holds: the `with`
blocks its frames sit inside. A thread waits for the lock its innermost frame's line takes (`with X:` or
`X.acquire()`); it holds those of the `with` statements whose bodies hold its frames' lines. A cycle of waits
for held locks is the finding. Locks are matched by their expression's text (`stats_lock`, `self.lock`): two
objects' `self.lock` would read as one, so the words say "by name". Only the program's own frames are read
(gpulab.hang.owner.origin): a lock the standard library takes inside a Condition or a Queue is no lock of the
program's order. Pure apart from reading the sources.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Callable, Sequence

from gpulab.hang.capture import Thread
from gpulab.hang.owner import origin, short, thread_frames


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


@functools.lru_cache(maxsize=64)
def _tree(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


def _withs(tree: ast.Module) -> list[ast.With | ast.AsyncWith]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.With, ast.AsyncWith))]


def taken_at(tree: ast.Module, line: int) -> str | None:
    """The lock the statement at `line` takes: `with X:` (one item) or `X.acquire(...)`."""
    for n in _withs(tree):
        if n.lineno == line and len(n.items) == 1:
            return ast.unparse(n.items[0].context_expr)
    for n in ast.walk(tree):
        if (isinstance(n, ast.Call) and getattr(n, "lineno", None) == line and isinstance(n.func, ast.Attribute)
                and n.func.attr == "acquire"):
            return ast.unparse(n.func.value)
    return None


def held_at(tree: ast.Module, line: int) -> list[tuple[str, int]]:
    """(lock, the `with` line) of every `with` whose body holds `line`, outermost first."""
    out = []
    for n in _withs(tree):
        body = n.body
        if body and body[0].lineno <= line <= (n.end_lineno or n.lineno) and n.lineno < line:
            out += [(ast.unparse(i.context_expr), n.lineno) for i in n.items]
    return sorted(out, key=lambda h: h[1])


def _state(t: Thread, read: Callable[[str], str | None]) -> dict | None:
    """What one thread waits for and holds, or None when its innermost frame is not the program's taking a lock."""
    every = thread_frames(t)
    if not every or origin(every[0][1])[0] != "program":
        return None
    frames = [(fn, p, int(ln)) for fn, p, ln in every if origin(p)[0] == "program"]
    trees = {p: _tree(src) for p in dict.fromkeys(p for _, p, _ in frames) if (src := read(p))}
    func, path, line = frames[0]
    want = taken_at(trees[path], line) if trees.get(path) else None
    if want is None:
        return None
    holds: dict[str, str] = {}
    for fn, p, ln in frames:
        for lock, at in (held_at(trees[p], ln) if trees.get(p) else ()):
            holds.setdefault(lock, short(p, at, fn))
    name = "the main thread" if t.main else f"the thread running {frames[-1][0]}()"
    return {"thread": name, "waits_for": want, "at": short(path, line, func), "holds": holds}


def find(threads: Sequence[Thread], read: Callable[[str], str | None] = _read) -> dict | None:
    """{"threads": [{thread, waits_for, at, holds: {lock: taken_at}}...], "said": the sentence} of a cycle of
    threads each waiting for a lock the next one holds (one thread: a lock it holds itself), or None."""
    states = [s for s in (_state(t, read) for t in threads) if s]
    ring = _ring(states)
    return {"threads": ring, "said": words(ring)} if ring else None


def _ring(states: list[dict]) -> list[dict] | None:
    """The first cycle of waits for held locks among the threads' states, or None."""
    for s in states:
        if s["waits_for"] in s["holds"]:   # a Lock taken again by the thread that holds it
            return [s]
    for start in range(len(states)):
        path, seen, cur = [], set(), start
        while cur is not None and cur not in seen:
            seen.add(cur)
            path.append(cur)
            want = states[cur]["waits_for"]
            cur = next((j for j, s in enumerate(states) if j != cur and want in s["holds"]), None)
        if cur is not None and cur in path:
            ring = path[path.index(cur):]
            if len(ring) >= 2:
                return [states[i] for i in ring]
    return None


def words(ts: list[dict]) -> str:
    """The cycle's threads in a sentence."""
    parts = []
    if len(ts) == 1:
        s = ts[0]
        return (f"{s['thread']} waits for `{s['waits_for']}` at {s['at']}, which it already holds (taken at "
                f"{s['holds'][s['waits_for']]}; locks matched by name): a threading.Lock is not reentrant, so a "
                f"thread that takes it again waits for itself: use threading.RLock, or release it before")
    for i, s in enumerate(ts):
        nxt = ts[(i + 1) % len(ts)]
        held = nxt["holds"].get(s["waits_for"])
        parts.append(f"{s['thread']} waits for `{s['waits_for']}` at {s['at']}, which {nxt['thread']} holds (taken "
                     f"at {held})")
    return ("; ".join(parts) + ": each waits for a lock another holds (locks matched by name), a lock-order "
            "deadlock: take the locks in one order everywhere, or hold one at a time")
