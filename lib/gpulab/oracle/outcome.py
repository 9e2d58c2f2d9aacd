"""Notebook 05's outcome: a Gate (one OracleReport per candidate, what 06 may benchmark) and its headline.
Apart from gpulab.oracle.check, which judges with torch: a 05 that does not apply to its workload says so and
ends in a second, without torch."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from gpulab import report
from gpulab.oracle import view

GATE_FILE = report.ORACLE_GATE_FILE
TABLE = "oracle_table"          # the gate's long table: oracle_table.csv / .json
TENSORS_DIR = "oracle_tensors"  # the worst failing cases' tensors, as .npy


@dataclass(frozen=True)
class Gate:
    """Notebook 05's result: one OracleReport per candidate, and what notebook 06 may benchmark."""
    reports: dict
    device: str
    dtypes: tuple[str, ...]
    cases: str
    kinds: dict
    wall_s: float
    unavailable: dict
    applies: bool = True     # False: the workload makes no attention call (a user program 02 saw run without one)
    note: str = ""           # the scope in a sentence (gpulab.oracle.scope_for): why it does not apply, whose dtypes
    caveat: str = ""         # said in the headline: it is unknown whether the program calls attention

    @property
    def verdicts(self):
        """One line per candidate: a DataFrame."""
        return view.verdicts(self)

    @property
    def table(self):
        """Every candidate's cases in one DataFrame."""
        return view.gate_table(self)

    @property
    def failing(self) -> list:   # [OracleReport]
        return [r for r in self.reports.values() if not r.passed]

    def rows(self) -> list[dict]:
        return [{"candidate": n, **row} for n, r in self.reports.items() for row in r.rows()]

    def gate_json(self) -> dict:
        return {n: r.summary() for n, r in self.reports.items()}

    def headline(self) -> str:
        if not self.applies:
            return self.note
        n, ok = len(self.reports), sum(r.passed for r in self.reports.values())
        where = f"{self.device}, {'/'.join(self.dtypes)}, {self.cases} cases"
        tail = f"; {self.caveat}" if self.caveat else ""
        if ok == n:
            worst = max(self.reports.values(), key=lambda r: r.worst_ratio if math.isfinite(r.worst_ratio) else -1)
            return (f"all {n} attention candidates pass the oracle ({where}); worst error ratio "
                    f"{worst.worst_ratio:.2f} ({worst.candidate}){tail}")
        bad = self.failing[0]
        return f"{n - ok} of {n} attention candidates fail the oracle ({where}): {bad.candidate}: " \
               f"{bad.summary()['reason'][:160]}{tail}"

    def metrics(self) -> dict:
        return {"candidates_checked": len(self.reports), "passed": sum(r.passed for r in self.reports.values()),
                "failures": [r.candidate for r in self.failing],
                "max_ratio": {n: r.worst_ratio for n, r in self.reports.items()},
                "wall_s": round(self.wall_s, 2), "device": self.device, "dtypes": list(self.dtypes),
                "cases": self.cases, "unavailable": self.unavailable, "applies": self.applies,
                **({"reason": self.note} if not self.applies else {"scope": self.note} if self.note else {})}

    def plot_ratio_distribution(self, ax=None):
        return view.plot_ratio_distribution(self, ax)

    def save(self, out_dir: str | os.PathLike) -> None:
        """oracle_gate.json (what notebook 06 reads), the long table, and the failing cases' tensors."""
        report.write_json(report.product(out_dir, GATE_FILE), self.gate_json())
        report.write_rows(out_dir, TABLE, self.rows())
        for r in self.failing:
            r.save(Path(out_dir) / TENSORS_DIR)


def finding(g: Gate) -> tuple[str, dict]:
    """Notebook 05's headline and metrics for metrics.json."""
    return g.headline(), g.metrics()
