"""One place that turns the `device` parameter into a torch device, so every notebook agrees."""
from __future__ import annotations

import os
import sys

DEVICE_CHOICES = ("auto", "cpu", "cuda")


AUTO_ENV = "GPULAB_DEVICE_AUTO"  # what `auto` resolved to, found by a parent in this very environment


def resolve(device: str = "auto") -> str:
    """'auto' -> 'cuda' when a GPU (CUDA or ROCm) is usable, else 'cpu'. 'cuda:1' style is accepted.

    Asking torch costs its import (about 5 s on the H100 machine): a chain's notebook kernel that only
    orchestrates children takes the answer its runner found for the same environment (AUTO_ENV, set by
    gpulab.chain.autodevice), and 'cpu' needs no torch at all."""
    name, base = str(device).strip().lower(), kind(device)
    if base not in DEVICE_CHOICES:
        raise ValueError(f"device={device!r} is not valid; choose one of {', '.join(DEVICE_CHOICES)} (or cuda:N)")
    got = known_without_torch(name)
    if got is not None:
        return got
    import torch

    if base == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available():
        raise RuntimeError(f"device={device!r} was asked for but torch.cuda.is_available() is False "
                           f"(torch {torch.__version__}); use device='cpu' or 'auto'")
    return name


def kind(device: str) -> str:
    """A device value's kind, as written: 'CUDA:1' -> 'cuda', ' cpu ' -> 'cpu' (not checked against the choices)."""
    return str(device).strip().lower().split(":", 1)[0]


def known_without_torch(device: str = "auto") -> str | None:
    """What resolve(device) gives without importing torch: 'cpu', or the runner's answer for this environment
    (AUTO_ENV) where it settles the question; None where only torch can tell."""
    name, base = str(device).strip().lower(), kind(device)
    if base == "cpu":
        return name
    known = os.environ.get(AUTO_ENV)
    if known in ("cpu", "cuda") and base in ("auto", known):
        return known if base == "auto" else name
    if base == "auto" and no_gpu_files():
        return "cpu"
    return None


# The device files a CUDA or ROCm runtime opens: NVIDIA's driver (nvidiactl, nvidia0, nvidia-uvm), Jetson's
# (nvhost-*, nvmap, nvgpu), WSL's (dxg) and ROCm's (kfd). Without one, no GPU can be usable to torch.
GPU_NODES = ("/dev/nvidia*", "/dev/nvhost*", "/dev/nvmap", "/dev/nvgpu", "/dev/dxg", "/dev/kfd")


def gpu_nodes() -> list[str]:
    """The GPU device files present (the patterns are Linux's)."""
    import glob

    return [p for pattern in GPU_NODES for p in glob.glob(pattern)]


def no_gpu_files() -> bool:
    """A Linux host with none of those files: 'auto' is cpu without asking torch (elsewhere only torch can tell).

    Why: 'auto' on a machine without a GPU was a torch import (3.5 CPU-s) to hear 'cpu', once per chain and in
    every kernel that asked before the runner's answer was in."""
    return sys.platform.startswith("linux") and not gpu_nodes()


def has_gpu() -> bool:
    """resolve('auto')'s answer: without torch where that is known (no GPU files, the runner's answer)."""
    got = known_without_torch("auto")
    if got is not None:
        return got == "cuda"
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


GPU_TRIAL_JOBS = 2      # trials side by side on one GPU: they share it (reports say so)
GPU_LIGHT_TRIAL_JOBS = 4  # ... when each needs little of it (the built-in workload at small sizes)
CPU_JOBS_MAX = 4         # CPU trials, or CPU oracle workers, side by side (one per core up to this)
GPU_ORACLE_WORKERS_MAX = 6  # oracle workers side by side on a GPU (more gained nothing: see oracle_workers)


def trial_jobs(jobs: int, device: str = "auto", light: bool = False) -> int:
    """`jobs` as asked, or for 0 (auto) what the machine has room for: one trial per core for a CPU program
    (a hung trial costs no CPU, a running one a core), capped at 4; two on a GPU, which they then share, or
    four for `light` trials (a program known to need little GPU memory: more could only crowd a user's
    program out of memory and fail it for the wrong reason)."""
    if jobs and jobs > 0:
        return int(jobs)
    dev = str(device)
    on_gpu = dev.startswith("cuda") or (dev == "auto" and has_gpu())
    if on_gpu:
        return GPU_LIGHT_TRIAL_JOBS if light else GPU_TRIAL_JOBS
    return max(1, min(usable_cores(), CPU_JOBS_MAX))


def oracle_workers(device: str, n_cases: int, cores: int | None = None) -> int:
    """Warm workers side by side for the oracle (gpulab.oracle.pooled). On a GPU its time is CPU-side (Python,
    cuDNN building a plan per shape, which the driver compiles at first use): one per 2 cores, at most 6 (each
    holds a CUDA context on the shared GPU; cuDNN's first calls over the default cases took 28.5 s on 3
    processes, 20.3 s on 6, 19.1 s on 8 and 19.7 s on 12, start-up included, on a 16-core H200 host).
    On the CPU one per core, at most 4, each with its share of the cores as torch threads (oracle_threads):
    the cases are small, and torch's threads gain 1.35x on two cores where two workers gain 1.9x (this
    project's 2-core machine). Never more than the cases. `cores`: the usable cores, counted when None."""
    dev = str(device)
    cores = usable_cores() if cores is None else cores
    if not (dev.startswith("cuda") or (dev == "auto" and has_gpu())):
        return max(1, min(CPU_JOBS_MAX, cores, n_cases))
    return max(1, min(GPU_ORACLE_WORKERS_MAX, max(1, cores // 2), n_cases))


def oracle_threads(workers: int, cores: int | None = None) -> int:
    """torch threads for each of `workers` CPU oracle workers: an even share of the cores (more threads than
    cores only take turns)."""
    return max(1, (usable_cores() if cores is None else cores) // max(1, workers))


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
