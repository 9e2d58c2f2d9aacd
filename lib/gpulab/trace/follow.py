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
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable, Container

from gpulab import beat
from gpulab.trace import recorder as _recorder  # its fork handler (leave the parent's log) runs before ours
from gpulab.trace import preload
from gpulab.trace import ring

ENV = "GPULAB_FOLLOW"
MODE_ENV = "GPULAB_FOLLOW_MODE"
SITE_DIR = str(Path(__file__).resolve().parent / "site")
ROLE_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")
# launchers and supervisors of ranks, by their command line: never the job's progress, never where it is stuck
LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch", "accelerate", "deepspeed",
             "deepspeed.launcher.launch", "deepspeed.launcher.runner")

_state: dict[str, Any] = {"folder": None, "mode": "auto", "meta": None, "recorder": None}


def files(folder: str | os.PathLike, pid: int) -> dict[str, Path]:
    base = Path(folder)
    return {"meta": base / f"{pid}.json", "log": base / f"{pid}.log", "beat": base / f"{pid}.beat",
            "faulthandler": base / f"{pid}.faulthandler.txt", "collectives": base / f"{pid}.collectives.json"}


def ask_address(folder: str | os.PathLike, pid: int) -> str:
    """The abstract Unix socket where a process of the job listens for the watchdog's asks: no file anywhere
    (nothing to clean up, nothing that copies the folder can block on it), gone when the process is."""
    import hashlib

    key = hashlib.sha1(str(Path(folder).resolve()).encode()).hexdigest()[:16]
    return f"\0gpulab-ask-{key}-{pid}"


def child_env(env: dict, folder: str | os.PathLike, mode: str) -> dict:
    """env for a job whose Python processes are all followed into `folder`."""
    from gpulab import proc

    out = proc.python_env(env)
    out[ENV], out[MODE_ENV] = str(folder), mode
    _flight_recorder_on(out)
    out["PYTHONPATH"] = site_first(out["PYTHONPATH"])
    return out


def _flight_recorder_on(env) -> None:
    """The job's process groups keep PyTorch's flight recorder (their collectives, numbered), unless the user
    set its size: a second witness the watchdog reads when the job stalls (ask)."""
    from gpulab.trace import collectives

    if not any(env.get(k) for k in collectives.FR_ENV):
        env[collectives.FR_ENV[0]] = str(collectives.FR_ENTRIES)


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

def is_launcher(meta: dict) -> bool:
    """A launcher by its command line (torchrun's agent, `python -m torch.distributed.run`, accelerate,
    deepspeed), the recorded root's `python -m gpulab.trace ... --` prefix included."""
    argv = " ".join(str(a) for a in meta.get("argv") or ())
    return any(re.search(rf"(^|[/ ]){re.escape(m)}( |$)", argv) for m in LAUNCHERS)


def is_rank(meta: dict) -> bool:
    """A rank: it said so after init_process_group, or its launcher gave it RANK."""
    return meta.get("rank") is not None or (meta.get("env") or {}).get("rank") is not None


def supervisors(metas: dict[int, dict], root: int | None = None, alive: Callable[[int], bool] = lambda pid: True,
                parent: Callable[[int], int | None] = lambda pid: None) -> set[int]:
    """The processes that only launch or supervise the job's ranks: launchers by command line, and every
    process of which a live rank descends without being a rank itself (mp.spawn's parent, a shell wrapper:
    the root). Their own beats, output and ops are not the job's progress while those ranks run. `parent`:
    the parent of a process that wrote no <pid>.json (a shell between the root and a launcher)."""
    out = {pid for pid, m in metas.items() if is_launcher(m) and not is_rank(m)}
    for pid, m in metas.items():
        if not is_rank(m) or m.get("ended") or m.get("exception") or not alive(pid):
            continue
        seen, p = set(), m.get("ppid")
        while p is not None and p not in seen:
            seen.add(p)
            pm = metas.get(p)
            if pm is not None and is_rank(pm):
                break   # a rank's own children (DataLoader workers) are below it, not above
            if pm is not None or p == root:   # a process of the job; an unknown one (a shell) is passed through
                out.add(p)
            if p == root:
                break
            p = pm.get("ppid") if pm is not None else parent(p)
    return out

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


_recorder.ON_DIST_INIT.append(note_dist)   # the recorder tells it after init_process_group


