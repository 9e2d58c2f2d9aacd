"""Use CUDA's stream-ordered allocator (cudaMallocAsync) instead of PyTorch's caching allocator.

For hangs and faults that involve the caching allocator (block reuse across streams, fragmentation that
turns into a stall on unified memory).
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix, on_nvidia

FIX = Fix("alloc_async", "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (CUDA's own stream-ordered allocator)",
          targets=("sync", "host_lock", "unknown"), env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
          applies=on_nvidia, needs="an NVIDIA GPU (CUDA 11.2+)",
          answers=(Answer("allocator calls in flight on the GPU", op_kind="allocator", device="cuda"),
                   Answer("the host is stuck in a driver memory call", driver_call=("cuMem*", "cudaMalloc*", "cudaFree*"))),
          source="https://pytorch.org/docs/stable/notes/cuda.html#using-custom-memory-allocators-for-cuda")
