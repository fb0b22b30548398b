#!/usr/bin/env bash
# Set up, start the services the tests use (PostgreSQL), and run the test suite on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [ -z "${TUNER_TEST_PG_URL:-}" ]; then
  TUNER_TEST_PG_URL=$(scripts/start-postgres.sh || true)
  export TUNER_TEST_PG_URL
fi
# The dashboard's end-to-end test drives Debian's Chromium (headless); install it where we may.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
    || echo "could not install chromium: the browser test will be skipped" >&2
fi
export TRITON_INTERPRET=1
. .venv/bin/activate
ruff check .
exec python -m pytest "$@"
