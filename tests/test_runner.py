"""The chain runner on throwaway notebooks: real papermill, real kernels, real kills."""
from __future__ import annotations

import json
import os
import time
import subprocess
import sys

import pytest

from conftest import ROOT
from gpulab.chain import index, runner
from nbfactory import RECORD, notebook, project
from procscan import left_after, new_marker


def _nbs():
    ok = notebook("Ok", 'steps: int = 2\n', "print('hello', steps)",
                  RECORD.format(name="01_ok", headline="all good"))
    bad = notebook("Bad", "", "raise ValueError('planted failure in cell')")
    after = notebook("After", "", RECORD.format(name="03_after", headline="ran after a failure"))
    return {"01_ok": ok, "02_bad": bad, "03_after": after}


def _cfg(proj, **kw):
    return runner.RunConfig(root=proj, out=proj / "outputs", cell_timeout_s=60, notebook_timeout_s=90, **kw)


def test_failed_notebook_is_rendered_marked_and_later_ones_run(tmp_path):
    proj = project(tmp_path, _nbs(), base="steps: 3\n")
    code, idx = runner.run(_cfg(proj), progress=lambda m: None)
    assert code == 1
    run = json.loads((idx.parent / "run.json").read_text())
    nbs = {n["name"]: n for n in run["scenarios"][0]["notebooks"]}
    assert nbs["01_ok"]["status"] == "ok" and nbs["01_ok"]["headline"] == "all good"
    assert nbs["02_bad"]["status"] == "failed"
    assert "ValueError: planted failure in cell" in nbs["02_bad"]["error"]
    assert nbs["03_after"]["status"] == "ok"
    for nb in nbs.values():  # every notebook rendered twice, linked from the index
        for key in ("report", "full", "ipynb"):
            assert (idx.parent / nb[key]).exists(), (nb["name"], key)
    html = idx.read_text()
    assert "planted failure in cell" in html and "all good" in html and "02_bad.html" in html
    assert "http" not in html  # opens from disk, no network
    executed = json.loads((idx.parent / "baseline" / "01_ok.ipynb").read_text())
    texts = [o.get("text", "") for c in executed["cells"] for o in c.get("outputs", [])]
    outputs = "".join(t if isinstance(t, str) else "".join(t) for t in texts)
    assert "hello 3" in outputs  # base.yaml reached the notebook
    assert (proj / "outputs" / "latest").resolve() == idx.parent.resolve()


def test_stalled_notebook_is_killed_at_its_limit_and_keeps_finished_cells(tmp_path):
    stall = notebook("Stall", "", "print('before the stall')", "import time; time.sleep(600)")
    proj = project(tmp_path, {"01_stall": stall})
    cfg = runner.RunConfig(root=proj, out=proj / "outputs", cell_timeout_s=600, notebook_timeout_s=12)
    code, idx = runner.run(cfg, progress=lambda m: None)
    assert code == 1
    nb = json.loads((idx.parent / "run.json").read_text())["scenarios"][0]["notebooks"][0]
    assert nb["status"] == "killed" and "wall-clock limit" in nb["error"]
    assert 10 <= nb["duration_s"] < 40
    assert (idx.parent / nb["report"]).exists()
    saved = (idx.parent / "baseline" / "01_stall.ipynb").read_text()
    assert "before the stall" in saved  # the cell done before the kill was saved


def test_needs_skips_dependents_of_a_failed_notebook(tmp_path):
    nbs = _nbs()
    nbs["03_after"].metadata["gpulab"] = {"needs": ["02_bad"]}
    proj = project(tmp_path, nbs)
    code, idx = runner.run(_cfg(proj, only=("02", "03")), progress=lambda m: None)
    run = json.loads((idx.parent / "run.json").read_text())
    statuses = [n["status"] for n in run["scenarios"][0]["notebooks"]]
    assert code == 1 and statuses == ["failed", "skipped"]


