"""Force SDPA's flash backend (FlashAttention on CUDA, the flash kernel for the CPU on the CPU).

When another backend hangs: flash refuses what it cannot run (an explicit mask on CUDA, some head sizes),
so a refusal shows as an error in the ladder, never as a silent fallback.
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix, takes_the_call_unmasked
from gpulab.fixes.kit import only_sdpa_backend

FIX = Fix("sdpa_backend_flash", "scaled_dot_product_attention limited to the flash backend",
          targets=("softmax",), apply=only_sdpa_backend("flash"),
          applies=takes_the_call_unmasked,
          needs="an attention call without an explicit mask on a GPU (flash takes none; the workload's is masked)",
          answers=(Answer("an SDPA backend's kernel in flight", op_kind="attention"),),
          apply_yourself="with torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION): around the attention call",
          source="https://pytorch.org/docs/stable/generated/torch.nn.attention.sdpa_kernel.html")
