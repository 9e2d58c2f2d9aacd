"""Shared test setup: GPU tests skip without a GPU; no test may leave a child process behind."""
from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))
# Every process the tests start inherits this marker; at the end of the session none may be alive.
SESSION_MARK = ("GPULAB_TEST_SESSION", uuid.uuid4().hex)
os.environ[SESSION_MARK[0]] = SESSION_MARK[1]
# OpenMP threads that sleep when they wait, not spin: the suite runs three workers of real torch processes on
# CI's two cores, where spinning threads wait on preempted ones at every parallel op (the full oracle set took
# 184 s beside two busy processes, 23 s with this). Thread counts stay torch's; a test that needs its own
# setting sets it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# ... and orphans re-parent to pytest (a fork without exec shows the environment pytest was started with).
from gpulab import proc as _proc  # noqa: E402

_proc._become_subreaper()


def pytest_configure(config):
    """The tests' children never get the developer's terminal (CI has none): `gpulab watch` at a terminal hands it
    to its job, and a job that reads it would wait for a person. --pdb keeps it."""
    if not config.getoption("usepdb", False) and os.isatty(0):
        fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(fd, 0)
        os.close(fd)


def _has_gpu() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:
        return False


# The files that take longest (test time on a 2-core CPU machine, Inductor cache cold as on CI), handed out
# first: with `--dist loadfile` a worker takes whole files in collection order, so a long file collected last keeps one
# worker busy after the others have finished. Order only; nothing is skipped. Wall seconds per file, from a full run
# (every file over 15 s; a file not named goes after them).
LONGEST_FIRST = ("test_numerics_runs", "test_jobs", "test_from_capture", "test_call_errors", "test_watch_nan",
                 "test_nan_cause_recorded", "test_fixes", "test_liveness", "test_oracle", "test_ladder_bisect",
                 "test_runner", "test_fsdp_job", "test_watch_long", "test_faults_watch", "test_fix_selection",
                 "test_user_project", "test_chain", "test_instrument_notebook", "test_script_attention",
                 "test_interrupts", "test_watch_terminal", "test_lazydynamo", "test_trace", "test_recorder_modes", "test_compiled",
                 "test_numerics_notebook", "test_watch_memory", "test_evidence_first", "test_bad_input",
                 "test_nan_eager_rerun", "test_chain_failing", "test_owner", "test_nan_cause_chain", "test_imports",
                 "test_firstrun", "test_html", "test_champion", "test_env", "test_environment", "test_chain_crash", "test_lockcycle",
                 "test_numerics", "test_products", "test_run_folder", "test_workloads")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))   # stable: a file's tests keep their order
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a GPU (CUDA or ROCm); none is available here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _fixture_tmp(tmp_path_factory):
    """Where fixture programs make their own folders (a checkpoint's): a run the watchdog kills never reaches its
    atexit clean-up, and its folder then stays in pytest's rotated base folder, not in /tmp."""
    os.environ["GPULAB_TEST_TMP"] = str(tmp_path_factory.mktemp("fixture-tmp"))


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


def pytest_sessionfinish(session, exitstatus):
    """The test-session check: fail the suite if any process a test started is still running."""
    from procscan import left_after

    from gpulab import proc

    import psutil

    spared = tuple(p for p in (proc.guard_pid(),) if p)
    left = left_after(*SESSION_MARK, grace_s=3, exclude=spared)
    for p in psutil.Process().children(recursive=True):
        try:
            if p.pid not in spared and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{p.pid}: {' '.join(p.cmdline())[:120]}")
                p.kill()
        except psutil.Error:
            pass
    if left:
        print("\nprocesses started by the tests were still running at the end (now killed):\n  "
              + "\n  ".join(left), file=sys.stderr)
        session.exitstatus = 1


@pytest.fixture(scope="session")
def native_hot_path():
    """The recorder's C hot path, built once (as the launchers do); where it cannot be built, the native
    variants of the recorder tests run the Python hot path (test_recorder_modes checks the two alike)."""
    from gpulab.trace import native
    native.ensure_observer()
    return native.ensure()
