"""The recorder's optional native hot path (hotpath.c): built once per Python and source, loaded if built.

Why optional and built by the parent: it needs a C compiler and Python's headers, which a user's machine
may lack (the pure-Python hot path then records the same log, ~1.4x slower per op), and a compile must
never run inside the recorded program (`gpulab.proc` would make that program a subreaper with a guard
process). So the launcher calls `ensure()` (gpulab.trace.run, the benchmarks, the GPU check) and the
recorder in the child only calls `load()`. A failed build is remembered (with the compiler's output) so
that it is not retried on every run; GPULAB_TRACE_NATIVE=0 turns the native path off.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).resolve().with_name("hotpath.c")
MODULE = "gpulab_hotpath"
_LOADED: dict[str, ModuleType | None] = {}


def enabled() -> bool:
    return os.environ.get("GPULAB_TRACE_NATIVE", "1") not in ("0", "false", "no", "off")


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    root = Path(base) / "gpulab" / "native"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except OSError:
        pass
    root = Path(tempfile.gettempdir()) / f"gpulab-native-{os.getuid()}"
    try:
        root.mkdir(mode=0o700, exist_ok=True)  # else the compiler cannot write its output there
    except OSError:
        pass
    return root


def artifact() -> Path:
    """Where the module for this interpreter and this source lives (the name carries both)."""
    digest = hashlib.sha256(SOURCE.read_bytes() + sys.version.encode()).hexdigest()[:16]
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return _cache_root() / f"{MODULE}-{digest}{suffix}"


def load() -> ModuleType | None:
    """The built module, or None (never builds: see the module docstring)."""
    if not enabled() or sys.version_info < (3, 11):
        return None
    path = artifact()
    key = str(path)
    if key not in _LOADED:
        mod = None
        if path.exists():
            try:
                loader = importlib.machinery.ExtensionFileLoader(MODULE, key)
                spec = importlib.util.spec_from_file_location(MODULE, key, loader=loader)
                mod = importlib.util.module_from_spec(spec)
                loader.exec_module(mod)
            except (ImportError, OSError):
                mod = None
        _LOADED[key] = mod
    return _LOADED[key]


def ensure(timeout_s: float = 120.0) -> tuple[Path | None, str]:
    """Build the module if it is not built yet; -> (path or None, why not). Safe to call from many
    processes at once (each compiles to its own temporary name, then renames)."""
    if not enabled():
        return None, "turned off by GPULAB_TRACE_NATIVE=0"
    if sys.version_info < (3, 11):
        return None, f"needs Python >= 3.11, this is {sys.version.split()[0]}"
    path = artifact()
    failed = path.with_suffix(path.suffix + ".failed")
    if path.exists():
        return path, ""
    if failed.exists():
        return None, failed.read_text(errors="replace")[-500:]
    cc = _compiler()
    include = sysconfig.get_paths().get("include", "")
    if not cc:
        return None, "no C compiler (cc or gcc) on PATH and CC unset"
    if not (Path(include) / "Python.h").exists():
        return None, f"Python's headers are missing ({include}/Python.h)"
    from gpulab import proc  # the launcher's side only (see the module docstring)

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    r = proc.run([cc, "-O2", "-shared", "-fPIC", "-fno-strict-aliasing", f"-I{include}", "-o", str(tmp),
                  str(SOURCE)], timeout_s=timeout_s, capture=True, label="cc hotpath")
    if r.returncode != 0 or not tmp.exists():
        why = f"{cc} failed ({r.status}, exit {r.returncode}): {(r.stderr or r.stdout)[-1500:]}"
        try:
            failed.write_text(why)
        except OSError:
            pass
        tmp.unlink(missing_ok=True)
        return None, why
    os.replace(tmp, path)
    return path, ""
