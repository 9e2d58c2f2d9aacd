"""Progress outside any op, judged from real child processes: the heartbeat (gpulab.beat) tells Python that
computes from a host spinning in native code (CPU, no bytecode) and from a polling loop (bytecode, no CPU).

The spin is a real C busy loop (compiled here, called through ctypes with the GIL released), the poll a
real sleep loop; each hang is judged by the watchdog exactly as `gpulab watch` judges a user's program.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from gpulab import beat, proc, trace
from gpulab.hang.watchdog import watch
from gpulab.trace import analysis, liveness

FIX = Path(__file__).parent / "fixtures"
STALL = 3.0
# The one-process native spins: a spin is a hang only after SPIN_WINDOWS stall windows of a core burnt (12 s at
# STALL), so they take the 2 s window the one-process compute runs take; the jobs keep STALL (two ranks loading
# torch at once went a second without progress on CI)
SPIN_STALL = 2.0
SPIN_C = r"""
#include <time.h>
/* Busy-wait for `seconds` (forever when negative): CPU burnt in C, never returning to Python. */
void spin(double seconds) {
    struct timespec t0, t;
    volatile unsigned long x = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        for (int i = 0; i < 1000000; i++) x++;
        if (seconds < 0) continue;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 >= seconds) return;
    }
}
"""


@pytest.fixture(scope="module")
def spin_lib(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler for the native busy loop")
    d = tmp_path_factory.mktemp("spin")
    (d / "spin.c").write_text(SPIN_C)
    r = proc.run([cc, "-shared", "-fPIC", "-O1", "-o", str(d / "libspin.so"), str(d / "spin.c")], timeout_s=60,
                 capture=True)
    assert r.returncode == 0, r.stderr
    return d / "libspin.so"


def _watch(tmp_path, args, **kw):
    kw.setdefault("stall_s", STALL)
    kw.setdefault("timeout_s", 40)
    kw.setdefault("stacks", False)
    return watch.run(["python", str(FIX / "outside_ops.py"), *args], out_dir=tmp_path / "w", progress=lambda m: None,
                     **kw)


# ------------------------------------------------------------------------------------------ the beat itself

BEAT_PROBE = r"""
import ctypes, json, sys, time
from gpulab import beat
path, lib = sys.argv[1], sys.argv[2]
beat.start(path)
n = lambda: beat.beats(beat.read(path))
out = {"start": n()}
end = time.monotonic() + 1.5
x = 0
while time.monotonic() < end:          # Python work in the main thread
    x = (x * 31 + 7) % 1000003
out["compute"] = n()
time.sleep(0.3)                        # let the window that saw the computing close
a = n(); time.sleep(1.5); out["sleep"] = n() - a          # asleep in a C call
a = n()
spin = ctypes.CDLL(lib).spin
spin.argtypes = [ctypes.c_double]
spin(1.5)                              # CPU in C, the GIL released, no bytecode
out["spin"] = n() - a
time.sleep(0.3)
a = n()
for _ in range(15):                    # a polling loop: bytecode, ~no CPU
    time.sleep(0.1)
