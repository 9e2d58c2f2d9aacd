#!/usr/bin/env bash
# Creates .venv and installs gpulab with its dependencies. Never replaces a torch that is already
# importable (people run custom wheels): a venv made from a Python that has torch sees it through
# --system-site-packages, and torch is installed only when none can be imported.
#   PYTHON=python3.12 scripts/setup.sh        # which Python to build the venv from
#   GPULAB_TORCH='torch==2.13.0' (default)   # what to install when no torch is importable
#   GPULAB_EXTRAS=test,lab                    # extras to add (test: pytest, py-spy; lab: jupyterlab)
#   GPULAB_INSTALLER=pip                      # never uv (default: uv where it can be used, else pip)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${GPULAB_VENV:-.venv}
VPY="$VENV/bin/python"
TORCH_SPEC=${GPULAB_TORCH:-torch==2.13.0}
TMP=$(mktemp -d)
NATIVE=""
trap '[ -z "$NATIVE" ] || kill "$NATIVE" 2>/dev/null; rm -rf "$TMP"' EXIT

"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "gpulab needs Python >= 3.10, found " + sys.version)'

# uv installs the dependencies in seconds where pip takes half a minute. It is used only where it sees what
# pip sees: not when pip is pointed at an index of its own (a mirror), and never for torch (pip's
# configuration may name wheels on disk that uv does not look at). Any uv failure falls back to pip.
UV=""
UV_ASKED=""
find_uv() {   # once a run: offline, a failed bootstrap must not cost its timeout at every install
  if [ -n "$UV_ASKED" ]; then
    return
  fi
  UV_ASKED=1
  if [ "${GPULAB_INSTALLER:-auto}" = pip ] || [ -n "${PIP_INDEX_URL:-}" ] \
     || "$PY" -m pip config list 2>/dev/null | grep -Eq '^[^.]*\.index-url='; then
    return
  fi
  UV=$(command -v uv || true)
  # pip puts uv in a folder of gpulab's cache (the recorder's native parts are cached beside it), once a machine:
  # fetching it took 6 s of every set-up, a second clone's too
  local kept="${XDG_CACHE_HOME:-$HOME/.cache}/gpulab/uv"
  if [ -z "$UV" ] && [ -x "$kept/bin/uv" ] && "$kept/bin/uv" --version >/dev/null 2>&1; then
    UV="$kept/bin/uv"
  fi
  if [ -z "$UV" ] && "$PY" -m pip install -q --disable-pip-version-check --retries 1 --timeout 15 --target "$TMP/uv" uv >/dev/null 2>&1 \
     && [ -x "$TMP/uv/bin/uv" ]; then
    UV="$TMP/uv/bin/uv"
    if mkdir -p "$(dirname "$kept")" 2>/dev/null && cp -r "$TMP/uv" "$kept.$$" 2>/dev/null \
       && mv -T "$kept.$$" "$kept" 2>/dev/null; then
      UV="$kept/bin/uv"
    else
      rm -rf "$kept.$$"
    fi
  fi
}
PIP=("$VPY" -m pip install -q --disable-pip-version-check --no-compile)   # bytecode: scripts/warm.py below
install() {
  find_uv
  if [ -n "$UV" ] && "$UV" pip install -q --python "$VPY" "$@"; then
    return
  fi
  "${PIP[@]}" "$@"
}

if [ ! -x "$VPY" ]; then
  SITE=()
  if TV=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
    echo "setup: $PY already has torch $TV; the venv will use it" >&2
    SITE=(--system-site-packages)
  fi
  find_uv
  if [ -n "$UV" ]; then   # ensurepip takes 5 s; uv puts the same pip in the venv in a fraction of one
    "$PY" -m venv --without-pip "${SITE[@]}" "$VENV"
    "$UV" pip install -q --python "$VPY" pip setuptools || "$VPY" -m ensurepip --default-pip >/dev/null
  else
    "$PY" -m venv "${SITE[@]}" "$VENV"
  fi
