"""The tolerance two runs' numbers are judged by: assert_close's per dtype (gpulab.tolerances, the one rule the
fix matrix's output check shares), named here for the comparison's modules. Pure."""
from __future__ import annotations

from gpulab.tolerances import DEFAULTS, Tolerance, check, for_dtypes

__all__ = ["DEFAULTS", "Tolerance", "check", "for_dtypes"]
