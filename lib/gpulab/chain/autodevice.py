"""What `device=auto` means in a scenario's environment, asked once by a small child while the scenario's
first notebook runs and handed to its later notebooks' kernels (gpulab.device.AUTO_ENV). Those kernels only
orchestrate children; without the answer each imports torch just to ask (about 5 s a kernel on the H100
machine). The answer is keyed by the exact environment it was found in: a scenario whose fixes change the
environment gets its own, and an answer not in yet is not waited for (the kernel then asks torch itself)."""
from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Mapping

from gpulab import proc
from gpulab.device import AUTO_ENV

ASK = "from gpulab import device; print(device.resolve('auto'))"
TIMEOUT_S = 120.0
# not part of what an environment means for the answer: the answer itself, and gpulab.proc's own bookkeeping
# (the guard's token joins os.environ once the first child starts)
_IGNORED = (AUTO_ENV, proc.ENV_VAR)


def _key(env: Mapping[str, str]) -> frozenset:
    return frozenset((k, v) for k, v in env.items() if k not in _IGNORED)


class AutoDevice:
    """One answer per environment, found in the background; `close()` ends a question still running."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers: dict[frozenset, Future] = {}
        self._children: list[proc.Child] = []
        self._closed = False

    def env_for(self, env: Mapping[str, str], ask: bool = True) -> dict[str, str]:
        """`env` plus the answer when it is in; the first call for an environment starts the question, unless
        not `ask` (a kernel with no later notebook to hand the answer to asks torch itself anyway)."""
        base = {k: v for k, v in env.items() if k != AUTO_ENV}
        key = _key(base)
        with self._lock:
            fut = self._answers.get(key)
            if fut is None and not ask:
                return base
            if fut is None:
                fut = self._answers[key] = Future()
                if self._closed:
                    fut.set_result(None)
                else:
                    threading.Thread(target=self._ask, args=(base, fut), name="gpulab-auto-device",
                                     daemon=True).start()
                return base
        answer = fut.result() if fut.done() else None
        return {**base, AUTO_ENV: answer} if answer else base

    def ready(self, env: Mapping[str, str]) -> bool:
        """The question for this environment was asked and answered (an answer may be none)."""
        fut = self._answers.get(_key(env))
        return fut is not None and fut.done()

    def close(self) -> None:
        """The run is over: a question still running is ended (its answer is none)."""
        with self._lock:
            self._closed = True
            children = list(self._children)
        for child in children:
            child.stop()

    def _ask(self, env: dict[str, str], fut: Future) -> None:
        answer = None
        try:
            with tempfile.TemporaryDirectory(prefix="gpulab-auto-device-") as tmp:
                out = Path(tmp) / "answer.txt"
                with self._lock:
                    if self._closed:
                        return
                    child = proc.Child([sys.executable, "-c", ASK], env=env, stdout=out,
                                       stderr=subprocess.DEVNULL, label="auto-device")
                    self._children.append(child)
                try:
                    rc = child.wait(timeout=TIMEOUT_S)
                finally:
                    child.stop()
                lines = out.read_text().split() if rc == 0 and out.exists() else []
                answer = lines[-1] if lines and lines[-1] in ("cpu", "cuda") else None
        except BaseException:  # noqa: BLE001 - no answer: every kernel asks torch itself, as before
            answer = None
        finally:
            fut.set_result(answer)
