"""The chain on a user's program that crashes, as the user runs it (the hang: test_chain_failing.py; one
chain per file, so that the two run on both test workers side by side)."""
from __future__ import annotations

import pytest

from chainrun import ended_chain


@pytest.mark.slow
def test_the_chain_on_a_program_that_crashes(root, tmp_path):
    # 02 to 04: a crash's verdict and next step are 03's and 04's (01, 05, 06 cannot change them: chainrun)
    sc, m = ended_chain(root, tmp_path, "crash_segfault.py", only=("02", "03", "04"))
    assert sc["verdict"] == "crash" and "SIGSEGV" in sc["evidence"]
    assert m["02_instrument"]["status"] == "crash"
    assert m["04_fix_scenarios"]["recommendation"] is None
    # a null pointer read through ctypes in the program's own line: the program's bug, not an upstream report
    assert "crash_segfault.py:11" in sc["next_step"] and "bundle.zip" not in sc["next_step"]
