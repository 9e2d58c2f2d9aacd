"""Compute softmax (and log-softmax, and their backward) of bf16/fp16 tensors in float32.

For a hang or wrong numbers inside a reduced-precision softmax reduction. It reaches softmax ops the
program dispatches (the math attention path, the program's own softmax), not the softmax inside a fused
attention kernel (flash already reduces in float32).
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix
from gpulab.fixes.kit import fp32_softmax, op_rewrite

FIX = Fix("fp32_softmax", "bf16/fp16 softmax, log-softmax and their backward computed in float32 and cast back",
          targets=("softmax",),
          apply=op_rewrite({"_softmax", "_safe_softmax", "_log_softmax", "_softmax_backward_data"}, fp32_softmax),
          answers=(Answer("a reduced-precision softmax in flight", op_kind="softmax", dtype=("bfloat16", "float16")),),
          apply_yourself="torch.softmax(x.float(), dim).to(x.dtype) where the program calls softmax in bf16/fp16",
          source="https://pytorch.org/docs/stable/notes/numerical_accuracy.html")