def _meta(how: str, own: dict[str, str]) -> dict:
    argv = list(getattr(sys, "orig_argv", sys.argv))
    env_role = {k.lower(): os.environ[k] for k in ROLE_ENV if k in os.environ} if how != "fork" else {}
    return {"pid": os.getpid(), "ppid": os.getppid(), "argv": argv[:40], "how": how, "host": socket.gethostname(),
            "started": time.time(), "env": env_role, "cwd": _cwd(), **own}


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None


# ------------------------------------------------------------------------------------ starting

def _open_files(folder: Path, how: str) -> None:
    from gpulab.trace import stackdump

    f = files(folder, os.getpid())
    _state["meta"] = _meta(how, {k: f[k].name for k in ("log", "beat", "faulthandler")})
    _write_meta()
    beat.start(f["beat"])
    fh = open(f["faulthandler"], "w")
    _state["faulthandler"] = fh
    stackdump.install(fh)
    ring.create(f["log"], _state["mode"])
    _answer_asks(folder, f["collectives"])


def _answer_asks(folder: Path, answer: Path) -> None:
    """A helper thread that, each time the watchdog asks (a datagram on ask_address), writes this process's
    collectives as PyTorch numbers them (gpulab.trace.collectives.snapshot: the groups' sequence numbers, the
    flight recorder) to `answer`. Blocked in recv() in between: no CPU; it answers while the main thread waits
    in a collective, which releases the GIL (a process stuck holding the GIL answers nothing, and says so by
    its silence)."""
    import socket as sk
    import threading

    pid = os.getpid()
    try:
        sock = sk.socket(sk.AF_UNIX, sk.SOCK_DGRAM)
        sock.bind(ask_address(folder, pid))
    except (OSError, AttributeError):
        return

    def serve() -> None:
        while os.getpid() == pid:
            try:
                sock.recv(16)
            except OSError:
                return
            try:
                from gpulab.trace import collectives

                text = json.dumps({"pid": pid, "t": time.time(), **collectives.snapshot()})
            except Exception as exc:  # noqa: BLE001 - an answer must never break the program
                text = json.dumps({"pid": pid, "t": time.time(), "error": f"{type(exc).__name__}: {exc}"})
            tmp = answer.with_name(answer.name + ".tmp")
            try:
                tmp.write_text(text)
                os.replace(tmp, answer)
            except OSError:
                return   # the folder is gone: the job is being stopped

    threading.Thread(target=serve, name="gpulab-ask", daemon=True).start()


def ask(folder: str | os.PathLike, pids, timeout_s: float = 2.0) -> dict[int, dict]:
    """The watchdog's side: ask each process (pid -> its answer) for its collectives, all at once, and wait up
    to timeout_s for the answers. A process that does not answer (gone, or holding the GIL) is left out."""
    import socket as sk

    asked: dict[int, float] = {}
    with sk.socket(sk.AF_UNIX, sk.SOCK_DGRAM) as sock:
        for pid in pids:
            t = time.time()
            try:
                sock.sendto(b"?", ask_address(folder, pid))
                asked[pid] = t
            except OSError:
                continue   # nobody listens: not followed, ended, or from before this mechanism
    out: dict[int, dict] = {}
    deadline = time.monotonic() + timeout_s
    while asked and time.monotonic() < deadline:
        for pid in list(asked):
            try:
                got = json.loads(files(folder, pid)["collectives"].read_text())
            except (OSError, ValueError):
                continue
            if got.get("t", 0) >= asked[pid] - 0.001:
                out[pid] = got
                del asked[pid]
        if asked:
            time.sleep(0.02)
    return out


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
        preload.run()
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
    _flight_recorder_on(os.environ)
    _answer_asks(Path(folder), files(folder, os.getpid())["collectives"])
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
    _note_bootstrap_end()


def _note_bootstrap_end() -> None:
    """A multiprocessing 'fork' child ends in os._exit() once its target returns, past atexit: its end is noted
    where multiprocessing's bootstrap returns its exit code, or the watchdog could not tell a child that ended well
    from one killed without a word (a producer whose tensors were still to be received, say)."""
    try:
        import multiprocessing.process as mpp
    except Exception:  # noqa: BLE001
        return
    orig = mpp.BaseProcess._bootstrap
    if getattr(orig, "__gpulab_call__", False):
        return

    def _bootstrap(self, *args, **kwargs):
        code = orig(self, *args, **kwargs)
        note(ended=time.time(), exitcode=code)
        return code

    _bootstrap.__gpulab_call__ = True
    mpp.BaseProcess._bootstrap = _bootstrap


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
