"""The package's import arrows point one way (docs/architecture.md, "Layer order"): every import statement is
read (a function's lazy one too; `if TYPE_CHECKING:` blocks are left out, they never run), and the suite fails
on a cycle between files, a cycle between packages, an import against the layer order, or a module that
imports its own package's `__init__`. Each failure names the file and line of the offending import."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "lib" / "gpulab"

# The written order, lowest first (the same as docs/architecture.md): a module may import its own layer's
# packages and any lower layer, never a higher one. "*" is every root module not named elsewhere (the process
# core: proc, pool, beat, report, device, workloads, stats, fixindex, ...). Nodes are gpulab's subpackages and
# root modules; `recorded` (a program's attention calls, read from 02's op log) reads the recorder's log.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("*",),
    ("trace", "recorded"),
    ("env",),
    ("hang",),
    ("fixes",),
    ("oracle", "bench", "numerics"),
    ("chain",),
    ("cli", "__main__"),
)

# Known offenders waiting for another change, each an edge ("importer", "imported"): left out of every rule,
# never silently (test_pending_offenders_still_exist fails once one is gone). Keep it empty.
PENDING: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Edge:
    """One import: `src` imports `dst` at `file:line`; `via_init` when `dst` is a package's __init__ (a name
    taken from it, or the package itself), not a module of it."""
    src: str
    dst: str
    file: str
    line: int
    via_init: bool

    def where(self) -> str:
        return f"{self.file}:{self.line}: {self.src} imports {self.dst}"


def _modules(root: Path) -> dict[str, Path]:
    mods = {}
    for f in root.rglob("*.py"):
        parts = list(f.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = f
    return mods


def _left_out(test: ast.expr) -> bool:
    """`if TYPE_CHECKING:` never runs; `if __name__ == "__main__":` runs only in the file run as the program,
    module `__main__`, which nothing imports, so its imports cannot close a cycle (python -m gpulab.workloads)."""
    text = ast.unparse(test)
    return "TYPE_CHECKING" in text or text in ("__name__ == '__main__'", "'__main__' == __name__")


def _statements(tree: ast.AST):
    """Every import statement at any depth, leaving out the bodies _left_out names."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _left_out(node.test):
            yield from (s for n in node.orelse for s in _statements_of(n))
            continue
        yield from _statements_of(node)


def _statements_of(node: ast.AST):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        yield from _statements(node)


def edges(root: Path = PKG) -> list[Edge]:
    """Every import from one module of the package at `root` to another (a name imported from a package counts
    as its submodule when there is one, else as the package's __init__)."""
    mods = _modules(root)
    top = root.name

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    out: list[Edge] = []
    for mod, f in sorted(mods.items()):
        pkg = mod if f.name == "__init__.py" else mod.rpartition(".")[0]
        rel = str(f.relative_to(PKG.parents[1] if f.is_relative_to(PKG.parents[1]) else root.parent))
        for node in _statements(ast.parse(f.read_text(), str(f))):
            found: list[str | None] = []
            if isinstance(node, ast.Import):
                found = [known(a.name) for a in node.names if a.name.split(".")[0] == top]
            else:
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                if base.split(".")[0] != top:
                    continue
                found = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else known(base) for a in node.names]
            out += [Edge(mod, d, rel, node.lineno, mods[d].name == "__init__.py")
                    for d in dict.fromkeys(found) if d and d != mod]
    return list(dict.fromkeys(out))


def node_of(mod: str) -> str:
    """The package-level node: gpulab.X for a subpackage's module, the root module itself otherwise."""
    parts = mod.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else mod


def layer_of(mod: str, layers=LAYERS) -> int:
    name = node_of(mod).partition(".")[2]
    for i, names in enumerate(layers):
        if name in names:
            return i
    return next(i for i, names in enumerate(layers) if "*" in names)


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan): every import cycle is in one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def _cycle_lines(es: list[Edge], key) -> list[str]:
    """The imports that make each cycle of the graph `key` draws over the edges, by file and line."""
    g: dict[str, set[str]] = {}
    for e in es:
        if key(e.src) != key(e.dst):
            g.setdefault(key(e.src), set()).add(key(e.dst))
    bad = []
    for comp in cycles(g):
        inside = set(comp)
        bad.append(f"cycle {' <-> '.join(comp)}: " + "; ".join(
            e.where() for e in es if key(e.src) in inside and key(e.dst) in inside and key(e.src) != key(e.dst)))
    return bad


