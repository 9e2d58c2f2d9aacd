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
def test_dynamo_is_imported_only_by_the_program_and_then_wraps_every_mode(tmp_path, monkeypatch, import_line):
    monkeypatch.setenv("GPULAB_TRACE_OBSERVER", "0")   # the dispatch-mode recorder (the observer is no mode)
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM.replace("{import_line}", import_line))
    rec = trace.record([sys.executable, str(script)], out_dir=tmp_path, timeout_s=120)
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


def _record_op(tmp_path, name: str, *body: str):
    """A program whose one custom op, gpulab_test::<name>, runs `body` (its lines) before it returns, recorded
    with a 1.5 s stall window."""
    script = tmp_path / "prog.py"
    script.write_text("import subprocess, torch\n"
                      f"@torch.library.custom_op('gpulab_test::{name}', mutates_args=())\n"
                      f"def {name}(x: torch.Tensor) -> torch.Tensor:\n"
                      + "".join(f"    {line}\n" for line in body) +
                      "    return x + 1\n"
                      f"print({name}(torch.ones(2)))\n")
    return trace.record([sys.executable, str(script)], out_dir=tmp_path, timeout_s=120, stall_s=1.5)


def test_a_slow_import_inside_an_op_is_progress_not_a_hang(tmp_path):
    """torch imports modules inside ops (a custom op's first call imports torch._dynamo: 1.6 s here, over 3 s
    under test load, once seen as a hang in a 1.5 s window); the heartbeat marks beats that come while the
    main thread imports, and an open op advances by them (gpulab.trace.liveness)."""
    (tmp_path / "slowmod.py").write_text("import time\nt = time.time()\nwhile time.time() - t < 4:\n    pass\n")
    rec = _record_op(tmp_path, "imports", "import slowmod")
    assert rec.status == "ok", rec.stderr_tail
    assert "gpulab_test.imports.default" in [r.name for r in rec.snapshot.records]


def test_an_op_waiting_on_a_compiler_it_started_is_progress_not_a_hang(tmp_path):
    """A compiled step compiles its backward inside the autograd node that runs it and waits there for g++ (tens
    of seconds with a cold cache under load: an FSDP job was once stopped there as a hang). The CPU of the
    child processes the op started is its progress; the busy shell here stands in for the compiler."""
    rec = _record_op(tmp_path, "compiles", "subprocess.run(['timeout', '4', 'sh', '-c', 'while :; do :; done'])")
    assert rec.status == "ok", rec.stderr_tail
    assert "gpulab_test.compiles.default" in [r.name for r in rec.snapshot.records]


def test_a_program_stuck_in_its_own_op_is_still_a_hang(tmp_path):
    """The import rule is no blanket: an op whose main thread spins in Python (bytecode and CPU: a beat every
    window) outside any import stalls."""
    rec = _record_op(tmp_path, "spins", "while True:", "    pass")
    assert rec.status == "hang" and rec.snapshot.records[-1].name == "gpulab_test.spins.default"
