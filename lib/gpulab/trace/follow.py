"""Every Python process of a job recorded, with no change to it: ranks started by torchrun or mp.spawn,
multiprocessing children (spawn, forkserver, fork), DataLoader workers, Python subprocesses.

How a process is reached: the watchdog puts `site/` first on the job's PYTHONPATH and names the job folder in
$GPULAB_FOLLOW; `site/sitecustomize.py` runs in every new interpreter and calls `start()`. A fork() child is
reached by the fork handler (its parent's recorder leaves it: gpulab.trace.recorder). Each process writes,
in the job folder, `<pid>.json` (who it is: command line, parent, the rank/world/worker it learns later),
`<pid>.beat` (gpulab.beat), `<pid>.faulthandler.txt` (stacks on SIGUSR1) and `<pid>.log` (its op log,
created before torch is imported so a process stuck loading libraries is seen in phase startup; the
recorder is installed right after the program imports torch). The recorded root (`python -m gpulab.trace
--follow DIR`) keeps its own files and writes only its `<pid>.json`, pointing at them.
"""
from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable, Container

from gpulab import beat
from gpulab.trace import recorder as _recorder  # its fork handler (leave the parent's log) runs before ours
from gpulab.trace import ring

ENV = "GPULAB_FOLLOW"
MODE_ENV = "GPULAB_FOLLOW_MODE"
SITE_DIR = str(Path(__file__).resolve().parent / "site")
ROLE_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")

_state: dict[str, Any] = {"folder": None, "mode": "auto", "meta": None, "recorder": None}


def files(folder: str | os.PathLike, pid: int) -> dict[str, Path]:
    base = Path(folder)
    return {"meta": base / f"{pid}.json", "log": base / f"{pid}.log", "beat": base / f"{pid}.beat",
            "faulthandler": base / f"{pid}.faulthandler.txt"}


def child_env(env: dict, folder: str | os.PathLike, mode: str) -> dict:
    """env for a job whose Python processes are all followed into `folder`."""
    from gpulab import proc

    out = proc.python_env(env)
    out[ENV], out[MODE_ENV] = str(folder), mode
    out["PYTHONPATH"] = site_first(out["PYTHONPATH"])
    return out


def site_first(pythonpath: str) -> str:
    """PYTHONPATH with site/ first (once): every new interpreter then runs its sitecustomize."""
    return os.pathsep.join([SITE_DIR, *[p for p in pythonpath.split(os.pathsep) if p and p != SITE_DIR]])


def metas(folder: str | os.PathLike, skip: Container[int] = ()) -> dict[int, dict]:
    """Every process that announced itself in the job folder: pid -> its <pid>.json (those in `skip`
    are not read again: a watcher polling for new processes)."""
    out: dict[int, dict] = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for name in names:
        if not name.endswith(".json") or not name[:-5].isdigit() or int(name[:-5]) in skip:
            continue
        try:
            with open(os.path.join(folder, name)) as fh:
                out[int(name[:-5])] = json.load(fh)
        except (OSError, ValueError):
            continue   # being replaced; read again next time
    return out


def children(folder: str | os.PathLike) -> list[dict]:
    """The <pid>.json of every process the job's root started (the root's own left out)."""
    return [m for m in metas(folder).values() if not m.get("root")]


def child_logs(folder: str | os.PathLike, kids: list[dict] | None = None) -> list[Path]:
    """The op logs of those processes (kids: their <pid>.json as children() read them), in pid order: what is
    read of a job besides its root's log."""
    kids = children(folder) if kids is None else kids
    return [Path(folder) / m["log"] for m in sorted(kids, key=lambda m: m.get("pid") or 0) if m.get("log")]


# ------------------------------------------------------------------------------------ who a process is

def _write_meta() -> None:
    meta, folder = _state["meta"], _state["folder"]
    path = files(folder, meta["pid"])["meta"]
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, path)
    except OSError:
        pass   # the folder is gone: the job is being stopped


def note(**facts: Any) -> None:
    """Add what a process learns about itself (its rank, its DataLoader worker id) to its <pid>.json."""
    if _state["meta"] is None or _state["meta"]["pid"] != os.getpid():
        return
    _state["meta"].update({k: v for k, v in facts.items() if v is not None})
    _write_meta()


def note_dist(dist: Any) -> None:
    """After init_process_group: the process's rank in the world, and the backend."""
    try:
        note(rank=dist.get_rank(), world=dist.get_world_size(), backend=str(dist.get_backend()))
    except Exception:  # noqa: BLE001 - informative only
        pass


def _meta(how: str, own: dict[str, str]) -> dict:
    argv = list(getattr(sys, "orig_argv", sys.argv))
    env_role = {k.lower(): os.environ[k] for k in ROLE_ENV if k in os.environ} if how != "fork" else {}
    return {"pid": os.getpid(), "ppid": os.getppid(), "argv": argv[:40], "how": how, "host": socket.gethostname(),
            "started": time.time(), "env": env_role, **own}


