"""The oracle's two errors, apart so every module can raise them without importing the others."""
from __future__ import annotations


class OracleError(ValueError):
    """Bad input to the oracle (cases, dtypes, device): names the bad value and the valid choices."""


class CandidateError(RuntimeError):
    """A candidate broke the SDPA contract (signature, return type, shape): names candidate and case."""
