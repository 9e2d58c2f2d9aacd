"""Make strided or transposed GEMM operands contiguous before the GEMM.

For a kernel that mishandles a layout (a transposed operand, a leading dimension it did not expect): if
copying the operand to a dense layout makes it pass, the bug is the layout path. Linear layers pass their
weight transposed, so the copy is paid on every call: the cost column says how much.
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix
from gpulab.fixes.kit import contiguous, op_rewrite

FIX = Fix("contiguous_gemm_inputs", "non-contiguous operands of mm/bmm/addmm/baddbmm/addbmm/matmul copied to "
          "a contiguous layout first", targets=("layout", "gemm"),
          apply=op_rewrite({"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul"}, contiguous),
          answers=(Answer("a GEMM with a transposed or non-contiguous operand in flight", op_kind="gemm",
                          operands=("transposed", "noncontiguous", "strided")),
                   Answer("an operand layout no kernel expects", cls="layout")),
          apply_yourself="a = a.contiguous(); b = b.contiguous() before the matmul that hangs (nn.Linear: keep a "
                         "contiguous copy of weight.t())",
          means="the GEMM kernel mishandles its operand's layout (a transposed or strided operand)",
          source="https://pytorch.org/docs/stable/generated/torch.Tensor.contiguous.html")
