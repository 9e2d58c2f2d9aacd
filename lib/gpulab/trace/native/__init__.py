"""The recorder's native parts, built once per Python (and torch) and source, loaded if built: the observer
(observer.cpp, which includes its parts observer_*.h, and pyframes.c: a RecordFunction callback, the recorder's
default where it builds) and the dispatch mode's hot path (hotpath.c); both emit GPU markers through gpumark.h.

The observer needs a C++ compiler and torch's headers (in every torch wheel); it is built against the torch
the program will import, found without importing it (the build asks a child for the C++ ABI flag).

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
import threading
import tempfile
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).resolve().with_name("hotpath.c")
HEADER = SOURCE.with_name("gpumark.h")
OBSERVER = SOURCE.with_name("observer.cpp")
FRAMES = SOURCE.with_name("pyframes.c")
MODULE = "gpulab_hotpath"
OBSERVER_MODULE = "gpulab_observer"
# hidden symbols: the module exports only PyInit (its C++ template copies never stand in for torch's);
# initial-exec TLS: no __tls_get_addr call per thread-local read on the hot path; NDEBUG: torch's release
# headers (a debug build of observer.cpp would see other class layouts)
C_FLAGS = ("-O2", "-fPIC", "-fvisibility=hidden")
CXX_FLAGS = ("-O2", "-DNDEBUG", "-std=c++17", "-shared", "-fPIC", "-w", "-fvisibility=hidden",
             "-fvisibility-inlines-hidden", "-ftls-model=initial-exec")
_LOADED: dict[str, ModuleType | None] = {}


def enabled() -> bool:
    return os.environ.get("GPULAB_TRACE_NATIVE", "1") not in ("0", "false", "no", "off")


def observer_enabled() -> bool:
    """GPULAB_TRACE_OBSERVER=0 keeps the dispatch mode (compile then only works through its
    ignore_compile_internals, and every op costs a Python call)."""
    return enabled() and os.environ.get("GPULAB_TRACE_OBSERVER", "1") not in ("0", "false", "no", "off")


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
    digest = hashlib.sha256(SOURCE.read_bytes() + HEADER.read_bytes() + sys.version.encode()).hexdigest()[:16]
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return _cache_root() / f"{MODULE}-{digest}{suffix}"


def load() -> ModuleType | None:
    """The built module, or None (never builds: see the module docstring)."""
    if not enabled() or sys.version_info < (3, 11):
        return None
    return _load(MODULE, artifact())


def _torch_dir() -> Path | None:
    """torch's folder, found without importing torch (the launcher stays torch-free)."""
    spec = importlib.util.find_spec("torch")
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def observer_sources() -> tuple[Path, ...]:
    """Every file the observer's build reads from here: observer.cpp includes its parts (observer_*.h, one
    translation unit, so torch's headers are parsed once), so each part must feed the cache key too."""
    return (OBSERVER, *sorted(OBSERVER.parent.glob("observer_*.h")), FRAMES, HEADER)


def observer_artifact() -> Path | None:
    """Where the observer for this interpreter, this torch build and these sources lives (None: no torch)."""
    tdir = _torch_dir()
    if tdir is None:
        return None
    version = (tdir / "version.py")
    stamp = version.read_bytes() if version.exists() else b""
    sources = b"".join(p.name.encode() + b"\0" + p.read_bytes() for p in observer_sources())
    digest = hashlib.sha256(sources + sys.version.encode() + str(tdir).encode() + stamp
                            + " ".join(C_FLAGS + CXX_FLAGS).encode()).hexdigest()[:16]
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return _cache_root() / f"{OBSERVER_MODULE}-{digest}{suffix}"


def load_observer() -> ModuleType | None:
    """The built observer, or None (never builds). Call after torch is imported: it links to torch's libraries."""
    if not observer_enabled() or sys.version_info < (3, 11):
        return None
    path = observer_artifact()
    return None if path is None else _load(OBSERVER_MODULE, path)


