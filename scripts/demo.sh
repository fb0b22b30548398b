#!/usr/bin/env bash
# Set up, then run a small demo GEMM study on an embedded SQLite database with a local Ray,
# with a live progress bar, and print its Pareto front and exported best config.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate
if ! command -v nvidia-smi >/dev/null 2>&1; then
  export TRITON_INTERPRET=1  # no GPU: the Triton interpreter runs the kernels on the CPU
fi
DB=${TUNER_DB_URL:-demo.db}
tuner run examples/demo-gemm.yaml --db "$DB"
echo
echo "Best config (tuner export demo-gemm-256 --db $DB --format yaml):"
tuner export demo-gemm-256 --db "$DB" --format yaml | sed -n '1,/^metrics:/p;/^metrics:/,/^objectives:/p' | head -40
echo
echo "More: tuner status --db $DB | tuner trials demo-gemm-256 --db $DB"
