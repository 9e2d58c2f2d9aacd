"""Known platform problems as data: each rule's signature is matched against the facts of `gpulab.env`.

Signatures are a tiny condition language in YAML (no eval), so a rule for a platform we do not have is
still unit-tested with synthetic facts:

    leaf:   {fact: KEY, OP: VALUE}      KEY is a documented fact (dotted paths into nested facts allowed)
            OP in eq, ne, in, not_in, version_ge, version_lt, regex, prefix, contains, empty, exists
    all: [cond, ...]   any: [cond, ...]   not: cond

A leaf on a missing fact is false (except `exists: false`), so an unknown platform never matches by
accident. Every match cites the leaves that held, with the observed values.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulab.env.facts import FACT_KEYS, NESTED_FACTS
from gpulab import fixindex   # the fixes' names and what they change, read below gpulab.fixes

DEFAULT_RULES = Path(__file__).resolve().parent / "risks.yaml"

OPERATORS = ("eq", "ne", "in", "not_in", "version_ge", "version_lt", "regex", "prefix", "contains", "empty",
             "exists")
COMBINATORS = ("all", "any", "not")
SEVERITIES = ("high", "medium", "low")
# Fixes a rule may suggest: the fix modules' names (patches/, the single source; notebook 04 runs them and
# params/scenarios/<name>.yaml runs the chain with one), read when a rule is checked, not at import.
RULE_FIELDS = ("id", "title", "severity", "signature", "risk", "evidence", "fixes", "advice", "source",
               "see_also")


class RuleError(ValueError):
    """A rules file that cannot be trusted: names the rule and the bad key or operator."""


@dataclass(frozen=True)
class Cond:
    """A leaf: one fact compared with one value."""
    fact: str
    op: str
    value: Any


@dataclass(frozen=True)
class Combo:
    kind: str  # all | any | not
    children: tuple


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    severity: str
    signature: Any  # Cond | Combo
    risk: str
    evidence: tuple[str, ...]
    fixes: tuple[str, ...]
    source: str
    advice: str = ""
    see_also: tuple[str, ...] = ()


@dataclass(frozen=True)
class RiskMatch:
    rule_id: str
    title: str
    severity: str
    risk: str
    matched: tuple[str, ...]  # the conditions that held, with observed values
    evidence: dict  # fact key -> observed value
    fixes: tuple[str, ...]
    advice: str
    source: str
    see_also: tuple[str, ...] = ()


# ----------------------------------------------------------------------------------------------------
# Loading and validation

def _check_fact_key(key: Any, where: str) -> str:
    if not isinstance(key, str) or not key:
        raise RuleError(f"{where}: fact must be a non-empty string, got {key!r}")
    head = key.split(".", 1)[0]
    if head not in FACT_KEYS or ("." in key and head not in NESTED_FACTS):
        raise RuleError(f"{where}: unknown fact key {key!r}; valid keys: {', '.join(sorted(FACT_KEYS))} "
                        f"(dotted paths only under {', '.join(NESTED_FACTS)})")
    return key


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    return v


def parse_condition(node: Any, where: str = "signature") -> Cond | Combo:
    """YAML node -> Cond/Combo tree; raises RuleError naming the place and the bad key or operator."""
    if not isinstance(node, dict) or not node:
        raise RuleError(f"{where}: a condition must be a mapping, got {node!r}")
    combos = [k for k in node if k in COMBINATORS]
    if combos:
        if len(node) != 1:
            raise RuleError(f"{where}: {combos[0]!r} must be the only key of its mapping, got {sorted(node)}")
        kind = combos[0]
        body = node[kind]
        if kind == "not":
            return Combo("not", (parse_condition(body, f"{where}.not"),))
        if not isinstance(body, list) or not body:
            raise RuleError(f"{where}.{kind}: needs a non-empty list of conditions, got {body!r}")
        return Combo(kind, tuple(parse_condition(c, f"{where}.{kind}[{i}]") for i, c in enumerate(body)))
    if "fact" not in node:
        raise RuleError(f"{where}: unknown operator(s) {sorted(node)}; a condition is "
                        f"{{fact: KEY, OP: VALUE}} with OP in {', '.join(OPERATORS)}, or one of "
                        f"{', '.join(COMBINATORS)}")
    fact = _check_fact_key(node["fact"], where)
    ops = [k for k in node if k != "fact"]
    if len(ops) != 1:
        raise RuleError(f"{where}: fact {fact!r} needs exactly one operator out of {', '.join(OPERATORS)}, "
                        f"got {ops}")
    op = ops[0]
    if op not in OPERATORS:
        raise RuleError(f"{where}: unknown operator {op!r} on fact {fact!r}; valid operators: "
                        f"{', '.join(OPERATORS)}")
    value = node[op]
    if op in ("in", "not_in") and not isinstance(value, list):
        raise RuleError(f"{where}: {op!r} needs a list, got {value!r}")
    if op in ("empty", "exists") and not isinstance(value, bool):
        raise RuleError(f"{where}: {op!r} needs true or false, got {value!r}")
    if op == "regex":
        try:
            re.compile(str(value))
        except re.error as exc:
            raise RuleError(f"{where}: bad regex {value!r}: {exc}") from None
    if op in ("version_ge", "version_lt") and not parse_version(value):
        raise RuleError(f"{where}: {op!r} needs a version like '6.2', got {value!r}")
    return Cond(fact, op, _freeze(value))


def _str_tuple(v: Any, where: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise RuleError(f"{where}: must be a list of strings, got {v!r}")
    return tuple(v)


def parse_rule(raw: Any, index: int = 0) -> Rule:
    if not isinstance(raw, dict):
        raise RuleError(f"rule #{index}: must be a mapping, got {type(raw).__name__}")
    rid = raw.get("id")
    if not isinstance(rid, str) or not re.fullmatch(r"[a-z0-9_]+", rid or ""):
        raise RuleError(f"rule #{index}: id must be snake_case text, got {rid!r}")
    where = f"rule {rid!r}"
    unknown = sorted(k for k in raw if k not in RULE_FIELDS)
    if unknown:
        raise RuleError(f"{where}: unknown field(s) {unknown}; valid fields: {', '.join(RULE_FIELDS)}")
    for need in ("title", "signature", "risk", "source"):
        if not raw.get(need):
            raise RuleError(f"{where}: missing required field {need!r}")
    sev = raw.get("severity", "medium")
    if sev not in SEVERITIES:
        raise RuleError(f"{where}: severity {sev!r} is not valid; choose one of {', '.join(SEVERITIES)}")
    if not re.match(r"https?://", str(raw["source"])):
        raise RuleError(f"{where}: source must be a public URL, got {raw['source']!r}")
    evidence = _str_tuple(raw.get("evidence"), f"{where}.evidence")
    for key in evidence:
        _check_fact_key(key, f"{where}.evidence")
    fixes = _str_tuple(raw.get("fixes"), f"{where}.fixes")
    for fx in fixes:
        if fx not in fixindex.names():
            raise RuleError(f"{where}.fixes: unknown fix scenario {fx!r}; valid: {', '.join(fixindex.names())}")
    return Rule(id=rid, title=str(raw["title"]), severity=sev,
                signature=parse_condition(raw["signature"], f"{where}.signature"), risk=str(raw["risk"]).strip(),
                evidence=evidence, fixes=fixes, source=str(raw["source"]),
                advice=str(raw.get("advice") or "").strip(),
                see_also=_str_tuple(raw.get("see_also"), f"{where}.see_also"))


def parse_rules(data: Any, origin: str = "rules") -> list[Rule]:
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise RuleError(f"{origin}: expected a mapping with a 'rules' list")
    rules = [parse_rule(r, i) for i, r in enumerate(data["rules"])]
    seen: set[str] = set()
    for r in rules:
        if r.id in seen:
            raise RuleError(f"{origin}: duplicate rule id {r.id!r}")
        seen.add(r.id)
    return rules


def load_rules(path: str | Path | None = None) -> list[Rule]:
    """Read and validate a rules YAML (default: the bundled env/risks.yaml)."""
    import yaml

    path = Path(path) if path else DEFAULT_RULES
    try:
        text = path.read_text()
    except OSError as exc:
        raise RuleError(f"cannot read rules file {str(path)!r}: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RuleError(f"{path}: not valid YAML: {exc}") from None
    return parse_rules(data, str(path))


# ----------------------------------------------------------------------------------------------------
# Evaluation (pure)

_MISSING = object()


def get_fact(facts: dict, key: str) -> Any:
    cur: Any = facts
    for part in key.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


def parse_version(v: Any) -> tuple[int, ...]:
    """'6.2.41133-dd7f95766' -> (6, 2, 41133); 12080 stays (12080,); junk -> ()."""
    if v is None or isinstance(v, bool):
        return ()
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = str(v)
    parts = []
    for p in str(v).strip().split("."):
        m = re.match(r"\d+", p)
        if not m:
            break
        parts.append(int(m.group(0)))
        if m.end() != len(p):
            break
    return tuple(parts)


def _cmp_versions(a: tuple, b: tuple) -> int:
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)


def _leaf(c: Cond, facts: dict) -> bool:
    got = get_fact(facts, c.fact)
    if c.op == "exists":
        return (got is not _MISSING and got is not None) == c.value
    if got is _MISSING or got is None:
        return False
    if c.op == "eq":
        return got == c.value
    if c.op == "ne":
        return got != c.value
    if c.op == "in":
        return got in c.value
    if c.op == "not_in":
        return got not in c.value
    if c.op in ("version_ge", "version_lt"):
        have = parse_version(got)
        if not have:
            return False
        d = _cmp_versions(have, parse_version(c.value))
        return d >= 0 if c.op == "version_ge" else d < 0
    if c.op == "regex":
        return re.search(str(c.value), str(got)) is not None
    if c.op == "prefix":
        return str(got).startswith(str(c.value))
    if c.op == "contains":
        return isinstance(got, (list, tuple, dict, str)) and c.value in got
    if c.op == "empty":
        return isinstance(got, (list, tuple, dict, str)) and (len(got) == 0) == c.value
    raise RuleError(f"unknown operator {c.op!r}")  # unreachable: validated on load


def _describe(c: Cond, facts: dict) -> str:
    got = get_fact(facts, c.fact)
    shown = "missing" if got is _MISSING else repr(got)
    return f"{c.fact} {c.op} {c.value!r} (observed {shown})"


def check(node: Cond | Combo, facts: dict) -> tuple[bool, list[str]]:
    """(holds, cited conditions). `any` cites only the branches that held."""
    if isinstance(node, Cond):
        ok = _leaf(node, facts)
        return ok, [_describe(node, facts)] if ok else []
    if node.kind == "all":
        cites = []
        for ch in node.children:
            ok, c = check(ch, facts)
            if not ok:
                return False, []
            cites += c
        return True, cites
    if node.kind == "any":
        held = [check(ch, facts) for ch in node.children]
        cites = [c for ok, cs in held if ok for c in cs]
        return any(ok for ok, _ in held), cites
    ok, _ = check(node.children[0], facts)
    if ok:
        return False, []
    leaves = _leaves(node.children[0])
    return True, ["not(" + " and ".join(_describe(l, facts) for l in leaves) + ")"]


def _leaves(node) -> list[Cond]:
    if isinstance(node, Cond):
        return [node]
    return [l for ch in node.children for l in _leaves(ch)]


def evaluate(facts: dict, rules: list[Rule]) -> list[RiskMatch]:
    """The rules whose signature holds on these facts, high severity first; each cites its evidence."""
    out = []
    for r in rules:
        ok, cites = check(r.signature, facts)
        if not ok:
            continue
        ev = {}
        for key in r.evidence:
            v = get_fact(facts, key)
            ev[key] = None if v is _MISSING else v
        out.append(RiskMatch(rule_id=r.id, title=r.title, severity=r.severity, risk=r.risk,
                             matched=tuple(cites), evidence=ev, fixes=r.fixes, advice=r.advice,
                             source=r.source, see_also=r.see_also))
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(out, key=lambda m: order[m.severity])


def suggested_scenarios(matches: list[RiskMatch]) -> list[str]:
    """Fix scenarios to try, in order of the most severe rule that suggests each, without repeats."""
    seen: list[str] = []
    for m in matches:
        for fx in m.fixes:
            if fx not in seen:
                seen.append(fx)
    return seen


def scenarios_product(matches: list[RiskMatch]) -> dict:
    """What notebook 04 reads from suggested_scenarios.json: names plus the rules behind each."""
    names = suggested_scenarios(matches)
    what = fixindex.catalog()
    return {"scenarios": names,
            "because": {n: [m.rule_id for m in matches if n in m.fixes] for n in names},
            "descriptions": {n: what[n] for n in names}}
