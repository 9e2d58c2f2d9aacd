"""Notebook 03's view as the published HTML shows it: text from outside (thread names, file names, op
names) must read as itself, with no Markdown backslash escape left visible. Each display is rendered the
way nbconvert renders it (Markdown through its mistune filter; HTML passed through)."""
from __future__ import annotations

import re
from pathlib import Path

import IPython.display
import pytest

from gpulab.hang.investigation import view
from gpulab.hang.verdict import Verdict

mistune = pytest.importorskip("nbconvert.filters.markdown_mistune")
ESCAPE = re.compile(r"\\[\\`*_{}\[\]#|~!]")


def _rendered(obj) -> str:
    if isinstance(obj, IPython.display.Markdown):
        return mistune.markdown2html_mistune(obj.data)
    if isinstance(obj, IPython.display.HTML):
        return obj.data
    return ""   # tables and figures: no Markdown in them


def _verdict(folder: Path) -> Verdict:
    return Verdict(status="hang", phase="step", cls="gemm", in_flight_op={"name": "aten::mm"}, host_blocked_in=None,
                   last_completed_op=None, ops_completed=3, signal=None, exit_code=None, elapsed_s=1.0,
                   stacks={"python": "x"}, evidence=("stuck in aten::mm [main] at train_step_1",), planted=None,
                   capture_s={}, command=("python", "x.py"),
                   log={"dir": str(folder), "stacks_python": "stacks_python.txt", "verdict": "verdict.json"},
                   collapsed={"python": ["[main]: train.py:run_step;torch/_ops.py:__call__"],
                              "native": ["thread_2 [worker]: start_thread;pthread_cond_wait"]})


def test_show_verdict_prints_no_markdown_escape(monkeypatch, tmp_path):
    shown: list = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: shown.extend(objs))
    folder = tmp_path / "ladder" / "forward-000"
    folder.mkdir(parents=True)
    view.show_verdict(_verdict(folder), tmp_path)
    html = "\n".join(_rendered(o) for o in shown)
    assert "[main]" in html and "stacks_python.txt" in html and "train_step_1" in html
    assert not ESCAPE.findall(html), ESCAPE.findall(html)


def test_prose_helpers_render_without_escapes(tmp_path):
    (tmp_path / "bundle").mkdir()
    texts = [view.finding_md("hang (gemm) in aten::mm [main] of my_model"),
             view.bundle_md(tmp_path / "bundle" / "bundle_1.zip", tmp_path)]
    html = "\n".join(mistune.markdown2html_mistune(t) for t in texts)
    assert "[main]" in html and "my_model" in html and "bundle/bundle_1.zip" in html
    assert not ESCAPE.findall(html), ESCAPE.findall(html)
