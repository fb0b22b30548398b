#!/usr/bin/env bash
# Create the virtual environment (.venv, or $TUNER_VENV) and install the project with its test and
# PostgreSQL extras, saying what each step installs. A second run with an unchanged pyproject.toml
# installs nothing: the hash of pyproject.toml (and of this script) is kept in the venv as a marker.
# torch is installed first, pinned, so that pip keeps a CPU build where one is provided;
# an existing torch in the venv (a user's CUDA build) is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${TUNER_VENV:-.venv}
MARKER="$VENV/.gpu-knob-tuner-setup"
started=$SECONDS
step() { echo "setup [$((SECONDS - started))s] $*" >&2; }
# pip's notices that ask nothing of the user (a newer pip exists, running as root, this machine's index
# locations) and setuptools' deprecation boxes during the editable build are left out.
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PYTHONWARNINGS=ignore
pip_log=$(mktemp)
trap 'rm -f "$pip_log"' EXIT
pip_quiet() {
  local rc=0
  python -m pip install -q "$@" >"$pip_log" 2>&1 || rc=$?
  grep -v -e "^WARNING: Location" -e "^\[notice\]" "$pip_log" >&2 || true
  return "$rc"
}

wanted=$(cat pyproject.toml scripts/setup.sh | "$PYTHON" -c "import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())")
if [ -x "$VENV/bin/python" ] && [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$wanted" ]; then
  step "$VENV is up to date with pyproject.toml: nothing to install (delete $MARKER to force a reinstall)"
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  # A fresh install takes about 2.8 GB (triton 1.0, torch 0.75, ray 0.25) and pip unpacks wheels in TMPDIR
  # beside it: say so before pip's "No space left on device" halfway through.
  need_mb=3200
  for dir in "$(dirname "$VENV")" "${TMPDIR:-/tmp}"; do
    free_mb=$(df -Pm "$dir" 2>/dev/null | awk 'NR == 2 {print $4}')
    if [ -n "$free_mb" ] && [ "$free_mb" -lt "$need_mb" ]; then
      echo "setup: $dir has $free_mb MB free; a fresh install needs about $need_mb MB (set TUNER_VENV or TMPDIR" \
        "to a larger disk, or free space)" >&2
      exit 1
    fi
  done
  step "creating the virtual environment $VENV ($("$PYTHON" --version 2>&1))"
  "$PYTHON" -m venv "$VENV"
fi
. "$VENV/bin/activate"
step "upgrading pip"
pip_quiet --upgrade pip
if python -c "import torch" 2>/dev/null; then
  step "torch $(python -c 'import torch; print(torch.__version__)') is installed already: kept"
else
  step "installing torch ${TORCH_VERSION:-2.13.0} (the largest download, several hundred MB: a few minutes on a first run)"
  pip_quiet "torch==${TORCH_VERSION:-2.13.0}"
fi
step "installing the project and its dependencies (triton, ray, optuna, fastapi...; dev and postgres extras)"
pip_quiet -e ".[dev,postgres]"
step "checking the imports"
python -c "import torch, triton, optuna, ray, sqlalchemy; print('set up: torch', torch.__version__, 'triton', triton.__version__, 'optuna', optuna.__version__, 'ray', ray.__version__)"
echo "$wanted" >"$MARKER"
step "done"
