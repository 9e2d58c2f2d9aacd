"""Why an op made the first NaN/Inf, in words a person can check: from the op's name and a few facts about its
inputs and output (counts, extremes), never from the tensors themselves, so the recorder (stats mode), `gpulab
compare` and tests share one judgement. `cause()` is pure; `facts_of()` reads a tensor's facts through the
tensor's own methods (torch is never imported here).

The cause says whose fault the NaN is in the op's terms: a divisor with zeros, a log or sqrt outside its
domain, a variance of one element, an exp or a matmul or a cast past the dtype's range, a softmax row that is
all -inf, or an input that already held NaN/+Inf (the cause is earlier: look at the op that made it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

# the largest finite value of each floating dtype (by name, as torch prints it without "torch.")
DTYPE_MAX = {"float16": 65504.0, "half": 65504.0, "bfloat16": 3.3895313892515355e38,
             "float32": 3.4028234663852886e38, "float": 3.4028234663852886e38,
             "float64": 1.7976931348623157e308, "double": 1.7976931348623157e308,
             "float8_e4m3fn": 448.0, "float8_e4m3fnuz": 240.0, "float8_e5m2": 57344.0, "float8_e5m2fnuz": 57344.0}
LOW_PRECISION = ("float16", "half", "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")

KINDS = ("input_nan", "input_inf", "input_neginf", "zero_divisor", "variance_dof", "unit_domain", "log_domain",
         "sqrt_domain", "pow_domain", "overflow", "matmul_overflow", "cast_overflow", "softmax_masked_row", "growth",
         "uninitialized", "no_targets", "unknown")
GROWTH = 1e3          # an op's outputs that grew this many times over ...
GROWTH_PASSES = 3     # ... at least this many earlier passes, then overflow: the run diverges

# op families by base name (aten.<base>.<overload>, without a leading or trailing underscore)
_DIVIDE = {"div": 1, "true_divide": 1, "floor_divide": 1, "remainder": 1, "fmod": 1, "divide": 1,
           "reciprocal": 0, "rsqrt": 0}          # base -> which input is the divisor
_LOG = ("log", "log2", "log10", "xlogy")
_LOG1P = ("log1p",)
_SQRT = ("sqrt", "rsqrt")
_NEGINF_TO_FINITE = ("exp", "exp2", "expm1")
_EXP = ("exp", "exp2", "expm1", "sinh", "cosh", "pow", "mul", "multiply", "square", "ldexp")
_MATMUL = ("mm", "bmm", "matmul", "addmm", "baddbmm", "addbmm", "linear", "mv", "addmv", "dot", "einsum",
           "convolution", "conv1d", "conv2d", "conv3d", "scaled_mm", "addmm_activation", "tensordot")
_CAST = ("to_copy", "to", "copy", "to_dtype", "type_as", "convert_element_type", "npu_dtype_cast")
_SOFTMAX = ("softmax", "log_softmax", "safe_softmax", "softmax_backward_data")
_VARIANCE = ("var", "std", "var_mean", "std_mean")   # N - correction elements to divide by
_FROM_STORAGE = ("set", "from_file", "from_blob")   # ops that make a tensor of existing memory (set_: its storage)
# nll_loss's arguments (x, target, weight, reduction, ignore_index): its mean divides by the counted targets' weight
_NLL = ("nll_loss_forward", "nll_loss2d_forward", "nll_loss", "nll_loss2d", "nll_loss_nd")


@dataclass(frozen=True)
class TensorFacts:
    """What the judgement needs of one input or the output. A Python number is a tensor of shape () with
    `scalar` set. min/max are over the finite values (None: no finite value)."""
    dtype: str
    shape: tuple[int, ...] = ()
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    min: float | None = None
    max: float | None = None
    zeros: int = 0
    nonpositive: int = 0    # values <= 0 (zeros included)
    scalar: float | None = None

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "shape": list(self.shape), "nan": self.nan, "posinf": self.posinf,
                "neginf": self.neginf, "min": self.min, "max": self.max, "zeros": self.zeros,
                "nonpositive": self.nonpositive, "scalar": self.scalar}

    @staticmethod
    def from_dict(d: dict) -> "TensorFacts":
        return TensorFacts(str(d.get("dtype")), tuple(d.get("shape") or ()), int(d.get("nan") or 0),
                           int(d.get("posinf") or 0), int(d.get("neginf") or 0), d.get("min"), d.get("max"),
                           int(d.get("zeros") or 0), int(d.get("nonpositive") or 0), d.get("scalar"))


@dataclass(frozen=True)
class Cause:
    """kind: one of KINDS; words: the cause in a sentence fragment ("the divisor holds zeros (input 1: 16
    zeros)"); input: the index of the input that explains it, or None; earlier: the NaN/Inf came in through an
    input, so the op that made it is earlier than this one; at: the call site of the earlier op whose line is the
    one to change (a log that made the -Inf this op turns into NaN), None when it is this op's own."""
    kind: str
    words: str
    input: int | None = None
    at: str | None = None

    @property
    def earlier(self) -> bool:
        return self.kind in ("input_nan", "input_inf")

    def to_dict(self) -> dict:
        return {"kind": self.kind, "words": self.words, "input": self.input,
                **({"at": self.at} if self.at else {})}


