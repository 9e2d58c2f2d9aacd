"""Synchronize the device before and after every GEMM (mm, bmm, matmul, addmm, baddbmm).

For a hang that comes from stream ordering: a GEMM reading a buffer another stream has not finished
writing, or a kernel queued behind one that never completes. If synchronizing makes it pass, the bug is
in the ordering, not in the GEMM kernel; the cost says what a targeted event/wait would save.
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix, on_gpu
from gpulab.fixes.kit import op_rewrite, synchronized

FIX = Fix("sync_gemm", "torch.cuda.synchronize() before and after each mm/bmm/matmul/addmm/baddbmm on the GPU",
          targets=("gemm", "sync"), apply=op_rewrite({"mm", "bmm", "matmul", "addmm", "baddbmm"}, synchronized),
          applies=on_gpu, needs="a GPU (CUDA or ROCm): on the CPU there is no stream to order",
          answers=(Answer("a GEMM's GPU work never completed (stream ordering)", op_kind="gemm", device="cuda"),
                   Answer("the host waits in a sync behind a GEMM", cls="sync", op_kind="gemm")),
          apply_yourself="torch.cuda.synchronize() before and after the matmul that hangs (then replace it with "
                         "an event wait between the two streams involved)",
          means="the bug is in stream ordering around a GEMM, not in the GEMM kernel",
          diagnostic="synchronizes the device twice per GEMM; a targeted event wait is the fix to ship",
          source="https://pytorch.org/docs/stable/notes/cuda.html#cuda-streams")
