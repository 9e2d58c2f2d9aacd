"""Notebook 04's question: which fix scenario makes the failure go away, at what cost?

    fix        Fix: one change against one suspected cause, declared as data; platform predicates
    registry   patches/*.py -> Fix by name (the single source of fix names)
    compose    fixes -> one child environment (GPULAB_FIXES, the fixes' variables, GPULAB_PYTHON)
    install    install_from_env(): what every gpulab child entry point calls before the program runs
    kit        building blocks of patches/ (dispatch-level rewrites, SDPA switches, plain attention)
    child      `python -m gpulab.fixes.child -- PROGRAM`: a program with the fixes installed, no recorder
    platform   the facts a fix's `applies` is checked against
    verdict    pure: a scenario's verdict, the recommendation, what to try next
    numerics   a fix's outputs and loss curve against the fix-free run's
    cost       interleaved timing children (baseline, fix, baseline, ...): ratio of medians with its interval
    matrix     scenarios -> ladder, numerics, cost, verdicts; fixes.json
    outcome    a scenario's and the matrix's results (fixes.json); their verdicts and the table's rows
    commands   `gpulab fixes`
    view       notebook 04's table, plot and words; finding()

Only the light modules are imported here: a child's bootstrap imports this package before torch.
"""
from __future__ import annotations

from gpulab.fixes.compose import clean_env, scenario_env
from gpulab.fixes.fix import Fix, FixError, UnknownFix
from gpulab.fixes.install import install_from_env
from gpulab.fixes.registry import catalog, get, names, resolve, targeting

__all__ = ["Fix", "FixError", "UnknownFix", "catalog", "clean_env", "get", "install_from_env", "names",
           "resolve", "scenario_env", "targeting"]
