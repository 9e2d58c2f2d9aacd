"""A tensor sent between processes whose sender was gone when it arrived (torch.multiprocessing's sharing).

Why: torch.multiprocessing pickles a tensor's storage as a handle, not its bytes: a file descriptor that the
sending process serves through a socket while it lives (the default strategy), or a shared-memory file it
keeps (file_system), or a CUDA IPC handle to memory it owns. A program that join()s its producers before it
get()s their tensors, or a producer that returns right after put(), leaves the receiver unpickling a handle
nobody serves: ConnectionRefusedError, FileNotFoundError or an EOFError raised deep inside multiprocessing's
code, called from PyTorch's rebuild function, at the program's get(). The line to change is the program's
order of get() and join(), which the traceback shows only as its call. Pure: text in, words out.
"""
from __future__ import annotations

import re

_REBUILD = re.compile(r"in (rebuild_storage_fd|rebuild_storage_filename|rebuild_cuda_tensor|rebuild_event)\b")
_GONE = re.compile(r"^(ConnectionRefusedError|FileNotFoundError|ConnectionResetError|EOFError|"
                   r"BrokenPipeError)\b.*$", re.M)


def meaning(text: str) -> tuple[str, str] | None:
    """(what the program's line was doing, what it means) when `text` (a traceback's tail) ends in a shared
    tensor whose sender had gone; None for anything else."""
    text = text or ""
    rebuild = _REBUILD.findall(text)
    gone = _GONE.findall(text)
    if not rebuild or not gone:
        return None
    how = {"rebuild_storage_fd": "a file descriptor the sender serves while it runs",
           "rebuild_storage_filename": "a shared-memory file the sender keeps",
           "rebuild_cuda_tensor": "a CUDA IPC handle to memory the sender owns",
           "rebuild_event": "a CUDA IPC handle to an event the sender owns"}[rebuild[-1]]
    return ("receiving a tensor another process sent",
            f"the tensor arrived as {how} (torch.multiprocessing shares storage, it does not copy it), and the "
            f"process that sent it had ended or let it go before this one took it: keep every producer alive "
            f"until its tensors are received (get() from the queue before join()ing the process that put them), "
            f"or send copies that need no sender (.numpy(), bytes)")
