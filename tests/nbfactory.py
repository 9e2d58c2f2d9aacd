"""Throwaway projects with tiny notebooks, for runner and params tests."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat

_spec = importlib.util.spec_from_file_location("nbtool", Path(__file__).resolve().parents[1] / "scripts" / "nbtool.py")
nbtool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nbtool)

PARAMS = '''out_dir: str = "outputs/x"  # where products go
device: str = "auto"  # choices: auto, cpu, cuda
interactive: bool = False
'''


def notebook(title: str, params: str, *cells: str) -> nbformat.NotebookNode:
    src = [f"# %% [markdown]\n# # {title}\n", '# %% tags=["parameters"]\n' + PARAMS + params]
    src += [f"# %%\n{c}\n" for c in cells]
    return nbtool.from_py("\n".join(src))


def project(tmp: Path, notebooks: dict[str, nbformat.NotebookNode], base: str = "", scenarios: dict[str, str] | None = None) -> Path:
    (tmp / "notebooks").mkdir(parents=True)
    (tmp / "params" / "scenarios").mkdir(parents=True)
    for name, nb in notebooks.items():
        nbformat.write(nb, tmp / "notebooks" / f"{name}.ipynb")
    (tmp / "params" / "base.yaml").write_text(base)
    for name, text in (scenarios or {"baseline": "description: plain\n"}).items():
        (tmp / "params" / "scenarios" / f"{name}.yaml").write_text(text)
    return tmp


RECORD = "import gpulab.report as r; r.record(out_dir, '{name}', '{headline}', value=1)"