def scalar_facts(value: float) -> TensorFacts:
    """A Python number argument (`x / 0.0`, `x ** 0.5`) as facts."""
    v = float(value)
    fin = math.isfinite(v)
    return TensorFacts("scalar", (), int(math.isnan(v)), int(v == math.inf), int(v == -math.inf),
                       v if fin else None, v if fin else None, int(v == 0), int(v <= 0), v)


def facts_of(value: Any) -> TensorFacts | None:
    """Facts of a floating or integer tensor (through its methods: one pass of reductions) or a Python
    number; None for anything else. Costs a host sync on a GPU: call it once, at the first NaN."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return scalar_facts(value)
    if isinstance(value, (list, tuple)):   # a foreach op's tensors (the optimizer's), or cat's: as one input
        parts = [facts_of(v) for v in value]
        return merged([f for f in parts if f is not None]) if any(p is not None for p in parts) else None
    if not all(hasattr(value, a) for a in ("dtype", "shape", "isnan", "numel")):
        return None
    dtype = str(value.dtype).removeprefix("torch.")
    shape = tuple(int(s) for s in value.shape)
    if value.numel() == 0 or getattr(value.device, "type", "") == "meta" or value.is_complex() or dtype == "bool":
        return TensorFacts(dtype, shape)
    x = value.detach()
    if not x.is_floating_point():
        x = x.double()
    nan = int(x.isnan().sum())
    posinf, neginf = int((x == math.inf).sum()), int((x == -math.inf).sum())
    fin = x[x.isfinite()]
    lo = hi = None
    if fin.numel():
        mn, mx = fin.aminmax()
        lo, hi = float(mn), float(mx)
    return TensorFacts(dtype, shape, nan, posinf, neginf, lo, hi, int((x == 0).sum()), int((x <= 0).sum()))


def merged(parts: Sequence[TensorFacts]) -> TensorFacts:
    """Several tensors' facts as one input's (a list argument): counts summed, extremes over all."""
    los = [f.min for f in parts if f.min is not None]
    his = [f.max for f in parts if f.max is not None]
    return TensorFacts(parts[0].dtype, (sum(math.prod(f.shape) for f in parts),), sum(f.nan for f in parts),
                       sum(f.posinf for f in parts), sum(f.neginf for f in parts), min(los) if los else None,
                       max(his) if his else None, sum(f.zeros for f in parts), sum(f.nonpositive for f in parts))


def base_name(op: str) -> str:
    """`aten.div.Tensor` -> `div`, `aten._to_copy.default` -> `to_copy`, `aten.mul_.Tensor` -> `mul`,
    `aten._foreach_div.List` -> `div`, `torch.exp` / `exp` -> `exp`."""
    parts = str(op).split(".")
    name = parts[1] if len(parts) > 1 and parts[0] in ("aten", "prims", "torch", "quantized", "Tensor") else parts[0]
    if name in ("nn", "functional") and len(parts) > 2:
        name = parts[-1]
    return name.strip("_").removeprefix("foreach_")


def is_log(op: str) -> bool:
    """A log's -Inf comes from values <= 0 it was given, never from a mask."""
    return base_name(op) in _LOG + _LOG1P


