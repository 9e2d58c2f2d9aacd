"""Load CUDA modules lazily (CUDA_MODULE_LOADING=LAZY): kernels are loaded on first use.

Static-initialization deadlocks go both ways: some happen while every module is loaded at start-up
(EAGER), others when a lazily loaded module needs a lock another thread holds. Try both.
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix, on_nvidia

FIX = Fix("module_loading_lazy", "CUDA_MODULE_LOADING=LAZY (kernels loaded on first use)",
          targets=("library_load",), env={"CUDA_MODULE_LOADING": "LAZY"}, applies=on_nvidia,
          needs="an NVIDIA GPU (CUDA 11.7+ reads CUDA_MODULE_LOADING)",
          answers=(Answer("the host is stuck in a driver module-load call", driver_call=("cuModuleLoad*", "cuLibraryLoad*")),
                   Answer("a hang in library loading at start-up", cls="library_load"),
                   Answer("a hang at start-up, before the first op", phase="startup", status=("hang", "timeout"))),
          source="https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#lazy-loading")
