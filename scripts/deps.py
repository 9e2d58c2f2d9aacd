"""Print pyproject.toml's dependencies one per line (for scripts/setup.sh and the environment test)."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load(path: Path = ROOT / "pyproject.toml") -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads(path.read_text())["project"]


def name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].strip().lower()


def deps(exclude: set[str] = frozenset(), extras: list[str] = ()) -> list[str]:
    project = load()
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    return [r for r in reqs if name(r) not in exclude]


def missing(reqs: list[str]) -> list[str]:
    """The requirements this Python cannot satisfy (not installed, or at a version outside the range): what a
    set-up run still has to install. Without `packaging` every requirement with a range counts as missing."""
    from importlib import metadata

    try:
        from packaging.requirements import Requirement
    except ModuleNotFoundError:
        Requirement = None
    out = []
    for r in reqs:
        try:
            have = metadata.version(name(r))
        except metadata.PackageNotFoundError:
            out.append(r)
            continue
        if Requirement is None:
            if name(r) != r.strip().lower():
                out.append(r)
        elif not Requirement(r).specifier.contains(have, prereleases=True):
            out.append(r)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--exclude", action="append", default=[])
    ap.add_argument("--extras", default="")
    ap.add_argument("--missing", action="store_true", help="only those not installed in this Python")
    a = ap.parse_args()
    reqs = deps(set(a.exclude), [e for e in a.extras.split(",") if e])
    reqs = missing(reqs) if a.missing else reqs
    if reqs:
        print("\n".join(reqs))
