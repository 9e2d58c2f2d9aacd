"""The observer's sources are split by concern (observer.cpp includes its parts, observer_*.h): every file the
build reads must feed the cache key, or an edit to one part would load a stale observer; and an installed wheel
must carry every part, or the build fails on a user's machine."""
from __future__ import annotations

import fnmatch
import re
import shutil
import tomllib
from pathlib import Path

import pytest

from gpulab.trace import native

ROOT = Path(__file__).resolve().parents[1]
NATIVE = Path(native.__file__).resolve().parent


def _included(path: Path, seen: set[Path]) -> set[Path]:
    """The files of this folder that `path` includes, directly or through another."""
    for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), re.M):
        part = path.with_name(name)
        assert part.exists(), f"{path.name} includes {name}, which is not in {path.parent}"
        if part not in seen:
            seen.add(part)
            _included(part, seen)
    return seen


def test_every_file_the_observer_build_reads_feeds_its_cache_key():
    sources = set(native.observer_sources())
    assert all(p.exists() for p in sources)
    read = {native.OBSERVER, native.FRAMES} | _included(native.OBSERVER, set()) | _included(native.FRAMES, set())
    assert read - sources == set(), "read by the build but not in the cache key"
    parts = {p.name for p in sources}
    assert {"observer_callbacks.h", "observer_gpu.h", "observer_frames.h"} <= parts   # split by concern


def test_an_edit_to_any_part_rebuilds_the_observer(tmp_path, monkeypatch):
    """Each source, changed by one comment, gives the observer another artifact (so it is built again)."""
    for p in native.observer_sources():
        shutil.copy2(p, tmp_path / p.name)
    for name in ("OBSERVER", "FRAMES", "HEADER"):
        monkeypatch.setattr(native, name, tmp_path / getattr(native, name).name)
    before = native.observer_artifact()
    if before is None:
        pytest.skip("torch is not importable: no observer to build")
    for p in native.observer_sources():
        text = p.read_text()
        p.write_text(text + "\n/* edited */\n")
        assert native.observer_artifact() != before, f"an edit to {p.name} does not rebuild the observer"
        p.write_text(text)
        assert native.observer_artifact() == before


def test_an_installed_wheel_carries_every_native_source():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["gpulab"]
    for f in NATIVE.iterdir():
        if f.is_file() and f.suffix != ".py" and f.suffix != ".pyc":
            rel = f"trace/native/{f.name}"
            assert any(fnmatch.fnmatch(rel, pat) for pat in data), f"{rel} is not in pyproject's package-data"
