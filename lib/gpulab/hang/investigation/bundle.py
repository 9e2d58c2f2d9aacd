"""The evidence bundle for an upstream report: bundle.zip with everything a maintainer asks for, and
issue.md in the shape PyTorch's bug template asks for (describe the bug, a minimal repro, versions from
`python -m torch.utils.collect_env`). Nothing machine-private goes in: absolute paths become relative
placeholders, and the host and user names are replaced.
"""
from __future__ import annotations

import getpass
import io
import os
import re
import socket
import sys
import zipfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpulab import proc, report
from gpulab.hang.investigation.ladder import interval_text

COLLECT_ENV_TIMEOUT_S = 180.0


def collect_env(timeout_s: float = COLLECT_ENV_TIMEOUT_S) -> str:
    """torch's own environment report (what the bug template asks for), or why it could not be taken."""
    try:
        r = proc.run([sys.executable, "-m", "torch.utils.collect_env"], timeout_s=timeout_s, capture=True)
    except OSError as exc:
        return f"(collect_env could not start: {exc})"
    if r.status != "ok":
        return f"(collect_env {r.status} after {r.elapsed_s:.0f} s)\n{r.stdout}{r.stderr[-2000:]}"
    return r.stdout


def redactions(roots: Mapping[str, str | os.PathLike]) -> list[tuple[str, str]]:
    """(text, placeholder) pairs, longest first: named folders, then home, host and user names."""
    pairs = [(str(Path(p).resolve()), f"<{name}>") for name, p in roots.items() if p]
    home = os.path.expanduser("~")
    if home and home != "/":
        pairs.append((home, "~"))
    for value, label in ((socket.gethostname(), "<host>"), (_user(), "<user>")):
        if value and len(value) > 2:
            pairs.append((value, label))
    return sorted(pairs, key=lambda p: -len(p[0]))


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name is fine
        return ""


def redact(text: str, pairs: Sequence[tuple[str, str]]) -> str:
    for value, label in pairs:
        if label in ("<host>", "<user>"):
            text = re.sub(rf"(?<![A-Za-z0-9_.-]){re.escape(value)}(?![A-Za-z0-9_-])", label, text)
        else:
            text = text.replace(value, label)
    return text


# ------------------------------------------------------------------------------------ issue.md (pure)

