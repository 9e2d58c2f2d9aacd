"""Notebook 05's gate: the candidates named by group or spec, judged in this process (gpulab.oracle.check) or on
warm worker children (gpulab.oracle.pooled), into a Gate. Apart from both, as it calls both and pooled reads
check's judging."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Sequence

from gpulab.device import resolve
from gpulab.oracle.errors import OracleError
from gpulab.oracle.outcome import GATE_FILE, Gate
from gpulab.oracle.scope import Scope
from gpulab.oracle.sets import CASE_CHOICES, for_device
from gpulab.workloads import dtype_name


def _skipped(wanted: Sequence[Any], device: str) -> dict[str, str]:
    """Backends named in `wanted` that this device lacks, with why: skipped (as notebook 06 does), not failed."""
    from gpulab.oracle import candidates as registry
    missing = registry.unavailable(device)
    avail = registry.available(device)
    backends = set(registry.ALIASES) | set(registry.ALIASES.values())
    return {n: missing.get(registry.ALIASES.get(n, n), f"not available on {device}") for n in wanted
            if isinstance(n, str) and n in backends and registry.ALIASES.get(n, n) not in avail}


def gate(candidates: Sequence[str] | str = ("vendor", "reference", "fix"), cases: str = "default",
         device: str | None = None, dtypes: Any = None, *, out_dir: str | os.PathLike | None = None, tile: int = 64,
         worst_k: int = 8, timeout_s: float = 900.0, isolate: bool = True, scope: Scope | None = None,
         workers: int = 0) -> Gate:
    """Judge candidates by name/group/spec on warm worker children (deadline timeout_s per case of a candidate;
    one that hangs or crashes fails alone, a fresh worker judges the rest: `isolated`, with `workers` side by
    side, 0 for the device's default: gpulab.device.oracle_workers; unused with isolate=False); write
    oracle_gate.json, oracle_table.csv and worst-case tensors under out_dir as results arrive. With a `scope`
    (gpulab.oracle.scope_for: what 05 judges for the workload) its dtypes are used, and when it does not apply
    nothing runs: the Gate says why, and no gate file is left for 06 (a stale one is removed)."""
    dev = resolve("auto" if device is None else device)
    if cases not in CASE_CHOICES:
        raise OracleError(f"oracle_cases={cases!r} is not valid; choose one of {', '.join(CASE_CHOICES)}")
    cases = for_device(cases, dev)
    if scope is not None and not scope.applies:
        if out_dir is not None:
            (Path(out_dir) / GATE_FILE).unlink(missing_ok=True)
        return Gate({}, dev, (), cases, {}, 0.0, {}, False, scope.note)
    # torch from here on: the judging (a 05 that does not apply ended above without it)
    from gpulab.oracle import candidates as registry
    from gpulab.oracle.cases import resolve_dtypes
    from gpulab.oracle.check import check_many
    from gpulab.oracle.pooled import isolated
    dts = tuple(dtype_name(d) for d in resolve_dtypes(scope.dtypes if scope is not None else dtypes, dev))
    wanted = [candidates] if isinstance(candidates, str) else list(candidates)
    skipped = _skipped(wanted, dev)
    resolved = registry.resolve([n for n in wanted if n not in skipped], dev)
    if not resolved:
        raise OracleError(f"candidates={wanted!r}: none is available on {dev} ({skipped})")
    unavailable = {**registry.unavailable(dev), **skipped}
    t0 = time.monotonic()

    def result(reports: dict) -> Gate:
        g = Gate(reports, dev, dts, cases, {c.name: c.kind for c in resolved}, time.monotonic() - t0, unavailable,
                 True, scope.note if scope else "", scope.caveat if scope else "")
        if out_dir is not None:
            g.save(out_dir)
        return g

    if not isolate:
        return result(check_many(resolved, cases, dev, dts, tile=tile, worst_k=worst_k))
    return result(isolated([c.name for c in resolved], cases, dev, dts, tile=tile, worst_k=worst_k,
                           timeout_s=timeout_s, workers=workers))
