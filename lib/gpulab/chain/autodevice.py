"""What `device=auto` means in a scenario's environment, asked once by a small child while the scenario's
first notebook runs and handed to its later notebooks' kernels (gpulab.device.AUTO_ENV). Those kernels only
orchestrate children; without the answer each imports torch just to ask (about 5 s a kernel on the H100
machine). The answer is keyed by the exact environment it was found in: a scenario whose fixes change the
environment gets its own, and an answer not in yet is not waited for (the kernel then asks torch itself)."""
from __future__ import annotations

import sys
import threading
from concurrent.futures import Future
from typing import Mapping

from gpulab import proc
from gpulab.device import AUTO_ENV

ASK = "from gpulab import device; print(device.resolve('auto'))"
TIMEOUT_S = 120.0


class AutoDevice:
    """One answer per environment, found in the background."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers: dict[frozenset, Future] = {}

    def env_for(self, env: Mapping[str, str]) -> dict[str, str]:
        """`env` plus the answer when it is in; the first call for an environment starts the question."""
        base = {k: v for k, v in env.items() if k != AUTO_ENV}
        key = frozenset(base.items())
        with self._lock:
            fut = self._answers.get(key)
            if fut is None:
                fut = self._answers[key] = Future()
                threading.Thread(target=_ask, args=(base, fut), name="gpulab-auto-device", daemon=True).start()
                return base
        answer = fut.result() if fut.done() else None
        return {**base, AUTO_ENV: answer} if answer else base

    def ready(self, env: Mapping[str, str]) -> bool:
        """The question for this environment was asked and answered (an answer may be none)."""
        fut = self._answers.get(frozenset((k, v) for k, v in env.items() if k != AUTO_ENV))
        return fut is not None and fut.done()


def _ask(env: dict[str, str], fut: Future) -> None:
    try:
        res = proc.run([sys.executable, "-c", ASK], timeout_s=TIMEOUT_S, env=env, capture=True, label="auto-device")
        lines = res.stdout.split() if res.ok else []
        fut.set_result(lines[-1] if lines and lines[-1] in ("cpu", "cuda") else None)
    except BaseException:  # noqa: BLE001 - no answer: every kernel asks torch itself, as before
        fut.set_result(None)
