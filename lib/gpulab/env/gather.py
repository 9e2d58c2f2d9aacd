"""collect(): every fact of FACT_KEYS in one JSON-able dict, from the host probes and the torch/GPU child."""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping

from gpulab import __version__
from gpulab.env import facts as host
from gpulab.env.facts import FACT_KEYS
from gpulab.env.probe import probe_spec, probe_torch, stage_timeouts
from gpulab.workloads import WorkloadConfig


def workload_config(workload: WorkloadConfig | Mapping[str, Any] | None) -> WorkloadConfig:
    """A WorkloadConfig as is; a mapping strictly (a mistyped key in a hand-written dict is an error; a
    notebook passes `WorkloadConfig.from_params(globals())`, which ignores its other parameters)."""
    if isinstance(workload, WorkloadConfig):
        return workload
    params = dict(workload or {})
    names = [f.name for f in dataclasses.fields(WorkloadConfig)]
    unknown = sorted(k for k in params if k not in names)
    if unknown:
        raise ValueError(f"unknown workload key(s) {unknown}; valid keys: {', '.join(names)}")
    return WorkloadConfig(**params)


def collect(workload: WorkloadConfig | Mapping[str, Any] | None = None, *, unmasked: bool = False,
            run_sdpa: bool = True, timeouts: dict | None = None, probe_env: dict | None = None,
            progress: bool = False) -> dict:
    """Gather the platform facts (see FACT_KEYS). Never raises on a failing probe; it records the error.

    The SDPA facts are for the workload's attention call (`unmasked`: the same call without its padding
    mask, for comparison). `probe_env` replaces the environment of the torch/GPU probe child (e.g. to
    compare CUDA_MODULE_LOADING=LAZY and EAGER); `timeouts` overrides probe.STAGE_TIMEOUT_S per stage kind
    ("sdpa_run") or per stage ("sdpa_run:math"); `progress` prints a line per probe stage on stderr."""
    spec = probe_spec(workload_config(workload), unmasked)
    t = stage_timeouts(timeouts)
    facts: dict[str, Any] = {"gpulab_version": __version__,
                             "collected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    errors: dict[str, str] = {}
    for name, fn in (("host", host.host_facts), ("env_vars", lambda: {"env_vars": host.env_vars(probe_env)}),
                     ("tools", lambda: {"tools": host.tools()}), ("ptrace", lambda: {"ptrace": host.ptrace_probe()}),
                     ("torch", lambda: probe_torch(spec, run_sdpa, t, probe_env, progress))):
        try:
            facts.update(fn())
        except Exception as exc:  # noqa: BLE001 - a probe never raises
            errors[name] = f"{type(exc).__name__}: {exc}"
    facts.update(host.derived(facts))
    if facts.get("device_kind") in (None, "cpu") and facts.get("torch_probe_status") == "ok":
        facts["device_name"] = facts.get("device_name") or facts.get("cpu_model")
    for k in FACT_KEYS:
        facts.setdefault(k, None)
    for st in facts.get("probe_stages") or []:
        if st["status"] != "ok":
            errors[f"probe:{st['stage']}"] = f"{st['status']}: {st['error']}"
    facts["errors"] = errors
    return facts
