"""What `gpulab env` and notebook 01 hand on: facts + matched risks + suggested scenarios, as files.

env.json holds the whole report; suggested_scenarios.json is what notebook 04 reads.
"""
from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpulab.env import rules
from gpulab.env.gather import collect
from gpulab.report import product, write_json


def match_risks(facts: dict, rules_path: str | os.PathLike | None = None) -> list[rules.RiskMatch]:
    """The bundled (or given) risk rules that hold on these facts, most severe first."""
    return rules.evaluate(facts, rules.load_rules(rules_path))


def document(facts: dict, matches: list[rules.RiskMatch]) -> dict:
    """The env.json document."""
    return {"facts": facts, "risks": [asdict(m) for m in matches],
            "suggested_scenarios": rules.suggested_scenarios(matches)}


def report(workload: Any = None, *, rules_path: str | os.PathLike | None = None, run_sdpa: bool = True,
           **collect_kw: Any) -> dict:
    """Facts + matched risks + suggested scenarios in one JSON-able dict (what env.json holds). The rules
    are loaded first, so a bad rules file is reported before anything is probed."""
    rule_set = rules.load_rules(rules_path)
    facts = collect(workload, run_sdpa=run_sdpa, **collect_kw)
    return document(facts, rules.evaluate(facts, rule_set))


def save_products(out_dir: str | os.PathLike, facts: dict, matches: list[rules.RiskMatch]) -> dict[str, Path]:
    """env.json (facts + risks) and suggested_scenarios.json (read by notebook 04) in out_dir."""
    return {"env": write_json(product(out_dir, "env.json"), document(facts, matches)),
            "suggested_scenarios": write_json(product(out_dir, "suggested_scenarios.json"),
                                              rules.scenarios_product(matches))}
