"""What a fix is: one change tried against one suspected cause, declared as data so the parent can decide,
without torch, what a scenario sets in its children's environment and whether it applies on this platform.

A fix has any of: `env` (variables the parent sets before the child starts: allocator, module loading and
launch settings are read once, at start-up, so only the parent can set them), `apply` (a runtime change
the child installs before the program runs), `python` (another interpreter, e.g. a venv holding a PyTorch
built with a source patch) and `params` (built-in workload parameters, e.g. device=cpu). `applies(facts)`
says whether it can mean anything on this platform; `needs` says in words what it needs when it cannot.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from gpulab.fixes.answers import Answer
from gpulab.hang.classify import ALL_CLASSES as CLASSES

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class UnknownFix(ValueError):
    """A fix name that is not in the registry; the message lists the known ones."""


class FixError(ValueError):
    """A fix module that declares something that cannot work (bad class, nothing to change, ...)."""


Facts = Mapping[str, Any]   # gpulab.fixes.platform.facts: device, gpu, cudnn, torch, sdpa_mask


def always(facts: Facts) -> bool:
    return True


def on_gpu(facts: Facts) -> bool:
    return facts.get("gpu") in ("cuda", "rocm") and str(facts.get("device", "")).startswith("cuda")


def on_nvidia(facts: Facts) -> bool:
    return facts.get("gpu") == "cuda" and on_gpu(facts)


def takes_the_call_unmasked(facts: Facts) -> bool:
    """FlashAttention on CUDA takes no explicit attention mask: forcing it on a masked call only errors."""
    return not (on_gpu(facts) and facts.get("sdpa_mask"))


def on_rocm(facts: Facts) -> bool:
    return facts.get("gpu") == "rocm" and on_gpu(facts)


@dataclass(frozen=True)
class Fix:
    name: str
    changes: str                                  # what it changes, in words a reviewer can check
    targets: tuple[str, ...]                      # hang classes it is meant for (gpulab.hang.classify.CLASSES)
    env: Any = ()                                 # {VAR: value} set by the parent; stored as sorted pairs
    apply: Callable[[], None] | None = None       # installed in the child before the program runs
    python: str | None = None                     # another interpreter for the workload children
    params: Any = ()                              # {key: value} built-in workload parameters it changes
    applies: Callable[[Facts], bool] = always
    needs: str = ""                               # what `applies` requires, in words (the not_applicable reason)
    source: str = ""                              # where the fix comes from (an issue, a doc page)
    replaces_sdpa: bool = False                   # F.scaled_dot_product_attention is no SDPA backend any more
    answers: tuple[Answer, ...] = ()              # the evidence it answers (gpulab.fixes.answers): what `auto`
                                                  #   and a verdict's "try" sentence pick it by
    apply_yourself: str = ""                      # how a user applies it in their own job, outside gpulab
    means: str = ""                               # what its removing the failure tells of the cause, in words
    diagnostic: str = ""                          # what it gives up that a short run does not show: a fix
                                                  #   that says where the bug lives more than it removes it

    def __post_init__(self) -> None:
        if not _NAME.match(self.name or ""):
            raise FixError(f"fix name {self.name!r} must be snake_case (it is also a scenario file name)")
        object.__setattr__(self, "targets", tuple(self.targets))
        bad = [t for t in self.targets if t not in CLASSES]
        if not self.targets or bad:
            raise FixError(f"fix {self.name!r}: targets {list(self.targets)!r} must name one or more hang classes "
                           f"out of {', '.join(CLASSES)}")
        for key in ("env", "params"):
            pairs = getattr(self, key)
            pairs = tuple(sorted((pairs.items() if isinstance(pairs, Mapping) else pairs)))
            object.__setattr__(self, key, pairs)
        if any(not isinstance(v, str) for _, v in self.env):
            raise FixError(f"fix {self.name!r}: env values must be strings, got {dict(self.env)!r}")
        if not (self.env or self.apply or self.python or self.params):
            raise FixError(f"fix {self.name!r} changes nothing: give env, apply, python or params")
        if not self.changes:
            raise FixError(f"fix {self.name!r}: say what it changes (changes=...)")
        object.__setattr__(self, "answers", tuple(self.answers))
        if any(not isinstance(a, Answer) for a in self.answers):
            raise FixError(f"fix {self.name!r}: answers must be gpulab.fixes.answers.Answer values")

    def apply_line(self) -> str:
        """What a user puts in their own job: the declared line, else the exports of its variables."""
        if self.apply_yourself:
            return self.apply_yourself
        if self.env and not (self.apply or self.python):
            return "export " + " ".join(f"{k}={v}" if v else f"{k}=" for k, v in self.env)
        if self.python:
            return f"run the job with {self.python}"
        return f"call FIX.apply() from patches/{self.name}.py at the start of the program"

    def how(self) -> str:
        """How it reaches the child, in words (a table column)."""
        parts = [" ".join(f"{k}={v!r}" if v == "" else f"{k}={v}" for k, v in self.env)] if self.env else []
        parts += ["a runtime change in the child"] if self.apply else []
        parts += [f"interpreter {self.python}"] if self.python else []
        parts += [", ".join(f"{k}={v}" for k, v in self.params)] if self.params else []
        return "; ".join(parts)


def not_applicable(fixes: Sequence[Fix], facts: Facts) -> str | None:
    """None when every fix applies on this platform, else why not (the first that does not, in words)."""
    for fx in fixes:
        if not fx.applies(facts):
            return f"{fx.name} needs {fx.needs or 'another platform'}"
    return None