# ------------------------------------------------------------------------------------ starting

def _open_files(folder: Path, how: str) -> None:
    import faulthandler
    import signal

    f = files(folder, os.getpid())
    _state["meta"] = _meta(how, {k: f[k].name for k in ("log", "beat", "faulthandler")})
    _write_meta()
    beat.start(f["beat"])
    fh = open(f["faulthandler"], "w")
    _state["faulthandler"] = fh
    faulthandler.enable(file=fh)
    faulthandler.register(signal.SIGUSR1, file=fh, all_threads=True)
    ring.create(f["log"], _state["mode"])


def _watch_ending() -> None:
    """An uncaught exception and a normal exit are noted: the watchdog tells 'exited' from 'stuck' by the
    process being gone, and says why from these."""
    prev = sys.excepthook

    def excepthook(tp, val, tb):
        note(exception=f"{tp.__name__}: {val}"[:300])
        prev(tp, val, tb)
    sys.excepthook = excepthook
    atexit.register(lambda: note(ended=time.time()))


def _install_recorder() -> None:
    """torch is imported: record from here on (with the scenario's fixes, as the root process has them)."""
    if _state["recorder"] is not None or _state["meta"] is None:
        return
    try:
        from gpulab.fixes import install_from_env

        install_from_env()
        rec = _recorder.Recorder(files(_state["folder"], os.getpid())["log"], _state["mode"], create_log=False)
        rec.install()
    except Exception as exc:  # noqa: BLE001 - the program must run even when it cannot be recorded
        note(record_error=f"{type(exc).__name__}: {exc}")
        return
    _state["recorder"] = rec
    atexit.register(rec.close)
    label_workers()


def start() -> None:
    """In a new interpreter of the job (sitecustomize): files now, the recorder once torch is imported."""
    folder = os.environ.get(ENV)
    if not folder or _state["folder"] is not None:
        return
    _state.update(folder=Path(folder), mode=os.environ.get(MODE_ENV) or "auto")
    try:
        _open_files(Path(folder), "exec")
    except OSError:
        _state["folder"] = None
        return
    _watch_ending()
    if "torch" in sys.modules:
        _install_recorder()
    else:
        sys.meta_path.insert(0, _AfterImport("torch", _install_recorder))


def adopt(folder: str | os.PathLike, mode: str, own: dict[str, str]) -> None:
    """The recorded root: its files are its own (`own`: log, beat, faulthandler, relative to the folder);
    its children follow into `folder`."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    _state.update(folder=Path(folder), mode=mode, meta=_meta("root", {**own, "root": True}))
    _write_meta()
    _watch_ending()
    os.environ[ENV], os.environ[MODE_ENV] = str(folder), mode
    os.environ["PYTHONPATH"] = site_first(os.environ.get("PYTHONPATH", ""))
    label_workers()


def _after_fork() -> None:
    """A fork() child of a followed process (a DataLoader worker, a multiprocessing 'fork' child): its own
    files and recorder; the parent's recorder has already left it."""
    if _state["folder"] is None:
        return
    _state.update(recorder=None, meta=None)
    try:
        _open_files(_state["folder"], "fork")
    except OSError:
        return
    if "torch" in sys.modules:
        _install_recorder()


os.register_at_fork(after_in_child=_after_fork)


# ------------------------------------------------------------------------------------ DataLoader workers

def label_workers() -> None:
    """A DataLoader worker says which worker it is: the loader's worker loop is wrapped (before the fork, or
    in a spawned worker before the loop is unpickled) to note its worker id and the loader's size."""
    if "torch" not in sys.modules:
        return
    try:
        import inspect

        import torch.utils.data._utils.worker as w
    except Exception:  # noqa: BLE001
        return
    orig = w._worker_loop
    if getattr(orig, "__gpulab_call__", False):
        return
    sig = inspect.signature(orig)

    def _worker_loop(*args, **kwargs):
        try:
            b = sig.bind_partial(*args, **kwargs).arguments
            note(worker=b.get("worker_id"), workers=b.get("num_workers"))
        except Exception:  # noqa: BLE001
            pass
        return orig(*args, **kwargs)

    _worker_loop.__module__, _worker_loop.__qualname__ = orig.__module__, orig.__qualname__
    _worker_loop.__gpulab_call__ = True
    w._worker_loop = _worker_loop


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then()` right after module `name` has been imported (a post-import hook)."""

    def __init__(self, name: str, then: Callable[[], None]):
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, then = spec.loader, self.then
        run = loader.exec_module

        def exec_module(module):
            run(module)
            then()
        loader.exec_module = exec_module
        return spec
