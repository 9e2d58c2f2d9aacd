"""Let the caching allocator grow segments in place (expandable_segments) instead of new cudaMalloc calls.

For fragmentation: an allocation that stalls or fails although enough memory is free in pieces.
"""
from gpulab.fixes.fix import Fix, on_gpu

FIX = Fix("alloc_expandable", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place)",
          targets=("sync", "host_lock", "unknown"), env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
          applies=on_gpu, needs="a GPU (the allocator setting means nothing on the CPU)",
          source="https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf")
