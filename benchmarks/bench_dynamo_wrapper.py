"""Figure: what torch's dynamo-disable wrapper around a dispatch mode's __torch_dispatch__ costs per op: a bare
pass-through mode as torch makes it (wrapped) against the same mode made unwrapped (as gpulab.trace.lazydynamo
makes modes until torch._dynamo is imported), and no mode; tiny CPU ops, rounds interleaved, medians.

    python benchmarks/bench_dynamo_wrapper.py [--rounds 5] [--ops 20000]
"""
from __future__ import annotations

import argparse
import statistics
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ops", type=int, default=20000)
    a = p.parse_args(argv)

    import torch
    import torch._dynamo  # noqa: F401 - the wrapper's first call imports it; imported here, outside the timing
    from torch.utils._python_dispatch import TorchDispatchMode

    class Wrapped(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Unwrapped(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x = torch.ones(4)

    def per_op_us() -> float:
        t = time.perf_counter()
        for _ in range(a.ops):
            x.add(1)
        return (time.perf_counter() - t) / a.ops * 1e6

    times: dict[str, list[float]] = {"no mode": [], "pass-through, wrapped (torch's)": [], "pass-through, unwrapped": []}
    for _ in range(a.rounds):
        times["no mode"].append(per_op_us())
        with Wrapped():
            times["pass-through, wrapped (torch's)"].append(per_op_us())
        with Unwrapped():
            times["pass-through, unwrapped"].append(per_op_us())
    base = statistics.median(times["no mode"])
    for name, t in times.items():
        m = statistics.median(t)
        print(f"{name:34s} {m:7.2f} us/op  (+{m - base:.2f} over no mode)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
