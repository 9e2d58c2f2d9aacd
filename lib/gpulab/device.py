"""One place that turns the `device` parameter into a torch device, so every notebook agrees."""
from __future__ import annotations

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve(device: str = "auto") -> str:
    """'auto' -> 'cuda' when a GPU (CUDA or ROCm) is usable, else 'cpu'. 'cuda:1' style is accepted."""
    import torch

    name = str(device).strip().lower()
    base = name.split(":", 1)[0]
    if base not in DEVICE_CHOICES:
        raise ValueError(f"device={device!r} is not valid; choose one of {', '.join(DEVICE_CHOICES)} (or cuda:N)")
    if base == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if base == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device={device!r} was asked for but torch.cuda.is_available() is False "
                           f"(torch {torch.__version__}); use device='cpu' or 'auto'")
    return name


def has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


GPU_TRIAL_JOBS = 2      # trials side by side on one GPU: they share it (reports say so)
GPU_LIGHT_TRIAL_JOBS = 4  # ... when each needs little of it (the built-in workload at small sizes)
CPU_TRIAL_JOBS_MAX = 4


def trial_jobs(jobs: int, device: str = "auto", light: bool = False) -> int:
    """`jobs` as asked, or for 0 (auto) what the machine has room for: one trial per core for a CPU program
    (a hung trial costs no CPU, a running one a core), capped at 4; two on a GPU, which they then share, or
    four for `light` trials (a program known to need little GPU memory: more could only crowd a user's
    program out of memory and fail it for the wrong reason)."""
    if jobs and jobs > 0:
        return int(jobs)
    import os

    dev = str(device)
    on_gpu = dev.startswith("cuda") or (dev == "auto" and has_gpu())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if on_gpu:
        return GPU_LIGHT_TRIAL_JOBS if light else GPU_TRIAL_JOBS
    return max(1, min(cores, CPU_TRIAL_JOBS_MAX))
