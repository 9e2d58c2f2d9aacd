"""Keep torch.compile out of the recorder's mode without importing torch._dynamo for a program that never
compiles.

torch wraps every TorchDispatchMode subclass's `__torch_dispatch__` in `torch._disable_dynamo`, whose first
call imports torch._dynamo (about 2 s, most of a recorded child's start-up beyond torch itself) only to
build the wrapper that turns Dynamo's frame evaluator off while the mode runs. Dynamo can only evaluate
frames once a program has imported it, so until then the mode runs as is; the first op after
torch._dynamo has finished importing installs torch's own disable wrapper, exactly as torch would have.
The wrapper chain keeps at least as many frames as before, so the recorder's measured frame depth to the
op's caller is never too deep (too shallow is still correct: the call-site walk skips torch's frames).
"""
from __future__ import annotations

import sys

_ATTR = "__dynamo_disable"  # torch._compile._disable_dynamo caches its wrapper under this attribute


def lazy(cls: type) -> type:
    """Class decorator for a TorchDispatchMode subclass: its Dynamo wrapper is built on first need."""
    wrapped = cls.__dict__.get("__torch_dispatch__")
    raw = getattr(wrapped, "__wrapped__", None)
    if raw is None or getattr(raw, _ATTR, None) is not None:
        return cls  # torch did not wrap it (older torch, or Dynamo skipping switched off): nothing to defer
    modules_get = sys.modules.get

    def until_dynamo(*args, **kwargs):
        dyn = modules_get("torch._dynamo")
        if dyn is not None:
            disable = _ready_disable(dyn, raw)
            if disable is not None:
                setattr(raw, _ATTR, disable)  # from now on torch's wrapper calls Dynamo's directly
                return disable(*args, **kwargs)
        return raw(*args, **kwargs)

    setattr(raw, _ATTR, until_dynamo)
    return cls


def _ready_disable(dyn, raw):
    """torch._dynamo.disable(raw) as torch._disable_dynamo builds it, or None while Dynamo is importing."""
    spec = getattr(dyn, "__spec__", None)
    if spec is None or getattr(spec, "_initializing", False):
        return None
    disable = getattr(dyn, "disable", None)
    if disable is None:
        return None
    try:
        try:
            return disable(raw, True, wrapping=False)
        except TypeError:  # a torch whose disable() has no `wrapping`
            return disable(raw, True)
    except Exception:  # noqa: BLE001 - a Dynamo that cannot wrap it: run as is rather than fail every op
        return raw
