"""The built-in workload (a small diffusion-transformer with joint text+image attention and LoRA), and
user workloads (`module:callable`, `script:path args`), so every notebook runs the same thing: here the
vocabulary they share and how a workload starts as a child (`python -m gpulab.workloads`, what every ladder
trial runs). Free of torch: the watchdog, the chain runner and most modules import this and must not pay
torch's import. The model and the running of its rungs are gpulab.builtin_model (its prepare, run, Prepared
and save_outputs still resolve here, imported on first use).

Why a ladder of rungs: a failure that shows in a bare attention call (`sdpa`) is a kernel problem; one that
needs `forward`, `step` (backward + AdamW) or many `steps` (memory growth) points elsewhere.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from gpulab.report import write_json

RUNGS = ("sdpa", "forward", "step", "steps")
# The vocabulary every subpackage shares (defined here once).
BACKENDS = ("math", "flash", "efficient", "cudnn")          # concrete SDPA backends, gpulab's names
FUSED_BACKENDS = ("flash", "efficient", "cudnn")
SDPA_CANDIDATES = {b: f"sdpa_{b}" for b in BACKENDS}   # backend -> its oracle candidate's name ("math" -> "sdpa_math")
SDPA_BACKENDS = ("auto",) + BACKENDS                        # the sdpa_backend parameter's choices
DTYPE_NAMES = ("float32", "bfloat16", "float16")
DTYPES = ("auto",) + DTYPE_NAMES                            # the dtype parameter's choices
DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
DEVICES = ("auto", "cpu", "cuda")
PYTHON_ENV = "GPULAB_PYTHON"   # another interpreter for the workload children (a fix's `python`: a patched torch)
_INT_KEYS = ("batch", "heads", "head_dim", "text_tokens", "image_tokens", "layers", "lora_rank", "steps", "seed")
# gpulab's SDPA backend names -> torch.nn.attention.SDPBackend members (the one mapping in the package)
SDPA_ENUM_NAMES = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                   "cudnn": "CUDNN_ATTENTION"}


def sdpa_backend_enum(name: str):
    """The SDPBackend for a backend name; None when this torch lacks it (cuDNN before torch 2.5)."""
    from torch.nn.attention import SDPBackend

    if name not in SDPA_ENUM_NAMES:
        raise ValueError(f"SDPA backend {name!r} is not valid; choose one of {', '.join(SDPA_ENUM_NAMES)}")
    return getattr(SDPBackend, SDPA_ENUM_NAMES[name], None)


def backend_name(code: Any) -> str:
    """An SDPBackend (or its int, as torch._fused_sdp_choice returns it) -> gpulab's name ('math', ...)."""
    from torch.nn.attention import SDPBackend

    by_value = {int(v): k for k, v in SDPBackend.__members__.items()}
    member = by_value.get(int(code), str(code))
    return {v: k for k, v in SDPA_ENUM_NAMES.items()}.get(member, member.lower())


def dtype_name(dtype: Any) -> str:
    """'bf16', 'bfloat16', torch.bfloat16 -> 'bfloat16'; raises naming the valid choices."""
    text = str(dtype).replace("torch.", "").strip().lower()
    text = DTYPE_ALIASES.get(text, text)
    if text not in DTYPE_NAMES:
        raise ValueError(f"dtype {dtype!r} is not valid; choose one of {', '.join(DTYPE_NAMES)} "
                         f"(aliases: {', '.join(DTYPE_ALIASES)})")
    return text


def resolve_dtype(dtype: Any, device: str) -> str:
    """The 'auto' rule, once: bfloat16 on a GPU, float32 on the CPU; other values normalized by dtype_name."""
    if str(dtype) == "auto":
        return "bfloat16" if str(device).startswith("cuda") else "float32"
    return dtype_name(dtype)


def torch_dtype(dtype: Any):
    import torch

    return getattr(torch, dtype_name(dtype))


MASK_KINDS = ("padding", "none", "bool", "additive")   # AttentionCall.mask


