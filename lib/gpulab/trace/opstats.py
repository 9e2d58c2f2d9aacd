"""Output statistics of each op (mode `stats`). Apart from the recorder because it is the one mode that reads
the op's outputs (tensor math per op, a host sync on CUDA); the recorder only decides when it runs."""
from __future__ import annotations

from typing import Any, Callable

from gpulab.trace.ring import _OFF_FLAGS, _OFF_NONFINITE, _OFF_STATS, _STATS, F_NONFINITE, F_STATS, _q


def stats_writer(mm: Any, torch: Any, state: dict) -> Callable[[Any, int, int], None]:
    """compute_stats(out, off, seq) for slot `off` of op `seq`; state["nonfinite_set"] is the log's first NaN/+Inf."""
    Tensor = torch.Tensor
    pack_q = _q.pack_into

    def compute_stats(out, off: int, seq: int) -> None:
        """min/max/mean and NaN/+Inf/-Inf counts of floating outputs. Only NaN or +Inf flag an op: -Inf is
        how attention masks are written (scalar_tensor(-inf), where(mask, 0, -inf)), not a fault."""
        ts = [out] if isinstance(out, Tensor) else [x for x in out if isinstance(x, Tensor)] \
            if isinstance(out, (list, tuple)) else []
        mn, mx, tot, cnt, nan, inf, ninf = float("inf"), float("-inf"), 0.0, 0, 0, 0, 0
        seen = False
        for t in ts:
            if not (t.is_floating_point() and t.numel() and t.device.type != "meta"):
                continue
            x = t.detach()
            n_nan = int(torch.isnan(x).sum())
            n_inf = int((x == float("inf")).sum())
            n_ninf = int((x == float("-inf")).sum())
            xf = x.float()
            lo, hi = torch.aminmax(xf)
            mn, mx = min(mn, float(lo)), max(mx, float(hi))
            tot += float(xf.sum()); cnt += x.numel()
            nan += n_nan; inf += n_inf; ninf += n_ninf
            seen = True
        if not seen:
            return
        bad = bool(nan or inf)
        _STATS.pack_into(mm, off + _OFF_STATS, mn, mx, tot / cnt if cnt else 0.0, nan, inf, ninf)
        mm[off + _OFF_FLAGS] = F_STATS | (F_NONFINITE if bad else 0)
        if bad and not state["nonfinite_set"]:
            state["nonfinite_set"] = True
            pack_q(mm, _OFF_NONFINITE, seq)

    return compute_stats
