#!/usr/bin/env bash
# Create .venv and install the project with its test and PostgreSQL extras.
# torch is installed first, pinned, so that pip keeps a CPU build where one is provided;
# an existing torch in the venv (a user's CUDA build) is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}" 2>&1 | grep -v "^WARNING: Location" || true
python -m pip install -q -e ".[dev,postgres]" 2>&1 | grep -v "^WARNING: Location" || true
python -c "import torch, triton, optuna, ray, sqlalchemy; print('set up: torch', torch.__version__, 'triton', triton.__version__, 'optuna', optuna.__version__, 'ray', ray.__version__)"
