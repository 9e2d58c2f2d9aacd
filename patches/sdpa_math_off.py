"""Forbid SDPA's math backend, so a fused kernel runs or SDPA says plainly that none can.

The math backend is the silent fallback when no fused kernel accepts the inputs, and the path that has
been seen to spin forever on new platforms (pytorch#174358): with it off, the fallback is an error.
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix
from gpulab.fixes.kit import sdpa_backends

FIX = Fix("sdpa_math_off", "scaled_dot_product_attention may not use the math backend (fused kernels only)",
          targets=("softmax",), apply=sdpa_backends({"math": False}),
          answers=(Answer("the math SDPA backend (or its softmax) in flight", op=("*attention_math*",)),
                   Answer("a reduced-precision softmax in flight", op_kind="softmax", dtype=("bfloat16", "float16"))),
          apply_yourself="torch.backends.cuda.enable_math_sdp(False) at the start of the program",
          source="https://github.com/pytorch/pytorch/issues/174358")