def issue_md(*, verdict: Mapping[str, Any] | None, ladder: Mapping[str, Any] | None,
             bisect: Mapping[str, Any] | None, repro: Mapping[str, Any] | None, repro_src: str | None,
             repro_sh: str | None, versions: str, title_hint: str = "") -> str:
    v = verdict or {}
    op = v.get("in_flight_op") or {}
    shapes = " x ".join(str(tuple(s)) for s in op.get("shapes") or ())
    what = (f"`{op.get('name')}` ({shapes}, {', '.join(map(str, op.get('dtypes') or ()))}, on "
            f"{op.get('device')}) called at `{op.get('call_site')}`" if op else f"phase {v.get('phase')}")
    lines = ["### 🐛 Describe the bug", ""]
    if v.get("drill"):
        lines += [f"> This report comes from a **self-test** of gpulab's watchdog: the fault `{v.get('planted')}` "
                  "was planted on purpose. It is not a bug of PyTorch.", ""]
    lines.append(f"The program {v.get('status', 'fails')}s ({v.get('class') or 'unclassified'}) in {what}."
                 + (f" The host thread is blocked in `{v['host_blocked_in'].get('name')}` meanwhile."
                    if v.get("host_blocked_in") else "") + (f" {title_hint}" if title_hint else ""))
    if ladder and ladder.get("rungs"):
        lines += ["", "How often (each trial a fresh process under a watchdog):", ""]
        for r in ladder["rungs"]:
            n = r["trials"]
            k = n - r["counts"].get("pass", 0)
            ci = interval_text(*r["fail_rate_ci"])
            lines.append(f"- `{r['name']}`: {k} of {n} trials failed (95% interval {ci})")
    if bisect and bisect.get("minimal"):
        lines += ["", "Smallest failing configuration found by bisection ("
                  f"{len(bisect.get('probes') or ())} probes, {bisect.get('repeats')} trial(s) each): "
                  + ", ".join(f"`{k}={val}`" for k, val in bisect["minimal"].items())]
        if bisect.get("matters"):
            lines.append("Needed as given (every alternative passed): "
                         + ", ".join(f"`{k}={val}`" for k, val in bisect["matters"].items()))
    lines += ["", "#### Minimal repro", ""]
    if repro_src:
        lines += [f"Verified: in a fresh process this {(repro or {}).get('target', {}).get('status', 'fails')}s "
                  f"the same way ({(repro or {}).get('explanation', '')}).", "", "```python", repro_src.rstrip(), "```"]
    elif repro_sh:
        lines += [(repro or {}).get("explanation") or "No op-level replay reproduced the failure.",
                  "The smallest failing command:", "", "```sh", repro_sh.rstrip(), "```"]
    else:
        lines += [(repro or {}).get("explanation") or "No repro could be made; the stacks and op log are attached."]
    facts = [f for f in v.get("evidence") or () if f]
    if facts:
        lines += ["", "#### What was observed", ""] + [f"- {f}" for f in facts]
    lines += ["", "### Versions", "", "```", versions.rstrip(), "```", "",
              "_Generated by gpulab; the attached bundle.zip holds the verdict, all stacks, the op-log tail, the "
              "trials and the bisection probes._"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------ the zip

def write(out_dir: str | Path, *, verdict_dir: str | Path | None = None, ladder_dir: str | Path | None = None,
          bisect_dir: str | Path | None = None, repro_dir: str | Path | None = None,
          env_json: str | Path | None = None, versions: str | None = None,
          roots: Mapping[str, str | os.PathLike] | None = None) -> Path:
    """bundle.zip (and issue.md beside it) from the products of notebook 03 or the CLI commands."""
    out = Path(out_dir)
    pairs = redactions({"run": out, "project": Path.cwd(), **(roots or {})})
    members: dict[str, str] = {}

    def add(folder: str | Path | None, names: Sequence[str], prefix: str) -> None:
        if not folder:
            return
        for name in names:
            p = Path(folder) / name
            if p.is_file():
                members[f"{prefix}/{name}"] = redact(p.read_text(errors="replace"), pairs)

    vdir = Path(verdict_dir) if verdict_dir else None
    add(vdir, ("verdict.json", "stacks_python.txt", "stacks_native.txt", "stacks_gpu.txt", "oplog_tail.txt",
               "stderr.txt", "stdout.txt"), "failure")
    if vdir is not None and (vdir / "procs").is_dir():   # a job: every process's role, stacks and op-log tail
        add(vdir, sorted(f"procs/{p.name}" for p in (vdir / "procs").iterdir()
                         if p.suffix == ".json" or ".stacks_" in p.name or p.name.endswith(".oplog_tail.txt")), "failure")
    add(ladder_dir, ("ladder.json", "ladder_table.csv"), "ladder")
    add(bisect_dir, ("bisect.json", "repro.sh"), "bisect")
    add(repro_dir, ("repro.py", "repro.json"), "repro")
    if env_json and Path(env_json).is_file():
        members["env/env.json"] = redact(Path(env_json).read_text(errors="replace"), pairs)
    versions = versions if versions is not None else collect_env()
    members["env/collect_env.txt"] = redact(versions, pairs)
    text = issue_md(
        verdict=report.read_json(vdir / "verdict.json") if vdir else None,
        ladder=report.read_json(Path(ladder_dir) / "ladder.json") if ladder_dir else None,
        bisect=report.read_json(Path(bisect_dir) / "bisect.json") if bisect_dir else None,
        repro=report.read_json(Path(repro_dir) / "repro.json") if repro_dir else None,
        repro_src=members.get("repro/repro.py"), repro_sh=members.get("bisect/repro.sh"),
        versions=members["env/collect_env.txt"])
    members["issue.md"] = redact(text, pairs)
    report.write_text(out / "issue.md", members["issue.md"])
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, body in sorted(members.items()):
            z.writestr(name, body)
    return report.write_bytes(out / "bundle.zip", buf.getvalue())
