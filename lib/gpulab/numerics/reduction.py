"""What a reduction op may legitimately differ by between two correct runs. Pure (shapes and numbers, no torch).

Why: an op that sums K terms (a matmul's inner dimension, a softmax's row, a layer norm's features, a conv's
window, and their backward ops) gives different float results for another accumulation order (another device's
kernel, another BLAS, another tiling), and amplifies its inputs' allowed differences K-fold. Holding it to
assert_close's elementwise tolerance alone reports rounding as a divergence. Its allowance adds, to that
tolerance, a bound of both effects (first order, documented and simple):

  dot products (mm, bmm, addmm, linear, conv, attention): K * M * (2 * rtol + sqrt(K) * eps), where M bounds one
  term |a_i * b_i| by the inputs' max-abs figures: the inputs' differences within rtol propagated through K terms
  (2 * rtol * K * M), plus reordered accumulation at the probabilistic bound sqrt(K) * eps per unit of the terms'
  total (Higham & Mary 2019; the worst case K * eps is rarely approached and would hide real errors at large K);
  sums of the input's values (sum, cumsum): the same with M = the input's max-abs;
  normalized reductions (mean, var, norm, softmax, log_softmax, layer/group/batch/rms norm, losses): they divide
  by their total, so M is the larger of the output's and the input's max-abs, without the factor K.

Elementwise ops (K = 1) get no allowance beyond assert_close's. eps is the output dtype's machine epsilon.
"""
from __future__ import annotations

import math

EPS = {"float64": 2.220446049250313e-16, "float32": 1.1920928955078125e-07, "float16": 9.765625e-04,
       "bfloat16": 7.8125e-03, "float8_e4m3fn": 0.125, "float8_e5m2": 0.25, "complex64": 1.1920928955078125e-07,
       "complex128": 2.220446049250313e-16}

DOT = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "dot", "vdot", "mv", "addmv", "_addmm_activation",
       "_scaled_mm", "einsum", "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "cudnn_convolution",
       "convolution_backward", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
       "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
       "scaled_dot_product_attention", "_scaled_dot_product_attention_math", "_flash_attention_forward",
       "_efficient_attention_forward", "_scaled_dot_product_flash_attention_backward",
       "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_cudnn_attention_backward",
       "_scaled_dot_product_flash_attention_for_cpu_backward", "_flash_attention_backward",
       "_efficient_attention_backward"}
SUM = {"sum", "nansum", "cumsum", "_foreach_norm"}
NORMALIZED = {"mean", "var", "std", "var_mean", "std_mean", "norm", "linalg_vector_norm", "logsumexp", "_softmax",
              "softmax", "_log_softmax", "log_softmax", "native_layer_norm", "layer_norm", "native_group_norm",
              "group_norm", "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
              "_native_batch_norm_legit_no_training", "_fused_rms_norm", "rms_norm", "nll_loss_forward", "nll_loss",
              "nll_loss2d_forward", "cross_entropy", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
              "binary_cross_entropy", "binary_cross_entropy_with_logits", "_softmax_backward_data",
              "_log_softmax_backward_data", "native_layer_norm_backward", "native_group_norm_backward",
              "native_batch_norm_backward", "_fused_rms_norm_backward", "mse_loss_backward"}
ATTENTION = {n for n in DOT if "attention" in n}
_SAME_SHAPE_DIM = {"_softmax", "softmax", "_log_softmax", "log_softmax", "cumsum", "_softmax_backward_data",
                   "_log_softmax_backward_data"}


def base_name(op: str) -> str:
    """`aten.bmm.default` -> `bmm` (the name the vocabulary above uses)."""
    parts = str(op).split(".")
    return parts[1] if len(parts) >= 3 and parts[0] == "aten" else parts[-1]


def kind(op: str) -> str | None:
    name = base_name(op)
    return "dot" if name in DOT else "sum" if name in SUM else "normalized" if name in NORMALIZED else None


def _numel(shape) -> int:
    return math.prod(int(s) for s in shape)


def length(name: str, shapes: list[tuple[int, ...]], ints: list, out_shape: tuple[int, ...]) -> int:
    """An op's reduction length K from its tensor inputs' shapes (in argument order), its int/list arguments in
    order, and its first output's shape; 1 for an op outside the vocabulary. Called by the recorder per op."""
    if name not in DOT and name not in SUM and name not in NORMALIZED or not shapes:
        return 1
    first = shapes[0]
    if name in ATTENTION:   # (q, k, v): the score's dot product over E plus the weighted sum over the keys
        k = shapes[1] if len(shapes) > 1 else first
        return max(1, (first[-1] if first else 1) + (k[-2] if len(k) >= 2 else 1))
    if name in ("addmm", "baddbmm", "addbmm", "addmv", "_addmm_activation"):
        return max(1, shapes[1][-1]) if len(shapes) > 1 and shapes[1] else 1
    if name in ("dot", "vdot"):
        return max(1, _numel(first))
    if name in DOT and "conv" not in name:
        return max(1, first[-1]) if first else 1
    if "conv" in name:   # forward: Cin/groups * window; backward: the larger of that and N * output positions
        w = next((s for s in shapes[1:] if len(s) >= 3), None)
        k = _numel(w[1:]) if w else 1
        if name == "convolution_backward" and first:
            k = max(k, first[0] * _numel(first[2:]))
        return max(1, k)
    if name in ("native_layer_norm", "layer_norm", "_fused_rms_norm", "rms_norm", "native_layer_norm_backward",
                "_fused_rms_norm_backward"):
        dims = next((v for v in ints if isinstance(v, (list, tuple))), None)
        return max(1, _numel(dims)) if dims else max(1, first[-1] if first else 1)
    if name in _SAME_SHAPE_DIM:
        src = shapes[0]
        dim = next((v for v in ints if isinstance(v, int) and not isinstance(v, bool)), -1)
        return max(1, src[dim]) if src and -len(src) <= dim < len(src) else 1
    n_in, n_out = max(_numel(s) for s in shapes), _numel(out_shape)
    if n_out and n_in > n_out:
        return max(1, n_in // n_out)
    if name in ("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
                "_native_batch_norm_legit_no_training", "native_batch_norm_backward") and len(first) >= 2:
        return max(1, _numel(first) // first[1])
    if name in ("native_group_norm", "native_group_norm_backward") and len(first) >= 2:
        groups = next((v for v in reversed(ints) if isinstance(v, int) and not isinstance(v, bool)), 1)
        return max(1, _numel(first) // (first[0] * max(1, groups)))
    return max(1, first[-1]) if first else 1


def allowance(op: str, k: int, dtype: str, rtol: float, in_amax: list[float], out_amax: float) -> float:
    """The absolute difference per element an op's reordered accumulation and its inputs' allowed differences
    can make (0 for an elementwise op). in_amax: the max-abs of its floating inputs, largest tensors first."""
    what = kind(op)
    if what is None or k <= 1:
        return 0.0
    eps = EPS.get(str(dtype), EPS["float32"])
    amax = [a for a in in_amax if math.isfinite(a)]
    unit = 2 * rtol + math.sqrt(k) * eps
    if what == "dot":
        m = math.prod(amax[:3] if base_name(op) in ATTENTION else amax[:2]) if amax else out_amax
        return k * m * unit
    if what == "sum":
        return k * (amax[0] if amax else out_amax) * unit
    return max([out_amax, *amax[:1]]) * unit if math.isfinite(out_amax) else 0.0