def log_made(why: Cause, op: str, log: Mapping[str, Any], made: str = "NaN") -> Cause:
    """why (an input's -Inf that op turns into NaN or +Inf: input_neginf) when a log made that -Inf, here or
    through ops that passed it on: log is where it ran (op, call_site, pass) and how many zeros / values <= 0 it
    read."""
    what = (f"{log['zeros']} zero(s)" if log.get("zeros") else
            f"{log['nonpositive']} value(s) <= 0" if log.get("nonpositive") else "values <= 0")
    return Cause("log_domain", f"input {why.input} holds -Inf that {base_name(log['op'])} made at {log['call_site']} "
                 f"(pass {log['pass']}) from {what} (the log of 0 is -Inf), and {base_name(op)} turns it into {made}",
                 why.input, log.get("call_site"))


def uninitialized(why: Cause, op: str, alloc: Mapping[str, Any], written: int | None = None) -> Cause:
    """why (an input's NaN/Inf that no recorded op made, or no known cause of an op that updated input
    `written` in place) when that input is memory an empty() allocated and no recorded op wrote since: the
    value is whatever bytes the allocator's block held before (a freed tensor's), a line of the program's
    (reading before writing), not the data; or code the recorder does not see wrote it (a Triton kernel
    launched directly). alloc: where the empty() ran (op, call_site, pass)."""
    if why.kind == "unknown" and written is not None:
        why = Cause("input_nan", why.words, written)
    if why.kind not in ("input_nan", "input_inf") or why.input is None:
        return why
    return Cause("uninitialized", f"input {why.input} is memory that {base_name(alloc['op'])} allocated at "
                 f"{alloc['call_site']} (pass {alloc['pass']}), and no PyTorch op wrote it before {base_name(op)} "
                 f"read it: either nothing did, and its values are the bytes a freed tensor left there, or code "
                 f"outside PyTorch's ops did (a Triton or CUDA kernel launched directly, .numpy(), an extension) and "
                 f"wrote the NaN/Inf", why.input, alloc.get("call_site"))


def loaded(why: Cause, op: str, loader: str) -> Cause:
    """why (an input's NaN/Inf that no recorded op made) when the op ran inside `loader` (torch.load): the
    tensor is a checkpoint's, and the run that saved it had the NaN/Inf already."""
    if not why.earlier:
        return why
    what = "NaN" if why.kind == "input_nan" else "+Inf"
    return Cause(why.kind, f"{base_name(op)} made a tensor of what {loader} read from a file, which already holds "
                 f"{what}: the run that saved that checkpoint had it", why.input)


def grown(why: Cause, op: str, dtype: str, history: Mapping[str, Any] | None) -> Cause:
    """why (an overflow) when the op's outputs at its earlier passes grew pass after pass (history: its first
    pass and latest pass before this one, each with the outputs' largest |value|): the values ran away, over the
    training's steps (a learning rate too high, no gradient clipping) or within one (a recurrence whose weights
    grow what they multiply), and the overflow is where that ends, not its cause. Any other cause stands."""
    if why.kind not in ("overflow", "matmul_overflow") or not history:
        return why
    p1, a1, pk, ak = (history.get(k) for k in ("first_pass", "first", "last_pass", "last"))
    if not (p1 and pk and a1 and ak) or pk - p1 + 1 < GROWTH_PASSES or ak < GROWTH * a1:
        return why
    rate = (ak / a1) ** (1.0 / (pk - p1))
    top = _dmax(dtype)
    narrow = (f" ({dtype}'s largest value is {_g(top)}; bfloat16 has float32's range)"
              if dtype in LOW_PRECISION and dtype != "bfloat16" and top else "")
    return Cause("growth", f"{base_name(op)}'s outputs grew pass after pass, from |x| up to {_g(a1)} at pass {p1} to "
                 f"{_g(ak)} at pass {pk} (x{rate:.3g} a pass), until they overflow {dtype}{narrow}: the values run away "
                 f"(a training that diverges, or a loop that multiplies by the same weights); the overflow is where it "
                 f"ends, not where it starts", why.input)


