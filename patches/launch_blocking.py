"""Make every kernel launch synchronous (CUDA_LAUNCH_BLOCKING=1).

A diagnostic more than a fix: if the hang goes away, it depends on kernels overlapping (a race between
streams or with the host); the cost shows why it is not a fix to ship.
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix, on_gpu

FIX = Fix("launch_blocking", "CUDA_LAUNCH_BLOCKING=1 and HIP_LAUNCH_BLOCKING=1 (every launch waits for its kernel)",
          targets=("sync", "unknown"), env={"CUDA_LAUNCH_BLOCKING": "1", "HIP_LAUNCH_BLOCKING": "1"},
          applies=on_gpu, needs="a GPU (kernel launches are synchronous on the CPU already)",
          answers=(Answer("the host waits in a sync behind GPU work that never completed", cls="sync", device="cuda"),
                   Answer("GPU work that never completed, launched outside the dispatcher", cls="unknown",
                          status="hang", device="cuda")),
          means="the failure depends on kernels overlapping (a race between streams or with the host)",
          diagnostic="makes every launch wait for its kernel: the GPU idles between kernels",
          source="https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#env-vars")
