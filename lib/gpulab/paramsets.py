"""Parameter files and scenario lists: what every command that reads params/ shares (the chain, `gpulab fixes`,
`gpulab ladder`/`bisect`, the fix matrix's scenario files).

Why a root module: these readers sit in hang/, fixes/ and chain/, and the layer order lets each import only
what lies below it. The chain's own parts (the notebooks' schema, layering, validation) stay in
gpulab.chain.params; a scenario file's `fixes` are checked against the registry by gpulab.fixes.names.
"""
from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Iterable

import yaml

# Keys a scenario file may hold that describe the scenario instead of parameterising notebooks: `fixes`
# names registry fixes (patches/) applied to every child of the scenario's notebooks.
SCENARIO_KEYS = frozenset({"description", "fixes"})

_SCENARIO_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ParamError(ValueError):
    """A bad parameter: the message names the key, where it came from, and what is valid."""


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise ParamError(f"params file {str(path)!r} does not exist")
    if not path.is_file():
        raise ParamError(f"params file {str(path)!r} is a folder, not a YAML file; give a file such as "
                         f"params/smoke.yaml")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ParamError(f"params file {str(path)!r} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ParamError(f"params file {str(path)!r} must hold a mapping of key: value, "
                         f"not {type(data).__name__}")
    return data


def parse_override(text: str) -> tuple[str, Any]:
    """`-p key=value`; the value is read as YAML so numbers, booleans and lists get their types (a script's
    arguments go quoted, one value: -p workload='script:train.py --batch 4')."""
    if "=" not in text:
        raise ParamError(f"-p {text!r}: expected key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ParamError(f"-p {text!r}: the key is empty")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def list_scenarios(root: str | Path) -> list[str]:
    return sorted(p.stem for p in (Path(root) / "params" / "scenarios").glob("*.yaml"))


def parse_scenarios(root: str | Path, text: str) -> tuple[str, ...]:
    """`--scenario` text -> names: 'all', or a comma list of names from params/scenarios/ (checked)."""
    if text.strip() == "all":
        names = tuple(list_scenarios(root))
        if not names:
            raise ParamError("--scenario all: there is no scenario in params/scenarios/")
        return names
    names = tuple(n.strip() for n in text.split(","))
    check_scenarios(root, names)
    return names


def check_scenarios(root: str | Path, names: Iterable[str]) -> None:
    """Scenario names are names of files in params/scenarios/, each once; a path is refused (a parameter
    file goes with --params), so nothing is read from or written outside the project and --out."""
    names = list(names)
    valid = list_scenarios(root)
    listing = ", ".join(valid) or "(none in params/scenarios/)"
    if not names or not any(names):
        raise ParamError(f"--scenario names no scenario; give one or more of {listing} (comma-separated), "
                         f"or 'all'")
    problems = []
    for n in names:
        if not n:
            problems.append(f"--scenario has an empty name in the list; valid scenarios: {listing}")
        elif "/" in n or "\\" in n or n.endswith((".yaml", ".yml")) or not _SCENARIO_NAME.match(n):
            problems.append(f"scenario {n!r} is not a scenario name; scenarios are names from params/scenarios/ "
                            f"({listing}); to layer a YAML file of your own, use --params {n}")
        elif n not in valid:
            close = difflib.get_close_matches(n, valid, n=2)
            problems.append(f"unknown scenario {n!r}" + (f" (did you mean {', '.join(map(repr, close))}?)" if close
                                                         else "") + f"; valid scenarios: {listing}")
    dup = sorted({n for n in names if n and names.count(n) > 1})
    if dup:
        problems.append(f"scenario(s) {', '.join(map(repr, dup))} listed more than once in --scenario")
    if problems:
        raise ParamError("; ".join(problems) if len(problems) == 1 else "\n  - " + "\n  - ".join(problems))
