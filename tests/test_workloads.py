"""The built-in workload ladder, user workloads, and config validation."""
from __future__ import annotations

import subprocess
import sys

import pytest

from gpulab import builtin_model, workloads
from gpulab.workloads import WorkloadConfig

TINY = dict(device="cpu", batch=1, heads=2, head_dim=8, text_tokens=4, image_tokens=8, layers=1, lora_rank=2)


@pytest.mark.parametrize("rung,steps,n_losses", [("sdpa", 1, 1), ("forward", 1, 1), ("step", 1, 1), ("steps", 3, 3)])
def test_rungs_run(rung, steps, n_losses):
    res = builtin_model.run(WorkloadConfig(rung=rung, steps=steps, **TINY))
    assert len(res.losses) == n_losses and all(l == l and l > 0 for l in res.losses)
    assert len(res.memory) == n_losses and res.memory[0]["rss"] > 0
    assert res.dtype == "float32" and res.device == "cpu" and res.sdpa_backend_used in ("math", "flash")


def test_steps_reduce_loss_and_adamw_changes_only_lora():
    import torch

    cfg = WorkloadConfig(rung="steps", steps=5, **TINY)
    prep = builtin_model.prepare(cfg)
    model = prep.state["model"]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    out = prep.fn()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    lora = {n for n in before if "lora_" in n}
    assert lora and changed == lora
    assert prep.trainable == sum(before[n].numel() for n in lora) < prep.total
    assert out[-1][0] < out[0][0]  # training makes progress


@pytest.mark.parametrize("backend", ["math", "auto"])
def test_sdpa_backend_selection(backend):
    res = builtin_model.run(WorkloadConfig(rung="sdpa", sdpa_backend=backend, **TINY))
    if backend == "math":
        assert res.sdpa_backend_used == "math"


@pytest.mark.parametrize("kw,msg", [
    (dict(rung="backward"), "rung='backward' is not valid; choose one of sdpa, forward, step, steps"),
    (dict(sdpa_backend="fa3"), "sdpa_backend='fa3' is not valid; choose one of auto, math, flash, efficient, cudnn"),
    (dict(dtype="fp8"), "dtype='fp8' is not valid; choose one of auto, float32, bfloat16, float16"),
    (dict(device="tpu"), "device='tpu' is not valid; choose one of auto, cpu, cuda"),
    (dict(batch=0), "batch=0 is not valid; it must be a positive integer"),
    (dict(heads="4"), "heads='4' is not valid"),
    (dict(workload="train.py"), "workload='train.py' is not valid; choose one of builtin, module:callable"),
    (dict(workload="script:"), "workload='script:' is not valid; use script:path/to/train.py"),
])
def test_config_validation_names_value_and_choices(kw, msg):
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace("[", r"\[")):
        WorkloadConfig.from_params(**kw)


def test_from_params_ignores_notebook_only_keys():
    cfg = WorkloadConfig.from_params(out_dir="x", interactive=False, rung="step", batch=3)
    assert cfg.rung == "step" and cfg.batch == 3


@pytest.mark.parametrize("workload,expect", [
    ("builtin", [sys.executable, "-m", "gpulab.workloads", "--workload", "builtin"]),
    ("module:mypkg.train:main", [sys.executable, "-m", "gpulab.workloads", "--workload", "module:mypkg.train:main"]),
    ("script:train.py --lr 0.1 'a b'", [sys.executable, "train.py", "--lr", "0.1", "a b"]),
])
def test_command_for_each_workload_kind(workload, expect):
    cmd = workloads.command(WorkloadConfig(workload=workload, rung="step", batch=3))
    assert cmd[:len(expect)] == expect
    if workload != "script:train.py --lr 0.1 'a b'":
        assert cmd[cmd.index("--rung") + 1] == "step" and cmd[cmd.index("--batch") + 1] == "3"


def test_command_runs_builtin_and_user_callable(tmp_path):
    mod = tmp_path / "userwl.py"
    mod.write_text("import torch\nRAN = []\ndef main():\n    (torch.ones(3) * 2).sum()\n"
                   "    open(__file__ + '.ran', 'w').write('yes')\n")
    env = {**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{workloads.__file__.rsplit('/gpulab/', 1)[0]}"}
    for wl in ("builtin", "module:userwl:main"):
        cfg = WorkloadConfig(workload=wl, rung="forward", **TINY)
        js = tmp_path / "res.json"
        p = subprocess.run(workloads.command(cfg) + ["--json", str(js)], capture_output=True, text=True,
                           timeout=120, env=env, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
    assert (tmp_path / "userwl.py.ran").read_text() == "yes"
    import json
    assert json.loads(js.read_text())["rung"] == "forward"


def test_the_vocabulary_imports_without_torch():
    """The watchdog and the runner import gpulab.workloads: it must not pay torch's import; the built-in model
    lives in gpulab.builtin_model, which imports the vocabulary (never the reverse: no import cycle)."""
    import subprocess
    import sys

    code = ("import sys, gpulab.workloads as w; assert 'torch' not in sys.modules; "
            "assert not hasattr(w, 'prepare') and 'gpulab.builtin_model' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
