"""Fixes compose: a scenario lists several, and the parent turns the list into one child environment.

`GPULAB_FIXES=a,b` names the fixes (the child installs their `apply` parts from it), their `env` is set
beside it, and `GPULAB_PYTHON` names a fix's interpreter. Two fixes that set the same variable to
different values (or two interpreters, or two values of a workload parameter) cannot both hold: an error
naming both, before anything runs. Allocator settings are comma lists, so those are joined instead.
Pure: environments are plain mappings.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from gpulab.device import AUTO_ENV
from gpulab.fixes import registry
from gpulab.fixes.fix import Fix, FixError

FIXES_VAR = "GPULAB_FIXES"
PRELOAD_VAR = "GPULAB_PRELOAD"   # gpulab.trace.preload.ENV: what a recorded child calls before the program
INSTALLER = "gpulab.fixes.install:install_from_env"
PYTHON_VAR = "GPULAB_PYTHON"   # = gpulab.workloads.PYTHON_ENV, not imported: children load this before runpy runs it
LIST_VARS = frozenset({"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"})   # comma-separated options


@dataclass(frozen=True)
class Composition:
    names: tuple[str, ...] = ()
    env: dict = field(default_factory=dict)        # the fixes' own variables (before joining with a base env)
    python: str | None = None
    params: dict = field(default_factory=dict)     # built-in workload parameters the fixes change


def compose(fixes: Sequence[Fix]) -> Composition:
    env: dict[str, str] = {}
    params: dict[str, Any] = {}
    owner: dict[str, str] = {}
    python, python_of = None, None
    for fx in fixes:
        for key, value in fx.env:
            if key in env and key in LIST_VARS:
                env[key] = _join(env[key], value)
            elif key in env and env[key] != value:
                raise FixError(f"fixes {owner[key]!r} and {fx.name!r} set {key} to {env[key]!r} and {value!r}; "
                               f"they cannot be combined")
            else:
                env[key] = value
            owner.setdefault(key, fx.name)
        for key, value in fx.params:
            if key in params and params[key] != value:
                raise FixError(f"fixes {owner['p:' + key]!r} and {fx.name!r} set the workload's {key} to "
                               f"{params[key]!r} and {value!r}; they cannot be combined")
            params[key] = value
            owner.setdefault("p:" + key, fx.name)
        if fx.python:
            if python and python != fx.python:
                raise FixError(f"fixes {python_of!r} and {fx.name!r} ask for two interpreters ({python} and "
                               f"{fx.python}); they cannot be combined")
            python, python_of = fx.python, fx.name
    return Composition(tuple(f.name for f in fixes), env, python, params)


def _join(a: str, b: str) -> str:
    return ",".join(dict.fromkeys(v for v in [*a.split(","), *b.split(",")] if v))


def _without(value: str, items: str) -> str:
    drop = set(items.split(","))
    return ",".join(v for v in value.split(",") if v and v not in drop)


def clean_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without the fixes it carries (a scenario's notebook runs its fix-free baseline from this)."""
    out = dict(env)
    out.pop(AUTO_ENV, None)   # a parent's answer to device=auto holds for its environment, not for this one
    names = [n for n in out.pop(FIXES_VAR, "").split(",") if n]
    out.pop(PRELOAD_VAR, None)
    out.pop(PYTHON_VAR, None)
    fixes = registry.load()
    for name in names:
        for key, value in (fixes[name].env if name in fixes else ()):
            rest = _without(out.get(key, ""), value) if key in LIST_VARS else ""
            if rest:
                out[key] = rest
            else:
                out.pop(key, None)
    return out


def scenario_env(fix_names: Sequence[str], base: Mapping[str, str]) -> dict[str, str]:
    """The environment of a scenario's children: `base` (its own fixes removed) plus these fixes."""
    comp = compose(registry.resolve(fix_names))
    out = clean_env(base)
    if not comp.names:
        return out
    out[FIXES_VAR] = ",".join(comp.names)
    out[PRELOAD_VAR] = INSTALLER   # the recorded child calls it before the program (gpulab.trace.preload)
    for key, value in comp.env.items():
        out[key] = _join(out.get(key, ""), value) if key in LIST_VARS else value
    if comp.python:
        out[PYTHON_VAR] = comp.python
    return out


def active(env: Mapping[str, str]) -> tuple[str, ...]:
    """The fixes an environment carries."""
    return tuple(n for n in env.get(FIXES_VAR, "").split(",") if n)
