"""The chain on failing programs of a user's, as the user runs it: `gpulab run -p workload=script:...` with
the smoke parameters, through papermill. Each notebook ends or says why it was skipped, the index says what
is wrong, and 04 recommends the fix that removes the failure or says honestly that nothing tried does.
One chain per file: a file's tests run on one test worker, and two whole chains in one file ran one after
the other at the end of the suite while the other worker idled."""
from __future__ import annotations

import pytest

from chainrun import ended_chain


@pytest.mark.slow
def test_the_chain_on_a_gemm_that_hangs_on_a_transposed_operand(root, tmp_path):
    # 02 to 06: every notebook that reads the program (01 does not: chainrun)
    sc, m = ended_chain(root, tmp_path, "fix_transposed_gemm.py", only=("02", "03", "04", "05", "06"))
    assert sc["verdict"] == "hang" and "aten.mm" in sc["evidence"]
    assert m["02_instrument"]["status"] == "hang"
    assert m["03_bisect_hang"]["status"] == "hang" and "contiguous_gemm_inputs" in m["03_bisect_hang"]["suggested"]
    assert m["04_fix_scenarios"]["recommendation"] == "contiguous_gemm_inputs"
    assert "contiguous_gemm_inputs fixes it" in sc["next_step"] and "apply with:" in sc["next_step"]
    assert m["04_fix_scenarios"]["scenarios"]["baseline"]["trials"] == 1    # 03's ladder, not run again
    # the recording ended in the hang before any attention call: the failure is not in attention (05), and 06
    # cannot know the program's call
    assert m["05_oracle"]["applies"] is False and "failed before any attention call" in m["05_oracle"]["reason"]
    assert m["06_benchmark"]["applies"] is False and "unknown whether the program calls attention" in m["06_benchmark"]["reason"]
