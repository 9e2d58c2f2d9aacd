"""What handing objects to other processes broke: a tensor whose sender was gone when it arrived
(torch.multiprocessing's sharing), and what a DataLoader could not pickle for the workers it starts.

Why: torch.multiprocessing pickles a tensor's storage as a handle, not its bytes: a file descriptor that the
sending process serves through a socket while it lives (the default strategy), or a shared-memory file it
keeps (file_system), or a CUDA IPC handle to memory it owns. A program that join()s its producers before it
get()s their tensors, or a producer that returns right after put(), leaves the receiver unpickling a handle
nobody serves: ConnectionRefusedError, FileNotFoundError or an EOFError raised deep inside multiprocessing's
code, called from PyTorch's rebuild function, at the program's get(). The line to change is the program's
order of get() and join(), which the traceback shows only as its call.

And a DataLoader whose workers start with spawn or forkserver (macOS's default, Python 3.14's on Linux, a
`multiprocessing_context` the program or a fix sets) pickles its Dataset, collate_fn, worker_init_fn and sampler
into each worker: a lambda or a function defined inside another cannot be, and the error is raised deep in
multiprocessing's reduction, below the program's `for batch in loader`. Pure: text in, words out.
"""
from __future__ import annotations

import re

_REBUILD = re.compile(r"in (rebuild_storage_fd|rebuild_storage_filename|rebuild_cuda_tensor|rebuild_event)\b")
_GONE = re.compile(r"^(ConnectionRefusedError|FileNotFoundError|ConnectionResetError|EOFError|"
                   r"BrokenPipeError)\b.*$", re.M)
_UNPICKLABLE = re.compile(r"(Can't pickle|cannot pickle|Can't get local object|PicklingError)[^\n]*", re.I)


RECEIVING = "receiving a tensor another process sent"
_ENDED = ("ended (killed or exited without a word)", "exited after an uncaught ", "died of ")


def sender_gone(processes) -> str | None:
    """What ended a process of the run that could have sent the tensor (a multiprocessing child or worker that
    ended before the program did), in words; None when none did. Why: a producer that ended is the cause the
    ConnectionResetError only reports, and how it ended (killed without a word, its own exception) is what to fix
    first."""
    for p in processes:
        state = str(p.get("state") or "")
        if p.get("kind") in ("process", "worker", "child") and state.startswith(_ENDED):
            how = (" (a process ends without a word when it is killed, by SIGKILL from the host's out-of-memory "
                   "killer for one, or when it calls os._exit)" if state.startswith(_ENDED[0]) else "")
            return (f"{p.get('role')} had {state}{how} before its tensor was taken: what ended it comes first, "
                    f"then keep producers alive until their tensors are received")
    return None


def meaning(text: str) -> tuple[str, str] | None:
    """(what the program's line was doing, what it means) when `text` (a traceback's tail) ends in a shared
    tensor whose sender had gone, or in what a DataLoader could not pickle for its workers; None for anything
    else."""
    text = text or ""
    bad = _UNPICKLABLE.search(text)
    if bad and "w.start()" in text and "dataloader.py" in text:
        return ("starting the DataLoader's worker processes",
                f"the DataLoader starts its workers with spawn or forkserver, which pickle the Dataset, collate_fn, "
                f"worker_init_fn and sampler into each of them, and one of those cannot be pickled ({bad.group(0)[:120]}"
                f"): define it at module level (functools.partial of a module-level function for its arguments), "
                f"keep locks, open files and connections out of the Dataset until a worker opens them, or start "
                f"the workers with fork where the platform has it (multiprocessing_context='fork')")
    rebuild = _REBUILD.findall(text)
    gone = _GONE.findall(text)
    if not rebuild or not gone:
        return None
    how = {"rebuild_storage_fd": "a file descriptor the sender serves while it runs",
           "rebuild_storage_filename": "a shared-memory file the sender keeps",
           "rebuild_cuda_tensor": "a CUDA IPC handle to memory the sender owns",
           "rebuild_event": "a CUDA IPC handle to an event the sender owns"}[rebuild[-1]]
    return (RECEIVING,
            f"the tensor arrived as {how} (torch.multiprocessing shares storage, it does not copy it), and the "
            f"process that sent it had ended or let it go before this one took it: keep every producer alive "
            f"until its tensors are received (get() from the queue before join()ing the process that put them), "
            f"or send copies that need no sender (.numpy(), bytes)")
