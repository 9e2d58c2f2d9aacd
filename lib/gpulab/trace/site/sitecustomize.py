"""Put first on a watched job's PYTHONPATH: every new Python process of the job is followed
(gpulab.trace.follow.start). Another sitecustomize further down the path (the user's) still runs."""
import os
import sys


def _follow() -> None:
    if not os.environ.get("GPULAB_FOLLOW"):
        return
    try:
        from gpulab.trace import follow
        follow.start()
    except Exception as exc:  # noqa: BLE001 - the job must run even when it cannot be followed
        print(f"[gpulab] not following pid {os.getpid()}: {type(exc).__name__}: {exc}", file=sys.stderr)


def _chain() -> None:
    """The sitecustomize this one shadows, if any."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_follow()
_chain()