def file_cycles(es: list[Edge]) -> list[str]:
    return _cycle_lines(es, lambda m: m)


def package_cycles(es: list[Edge]) -> list[str]:
    return _cycle_lines(es, node_of)


def upward(es: list[Edge], layers=LAYERS) -> list[str]:
    return [f"{e.where()} (layer {layer_of(e.src, layers)} imports layer {layer_of(e.dst, layers)})"
            for e in es if layer_of(e.dst, layers) > layer_of(e.src, layers)]


def own_init(es: list[Edge], top: str = "gpulab") -> list[str]:
    """A module that takes names from its own package's __init__ (which imports the module back, or may). The
    top package's __init__ is left out: it imports nothing (test_the_top_init_imports_nothing), it only names
    the subpackages `import gpulab` loads on first use."""
    return [e.where() + " (its own package's __init__)" for e in es
            if e.via_init and e.dst != top and e.src.rpartition(".")[0] == e.dst]


def checked() -> list[Edge]:
    return [e for e in edges() if (e.src, e.dst) not in PENDING]


def test_the_graph_sees_lazy_and_relative_imports():
    es = edges()
    dst = {(e.src, e.dst) for e in es}
    assert ("gpulab.cli", "gpulab.chain.commands") in dst          # imported inside a function
    assert ("gpulab.hang.watchdog.watch", "gpulab.args") in dst


def test_no_cycle_between_files():
    bad = file_cycles(checked())
    assert not bad, "\n".join(bad)


def test_no_cycle_between_packages():
    bad = package_cycles(checked())
    assert not bad, "\n".join(bad)


def test_imports_follow_the_layer_order():
    bad = upward(checked())
    assert not bad, "\n".join(bad)


def test_no_module_imports_its_own_package_init():
    bad = own_init(checked())
    assert not bad, "\n".join(bad)


def test_the_top_init_imports_nothing():
    assert not [e.where() for e in edges() if e.src == "gpulab"]


def test_only_the_entry_point_imports_the_cli():
    bad = [e.where() for e in checked() if e.dst == "gpulab.cli" and e.src != "gpulab.__main__"]
    assert not bad, "\n".join(bad)


def test_pending_offenders_still_exist():
    """An entry of PENDING that no longer imports upward is removed from the set (the rule then holds for it)."""
    stale = PENDING - {(e.src, e.dst) for e in edges()}
    assert not stale, f"PENDING holds imports that are gone, remove them: {sorted(stale)}"


