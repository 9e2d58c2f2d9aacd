"""The package's import arrows point one way: `gpulab.cli` dispatches to the commands and nothing below it
imports it back (the input helpers live in gpulab.args), and gpulab.hang (the watchdog) never imports
gpulab.fixes: the callers that know both compose them. Every import counts, a function's lazy one too."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "lib" / "gpulab"


def _modules() -> dict[str, Path]:
    mods = {}
    for f in PKG.rglob("*.py"):
        parts = list(f.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = f
    return mods


def graph() -> dict[str, set[str]]:
    """module -> the gpulab modules it imports (a name imported from a package counts as its submodule
    when there is one), from every import statement at any depth."""
    mods = _modules()

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    g: dict[str, set[str]] = {}
    for mod, f in mods.items():
        pkg = mod if f.name == "__init__.py" else mod.rpartition(".")[0]
        out: set[str | None] = set()
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                out |= {known(a.name) for a in node.names if a.name.split(".")[0] == "gpulab"}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                if base.split(".")[0] != "gpulab":
                    continue
                out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in mods else known(base) for a in node.names}
        g[mod] = {m for m in out if m and m != mod}
    return g


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan): every import cycle is in one."""
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


def test_the_graph_sees_lazy_and_relative_imports():
    g = graph()
    assert "gpulab.chain.commands" in g["gpulab.cli"]          # imported inside a function
    assert "gpulab.args" in g["gpulab.hang.watch"]


def test_no_import_cycle_goes_through_the_cli():
    g = graph()
    bad = [c for c in cycles(g) if "gpulab.cli" in c]
    assert not bad, f"import cycles through gpulab.cli: {bad}"
    assert not [m for m, deps in g.items() if "gpulab.cli" in deps and m != "gpulab.__main__"]


def test_hang_never_imports_fixes():
    up = sorted(f"{m} -> {d}" for m, deps in graph().items() if m.split(".")[:2] == ["gpulab", "hang"]
                for d in deps if d.split(".")[:2] == ["gpulab", "fixes"])
    assert not up, f"gpulab.hang imports gpulab.fixes: {up}"


def test_the_recorder_never_imports_fixes():
    """The recorder (gpulab.trace) sits below the fixes: a recorded child calls their installer by the name its
    parent gives (gpulab.trace.preload), and no import cycle goes through the recorder and the fixes."""
    up = sorted(f"{m} -> {d}" for m, deps in graph().items() if m.split(".")[:2] == ["gpulab", "trace"]
                for d in deps if d.split(".")[:2] == ["gpulab", "fixes"])
    assert not up, f"gpulab.trace imports gpulab.fixes: {up}"
    both = [c for c in cycles(graph()) if any(m.startswith("gpulab.trace") for m in c)
            and any(m.startswith("gpulab.fixes") for m in c)]
    assert not both, both


def test_preload_calls_what_the_parent_names_and_rejects_a_bad_name(monkeypatch):
    from gpulab.trace import preload

    called = []
    monkeypatch.setattr("gpulab.report.progress_log", lambda *a, **k: called.append(a), raising=False)
    assert preload.run({"GPULAB_PRELOAD": ""}) == []
    assert preload.run({preload.ENV: "gpulab.report:progress_log"}) == ["gpulab.report:progress_log"]
    assert called == [()]
    with pytest.raises(ValueError, match="not module:function"):
        preload.run({preload.ENV: "gpulab.report"})


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
