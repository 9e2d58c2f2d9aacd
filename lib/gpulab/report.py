"""What a notebook hands to the runner and to the notebooks after it.

Every notebook ends with `record(...)`: its headline finding and a few numbers go into the scenario's
`metrics.json` (one entry per notebook), which the runner reads for the index and the tests assert on.
Products (verdicts, tables, tensors) are plain files in the same `out_dir`, named by `product()`.
"""
from __future__ import annotations

import contextlib
import html
import json
import math
import re
import os
import tempfile
from dataclasses import dataclass
from urllib.parse import quote
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.json"
ORACLE_GATE_FILE = "oracle_gate.json"   # 05's gate, read by 06 (gpulab.oracle.check writes it)


def _jsonable(value: Any) -> Any:
    """Numbers, strings, lists and dicts only; NaN/Inf become None so the file stays strict JSON."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Atomic write, readable by the team (0644 under the usual umask; mkstemp alone gives 0600). On any
    failure (a full disk included) the temporary file is removed and the target is left as it was."""
    return write_bytes(path, text.encode("utf-8"))


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """write_text for bytes (a zip, an image)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """Atomic JSON: a reader (the runner, a later notebook) never sees half a file."""
    return write_text(path, json.dumps(_jsonable(data), indent=2, sort_keys=False) + "\n")


def write_rows(out_dir: str | os.PathLike, name: str, rows: list[dict], **extra: Any) -> None:
    """A table as name.json (with `extra`, e.g. meta and errors) and name.csv, rewritten as rows arrive so
    that a failure part-way keeps what was measured."""
    import csv
    import io

    out = Path(out_dir)
    write_json(out / f"{name}.json", {**extra, "rows": rows})
    if rows:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
        w.writeheader()
        w.writerows(_jsonable(rows))
        write_text(out / f"{name}.csv", buf.getvalue())


def read_json(path: str | os.PathLike, default: Any = None) -> Any:
    path = Path(path)
    if not path.exists():
        return default
    with open(path) as fh:
        return json.load(fh)


def product(out_dir: str | os.PathLike, name: str) -> Path:
    """Path of a product file in the scenario folder (created on demand)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out / name


def record(out_dir: str | os.PathLike, notebook: str, headline: str, **metrics: Any) -> None:
    """Store a notebook's headline finding and metrics under its name in `out_dir/metrics.json`. Returns
    nothing, so a notebook's last cell shows nothing (the finding is stated in words above it). Notebooks that
    run side by side record into one file: each read-and-rewrite holds a lock, so none drops another's entry."""
    path = product(out_dir, METRICS_FILE)
    with _locked(path.with_name("." + METRICS_FILE + ".lock")):
        data = read_json(path, default={}) or {}
        data[notebook] = {"headline": headline, "metrics": _jsonable(metrics)}
        write_json(path, data)


