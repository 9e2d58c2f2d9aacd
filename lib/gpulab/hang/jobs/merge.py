"""`gpulab merge DIR...`: one cross-process verdict from the folders of a job's nodes.

A job across nodes is watched where it runs: one `gpulab watch --out DIR -- torchrun --nnodes N ...` per
node, started the way the job is started. Each writes its node's evidence (every process's op log, stacks
and role under DIR/procs, and the node's verdict); no agent talks to another. Ranks are global, so the
nodes' views join into one job, and gpulab.hang.jobs.job finds where the groups diverge across nodes.

    gpulab merge [--json FILE] DIR [DIR ...]

Exit codes: 0 the merged verdict names no cross-process failure, 3 it does, 2 bad input.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

from gpulab import proc
from gpulab.args import BadInput, json_target, parser
from gpulab.hang.jobs import job, jobread
from gpulab.hang.jobs.job import JobFinding, ProcessView
from gpulab.report import write_json


def folder_of(d: Path) -> Path:
    """A watchdog's --out folder (its procs/ inside) or the procs folder itself."""
    for cand in (d / "procs", d):
        if cand.is_dir() and any(p.suffix == ".json" and p.stem.isdigit() for p in cand.iterdir()):
            return cand
    raise BadInput(f"{str(d)!r} holds no followed processes (no procs/<pid>.json): give the --out folder of a "
                   "`gpulab watch` of a job on one node")


def node_views(d: Path, label: str | None = None) -> list[ProcessView]:
    """One node's views as its watchdog saw them at the stall (its verdict's rows: state, last progress)."""
    folder = folder_of(d)
    verdict = folder.parent / "verdict.json" if folder.name == "procs" else folder / "verdict.json"
    rows = {}
    if verdict.exists():
        rows = {r["pid"]: r for r in json.loads(verdict.read_text()).get("processes") or () if "pid" in r}
    return jobread.views(folder, jobread.stacks_files(folder), seen=rows or None, node=label)


def merge(dirs: Sequence[str | Path]) -> tuple[list[ProcessView], JobFinding]:
    dirs = [Path(d) for d in dirs]
    missing = [str(d) for d in dirs if not d.is_dir()]
    if missing:
        raise BadInput(f"not a folder: {', '.join(map(repr, missing))}")
    per_node = [node_views(d) for d in dirs]
    hosts = [v[0].node if v else "" for v in per_node]
    if len(set(hosts)) < len(hosts):   # several "nodes" on one host (a rehearsal): name them by folder
        per_node = [node_views(d, f"{h}:{d.name}") for d, h in zip(dirs, hosts)]
    views = [v for vs in per_node for v in vs]
    return views, job.analyse(views)


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("gpulab merge", "One cross-process verdict from the folders of a job's nodes (each the --out of a "
               "`gpulab watch` beside torchrun on that node). Exit codes: 0 no cross-process failure found, 3 one "
               "found, 2 bad input.", "gpulab merge --json job.json node0/ node1/")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the merged verdict here")
    p.add_argument("dirs", nargs="+", metavar="DIR")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        json_target(args.json)
        views, finding = merge(args.dirs)
    except BadInput as exc:
        print(f"gpulab merge: {exc}", file=sys.stderr)
        return proc.EXIT_BAD_INPUT
    out = {"nodes": [str(d) for d in args.dirs], **finding.to_dict()}
    if args.json:
        write_json(args.json, out)
    print(f"class {finding.cls}  culprit {finding.culprit}  processes {len(views)} on "
          f"{len({v.node for v in views})} node(s)")
    for fact in finding.evidence:
        print(f"  - {fact}")
    return 3 if finding.cls else 0
