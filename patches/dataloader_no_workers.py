"""Load data in the main process (num_workers=0): a diagnostic more than a fix.

If the hang goes away, it lives in the workers' processes (a lock or a thread pool inherited at fork,
shared memory, a worker's own deadlock); if it stays, the dataset itself blocks. A worker that died without a
traceback dies here in the main process, where the recorder sees its last op and line (or, if it was the
workers' memory or shared memory, does not die). Costs the overlap of data loading with the step.
"""
from gpulab.fixes.answers import Answer
from gpulab.fixes.fix import Fix
from gpulab.fixes.kit import dataloader_defaults

FIX = Fix("dataloader_no_workers", "DataLoader with num_workers=0 (data loaded in the main process)",
          targets=("worker_stuck", "worker_died"), apply=dataloader_defaults(num_workers=0),
          answers=(Answer("a DataLoader worker is blocked while its loader waits for data", cls="worker_stuck",
                          owner=("program", "library", "unknown")),
                   Answer("a DataLoader worker died without a traceback", cls="worker_died",
                          owner=("program", "library", "platform", "unknown"))),
          apply_yourself="DataLoader(..., num_workers=0)",
          means="the failure lives in the loader's worker processes",
          diagnostic="loads the data in the training process, no longer beside the step",
          source="https://pytorch.org/docs/stable/data.html#single-and-multi-process-data-loading")
