"""What some of PyTorch's refusals mean for the program, where the line they raise at is not the line to change,
or where the message alone does not say why now.

Why: "element 0 of tensors does not require grad" is raised at `loss.backward()`, but the loss lost its graph
where it was computed (under torch.no_grad(), from a .detach()ed or .item()-made value, with every parameter
frozen); DDP's "Expected to have finished reduction in the prior iteration" is raised in the forward of the step
after the one whose loss left parameters out; torch.load's "Weights only load failed" meets a checkpoint that
loaded for years, since the default of weights_only changed in 2.6. Each meaning is read from PyTorch's own
message and says what to look for, never a line the evidence does not show. Pure: text in, words out.
"""
from __future__ import annotations

import re

from gpulab import lastwords

_NO_GRAPH = re.compile(r"element \d+ of tensors does not require grad and does not have a grad_fn")
_DDP_UNUSED = re.compile(r"Expected to have finished reduction in the prior iteration before starting a new one")
_DDP_INDICES = re.compile(r"Parameter indices which did not receive grad for rank (?P<rank>\d+):\s*(?P<idx>[\d ]+)")
_DDP_NAMES = re.compile(r"Parameters which did not receive grad for rank (?P<rank>\d+):\s*(?P<names>[^\n]+)")
_MAX_LISTED = 8
_WEIGHTS_ONLY = re.compile(r"Weights only load failed")
# torch.utils.checkpoint's reentrant form warns when no input of the checkpointed call requires grad: its output is
# then cut from the graph (a frozen backbone's activations into a trainable adapter, say)
_REENTRANT = re.compile(r"None of the inputs have requires_grad=True\. Gradients will be None")
# torch.load of a file that is no whole torch.save archive: its end (the zip's central directory) is missing
_TRUNCATED = re.compile(r"PytorchStreamReader failed reading zip archive: failed finding central directory")
_INT_DIV = re.compile(r"ZeroDivisionError")   # aten's integer division, eager or in torch.compile's generated code
# two dtypes met in one call: addmm/mm ("mat1 and mat2 must have the same dtype, but got Double and Float"), matmul
# and the older kernels ("expected scalar type Float but found Double", "expected m1 and m2 to have the same dtype,
# but got: double != float"), convolutions ("Input type (double) and bias type (float) should be the same")
_TWO_DTYPES = re.compile(
    r"must have the same dtype, but got (?P<a>\w+) and (?P<b>\w+)"
    r"|expected scalar type (?P<c>\w+) but found (?P<d>\w+)"
    r"|to have the same dtype, but got:? (?P<e>\w+) != (?P<f>\w+)"
    r"|Input type \((?:torch\.)?(?:cuda\.)?(?P<g>[A-Za-z0-9]+?)(?:Tensor)?\) and (?:weight|bias) type "
    r"\((?:torch\.)?(?:cuda\.)?(?P<h>[A-Za-z0-9]+?)(?:Tensor)?\) should be the same")
_DTYPE_NAMES = {"double": "float64", "float": "float32", "half": "float16"}   # the rest are torch's own names
_STATE_KEYS = re.compile(r"Missing key\(s\) in state_dict: (?P<missing>.+?)\.\s*\n?\s*"
                         r"Unexpected key\(s\) in state_dict: (?P<unexpected>.+?)\.\s*(?:\n|$)", re.S)
_KEY = re.compile(r'"([^"]+)"')
_WRAPPERS = {"module.": ("DistributedDataParallel or DataParallel", "model.module"),
             "_orig_mod.": ("torch.compile", "model._orig_mod")}
_GLOBAL = re.compile(r"Unsupported global: GLOBAL (?P<name>[\w.]+)")


