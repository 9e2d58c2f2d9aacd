"""Force SDPA's cuDNN backend (cuDNN's fused attention, PyTorch 2.5+ on NVIDIA GPUs).

When another backend hangs on a new architecture, cuDNN's engines are often the first with kernels for it.
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix, on_nvidia
from gpulab.fixes.kit import only_sdpa_backend

FIX = Fix("sdpa_backend_cudnn", "scaled_dot_product_attention limited to the cuDNN backend",
          targets=("softmax",), apply=only_sdpa_backend("cudnn"),
          applies=lambda facts: on_nvidia(facts) and bool(facts.get("cudnn")),
          needs="an NVIDIA GPU with cuDNN and PyTorch 2.5+",
          answers=(Answer("an SDPA backend's kernel in flight", op_kind="attention"),),
          apply_yourself="with torch.nn.attention.sdpa_kernel(SDPBackend.CUDNN_ATTENTION): around the attention call",
          source="https://pytorch.org/docs/stable/generated/torch.nn.attention.sdpa_kernel.html")
