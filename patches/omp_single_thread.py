"""One OpenMP/MKL thread (OMP_NUM_THREADS=1, MKL_NUM_THREADS=1), read by the runtimes at start-up.

For a host-side lock: an OpenMP pool forked into a child (DataLoader workers) or two runtimes' pools
deadlocking on each other. If one thread passes, the hang is in the CPU thread pools, not the GPU.
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix

FIX = Fix("omp_single_thread", "OMP_NUM_THREADS=1 and MKL_NUM_THREADS=1 (no CPU thread pool)",
          targets=("host_lock",), env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
          answers=(Answer("host threads parked in a CPU thread pool", cls="host_lock",
                          native=("gomp_", "GOMP_", "__kmp", "omp_", "mkl_")),
                   Answer("a deadlock on a host lock", cls="host_lock")),
          means="the hang is in the CPU thread pools (OpenMP/MKL), not on the GPU",
          source="https://pytorch.org/docs/stable/notes/multiprocessing.html")
