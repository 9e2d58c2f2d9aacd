"""Shared test setup: GPU tests skip without a GPU; no test may leave a child process behind."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))


def _has_gpu() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a GPU (CUDA or ROCm); none is available here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_orphans():
    """Fail a test that leaves a descendant process running."""
    import psutil

    me = psutil.Process(os.getpid())
    before = {p.pid for p in me.children(recursive=True)}
    yield
    from gpulab import proc

    spared = before | {proc.guard_pid()}  # the guard sidecar lives as long as the test session
    left = [p for p in me.children(recursive=True) if p.pid not in spared and p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]
    if left:
        gone, alive = psutil.wait_procs(left, timeout=3)
        if alive:
            for p in alive:
                p.kill()
            pytest.fail(f"test left child processes running: {[(p.pid, p.name()) for p in alive]}")


@pytest.fixture
def root() -> Path:
    return ROOT