@pytest.mark.parametrize("side_by_side", ["0", "always"])
def test_what_needs_a_skipped_notebook_is_skipped_too(tmp_path, monkeypatch, side_by_side):
    monkeypatch.setenv(runner.SIDE_BY_SIDE_ENV, side_by_side)
    nbs = _nbs()
    nbs["03_after"].metadata["gpulab"] = {"needs": ["02_bad"]}
    nbs["04_last"] = notebook("Last", "", RECORD.format(name="04_last", headline="last"))
    nbs["04_last"].metadata["gpulab"] = {"needs": ["03_after"]}
    proj = project(tmp_path, nbs)
    code, idx = runner.run(_cfg(proj, only=("02", "03", "04")), progress=lambda m: None)
    run = json.loads((idx.parent / "run.json").read_text())
    statuses = [n["status"] for n in run["scenarios"][0]["notebooks"]]
    assert code == 1 and statuses == ["failed", "skipped", "skipped"]


KERNEL_STARTED = """import os, pathlib
ticks = int(open(f"/proc/{os.getpid()}/stat").read().rsplit(")", 1)[1].split()[19])
btime = next(int(ln.split()[1]) for ln in open("/proc/stat") if ln.startswith("btime"))
pathlib.Path("kernel_started_02").write_text(str(btime + ticks / os.sysconf("SC_CLK_TCK")))"""

# a cell that waits (at most 30 s) until the papermill child started ahead for notebook NAME (its path) has its
# kernel
AWAIT_AHEAD = """import os, time
def _ahead_kernel(name):
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    def read(p, f):
        try:
            return open(f"/proc/{p}/{f}", "rb").read()
        except OSError:
            return b""
    ahead = {p for p in pids if b"gpulab.chain.ahead" in read(p, "cmdline") and name.encode() in read(p, "cmdline")}
    return any(read(p, "stat").rsplit(b")", 1)[-1].split()[1:2] == [a.encode()] for p in pids for a in ahead)
deadline = time.time() + 30
while not _ahead_kernel("NAME") and time.time() < deadline:
    time.sleep(0.1)"""


def test_next_notebooks_kernel_starts_while_this_one_runs(tmp_path):
    """gpulab.chain.ahead: 02's papermill child and kernel start while 01 still runs, not after it (01 waits
    for that kernel at most 30 s, then ends)."""
    first = notebook("First", "", AWAIT_AHEAD.replace("NAME", str(tmp_path / "notebooks" / "02_second.ipynb")),
                     "import time, pathlib; pathlib.Path('ended_01').write_text(str(time.time()))")
    second = notebook("Second", "", KERNEL_STARTED, RECORD.format(name="02_second", headline="ran second"))
    proj = project(tmp_path, {"01_first": first, "02_second": second})
    code, idx = runner.run(_cfg(proj), progress=lambda m: None)
    run = json.loads((idx.parent / "run.json").read_text())
    assert code == 0 and [n["status"] for n in run["scenarios"][0]["notebooks"]] == ["ok", "ok"]
    started, ended = float((proj / "kernel_started_02").read_text()), float((proj / "ended_01").read_text())
    assert started < ended, f"02's kernel started {started - ended:.1f} s after 01 ended"
    assert run["scenarios"][0]["notebooks"][1]["headline"] == "ran second"


def test_next_notebooks_kernel_imports_its_modules_before_its_turn(tmp_path):
    """gpulab.chain.ahead: the waiting kernel imports what the notebook's cells import (here a module of the
    project that marks its import), so 02's first cell finds it loaded though no cell of 02 has run yet."""
    first = notebook("First", "", "import pathlib, time\ndeadline = time.time() + 30\n"
                     "while not pathlib.Path('probe_imported').exists() and time.time() < deadline:\n"
                     "    time.sleep(0.1)")
    second = notebook("Second", "", "import sys\nprint('loaded before any cell:', 'probe_mod' in sys.modules)",
                      "import probe_mod", RECORD.format(name="02_second", headline="ran second"))
    proj = project(tmp_path, {"01_first": first, "02_second": second})
    (proj / "probe_mod.py").write_text("import pathlib\npathlib.Path('probe_imported').write_text('yes')\n")
    code, idx = runner.run(_cfg(proj), progress=lambda m: None)
    assert code == 0
    executed = json.loads((idx.parent / "baseline" / "02_second.ipynb").read_text())
    texts = "".join("".join(o.get("text", "")) for c in executed["cells"] for o in c.get("outputs", []))
    assert "loaded before any cell: True" in texts