def finite_inputs(given: Sequence[tuple[int, TensorFacts]]) -> bool:
    return all(not (f.nan or f.posinf or f.neginf) for _, f in given)


def _no_targets(ins: Sequence[TensorFacts | None]) -> Cause:
    """nll_loss's mean of finite log-probabilities is NaN only as 0/0: no target counted (each one is
    ignore_index: a batch of padding, or of prompts whose answers were cut away), or the counted ones' classes
    weigh 0."""
    tgt = ins[1] if len(ins) > 1 else None
    ign = ins[4].scalar if len(ins) > 4 and ins[4] is not None else None
    n = math.prod(tgt.shape) if tgt is not None else 0
    if tgt is not None and ign is not None and tgt.min == tgt.max == ign:
        return Cause("no_targets", f"every target is ignore_index ({_g(ign)}; input 1: {_n(n, 'target')}, all "
                     f"{_g(ign)}): the mean over no counted target is 0/0", 1)
    return Cause("no_targets", "the counted targets' total weight is 0 (every target ignore_index, or of a class "
                 "whose weight is 0): the mean over it is 0/0", 1 if tgt is not None else None)


def _dmax(dtype: str, given: float | None = None) -> float | None:
    return given if given is not None else DTYPE_MAX.get(str(dtype).removeprefix("torch."))


def _n(count: int, what: str) -> str:
    return f"{count} {what}" + ("" if count == 1 else "s")


def _g(v: float | None) -> str:
    return "?" if v is None else f"{v:.4g}"


def _absmax(f: TensorFacts) -> float | None:
    vals = [abs(v) for v in (f.min, f.max) if v is not None]
    return max(vals) if vals else None


def _tensor(f: TensorFacts, i: int) -> str:
    return f"input {i}" if f.scalar is None else f"the scalar {_g(f.scalar)} (input {i})"


_MATRIX_ARGS = {"addmm": (1, 2), "baddbmm": (1, 2), "addbmm": (1, 2), "addmv": (1, 2), "addmm_activation": (1, 2)}


def _products_overflow(base: str, ins: Sequence[TensorFacts | None], top: float | None) -> bool:
    """Can a sum of products of these operands pass `top`? max|a| * max|b| * the inner size, as a bound: a
    NaN with no Inf beside it in a matmul's output is an overflow only where the operands allow one."""
    i, j = _MATRIX_ARGS.get(base, (0, 1))
    a = ins[i] if i < len(ins) else None
    b = ins[j] if j < len(ins) else None
    if top is None or a is None or b is None:
        return False
    ma, mb = _absmax(a), _absmax(b)
    inner = a.shape[-1] if a.shape else 1
    return ma is not None and mb is not None and ma * mb * max(inner, 1) > top


def made_word(nan: Any, posinf: Any, neginf: Any) -> str:
    """The non-finite value an op made, in the verdict's word (NaN first: it is what the others turn into)."""
    return "NaN" if nan else "+Inf" if posinf else "-Inf" if neginf else "NaN/Inf"