def _load(name: str, path: Path) -> ModuleType | None:
    key = str(path)
    if key not in _LOADED:
        mod = None
        if path.exists():
            try:
                loader = importlib.machinery.ExtensionFileLoader(name, key)
                spec = importlib.util.spec_from_file_location(name, key, loader=loader)
                mod = importlib.util.module_from_spec(spec)
                loader.exec_module(mod)
            except (ImportError, OSError):
                mod = None
        _LOADED[key] = mod
    return _LOADED[key]


def ensure(timeout_s: float = 120.0) -> tuple[Path | None, str]:
    """Build the module if it is not built yet; -> (path or None, why not). Safe to call from many
    processes and threads at once (each compiles to its own temporary name, then renames)."""
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

    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
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


def _cxx() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def ensure_observer(timeout_s: float = 240.0) -> tuple[Path | None, str]:
    """Build the observer if it is not built yet; -> (path or None, why not). Like ensure(): from the launcher,
    safe from many processes at once, a failure remembered beside the artifact."""
    if not observer_enabled():
        return None, "turned off by GPULAB_TRACE_OBSERVER=0 or GPULAB_TRACE_NATIVE=0"
    if sys.version_info < (3, 11):
        return None, f"needs Python >= 3.11, this is {sys.version.split()[0]}"
    path = observer_artifact()
    if path is None:
        return None, "torch is not importable"
    failed = path.with_suffix(path.suffix + ".failed")
    if path.exists():
        return path, ""
    if failed.exists():
        return None, failed.read_text(errors="replace")[-500:]
    cc, cxx = _compiler(), _cxx()
    include = sysconfig.get_paths().get("include", "")
    tdir = _torch_dir()
    if not cc or not cxx:
        return None, "no C and C++ compiler (cc, c++ or g++) on PATH and CC/CXX unset"
    if not (Path(include) / "Python.h").exists():
        return None, f"Python's headers are missing ({include}/Python.h)"
    if not (tdir / "include" / "ATen" / "record_function.h").exists():
        return None, f"torch's C++ headers are missing ({tdir}/include)"
    from gpulab import proc  # the launcher's side only (see the module docstring)

    def fail(why: str) -> tuple[None, str]:
        try:
            failed.write_text(why)
        except OSError:
            pass
        return None, why

    abi = proc.run([sys.executable, "-c", "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"],
                   timeout_s=120, capture=True, label="torch ABI")
    flag = (abi.stdout or "").strip().splitlines()[-1:] if abi.returncode == 0 else []
    if flag not in (["0"], ["1"]):
        return fail(f"could not ask torch for its C++ ABI ({abi.status}, exit {abi.returncode}): "
                    f"{(abi.stderr or abi.stdout)[-800:]}")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    obj = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.frames.o")
    try:
        r = proc.run([cc, *C_FLAGS, "-c", f"-I{include}", "-o", str(obj), str(FRAMES)],
                     timeout_s=timeout_s, capture=True, label="cc pyframes")
        if r.returncode == 0:
            lib = tdir / "lib"
            r = proc.run([cxx, *CXX_FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={flag[0]}",
                          f"-I{tdir / 'include'}", f"-I{include}", str(OBSERVER), str(obj), f"-L{lib}", "-lc10",
                          "-ltorch_cpu", f"-Wl,-rpath,{lib}", "-o", str(tmp)],
                         timeout_s=timeout_s, capture=True, label="c++ observer")
        if r.returncode != 0 or not tmp.exists():
            return fail(f"the observer's build failed ({r.status}, exit {r.returncode}): {(r.stderr or r.stdout)[-1500:]}")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        obj.unlink(missing_ok=True)
    return path, ""


def ensure_all() -> dict[str, str]:
    """Build what the recorder can use; -> {part: why not} for each part that is not built."""
    why: dict[str, str] = {}
    for name, build in (("hotpath", ensure), ("observer", ensure_observer)):
        built, reason = build()
        if built is None:
            why[name] = reason
    return why
