"""Start DataLoader workers by spawn instead of fork.

A forked worker inherits the parent's memory as it was at the fork, locks included: a lock another thread
of the parent held at that instant (a logging handler, a tokenizer's, an OpenMP pool's) stays held in the
worker for ever, with no thread to release it. A spawned worker starts a fresh interpreter and imports
what it needs, so it never sees such a lock; it costs a slower start of each worker.
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix
from gpulab.fixes.kit import dataloader_defaults

FIX = Fix("dataloader_spawn", "DataLoader workers started with multiprocessing_context='spawn' instead of fork",
          targets=("worker_stuck", "worker_died"), apply=dataloader_defaults(multiprocessing_context="spawn"),
          answers=(Answer("a DataLoader worker is blocked while its loader waits for data", cls="worker_stuck",
                          owner=("program", "library", "unknown")),
                   Answer("a DataLoader worker's native code crashed (a library that is not fork-safe)",
                          cls="worker_died", stderr=("signal: Segmentation fault", "signal: Aborted"),
                          owner=("program", "library", "platform", "unknown"))),
          apply_yourself="DataLoader(..., num_workers=N, multiprocessing_context='spawn') (the dataset and "
                         "collate_fn must be picklable, and the script's top level guarded by "
                         "if __name__ == '__main__')",
          means="the worker blocks on something it inherited from the parent at fork (a lock another thread of the "
                "parent held at that instant, a thread pool's state), not on its data",
          source="https://pytorch.org/docs/stable/data.html#platform-specific-behaviors")
