"""01's rules read the fixes' names and what each changes from the modules' text (gpulab.fixindex, below
gpulab.env); the registry loads the same modules: both must say the same."""
from __future__ import annotations

from gpulab import fixindex
from gpulab.fixes import registry


def test_the_index_says_what_the_registry_loads():
    assert fixindex.names() == registry.names() and len(fixindex.names()) > 5
    assert fixindex.catalog() == registry.catalog()


def test_a_computed_description_falls_back_to_the_docstring(tmp_path, monkeypatch):
    (tmp_path / "team_fix.py").write_text('"""Pin the allocator.\n\nMore."""\nWHAT = "x"\nFIX = make(WHAT)\n')
    (tmp_path / "_helper.py").write_text("")
    monkeypatch.setenv(fixindex.ENV_DIRS, str(tmp_path))
    assert "team_fix" in fixindex.names() and "_helper" not in fixindex.names()
    assert fixindex.catalog()["team_fix"] == "Pin the allocator."
