#!/usr/bin/env bash
# Set up, then run the service (REST API + dashboard + a study runner, on an embedded SQLite
# database and a local Ray) with a small demo GEMM study submitted, and print the dashboard URL.
# Ctrl-C stops it; running it again resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate
if ! command -v nvidia-smi >/dev/null 2>&1; then
  export TRITON_INTERPRET=1  # no GPU: the Triton interpreter runs the kernels on the CPU
fi
PORT=${PORT:-8000}
URL="http://127.0.0.1:$PORT"
DB=${TUNER_DB_URL:-demo.db}
tuner serve --db "$DB" --port "$PORT" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT INT TERM
for _ in $(seq 1 60); do curl -sf "$URL/healthz" >/dev/null && break; sleep 1; done
tuner submit examples/demo-gemm.yaml --url "$URL" --idempotency-key demo-gemm-256 \
  || echo "(the demo study exists already: resume it from the dashboard or with POST /api/studies/ID/resume)"
echo
echo "Dashboard: $URL/    (the demo study's page shows its Pareto front filling in)"
echo "API docs:  $URL/docs"
wait $server
