#!/usr/bin/env bash
# Set up, start the services the tests use (PostgreSQL), and run the test suite on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "== $(date -u +%H:%M:%S) $*" >&2; }
step "set up"
scripts/setup.sh
if [ -z "${TUNER_TEST_PG_URL:-}" ]; then
  step "PostgreSQL"
  TUNER_TEST_PG_URL=$(scripts/start-postgres.sh || true)
  export TUNER_TEST_PG_URL
fi
# The dashboard's end-to-end test drives Debian's Chromium (headless); install it where we may.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  step "Chromium"
  (timeout 600 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold chromium) </dev/null >/dev/null 2>&1 \
    || echo "could not install chromium: the browser test will be skipped" >&2
fi
export TRITON_INTERPRET=1 PYTHONUNBUFFERED=1
. .venv/bin/activate
step "ruff"
ruff check .
step "pytest"
exec python -m pytest "$@"
