"""A scenario's `fixes:` checked against the registry, for every reader of scenario files (the chain's
layers, the fix matrix's named scenarios): a typo or two fixes that cannot combine fail before anything runs."""
from __future__ import annotations

from typing import Any

from gpulab.fixes import registry
from gpulab.fixes.compose import compose
from gpulab.paramsets import ParamError


def fix_names(value: Any, source: str) -> tuple[str, ...]:
    """A scenario's `fixes`: a list of registry names that can be combined (checked before anything runs)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ParamError(f"'fixes' (from {source}) must be a list of fix names, got {value!r}; "
                         f"known fixes: {', '.join(registry.names())}")
    try:
        compose(registry.resolve(value))
    except ValueError as exc:
        raise ParamError(f"'fixes' (from {source}): {exc}") from None
    return tuple(value)
