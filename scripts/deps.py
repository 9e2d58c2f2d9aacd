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


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--exclude", action="append", default=[])
    ap.add_argument("--extras", default="")
    a = ap.parse_args()
    print("\n".join(deps(set(a.exclude), [e for e in a.extras.split(",") if e])))
