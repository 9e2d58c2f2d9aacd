"""Where a process's main thread is, in the program's own terms: its faulthandler dump read for the
program's innermost line (not the library frame it waits in), and the program's source read around the
lines that matter (the loop and the function holding each, the one line that calls it). Apart: these read
stack text and source files, never the job's folder or its processes."""
from __future__ import annotations

import ast
import functools
import linecache
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpulab.hang import capture


# ------------------------------------------------------------------------------------ the main thread

@dataclass(frozen=True)
class MainFrame:
    """Where a process's main thread was when its stacks were dumped."""
    where: str | None            # as a person reads it: the program's own line first (see main_frame)
    inner: str | None            # its innermost frame, library or not (what it waits in)
    frames: tuple[str, ...]      # all its frames, innermost first
    own_code: bool = False       # running the program's own code (or the standard library on its behalf)
    own: str | None = None       # the program's innermost own frame, as faulthandler wrote it (full path)


def main_frame(text: str) -> MainFrame:
    """The main thread's place, from a faulthandler dump. Stopped inside the standard library or an installed
    package, the place named is the program's own innermost line, with the library frame after it:
    `dist_job.py:52 in main: `re.match(...)`, inside re/__init__.py:166 in match` says where to look,
    `re/__init__.py:166` alone does not."""
    threads = capture.parse_python(text or "")
    main = next((t for t in threads if t.main), None)
    if main is None or not main.frames:
        return MainFrame(None, None, ())
    origins = [_origin(f) for f in main.frames]
    inner = _where(main.frames[0])
    i = origins.index("own") if "own" in origins else None
    # the program's own code, or the standard library called from it; not torch or another package
    own_code = i is not None and "package" not in origins[:i]
    own = main.frames[i] if i is not None else None
    if i is None or i == 0:
        return MainFrame(inner, inner, main.frames, own_code, own)
    return MainFrame(f"{_where(main.frames[i])}, inside {_where(main.frames[0], quote=False)}", inner, main.frames,
                     own_code, own)


_FRAME = re.compile(r"(?P<func>.*) \((?P<file>.*):(?P<line>\d+)\)$")
_STDLIB = re.compile(r"([/\\]lib[/\\]python\d[\d.]*[/\\])|(^<)")   # <prefix>/lib/python3.X/, frozen modules
_PACKAGES = re.compile(r"[/\\](site|dist)-packages[/\\]")
_GPULAB = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep   # lib/gpulab/


def _origin(frame: str) -> str:
    """Whose code a faulthandler frame runs: "package" (an installed package: torch, numpy, ...; or gpulab),
    "stdlib" (the standard library, frozen modules) or "own" (the program's)."""
    m = _FRAME.match(frame)
    if not m:
        return "own"   # not a file frame: nothing says it is a library's
    path = m.group("file")
    if _PACKAGES.search(path) or path.startswith(_GPULAB):
        return "package"
    return "stdlib" if _STDLIB.search(path) else "own"


def _where(frame: str, quote: bool = True) -> str:
    """'dir/file.py:12 in func: `its line`' from faulthandler's 'func (/path/dir/file.py:12)' (quote=False: no
    source line)."""
    m = _FRAME.match(frame)
    if not m:
        return frame
    parts = m.group("file").split(os.sep)
    where = f"{os.sep.join(parts[-2:])}:{m.group('line')} in {m.group('func')}"
    src = source_line(m.group("file"), int(m.group("line"))) if quote else ""
    return f"{where}: `{src[:80]}`" if src else where


def source_line(path: str, line: int) -> str:
    """The code of a frame's line as a person quotes it: no trailing comment, one space between words."""
    src = re.sub(r"\s+#.*$", "", linecache.getline(path, line).strip())
    return " ".join(src.split())


# ------------------------------------------------------------------------------------ the program's source

_LINE = re.compile(r"^(?P<file>.+\.py):(?P<line>\d+)$")


def _line(site: str) -> str:
    """'dir/train.py:12 in main' (a call site) -> 'dir/train.py:12'."""
    return site.split(" in ", 1)[0].strip()


def _site_of_frame(frame: str) -> str:
    """faulthandler's 'func (/path/dir/train.py:12)' -> 'dir/train.py:12 in func', as a call site reads."""
    m = _FRAME.match(frame or "")
    if not m:
        return ""
    return f"{os.sep.join(m.group('file').split(os.sep)[-2:])}:{m.group('line')} in {m.group('func')}"


