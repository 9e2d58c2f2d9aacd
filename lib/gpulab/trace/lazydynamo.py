"""torch._dynamo only when the program imports it: a recorded child's largest start-up cost after torch.

torch wraps every TorchDispatchMode subclass's __torch_dispatch__ in a dynamo-disable wrapper whose first call
imports torch._dynamo: 1.7 s of a recorded 5 s forward run on a 2-core CPU (2.7 s is torch itself), paid by
every recorded child although a forward pass never uses dynamo. The wrapper matters only once dynamo can run
(torch.compile, or code that imports it: AdamW does): it keeps dynamo from tracing into the mode's Python.

So while torch._dynamo is not imported, dispatch-mode classes are made unwrapped (the recorder's and any other
made meanwhile: a fix's rewrite mode, the program's own), which imports nothing inside an op; when something
imports torch._dynamo, each is wrapped as torch would have wrapped it, and the recorder is told (its call-site
walk starts deeper: the wrapper adds frames). Nothing changes for a process that had imported it before.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import types
import weakref
from typing import Callable, Iterator

NAME = "torch._dynamo"


_callbacks: list[Callable[[], None]] = []   # whom to tell when torch._dynamo is imported
_installed: list[bool] = []                  # [True] once deferred in this process


def on_import(f: Callable[[], None]) -> bool:
    """Call f when torch._dynamo gets imported, if the import is deferred (defer()); False if it is not."""
    if _installed and NAME not in sys.modules:
        _callbacks.append(f)
        return True
    return False


def defer() -> bool:
    """Make dispatch-mode classes unwrapped until torch._dynamo is imported; then wrap them and tell those
    on_import() registered. False (nothing deferred) when it is imported already or this torch wraps
    differently."""
    from torch.utils._python_dispatch import TorchDispatchMode

    if NAME in sys.modules or "_should_skip_dynamo" not in TorchDispatchMode.__dict__:
        return False
    if _installed:
        return True
    original = TorchDispatchMode.__dict__["_should_skip_dynamo"]
    deferred: weakref.WeakSet = weakref.WeakSet()

    def _should_skip_dynamo(cls) -> bool:
        if NAME in sys.modules:
            return original.__get__(None, cls)()
        if original.__get__(None, cls)() and "__torch_dispatch__" in cls.__dict__:
            deferred.add(cls)
        return False

    def imported() -> None:
        import torch

        TorchDispatchMode._should_skip_dynamo = original
        for cls in list(deferred):
            raw = cls.__dict__.get("__torch_dispatch__")
            if raw is not None and not isinstance(raw, classmethod):
                cls.__torch_dispatch__ = torch._disable_dynamo(raw, recursive=True)
        for f in _callbacks:
            try:
                f()
            except Exception:  # noqa: BLE001 - one listener's failure leaves the others told
                pass

    TorchDispatchMode._should_skip_dynamo = classmethod(_should_skip_dynamo)
    after_import(imported)
    _installed.append(True)
    return True


def after_import(f: Callable[[], None]) -> None:
    """Call f now if torch._dynamo is imported, else right after something imports it."""
    if NAME in sys.modules:
        f()
    else:
        sys.meta_path.insert(0, _AfterImport(NAME, f))


def _codes(package: str) -> Iterator[types.CodeType]:
    """Every code object of the package's loaded modules: functions, methods and the closures inside them."""
    prefix = package + "."
    stack: list[types.CodeType] = []
    for name, mod in list(sys.modules.items()):
        if mod is None or (name != package and not name.startswith(prefix)):
            continue
        for obj in list(vars(mod).values()):
            members = list(vars(obj).values()) if isinstance(obj, type) and obj.__module__ == name else [obj]
            for m in members:
                m = getattr(m, "__func__", None) or getattr(m, "fget", None) or m
                code = getattr(m, "__code__", None)
                if isinstance(code, types.CodeType) and getattr(m, "__module__", None) == name:
                    stack.append(code)
    seen: set[int] = set()
    while stack:
        code = stack.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        yield code
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


_kept_out: list[str] = []


def keep_out(package: str) -> None:
    """Dynamo never converts a frame of the package's code. The recorder's Python is called from C++ inside an
    op (a name interned, a stream registered) while a compiled frame runs, when dynamo's frame callback is
    set: each such function's first call went through dynamo's frame conversion (skipped there, but counted:
    dynamo's counters said 3 frames for the program's 1, and the conversion costs its time). Marking the code
    objects skipped makes the frames run as plain Python, and dynamo's counters equal the program's own."""
    if package in _kept_out:
        return
    _kept_out.append(package)

    def skip() -> None:
        from torch._dynamo import eval_frame

        skip_code = getattr(eval_frame, "skip_code", None)
        if skip_code is None:   # an older torch: counted as before, nothing else changes
            return
        for code in _codes(package):
            skip_code(code)

    after_import(skip)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls then() once the named module has executed (a post-import hook): finds the module's spec through
    the other finders and runs then() after that spec's loader executed it."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then, self.busy, self.done = name, then, False, False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self.busy or self.done:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        self.done = True
        run, then = spec.loader.exec_module, self.then

        def exec_module(module):
            run(module)
            try:
                then()
            except Exception:  # noqa: BLE001 - the program's import goes on; the modes stay unwrapped
                pass

        spec.loader.exec_module = exec_module   # this spec's own loader instance: its type and the rest unchanged
        return spec
