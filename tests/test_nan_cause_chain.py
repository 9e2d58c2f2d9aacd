"""The chain (02 to 05, the notebooks that can decide its verdict) on a training loop whose loss turns NaN, as
the user runs it (`gpulab run -p workload=script:...`, smoke parameters): the verdict is wrong_numbers and
run.json and the index say the op, its line, the step and the cause, then whose code to fix, and advise no fix
scenario that cannot answer it (no fp32_softmax: the program has no softmax). One chain per file (see
test_chain_failing.py)."""
from __future__ import annotations

import html

import pytest

from chainrun import ended_chain
from test_nan_cause_recorded import line_of


@pytest.mark.slow
def test_the_chain_names_the_zero_divisor_at_the_programs_line(root, tmp_path):
    # 02 to 05: 03 (no hang or crash) and 05 (no vendor kernel failing the oracle) could take the verdict from
    # 02's NaN; 01 and 06 cannot (chainrun)
    sc, m = ended_chain(root, tmp_path, "nan/div_std.py", only=("02", "03", "04", "05"))
    site = line_of("div_std.py", "NORMALIZE")
    assert sc["verdict"] == "wrong_numbers", sc
    assert sc["evidence"].startswith(f"the workload first makes NaN in aten.div.Tensor at {site} (pass 5): the "
                                     f"divisor holds zeros (input 1: 1 zero)"), sc["evidence"]
    assert sc["next_step"].startswith(f"fix the program's line {site}: keep the divisor away from 0"), sc["next_step"]
    assert "softmax" not in sc["next_step"]
    assert m["02_instrument"]["first_nonfinite_pass"] == 5 and m["02_instrument"]["first_nonfinite_owner"] == "program"
    index = (tmp_path / "latest" / "index.html").read_text()
    assert html.escape(sc["evidence"], quote=True) in index and html.escape(sc["next_step"], quote=True) in index
