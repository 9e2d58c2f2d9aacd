"""Run the workload on the CPU: the last resort, and the way to tell a platform bug from a model bug.

The built-in workload gets device=cpu; a user's program sees no GPU (CUDA_VISIBLE_DEVICES and
HIP_VISIBLE_DEVICES empty), so `cuda if available else cpu` code picks the CPU.
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix, on_gpu

FIX = Fix("cpu_fallback", "the workload runs on the CPU (device=cpu; no GPU visible to the program)",
          targets=("unknown",), env={"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""},
          params={"device": "cpu"}, applies=on_gpu, needs="a GPU to fall back from (this run is on the CPU already)",
          answers=(Answer("a GPU memory access fault", stderr=("memory access fault", "page not present",
                                                                 "illegal memory access")),),
          apply_yourself="export CUDA_VISIBLE_DEVICES= HIP_VISIBLE_DEVICES= (or device='cpu' in the program)",
          means="the failure belongs to the GPU platform (its kernels, driver or runtime), not to the model's code",
          diagnostic="runs the workload on the CPU",
          source="https://github.com/ROCm/ROCm/issues/2804")
