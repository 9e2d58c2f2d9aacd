"""Force SDPA's memory-efficient backend (xFormers-style kernels; aotriton on ROCm).

When another backend hangs: the efficient kernels accept masks, so they are the usual fused alternative
for a masked workload.
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix, on_gpu
from gpulab.fixes.kit import only_sdpa_backend

FIX = Fix("sdpa_backend_efficient", "scaled_dot_product_attention limited to the memory-efficient backend",
          targets=("softmax",), apply=only_sdpa_backend("efficient"), applies=on_gpu,
          needs="a GPU (the memory-efficient kernels have no CPU version)",
          answers=(Answer("an SDPA backend's kernel in flight", op_kind="attention"),),
          apply_yourself="with torch.nn.attention.sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION): around the attention call",
          source="https://pytorch.org/docs/stable/generated/torch.nn.attention.sdpa_kernel.html")
