"""The recorder's mode and torch.compile: no torch._dynamo import for a program that never compiles, Dynamo's
own disable wrapper once it is imported, and the same records and call sites either way."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from gpulab import trace
from gpulab.trace import run as _run

pytestmark = pytest.mark.usefixtures("native_hot_path")  # conftest: built once, as launchers do

HAND_OVER = textwrap.dedent("""
    import sys, torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from gpulab.trace import dynamo

    depths = []

    @dynamo.lazy
    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            f, n = sys._getframe(1), 1
            while f is not None and f.f_code.co_name != "caller":
                f, n = f.f_back, n + 1
            depths.append(n)
            return func(*args, **(kwargs or {}))

    def caller():
        with Counting():
            return torch.ones(2).add(1)

    raw = Counting.__dict__["__torch_dispatch__"].__wrapped__
    caller()
    before = ("torch._dynamo" in sys.modules, getattr(raw, "__dynamo_disable").__name__, depths[-1])
    import torch._dynamo
    caller()
    after = (getattr(raw, "__dynamo_disable").__name__, depths[-1])
    print(before, after)
""")


def test_lazy_mode_needs_no_dynamo_until_the_program_imports_it():
    r = subprocess.run([sys.executable, "-c", HAND_OVER], capture_output=True, text=True, timeout=120,
                       env=_run._child_env())
    assert r.returncode == 0, r.stderr[-2000:]
    (imported, wrapper, depth), (wrapper_after, depth_after) = eval(r.stdout.strip().replace(") (", "), ("))
    assert not imported and wrapper == "until_dynamo"    # no torch._dynamo for a mode that never compiles
    assert wrapper_after != "until_dynamo"               # Dynamo's own disable wrapper once it is there
    assert depth_after >= depth                          # the measured depth to the caller is never too deep


@pytest.mark.parametrize("compiles", [False, True])
def test_recorded_program_with_and_without_torch_compile(tmp_path, compiles):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(f"""
        import sys, torch
        def f(x):
            return torch.sin(x) * 2 + x
        x = torch.randn(8)
        y = torch.compile(f, backend="eager")(x) if {compiles} else f(x)
        assert torch.allclose(y, torch.sin(x) * 2 + x)
        print("dynamo" if "torch._dynamo" in sys.modules else "no dynamo")
    """))
    log = tmp_path / "ops.log"
    r = subprocess.run([sys.executable, "-m", "gpulab.trace", "--log", str(log), "--mode", "ops", "--", str(script)],
                       capture_output=True, text=True, timeout=180, env=_run._child_env())
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == ("dynamo" if compiles else "no dynamo")
    sites = {(rec.name, rec.call_site.split(":")[-1]) for rec in trace.read(log).records}
    for op in ("aten.sin.default", "aten.mul.Tensor", "aten.add.Tensor"):
        assert (op, "4 in f") in sites, sites          # the user's line inside f, compiled or not