def meaning(text: str) -> tuple[str, str] | None:
    """(what the line it was raised at is, the program-side meaning) of the refusal in `text` (a traceback's
    tail), or None for any other message."""
    if _NO_GRAPH.search(text or "") and _REENTRANT.search(text or ""):
        return ("backward() of a tensor with no graph, after torch.utils.checkpoint warned",
                "torch.utils.checkpoint warned that no input of a checkpointed call requires grad (the reentrant "
                "form, use_reentrant=True): that call's output carries no graph, so nothing before backward() "
                "reaches a parameter that trains (a frozen block's output into a checkpointed trainable one): "
                "checkpoint(..., use_reentrant=False) keeps the graph through the call's own parameters")
    if _TRUNCATED.search(text or ""):
        return ("torch.load of a file that is not a whole checkpoint",
                "the file is not a whole torch.save archive (its end is missing): a save cut short (a job preempted "
                "or killed while it wrote, a full disk) or a file still being written or copied; load the checkpoint "
                "before it, and write checkpoints whole: torch.save to a temporary name, then os.replace() it onto "
                "the final one")
    if _NO_GRAPH.search(text or ""):
        return ("backward() of a tensor with no graph",
                "the tensor backward() was called on has no autograd graph: it was computed with gradients off "
                "(inside torch.no_grad() or torch.inference_mode(), an evaluation helper reused for training), from "
                "values cut from the graph (.detach(), .item(), .numpy(), torch.tensor(x) of a tensor), or with every "
                "parameter it depends on frozen (requires_grad=False): the line to change is where that tensor and "
                "its inputs were computed, before this call")
    if _WEIGHTS_ONLY.search(text or ""):
        g = _GLOBAL.search(text)
        what = f"`{g.group('name')}`" if g else "an object that is not a tensor or a plain container"
        allow = f"torch.serialization.add_safe_globals([{g.group('name')}])" if g else \
            "torch.serialization.add_safe_globals([...]) with the type it names"
        return ("torch.load, whose weights_only=True is the default since PyTorch 2.6",
                f"the checkpoint holds {what}, which torch.load refuses with weights_only=True (the default since "
                f"PyTorch 2.6; the file was written before, or with more than tensors): if the file is your own or "
                f"trusted, torch.load(..., weights_only=False); or allow that type ({allow}); or save only tensors "
                f"and plain Python values (a numpy array as a tensor, a generator's state as a dict of ints)")
    if _INT_DIV.search(lastwords.of(text or "")):
        return ("an integer division by zero",
                "a divisor the program passed holds 0 (`//`, `%` or torch.div(..., rounding_mode=...) of integer "
                "tensors; floating division gives inf instead; torch.compile's generated code checks the same): keep "
                "the divisor from 0 where it is made (clamp(min=1), or torch.where(d == 0, 1, d) with the rows it "
                "stands for handled apart)")
    two = _TWO_DTYPES.search(text or "")
    if two:
        got = [_DTYPE_NAMES.get(g.lower(), g.lower()) for g in two.groups() if g]
        return ("a call that met tensors of two dtypes", _two_dtypes(got[0], got[1]))
    keys = _prefix(text or "")
    if keys:
        return keys
    if _DDP_UNUSED.search(text or ""):
        names = _DDP_NAMES.search(text)
        idx = _DDP_INDICES.search(text)
        if names:
            which = f"{_listed(names.group('names').replace(',', ' ').split())} on rank {names.group('rank')}"
        elif idx:
            which = (f"indices {_listed(idx.group('idx').split())} of model.parameters() on rank {idx.group('rank')} "
                     f"(TORCH_DISTRIBUTED_DEBUG=DETAIL names them)")
        else:
            which = "some parameters (TORCH_DISTRIBUTED_DEBUG=DETAIL names them)"
        return ("DDP's forward, a step after the one that left parameters out",
                f"DistributedDataParallel waited for gradients the step before never produced: {which} took no part "
                f"in that step's loss (a branch or head that did not run, a loss term left out, a frozen layer "
                f"still wrapped): make every wrapped parameter reach the loss, leave it out of the module DDP wraps, "
                f"or pass find_unused_parameters=True to DDP (a walk of the graph every step)")
    return None


def _two_dtypes(a: str, b: str) -> str:
    if "float64" in (a, b):
        return (f"one operand is {a}, the other {b}: float64 comes from numpy arrays (torch.from_numpy and "
                f"torch.tensor keep numpy's default float64) or a .double() somewhere, while a layer's weights are "
                f"float32: convert where the input is made (torch.from_numpy(x).float(), x.astype(np.float32), or "
                f"x.to(the weights' dtype)); the line that raised only met it")
    return (f"one operand is {a}, the other {b}: a model cast to one dtype (.half(), .to(torch.bfloat16)) fed "
            f"tensors of another, or an autocast region's output meeting a layer outside it: cast the input to "
            f"the weights' dtype (x.to(next(model.parameters()).dtype)) or run both inside the same torch.autocast")


def _prefix(text: str) -> tuple[str, str] | None:
    """load_state_dict's missing and unexpected keys that are the same names with a wrapper's prefix."""
    m = _STATE_KEYS.search(text)
    if not m:
        return None
    missing, unexpected = _KEY.findall(m.group("missing")), _KEY.findall(m.group("unexpected"))
    if not missing or not unexpected:
        return None
    for pre, (who, inner) in _WRAPPERS.items():
        if _carry(unexpected, pre, missing):
            return ("load_state_dict of keys saved with a wrapper's prefix",
                    f"every key the checkpoint has is a key the model wants with `{pre}` in front: it was saved from "
                    f"the model wrapped by {who}: save the unwrapped model's state_dict() ({inner}), or strip the "
                    f"prefix as it loads: "
                    f"torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state, '{pre}')")
        if _carry(missing, pre, unexpected):
            return ("load_state_dict into a wrapped model",
                    f"every key the model wants is a key the checkpoint has with `{pre}` in front: the model is "
                    f"wrapped by {who} and the checkpoint is the plain model's: load it into the unwrapped model "
                    f"({inner}), or before wrapping")
    return None


def _carry(keys: list[str], pre: str, others: list[str]) -> bool:
    """Every key is one of the others with `pre` in front."""
    return all(k.startswith(pre) for k in keys) and {k.removeprefix(pre) for k in keys} >= set(others)


def _listed(items: list[str]) -> str:
    shown = " ".join(items[:_MAX_LISTED])
    return shown + (f" (and {len(items) - _MAX_LISTED} more)" if len(items) > _MAX_LISTED else "")