@dataclass(frozen=True)
class AttentionCall:
    """The scaled_dot_product_attention call the built-in workload makes in every layer (same shapes each
    time): what notebook 01 probes, 05 judges and 06 times, so all three describe the same call. A user
    program's call, as notebook 02 recorded it (gpulab.recorded), is one too: keys may then be longer or
    shorter than queries (kv_len), and its mask is any boolean or additive mask of the recorded shape."""
    batch: int
    heads: int
    seq_len: int
    head_dim: int
    dtype: str                  # resolved: float32 | bfloat16 | float16
    mask: str = "padding"       # padding (boolean key-padding mask, as the workload) | none | bool | additive
    padded_keys: int = 0        # keys masked out in every row (the padding text tokens)
    pad_end: int | None = None  # the masked keys end here (default: at the end of the sequence)
    causal: bool = False
    kv_len: int | None = None   # keys (and values) per sequence when they differ from seq_len (queries)
    mask_shape: tuple[int, ...] | None = None   # the bool/additive mask's shape (broadcast against B,H,Sq,Sk)

    def __post_init__(self) -> None:
        if self.mask not in MASK_KINDS:
            raise ValueError(f"mask={self.mask!r} is not valid; choose one of {', '.join(MASK_KINDS)}")
        if self.mask_shape is not None:   # a JSON round trip gives a list
            object.__setattr__(self, "mask_shape", tuple(int(n) for n in self.mask_shape))
        if self.mask in ("bool", "additive") and not self.mask_shape:
            raise ValueError(f"mask={self.mask!r} needs mask_shape (the recorded mask's shape)")

    @property
    def keys(self) -> int:
        """Keys per sequence (Sk): kv_len, or seq_len for self-attention."""
        return self.seq_len if self.kv_len is None else self.kv_len

    def describe(self) -> str:
        shape = "x".join(map(str, self.mask_shape or ()))
        m = {"padding": f"boolean key-padding mask ({self.padded_keys} of {self.seq_len} keys masked)",
             "none": "no mask", "bool": f"boolean mask of shape {shape}",
             "additive": f"additive float mask of shape {shape}"}[self.mask]
        sk = f" Sk={self.kv_len}" if self.kv_len is not None and self.kv_len != self.seq_len else ""
        return (f"B={self.batch} H={self.heads} S={self.seq_len}{sk} D={self.head_dim} {self.dtype}, {m}"
                + (", causal" if self.causal else ""))

    def unmasked(self) -> "AttentionCall":
        return dataclasses.replace(self, mask="none", padded_keys=0, pad_end=None, mask_shape=None)

    def inputs(self, device: str, seed: int = 0, requires_grad: bool = False) -> tuple:
        """(q, k, v, attn_mask) on `device`; the mask is None for mask='none'."""
        import torch

        g = torch.Generator(device="cpu").manual_seed(seed)
        dt = torch_dtype(self.dtype)
        shapes = ((self.batch, self.heads, self.seq_len, self.head_dim),
                  *[(self.batch, self.heads, self.keys, self.head_dim)] * 2)
        q, k, v = (torch.randn(s, generator=g).to(device, dt).requires_grad_(requires_grad) for s in shapes)
        if self.mask == "padding":
            mask = key_padding_mask(self.batch, self.seq_len, self.padded_keys, device, self.pad_end)
        elif self.mask == "bool":   # ~80% of keys attended, key 0 always (no row left without a key)
            keep = torch.rand(self.mask_shape, generator=g) < 0.8
            keep[..., 0] = True
            mask = keep.to(device)
        elif self.mask == "additive":
            mask = torch.randn(self.mask_shape, generator=g).to(device, dt)
        else:
            mask = None
        return q, k, v, mask


def key_padding_mask(batch: int, seq_len: int, padded: int, device: str, pad_end: int | None = None):
    """Boolean (B, 1, S, S) mask, True = attend; the `padded` keys ending at `pad_end` (default: the end)
    are never attended to, as padding tokens are."""
    import torch

    valid = torch.ones(batch, seq_len, dtype=torch.bool)
    end = seq_len if pad_end is None else pad_end
    if padded:
        valid[:, end - padded:end] = False
    return valid[:, None, None, :].expand(batch, 1, seq_len, seq_len).contiguous().to(device)


