"""torch._dynamo is imported by the program or not at all (gpulab.trace.lazydynamo): recorded children start
without it, and a program that imports it midway is recorded as before, its call sites right on both sides."""
from __future__ import annotations

import sys

import pytest

from gpulab import trace
from gpulab.trace.run import _child_env

PROGRAM = """
import sys, torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

class Own(TorchDispatchMode):          # the program's own mode, made before dynamo is imported
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))

def wrapped(cls):
    return hasattr(cls.__dict__["__torch_dispatch__"], "__wrapped__")

rec = type(_get_current_dispatch_mode_stack()[0])
x = torch.ones(2) + 1                                   # line 13
with Own():
    y = x * 2                                           # line 15
print("before", "torch._dynamo" in sys.modules, wrapped(rec), wrapped(Own))
{import_line}
print("after", "torch._dynamo" in sys.modules, wrapped(rec), wrapped(Own))
z = x - 1                                               # line 19
with Own():
    w = z / 2                                           # line 21
"""


@pytest.mark.parametrize("import_line", ["import torch._dynamo", "torch.optim.AdamW([torch.nn.Parameter(x)])"])
def test_dynamo_is_imported_only_by_the_program_and_then_wraps_every_mode(tmp_path, import_line):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM.replace("{import_line}", import_line))
    rec = trace.record([sys.executable, str(script)], out_dir=tmp_path, timeout_s=120)   # no stall rule: lazy
    assert rec.ok, rec.stderr_tail
    out = rec.stderr_tail
    assert "before False False False" in out       # no import by the recorder, no wrapper yet
    assert "after True True True" in out           # torch's wrapping, for the recorder's mode and the program's
    sites = {r.name: r.call_site for r in rec.snapshot.records}
    assert [sites[f"aten.{op}.Tensor"].split("/")[-1] for op in ("add", "mul", "sub", "div")] == [
        "prog.py:13 in <module>", "prog.py:7 in __torch_dispatch__",   # under its own mode: called from there
        "prog.py:19 in <module>", "prog.py:7 in __torch_dispatch__"]


def test_a_process_that_imported_dynamo_before_is_left_as_torch_made_it():
    import subprocess

    code = ("import torch, torch._dynamo\nfrom gpulab.trace import lazydynamo\n"
            "from torch.utils._python_dispatch import TorchDispatchMode\n"
            "print(lazydynamo.defer(), '_should_skip_dynamo' in TorchDispatchMode.__dict__)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=_child_env())
    assert p.stdout.split() == ["False", "True"], p.stderr


@pytest.mark.parametrize("target,stall_s,want", [
    (["-m", "gpulab.workloads", "--workload", "builtin", "--rung", "forward"], 1.5, "lazy"),   # ours: no custom op
    (["-m", "gpulab.workloads", "--workload", "mod:fn"], 1.5, "eager"),
    (["train.py"], 3.0, "eager"),     # a custom op's first call imports it: seconds inside one op
    (["train.py"], 30.0, "lazy"),     # the default window: no import is mistaken for a hang
    (["train.py"], None, "lazy"),     # no stall rule at all
])
def test_the_import_is_deferred_only_where_no_stall_window_can_mistake_it(target, stall_s, want):
    from gpulab.trace.run import dynamo_import

    assert dynamo_import(target, stall_s) == want


def test_a_planted_fault_keeps_the_eager_import(tmp_path):
    """The faults' custom ops import dynamo on their first call: inside the op, under a short window, a hang
    (seen under test load: a 1.5 s window and a NaN fault)."""
    script = tmp_path / "prog.py"
    script.write_text("import sys, torch\nx = torch.ones(2, 2) @ torch.ones(2, 2)\n"
                      "print('dynamo', 'torch._dynamo' in sys.modules)\n")
    for fault, seen in ((None, "dynamo False"), ("nan:aten.mm@1", "dynamo True")):
        log = tmp_path / f"{fault is None}.log"
        argv = [sys.executable, "-m", "gpulab.trace", "--log", str(log), "--mode", "stats", "--dynamo", "lazy",
                *(["--fault", fault] if fault else []), "--", str(script)]
        import subprocess

        p = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=_child_env())
        assert seen in p.stdout, p.stderr
