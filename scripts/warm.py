"""Set-up's last step: import what a chain run imports, once, with bytecode writing on.

Why not `compileall` on the venv: it compiles every file there, 11,000 (40 s on two cores), and a chain run
imports about 2,500 of them. Why compile at all: with PYTHONDONTWRITEBYTECODE set (CI sets it, so does this
project's machine) nothing a process imports is ever written back, and each of the chain's children would
compile torch, pandas and the Jupyter stack again (about 10 s each). A module imported here from a package
that was not (a user's program importing more of torch) is compiled when first imported, as without set-up.

    python scripts/warm.py science   # torch and every gpulab module
    python scripts/warm.py jupyter   # a notebook cell run by papermill in a kernel, rendered to HTML
    python scripts/warm.py compiler  # the test set-up only: torch.compile's and torch.distributed's files
Set-up runs them side by side, after the kernel is installed.
"""
from __future__ import annotations

import importlib
import os
import pkgutil
import sys
import tempfile
import warnings
from pathlib import Path

sys.dont_write_bytecode = False   # what PYTHONDONTWRITEBYTECODE turned off, for this process only
ROOT = Path(__file__).resolve().parents[1]


def science() -> None:
    """torch and every gpulab module (what the chain's children and cells import)."""
    import gpulab

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in pkgutil.walk_packages(gpulab.__path__, "gpulab."):
            if not m.name.endswith("__main__"):
                importlib.import_module(m.name)
    import torch.testing

    print("torch", torch.__version__, "cuda" if torch.cuda.is_available() else "cpu")   # set-up's last line


def jupyter() -> None:
    """One notebook cell run through papermill in a real kernel (the kernel's own imports: IPython, debugpy,
    the inline plots), then rendered to HTML as the chain renders."""
    import nbformat
    import papermill

    from gpulab.chain import notebook

    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)   # the kernel is a child: it writes its imports too
    cells = [nbformat.v4.new_markdown_cell("# Warm\n- [x] a *list* <https://example.org>"),
             nbformat.v4.new_code_cell("import matplotlib.pyplot as plt, pandas, scipy.stats\nplt.plot([1, 2])\n"
                                       "df = pandas.DataFrame({'a': [1]}); df.to_csv(); df.to_dict(); display(df); df.style")]
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "warm.ipynb", Path(tmp) / "01_environment.ipynb"
        nbformat.write(nbformat.v4.new_notebook(cells=cells), str(src))
        papermill.execute_notebook(str(src), str(out), kernel_name="python3", progress_bar=False, log_output=False)
        notebook.render(out)


# what torch.compile, DDP and FSDP import, which no chain run of the built-in workload does: ~3,000 files
COMPILER = ("torch._inductor", "torch._dynamo", "torch._functorch", "torch.distributed", "sympy", "networkx", "triton")


def compiler() -> None:
    """Bytecode for the compiler stack and torch.distributed, for the test set-up: each process that compiles a
    graph or wraps a model in DDP compiled them from source again (about 4 CPU-s a process on two cores; dozens
    of such processes in the test suite). compileall, not imports: importing Inductor's code generators needs a
    compile to run."""
    import compileall
    import importlib.util

    for name in COMPILER:
        spec = importlib.util.find_spec(name)
        for where in (spec.submodule_search_locations or []) if spec else []:
            compileall.compile_dir(where, quiet=1, workers=0)


if __name__ == "__main__":
    {"science": science, "jupyter": jupyter, "compiler": compiler}[sys.argv[1]]()
