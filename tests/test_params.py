from __future__ import annotations

import pytest

from gpulab import paramsets
from gpulab.chain import params
from nbfactory import notebook, project

NB1 = notebook("One", 'rung: str = "forward"  # choices: sdpa, forward, step, steps\nsteps: int = 10\nlr: float = 0.001\n')
NB2 = notebook("Two", 'rung: str = "forward"  # choices: sdpa, forward, step, steps\ncandidates: list = ["math"]\n')


@pytest.fixture
def proj(tmp_path):
    return project(tmp_path, {"01_one": NB1, "02_two": NB2}, base="rung: forward\nsteps: 3\n",
                   scenarios={"baseline": "description: plain\n", "fast": "steps: 1\nlr: 0.1\n"})


@pytest.fixture
def schema(proj):
    return params.notebook_schema(sorted((proj / "notebooks").glob("*.ipynb")))


def test_schema_reads_types_choices_and_owners(schema):
    assert schema["rung"].choices == ("sdpa", "forward", "step", "steps")
    assert schema["rung"].notebooks == ("01_one", "02_two")
    assert schema["steps"].type == "int" and schema["steps"].default == 10
    assert schema["candidates"].type == "list" and schema["candidates"].notebooks == ("02_two",)


def test_layering_order_later_wins(proj, tmp_path):
    extra = tmp_path / "mine.yaml"
    extra.write_text("steps: 7\nrung: step\n")
    layered = params.resolve(proj, "fast", [extra], ["rung=sdpa"])
    src = layered.sources()
    assert layered.plain()["steps"] == 7 and src["steps"] == str(extra)
    assert layered.plain()["rung"] == "sdpa" and src["rung"] == "-p"
    assert layered.plain()["lr"] == 0.1 and src["lr"] == "params/scenarios/fast.yaml"
    assert params.resolve(proj, "baseline").description == "plain"


@pytest.mark.parametrize("override, fragments", [
    ("no_such_param=1", ["unknown parameter 'no_such_param'", "(from -p)", "Valid parameters:", "rung"]),
    ("step=3", ["unknown parameter 'step'", "Did you mean 'steps'"]),
    ("steps=many", ["'steps'", "must be int", "'many'"]),
    ("steps=true", ["must be int"]),
    ("rung=backward", ["'backward' is not a valid choice", "sdpa, forward, step, steps"]),
    ("candidates=math", ["'candidates'", "must be list"]),
    ("out_dir=/tmp/x", ["set by the runner"]),
])
def test_validation_errors_name_key_source_and_valid_values(proj, schema, override, fragments):
    layered = params.resolve(proj, "baseline", [], [override])
    with pytest.raises(params.ParamError) as err:
        params.validate(layered, schema)
    for frag in fragments:
        assert frag in str(err.value)


def test_error_names_the_file_a_bad_key_came_from(proj, schema, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rung: forwad\n")
    with pytest.raises(params.ParamError, match=r"from .*bad\.yaml.*not a valid choice"):
        params.validate(params.resolve(proj, "baseline", [bad]), schema)


def test_coercions(proj, schema):
    values = params.validate(params.resolve(proj, "fast", [], ["lr=1", "rung=step"]), schema)
    assert values["lr"] == 1.0 and isinstance(values["lr"], float)
    assert values["steps"] == 1


def test_unknown_scenario_lists_valid_ones(proj):
    with pytest.raises(params.ParamError, match="unknown scenario 'nope'.*baseline, fast"):
        params.resolve(proj, "nope")


@pytest.mark.parametrize("text, msg", [("- a\n- b\n", "must hold a mapping"), ("a: [1,\n", "not valid YAML"),
                                       ("!!python/object:os.system x\n", "not valid YAML")])
def test_bad_files(tmp_path, text, msg):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(paramsets.ParamError, match=msg):
        paramsets.read_yaml(f)


def test_for_notebook_passes_only_declared_keys(schema):
    vals = {"rung": "step", "steps": 2, "candidates": ["x"]}
    assert params.for_notebook(vals, schema, "02_two") == {"rung": "step", "candidates": ["x"]}


def test_conflicting_declarations_are_an_error(tmp_path):
    a = notebook("A", "steps: int = 1\n")
    b = notebook("B", "steps: float = 1.0\n")
    proj = project(tmp_path, {"01_a": a, "02_b": b})
    with pytest.raises(params.ParamError, match="declared differently"):
        params.notebook_schema(sorted((proj / "notebooks").glob("*.ipynb")))


def test_repo_params_are_valid(root):
    """The shipped base, smoke and scenario files validate against the shipped notebooks."""
    from gpulab.chain import runner
    schema = params.notebook_schema(runner.discover(root))
    for scen in paramsets.list_scenarios(root):
        params.validate(params.resolve(root, scen, [root / "params" / "smoke.yaml"]), schema)
        params.validate(params.resolve(root, scen), schema)


@pytest.mark.parametrize("text, value", [
    ("workload=script:train.py --batch 4", "script:train.py --batch 4"),
    ("workload=script:train.py config/train_tiny.py --device=cpu --compile=False",
     "script:train.py config/train_tiny.py --device=cpu --compile=False"),
    ("workload='script:train.py --name \"a b\"'", 'script:train.py --name "a b"'),
    ("steps=3", 3),
])
def test_a_scripts_arguments_pass_quoted_as_one_value(text, value):
    """`-p workload='script:train.py --batch 4'` (the shell removes the quotes): the whole command is one value."""
    assert paramsets.parse_override(text) == (text.split("=", 1)[0], value)


def test_quoted_script_arguments_reach_the_workload_command(proj):
    from gpulab import workloads
    nb = notebook("W", 'workload: str = "builtin"  # builtin | module:callable | script:path\n')
    _write(proj, "03_w", nb)
    schema = params.notebook_schema(sorted((proj / "notebooks").glob("*.ipynb")))
    values = params.validate(params.resolve(proj, "baseline", [], ["workload=script:train.py --batch 4 --lr=1e-3"]),
                             schema)
    cmd = workloads.command(workloads.WorkloadConfig(workload=values["workload"]))
    assert cmd[1:] == ["train.py", "--batch", "4", "--lr=1e-3"]


def _write(proj, name, nb):
    import nbformat
    path = proj / "notebooks" / f"{name}.ipynb"
    nbformat.write(nb, path)
    return path


def test_the_parameter_helpers_sit_below_their_readers():
    """hang/ and fixes/ read parameter files through gpulab.paramsets, never through the chain above them."""
    import ast
    from pathlib import Path
    import gpulab
    lib = Path(gpulab.__file__).parent
    for sub in ("hang", "fixes"):
        for path in (lib / sub).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module:
                    assert not node.module.startswith("gpulab.chain"), f"{path.name} imports {node.module}"
    assert params.ParamError is paramsets.ParamError


def test_a_params_file_of_the_project_is_found_from_any_folder(proj, tmp_path, monkeypatch):
    """`--params params/smoke.yaml` from the user's folder: the caller's file when there is one, else the project's."""
    (proj / "params" / "smoke.yaml").write_text("steps: 5\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert params.resolve(proj, "baseline", ["params/smoke.yaml"]).plain()["steps"] == 5
    (elsewhere / "params").mkdir()
    (elsewhere / "params" / "smoke.yaml").write_text("steps: 6\n")
    assert params.resolve(proj, "baseline", ["params/smoke.yaml"]).plain()["steps"] == 6
    with pytest.raises(paramsets.ParamError, match="'params/nope.yaml' does not exist"):
        params.resolve(proj, "baseline", ["params/nope.yaml"])
