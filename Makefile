# The two commands (README): `make run` and `make test`.
PY := .venv/bin/python
# The venv's tools (gpulab, py-spy, jupyter) come first, as for a user who activated it.
export PATH := $(CURDIR)/.venv/bin:$(PATH)
PARAMS ?=
ARGS ?=

.PHONY: run test smoke lab setup setup-test clean-venv

## setup: only set up .venv (gpulab installed in it, editable, with its dependencies); runs nothing
setup:
	scripts/setup.sh

setup-test:
	GPULAB_EXTRAS=test scripts/setup.sh

## run: set up, then run the whole chain on the built-in workload (GPU if there is one, else CPU)
run: setup
	$(PY) -m gpulab run $(PARAMS) $(ARGS)

## smoke: the tiny CPU chain that CI runs
smoke: setup
	$(PY) -m gpulab run --params params/smoke.yaml $(ARGS)

## test: set up, then the whole test suite (GPU tests skip without a GPU), three tests at a time: most of the
## suite waits on stall windows of real hangs, so a third worker still helps on CI's two cores (on a 2-core
## machine the suite took about 10% less time with 3 workers than with 2); a file's tests stay on one worker, which
## builds its module-scoped fixtures (a whole chain run) once, not once per worker
TEST_WORKERS ?= 3
test: setup-test
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(ARGS)

## lab: JupyterLab on the notebooks, for interactive work (set interactive = True in a notebook)
lab:
	GPULAB_EXTRAS=lab scripts/setup.sh
	.venv/bin/jupyter lab notebooks/

clean-venv:
	rm -rf .venv