@pytest.mark.parametrize("source,expected", [
    ("import numpy as np\nimport os.path", ["numpy", "os.path"]),
    ("from gpulab import bench, report\nfrom . import x", ["torch", "gpulab", "gpulab.bench", "gpulab.report"]),
    ("from __future__ import annotations\nfrom json import *", ["json"]),
    ("def f():\n    import csv\n%matplotlib inline", []),   # not top level; a magic does not parse
])
def test_head_start_imports_what_the_cells_import(tmp_path, source, expected):
    from gpulab.chain.ahead import imports_of
    import nbformat
    nb = notebook("T", "x: int = 1\nimport zlib\n", source)   # the parameters cell is not read
    path = tmp_path / "t.ipynb"
    nbformat.write(nb, str(path))
    assert imports_of(str(path)) == expected


@pytest.mark.parametrize("device,meta,answer,nodes,torch_first", [
    ("cpu", {}, None, True, False), ("auto", {}, None, True, True), ("auto", {}, None, False, False),
    ("auto", {}, "cpu", True, False), ("cuda:1", {}, "cuda", True, False), ("cuda", {}, "cpu", True, True),
    ("cpu", {"kernel_torch": True}, None, True, True), (None, {}, "cpu", True, True)])
def test_torch_is_imported_ahead_only_where_the_kernel_will_import_it(tmp_path, monkeypatch, device, meta, answer,
                                                                     nodes, torch_first):
    """A kernel imports torch for its device unless it is cpu or the runner's answer settles it, or it is auto on a
    host without GPU device files (`nodes`), and where the notebook's metadata says its cells call into torch; its
    head start imports torch only then (3.5 CPU-s)."""
    from gpulab import device as dev
    from gpulab.chain.ahead import imports_of
    import nbformat
    monkeypatch.setattr(dev, "gpu_nodes", lambda: ["/dev/nvidia0"] if nodes else [])
    nb = notebook("T", "x: int = 1\n", "from gpulab import report")
    nb.metadata["gpulab"] = meta
    path = tmp_path / "t.ipynb"
    nbformat.write(nb, str(path))
    if answer:
        monkeypatch.setenv(dev.AUTO_ENV, answer)
    else:
        monkeypatch.delenv(dev.AUTO_ENV, raising=False)
    assert (imports_of(str(path), device)[0] == "torch") == torch_first


def test_a_head_start_for_a_notebook_that_is_then_skipped_leaves_nothing(tmp_path, monkeypatch):
    name, mark = new_marker()
    monkeypatch.setenv(name, mark)
    nbs = _nbs()
    nbs["02_bad"] = notebook("Bad", "", AWAIT_AHEAD.replace("NAME", str(tmp_path / "notebooks" / "03_after.ipynb")),
                             "raise ValueError('planted failure in cell')")
    nbs["03_after"].metadata["gpulab"] = {"needs": ["02_bad"]}
    proj = project(tmp_path, nbs)
    code, idx = runner.run(_cfg(proj, only=("02", "03")), progress=lambda m: None)
    run = json.loads((idx.parent / "run.json").read_text())
    assert code == 1 and [n["status"] for n in run["scenarios"][0]["notebooks"]] == ["failed", "skipped"]
    assert left_after(name, mark) == []   # 03's papermill child and its idle kernel were ended


SPAN = """import time, pathlib
t0 = time.time(); time.sleep({s}); pathlib.Path("span_{name}").write_text(f"{{t0}} {{time.time()}}")"""


