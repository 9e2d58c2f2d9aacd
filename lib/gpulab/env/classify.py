"""Pure classifications of raw device facts (no torch, no driver): testable for GPUs we do not have."""
from __future__ import annotations

import re


def classify_unified(attrs: dict) -> str:
    """integrated (one physical memory, GB10/Jetson) > ats (hardware-coherent host page tables, Grace)
    > hmm (software-managed pageable access) > none."""
    if attrs.get("integrated") or attrs.get("is_integrated"):
        return "integrated"
    if attrs.get("pageable_uses_host_page_tables"):
        return "ats"
    if attrs.get("pageable_memory_access"):
        return "hmm"
    return "none"


def classify_arch(compute_capability: str | None, gfx_arch: str | None, arch_list: list[str]) -> str:
    """How the wheel covers the device: exact SASS, a binary-compatible SASS of the same major (lower or
    equal minor, not an arch-specific 'a' build), only PTX that the driver must JIT, or nothing."""
    if gfx_arch:
        return "sass" if gfx_arch in arch_list else "missing"
    if not compute_capability:
        return "n/a"
    try:
        major, minor = (int(x) for x in compute_capability.split(".")[:2])
    except ValueError:
        return "n/a"
    dev = major * 10 + minor
    sass, ptx = [], []
    for a in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+)([a-z]?)", a)
        if not m:
            continue
        num, suffix = int(m.group(2)), m.group(3)
        (sass if m.group(1) == "sm" else ptx).append((num, suffix))
    if (dev, "") in sass or (dev, "a") in sass or (dev, "f") in sass:
        return "sass"
    if any(n // 10 == major and n <= dev and s == "" for n, s in sass):
        return "sass_family"
    if any(n <= dev and s == "" for n, s in ptx):
        return "ptx_only"
    return "missing"
