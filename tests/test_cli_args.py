"""The command line's pieces in-process: `gpulab.args` (the input checks every command shares), `--only`
as a comma list, and the watch command adding the fixes to try (gpulab.hang knows no fixes)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpulab import args as A
from gpulab.hang.watchdog import watch
from gpulab.hang.verdict import Verdict


def test_comma_list_joins_repeats_and_commas_and_refuses_an_empty_name():
    assert A.comma_list(["01,02", "05_oracle", " 06 "], "--only") == ("01", "02", "05_oracle", "06")
    assert A.comma_list(["01", "01"], "--only") == ("01",)
    assert A.comma_list([], "--only") == ()
    with pytest.raises(A.BadInput, match="empty name"):
        A.comma_list([","], "--only")


def test_run_passes_the_comma_list_on(monkeypatch, tmp_path):
    from gpulab.chain import commands, runner

    seen = {}
    monkeypatch.setattr(runner, "find_root", lambda: Path(__file__).resolve().parents[1])
    monkeypatch.setattr(runner, "run", lambda cfg: (seen.setdefault("cfg", cfg), (0, tmp_path / "index.html"))[1])
    assert commands.run_main(["--only", "01,02", "--only", "04", "--out", str(tmp_path)]) == 0
    assert seen["cfg"].only == ("01", "02", "04")


def test_a_default_said_in_words_is_not_said_twice():
    p = A.parser("x", "d", "x")
    p.add_argument("--out", default=None, help="folder (default: a new temp folder)")
    p.add_argument("--n", type=int, default=3, help="count")
    text = " ".join(p.format_help().split())
    assert "(default: a new temp folder)" in text and "(default: None)" not in text
    assert "count (default: 3)" in text


def _verdict(tmp_path: Path, status: str = "hang") -> Verdict:
    return Verdict(status=status, phase="step", cls="gemm", in_flight_op={"name": "aten::mm", "device": "cpu"},
                   host_blocked_in=None, last_completed_op=None, ops_completed=3, signal=None, exit_code=None,
                   elapsed_s=1.0, stacks={}, evidence=("fact one",), planted=None, capture_s={},
                   command=("python", "x.py"), log={"dir": str(tmp_path), "verdict": "verdict.json"})


def test_saved_adds_the_try_sentence_and_rewrites_the_verdict_file(monkeypatch, tmp_path):
    from gpulab.fixes import suggest

    found = ({"fix": "contiguous_gemm_inputs", "because": "a stuck gemm", "facts": ["class=gemm"],
              "apply": "GPULAB_X=1"},)
    monkeypatch.setattr(suggest, "for_verdict", lambda v, device=None: found)
    v = _verdict(tmp_path)
    (tmp_path / "verdict.json").write_text(json.dumps(v.to_dict()))
    out = suggest.saved(v)
    assert out.suggested == found and out.evidence[:-1] == ("fact one",)
    assert out.evidence[-1] == suggest.sentence(found) and "contiguous_gemm_inputs" in out.evidence[-1]
    on_disk = json.loads((tmp_path / "verdict.json").read_text())
    assert on_disk["suggested"][0]["fix"] == "contiguous_gemm_inputs" and on_disk["evidence"][-1] == out.evidence[-1]
    assert suggest.saved(None) is None


def test_a_failing_suggestion_keeps_the_verdict(monkeypatch, tmp_path):
    from gpulab.fixes import suggest

    def boom(v, device=None):
        raise RuntimeError("no registry")
    monkeypatch.setattr(suggest, "for_verdict", boom)
    out = suggest.with_suggestions(_verdict(tmp_path))
    assert out.evidence == ("fact one",) and "fix suggestions failed: RuntimeError" in out.notes[-1]


def test_the_watch_command_passes_the_suggestions(monkeypatch):
    from gpulab.fixes import commands, suggest

    got = {}
    monkeypatch.setattr(watch, "main", lambda argv, finish=None: got.update(argv=argv, finish=finish) or 0)
    assert commands.watch_main(["--", "true"]) == 0
    assert got["finish"] is suggest.with_suggestions


def test_fixes_reach_a_watched_child_only_through_its_environment(tmp_path):
    from gpulab.fixes import scenario_env

    with pytest.raises(ValueError, match="scenario_env"):
        watch.launch_plan(["true"], tmp_path, record=False, mode="auto", fault=None, env={}, coredump=False,
                          fixes=["launch_blocking"])
    env = scenario_env(["launch_blocking"], {})
    plan = watch.launch_plan(["true"], tmp_path, record=False, mode="auto", fault=None, env=env, coredump=False,
                             fixes=["launch_blocking"])
    assert plan.env[watch.FIXES_VAR] == "launch_blocking" and plan.env.items() >= env.items()