@contextlib.contextmanager
def _locked(lock_path: Path):
    """An exclusive lock on `lock_path` between processes (none where the platform has no fcntl)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(lock_path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def load_metrics(out_dir: str | os.PathLike) -> dict:
    return read_json(Path(out_dir) / METRICS_FILE, default={}) or {}


def metrics_of(out_dir: str | os.PathLike, notebook: str) -> dict:
    """One notebook's metrics in out_dir's metrics.json ({} when it has not recorded any)."""
    return dict((load_metrics(out_dir).get(notebook) or {}).get("metrics") or {})


# ---------------------------------------------------------------------------------------------- folder size

@dataclass(frozen=True)
class FolderPart:
    """One group of files in a folder: a subfolder two levels down (baseline/ladder), or the files of one
    kind beside each other (baseline/*.html)."""
    name: str
    files: int
    bytes: int


@dataclass(frozen=True)
class FolderContents:
    """What a folder holds, by apparent size: what a copy, an archive or an upload transfers (a sparse file
    counts whole, though it takes less disk)."""
    files: int
    bytes: int
    parts: tuple[FolderPart, ...]          # largest first
    largest: tuple[tuple[str, int], ...]   # (relative path, bytes), largest first

    def to_dict(self) -> dict:
        return {"files": self.files, "bytes": self.bytes,
                "parts": [{"name": p.name, "files": p.files, "bytes": p.bytes} for p in self.parts],
                "largest": [{"path": p, "bytes": b} for p, b in self.largest]}


def _group(rel: Path) -> str:
    parts = rel.parts
    if len(parts) > 2:
        return f"{parts[0]}/{parts[1]}"
    head = f"{parts[0]}/" if len(parts) == 2 else ""
    return f"{head}*{rel.suffix}" if rel.suffix else f"{head}{rel.name}"


def folder_contents(root: str | os.PathLike, largest: int = 5) -> FolderContents:
    """Every file under root (links not followed), grouped by `_group`, with their apparent sizes."""
    root = Path(root)
    groups: dict[str, list[int]] = {}
    sizes: list[tuple[str, int]] = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            try:
                st = path.lstat()
            except OSError:   # removed while we walked (a temporary file)
                continue
            if not path.is_file() or path.is_symlink():
                continue
            rel = path.relative_to(root)
            g = groups.setdefault(_group(rel), [0, 0])
            g[0] += 1
            g[1] += st.st_size
            sizes.append((str(rel), st.st_size))
    parts = tuple(sorted((FolderPart(k, n, b) for k, (n, b) in groups.items()), key=lambda p: (-p.bytes, p.name)))
    top = tuple(sorted(sizes, key=lambda x: (-x[1], x[0]))[:largest])
    return FolderContents(len(sizes), sum(b for _, b in sizes), parts, top)


def size_text(n: int | float) -> str:
    """Bytes as a reader wants them: 4.7 MB, 912 kB, 80 B (powers of 1000, as du --si and file managers)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


# ---------------------------------------------------------------------------------------------- safe text
# nbconvert renders Markdown outputs to HTML and passes raw HTML through, so any string that comes from
# outside (paths, op names, program output, parameter values, exception text) must be made inert.

_MD_ACTIVE = re.compile(r"([\\`*_{}\[\]#|~!])")


def esc(value: Any) -> str:
    """Outside text for Markdown prose: HTML-escaped, and Markdown's active characters neutralized. The
    apostrophe stays as it is (inert in prose): its entity, &#x27;, would have its '#' escaped and show."""
    return _MD_ACTIVE.sub(r"\\\1", html.escape(str(value), quote=False).replace('"', "&quot;"))


def code(value: Any) -> str:
    """Outside text shown as inline code in Markdown (an HTML <code>, so a backtick cannot break out)."""
    return f"<code>{html.escape(str(value), quote=True)}</code>"


def pre(value: Any) -> str:
    """Outside text shown as a block (a program, a stack) in Markdown."""
    return f"<pre>{html.escape(str(value), quote=True)}</pre>"


def url(path: Any) -> str:
    """A relative link target, URL-encoded (a path with spaces or markup still links, and stays inert)."""
    return html.escape(quote(str(path).replace(os.sep, "/")), quote=True)


def progress_log(out_dir: str | os.PathLike, notebook: str, echo: bool = False):
    """A progress callable for long notebook work: lines go to out_dir/progress.log (which `gpulab run`
    shows in its heartbeat), not into the published HTML; `echo` also prints them (interactive use)."""
    path = product(out_dir, "progress.log")

    def say(msg: str) -> None:
        with open(path, "a") as fh:
            fh.write(f"{notebook}: {msg}\n")
        if echo:
            print(msg, flush=True)
    return say


def number(v: Any, digits: int = 3) -> str:
    """A number as a reader wants it: 3 significant digits, thousands separated, never 1.49e+04."""
    if v is None or v != v:
        return "-"
    if abs(v) >= 10 ** digits:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.2e}"


def table(rows: Any, index: str | None = None, digits: int = 3):
    """A table for a report: indexed by its key column (not 0, 1, 2 ...), numbers to `digits` significant
    digits, missing values as a dash. (pandas escapes cell text in HTML.)"""
    import pandas as pd

    frame = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    for col in frame.columns:
        if frame[col].dtype.kind == "f":
            frame[col] = [number(v, digits) for v in frame[col]]
    frame = frame.fillna("-")
    if index is not None and index in frame.columns:
        frame = frame.set_index(index)
    elif index is None and len(frame.columns):
        frame = frame.set_index(frame.columns[0])
    return frame
