"""The facts a fix's `applies` is checked against: where the workload runs and what this torch has.

Read in the parent from torch's build flags (no GPU work, no CUDA context), so a fix that cannot mean
anything here (cuDNN or an allocator setting on a CPU) is reported not_applicable instead of being run.
"""
from __future__ import annotations


def facts(device: str, sdpa_mask: bool | None = None) -> dict:
    """{"device": cpu|cuda[:N], "gpu": cuda|rocm|None, "cudnn": bool, "torch": version, "sdpa_mask": the
    workload's attention call carries an explicit mask (True/False for the built-in workload, None when
    unknown: a user's program)}. torch is imported here, when the facts are asked for (not for --help)."""
    import torch
    from torch.nn.attention import SDPBackend

    gpu = "rocm" if getattr(torch.version, "hip", None) else ("cuda" if torch.version.cuda else None)
    on_gpu = str(device).startswith("cuda") and torch.cuda.is_available()
    return {"device": str(device), "gpu": gpu if on_gpu else None,
            "cudnn": bool(on_gpu and torch.backends.cudnn.is_available()
                          and hasattr(SDPBackend, "CUDNN_ATTENTION")),
            "torch": torch.__version__, "sdpa_mask": sdpa_mask}


def workload_mask(cfg) -> bool | None:
    """Whether a workload configuration's attention call is masked: known for the built-in workload only."""
    if cfg is None or cfg.kind != "builtin":
        return None
    return cfg.padded_text_tokens > 0
