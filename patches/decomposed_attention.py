"""Replace torch.nn.functional.scaled_dot_product_attention with attention written out in plain ops.

No SDPA backend runs at all (not even the math one's C++ path): matmul, masked fill, a float32 softmax,
matmul. If this passes where every backend fails, the bug is in SDPA's dispatch or kernels.
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix
from gpulab.fixes.kit import replace_sdpa

FIX = Fix("decomposed_attention", "F.scaled_dot_product_attention replaced by plain PyTorch attention "
          "(matmul, mask, float32 softmax, matmul)", targets=("softmax",), apply=replace_sdpa, replaces_sdpa=True,
          answers=(Answer("an SDPA backend's kernel in flight", op_kind="attention"),
                   Answer("a softmax reduction in flight", op_kind="softmax")),
          apply_yourself="attention as (q @ k.transpose(-2, -1) * scale).masked_fill(~mask, -inf).float()"
                         ".softmax(-1).to(q.dtype) @ v instead of F.scaled_dot_product_attention",
          source="https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html")