out["poll"] = n() - a
out["threads"] = [t.name for t in __import__("threading").enumerate()]
print(json.dumps(out))
"""


def test_beat_counts_python_work_only(tmp_path, spin_lib):
    """The counter advances while the main thread computes in Python, and stays still while it sleeps in a
    C call, spins in native code, or polls."""
    script = tmp_path / "probe.py"
    script.write_text(BEAT_PROBE)
    r = proc.run([sys.executable, str(script), str(tmp_path / "beat"), str(spin_lib)], timeout_s=60, capture=True,
                 env=proc.python_env())
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["start"] == 0 and got["compute"] >= 8, got          # ~15 windows of 0.1 s
    assert got["sleep"] <= 1 and got["spin"] <= 1 and got["poll"] <= 1, got
    assert beat.THREAD_NAME in got["threads"]


def test_beat_record_and_environment(tmp_path, monkeypatch):
    assert beat.read(tmp_path / "absent") is None and beat.beats(None) is None
    monkeypatch.delenv(beat.ENV, raising=False)
    assert beat.start_from_env() is None       # no variable: nothing starts
    (tmp_path / "short").write_bytes(b"12")
    assert beat.read(tmp_path / "short") is None  # a record being created is no record yet


@pytest.mark.parametrize("path, func, loading", [
    ("/site-packages/torch/_dynamo/convert_frame.py", "_compile", True),          # dynamo tracing a frame
    ("C:\\py\\Lib\\torch\\_inductor\\compile_fx.py", "compile_fx_inner", True),    # Inductor compiling a graph
    ("/site-packages/torch/_inductor/compile_fx.py", "run", False),   # cudagraphify's run: compiled code running
    ("/site-packages/torch/_dynamo/eval_frame.py", "_fn", False),     # every compiled call passes here
    ("/home/me/convert_frame.py", "_compile", False),                 # the program's own file of that name
])
def test_a_thread_is_loading_code_in_torch_compiles_entry_points_only(path, func, loading):
    """Beats inside a compilation count as progress inside an op, so where compiled code merely runs must not."""
    import threading
    seen = []
    code = compile(f"def {func}(check):\n    return check()\n", path, "exec")
    ns: dict = {}
    exec(code, ns)
    ns[func](lambda: seen.append(beat._loading(threading.get_ident())))
    assert seen == [loading] and beat._loading(threading.get_ident()) is False


def test_start_from_env_takes_the_variable_out(tmp_path):
    """The program's own Python children must not write the watched process's beat file."""
    code = ("import os, sys; from gpulab import beat; t = beat.start_from_env(); "
            "print(t.name, os.environ.get(beat.ENV), beat.beats(beat.read(sys.argv[1])))")
    env = {**proc.python_env(), beat.ENV: str(tmp_path / "b")}
    r = proc.run([sys.executable, "-c", code, str(tmp_path / "b")], timeout_s=60, capture=True, env=env)
    assert r.stdout.split() == [beat.THREAD_NAME, "None", "0"], r.stderr


# ------------------------------------------------------------------------------------------ the watchdog

def test_launch_plan_asks_python_commands_for_a_beat(tmp_path):
    """Recorded or not, a Python command gets $GPULAB_BEAT (gpulab.trace and gpulab.fixes.child start it);
    another command does not."""
    kw = dict(mode="ops", fault=None, env={}, coredump=False)
    for record in (True, False):
        plan = watch.launch_plan(["python", "x.py"], tmp_path, record=record, **kw)
        assert plan.env[beat.ENV] == str(tmp_path / "beat") == str(plan.beat) and plan.recorded == record
    assert beat.ENV not in watch.launch_plan(["bash", "-c", "true"], tmp_path, record=True, **kw).env


@pytest.fixture(scope="module")
def cli_spin(spin_lib, tmp_path_factory) -> tuple[int, dict, float]:
    """`gpulab watch` of a native spin after 3 ops: (exit code, verdict, seconds). Run once for the two tests that
    judge that run: it burns a core for SPIN_WINDOWS stall windows."""
    d = tmp_path_factory.mktemp("cli_spin")
    t0 = time.monotonic()
    code = watch.main(["--stall", str(SPIN_STALL), "--timeout", "60", "--json", str(d / "v.json"),
                       "--out", str(d / "w"), "--", "python", str(FIX / "outside_ops.py"), "--ops", "3", "spin",
                       str(spin_lib)])
    return code, json.loads((d / "v.json").read_text()), time.monotonic() - t0


def test_cli_native_spin_outside_any_op_is_a_hang(cli_spin):
    """A host thread spinning in native code between ops burns CPU but makes no progress: a hang (it used to
    run to --timeout and be reported `timeout`)."""
    code, v, took = cli_spin
    assert (code, v["status"], v["phase"]) == (watch.EXIT_CODES["hang"], "hang", "ops"), v["evidence"]
    assert v["in_flight_op"] is None and v["ops_completed"] >= 3 and v["left_running"] == []
    assert took < 45


@pytest.mark.parametrize("ops,phase", [(0, "startup"), (3, "ops")])
def test_native_spin_is_a_hang_before_and_between_ops(request, tmp_path, spin_lib, ops, phase):
    """Between ops, the CLI test's run: the same program judged by the same watch.run, not spun twice."""
    if ops == 3:
        v = request.getfixturevalue("cli_spin")[1]
    else:
        v = _watch(tmp_path, ["--ops", str(ops), "spin", str(spin_lib)], stall_s=SPIN_STALL).to_dict()
    assert (v["status"], v["phase"]) == ("hang", phase), v["evidence"]
    assert v["elapsed_s"] < 30


