"""The platform facts behind notebook 01 and `gpulab env`: what this machine is, measured, not assumed.

Facts are one JSON-able dict (keys documented in `FACT_KEYS`) that the risk rules (`rules`, data in
risks.yaml) match against known platform problems. Everything that touches torch or the GPU runs in a
child process, one stage at a time with a deadline per stage, so a deadlocking library or a spinning
attention kernel becomes a fact instead of a hung notebook. No probe raises; a failing probe records its error.

Modules, by job: `facts` (the schema; host, environment variables, tools, ptrace: no torch), `probe` (the
parent-side stage runner on gpulab.proc) and `child` (the stages that run torch), `classify` (arch and
unified-memory classes; pure), `gather` (collect), `rules` (the risk-rule engine), `products` (env.json and
suggested_scenarios.json), `view` (tables, plot, finding, text report), `cli` (`gpulab env`).
"""
from __future__ import annotations

from gpulab.env.classify import classify_arch, classify_unified
from gpulab.env.cli import main
from gpulab.env.facts import FACT_KEYS, NESTED_FACTS
from gpulab.env.gather import collect, workload_config
from gpulab.env.products import document, match_risks, report, save_products
from gpulab.env.view import (env_table, evidence_table, facts_table, finding, finding_text, format_report, headline,
                             matches_table, plot_sdpa, risk_browser, scenarios_table, sdpa_rows, sdpa_table)

__all__ = [
    "FACT_KEYS", "NESTED_FACTS",
    "classify_arch", "classify_unified", "collect", "document", "env_table", "evidence_table", "facts_table",
    "finding", "finding_text", "format_report", "headline", "main", "match_risks", "matches_table", "plot_sdpa",
    "report", "risk_browser", "save_products", "scenarios_table", "sdpa_rows", "sdpa_table", "workload_config",
]
