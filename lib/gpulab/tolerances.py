"""The one tolerance rule two runs' numbers are judged by: torch.testing.assert_close's per dtype, the looser of
the dtypes compared (a bfloat16 run against a float32 one is held to bfloat16's), unless the user sets it.
A root module, stdlib only: `gpulab compare`'s per-op judgement (gpulab.numerics) and 04's check of a fix's
outputs (gpulab.fixes.numerics, which may not import numerics) read the same table.
"""
from __future__ import annotations

from dataclasses import dataclass

# dtype -> (rtol, atol), as torch.testing.assert_close has them
DEFAULTS: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7), "float32": (1.3e-6, 1e-5), "float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5),
    "float8_e4m3fn": (1.25e-1, 1e-5), "float8_e5m2": (2.5e-1, 1e-5), "complex64": (1.3e-6, 1e-5),
    "complex128": (1e-7, 1e-7),
}


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    dtypes: tuple[str, ...] = ()
    set_by_user: bool = False
    scale: float | None = None   # atol was shrunk to values of this mean magnitude (gpulab.numerics.judge)

    def to_dict(self) -> dict:
        return {"rtol": self.rtol, "atol": self.atol, "dtypes": list(self.dtypes), "set_by_user": self.set_by_user,
                **({"atol_scaled_to": self.scale} if self.scale is not None else {})}

    def words(self) -> str:
        how = "set by the user" if self.set_by_user else f"assert_close's for {'/'.join(self.dtypes) or 'float32'}"
        if self.scale is not None:
            how += f", its atol scaled to the values' mean magnitude {self.scale:.3g}"
        return f"rtol {self.rtol:g}, atol {self.atol:g} ({how})"

    def at(self, magnitude: float) -> float:
        """assert_close's allowance |a - b| <= atol + rtol * |b| for values of this magnitude."""
        return self.atol + self.rtol * abs(magnitude)


def check(rtol: float | None, atol: float | None) -> None:
    for name, v in (("rtol", rtol), ("atol", atol)):
        if v is not None and not (v >= 0 and v == v and v != float("inf")):
            raise ValueError(f"--{name} {v!r} is not valid; give a finite number >= 0 (e.g. --{name} 1e-5)")


def for_dtypes(*dtypes: str | None, rtol: float | None = None, atol: float | None = None) -> Tolerance:
    """The looser of the dtypes' tolerances (an unknown dtype counts as float32); rtol/atol override."""
    names = tuple(dict.fromkeys(str(d).replace("torch.", "") for d in dtypes if d))
    pairs = [DEFAULTS.get(d, DEFAULTS["float32"]) for d in names] or [DEFAULTS["float32"]]
    r, a = max(p[0] for p in pairs), max(p[1] for p in pairs)
    return Tolerance(r if rtol is None else rtol, a if atol is None else atol, names,
                     rtol is not None or atol is not None)
