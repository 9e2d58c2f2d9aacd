"""The committed notebooks: stripped, titled, one parameters cell that papermill parses completely."""
from __future__ import annotations

import re

import nbformat
import papermill
import pytest

from conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ASSIGN = re.compile(r"^(\w+)\s*(:[^=]+)?=")
REQUIRED = {"out_dir", "device", "interactive"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_conventions(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "commit notebooks stripped"
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1
    declared = [m.group(1) for line in params[0].source.splitlines() if (m := ASSIGN.match(line))]
    parsed = papermill.inspect_notebook(str(path))
    assert sorted(parsed) == sorted(declared), "papermill could not parse every parameter line (no '=' in comments)"
    assert REQUIRED <= set(parsed)
    assert "gpulab.report.record" in code[-1].source or "report.record" in code[-1].source or "record(" in code[-1].source


def test_shared_keys_agree_across_notebooks():
    from gpulab.chain import params
    params.notebook_schema(NOTEBOOKS)  # raises when a shared key differs in type or choices
