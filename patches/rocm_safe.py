"""Conservative ROCm settings for consumer AMD GPUs (RDNA1/RDNA2, ROCm 6.2+; rule rdna_rocm_memory_faults).

Copies through the shader engines instead of the SDMA copy engines (HSA_ENABLE_SDMA=0) and serialized
kernel launches and copies (AMD_SERIALIZE_KERNEL=3, AMD_SERIALIZE_COPY=3, what the ROCm maintainers ask
for when reproducing "Memory access fault ... Page not present"). Slow: it localizes, the cost says so.
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix, on_rocm

FIX = Fix("rocm_safe", "HSA_ENABLE_SDMA=0, AMD_SERIALIZE_KERNEL=3, AMD_SERIALIZE_COPY=3 (no SDMA copy engines, "
          "serialized kernels and copies)", targets=("sync", "unknown"),
          env={"HSA_ENABLE_SDMA": "0", "AMD_SERIALIZE_KERNEL": "3", "AMD_SERIALIZE_COPY": "3"},
          applies=on_rocm, needs="an AMD GPU on ROCm", answers=(Answer("a GPU memory access fault on ROCm", gpu="rocm", stderr=("memory access fault", "page not present")),
                   Answer("a GPU hang on ROCm", gpu="rocm", status="hang")),
          source="https://github.com/ROCm/ROCm/issues/2804")
