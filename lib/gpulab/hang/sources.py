"""The program's own sources, where it registers custom ops and defines kernels (gpulab.hang.owner.registrations).

A project keeps its ops and kernels in modules of its own: a helper beside the script, a package under it
(`from kernels import attention`), a module of the working directory run with `python -m`. Those are the
program's code as much as the script is, so the script's imports are followed, transitively, to every module
that lives under the script's folder or the working directory (never into an installed package). Bounded: a
folder of data or a huge tree must not cost the verdict.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Sequence

SUFFIXES = (".py", ".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp")
FILES_MAX, BYTES_MAX = 200, 512 << 10
_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+(?P<base>\.*[\w.]*)[ \t]+import[ \t]+(?P<names>\([^)]*\)|[^\n#;]+)"
                     r"|import[ \t]+(?P<mods>[^\n#;]+))", re.M)
_INSTALLED = re.compile(r"[/\\](site|dist)-packages[/\\]")


def imported(text: str) -> list[tuple[int, str, tuple[str, ...]]]:
    """The imports of a module's text: (dots, module, names) per statement; `import a.b as c` is (0, 'a.b', ()),
    `from ..x import y, z` is (2, 'x', ('y', 'z')). Pure."""
    out = []
    for m in _IMPORT.finditer(text):
        if m.group("mods"):
            for part in m.group("mods").split(","):
                name = part.strip().split(" as ")[0].strip()
                if re.fullmatch(r"[\w.]+", name or ""):
                    out.append((0, name, ()))
            continue
        base = m.group("base")
        dots = len(base) - len(base.lstrip("."))
        names = tuple(n.strip().split(" as ")[0].strip() for n in m.group("names").strip("()").split(","))
        out.append((dots, base.lstrip("."), tuple(n for n in names if re.fullmatch(r"\w+", n or ""))))
    return out


def _module_files(root: Path, dotted: str) -> list[Path]:
    """The files a dotted module name means under root: each package's __init__.py on the way, and the module
    itself (mod.py, or mod/__init__.py)."""
    if not dotted:
        return [root / "__init__.py"]
    parts = dotted.split(".")
    out = [root.joinpath(*parts[:i], "__init__.py") for i in range(1, len(parts))]
    out += [root.joinpath(*parts[:-1], parts[-1] + ".py"), root.joinpath(*parts, "__init__.py"),
            root.joinpath(*parts, "__main__.py")]
    return out


def _resolve(here: Path, roots: Sequence[Path], dots: int, module: str, names: Iterable[str]) -> list[Path]:
    """The files under the roots (or, for a relative import, beside `here`) one import statement names."""
    if dots:
        bases = [here.parent.parents[dots - 2] if dots > 1 else here.parent] if dots - 1 < len(here.parents) else []
    else:
        bases = list(roots)
    out = []
    for base in bases:
        for dotted in [module] + [f"{module}.{n}" if module else n for n in names]:
            out += _module_files(base, dotted)
    return out


def _within(path: Path, roots: Sequence[Path]) -> bool:
    return not _INSTALLED.search(str(path)) and any(path == r or r in path.parents for r in roots)


def program(cwd: str | Path, script: str | Path | None = None, module: str | None = None) -> dict[str, str]:
    """{path: text} of the program's own sources: the script (or `-m module`, found under cwd), the source files
    beside it, and the modules it imports, transitively, that live under its folder or cwd."""
    cwd = Path(cwd).resolve()
    if script is None and module:
        found = [p for p in _module_files(cwd, module)[-3:] if p.is_file()]
        script = found[0] if found else None
    if script is None:
        return {}
    script = (cwd / script).resolve() if not Path(script).is_absolute() else Path(script)
    roots = list(dict.fromkeys([script.parent, cwd]))
    try:
        beside = sorted(p for p in script.parent.iterdir() if p.suffix in SUFFIXES and p != script)
    except OSError:
        beside = []
    out: dict[str, str] = {}
    queue = [script, *beside]
    while queue and len(out) < FILES_MAX:
        p = queue.pop(0)
        if str(p) in out:
            continue
        try:
            if not p.is_file() or p.stat().st_size > BYTES_MAX:
                continue
            text = p.read_text(errors="replace")
        except OSError:
            continue
        out[str(p)] = text
        if p.suffix == ".py":
            for dots, mod, names in imported(text):
                queue += [f for f in _resolve(p, roots, dots, mod, names)
                          if str(f) not in out and _within(f, roots)]
    return out