@dataclass(frozen=True)
class WorkloadConfig:
    workload: str = "builtin"   # builtin | module:callable | script:path/to/train.py [args]
    rung: str = "forward"
    sdpa_backend: str = "auto"
    dtype: str = "auto"
    batch: int = 2
    heads: int = 4
    head_dim: int = 32
    text_tokens: int = 16
    image_tokens: int = 64
    layers: int = 2
    lora_rank: int = 8
    steps: int = 10
    device: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        for key, choices in (("rung", RUNGS), ("sdpa_backend", SDPA_BACKENDS), ("dtype", DTYPES)):
            if getattr(self, key) not in choices:
                raise ValueError(f"{key}={getattr(self, key)!r} is not valid; choose one of {', '.join(choices)}")
        if str(self.device).split(":", 1)[0] not in DEVICES:
            raise ValueError(f"device={self.device!r} is not valid; choose one of {', '.join(DEVICES)} (or cuda:N)")
        for key in _INT_KEYS:
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or (v < 1 and key not in ("seed", "lora_rank")) or v < 0:
                raise ValueError(f"{key}={v!r} is not valid; it must be a positive integer")
        kind = self.kind
        if kind == "module" and not _split_callable(self.workload[len("module:"):] if self.workload.startswith(
                "module:") else self.workload):
            raise ValueError(f"workload={self.workload!r} is not valid; use module:callable (e.g. mypkg.train:main)")
        if kind == "script" and not shlex.split(self.workload[len("script:"):]):
            raise ValueError(f"workload={self.workload!r} is not valid; use script:path/to/train.py [args]")

    @property
    def kind(self) -> str:
        w = self.workload.strip()
        if w == "builtin":
            return "builtin"
        if w.startswith("script:"):
            return "script"
        if w.startswith("module:") or (":" in w and " " not in w):
            return "module"
        raise ValueError(f"workload={self.workload!r} is not valid; choose one of builtin, module:callable, "
                         f"script:path/to/train.py [args]")

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None = None, /, **kw: Any) -> "WorkloadConfig":
        """Build from notebook parameters (a mapping such as a notebook's globals(), and/or keywords); keys
        that are not workload keys are ignored, since notebooks hold more."""
        names = {f.name for f in dataclasses.fields(cls)}
        merged = {**dict(params or {}), **kw}
        return cls(**{k: v for k, v in merged.items() if k in names})

    def resolved_dtype(self, device: str) -> str:
        return resolve_dtype(self.dtype, device)

    @property
    def padded_text_tokens(self) -> int:
        """The last quarter of the text tokens are padding (never attended to)."""
        return self.text_tokens // 4

    def attention(self, device: str) -> AttentionCall:
        """The attention call this configuration makes (built-in workload; a user workload's calls are
        what 02 records)."""
        return AttentionCall(self.batch, self.heads, self.text_tokens + self.image_tokens, self.head_dim,
                             self.resolved_dtype(device), "padding" if self.padded_text_tokens else "none",
                             self.padded_text_tokens, self.text_tokens)


@dataclass(frozen=True)
class WorkloadResult:
    rung: str
    device: str
    dtype: str
    sdpa_backend: str           # as asked
    sdpa_backend_used: str      # what torch._fused_sdp_choice picks for this input under the asked backend
    losses: tuple[float, ...]
    memory: tuple[dict, ...]    # per step: CUDA allocated/reserved/peak bytes, or CPU rss bytes
    seconds: float
    trainable_params: int = 0
    total_params: int = 0
    times_s: tuple[float, ...] = ()   # wall time of each timed repeat of the rung (a fix's cost), after the first run

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _split_callable(spec: str) -> tuple[str, str] | None:
    mod, _, fn = spec.partition(":")
    return (mod, fn) if mod and fn else None


