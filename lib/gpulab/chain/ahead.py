"""A notebook's papermill child started ahead of its turn: it imports papermill and starts its kernel while the
notebook before it still runs, then waits for one line on stdin. `go` runs the notebook exactly as
`python -m papermill NB OUT -k KERNEL --cwd ROOT -f PARAMS --execution-timeout N` does (same parameters, same
saves after every cell, same exit codes); anything else, or the end of stdin (the runner did not need it or
died), shuts the kernel down and exits 0 having run nothing.

Why: a chain notebook's own cells often take a few seconds, and the papermill import plus a kernel start
(about 1.2 s here, more on a loaded machine) were paid in series six times a run (gpulab.chain.notebook)."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from typing import Any

EXIT_DEAD_KERNEL = 138   # papermill's own exit code for a kernel that died


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpulab.chain.ahead")
    p.add_argument("notebook")
    p.add_argument("output")
    p.add_argument("-k", "--kernel", default="python3")
    p.add_argument("--cwd", required=True)
    p.add_argument("-f", "--parameters-file", required=True)
    p.add_argument("--execution-timeout", type=int, default=None)
    return p


def imports_of(notebook: str, device: str | None = None) -> list[str]:
    """The modules the notebook's own import statements name (parameters cell aside), in order: `from a
    import b` names a and a.b (b may be a module). torch comes first where gpulab is named and the kernel will
    import it (_kernel_imports_torch); device: the notebook's device parameter (None: not known)."""
    import ast

    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    mods: list[str] = []
    for cell in nb.cells:
        if cell.cell_type != "code" or "parameters" in cell.metadata.get("tags", []):
            continue
        try:
            body = ast.parse(cell.source).body
        except SyntaxError:   # a magic: not Python
            continue
        for node in body:
            if isinstance(node, ast.Import):
                mods += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
                mods += [node.module, *(f"{node.module}.{a.name}" for a in node.names if a.name != "*")]
    if any(m == "gpulab" or m.startswith("gpulab.") for m in mods) and _kernel_imports_torch(nb, device):
        mods.insert(0, "torch")
    return list(dict.fromkeys(mods))


def _kernel_imports_torch(nb: Any, device: str | None) -> bool:
    """gpulab imports torch lazily, at the first call that needs it: in a chain kernel, the device (unless it is
    cpu or the runner's answer is in: gpulab.device.known_without_torch) and whatever the notebook's metadata
    says its cells call into torch for (`gpulab.kernel_torch`). Imported ahead where it will be; elsewhere it was
    CPU-seconds the kernel never needed (01 to 04 on the CPU, measured: no torch in their kernels; 04's platform
    facts read torch's version file there, gpulab.fixes.platform)."""
    from gpulab import device as dev

    if nb.metadata.get("gpulab", {}).get("kernel_torch") or device is None:
        return True
    return dev.known_without_torch(device) is None


def _preimport(km, mods: list[str]):
    """Ask the kernel to import the notebook's modules (torch, pandas, gpulab: 2-3 s a notebook) while it
    waits for its turn. Silent and in a throwaway namespace: the notebook's cells run as they would, only
    their imports find the modules loaded. The request is not waited for: a kernel still importing when the
    notebook starts runs its first cell right after. What the imports print is lost (a warning at import
    time shows once per process, so the notebook does not repeat it either). Returns the client to close."""
    if not mods:
        return None
    from jupyter_core.utils import run_sync

    code = ("import importlib\n"
            f"for m in {mods!r}:\n"
            "    try:\n"
            "        importlib.import_module(m)\n"
            "    except Exception:\n"
            "        pass\n")
    try:
        kc = km.client()
        kc.start_channels()
        run_sync(kc.wait_for_ready)(timeout=60)
        kc.execute(f"exec({code!r}, {{}})", silent=True, store_history=False)
        return kc
    except Exception as exc:  # noqa: BLE001 - only a head start: the notebook imports them itself
        print(f"gpulab.chain.ahead: no pre-import ({exc})", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    import nbclient
    import papermill
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.utils import run_sync
    from papermill.iorw import read_yaml_file

    km = AsyncKernelManager(kernel_name=ns.kernel)
    run_sync(km.start_kernel)(cwd=ns.cwd)
    try:
        kc = _preimport(km, imports_of(ns.notebook, (read_yaml_file(ns.parameters_file) or {}).get("device")))
        said = sys.stdin.readline().strip()
        if kc is not None:
            kc.stop_channels()
        if said != "go":
            print(f"gpulab.chain.ahead: not run ({said or 'end of input'}): the runner did not need it",
                  file=sys.stderr)
            return 0
        papermill.execute_notebook(ns.notebook, ns.output, parameters=read_yaml_file(ns.parameters_file) or {},
                                   kernel_name=ns.kernel, cwd=ns.cwd, execution_timeout=ns.execution_timeout,
                                   progress_bar=False, km=km)
        return 0
    except nbclient.exceptions.DeadKernelError:
        traceback.print_exc()
        return EXIT_DEAD_KERNEL
    finally:
        if km.has_kernel:   # the notebook is saved: no need to wait ~1 s for a graceful kernel exit
            run_sync(km.shutdown_kernel)(now=True)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)   # the kernel is shut down and the notebook saved: skip the kernel client's noisy finalizers
