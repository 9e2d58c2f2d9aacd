"""The fixes a verdict's evidence points at, on this platform: what `gpulab watch`, 03 and the index tell a
user to try, from the same matcher (gpulab.fixes.answers) that `--scenario auto` runs first.

Apart from answers.py because it reads the registry and the platform (torch's build flags): the matcher
stays pure. Here, not in gpulab.hang, because the watchdog knows no fixes: the callers that know both (the
`gpulab watch` command, notebook 03) add the suggestions to the watchdog's verdict with `with_suggestions`.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from gpulab.fixes import answers, registry

if TYPE_CHECKING:
    from gpulab.hang.verdict import Verdict


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


def with_suggestions(v: Verdict, device: str | None = None) -> Verdict:
    """The verdict with the fixes its evidence points at and its "try" sentence as the last fact: the same
    matcher `gpulab fixes --scenario auto` runs first, so whatever it says is tried. The shape of
    gpulab.hang.watchdog.watch.run's `finish`."""
    try:
        found = for_verdict(v.to_dict(), device)
    except Exception as exc:  # noqa: BLE001 - a suggestion must never lose the verdict
        return dataclasses.replace(v, notes=v.notes + (f"fix suggestions failed: {type(exc).__name__}: {exc}",))
    if not found:
        return v
    return dataclasses.replace(v, suggested=found, evidence=v.evidence + (sentence(found),))


def saved(v: Verdict | None) -> Verdict | None:
    """A finished watched run's verdict (a ladder trial's, read back) with its suggestions, written back to
    its verdict.json so the products that read that file (the bundle, issue.md) say the same. The device
    is read from its op log, as the watchdog would have."""
    if v is None or v.suggested:
        return v
    from gpulab import report
    from gpulab.hang.watchdog import watch

    folder = Path(v.log.get("dir", "."))
    out = with_suggestions(v, watch.log_device(folder / v.log["op_log"] if v.log.get("op_log") else None))
    if out is not v and v.log.get("verdict"):
        report.write_json(folder / v.log["verdict"], out.to_dict())
    return out


SOFTMAX_FIX = "fp32_softmax"
_LOW = ("float16", "bfloat16")


def for_nan(first: Mapping[str, Any]) -> tuple[str, ...]:
    """The fix scenarios that can answer a first NaN/Inf (02's metrics, gpulab.trace.firstnan): a softmax fix
    only when a softmax's own output was the first NaN/Inf (not a fully masked row: fp32 has the same 0/0), or
    a low-precision overflow went into a softmax. A zero divisor, a log of <= 0 or bad data is the program's
    to fix: no scenario answers it, and none is named."""
    if SOFTMAX_FIX not in registry.names():
        return ()
    op = str(first.get("first_nonfinite_op") or "")
    kind = first.get("first_nonfinite_cause_kind")
    if "softmax" in op and kind in (None, "overflow", "unknown"):
        return (SOFTMAX_FIX,)
    if (kind in ("matmul_overflow", "overflow") and first.get("first_nonfinite_dtype") in _LOW
            and first.get("first_nonfinite_into_softmax")):
        return (SOFTMAX_FIX,)
    return ()