@pytest.mark.parametrize("ops,phase", [(0, "startup"), (3, "ops")])
def test_native_computation_longer_than_the_stall_window_is_ok(tmp_path, spin_lib, ops, phase):
    """CPU in native code without bytecode (numpy, cuInit under EAGER loading) holds off a hang for
    SPIN_WINDOWS stall windows: 2.5 windows of it end well; a spin that never returns is still a hang."""
    v = _watch(tmp_path, ["--ops", str(ops), "spin", str(spin_lib), str(2.5 * SPIN_STALL)], stall_s=SPIN_STALL)
    assert (v.status, v.phase, v.exit_code) == ("ok", phase, 0), v.evidence
    assert liveness.SPIN_WINDOWS > 2.5


@pytest.mark.parametrize("ops,phase", [(0, "startup"), (3, "ops")])
def test_polling_loop_is_a_hang(tmp_path, ops, phase):
    v = _watch(tmp_path, ["--ops", str(ops), "poll"])
    assert (v.status, v.phase) == ("hang", phase), v.evidence


@pytest.mark.parametrize("ops,phase", [(0, "startup"), (3, "ops")])
def test_python_compute_longer_than_the_stall_window_is_ok(tmp_path, ops, phase):
    v = _watch(tmp_path, ["--ops", str(ops), "compute", str(2.5 * 2)], stall_s=2.0)
    assert (v.status, v.phase, v.exit_code) == ("ok", phase, 0), v.evidence


@pytest.mark.gpu
@pytest.mark.parametrize("blocking", [False, True], ids=["sync", "launch_blocking"])
def test_host_spinning_in_the_cuda_driver_outside_any_op_is_a_hang(tmp_path, blocking):
    """A kernel that never ends, queued with no aten op (torch.cuda._sleep), then torch.cuda.synchronize()
    (no aten op either), or its launch itself under CUDA_LAUNCH_BLOCKING=1: the host spins in the driver,
    burning CPU, after every recorded op completed on host and GPU."""
    env = {**os.environ, **({"CUDA_LAUNCH_BLOCKING": "1"} if blocking else {})}
    v = _watch(tmp_path, ["--ops", "3", "gpu"], env=env, timeout_s=90)
    assert (v.status, v.phase, v.in_flight_op) == ("hang", "ops", None), v.evidence
    assert v.elapsed_s < 60


def test_unrecorded_fixes_child_keeps_a_beat(tmp_path, spin_lib):
    """The fix matrix's cost children run `python -m gpulab.fixes.child` without the recorder: the beat
    still starts there, so a spin in native code is a hang, not a timeout."""
    cmd = [sys.executable, "-m", "gpulab.fixes.child", "--", str(FIX / "outside_ops.py"), "--ops", "0", "spin",
           str(spin_lib)]
    v = watch.run(cmd, stall_s=SPIN_STALL, timeout_s=40, record=False, out_dir=tmp_path / "w", progress=lambda m: None,
                  stacks=False, env=proc.python_env())
    assert v.status == "hang" and v.mode is None, v.evidence
    assert beat.beats(beat.read(tmp_path / "w" / "beat")) is not None


# ------------------------------------------------------------------------------------------ 02's recordings

def test_record_stops_a_deadlock_after_the_stall_window(tmp_path):
    t0 = time.monotonic()
    rec = trace.record([sys.executable, str(FIX / "custom_op_deadlock.py"), "--gil", "released"], out_dir=tmp_path,
                       timeout_s=120, stall_s=STALL, name="ops")
    assert (rec.status, rec.ok, rec.finished, rec.timed_out, rec.returncode) == ("hang", False, False, False, None)
    assert time.monotonic() - t0 < 30
    open_ = rec.snapshot.in_flight()
    assert [r.name for r in open_] == ["gpulab_fixtures.locked_scale.default"]
    assert not (tmp_path / "ops.stderr.beat").exists()   # the heartbeat file is not left among the products


