"""Let the caching allocator grow segments in place (expandable_segments) instead of new cudaMalloc calls.

For fragmentation: an allocation that stalls or fails although enough memory is free in pieces (an
out-of-memory error whose "reserved but unallocated" figure is large).
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix, on_gpu

FIX = Fix("alloc_expandable", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place)",
          targets=("sync", "host_lock", "unknown", "out_of_memory"),
          env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
          applies=on_gpu, needs="a GPU (the allocator setting means nothing on the CPU)",
          means="the memory was there, in pieces the caching allocator could not join (fragmentation)",
          answers=(Answer("allocator calls in flight on the GPU", op_kind="allocator", device="cuda"),
                   Answer("the host is stuck in a driver memory call", driver_call=("cuMem*", "cudaMalloc*", "cudaFree*")),
                   Answer("the GPU ran out of memory (enough may be free in pieces the allocator cannot join)",
                          cls="out_of_memory", device="cuda", owner=("program", "library", "platform", "unknown"))),
          source="https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf")