def test_notebooks_that_time_nothing_run_side_by_side_and_a_timed_one_alone(tmp_path, monkeypatch):
    """With cores to spare (the rule's cores lowered to this machine's): 01 and 02 read nothing of each other's
    and run at once; 03 reads 01's products and times something, so it starts once both have ended. The index
    lists them in the chain's order whatever order they finished in."""
    monkeypatch.setattr(runner, "SIDE_BY_SIDE_CORES", 1)
    nbs = {f"0{i}_{n}": notebook(n, "", SPAN.format(s=s, name=f"0{i}"), RECORD.format(name=f"0{i}_{n}", headline=n))
           for i, n, s in ((1, "a", 4), (2, "b", 6), (3, "c", 0))}
    nbs["03_c"].metadata["gpulab"] = {"timed": True, "after": {"01_a": "always"}}
    proj = project(tmp_path, nbs)
    said, shown = [], []
    begin = runner.RunState.begin

    def begin_and_read(self, scen, name, ipynb):   # what the index says once a notebook has begun
        begin(self, scen, name, ipynb)
        shown.append([(n["name"], n["status"]) for n in self.summary()["scenarios"][0]["notebooks"]])
    monkeypatch.setattr(runner.RunState, "begin", begin_and_read)
    code, idx = runner.run(_cfg(proj), progress=said.append)
    run = json.loads((idx.parent / "run.json").read_text())
    nb = run["scenarios"][0]["notebooks"]
    assert [("01_a", "running"), ("02_b", "running")] in shown, shown   # both shown running, in the chain's order
    assert code == 0 and [(n["name"], n["status"]) for n in nb] == [("01_a", "ok"), ("02_b", "ok"), ("03_c", "ok")]
    (a0, a1), (b0, b1), (c0, _) = (map(float, (proj / f"span_0{i}").read_text().split()) for i in (1, 2, 3))
    assert max(a0, b0) < min(a1, b1), "01 and 02 did not overlap"
    assert c0 > max(a1, b1), "03 (timed) started while another notebook ran"
    assert any("side by side" in m for m in said), said


def never_times(sc_dir, values):   # a notebook metadata's `timed` names it ("test_runner:never_times")
    return not (sc_dir.is_dir() and values.get("steps") == 3)


@pytest.mark.parametrize("timed, expect", [(True, True), (False, False), (None, False),
                                           ("test_runner:never_times", False),
                                           ("test_runner:no_such_function", True), ("no_such_module:f", True)])
def test_a_notebooks_timed_metadata_is_asked_and_a_wrong_name_leaves_it_alone(tmp_path, timed, expect):
    assert runner.times_now({"timed": timed}, tmp_path, {"steps": 3}) is expect


def test_a_notebook_that_finds_it_times_nothing_runs_beside_the_others(tmp_path, monkeypatch):
    """`timed` as a function of what the notebooks before it left: asked once its inputs are in; false, and the
    notebook runs beside the ones that time nothing."""
    monkeypatch.setattr(runner, "SIDE_BY_SIDE_CORES", 1)
    nbs = {f"0{i}_{n}": notebook(n, "steps: int = 2\n", SPAN.format(s=3, name=f"0{i}"),
                                 RECORD.format(name=f"0{i}_{n}", headline=n)) for i, n in ((1, "a"), (2, "b"))}
    nbs["02_b"].metadata["gpulab"] = {"timed": "test_runner:never_times"}
    proj = project(tmp_path, nbs, base="steps: 3\n")
    said = []
    code, _ = runner.run(_cfg(proj), progress=said.append)
    (a0, a1), (b0, b1) = (map(float, (proj / f"span_0{i}").read_text().split()) for i in (1, 2))
    assert code == 0 and max(a0, b0) < min(a1, b1), "02 (times nothing here) did not run beside 01"
    assert any("02_b times nothing here" in m for m in said), said


def test_a_running_notebook_is_listed_in_the_chains_order_before_a_later_one_that_finished(tmp_path, monkeypatch):
    """01 reads 02's products, so 02 runs first: while 01 runs the index lists 01 (running) above 02 (ok)."""
    monkeypatch.setattr(runner, "SIDE_BY_SIDE_CORES", 1)
    nbs = {f"0{i}_{n}": notebook(n, "", RECORD.format(name=f"0{i}_{n}", headline=n)) for i, n in ((1, "a"), (2, "b"))}
    nbs["01_a"].metadata["gpulab"] = {"after": {"02_b": "always"}}
    proj = project(tmp_path, nbs)
    shown = []
    begin = runner.RunState.begin

    def begin_and_read(self, scen, name, ipynb):
        begin(self, scen, name, ipynb)
        sc = self.summary()["scenarios"][0]
        shown.append(([(n["name"], n["status"]) for n in sc["notebooks"]], sc["evidence"]))
    monkeypatch.setattr(runner.RunState, "begin", begin_and_read)
    code, _ = runner.run(_cfg(proj), progress=lambda m: None)
    assert code == 0
    assert shown[-1][0] == [("01_a", "running"), ("02_b", "ok")], shown
    assert shown[-1][1].endswith("(1 of 2 notebooks still to finish)"), shown


