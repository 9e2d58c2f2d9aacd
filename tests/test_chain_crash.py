"""The chain on a user's program that crashes, as the user runs it (the hang: test_chain_failing.py; one
chain per file, so that the two run on both test workers side by side)."""
from __future__ import annotations

import pytest

from chainrun import ended_chain


@pytest.mark.slow
def test_the_chain_on_a_program_that_crashes(root, tmp_path):
    sc, m = ended_chain(root, tmp_path, "crash_segfault.py")
    assert sc["verdict"] == "crash" and "SIGSEGV" in sc["evidence"]
    assert m["02_instrument"]["status"] == "crash"
    assert m["04_fix_scenarios"]["recommendation"] is None
    # a null pointer read through ctypes in the program's own line: the program's bug, not an upstream report
    assert "crash_segfault.py:11" in sc["next_step"] and "bundle.zip" not in sc["next_step"]
