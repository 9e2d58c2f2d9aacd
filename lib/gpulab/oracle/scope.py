"""What notebook 05 judges for a workload, and why. The oracle is a platform check of attention kernels:
for the built-in workload (which calls attention) it always applies; for a user program only when notebook
02's recording saw it call scaled_dot_product_attention (judged then in the dtypes the program calls), or
could not tell (05 then runs, and says so). A program that ran to the end without one, or failed before
its first, is not its business.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from gpulab import recorded
from gpulab.workloads import WorkloadConfig, dtype_name, resolve_dtype


@dataclass(frozen=True)
class Scope:
    applies: bool
    dtypes: tuple[str, ...]   # what the candidates are judged in (empty when 05 does not apply)
    note: str = ""            # a sentence for the reader: where the dtypes come from, or why 05 does not apply
    caveat: str = ""          # said in the headline too: it is unknown whether the program calls attention


def scope_for(workload: str, dtype: str, device: str, out_dir: str | os.PathLike | None) -> Scope:
    """The oracle's scope for this workload: dtype 'auto' means the dtypes the workload's attention runs in
    (the built-in workload's one dtype; a user program's recorded calls, when 02 saw any), else
    resolve_dtypes' rule for the device. Every low-precision dtype at once is `gpulab oracle`'s platform
    check, not the chain's question about this workload."""
    use = recorded.attention_use(WorkloadConfig(workload=workload), out_dir)
    if use.seen == "none":
        return Scope(False, (), f"05 does not apply to workload={workload}: {use.note}")
    if use.seen == "unknown" and use.failed:
        return Scope(False, (), f"05 does not apply to workload={workload}: {use.note}; the program failed before "
                                f"any attention call, so its failure is not in an attention kernel (workload=builtin "
                                f"checks this platform's kernels)")
    from gpulab.oracle.cases import resolve_dtypes   # torch: only where 05 applies (above, it ends without it)

    asked = tuple(dtype_name(d) for d in resolve_dtypes(dtype, device))
    if use.seen == "builtin":
        runs = resolve_dtype(dtype, device)
        if dtype == "auto" and asked != (runs,):
            return Scope(True, (runs,), f"Judged in {runs}, the dtype the built-in workload runs in on {device} "
                                        f"(-p dtype=... for another; `gpulab oracle` judges {', '.join(asked)}).")
        return Scope(True, asked)
    if use.seen == "unknown":
        return Scope(True, asked, f"{use.note}; 05 checks the attention kernels anyway.", use.note)
    if dtype == "auto" and use.dtypes:
        return Scope(True, use.dtypes, f"{use.note}; judged in the dtypes those calls use: {', '.join(use.dtypes)}.")
    return Scope(True, asked, f"{use.note}.")