FLAKY_KERNEL = """import pathlib, sys
mark = pathlib.Path(sys.argv[1])
if not mark.exists():   # its first start dies, as a kernel that lost the race for its ports does
    mark.write_text("died once")
    sys.exit(1)
from ipykernel import kernelapp
sys.argv = [sys.argv[0], *sys.argv[2:]]
kernelapp.launch_new_instance()
"""


def test_a_kernel_that_dies_as_it_starts_is_started_once_more_and_the_notebook_runs(tmp_path, monkeypatch):
    """Nothing of the notebook ran, so nothing can happen twice: the runner starts it again, once."""
    spec = tmp_path / "jupyter" / "kernels" / "flaky"
    spec.mkdir(parents=True)
    (tmp_path / "flaky_kernel.py").write_text(FLAKY_KERNEL)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, str(tmp_path / "flaky_kernel.py"), str(tmp_path / "died"), "-f", "{connection_file}"],
        "display_name": "flaky", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", f"{tmp_path / 'jupyter'}{os.pathsep}{os.environ.get('JUPYTER_PATH', '')}")
    proj = project(tmp_path / "p", {"01_ok": notebook("Ok", "", RECORD.format(name="01_ok", headline="all good"))})
    said = []
    code, idx = runner.run(_cfg(proj, kernel="flaky"), progress=said.append)
    nb = json.loads((idx.parent / "run.json").read_text())["scenarios"][0]["notebooks"][0]
    assert (tmp_path / "died").exists() and code == 0 and nb["status"] == "ok", (nb, said)
    assert any("died as it started" in m for m in said), said


def test_a_kernel_that_dies_in_a_cell_is_not_run_again(tmp_path):
    """A cell ran (it may have written, trained, started things): the failure stands, nothing is repeated."""
    cell = "import os, pathlib\npathlib.Path('ran').open('a').write('x')\nos._exit(3)"
    proj = project(tmp_path, {"01_dies": notebook("Dies", "", cell)})
    said = []
    code, idx = runner.run(_cfg(proj), progress=said.append)
    nb = json.loads((idx.parent / "run.json").read_text())["scenarios"][0]["notebooks"][0]
    assert code != 0 and nb["status"] == "failed" and (proj / "ran").read_text() == "x"
    assert not any("died as it started" in m for m in said), said


def test_second_run_never_overwrites_the_first(tmp_path):
    proj = project(tmp_path, {"01_ok": _nbs()["01_ok"]})
    _, first = runner.run(_cfg(proj), progress=lambda m: None)
    _, second = runner.run(_cfg(proj), progress=lambda m: None)
    assert first.parent != second.parent and first.exists() and second.exists()
    assert (proj / "outputs" / "latest").resolve() == second.parent.resolve()


