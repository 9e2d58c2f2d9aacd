"""Cap the process's GPU memory (torch.cuda.set_per_process_memory_fraction), 0.8 by default.

On a unified-memory host an allocation past physical memory can page and freeze the machine instead of
raising out-of-memory; with a cap it raises. Set GPULAB_MEMORY_FRACTION to change the cap.
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix, on_gpu
from gpulab.fixes.kit import cap_gpu_memory

FIX = Fix("memory_fraction_cap", "each GPU's caching allocator capped at GPULAB_MEMORY_FRACTION (0.8) of its memory",
          targets=("sync", "unknown"), env={"GPULAB_MEMORY_FRACTION": "0.8"}, apply=cap_gpu_memory,
          applies=on_gpu, needs="a GPU",
          answers=(Answer("allocator calls in flight on the GPU", op_kind="allocator", device="cuda"),
                   Answer("the host is stuck in a driver memory call", driver_call=("cuMem*", "cudaMalloc*"))),
          apply_yourself="torch.cuda.set_per_process_memory_fraction(0.8) at the start of the program",
          source="https://pytorch.org/docs/stable/generated/torch.cuda.set_per_process_memory_fraction.html")
