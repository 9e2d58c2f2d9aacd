"""Build, strip and check the workbook's notebooks.

  python scripts/nbtool.py from-py SRC.py DEST.ipynb   # percent-format script -> stripped notebook
  python scripts/nbtool.py to-py NB.ipynb              # print a notebook as a percent-format script (to edit)
  python scripts/nbtool.py strip [NB.ipynb ...]        # drop outputs/execution counts in place
  python scripts/nbtool.py check [NB.ipynb ...]        # exit 1 if any is unstripped or lacks a parameters cell

Percent format: cells start with `# %%` (code), `# %% [markdown]` (markdown; lines are `# ` commented),
and `# %% tags=["parameters"]` for the parameters cell.
"""
from __future__ import annotations

import glob
import json
import re
import sys

import nbformat

CELL = re.compile(r"^# %%(?P<md> \[markdown\])?(?: tags=(?P<tags>\[.*\]))?\s*$")


def from_py(src: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "language_info": {"name": "python"}}
    cells, kind, tags, lines = [], None, [], []

    def flush():
        if kind is None:
            return
        text = "\n".join(lines).strip("\n")
        if kind == "markdown":
            text = "\n".join(l[2:] if l.startswith("# ") else l.lstrip("#") for l in text.splitlines())
            cell = nbformat.v4.new_markdown_cell(text)
        else:
            cell = nbformat.v4.new_code_cell(text)
        if tags:
            cell.metadata["tags"] = tags
        cell["id"] = f"cell-{len(cells):02d}"  # stable ids: regenerating a notebook gives no diff
        cells.append(cell)

    for line in src.splitlines():
        m = CELL.match(line)
        if m:
            flush()
            kind = "markdown" if m.group("md") else "code"
            tags = json.loads(m.group("tags")) if m.group("tags") else []
            lines = []
        elif kind is not None:
            lines.append(line)
    flush()
    nb.cells = cells
    nbformat.validator.normalize(nb)
    return nb


def to_py(nb) -> str:
    out = []
    for c in nb.cells:
        tags = c.get("metadata", {}).get("tags", [])
        head = "# %%" + (" [markdown]" if c.cell_type == "markdown" else "")
        if tags:
            head += " tags=" + json.dumps(tags)
        out.append(head)
        src = c.source
        if c.cell_type == "markdown":
            src = "\n".join("# " + l if l else "#" for l in src.splitlines())
        out.append(src)
        out.append("")
    return "\n".join(out)


def strip(nb) -> bool:
    changed = False
    for c in nb.cells:
        if c.cell_type == "code":
            if c.get("outputs") or c.get("execution_count") is not None:
                changed = True
            c.outputs, c.execution_count = [], None
        for key in ("execution", "papermill", "collapsed", "scrolled"):
            if key in c.get("metadata", {}):
                del c.metadata[key]
                changed = True
    for key in ("papermill", "widgets"):
        if key in nb.metadata:
            del nb.metadata[key]
            changed = True
    return changed


def problems(path: str) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    found = []
    if any(c.cell_type == "code" and (c.get("outputs") or c.get("execution_count")) for c in nb.cells):
        found.append(f"{path}: has outputs (run `python scripts/nbtool.py strip {path}`)")
    params = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(params) != 1:
        found.append(f"{path}: needs exactly one cell tagged 'parameters' (has {len(params)})")
    if not nb.cells or nb.cells[0].cell_type != "markdown" or not nb.cells[0].source.startswith("# "):
        found.append(f"{path}: first cell must be a markdown title ('# ...')")
    return found


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    cmd, args = argv[0], argv[1:]
    if cmd == "from-py":
        src, dest = args
        nbformat.write(from_py(open(src).read()), dest)
        return 0
    if cmd == "to-py":
        sys.stdout.write(to_py(nbformat.read(args[0], as_version=4)))
        return 0
    paths = args or sorted(glob.glob("notebooks/[0-9][0-9]_*.ipynb"))
    if cmd == "strip":
        for p in paths:
            nb = nbformat.read(p, as_version=4)
            if strip(nb):
                nbformat.write(nb, p)
                print(f"stripped {p}")
        return 0
    if cmd == "check":
        found = [msg for p in paths for msg in problems(p)]
        print("\n".join(found) if found else f"{len(paths)} notebooks ok")
        return 1 if found else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
