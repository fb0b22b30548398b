#!/usr/bin/env bash
# Set up, start the services the tests use (PostgreSQL), and run the test suite on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [ -z "${TUNER_TEST_PG_URL:-}" ]; then
  TUNER_TEST_PG_URL=$(scripts/start-postgres.sh || true)
  export TUNER_TEST_PG_URL
fi
export TRITON_INTERPRET=1
. .venv/bin/activate
ruff check .
exec python -m pytest "$@"
