"""The products notebooks share: metrics.json written by notebooks side by side."""
import subprocess
import sys

from gpulab import report

WRITER = """
import sys
from gpulab import report
for i in range(int(sys.argv[3])):
    report.record(sys.argv[1], sys.argv[2], f"pass {i}", i=i)
"""


def test_notebooks_recording_side_by_side_keep_every_entry(tmp_path):
    # four processes rewrite one metrics.json at once, as 01, 03 and 05 do when they end together: a
    # read-and-rewrite without the lock dropped an entry in 3 of 3 runs here
    names = [f"0{k}_notebook" for k in range(1, 5)]
    kids = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), n, "150"]) for n in names]
    assert [k.wait(timeout=120) for k in kids] == [0] * len(kids)
    got = report.load_metrics(tmp_path)
    assert sorted(got) == names
    assert all(got[n]["metrics"]["i"] == 149 and got[n]["headline"] == "pass 149" for n in names)
