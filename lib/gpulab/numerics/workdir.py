"""What the reference run left in the working folder before the candidate started. Both commands run in the
caller's folder, one after the other, so a file the reference writes there (a checkpoint, a cache, a
dataset prepared on first use) can change what the candidate does: the comparison then says so instead of
leaving the user to wonder why a rerun took another path.
"""
from __future__ import annotations

import os
from pathlib import Path

LIMIT = 20_000                 # files looked at, at most: a huge folder is not walked (nothing is said then)
SKIP = {".git", "__pycache__", ".ipynb_checkpoints", ".venv", "node_modules"}


def snapshot(root: str | os.PathLike, skip: tuple[str | os.PathLike, ...] = ()) -> dict[str, tuple[int, int]] | None:
    """{relative path: (mtime_ns, size)} of the files under root, None when there are more than LIMIT. `skip`:
    folders left out (the comparison's own output)."""
    root = Path(root)
    left_out = {os.path.realpath(p) for p in skip}
    seen: dict[str, tuple[int, int]] = {}
    for here, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP and os.path.realpath(os.path.join(here, d)) not in left_out]
        for name in files:
            path = os.path.join(here, name)
            try:
                st = os.stat(path)
            except OSError:   # gone meanwhile, or a dangling link
                continue
            seen[os.path.relpath(path, root)] = (st.st_mtime_ns, st.st_size)
            if len(seen) > LIMIT:
                return None
    return seen


def written(before: dict | None, after: dict | None, root: str | os.PathLike = ".") -> list[str]:
    """The files created or changed between two snapshots of root, sorted (none when either was not taken),
    but those this process itself holds open (its output redirected into the folder: gpulab's doing)."""
    if before is None or after is None:
        return []
    own = _own_files()
    return sorted(p for p, st in after.items()
                  if before.get(p) != st and os.path.realpath(os.path.join(root, p)) not in own)


def _own_files() -> set[str]:
    """Real paths of the files this process has open (Linux; none known elsewhere)."""
    out = set()
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            out.add(os.path.realpath(os.readlink(f"/proc/self/fd/{fd}")))
        except OSError:
            continue
    return out


def words(paths: list[str], shown: int = 5) -> str:
    """A sentence for the verdict, or '' when the reference wrote nothing there."""
    if not paths:
        return ""
    names = ", ".join(paths[:shown]) + (f" and {len(paths) - shown} more" if len(paths) > shown else "")
    return (f"While the reference ran, {names} appeared or changed in the working folder, where the candidate "
            f"then ran: if the program reads it back (a checkpoint it resumes from, a cache), the two runs did not "
            f"start alike; move it away before comparing, or give the program a flag that starts fresh.")