fi
if TV=$("$VPY" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
  echo "setup: using the installed torch $TV" >&2
else
  echo "setup: no importable torch; installing $TORCH_SPEC" >&2
  # pip picks the wheel (its configuration may name wheels on disk); uv, when usable, unpacks it (7 s, not 18)
  find_uv
  if ! { [ -n "$UV" ] && "$VPY" -m pip download -q --disable-pip-version-check --no-deps -d "$TMP/torch" "$TORCH_SPEC" \
         && "$UV" pip install -q --python "$VPY" "$TMP"/torch/*.whl; }; then
    "${PIP[@]}" "$TORCH_SPEC"
  fi
fi
# Every dependency but torch, read from pyproject.toml (the one list; environment.yml is checked against it);
# only those not installed yet, so that a set-up with nothing to do takes no installer's time.
mapfile -t DEPS < <("$VPY" scripts/deps.py --exclude torch --extras "${GPULAB_EXTRAS:-}" --missing)
if [ ${#DEPS[@]} -gt 0 ]; then
  install "${DEPS[@]}"
fi
# The recorder's native parts, compiled against this torch (the observer: about 17 s of one core), built beside the
# installs and the warm-up below instead of inside the first recording, which waited for them (a fresh clone's
# 02 took twice as long). Built by this launcher, never by a recorded program (gpulab.trace.native says why);
# cached per torch and source, so a set-up with nothing new to build costs a fraction of a second.
PYTHONPATH=lib "$VPY" -c 'import sys; from gpulab.trace import native; why = native.ensure_all(); print(why); sys.exit(1 if why else 0)' \
  > "$TMP/native.log" 2>&1 & NATIVE=$!
if ! "$VPY" -c 'import gpulab, pathlib, sys; sys.exit(pathlib.Path(gpulab.__file__).parents[1] != pathlib.Path("lib").resolve())' 2>/dev/null; then
  if [ -n "$UV" ]; then   # uv only when already found: fetching it for this alone costs what it saves
    install --no-deps -e .
  else
    "${PIP[@]}" --no-deps --no-build-isolation -e . 2>/dev/null || "${PIP[@]}" --no-deps -e .
  fi
fi
"$VPY" -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (gpulab)" >/dev/null

# Bytecode for what a chain run imports (scripts/warm.py says why), again only when the installed packages
# changed; gpulab's own modules on every set-up (compileall skips those already compiled).
"$VPY" -m compileall -q lib >/dev/null
PURE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
STAMP="$VENV/.gpulab-warm"
ls "$PURE" | grep -E '\.dist-info$' > "$TMP/installed" || true
if ! cmp -s "$TMP/installed" "$STAMP" 2>/dev/null; then
  "$VPY" scripts/warm.py science > "$TMP/warm-science.log" 2>&1 & SCIENCE=$!
  "$VPY" scripts/warm.py jupyter > "$TMP/warm-jupyter.log" 2>&1 & JUPYTER=$!
  case ",${GPULAB_EXTRAS:-}," in *,test,*) "$VPY" scripts/warm.py compiler > "$TMP/warm-compiler.log" 2>&1 || true ;; esac
  ok=1
  wait $SCIENCE || { ok=0; echo "setup: warning: importing torch and gpulab failed:" >&2; tail -20 "$TMP/warm-science.log" >&2; }
  wait $JUPYTER || { ok=0; echo "setup: warning: a notebook cell through papermill failed:" >&2; tail -20 "$TMP/warm-jupyter.log" >&2; }
  if [ $ok = 1 ]; then cp "$TMP/installed" "$STAMP"; fi
fi
wait "$NATIVE" || { echo "setup: warning: the recorder's native parts were not built (it records without them):" >&2; tail -5 "$TMP/native.log" >&2; }
NATIVE=""
READY=$(tail -1 "$TMP/warm-science.log" 2>/dev/null | grep '^torch ' \
        || "$VPY" -c 'import torch, gpulab; print("torch", torch.__version__, "cuda" if torch.cuda.is_available() else "cpu")')
echo "setup: ready ($READY)" >&2
