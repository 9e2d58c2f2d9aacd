"""Layered run parameters, validated against the notebooks' own parameters cells before anything runs.

Layers, later wins: params/base.yaml -> params/scenarios/<name>.yaml -> each --params FILE -> -p key=value.
Every value remembers the layer it came from, so an error can say which file to fix. The schema is read
from the notebooks (papermill.inspect_notebook): a key is valid when some notebook declares it, its type
is the annotation there, and `# choices: a, b` in the declaring line's comment lists the valid values.
"""
from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

# Keys a scenario file may hold that describe the scenario instead of parameterising notebooks.
SCENARIO_KEYS = frozenset({"description"})
# Keys the runner sets itself; a params file may not.
INJECTED = frozenset({"out_dir"})

_CHOICES = re.compile(r"choices:\s*(?P<list>[^#;]+)", re.IGNORECASE)
_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "list": list, "dict": dict}


class ParamError(ValueError):
    """A bad parameter: the message names the key, where it came from, and what is valid."""


@dataclass(frozen=True)
class ParamSpec:
    name: str
    type: str  # str | int | float | bool | list | dict | None (unannotated None default)
    default: Any
    choices: tuple[str, ...] = ()
    help: str = ""
    notebooks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Value:
    value: Any
    source: str  # "params/base.yaml", "-p", ...


@dataclass(frozen=True)
class Layered:
    values: Mapping[str, Value] = field(default_factory=dict)
    description: str = ""

    def plain(self) -> dict[str, Any]:
        return {k: v.value for k, v in self.values.items()}

    def sources(self) -> dict[str, str]:
        return {k: v.source for k, v in self.values.items()}


# ---------------------------------------------------------------------------------------------- schema

def _spec_from_inspect(name: str, raw: Mapping[str, Any], notebook: str) -> ParamSpec:
    type_name = (raw.get("inferred_type_name") or "None").strip()
    try:
        default = ast.literal_eval(raw.get("default", "None"))
    except (ValueError, SyntaxError) as exc:
        raise ParamError(f"{notebook}: parameter {name!r} default {raw.get('default')!r} is not a literal "
                         f"(parameters cells hold YAML-friendly literals only)") from exc
    help_text = (raw.get("help") or "").strip()
    m = _CHOICES.search(help_text)
    choices = tuple(c.strip() for c in m.group("list").split(",") if c.strip()) if m else ()
    if type_name not in _TYPES:
        type_name = "None" if default is None else type(default).__name__
    return ParamSpec(name, type_name, default, choices, help_text, (notebook,))


def notebook_schema(paths: Iterable[str | Path]) -> dict[str, ParamSpec]:
    """Union of the parameters declared by the notebooks; a key shared by several must agree."""
    import papermill

    schema: dict[str, ParamSpec] = {}
    for path in paths:
        nb_name = Path(path).stem
        declared = papermill.inspect_notebook(str(path))
        for name, raw in declared.items():
            spec = _spec_from_inspect(name, raw, nb_name)
            if name in schema:
                old = schema[name]
                if (old.type, old.choices) != (spec.type, spec.choices):
                    raise ParamError(
                        f"parameter {name!r} is declared differently in {old.notebooks[0]} "
                        f"({old.type}, choices {list(old.choices)}) and {nb_name} ({spec.type}, "
                        f"choices {list(spec.choices)}); make them agree")
                spec = ParamSpec(name, old.type, old.default, old.choices, old.help or spec.help,
                                 old.notebooks + (nb_name,))
            schema[name] = spec
    return schema


# ---------------------------------------------------------------------------------------------- layers

def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise ParamError(f"params file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ParamError(f"params file {str(path)!r} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ParamError(f"params file {str(path)!r} must hold a mapping of key: value, "
                         f"not {type(data).__name__}")
    return data


def parse_override(text: str) -> tuple[str, Any]:
    """`-p key=value`; the value is read as YAML so numbers, booleans and lists get their types."""
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


def layer(layers: Iterable[tuple[str, Mapping[str, Any]]], description: str = "") -> Layered:
    values: dict[str, Value] = {}
    for source, data in layers:
        for key, value in data.items():
            if key in SCENARIO_KEYS:
                if key == "description":
                    description = str(value)
                continue
            values[str(key)] = Value(value, source)
    return Layered(values, description)


# ---------------------------------------------------------------------------------------------- checks

def _type_ok(spec: ParamSpec, value: Any) -> bool:
    if spec.type == "None" or value is None and spec.default is None:
        return True
    expected = _TYPES[spec.type]
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, expected)


def _coerce(spec: ParamSpec, value: Any, source: str) -> Any:
    """A `-p` scalar for a str parameter stays a string (e.g. `-p fault=1` or `-p dtype=float16`)."""
    if spec.type == "str" and source == "-p" and isinstance(value, (int, float, bool)):
        return str(value).lower() if isinstance(value, bool) else str(value)
    if spec.type == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def validate(layered: Layered, schema: Mapping[str, ParamSpec]) -> dict[str, Any]:
    """Return the checked, coerced values, or raise ParamError listing every problem found."""
    problems: list[str] = []
    out: dict[str, Any] = {}
    valid = sorted(schema)
    for key, val in layered.values.items():
        where = f"(from {val.source})"
        if key in INJECTED:
            problems.append(f"{key!r} {where} is set by the runner (use --out); remove it")
            continue
        spec = schema.get(key)
        if spec is None:
            close = difflib.get_close_matches(key, valid, n=3)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            problems.append(f"unknown parameter {key!r} {where}.{hint} Valid parameters: {', '.join(valid)}")
            continue
        value = _coerce(spec, val.value, val.source)
        if not _type_ok(spec, value):
            problems.append(f"parameter {key!r} {where} must be {spec.type}, got {type(value).__name__} "
                            f"{value!r}")
            continue
        if spec.choices and str(value) not in spec.choices:
            problems.append(f"parameter {key!r} {where} = {value!r} is not a valid choice; "
                            f"choose one of: {', '.join(spec.choices)}")
            continue
        out[key] = value
    if problems:
        raise ParamError("bad parameters:\n  - " + "\n  - ".join(problems))
    return out


def for_notebook(values: Mapping[str, Any], schema: Mapping[str, ParamSpec], notebook: str) -> dict[str, Any]:
    """The subset a notebook declares: papermill only warns on extra keys, so we never pass them."""
    return {k: v for k, v in values.items() if notebook in schema.get(k, ParamSpec(k, "None", None)).notebooks}


def resolve(root: str | Path, scenario: str, param_files: Iterable[str | Path] = (),
            overrides: Iterable[str] = ()) -> Layered:
    """Read the layers for one scenario (no validation; see `validate`)."""
    root = Path(root)
    layers: list[tuple[str, Mapping[str, Any]]] = []
    base = root / "params" / "base.yaml"
    if base.exists():
        layers.append(("params/base.yaml", read_yaml(base)))
    scen = root / "params" / "scenarios" / f"{scenario}.yaml"
    if not scen.exists():
        raise ParamError(f"unknown scenario {scenario!r}; valid scenarios: "
                         f"{', '.join(list_scenarios(root)) or '(none in params/scenarios/)'}")
    layers.append((f"params/scenarios/{scenario}.yaml", read_yaml(scen)))
    for f in param_files:
        layers.append((str(f), read_yaml(f)))
    layers.append(("-p", dict(parse_override(o) for o in overrides)))
    return layer(layers)


def list_scenarios(root: str | Path) -> list[str]:
    return sorted(p.stem for p in (Path(root) / "params" / "scenarios").glob("*.yaml"))
