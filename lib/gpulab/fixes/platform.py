"""The facts a fix's `applies` is checked against: where the workload runs and what this torch has.

Read in the parent from torch's build flags (no GPU work, no CUDA context), so a fix that cannot mean
anything here (cuDNN or an allocator setting on a CPU) is reported not_applicable instead of being run.
"""
from __future__ import annotations

from gpulab import device as gdevice


def facts(device: str, sdpa_mask: bool | None = None) -> dict:
    """{"device": cpu|cuda[:N], "gpu": cuda|rocm|None, "cudnn": bool, "torch": version, "sdpa_mask": the
    workload's attention call carries an explicit mask (True/False for the built-in workload, None when
    unknown: a user's program)}. torch is imported only for a GPU device: on the CPU nothing here needs more
    than torch's version file, and 04's kernel, which only starts children, then never loads torch (3.5
    CPU-s of a 2-core machine)."""
    if gdevice.kind(device) == "cpu":
        built = _build_file()
        if built is not None:
            return {"device": str(device), "gpu": None, "cudnn": False, "torch": built.get("__version__"),
                    "sdpa_mask": sdpa_mask}
    import torch
    from torch.nn.attention import SDPBackend

    gpu = "rocm" if getattr(torch.version, "hip", None) else ("cuda" if torch.version.cuda else None)
    on_gpu = str(device).startswith("cuda") and torch.cuda.is_available()
    return {"device": str(device), "gpu": gpu if on_gpu else None,
            "cudnn": bool(on_gpu and torch.backends.cudnn.is_available()
                          and hasattr(SDPBackend, "CUDNN_ATTENTION")),
            "torch": torch.__version__, "sdpa_mask": sdpa_mask}


def _build_file() -> dict | None:
    """The constants torch/version.py assigns (the build writes it: `__version__ = '2.13.0+cpu'`, `cuda = None`),
    read without importing torch; None where it cannot be found or read, and the caller imports torch."""
    import ast
    import importlib.util
    from pathlib import Path

    try:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.origin:
            return None
        tree = ast.parse(Path(spec.origin).with_name("version.py").read_text())
    except (OSError, SyntaxError, ImportError, ValueError):
        return None
    names = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and isinstance(getattr(node, "value", None), ast.Constant):
            names[target.id] = node.value.value
    return names if isinstance(names.get("__version__"), str) else None


def workload_mask(cfg) -> bool | None:
    """Whether a workload configuration's attention call is masked: known for the built-in workload only."""
    if cfg is None or cfg.kind != "builtin":
        return None
    return cfg.padded_text_tokens > 0
