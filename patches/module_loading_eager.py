"""Load every CUDA module at start-up (CUDA_MODULE_LOADING=EAGER).

The other side of module_loading_lazy: a lazily loaded module that deadlocks on the context lock in the
middle of a run is loaded up front instead, where a hang is visible as a start-up hang (and a PTX-only
wheel pays its JIT cost at start-up instead of in the first op).
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix, on_nvidia

FIX = Fix("module_loading_eager", "CUDA_MODULE_LOADING=EAGER (every kernel loaded at start-up)",
          targets=("library_load",), env={"CUDA_MODULE_LOADING": "EAGER"}, applies=on_nvidia,
          needs="an NVIDIA GPU (CUDA 11.7+ reads CUDA_MODULE_LOADING)",
          answers=(Answer("the host is stuck in a driver module-load or kernel-launch call",
                          driver_call=("cuLaunchKernel*", "cudaLaunchKernel*", "cuModuleLoad*", "cuModuleGetFunction",
                                       "cuLibraryLoad*", "cuLibraryGetKernel", "cuKernelGetFunction")),
                   Answer("a hang in library loading at start-up", cls="library_load"),
                   Answer("a hang at start-up, before the first op", phase="startup", status=("hang", "timeout"))),
          source="https://github.com/NVIDIA/nvbench/issues/136")
