"""Published HTML as a reader meets it: self-contained (no request to any other host) and inert (markup
that comes from outside - a workload path, a parameter value, program output, exception text - is shown as
text, never run). Opened in headless Chromium with the network cut off."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from browser import CHROMIUM, open_page
from gpulab.chain import index

ROOT = Path(__file__).resolve().parents[1]
LIB = str(ROOT / "lib")
# Markup that, if it ever ran, would mark the page: an svg whose onload sets data-pwned on <body>.
MARK = "<svg onload=document.body.dataset.pwned=1>"
REMOTE = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?(?:https?:)?//|@import""", re.I)

needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    """Notebook 03 on a user script whose folder name is markup and which prints markup and fails."""
    tmp = tmp_path_factory.mktemp("html")
    folder = tmp / MARK
    folder.mkdir()
    (folder / "train.py").write_text(f"import sys\nprint({MARK!r}, file=sys.stderr)\nsys.exit(3)\n")
    r = subprocess.run([sys.executable, "-m", "gpulab", "run", "--only", "03", "--params", "params/smoke.yaml",
                        "-p", "repeats=1", "-p", f'workload=script:"{folder / "train.py"}"', "--out", str(tmp / "out")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": LIB})
    assert r.stdout.strip(), r.stderr[-3000:]
    return Path(r.stdout.strip().splitlines()[-1]).parent, tmp


def test_markup_from_a_path_and_program_output_stays_text(hostile_run):
    run_dir, _ = hostile_run
    run = json.loads((run_dir / "run.json").read_text())
    nb = run["scenarios"][0]["notebooks"][0]
    assert nb["status"] == "ok", nb  # the notebook worked; the workload failed
    assert run["scenarios"][0]["verdict"] == "error"  # exit 3 is the workload's error, found and named
    for page in [run_dir / nb["report"], run_dir / nb["full"], run_dir / "index.html"]:
        text = page.read_text()
        assert "&lt;svg onload=document.body.dataset.pwned=1&gt;" in text, page.name  # shown, as text
        assert MARK not in text, page.name                                             # never as markup


def test_no_html_under_a_run_folder_references_another_host(hostile_run):
    run_dir, _ = hostile_run
    pages = list(run_dir.rglob("*.html"))
    assert len(pages) >= 3
    for page in pages:
        hits = REMOTE.findall(page.read_text())
        assert hits == [], f"{page.relative_to(run_dir)} references another host: {hits[:3]}"


@needs_chromium
def test_pages_open_offline_with_no_request_and_nothing_runs(hostile_run):
    run_dir, tmp = hostile_run
    run = json.loads((run_dir / "run.json").read_text())
    nb = run["scenarios"][0]["notebooks"][0]
    for page in [run_dir / "index.html", run_dir / nb["report"], run_dir / nb["full"]]:
        dom, requests = open_page(page, tmp / "chromium", screenshot=tmp / f"{page.stem}.png")
        assert "<body" in dom and "data-pwned" not in dom, page.name
        assert requests == [], f"{page.name} asked the network for {requests}"
        assert (tmp / f"{page.stem}.png").stat().st_size > 10_000  # something was drawn


def test_index_escapes_every_outside_string_and_encodes_links():
    run = {"run_id": "r<1>", "status": "failed", "note": MARK, "scenarios": [{
        "name": "base<line>", "description": MARK, "verdict": "error", "evidence": MARK, "next_step": MARK,
        "changed": {"workload": MARK}, "products": [f"base/{MARK}.json"], "metrics": {},
        "notebooks": [{"name": "01_x", "status": "failed", "error": MARK, "headline": MARK,
                       "report": "base/01 x<y>.html"}]}]}
    html = index.render(run)
    assert MARK not in html and "&lt;svg onload" in html
    assert 'href="base/01%20x%3Cy%3E.html"' in html
