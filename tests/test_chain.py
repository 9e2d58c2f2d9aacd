"""The whole chain, as CI runs it: `gpulab run --params params/smoke.yaml` through papermill, real notebooks."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, request):
    root = request.config.rootpath
    out = tmp_path_factory.mktemp("outputs")
    res = subprocess.run([sys.executable, "-m", "gpulab", "run", "--params", "params/smoke.yaml", "--out", str(out),
                          "--notebook-timeout", "400"], cwd=root, capture_output=True, text=True, timeout=900)
    index = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    return res, out, index


@pytest.mark.slow
def test_smoke_chain_succeeds_and_indexes_every_notebook(smoke_run, root):
    res, out, index = smoke_run
    assert res.returncode == 0, res.stderr[-4000:]
    assert index.endswith("index.html")
    run = json.loads(open(index.replace("index.html", "run.json")).read())
    names = sorted(p.stem for p in (root / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    nbs = run["scenarios"][0]["notebooks"]
    assert [n["name"] for n in nbs] == names
    html = open(index).read()
    for nb in nbs:
        assert nb["status"] == "ok", nb
        assert nb["headline"], nb
        assert (out / "latest" / nb["report"]).exists() and f'href="{nb["report"]}"' in html


@pytest.mark.slow
def test_smoke_chain_metrics(smoke_run):
    res, out, index = smoke_run
    metrics = json.loads((out / "latest" / "baseline" / "metrics.json").read_text())
    assert set(metrics) >= {"01_environment", "02_instrument", "03_bisect_hang", "05_oracle", "06_benchmark"}
    for name, entry in metrics.items():
        assert entry["headline"] and isinstance(entry["metrics"], dict), name


@pytest.mark.slow
def test_smoke_chain_findings(smoke_run):
    """What each notebook found on a CPU-only machine, read back from metrics.json."""
    res, out, index = smoke_run
    m = {k: v["metrics"] for k, v in json.loads((out / "latest" / "baseline" / "metrics.json").read_text()).items()}
    assert m["01_environment"]["device_kind"] == "cpu" and m["01_environment"]["sdpa_selected"]
    assert m["02_instrument"]["ops_recorded"] > 50 and m["02_instrument"]["exit_code"] == 0
    # the recording cost was measured, in 06 where nothing runs beside it (its size is a benchmark's business, not
    # a test's: noise can flip its sign); 02, which runs beside others, says where
    assert math.isfinite(m["06_benchmark"]["recorder_us_per_op"]["ops"]) and m["02_instrument"]["overhead_us_per_op"] is None
    assert "timed in 06" in (out / "latest" / "baseline" / "metrics.json").read_text()
    # 03 watches the workload itself: healthy on this machine, no drill; the configured rung ran first (02's run
    # its first trial) and passed every trial, so the rung below it, a part of it, was not run
    assert m["03_bisect_hang"]["status"] == "ok" and not m["03_bisect_hang"]["drill"]
    assert set(m["03_bisect_hang"]["rungs"]) == {"forward"} and m["03_bisect_hang"]["covered"] == ["sdpa"]
    assert m["03_bisect_hang"]["runs"] >= 2
    assert m["05_oracle"]["candidates_checked"] >= 3 and m["05_oracle"]["passed"] == m["05_oracle"]["candidates_checked"]
    assert m["06_benchmark"]["status"] == "ok" and m["06_benchmark"]["champion"]
    gate = json.loads((out / "latest" / "baseline" / "oracle_gate.json").read_text())
    assert set(m["06_benchmark"]["candidates"]) <= set(gate)  # 06 timed only what 05 judged