def cause(op: str, inputs: Sequence[TensorFacts | None], output: TensorFacts, dtype_max: float | None = None,
          first: bool = False, compiled: bool = False) -> Cause:
    """Why `op` (a name as PyTorch prints it: `aten.div.Tensor`) made NaN/+Inf in `output`, given its inputs'
    facts in argument order (None for an argument that is no tensor or number, or one the op overwrote).
    dtype_max: the output dtype's largest finite value, when its name is not in DTYPE_MAX. first: no earlier
    recorded op made NaN/+Inf (a recorder's first), so an input that holds one came from outside the ops: the
    data, or a tensor built without an op (torch.from_numpy, a file). compiled: torch.compile'd code ran in the
    process before it, whose inside the recorder does not see: such an input may as well have been made there."""
    base = base_name(op)
    ins = list(inputs)
    given = [(i, f) for i, f in enumerate(ins) if f is not None]
    made = made_word(output.nan, output.posinf, output.neginf)
    top = _dmax(output.dtype, dtype_max)
    came = ("no op the recorder saw made it: it was made inside a torch.compile'd graph (compiled code ran before "
            "it, and the recorder does not see inside it) or it came in with the data" if first and compiled else
            "no earlier op made it: it came in with the data" if first else "it was made earlier")
    if base in _FROM_STORAGE and (output.nan or output.posinf):   # a tensor made of memory that holds it already
        kind = "input_nan" if output.nan else "input_inf"
        return Cause(kind, f"{base} made a tensor of a storage that already holds {made} ({came}: another process "
                     f"filled it, a DataLoader worker's batch through shared memory, or a file)", None)
    for i, f in given:
        if f.nan and f.scalar is not None:
            return Cause("input_nan", f"input {i} is the number NaN: the program passed it", i)
        if f.nan:
            return Cause("input_nan", f"{_tensor(f, i)} already holds NaN ({_n(f.nan, 'value')}): {came}", i)
    if base in _SOFTMAX and given and given[0][1].neginf and output.nan and not given[0][1].posinf:
        f = given[0][1]
        return Cause("softmax_masked_row", f"{base} of a row that is all -inf (a fully masked row; input 0 holds "
                     f"{_n(f.neginf, '-inf value')}): every weight is 0/0", 0)
    for i, f in given:
        if f.posinf:
            return Cause("input_inf", f"{_tensor(f, i)} already holds +Inf ({_n(f.posinf, 'value')}): {came}", i)
    if base in _NLL and output.nan and finite_inputs(given):
        return _no_targets(ins)
    if base in _DIVIDE:
        j = _DIVIDE[base]
        d = ins[j] if j < len(ins) else None
        if d is not None and d.zeros:
            num = ins[0] if j == 1 and ins else None
            both = num is not None and num.zeros and output.nan
            zz = " and the dividend holds zeros too (0/0 gives NaN)" if both else ""
            what = "rsqrt of zero" if base == "rsqrt" else "the divisor holds zeros"
            return Cause("zero_divisor", f"{what} ({_tensor(d, j)}: {_n(d.zeros, 'zero')}){zz}", j)
    if base in _SQRT and given:
        f = ins[0]
        neg = (f.nonpositive - f.zeros) if f else 0
        if neg > 0:
            return Cause("sqrt_domain", f"{base} of negative values (input 0: {_n(neg, 'value')} < 0, min "
                         f"{_g(f.min)})", 0)
    if base in _LOG and given:
        j = 1 if base == "xlogy" else 0
        f = ins[j] if j < len(ins) else None
        if f is not None and f.nonpositive:
            return Cause("log_domain", f"{base} of values <= 0 (input {j}: {_n(f.nonpositive, 'value')} <= 0, "
                         f"{_n(f.zeros, 'zero')}, min {_g(f.min)})", j)
    if base in ("acos", "asin") and given and output.nan:
        f = ins[0]
        if f is not None and ((f.max is not None and f.max > 1) or (f.min is not None and f.min < -1)):
            return Cause("unit_domain", f"{base} of values outside [-1, 1] (input 0: min {f.min:.9g}, max "
                         f"{f.max:.9g})", 0)
    if base in _LOG1P and given:
        f = ins[0]
        if f is not None and f.min is not None and f.min <= -1:
            return Cause("log_domain", f"log1p of values <= -1 (input 0: min {_g(f.min)})", 0)
    if base in ("pow", "float_power") and len(ins) >= 2 and ins[0] is not None and ins[1] is not None:
        b, e = ins[0], ins[1]
        neg = b.nonpositive - b.zeros
        frac = e.scalar is None or (math.isfinite(e.scalar) and e.scalar != int(e.scalar))
        if neg > 0 and frac and output.nan:
            return Cause("pow_domain", f"pow of negative bases to a non-integer exponent (input 0: "
                         f"{_n(neg, 'value')} < 0; exponent {_g(e.scalar) if e.scalar is not None else 'a tensor'})", 0)
        if b.zeros and e.min is not None and e.min < 0 and output.posinf:
            return Cause("zero_divisor", f"pow of zero to a negative exponent (input 0: {_n(b.zeros, 'zero')}, "
                         f"exponent {_g(e.min)}): a division by zero", 0)
    finite_in = finite_inputs(given)
    if base in _CAST and given and (output.posinf or output.neginf or output.nan):
        f = given[0][1]
        big = _absmax(f)
        if top is not None and big is not None and big > top:
            return Cause("cast_overflow", f"casting {f.dtype} values up to {_g(big)} to {output.dtype} (largest "
                         f"{_g(top)}) overflows to Inf", 0)
    overflowed = bool(output.posinf or output.neginf)   # a sum of +Inf and -Inf is NaN: NaN with Inf beside it
    # exp of -Inf is 0 (expm1's -1): a masked score cannot make exp's +Inf, only a large finite value can
    if (output.posinf or output.nan) and (finite_in or base in _NEGINF_TO_FINITE):
        if base in _MATMUL and (overflowed or _products_overflow(base, ins, top)):
            big = max((v for v in (_absmax(f) for _, f in given) if v is not None), default=None)
            low = output.dtype in LOW_PRECISION
            return Cause("matmul_overflow", f"{base} in {output.dtype} overflows{' its narrow range' if low else ''}"
                         f" (inputs finite, |x| up to {_g(big)}; a sum of products past {_g(top)} is Inf)",
                         None)
        if base in _EXP and overflowed:
            f = given[0][1] if given else None
            where = (f" of values up to {_g(f.max)}" if f is not None and base in ("exp", "exp2", "expm1", "sinh",
                                                                                    "cosh") else "")
            limit = (f" (above {_g(math.log(top))} exp is past {_g(top)})"
                     if top and base in ("exp", "expm1") else f" (largest {_g(top)})" if top else "")
            return Cause("overflow", f"{base}{where} overflows {output.dtype}{limit}", 0 if given else None)
        if output.posinf:
            return Cause("overflow", f"{base}'s result exceeds {output.dtype}'s range (inputs finite; largest "
                         f"{_g(top)})", None)
    if base in _VARIANCE and output.nan and finite_in and given and given[0][0] == 0:
        n = math.prod(given[0][1].shape) // max(1, math.prod(output.shape))
        if n <= 1:
            return Cause("variance_dof", f"{base} of {_n(n, 'element')} per value: with the default correction "
                         f"(Bessel's, dividing by N - 1) that is 0/0 (input 0 has shape {list(given[0][1].shape)}, "
                         f"the output {list(output.shape)})", 0)
    for i, f in given:
        if f.neginf:
            return Cause("input_neginf", f"input {i} holds -Inf ({_n(f.neginf, 'value')}, e.g. a mask value) and "
                         f"{base} turns it into {made}", i)
    checked = "no input holds NaN/Inf" + ("" if len(given) == len(ins) else
                                          " (among those read; one that is no tensor or that the op overwrote in "
                                          "place is not)")
    if base in _DIVIDE:
        checked += ", the divisor holds no zero"
    if base in _LOG + _LOG1P + _SQRT:
        checked += ", no input is outside the function's domain"
    checked += f", the inputs' extremes do not explain an overflow of {output.dtype}"
    return Cause("unknown", f"{base} made {made} from inputs that explain it in no known way ({checked})", None)