def _known_paths(metas: Mapping[int, Mapping[str, Any]], frames: Mapping[int, MainFrame]) -> dict[str, str]:
    """'dir/train.py' (how call sites name a file) -> its full path, from every stack and command line seen."""
    full = set()
    for mf in frames.values():
        for f in mf.frames:
            m = _FRAME.match(f)
            if m and os.path.isabs(m.group("file")):
                full.add(m.group("file"))
    for meta in metas.values():
        for a in meta.get("argv") or ():
            if str(a).endswith(".py"):
                full.add(os.path.join(meta.get("cwd") or "", str(a)))
    return {os.sep.join(p.split(os.sep)[-2:]): p for p in sorted(full)}


def _spans(path: str | None, line: int) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """(the innermost for/while loop holding `line`, the function holding it, or the whole module), each as its
    first and last line, in the source at `path`; (None, None) when the source cannot be read."""
    mtime = _mtime(path)
    if mtime is None:
        return None, None
    loops, funcs, end, _, _ = _blocks(path, mtime)
    if end == 0:
        return None, None

    def inner(spans):
        held = [sp for sp in spans if sp[0] <= line <= sp[1]]
        return min(held, key=lambda sp: sp[1] - sp[0]) if held else None
    return inner(loops), inner(funcs) or (1, end)


def _callers(lines: set[str], paths: Mapping[str, str], depth: int = 4) -> dict[str, str]:
    """'dir/train.py:47' -> the line that calls the function holding it ('dir/train.py:70'), and so on outwards
    (up to `depth` calls): where the program issued a collective from, when its stack has moved on since (NCCL
    returns at launch: the host is elsewhere by the time the collective is seen to hang). Read from the source:
    only a function called from exactly one place in its own file has a caller here."""
    out: dict[str, str] = {}
    todo = [(x, 0) for x in sorted(lines) if _LINE.match(x)]
    while todo:
        line, n = todo.pop()
        if line in out or n >= depth:
            continue
        short, _, num = line.rpartition(":")
        at = _caller(paths.get(short), int(num))
        if at is not None:
            out[line] = f"{short}:{at}"
            todo.append((out[line], n + 1))
    return out


def _caller(path: str | None, line: int) -> int | None:
    """The one line of the file at `path` that calls the function holding `line` (None: at module level, called
    from nowhere or from several places in that file, or the source cannot be read)."""
    mtime = _mtime(path)
    if mtime is None:
        return None
    _, _, _, funcs, calls = _blocks(path, mtime)
    held = [(end - start, name) for start, end, name in funcs if start <= line <= end]
    if not held:
        return None
    sites = calls.get(min(held)[1], ())
    return sites[0] if len(sites) == 1 else None


def loop_of(path: str | None, line: int) -> tuple[int, int] | None:
    """The first and last line of the innermost for/while loop holding `line` in the source at `path`, or None
    (at no loop, or the source cannot be read)."""
    return _spans(path, line)[0]


def _mtime(path: str | None) -> float | None:
    """The source's modification time (what _blocks' cache is keyed on), None when it cannot be read."""
    try:
        return os.stat(path).st_mtime if path else None
    except OSError:
        return None


@functools.lru_cache(maxsize=64)
def _blocks(path: str, mtime: float) -> tuple[tuple, tuple, int, tuple, dict]:
    """(loops, functions, last line, named functions as (first, last line, name), name -> the lines that call
    it) of a source file, from one parse: _spans and _caller read the same files."""
    try:
        text = Path(path).read_text(errors="replace")
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError):
        return (), (), 0, (), {}
    span = lambda n: (n.lineno, n.end_lineno or n.lineno)   # noqa: E731
    nodes = list(ast.walk(tree))
    calls: dict[str, list[int]] = {}
    for n in nodes:
        if isinstance(n, ast.Call):
            f = n.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name:
                calls.setdefault(name, []).append(n.lineno)
    return (tuple(span(n) for n in nodes if isinstance(n, (ast.For, ast.While, ast.AsyncFor))),
            tuple(span(n) for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))),
            max(1, text.count("\n") + 1),
            tuple((*span(n), n.name) for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))),
            {k: tuple(sorted(set(v))) for k, v in calls.items()})


def _line_ops(records: Sequence[Any]) -> dict[str, int]:
    """How many ops each of the program's lines issued (depth 0: what the line called, not what ran inside)."""
    return dict(Counter(_line(r.call_site) for r in records if r.call_site and not getattr(r, "depth", 0)))
