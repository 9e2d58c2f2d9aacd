"""Load every CUDA module at start-up (CUDA_MODULE_LOADING=EAGER).

The other side of module_loading_lazy: a lazily loaded module that deadlocks on the context lock in the
middle of a run is loaded up front instead, where a hang is visible as a start-up hang (and a PTX-only
wheel pays its JIT cost at start-up instead of in the first op).
"""
from gpulab.fixes.fix import Fix, on_nvidia

FIX = Fix("module_loading_eager", "CUDA_MODULE_LOADING=EAGER (every kernel loaded at start-up)",
          targets=("library_load",), env={"CUDA_MODULE_LOADING": "EAGER"}, applies=on_nvidia,
          needs="an NVIDIA GPU (CUDA 11.7+ reads CUDA_MODULE_LOADING)",
          source="https://github.com/NVIDIA/nvbench/issues/136")
