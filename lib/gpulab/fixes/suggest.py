"""The fixes a verdict's evidence points at, on this platform: what `gpulab watch`, 03 and the index tell a
user to try, from the same matcher (gpulab.fixes.answers) that `--scenario auto` runs first.

Apart from answers.py because it reads the registry and the platform (torch's build flags): the matcher
stays pure.
"""
from __future__ import annotations

from typing import Any, Mapping

from gpulab.fixes import answers, registry


def device_of(verdict: Mapping[str, Any], fallback: str | None = None) -> str:
    """Where the failing program ran: its in-flight op's device, else the given one, else this machine's."""
    op_device = (verdict.get("in_flight_op") or {}).get("device")
    if op_device:
        return str(op_device)
    if fallback:
        return str(fallback)
    from gpulab import device
    return device.resolve("auto")


def for_verdict(verdict: Mapping[str, Any], device: str | None = None,
                platform_facts: Mapping[str, Any] | None = None) -> tuple[dict, ...]:
    """[{"fix", "because", "facts", "apply"}] for a failed run; () for a passing one."""
    if verdict.get("status") in (None, "ok"):
        return ()
    if platform_facts is None:
        from gpulab.fixes import platform   # imports torch: only for a failure
        platform_facts = platform.facts(device_of(verdict, device))
    fixes = registry.load()
    return tuple({"fix": m.fix, "because": m.because, "facts": list(m.facts), "apply": fixes[m.fix].apply_line()}
                 for m in answers.suggest(fixes.values(), verdict, platform_facts))


def sentence(suggested: Any) -> str:
    """The verdict's "try" sentence from its `suggested` entries ("" when there are none)."""
    return answers.try_sentence([answers.Match(s["fix"], s["because"], tuple(s.get("facts") or ())) for s in suggested],
                                {s["fix"]: s.get("apply") for s in suggested})
