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

from gpulab.fixes.names import fix_names
from gpulab.paramsets import SCENARIO_KEYS, ParamError, check_scenarios, parse_override, read_yaml

# Keys the runner sets itself; a params file may not.
INJECTED = frozenset({"out_dir"})

_CHOICES = re.compile(r"choices:\s*(?P<list>[^#;]+)", re.IGNORECASE)
_RANGE = re.compile(r"range:\s*(?P<lo>-?[0-9.e+-]*)\s*\.\.\s*(?P<hi>-?[0-9.e+-]*)", re.IGNORECASE)
_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "list": list, "dict": dict}


@dataclass(frozen=True)
class ParamSpec:
    name: str
    type: str  # str | int | float | bool | list | dict | None (unannotated None default)
    default: Any
    choices: tuple[str, ...] = ()
    help: str = ""
    notebooks: tuple[str, ...] = ()
    range: tuple[float | None, float | None] | None = None  # inclusive bounds (`# range: lo..hi`); lists: each item

    @property
    def description(self) -> str:
        """The help comment without its machine-read parts (choices, range)."""
        text = _RANGE.sub("", _CHOICES.sub("", self.help))
        return re.sub(r"\s*[;,]\s*$", "", re.sub(r"\s{2,}", " ", text)).strip(" ;,") or ""

    def range_text(self) -> str:
        if not self.range:
            return ""
        lo, hi = self.range
        return f"{_num(lo) if lo is not None else ''}..{_num(hi) if hi is not None else ''}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


@dataclass(frozen=True)
class Value:
    value: Any
    source: str  # "params/base.yaml", "-p", ...


@dataclass(frozen=True)
class Layered:
    values: Mapping[str, Value] = field(default_factory=dict)
    description: str = ""
    fixes: tuple[str, ...] = ()   # registry fixes the scenario applies (the last layer that names them wins)

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
    bounds = None
    r = _RANGE.search(help_text)
    if r:
        try:
            bounds = (float(r.group("lo")) if r.group("lo") else None, float(r.group("hi")) if r.group("hi") else None)
        except ValueError as exc:
            raise ParamError(f"{notebook}: parameter {name!r} has a malformed range in {help_text!r}; "
                             f"write e.g. '# range: 1..64'") from exc
    return ParamSpec(name, type_name, default, choices, help_text, (notebook,), bounds)


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
                if (old.type, old.choices, old.range, old.default) != (spec.type, spec.choices, spec.range,
                                                                      spec.default):
                    raise ParamError(
                        f"parameter {name!r} is declared differently in {old.notebooks[0]} "
                        f"({old.type} = {old.default!r}, choices {list(old.choices)}, range {old.range_text() or '-'}) "
                        f"and {nb_name} ({spec.type} = {spec.default!r}, choices {list(spec.choices)}, range "
                        f"{spec.range_text() or '-'}); make them agree")
                spec = ParamSpec(name, old.type, old.default, old.choices, old.help or spec.help,
                                 old.notebooks + (nb_name,), old.range)
            schema[name] = spec
    return schema


# ---------------------------------------------------------------------------------------------- layers

def layer(layers: Iterable[tuple[str, Mapping[str, Any]]], description: str = "") -> Layered:
    values: dict[str, Value] = {}
    fixes: tuple[str, ...] = ()
    for source, data in layers:
        for key, value in data.items():
            if key in SCENARIO_KEYS:
                if key == "description":
                    description = str(value)
                elif key == "fixes":
                    fixes = fix_names(value, source)
                continue
            values[str(key)] = Value(value, source)
    return Layered(values, description, fixes)


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
        bad = _out_of_range(spec, value)
        if bad is not None:
            problems.append(f"parameter {key!r} {where} = {bad!r} is out of range; it must be within "
                            f"{spec.range_text()} (inclusive)")
            continue
        out[key] = value
    if len(problems) == 1:
        raise ParamError(problems[0])
    if problems:
        raise ParamError(f"{len(problems)} bad parameters:\n  - " + "\n  - ".join(problems))
    return out


def _out_of_range(spec: ParamSpec, value: Any) -> Any:
    """The first value (the value itself, or an item of a list) outside the declared range, or None."""
    if not spec.range:
        return None
    lo, hi = spec.range
    for v in (value if isinstance(value, list) else [value]):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            if isinstance(value, list):
                return v  # a list parameter with a range holds numbers only
            continue
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            return v
    return None


def for_notebook(values: Mapping[str, Any], schema: Mapping[str, ParamSpec], notebook: str) -> dict[str, Any]:
    """The subset a notebook declares: papermill only warns on extra keys, so we never pass them."""
    return {k: v for k, v in values.items() if notebook in schema.get(k, ParamSpec(k, "None", None)).notebooks}


def resolve(root: str | Path, scenario: str, param_files: Iterable[str | Path] = (),
            overrides: Iterable[str] = ()) -> Layered:
    """Read the layers for one scenario (its name checked by `check_scenarios`; the values are not: see
    `validate`)."""
    root = Path(root)
    check_scenarios(root, [scenario])
    layers: list[tuple[str, Mapping[str, Any]]] = []
    base = root / "params" / "base.yaml"
    if base.exists():
        layers.append(("params/base.yaml", read_yaml(base)))
    layers.append((f"params/scenarios/{scenario}.yaml", read_yaml(root / "params" / "scenarios" / f"{scenario}.yaml")))
    for f in param_files:
        layers.append((str(f), read_yaml(_param_file(root, f))))
    layers.append(("-p", dict(parse_override(o) for o in overrides)))
    return layer(layers)


def _param_file(root: Path, given: str | Path) -> Path:
    """A --params path is the caller's; a relative one that is not there names a file of the project's own
    (`--params params/smoke.yaml` from the user's folder reads the smoke sizes that ship with gpulab)."""
    path = Path(given)
    if not path.exists() and not path.is_absolute() and (root / path).is_file():
        return root / path
    return path


def schema_text(schema: Mapping[str, ParamSpec]) -> str:
    """`gpulab params`: one block per parameter, what a user needs to set it."""
    lines = []
    for spec in sorted(schema.values(), key=lambda s: s.name):
        allowed = (f"choices: {', '.join(spec.choices)}" if spec.choices else
                   f"range: {spec.range_text()}" if spec.range else "")
        lines.append(f"{spec.name}  ({spec.type}, default {spec.default!r}{'; ' + allowed if allowed else ''})")
        if spec.description:
            lines.append(f"    {spec.description}")
        lines.append(f"    used by: {', '.join(spec.notebooks)}")
    return "\n".join(lines)


def changed(values: Mapping[str, Any], schema: Mapping[str, ParamSpec]) -> dict[str, Any]:
    """The values that differ from the notebooks' own defaults (what the index shows a run changed)."""
    return {k: v for k, v in sorted(values.items()) if k in schema and schema[k].default != v}