def test_record_of_a_job_judges_each_process_by_its_own_progress(tmp_path):
    """A rank spinning in native code (CPU, no bytecode: a host busy-waiting in a CUDA sync) is no progress of
    the launcher that waits for it: 02's recording of the job stops it as a hang (seen on the H100: an NCCL
    job's 02 ran to its deadline while a rank spun in .item()). The file's STALL, not less: on CI's loaded 2
    cores, two ranks loading torch's libraries at once went a whole second without bytecode or a fifth of a core,
    and the recording ended as a hang before their first op."""
    t0 = time.monotonic()
    rec = trace.record([sys.executable, str(FIX / "dist_job.py"), "spin", "--world", "2"], out_dir=tmp_path,
                       timeout_s=120, stall_s=STALL, name="ops")
    assert (rec.status, rec.processes) == ("hang", 3), rec.stderr_tail   # 2 ranks + multiprocessing's tracker
    assert time.monotonic() - t0 < 60
    # the launcher runs no op; the ranks do, and 02 shows the busiest of them, saying whose ops they are
    assert rec.process_ops >= 4 and rec.shown.startswith("process ") and 0 < rec.snapshot.started <= rec.process_ops
    headline = analysis.finding(rec, None, "script", "cpu", "ops.log")[0]
    assert f"(in {rec.shown})" in headline and f"02 shows {rec.shown}'s, the busiest" in headline, headline
    assert f"each recorded ({rec.process_ops} ops together" in headline, headline


def test_record_status_of_an_error_and_of_a_timeout(tmp_path):
    err = trace.record([sys.executable, str(FIX / "error_exit.py")], out_dir=tmp_path, timeout_s=120, stall_s=STALL)
    assert (err.status, err.returncode, err.finished) == ("error", 1, True)
    busy = trace.record([sys.executable, str(FIX / "busy_forever.py")], out_dir=tmp_path, timeout_s=6, stall_s=STALL,
                        name="busy")
    assert (busy.status, busy.timed_out, busy.returncode) == ("timeout", True, None)


def test_liveness_run_without_a_heartbeat_uses_cpu(tmp_path):
    """A non-Python command has neither log nor heartbeat: a shell loop that burns CPU is progress, a sleep
    is not."""
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    busy = liveness.run(["bash", "-c", "end=$((SECONDS+4)); while [ $SECONDS -lt $end ]; do :; done"],
                        timeout_s=30, stall_s=2.0, stdout=tmp_path / "o", stderr=tmp_path / "e")
    asleep = liveness.run(["bash", "-c", "sleep 30"], timeout_s=30, stall_s=2.0, stdout=tmp_path / "o2",
                          stderr=tmp_path / "e2")
    assert (busy.status, asleep.status) == ("ok", "hang")
    assert asleep.elapsed_s < 10 and asleep.last_progress_s is not None


# ------------------------------------------------------------------------------------------ a job's launcher

def test_a_shell_wrapper_that_prints_while_its_ranks_are_stuck_is_no_progress(tmp_path):
    """A job is judged by its ranks: the shell that started them, printing while it waits, is their supervisor,
    not their progress (its output counted as progress: such a job ran to its timeout)."""
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    job = f"{sys.executable} {FIX / 'dist_job.py'} stuck & while kill -0 $! 2>/dev/null; do echo waiting; sleep 0.2; done"
    t0 = time.monotonic()
    v = watch.run(["bash", "-c", job], stall_s=STALL, timeout_s=45, out_dir=tmp_path / "w", progress=lambda m: None,
                  stacks=False)
    assert v.status == "hang", v.evidence
    assert time.monotonic() - t0 < 40
    assert (tmp_path / "w" / "stdout.txt").read_text().count("waiting") > 5 * STALL   # it printed all along


def test_descendants_from_one_scan_are_the_process_tree():
    """The one /proc scan a poll shares (liveness.descendants) finds what psutil's per-process walk finds: a shell's
    children and grandchildren, nothing else on the machine."""
    import psutil

    with proc.Child(["sh", "-c", "sh -c 'sleep 30' & sleep 30 & wait"], label="tree") as child:
        deadline = time.monotonic() + 10
        while len(psutil.Process(child.pid).children(recursive=True)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        liveness._TREE["at"] = -1.0   # a fresh scan, not one cached by an earlier test's poll
        got = liveness.descendants(child.pid)
        want = [p.pid for p in psutil.Process(child.pid).children(recursive=True)]
        assert sorted(got) == sorted(want) and len(got) == 3, (got, want)
        assert child.pid not in got and os.getpid() not in got
        child.stop()