def test_cli_rejects_unknown_param_before_running_anything(tmp_path):
    proj = project(tmp_path, {"01_ok": _nbs()["01_ok"]})
    res = subprocess.run([sys.executable, "-m", "gpulab", "run", "-p", "no_such_param=1"], cwd=proj,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "no_such_param" in res.stderr and "Valid parameters" in res.stderr
    assert not (proj / "outputs").exists()


def test_cli_runs_all_scenarios_and_prints_index_last(tmp_path):
    proj = project(tmp_path, {"01_ok": _nbs()["01_ok"]},
                   scenarios={"baseline": "description: plain\n", "fix_a": "steps: 5\n"})
    res = subprocess.run([sys.executable, "-m", "gpulab", "run", "--scenario", "all"], cwd=proj,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    idx = res.stdout.strip().splitlines()[-1]
    assert idx.endswith("index.html")
    assert "[fix_a] 01_ok: ok" in res.stderr
    run = json.loads(open(idx.replace("index.html", "run.json")).read())
    assert [s["name"] for s in run["scenarios"]] == ["baseline", "fix_a"]


@pytest.mark.parametrize("jobs,warned", [(1, False), (2, True), (None, False)])
def test_index_warns_that_side_by_side_scenarios_timed_each_others_load(jobs, warned):
    html = index.render({"run_id": "r1", "status": "ok", "shared_jobs": jobs, "scenarios": [
        {"name": "baseline", "description": "d", "notebooks": [{"name": "06_benchmark", "status": "ok"}]}]})
    assert ("ran side by side on one machine" in html) is warned


def test_index_render_is_pure_and_escapes():
    html = index.render({"run_id": "r1", "status": "failed", "scenarios": [{"name": "baseline", "description": "d", "notebooks": [
        {"name": "01_x", "status": "failed", "duration_s": 1.5, "error": "<boom>", "report": "baseline/01_x.html"},
        {"name": "02_y", "status": "ok", "headline": "fine", "duration_s": 2.0}]}]})
    assert "&lt;boom&gt;" in html and "<boom>" not in html
    assert "FAILED: 1 failed, 1 ok" in html and 'href="baseline/01_x.html"' in html


def test_a_bad_side_by_side_setting_is_refused_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.setenv(runner.SIDE_BY_SIDE_ENV, "yes")
    proj = project(tmp_path, _nbs())
    with pytest.raises(runner.params.ParamError, match="'yes' is not valid; it must be one of auto, 0, always"):
        runner.run(_cfg(proj), progress=lambda m: None)
    assert not (proj / "outputs").exists() or not any((proj / "outputs").glob("2*"))


def test_a_running_index_counts_only_the_notebooks_that_ended_as_finished():
    nbs = [{"name": "01_x", "status": "running"}, {"name": "02_y", "status": "ok"}, {"name": "03_z", "status": "running"}]
    line = index.run_summary({"status": "running", "progress": "baseline: running 01_x; running 03_z (side by side)",
                              "scenarios": [{"name": "baseline", "notebooks": nbs}]})
    assert line.endswith("finished so far: 1 ok"), line


def test_only_still_validates_against_every_notebook(tmp_path):
    nbs = _nbs()
    proj = project(tmp_path, nbs, base="steps: 3\n")  # steps is declared by 01 only
    code, idx = runner.run(_cfg(proj, only=("03",)), progress=lambda m: None)
    run = json.loads((idx.parent / "run.json").read_text())
    assert code == 0 and [n["name"] for n in run["scenarios"][0]["notebooks"]] == ["03_after"]


def test_a_scenario_whose_fix_cannot_apply_is_not_run_and_not_a_failure(tmp_path):
    scenarios = {"baseline": "description: plain\n", "cudnn": "description: c\nfixes: [sdpa_backend_cudnn]\n"}
    proj = project(tmp_path, {"01_ok": _nbs()["01_ok"]}, scenarios=scenarios)
    code, idx = runner.run(_cfg(proj, scenarios=("cudnn",), overrides=("device=cpu",)), progress=lambda m: None)
    run = json.loads((idx.parent / "run.json").read_text())
    sc = run["scenarios"][0]
    assert code == 0 and run["status"] == "ok"
    assert sc["fixes"] == ["sdpa_backend_cudnn"] and sc["verdict"] == "not_applicable"
    assert [(n["status"], n["ipynb"]) for n in sc["notebooks"]] == [("not_applicable", None)]
    assert "sdpa_backend_cudnn needs" in sc["notebooks"][0]["error"] and "sdpa_backend_cudnn needs" in sc["evidence"]
    html = idx.read_text()
    assert "fixes <code>sdpa_backend_cudnn</code>" in html and "1 not run (their scenario&#x27;s fix cannot apply here)" in html


def test_device_auto_is_asked_once_per_environment_and_handed_to_later_kernels():
    from gpulab import device
    from gpulab.chain.autodevice import AutoDevice

    auto, env = AutoDevice(), {**os.environ, "GPULAB_DEVICE_AUTO": "stale"}
    assert device.AUTO_ENV not in auto.env_for(env)          # the first notebook: asked now, not waited for
    deadline = time.monotonic() + 120
    while device.AUTO_ENV not in (later := auto.env_for(env)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert later[device.AUTO_ENV] == device.resolve("auto")  # what this process finds with torch
    hidden = {**env, "CUDA_VISIBLE_DEVICES": ""}              # another environment: its own question
    assert device.AUTO_ENV not in auto.env_for(hidden)
    auto.close()   # as the run does at its end: that question's child is not left running


@pytest.mark.parametrize("known, asked, expect", [("cuda", "auto", "cuda"), ("cuda", "cuda:1", "cuda:1"),
                                                  ("cpu", "auto", "cpu"), (None, "cpu", "cpu")])
def test_a_kernel_takes_the_runners_answer_without_importing_torch(known, asked, expect):
    code = f"import sys; from gpulab import device; print(device.resolve({asked!r}), 'torch' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k != "GPULAB_DEVICE_AUTO"}
    env.update({"PYTHONPATH": str(ROOT / "lib")}, **({"GPULAB_DEVICE_AUTO": known} if known else {}))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.split() == [expect, "False"], out.stderr[-1000:]


def test_auto_without_gpu_device_files_is_cpu_without_torch(tmp_path, monkeypatch):
    """No CUDA or ROCm runtime can open a GPU without its device files: auto is then cpu, no torch asked."""
    from gpulab import device
    monkeypatch.delenv(device.AUTO_ENV, raising=False)
    monkeypatch.setattr(device, "GPU_NODES", (str(tmp_path / "nvidia*"), str(tmp_path / "kfd")))
    assert device.gpu_nodes() == [] and device.known_without_torch("auto") == "cpu"
    assert device.known_without_torch("cuda") is None   # asked for by name: torch says whether it works
    (tmp_path / "kfd").touch()
    assert device.gpu_nodes() == [str(tmp_path / "kfd")] and device.known_without_torch("auto") is None


def test_the_device_question_ignores_gpulab_bookkeeping_and_ends_with_the_run(monkeypatch):
    """The answer for an environment is found again once gpulab.proc's guard token joined it; a question still
    running when the run ends is ended (this test's orphan check fails on a child left running)."""
    from gpulab import proc
    from gpulab.chain import autodevice

    # a question that takes a while, as torch's import does on a GPU host (here gpu_nodes answers at once)
    monkeypatch.setattr(autodevice, "ASK", "import time; time.sleep(60)")
    auto = autodevice.AutoDevice()
    env = {k: v for k, v in os.environ.items() if k != proc.ENV_VAR}
    auto.env_for(env)
    time.sleep(0.5)   # the question child is running
    auto.close()
    deadline = time.monotonic() + 20
    while not auto.ready({**env, proc.ENV_VAR: "c0123"}) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert auto.ready({**env, proc.ENV_VAR: "c0123"})
    assert auto.env_for(env) == env   # ended before it answered: no answer, the kernels ask torch themselves


def test_cells_done_and_cell_seconds_read_papermills_per_cell_metadata(tmp_path):
    from gpulab.chain import notebook

    def cell(src, status, secs):
        return {"cell_type": "code", "source": src, "metadata": {"papermill": {"status": status, "duration": secs}}}

    nb = tmp_path / "n.ipynb"
    nb.write_text(json.dumps({"cells": [cell("x = 1\ny = 2", "completed", 1.5), {"cell_type": "markdown", "source": "#"},
                                        cell("run()", "completed", 2.25), cell("later()", "pending", None)]}))
    assert notebook.cells_done(nb) == (2, 3, 3.75)
    assert notebook.cell_seconds(nb) == [(1.5, "x = 1"), (2.25, "run()")]
    assert notebook.cells_done(tmp_path / "none.ipynb") == (0, 0, 0.0) and notebook.cell_seconds(tmp_path / "x") == []
