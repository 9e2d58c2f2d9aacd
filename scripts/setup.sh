#!/usr/bin/env bash
# Creates .venv and installs gpulab with its dependencies. Never replaces a torch that is already
# importable (people run custom wheels): a venv made from a Python that has torch sees it through
# --system-site-packages, and torch is installed only when none can be imported.
#   PYTHON=python3.12 scripts/setup.sh        # which Python to build the venv from
#   GPULAB_TORCH='torch==2.13.0' (default)   # what to install when no torch is importable
#   GPULAB_EXTRAS=test,lab                    # extras to add (test: pytest, py-spy; lab: jupyterlab)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${GPULAB_VENV:-.venv}
TORCH_SPEC=${GPULAB_TORCH:-torch==2.13.0}

"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "gpulab needs Python >= 3.10, found " + sys.version)'
if [ ! -x "$VENV/bin/python" ]; then
  if "$PY" -c 'import torch' 2>/dev/null; then
    echo "setup: $PY already has torch $("$PY" -c 'import torch; print(torch.__version__)'); the venv will use it" >&2
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
  fi
fi
VPY="$VENV/bin/python"
# pip compiles each installed file to bytecode one at a time (half of set-up); compileall below does it on
# every core instead. Not skipping it: the chain's children would then each compile what they import.
PIP=("$VPY" -m pip install -q --disable-pip-version-check --no-compile)
# Every dependency but torch, read from pyproject.toml (the one list; environment.yml is checked against it).
mapfile -t DEPS < <("$VPY" scripts/deps.py --exclude torch --extras "${GPULAB_EXTRAS:-}")
if "$VPY" -c 'import torch' 2>/dev/null; then
  echo "setup: using the installed torch $("$VPY" -c 'import torch; print(torch.__version__)')" >&2
else
  echo "setup: no importable torch; installing $TORCH_SPEC" >&2
  DEPS=("$TORCH_SPEC" "${DEPS[@]}")   # one pip run: one resolution
fi
"${PIP[@]}" "${DEPS[@]}"
"${PIP[@]}" --no-deps --no-build-isolation -e . 2>/dev/null || "${PIP[@]}" --no-deps -e .
"$VPY" -m compileall -q -j 0 "$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  >/dev/null 2>&1 || true   # a few packages ship files for other Pythons that do not compile: harmless
"$VPY" -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (gpulab)" >/dev/null
echo "setup: ready ($("$VPY" -c 'import torch, gpulab; print("torch", torch.__version__, "cuda" if torch.cuda.is_available() else "cpu")'))" >&2
