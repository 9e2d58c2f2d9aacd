"""Force SDPA's math backend (attention as matmul + softmax, PyTorch's reference path).

For a hang or wrong numbers inside a fused attention kernel: the math path uses no fused kernel at all.
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix
from gpulab.fixes.kit import only_sdpa_backend

FIX = Fix("sdpa_backend_math", "scaled_dot_product_attention limited to the math backend (no fused kernel)",
          targets=("softmax",), apply=only_sdpa_backend("math"),
          answers=(Answer("an SDPA backend's kernel in flight", op_kind="attention"),),
          apply_yourself="with torch.nn.attention.sdpa_kernel(SDPBackend.MATH): around the attention call",
          source="https://pytorch.org/docs/stable/generated/torch.nn.attention.sdpa_kernel.html")
