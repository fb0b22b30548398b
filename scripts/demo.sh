#!/usr/bin/env bash
# Set up, then run the service (REST API + dashboard + a study runner, on the default database and a local
# Ray) with the demo's studies submitted, and print the dashboard URL and the next commands.
#   - no GPU: a study replaying GEMM measurements recorded on an H200 (its Pareto front fills in within
#     seconds), then a small live GEMM study that the Triton interpreter really computes;
#   - a GPU: a 4096^3 GEMM study compiled and timed on it.
# The database is the one every `tuner` command opens by default ($TUNER_DB_URL, else ./tuner.db), so
# `tuner status` and `tuner export` find the demo's studies. Ctrl-C stops it; running it again resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
say() { echo "demo [$((SECONDS - started))s] $*"; }
say "setting up (scripts/setup.sh)"
scripts/setup.sh
. "${TUNER_VENV:-.venv}/bin/activate"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  studies=(examples/demo-gemm-gpu.yaml)
else
  export TRITON_INTERPRET=1  # no GPU: the Triton interpreter runs the kernels on the CPU
  studies=(examples/demo-replay.yaml examples/demo-gemm.yaml)
fi
PORT=${PORT:-8000}
URL="http://127.0.0.1:$PORT"
DB=${TUNER_DB_URL:-tuner.db}
case $DB in  # a path is printed absolute below, so the next commands find it from any directory
  *://* | /*) ;;
  *) DB="$PWD/$DB" ;;
esac
say "starting the service on $URL (database $DB; the study runner starts Ray, ~10-20 s on a small machine)"
# The server's own banner is left out (stdout): the URL is printed below, once, when the server answers.
# Ray's notice that its local cluster uses token authentication asks nothing of the user: it is left out.
# The filter ignores Ctrl-C, so that what the server prints as it stops (what it stopped, what went back to
# the queue) still reaches the terminal.
tuner serve --db "$DB" --port "$PORT" >/dev/null \
  2> >(trap '' INT; exec grep -v --line-buffered 'authentication_token_setup' >&2) &
server=$!
stop() {
  trap - EXIT INT TERM
  kill "$server" 2>/dev/null && say "stopping the service (trials in flight finish first)"
  wait "$server" 2>/dev/null
  say "demo stopped; run it again to resume (same database, $DB)"
}
trap stop EXIT INT TERM
up=
for _ in $(seq 1 120); do
  if curl -sf "$URL/healthz" >/dev/null; then up=1; break; fi
  kill -0 "$server" 2>/dev/null || break
  sleep 0.5
done
if [ -z "$up" ]; then
  echo "the service did not answer on $URL (is the port taken? PORT=8001 $0)" >&2
  exit 1
fi
first=
for spec in "${studies[@]}"; do
  name=$(sed -n 's/^name: *//p' "$spec")
  out=$(tuner submit "$spec" --url "$URL" --idempotency-key "$name" 2>&1) \
    || out="$name exists already (resume it from its page, or: curl -X POST $URL/api/studies/ID/resume)"
  say "$out"
  first=${first:-$name}
done
id=$(curl -sf "$URL/api/studies?limit=500" | python -c "import json, sys; print(next((s['id'] for s in json.load(sys.stdin)['items'] if s['name'] == '$first'), ''))")
echo
say "dashboard:  $URL/studies/$id    (all studies: $URL/)"
echo "  API docs:   $URL/docs"
echo "  next, in another terminal (same database, $DB):"
echo "    . ${TUNER_VENV:-.venv}/bin/activate"
echo "    tuner status --db $DB"
echo "    tuner trials $first --db $DB"
echo "    tuner export $first --format yaml --db $DB"
wait $server
