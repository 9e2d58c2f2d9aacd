"""The oracle's case sets by name, and which one a device gets. Apart from gpulab.oracle.cases (the inputs
themselves, made with torch) so that notebook 05 checks its parameter, and finds it does not apply, without
importing torch."""
from __future__ import annotations

from gpulab.device import kind

CASE_SETS = ("default", "quick")
CASE_CHOICES = ("auto", *CASE_SETS)   # what notebook 05 accepts: auto picks a set for the device (for_device)


def for_device(cases: str, device: str) -> str:
    """'auto' -> the set for the device: 'default' on a GPU, whose kernels 05 exists to judge; 'quick' on the CPU,
    where the candidates are PyTorch's own CPU kernels and gpulab's references, and the default set costs a
    first `make run` half a minute of two cores (45 CPU-s). Any other name is kept, to be checked by case_set."""
    if cases != "auto":
        return cases
    return "quick" if kind(device) == "cpu" else "default"