def test_every_layer_name_is_a_package_or_module():
    names = {p.stem if p.suffix else p.name for p in PKG.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    unknown = {n for names_ in LAYERS for n in names_ if n != "*"} - names
    assert not unknown, unknown


def test_the_architecture_doc_writes_the_same_order():
    """docs/architecture.md's "Layer order" table: row i names exactly the packages of LAYERS[i]."""
    text = (PKG.parents[1] / "docs" / "architecture.md").read_text()
    section = text.split("## Layer order", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| ") and r[2].isdigit()]
    assert len(rows) == len(LAYERS), rows
    for i, (row, names) in enumerate(zip(rows, LAYERS)):
        said = set(re.findall(r"`gpulab\.(\w+)`", row))
        assert row.startswith(f"| {i} ") and said == set(names) - {"*"}, (row, names)


# gpulab.hang's three groups, lowest first, over the evidence and judgement they share (hang's own modules:
# capture, classify, verdict, owner, sources, memcheck, faults): a job's processes are read without the
# watchdog, the watchdog judges a job through them, the investigation (notebook 03) drives the watchdog.
HANG_GROUPS: tuple[str, ...] = ("", "jobs", "watchdog", "investigation")


def hang_group(mod: str) -> int | None:
    parts = mod.split(".")
    if parts[:2] != ["gpulab", "hang"]:
        return None
    sub = parts[2] if len(parts) > 3 else ""
    return HANG_GROUPS.index(sub) if sub in HANG_GROUPS else 0


def hang_upward(es: list[Edge]) -> list[str]:
    return [f"{e.where()} (hang group {HANG_GROUPS[hang_group(e.src)] or 'hang'} imports "
            f"{HANG_GROUPS[hang_group(e.dst)] or 'hang'})" for e in es
            if hang_group(e.src) is not None and hang_group(e.dst) is not None
            and hang_group(e.dst) > hang_group(e.src)]


def test_hang_is_three_groups_over_its_shared_judgement():
    groups = {p.name for p in (PKG / "hang").iterdir() if (p / "__init__.py").exists()}
    assert groups == set(HANG_GROUPS) - {""}, groups
    bad = hang_upward(checked())
    assert not bad, "\n".join(bad)


def test_an_import_against_hangs_groups_is_named():
    es = [Edge("gpulab.hang.jobs.jobread", "gpulab.hang.watchdog.watch", "lib/gpulab/hang/jobs/jobread.py", 7, False),
          Edge("gpulab.hang.investigation.ladder", "gpulab.hang.watchdog.watch", "x.py", 1, False)]
    assert hang_upward(es) == ["lib/gpulab/hang/jobs/jobread.py:7: gpulab.hang.jobs.jobread imports "
                               "gpulab.hang.watchdog.watch (hang group jobs imports watchdog)"]


def test_preload_calls_what_the_parent_names_and_rejects_a_bad_name(monkeypatch):
    from gpulab.trace import preload

    called = []
    monkeypatch.setattr("gpulab.report.progress_log", lambda *a, **k: called.append(a), raising=False)
    assert preload.run({"GPULAB_PRELOAD": ""}) == []
    assert preload.run({preload.ENV: "gpulab.report:progress_log"}) == ["gpulab.report:progress_log"]
    assert called == [()]
    with pytest.raises(ValueError, match="not module:function"):
        preload.run({preload.ENV: "gpulab.report"})


# Each rule catches a synthetic offender: a small package written to tmp_path, read by the same functions.

def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "gpulab"
    for name, text in files.items():
        f = root / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    for d in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        (d / "__init__.py").touch()
    return root


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_a_file_cycle_is_named_by_file_and_line(tmp_path):
    root = _package(tmp_path, {"trace/a.py": "import os\nfrom gpulab.trace import b\n",
                               "trace/b.py": "def f():\n    from . import a\n"})
    bad = file_cycles(edges(root))
    assert len(bad) == 1 and "gpulab/trace/a.py:2" in bad[0] and "gpulab/trace/b.py:2" in bad[0], bad


def test_a_package_cycle_is_found_between_root_modules(tmp_path):
    root = _package(tmp_path, {"one.py": "from gpulab import two\n", "two.py": "\n\nimport gpulab.one\n"})
    bad = package_cycles(edges(root))
    assert len(bad) == 1 and "gpulab/two.py:3" in bad[0], bad
    root2 = _package(tmp_path / "x", {"oracle/a.py": "from gpulab.bench import b\n",
                                      "bench/b.py": "from gpulab.oracle import c\n", "oracle/c.py": ""})
    assert file_cycles(edges(root2)) == [] and len(package_cycles(edges(root2))) == 1


def test_an_upward_import_is_named(tmp_path):
    root = _package(tmp_path, {"env/rules.py": "def f():\n    from gpulab.fixes import registry\n",
                               "fixes/registry.py": "from gpulab.env import rules\n", "proc.py": ""})
    bad = upward(edges(root))
    assert bad == ["gpulab/env/rules.py:2: gpulab.env.rules imports gpulab.fixes.registry (layer 2 imports layer 4)"]


def test_type_checking_imports_are_left_out(tmp_path):
    root = _package(tmp_path, {"trace/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                             "    from gpulab.hang import v\nelse:\n    from gpulab import proc\n",
                               "hang/v.py": "", "proc.py": ""})
    assert {(e.src, e.dst) for e in edges(root)} == {("gpulab.trace.a", "gpulab.proc")}


def test_a_module_importing_its_own_init_is_named(tmp_path):
    root = _package(tmp_path, {"fixes/compose.py": "from gpulab.fixes import registry\nfrom gpulab.fixes import Fix\n",
                               "fixes/registry.py": "", "oracle/x.py": "from . import Thing\n",
                               "env/cli.py": "import os\nfrom gpulab import env, proc\n", "proc.py": ""})
    bad = own_init(edges(root))
    assert bad == ["gpulab/env/cli.py:2: gpulab.env.cli imports gpulab.env (its own package's __init__)",
                   "gpulab/fixes/compose.py:2: gpulab.fixes.compose imports gpulab.fixes (its own package's __init__)",
                   "gpulab/oracle/x.py:1: gpulab.oracle.x imports gpulab.oracle (its own package's __init__)"], bad