def interpreter() -> str:
    """The Python that runs workload children: a fix's interpreter ($GPULAB_PYTHON), else this one."""
    return os.environ.get(PYTHON_ENV) or sys.executable


def fix_interpreter(interp: str, fix_python: str | None) -> str:
    """A command's interpreter under a fix's (a patched PyTorch's): it replaces gpulab's own, never a Python
    the user named (that one is what the user wants run)."""
    return fix_python if fix_python and interp == sys.executable else interp


def cli_args(cfg: WorkloadConfig) -> list[str]:
    """The `python -m gpulab.workloads` flags that reproduce cfg."""
    out = ["--workload", cfg.workload]
    for f in dataclasses.fields(cfg):
        if f.name != "workload":
            out += [f"--{f.name.replace('_', '-')}", str(getattr(cfg, f.name))]
    return out


def command(cfg: WorkloadConfig) -> list[str]:
    """argv (the interpreter first) that runs the configured workload as a child process."""
    if cfg.kind == "script":
        argv = shlex.split(cfg.workload[len("script:"):])
        if argv[0] == "torchrun":   # the launcher's console script is torch.distributed.run, run by this interpreter
            argv = ["-m", "torch.distributed.run", *argv[1:]]
        return [interpreter(), *argv]
    return [interpreter(), "-m", "gpulab.workloads", *cli_args(cfg)]


def cli_parser() -> argparse.ArgumentParser:
    """The `python -m gpulab.workloads` flags (one per WorkloadConfig field), shared by every child that
    rebuilds the workload from cli_args()."""
    p = argparse.ArgumentParser(prog="python -m gpulab.workloads", description=__doc__.splitlines()[0])
    defaults = WorkloadConfig()
    p.add_argument("--workload", default=defaults.workload)
    for f in dataclasses.fields(WorkloadConfig):
        if f.name == "workload":
            continue
        choices = {"rung": RUNGS, "sdpa_backend": SDPA_BACKENDS, "dtype": DTYPES}.get(f.name)
        p.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, default=getattr(defaults, f.name),
                       type=int if f.name in _INT_KEYS else str, choices=choices)
    return p


def parse_cli(argv: list[str]) -> WorkloadConfig:
    p = cli_parser()
    try:
        return WorkloadConfig(**vars(p.parse_args(argv)))
    except ValueError as exc:
        p.error(str(exc))
        raise


def main(argv: list[str] | None = None, run: Callable[..., WorkloadResult] | None = None) -> int:
    """The workload child: `run` is gpulab.builtin_model.run, passed in by the `__main__` block below, so this
    module (the torch-free vocabulary builtin_model reads) never imports it back."""
    if run is None:
        raise TypeError("main needs run=gpulab.builtin_model.run (python -m gpulab.workloads passes it)")
    p = cli_parser()
    p.add_argument("--json", default=None, help="write the WorkloadResult here")
    p.add_argument("--time-for", type=float, default=0.0, metavar="S",
                   help="then repeat the rung for S seconds (at least 3 times), each repeat timed")
    p.add_argument("--outputs", default=None, help="save what the run computed here (torch.save)")
    ns = vars(p.parse_args(argv))
    out, time_for, outputs = ns.pop("json"), ns.pop("time_for"), ns.pop("outputs")
    try:
        cfg = WorkloadConfig(**ns)
    except ValueError as exc:
        p.error(str(exc))
    res = run(cfg, time_for=time_for, outputs=outputs)
    line = (f"{res.rung} on {res.device} ({res.dtype}, sdpa {res.sdpa_backend_used}): "
            f"{len(res.losses)} step(s), loss {res.losses[-1] if res.losses else float('nan'):.5f}, "
            f"{res.seconds:.3f} s")
    print(line, file=sys.stderr)
    if out:
        write_json(out, res.to_dict())
    return 0


if __name__ == "__main__":   # this file as the program (module __main__): builtin_model imports gpulab.workloads
    from gpulab.builtin_model import run as _run

    sys.exit(main(run=_run))
