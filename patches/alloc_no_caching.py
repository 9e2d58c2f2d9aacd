"""Turn the caching allocator off: every tensor is a real cudaMalloc/cudaFree.

Slow, but it takes block reuse out of the picture: if a hang or a fault goes away, suspect a buffer used
after it was handed to another stream, or the allocator itself.
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix, on_gpu

FIX = Fix("alloc_no_caching", "PYTORCH_NO_CUDA_MEMORY_CACHING=1 (no block reuse: a real malloc/free per tensor)",
          targets=("sync", "host_lock", "unknown"), env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
          applies=on_gpu, needs="a GPU (the allocator setting means nothing on the CPU)",
          answers=(Answer("allocator calls in flight on the GPU", op_kind="allocator", device="cuda"),
                   Answer("a GPU memory access fault (a buffer reused too early)", stderr=("memory access fault", "illegal address"))),
          means="block reuse is involved: a buffer used after it was handed to another stream, or the allocator "
                "itself",
          diagnostic="makes every tensor a real cudaMalloc and cudaFree",
          source="https://pytorch.org/docs/stable/notes/cuda.html#memory-management")
