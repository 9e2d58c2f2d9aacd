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
